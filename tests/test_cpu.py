"""The CPU backend: generated C++ builds warning-free and runs every example and
library kernel to the float64 reference; the runtime checks its arguments."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.runtime.cpu import build
from tessera.transpiler.target.cpu import DEFAULT_FLAGS

from .conftest import EXAMPLES, ROOT
from .helpers import (
    INTEGERS,
    ZERO_SIZES,
    check_column_blocks,
    check_integers,
    check_store_in_a_loop,
    check_zero_sizes,
    run_sanitized,
)
from .reference import (
    CASES,
    F32_MATMUL_SOURCE,
    Case,
    adam,
    attention,
    check_case,
    f32_attention_source,
    f64,
)

pytestmark = [
    pytest.mark.execute,
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
]
STDLIB = sorted((ROOT / "tessera/stdlib").glob("*.tsr"))
STRICT = ("-std=c++17", "-O1", "-fopenmp", "-Wall", "-Wextra", "-Werror")
#: How each compiler a user may have checks a file: Clang's warnings that the optimizer
#: could not honour a pragma (-Wpass-failed) need a real compile, not a syntax check.
COMPILERS = {"g++": ("-fsyntax-only",), "clang++": ("-c", "-o", "k.o")}


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize(
    "path",
    EXAMPLES + [pytest.param(p, marks=pytest.mark.exhaustive, id=p.stem) for p in STDLIB],
    ids=lambda p: p.stem,
)
def test_generated_cpp_compiles_warning_free(path: Path, compiler: str, tmp_path: Path) -> None:
    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    source = tessera.compile_file(path, target="cpu").source
    cpp = tmp_path / "k.cpp"
    cpp.write_text(source)
    done = subprocess.run([compiler, *STRICT, *COMPILERS[compiler], str(cpp)],
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_softmax_takes_the_exp_of_nonpositive_arguments() -> None:
    """A row less its own maximum is never positive: the shorter exp serves, and an exp
    of anything else keeps the full one."""
    source = tessera.compile(
        '@kernel\ndef f(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:\n'
        "    return softmax(x) + exp(x - 1.0)\n",
        target="cpu",
    ).source
    kernels = source[source.index("// ---- f") :]
    assert kernels.count("tsr::exp_nonpositive(") == 1  # softmax's
    assert kernels.count("tsr::exp(") == 1  # exp(x - 1.0)'s


def test_only_the_header_sections_a_file_uses_are_inlined() -> None:
    """Norms need no micro-kernel and no online softmax; attention needs both. (That the
    trimmed files still build is the test above.)"""
    norms = tessera.compile_file(ROOT / "examples/norms.tsr", target="cpu").source
    attention = tessera.compile_file(ROOT / "examples/attention.tsr", target="cpu").source
    assert "inline void load_tile" in norms and "inline float exp" in norms
    assert "mma_block" not in norms and "softmax_online" not in norms
    assert "inline void mma_block" in attention and "inline void attend" in attention


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_runs_to_the_float64_reference(case: Case) -> None:
    check_case(case, "cpu")


def test_names_that_cpp_or_the_generated_code_takes_still_run() -> None:
    """Tensors named `area` (each program's scratch) and `new` (a C++ keyword), and an
    intermediate named like the entry's first buffer slot, get new names in C++, the
    same at the entry and its launches (before, a launch was passed `area_1`, which the
    entry had not declared)."""
    src = """\
@kernel
def f(area: Tensor["T", "D", f32], new: Tensor["D", "F", f32],
      c: Tensor["F", "D", f32]) -> Tensor["T", "D", f32]:
    slot0 = relu(area @ new)
    return slot0 @ c
"""
    rng = np.random.default_rng(5)
    a, b, c = (rng.standard_normal(s, dtype=np.float32) for s in ((37, 29), (29, 41), (41, 29)))
    out = np.full((37, 29), np.nan, dtype=np.float32)
    tessera.compile(src, target="cpu").load().f(a, b, c, out=out)
    expected = np.maximum(f64(a) @ f64(b), 0.0) @ f64(c)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_outputs_past_the_streaming_threshold_are_whole() -> None:
    """An f32 output of 16 MiB or more leaves through non-temporal stores, which only a
    large case reaches: 4099 x 1029 is ragged under both the row tile and the vector."""
    src = """\
@kernel
def f(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return softmax(x, axis=-1)
"""
    x = np.random.default_rng(3).standard_normal((4099, 1029), dtype=np.float32)
    assert x.nbytes >= 16 << 20
    out = np.full_like(x, np.nan)
    tessera.compile(src, target="cpu").load().f(x, out=out)
    want = np.exp(f64(x) - f64(x).max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)
    assert not np.isnan(out).any()
    assert np.abs(out - want).max() < 1e-6


def test_intermediates_are_kept_per_thread_and_grown() -> None:
    """A function's intermediate tensors live in blocks that the calling thread keeps
    from call to call: a call at a larger size grows them, a smaller one reuses them,
    two functions share them, and another thread has its own. (The sanitizer test
    checks that a grown block is large enough.)"""
    src = """\
@kernel
def column_sums(x: Tensor["R", "C", f32]) -> Tensor["C", f32]:
    return sum(x, axis=0)

@kernel
def two_layers(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32],
               c: Tensor["N", "P", f32]) -> Tensor["M", "P", f32]:
    return relu(a @ b) @ c
"""
    lib = tessera.compile(src, target="cpu").load()
    rng = np.random.default_rng(5)
    failures: list[BaseException] = []

    def check(rows: int, cols: int) -> None:
        try:
            x = rng.standard_normal((rows, cols), dtype=np.float32)
            got = lib.column_sums(x)
            np.testing.assert_allclose(got, f64(x).sum(0), rtol=1e-4, atol=1e-4)
            a, b, c = (rng.standard_normal(s, dtype=np.float32)
                       for s in ((rows, cols), (cols, 33), (33, 9)))  # fmt: skip
            want = np.maximum(f64(a) @ f64(b), 0.0) @ f64(c)
            np.testing.assert_allclose(lib.two_layers(a, b, c), want, rtol=1e-4, atol=1e-3)
        except BaseException as error:  # reported from the main thread
            failures.append(error)

    for rows, cols in ((7, 5), (301, 257), (9, 3)):
        check(rows, cols)
    other = threading.Thread(target=check, args=(129, 65))
    other.start()
    other.join()
    assert not failures, failures


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2", "f16", "bf16"])
def test_low_precision_inputs_and_rounded_outputs(dtype: str) -> None:
    src = f"""\
@kernel
def f(A: Tensor["M", "K", {dtype}],
      B: Tensor["K", "N", {dtype}]) -> Tensor["M", "N", {dtype} @accum(f32)]:
    return A @ B
"""
    np_type = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
               "f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]  # fmt: skip
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((37, 45)) * 2).astype(np_type)
    b = (rng.standard_normal((45, 29)) * 2).astype(np_type)
    out = tessera.compile(src, target="cpu").load().f(a, b)
    assert out.dtype == np_type
    # f32 accumulation, then one rounding to the output type, to nearest even
    want = (f64(a) @ f64(b)).astype(np.float32).astype(np_type)
    np.testing.assert_array_equal(f64(out), f64(want))


def test_arguments_are_checked_by_name(tmp_path: Path) -> None:
    lib = tessera.compile_file(ROOT / "examples/mlp.tsr", target="cpu").load()
    a = np.ones((4, 6), ml_dtypes.bfloat16)
    b = np.ones((5, 3), ml_dtypes.bfloat16)
    bias = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"'B' has shape \(5, 3\): dim K should be 6"):
        lib.linear_gelu(a, b, bias)
    with pytest.raises(TypeError, match="'A' is float32, the kernel takes bf16"):
        lib.linear_gelu(a.astype(np.float32), b, bias)
    with pytest.raises(ValueError, match="'A' must be C-contiguous"):
        lib.linear_gelu(np.ones((6, 4), ml_dtypes.bfloat16).T, np.ones((6, 3), a.dtype), bias)
    frozen = np.empty((4, 3), ml_dtypes.bfloat16)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="'out' is the result but is read-only"):
        lib.linear_gelu(a, np.ones((6, 3), a.dtype), bias, out=frozen)
    with pytest.raises(TypeError, match="missing bias"):
        lib.linear_gelu(a, np.ones((6, 3), a.dtype))
    with pytest.raises(AttributeError, match="no function 'mlp2'"):
        lib.mlp2  # noqa: B018


def test_a_symbol_named_twice_in_one_shape_must_agree() -> None:
    src = """
@kernel
def square(x: Tensor["N", "N", f32]) -> Tensor["N", "N", f32]:
    return x @ x
"""
    lib = tessera.compile(src, target="cpu").load()
    with pytest.raises(ValueError, match=r"'x' has shape \(3, 4\): dim N should be 3"):
        lib.square(np.ones((3, 4), np.float32))
    x = np.random.default_rng(0).standard_normal((3, 3)).astype(np.float32)
    np.testing.assert_allclose(lib.square(x), f64(x) @ f64(x), rtol=1e-5, atol=1e-5)


def test_scalars_left_out_take_the_files_defaults() -> None:
    """fused_adam's beta1, beta2 and eps default to 0.9, 0.999 and 1e-8 in the .tsr file:
    a call without them matches the float64 reference with those values, and a scalar
    of the wrong kind is refused by name instead of being cut to fit."""
    lib = tessera.compile_file(ROOT / "tessera/stdlib/fused_adam.tsr", target="cpu").load()
    rng = np.random.default_rng(5)
    param, grad, m = (rng.standard_normal(1100).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal(1100)).astype(np.float32)
    want = adam(f64(param), f64(grad), f64(m), f64(v), 1e-2, 3, 0.9, 0.999, 1e-8)
    lib.fused_adam(param, grad, m, v, lr=1e-2, step=3)
    for name, have in (("param", param), ("exp_avg", m), ("exp_avg_sq", v)):
        np.testing.assert_allclose(have, want[name], rtol=1e-5, atol=1e-6)
    assert "beta1: float = 0.9" in lib.fused_adam.__doc__
    with pytest.raises(TypeError, match=r"fused_adam\(\): 'step' is int, given 2.5"):
        lib.fused_adam(param, grad, m, v, lr=1e-2, step=2.5)
    with pytest.raises(TypeError, match=r"'lr' is float, given '0.1'"):
        lib.fused_adam(param, grad, m, v, lr="0.1", step=3)
    m.flags.writeable = False
    with pytest.raises(ValueError, match="'exp_avg' is updated in place but is read-only"):
        lib.fused_adam(param, grad, m, v, lr=1e-2, step=3)


def test_guards_are_checked() -> None:
    lib = tessera.compile_file(ROOT / "examples/attention.tsr", target="cpu").load()
    q = np.ones((1, 1, 8, 160), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="D = 160 breaks D <= 128"):
        lib.attention(q, q, q)
    # a declared size that the computed result fixes to 1: the check names the size
    src = (
        '@kernel\ndef column(v: Tensor["N", f32], m: Tensor["N", "N", f32]) -> '
        'Tensor["N", "N", f32]:\n    return m @ v[:, None]\n'
    )
    v = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"N = 3 breaks N == 1 \(result shape\)"):
        tessera.compile(src, target="cpu").load().column(v, np.ones((3, 3), np.float32))


def test_the_shared_object_is_cached(tmp_path: Path) -> None:
    source = tessera.compile_file(ROOT / "examples/norms.tsr", target="cpu").source
    flags = ["-std=c++17", "-O1", "-fopenmp", "-shared", "-fPIC"]
    first = build(source, flags)
    stamp = first.stat().st_mtime_ns
    assert build(source, flags) == first and first.stat().st_mtime_ns == stamp
    assert build(source + "\n", flags) != first


def test_metadata_describes_the_entries() -> None:
    meta = json.loads(tessera.compile_file(ROOT / "examples/mlp.tsr", target="cpu")
                      .inspect_ir("meta"))  # fmt: skip
    mlp = next(f for f in meta["functions"] if f["name"] == "mlp")
    assert mlp["symbol"] == "tessera_mlp" and mlp["dims"] == ["T", "D", "F"]
    assert [p["name"] for p in mlp["params"]] == ["x", "W_in", "b_in", "W_out", "b_out", "out"]
    assert mlp["params"][-1]["io"] == "out" and mlp["kernels"] == ["mlp_k0", "mlp_k1"]


def test_a_library_says_what_it_holds() -> None:
    """Its repr names the file, the target and the functions; an unknown function's
    error lists them."""
    source = 'def f(x: Tensor["N", f32]) -> Tensor["N", f32]:\n    return x * 2.0\n'
    lib = tessera.compile(source + source.replace("def f", "def g"), "two.tsr", target="cpu")
    loaded = lib.load()
    assert repr(loaded) == "<CpuLibrary of two.tsr for cpu native: f, g>"
    with pytest.raises(AttributeError, match=r"no function 'h' \(the file defines: f, g\)"):
        loaded.h  # noqa: B018


SANITIZED = """
import sys, numpy as np
sys.path.insert(0, {root!r})
import tessera
from tessera.runtime.cpu import load
from tests.reference import CASES, F32_MATMUL_SOURCE, f32_attention_source
flags = ["-std=c++17", "-O0", "-g", "-fopenmp", "-shared", "-fPIC",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
for case in CASES:
    program = tessera.compile_file(case.path, target="cpu")
    fn = getattr(load(program.source, program.ir("meta"), flags), case.function)
    fn(**case.make(np.random.default_rng(0)))
for causal in (False, True):  # keys and values read in place, at ragged sizes
    program = tessera.compile(f32_attention_source(causal), target="cpu")
    fn = load(program.source, program.ir("meta"), flags).attention
    rng = np.random.default_rng(1)  # three allocations: a read past one is caught
    fn(*(rng.standard_normal((1, 2, 97, 80), dtype=np.float32) for _ in range(3)))
program = tessera.compile(F32_MATMUL_SOURCE, target="cpu")  # the left operand in place
rng = np.random.default_rng(2)
load(program.source, program.ir("meta"), flags).sgemm(
    rng.standard_normal((259, 301), dtype=np.float32),
    rng.standard_normal((301, 37), dtype=np.float32))
# every permutation and reduction axis: reshapes, swaps and copies of ragged tensors
from tests.test_axes import PERMUTATIONS, REDUCTIONS, SHAPE, SOFTMAXES, _source
program = tessera.compile(_source(), target="cpu")
axes = load(program.source, program.ir("meta"), flags)
x = {{rank: rng.standard_normal(SHAPE[:rank], dtype=np.float32) for rank in (3, 4)}}
for perm in PERMUTATIONS:
    getattr(axes, "permuted_" + "".join(map(str, perm)))(x[len(perm)])
for kind, rank, axis, keepdims in REDUCTIONS:
    getattr(axes, f"{{kind}}_{{rank}}_{{axis}}_{{int(keepdims)}}")(x[rank])
for rank, axis in SOFTMAXES:
    getattr(axes, f"softmax_{{rank}}_{{axis}}")(x[rank])
# intermediates live in blocks the calling thread keeps: a larger call must grow them
for shape in ((2, 3, 5), (40, 33, 29), (3, 4, 2)):
    axes.sum_3_0_0(rng.standard_normal(shape, dtype=np.float32))
print("clean")
"""


@pytest.mark.exhaustive
def test_every_case_is_clean_under_address_and_undefined_sanitizers() -> None:
    done = run_sanitized(SANITIZED.format(root=str(ROOT)), ROOT)
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr[-4000:]


def test_online_softmax_apart_from_its_accumulate() -> None:
    """When p is used on its way to softmax_accumulate, the two ops run as separate
    calls rather than fused into one pass: that path against the definition too."""
    src = """\
@kernel
def half_attention(q: Tensor["BH", "S", "D", f32], k: Tensor["BH", "S", "D", f32],
                   v: Tensor["BH", "S", "D", f32]) -> Tensor["BH", "S", "D", f32]:
    T = tile.context()
    qb = tile.load(q, rows=T.m, cols=T.d)
    acc = tile.zeros((T.m, T.d), f32)
    m = tile.full((T.m,), -INF)
    l = tile.zeros((T.m,), f32)
    for nblk in tile.range_n(k.shape, T.n):
        kb = tile.load(k, nblk, cols=T.d)
        vb = tile.load(v, nblk, cols=T.d)
        s = tile.dot(qb, tile.transpose(kb)) * tile.rsqrt(float(q.shape[2]))
        p, m_c, l_c = tile.softmax_online(s)
        acc, m, l = tile.softmax_accumulate(acc, m, l, p * 0.5, vb, m_c, l_c)
    return acc / l[:, None]
"""
    program = tessera.compile(src, target="cpu")
    assert "tsr::softmax_online(" in program.source and "tsr::attend(" not in program.source
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((3, 150, 64), dtype=np.float32) for _ in range(3))
    out = np.full_like(q, np.nan)
    program.load().half_attention(q, k, v, out=out)
    s = f64(q) @ f64(k).transpose(0, 2, 1) / 8.0
    p = np.exp(s - s.max(axis=2, keepdims=True))
    want = 0.5 * (p / p.sum(axis=2, keepdims=True)) @ f64(v)
    assert np.abs(out - want).max() / np.abs(want).max() < 1e-5


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq, dim", [(300, 64), (97, 80)])
def test_f32_attention_reads_keys_and_values_in_place(causal: bool, seq: int, dim: int) -> None:
    """f32 keys and values are read from the tensors themselves, not copied into a tile:
    the key block's transpose and the product with the value block stop at the live
    corner, so no read leaves the tensor. Ragged sequence lengths (the last block
    short) and a head dim that is not a multiple of the vector width test just that."""
    program = tessera.compile(f32_attention_source(causal), target="cpu")
    assert "load_tile(k_tile" not in program.source and "load_tile(v_tile" not in program.source
    rng = np.random.default_rng(seq)
    q, k, v = (rng.standard_normal((2, 3, seq, dim), dtype=np.float32) for _ in range(3))
    out = np.full_like(q, np.nan)
    program.load().attention(q, k, v, out=out)
    want = attention(q, k, v, causal=causal)
    assert np.abs(out - want).max() / np.abs(want).max() < 1e-5


@pytest.mark.parametrize("m, k, n", [(300, 600, 290), (259, 301, 37), (7, 5, 3)])
def test_f32_matmul_reads_its_left_operand_in_place(m: int, k: int, n: int) -> None:
    """An f32 A is read from the tensor with its own row stride, not copied into a tile:
    the product stops at the live corner, so a ragged last row block or K step reads
    nothing past the tensor. K of 600 takes three K steps, the last one short."""
    program = tessera.compile(F32_MATMUL_SOURCE, target="cpu")
    source = program.source  # A read in place; B copied, on its live corner only
    assert "_corner(a_tile" not in source and "load_tile(a_tile" not in source
    assert "load_corner(b_tile" in source
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    out = np.full((m, n), np.nan, dtype=np.float32)
    program.load().sgemm(a, b, out=out)
    want = f64(a) @ f64(b)
    assert np.abs(out - want).max() / np.abs(want).max() < 1e-5


TRANSPOSE_CHECK = """\
#include "tessera_tile.hpp"
#include <cstdio>
int main() {
  const long shapes[][2] = {{16, 16}, {128, 64}, {37, 50}, {5, 3}, {64, 100}};
  for (const auto& s : shapes) {
    std::vector<float> x(s[0] * s[1]), out(s[0] * s[1], -1.0f);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
    tsr::transpose(out.data(), x.data(), s[0], s[1]);
    for (long i = 0; i < s[0]; ++i)
      for (long j = 0; j < s[1]; ++j)
        if (out[j * s[0] + i] != x[i * s[1] + j]) return std::printf("%ld x %ld\\n", s[0], s[1]);
  }
  std::puts("ok");
}
"""


MMA_CHECK = """\
#include "tessera_tile.hpp"
#include <cstdio>
// mma and dot against their definition on live corners of every kind: rows in whole
// blocks and a short one, columns in whole panels and a tail, k of 0 and more. Small
// integers keep every sum exact whatever the order. `out` starts as garbage (a dot,
// and an mma into another array) or as acc (an mma in place); past the live corner it
// must hold acc, or 0 for a dot.
int main() {
  const long M = 24, N = 80, K = 9, ld_a = 11, ld_b = 83;
  std::vector<float> a(M * ld_a), b(K * ld_b), acc(M * N), out(M * N);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i * 7 % 13) - 6;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i * 5 % 11) - 5;
  for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = static_cast<float>(i % 17);
  for (long m : {0L, 1L, 5L, 7L, 8L, 9L, 17L, 24L})
    for (long n : {0L, 1L, 15L, 16L, 31L, 33L, 64L, 80L})
      for (long k : {0L, 1L, 9L})
        for (int mode = 0; mode < 3; ++mode) {  // dot, mma, mma in place
          if (mode == 2) out = acc; else std::fill(out.begin(), out.end(), 1e30f);
          if (mode == 0) tsr::dot(out.data(), a.data(), b.data(), M, N, m, n, k, ld_a, ld_b);
          if (mode > 0)
            tsr::mma(out.data(), a.data(), b.data(), mode == 1 ? acc.data() : out.data(), M,
                     N, m, n, k, ld_a, ld_b);
          for (long r = 0; r < M; ++r)
            for (long c = 0; c < N; ++c) {
              float want = mode == 0 ? 0.0f : acc[r * N + c];
              for (long p = 0; r < m && c < n && p < k; ++p)
                want += a[r * ld_a + p] * b[p * ld_b + c];
              if (out[r * N + c] != want)
                return std::printf("mode %d m %ld n %ld k %ld: out[%ld, %ld] = %g\\n", mode,
                                   m, n, k, r, c, out[r * N + c]);
            }
        }
  std::puts("ok");
}
"""

EXP_CHECK = """\
#include "tessera_tile.hpp"
#include <cstdio>
#include <cstring>
// exp_nonpositive against exp at every 61st float from -0 down past -100, and at the
// edges: where exp flushes to 0, -inf and NaN.
int main() {
  std::vector<float> x;
  for (std::uint32_t bits = 0x80000000u; bits <= 0xC2D00000u; bits += 61)
    x.push_back(tsr::float_of(bits));
  for (float e : {tsr::kExpLow, -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::max()})
    for (float y : {e, std::nextafter(e, 0.0f), std::nextafter(e, -1e30f)}) x.push_back(y);
  std::vector<float> fast(x.size()), full(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) fast[i] = tsr::exp_nonpositive(x[i]);
  for (std::size_t i = 0; i < x.size(); ++i) full[i] = tsr::exp(x[i]);
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::memcmp(&fast[i], &full[i], 4) != 0 && !(fast[i] != fast[i] && full[i] != full[i]))
      return std::printf("x = %a: %a, exp %a\\n", x[i], fast[i], full[i]);
  std::printf("ok %zu\\n", x.size());
}
"""


def _run_header_check(program: str, flags: list[str], tmp_path: Path) -> str:
    """Build a C++ program against the CPU tile header; its output."""
    (tmp_path / "t.cpp").write_text(program)
    header = ROOT / "tessera/templates/cpu"
    build = subprocess.run(["g++", "-std=c++17", *flags, f"-I{header}", "t.cpp", "-o", "t"],
                           cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert build.returncode == 0, build.stderr
    return subprocess.run([str(tmp_path / "t")], capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize("arch", [[], ["-march=native"]], ids=["baseline", "native"])
def test_register_transpose_matches_the_definition(arch: list[str], tmp_path: Path) -> None:
    """Whole blocks go through shuffles of kLanes-wide vectors (8 or 16 with AVX-512),
    the rest element by element: both, at several ragged shapes."""
    assert _run_header_check(TRANSPOSE_CHECK, ["-O2", *arch], tmp_path) == "ok"


@pytest.mark.parametrize("arch", [[], ["-march=native"]], ids=["baseline", "native"])
def test_mma_and_dot_match_the_definition(arch: list[str], tmp_path: Path) -> None:
    """The micro-kernel's edges: a short block of rows is compiled for its height, and
    columns past the last whole panel run on zero-padded copies. Neither may read or
    write past the live corner, and a dot must not add what `out` held before."""
    assert _run_header_check(MMA_CHECK, ["-O2", *arch], tmp_path) == "ok"


def test_softmax_exp_equals_exp_where_softmax_takes_it(tmp_path: Path) -> None:
    """Online softmax's exponents are never positive, and there a shorter exp serves. It
    must give exp's bits, since the tests of attention would not see a one-ulp slip. Built
    with the generated code's flags, so both loops vectorize as they do there."""
    flags = [f for f in DEFAULT_FLAGS if f not in ("-shared", "-fPIC")]
    out = _run_header_check(EXP_CHECK, flags, tmp_path)
    assert out.startswith("ok ") and int(out.split()[1]) > 10**7, out


