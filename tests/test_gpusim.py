"""GPU kernels at edge sizes and in fp8, on the simulated GPU of ``tests/gpusim``.

The reference cases take one ragged size per function. Here a product and attention
run at the sizes where tiling goes wrong first: one element, exactly one tile, one
past a tile, a head dim under the tile's, a sequence shorter than a key block, for
CUDA on both archs and for HIP. fp8 products, and the fp8 conversions themselves value
by value against ml_dtypes (on OpenCL too). Outputs are poisoned first; the reference
is float64 on the same inputs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.transpiler.tile import passes

from .conftest import ROOT
from .gpusim import load_hip, simulated_cupy, use_simulator
from .helpers import INTEGERS, ZERO_SIZES, check_integers, check_zero_sizes, run_sanitized
from .reference import (
    FP8,
    assert_rounded_once,
    assert_tf32_product,
    attention,
    f64,
    low_precision_product_source,
)
from .test_cuda import needs_gxx
from .test_opencl import _platform

pytestmark = [pytest.mark.execute, needs_gxx]

TARGETS = [("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", "gfx90a")]

GEMM = """\
@kernel
def mm(A: Tensor["M", "K", bf16], B: Tensor["K", "N", bf16]) -> Tensor["M", "N", f32]:
    return A @ B
"""


def _attention_source(causal: bool, dtype: str = "bf16") -> str:
    return f"""\
@kernel
def attn(q: Tensor["BH", "S", "D", {dtype}], k: Tensor["BH", "S", "D", {dtype}],
         v: Tensor["BH", "S", "D", {dtype}]) -> Tensor["BH", "S", "D", {dtype}]:
    return ops.flash_attention(q, k, v, causal={causal})
"""


def _library(
    source: str, target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch,
    edit: Callable[[str], str] | None = None, defines: dict[str, int] | None = None,
) -> Any:  # fmt: skip
    """The source's functions, built for ``target``: CUDA and HIP on the simulated GPU
    (HIP launched as CUDA is; the generated file changed by ``edit`` where given),
    OpenCL on PoCL."""
    gpu = arch if target == "cuda" else "sm_80"
    cupy = simulated_cupy(gpu)
    if edit is not None:
        cupy.RawModule = functools.partial(lambda real, code, **kw: real(edit(code), **kw),
                                           cupy.RawModule)  # fmt: skip
    use_simulator(monkeypatch, cupy)
    program = tessera.compile(source, filename="edge.tsr", target=target, arch=arch,
                              defines=defines)  # fmt: skip
    return load_hip(program) if target == "hip" else program.load()


def _function(
    source: str, target: str, arch: str, monkeypatch: pytest.MonkeyPatch,
    edit: Callable[[str], str] | None = None, defines: dict[str, int] | None = None,
) -> Any:  # fmt: skip
    """The source's one function, built for ``target`` and run on the simulated GPU."""
    (name,) = (m.group(1) for m in re.finditer(r"^def (\w+)\(", source, re.M))
    return getattr(_library(source, target, arch, monkeypatch, edit, defines), name)


def _bf16(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)