def test_vectorizable_exp_and_tanh_match_libm() -> None:
    src = """\
@kernel
def math(x: Tensor["N", f32], e: Tensor["N", f32], t: Tensor["N", f32]):
    T = tile.context()
    v = tile.load(x, rows=T.m)
    tile.store(e, tile.exp(v))
    tile.store(t, tile.tanh(v))
"""
    x = np.concatenate([np.linspace(-100, 89, 20011), [-np.inf, np.inf, np.nan, 0.0]])
    x = x.astype(np.float32)
    e, t = np.full_like(x, 7.0), np.full_like(x, 7.0)
    tessera.compile(src, target="cpu").load().math(x, e, t)
    want_e, want_t = np.exp(x.astype(np.float64)), np.tanh(x.astype(np.float64))
    normal = (want_e > np.finfo(np.float32).tiny) & (want_e < np.finfo(np.float32).max)
    assert np.max(np.abs(e[normal] - want_e[normal]) / want_e[normal]) < 2.5e-7
    assert e[-4] == 0.0 and e[-3] == np.inf and np.isnan(e[-2]) and e[-1] == 1.0
    assert np.all(e[~normal & np.isfinite(x) & (x < 0)] <= np.finfo(np.float32).tiny)
    finite = np.isfinite(x)
    assert np.max(np.abs(t[finite] - want_t[finite])) < 3e-7
    assert (t[-4], t[-3]) == (-1.0, 1.0) and np.isnan(t[-2])