def _check(have: np.ndarray, want: np.ndarray, rtol: float) -> None:
    have = f64(have)
    assert not np.isnan(have).any(), "some outputs were never written"
    error = np.abs(have - want).max() / max(np.abs(want).max(), 1e-30)
    assert error < rtol, f"relative error {error:.2e}"


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a for _, a in TARGETS])
@pytest.mark.parametrize(
    ("m", "n", "k"),
    # ... and K long enough for the pipelines' steady state: rows of whole 16 bytes (TMA
    # on sm_90a) and not (element copies)
    [(1, 1, 1), (16, 8, 16), (33, 65, 17), (128, 128, 64), (129, 257, 80), (70, 136, 600),
     (33, 65, 301)],
)  # fmt: skip
def test_products_at_edge_sizes(
    m: int, n: int, k: int, target: str, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mm = _function(GEMM, target, arch, monkeypatch)
    rng = np.random.default_rng(m * n * k)
    a, b = _bf16(rng, m, k), _bf16(rng, k, n)
    out = np.full((m, n), np.nan, np.float32)
    mm(a, b, out=out)
    _check(out, f64(a) @ f64(b), 1e-5)


@pytest.mark.parametrize("kernel", ["gemm", "attention"])
def test_tma_pipelines_without_a_producer_warpgroup(
    kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sm_90a's TMA pipelines where every thread computes and thread 0 also copies (what a
    kernel the specialize pass leaves alone runs): GEMM and attention, long enough for
    the steady state, with rows that TMA takes and rows that it does not."""
    monkeypatch.setattr(passes, "TILE_PASSES",
                        tuple(p for p in passes.TILE_PASSES if p.name != "specialize"))  # fmt: skip
    rng = np.random.default_rng(7)

    def unspecialized(code: str) -> str:
        assert "tsr_tma_load" in code and "tsr_free" not in code
        return code

    if kernel == "gemm":
        mm = _function(GEMM, "cuda", "sm_90a", monkeypatch, edit=unspecialized)
        for k in (600, 301):
            a, b = _bf16(rng, 70, k), _bf16(rng, k, 136)
            out = np.full((70, 136), np.nan, np.float32)
            mm(a, b, out=out)
            _check(out, f64(a) @ f64(b), 1e-5)
        return
    attn = _function(_attention_source(True), "cuda", "sm_90a", monkeypatch, edit=unspecialized)
    q, k, v = (_bf16(rng, 2, 300, 64) for _ in range(3))
    out = np.full(q.shape, np.nan).astype(ml_dtypes.bfloat16)
    attn(q, k, v, out=out)
    _check(out, attention(q, k, v, True), 2e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_of_a_fixed_head_dim_runs_with_a_producer(
    causal: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attention compiled for one head dim (``-D D=64``, as the GPU benchmark compiles
    it), whose scale is a constant, on sm_90a: with a producer warpgroup, ragged S."""

    def specialized(code: str) -> str:
        assert "tsr_free" in code
        return code

    attn = _function(_attention_source(causal), "cuda", "sm_90a", monkeypatch,
                     edit=specialized, defines={"D": 64})  # fmt: skip
    rng = np.random.default_rng(9)
    q, k, v = (_bf16(rng, 2, 300, 64) for _ in range(3))
    out = np.full(q.shape, np.nan).astype(ml_dtypes.bfloat16)
    attn(q, k, v, out=out)
    _check(out, attention(q, k, v, causal), 2e-2)


def test_a_producer_refilling_a_stage_whose_batch_still_runs_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sm_90a's GEMM, its computing warpgroups freeing the stage of the batch they left
    running instead of the one before: the producer's next copy into it poisons the
    operands that batch has yet to read."""
    release = (
        "if (kb - 1 >= 0 && lid % WARPGROUP == 0) tsr_mbarrier_arrive(tsr_free + (kb - 1) % 4);"
    )

    def early(code: str) -> str:
        assert release in code
        return code.replace(
            release, "if (lid % WARPGROUP == 0) tsr_mbarrier_arrive(tsr_free + kb % 4);"
        )

    mm = _function(GEMM, "cuda", "sm_90a", monkeypatch, edit=early)
    rng = np.random.default_rng(0)
    a, b = _bf16(rng, 70, 600), _bf16(rng, 600, 136)
    out = np.full((70, 136), np.nan, np.float32)
    mm(a, b, out=out)
    assert np.isnan(out).any()


def test_attention_freeing_a_stage_before_its_products_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sm_90a's attention, its computing warpgroups freeing a stage as soon as its copies
    have landed instead of after the products that read it: the producer's next copy
    into it poisons the keys and values they have yet to read."""
    wait = "tsr_mbarrier_wait(tsr_landed + (nblk) % 2, nblk / 2 % 2);"
    release = "if (lid % WARPGROUP == 0) tsr_mbarrier_arrive(tsr_free + (nblk) % 2);"

    def early(code: str) -> str:
        assert wait in code and release in code
        return code.replace(release, "").replace(wait, wait + "\n" + release)

    attn = _function(_attention_source(False), "cuda", "sm_90a", monkeypatch, edit=early)
    rng = np.random.default_rng(0)
    q, k, v = (_bf16(rng, 1, 600, 64) for _ in range(3))
    out = np.full(q.shape, np.nan).astype(ml_dtypes.bfloat16)
    attn(q, k, v, out=out)
    assert np.isnan(f64(out)).any()


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a for _, a in TARGETS])
@pytest.mark.parametrize(
    ("bh", "s", "d", "causal"),
    [(1, 1, 64, True), (2, 17, 64, False), (1, 128, 128, True), (1, 200, 96, False),
     (1, 130, 32, True)],
)  # fmt: skip
def test_attention_at_edge_sizes(
    bh: int, s: int, d: int, causal: bool, target: str, arch: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    attn = _function(_attention_source(causal), target, arch, monkeypatch)
    rng = np.random.default_rng(bh * s * d)
    q, k, v = (_bf16(rng, bh, s, d) for _ in range(3))
    out = np.full((bh, s, d), np.nan, np.float32).astype(ml_dtypes.bfloat16)
    attn(q, k, v, out=out)
    _check(out, attention(q, k, v, causal), 2e-2)


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a for _, a in TARGETS])
def test_sizes_of_zero_run(target: str, arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check_zero_sizes(_library(ZERO_SIZES, target, arch, monkeypatch))


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a for _, a in TARGETS])
def test_integer_loads_stores_and_casts(
    target: str, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_integers(_library(INTEGERS, target, arch, monkeypatch))


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a for _, a in TARGETS])
@pytest.mark.parametrize("dtype", sorted(FP8))
def test_fp8_products_widen_exactly_and_round_once(
    dtype: str, target: str, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA widens fp8 operands to f16 for mma.sync, HIP multiplies them as floats; both
    round the f32 result once to fp8 (ragged: 37 x 45 x 29)."""
    f = _function(low_precision_product_source(dtype), target, arch, monkeypatch)
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((37, 45)) * 2).astype(FP8[dtype])
    b = (rng.standard_normal((45, 29)) * 2).astype(FP8[dtype])
    out = np.full((37, 29), np.nan).astype(FP8[dtype])
    f(a, b, out=out)
    assert_rounded_once(out, f64(a) @ f64(b))


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a for _, a in TARGETS])
@pytest.mark.parametrize("dtype", sorted(FP8))
@pytest.mark.parametrize("m, k, n", [(37, 45, 29), (150, 256, 136)])
def test_fp8_products_of_a_transposed_operand(
    m: int, k: int, n: int, dtype: str, target: str, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """``A @ B.T``: both operands K-major, which sm_90a multiplies on wgmma's fp8 form
    (k32) from the 128-byte swizzle; at a ragged size whose rows are not 16-byte aligned
    (copied element by element) and at one of whole TMA boxes and several tiles."""
    f = _function(low_precision_product_source(dtype, transposed=True), target, arch,
                  monkeypatch)  # fmt: skip
    rng = np.random.default_rng(m + k)
    a = (rng.standard_normal((m, k)) * 2).astype(FP8[dtype])
    b = (rng.standard_normal((n, k)) * 2).astype(FP8[dtype])
    out = np.full((m, n), np.nan).astype(FP8[dtype])
    f(a, b, out=out)
    assert_rounded_once(out, f64(a) @ f64(b).T)


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a for _, a in TARGETS])
@pytest.mark.parametrize("d", [64, 128])
def test_fp8_attention(d: int, target: str, arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8 attention: with a head dim of 128 fp8 (whole 128-byte rows) sm_90a takes
    ``q @ k.T`` on wgmma's fp8 form and ``p @ v``, whose ``v`` is N-major, on mma.sync;
    the two products' fragments meet in the same threads' rows."""
    attn = _function(_attention_source(False, "fp8_e4m3"), target, arch, monkeypatch,
                     defines={"D": d})  # fmt: skip
    rng = np.random.default_rng(d)
    q, k, v = (rng.standard_normal((2, 150, d)).astype(FP8["fp8_e4m3"]) for _ in range(3))
    out = np.full((2, 150, d), np.nan).astype(FP8["fp8_e4m3"])
    attn(q, k, v, out=out)
    _check(out, attention(q, k, v, False), 0.1)  # the result rounds to fp8: 2^-4


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a for _, a in TARGETS])
def test_tf32_products_read_tf32_and_round_once(
    target: str, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tf32 tensors filled with f32s that are not tf32 values: CUDA multiplies them on
    mma.sync m16n8k8 as tf32, HIP as floats, after rounding each as it is read; the f32
    result rounds once to tf32 (ragged: 37 x 45 x 29)."""
    f = _function(low_precision_product_source("tf32"), target, arch, monkeypatch)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((37, 45)).astype(np.float32)
    b = rng.standard_normal((45, 29)).astype(np.float32)
    out = np.full((37, 29), np.nan, np.float32)
    f(a, b, out=out)
    assert_tf32_product(out, a, b)


def _fp8_values(np_type: Any) -> tuple[np.ndarray, np.ndarray]:
    """Every finite fp8 value, and f32 values that test narrowing: each fp8 value, the
    midpoints between neighbours (ties go to the even one) and the floats on either
    side of them, values past the largest (overflow), and subnormals."""
    finite = np.arange(256, dtype=np.uint8).view(np_type)
    finite = np.unique(f64(finite[np.isfinite(f64(finite))]))
    mid = (finite[1:] + finite[:-1]) / 2
    below = np.nextafter(mid.astype(np.float32), np.float32(-np.inf))
    above = np.nextafter(mid.astype(np.float32), np.float32(np.inf))
    largest = finite.max()
    beyond = np.array([largest * 1.03, largest * 1.1, largest * 1.2, largest * 4, 1e30])
    tiny = float(ml_dtypes.finfo(np_type).smallest_subnormal) * np.array([0.25, 0.5, 0.75, 1.5])
    narrow = np.concatenate([finite, mid, below, above, beyond, -beyond, tiny, -tiny])
    return finite, narrow.astype(np.float32)


def _square(values: np.ndarray, dtype: Any) -> np.ndarray:
    """``values`` as rows of 16, padded with zeros."""
    padded = np.zeros(-(-len(values) // 16) * 16, dtype)
    padded[: len(values)] = values
    return padded.reshape(-1, 16)


@pytest.mark.parametrize(
    ("target", "arch"), [*TARGETS, ("opencl", None)], ids=[*(a for _, a in TARGETS), "opencl"]
)
@pytest.mark.parametrize("dtype", sorted(FP8))
def test_fp8_conversions_agree_with_ml_dtypes(
    dtype: str, target: str, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Widening every finite fp8 value and narrowing values around every one of them
    (through products with the identity, which add nothing but zeros) give ml_dtypes'
    results, value for value: ties to even, overflow to NaN (e4m3) or infinity (e5m2)."""
    source = f"""\
@kernel
def widen(x: Tensor["R", "C", {dtype}], eye: Tensor["C", "C", {dtype}]) -> Tensor["R", "C", f32]:
    return x @ eye

@kernel
def narrow(x: Tensor["R", "C", f32],
           eye: Tensor["C", "C", f32]) -> Tensor["R", "C", {dtype} @accum(f32)]:
    return x @ eye
"""
    if target == "opencl" and _platform() is not None:
        pytest.skip(f"needs pyopencl and PoCL: {_platform()}")
    np_type = FP8[dtype]
    library = _library(source, target, arch, monkeypatch)
    finite, narrow = _fp8_values(np_type)
    x = _square(finite, np_type)
    out = np.full(x.shape, np.nan, np.float32)
    library.widen(x, np.eye(16).astype(np_type), out=out)
    np.testing.assert_array_equal(out, f64(x))
    y = _square(narrow, np.float32)
    out = np.full(y.shape, np.nan).astype(np_type)
    library.narrow(y, np.eye(16, dtype=np.float32), out=out)
    np.testing.assert_array_equal(f64(out), f64(y.astype(np_type)))


SANITIZED = """
import re, sys
sys.path.insert(0, {root!r})
from tessera.runtime import cuda as cuda_runtime
from tests.gpusim import load_hip, simulated_cupy, simulated_driver
from tests.reference import CASES, check_case
cupy = simulated_cupy({arch!r}, sanitize=True)
real = cupy.RawModule
def module(code, *args, **kwargs):  # the chunk copies' masks taken away, when asked
    return real(re.sub(r"const int bytes = [^;]*;", "const int bytes = 16;", code)
                if {unmasked!r} else code, *args, **kwargs)
cupy.RawModule = module
cuda_runtime._cupy = lambda: cupy
cuda_runtime._driver = lambda: simulated_driver(sanitize=True)
for case in CASES:
    if {only!r} in (None, case.id):
        check_case(case, {target!r}, {arch!r}, **({{"load": load_hip}} if {target!r} == "hip"
                                                     else {{}}))
print("clean")
"""


@pytest.mark.exhaustive
@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a for _, a in TARGETS])
def test_every_case_is_clean_under_address_and_undefined_sanitizers(target: str, arch: str) -> None:
    """Every reference case with the simulated kernels built under AddressSanitizer and
    UBSan, in a process that preloads them: an access past a tensor, a buffer or the
    shared-memory arena, or undefined behaviour in the kernel's arithmetic, stops the
    run (``compute-sanitizer --tool memcheck`` checks the same on a GPU)."""
    script = SANITIZED.format(root=str(ROOT), arch=arch, target=target, only=None,
                              unmasked=False)  # fmt: skip
    done = run_sanitized(script, ROOT)
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr[-4000:]


def test_the_sanitizers_catch_an_unmasked_copy() -> None:
    """Chunk copies that read past a ragged edge (their masks taken away) are caught."""
    script = SANITIZED.format(root=str(ROOT), arch="sm_80", target="cuda", only="gemm:gemm",
                              unmasked=True)  # fmt: skip
    done = run_sanitized(script, ROOT)
    assert done.returncode != 0 and "heap-buffer-overflow" in done.stderr, done.stderr[-4000:]