def test_keyword_only_parameters_are_taken_by_name_only() -> None:
    """As in Python: a parameter after a bare ``*`` cannot be passed by position, and
    the callable's docstring shows the ``*``."""
    src = """\
@kernel
def f(x: Tensor["N", f32], *, scale: float, shift: float = 1.0) -> Tensor["N", f32]:
    return x * scale + shift
"""
    f = tessera.compile(src, target="cpu").load().f
    assert f.__doc__ == "f(x: f32[N], *, scale: float, shift: float = 1.0, out=None)"
    x = np.random.default_rng(2).standard_normal(13, dtype=np.float32)
    with pytest.raises(TypeError, match=r"takes 1 positional arguments \(scale, shift by name"):
        f(x, 2.0)
    np.testing.assert_allclose(f(x, scale=2.0), f64(x) * 2.0 + 1.0, rtol=1e-6)


def test_a_loop_that_only_stores_runs() -> None:
    check_store_in_a_loop("cpu")


def test_a_loop_in_column_blocks_without_a_product_runs() -> None:
    check_column_blocks("cpu")


def test_integer_loads_stores_and_casts() -> None:
    check_integers(tessera.compile(INTEGERS, target="cpu").load())


def test_sizes_of_zero_run() -> None:
    check_zero_sizes(tessera.compile(ZERO_SIZES, target="cpu").load())


def test_one_element_per_batch_broadcast_over_its_rows() -> None:
    """``x + per_batch[:, None, None]`` and the padding mask ``arange(S) < lengths[:,
    None, None]``: a kernel over each batch's ``[H, S]`` rows reads one element of the
    ``[B]`` operand (a tile of no axes, loaded as one element; an internal error
    before)."""
    source = (
        'def f(x: Tensor["B", "H", "S", f32], per_batch: Tensor["B", f32], '
        'lengths: Tensor["B", i32]) -> Tensor["B", "H", "S", f32]:\n'
        "    S = x.shape[-1]\n"
        "    return where(arange(S) < lengths[:, None, None], x + per_batch[:, None, None], "
        "-1.0)\n"
    )
    lib: Any = tessera.compile(source, "batch.tsr", target="cpu").load()
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    per_batch = rng.standard_normal(3).astype(np.float32)
    lengths = np.array([4, 0, 7], np.int32)
    poison = np.full(x.shape, np.nan, np.float32)
    want = np.where(np.arange(7) < lengths[:, None, None], x + per_batch[:, None, None], -1.0)
    np.testing.assert_allclose(lib.f(x, per_batch, lengths, out=poison), want, rtol=1e-6)
