"""The CPU backend's low-precision products (``docs/numerics.md``): a product of two bf16
tensors accumulated in f32 (``tsr::mma_bf16``) runs on ``vdpbf16ps`` where the build
targets AVX512_BF16, a product of two i8 tiles (``tsr::mma_i8``: a dot, or one added to an
accumulator) on ``vpdpbusd`` where it targets AVX512_VNNI, and both on the f32
micro-kernel otherwise or with ``-DTSR_PORTABLE_SUMS``.

Each path is checked bit for bit against a NumPy emulation of its order of sums, on random
inputs at ragged sizes (no multiple of any tile; K past one K block; odd K blocks), with
the outputs poisoned first, and against a float64 reference within the bound of f32
summation. The fast path runs only on a CPU that has the instruction: on one without it,
the default build is checked to be the portable one, and the test of the fast path says
that it could not run."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.runtime import cpu as cpu_runtime

from .helpers import run_sanitized
from .test_cuda import needs_gxx

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.execute, needs_gxx]

BF16 = ml_dtypes.bfloat16

#: A graph-level product (the library's gemm, K blocks of 512), a tile kernel's
#: accumulating product over K blocks of 3 (odd: each block's last pair is padded), and a
#: tile kernel's dot from zero (``tsr::mma_bf16<true>``) over one whole-K block.
SOURCE = """
@kernel
def matmul_bf16(a: Tensor["M", "K", bf16], b: Tensor["K", "N", bf16]) -> Tensor["M", "N", f32]:
    return a @ b


@kernel
def odd_blocks(a: Tensor["M", "K", bf16], b: Tensor["K", "N", bf16]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(a.shape[-1], 3):
        acc += tile.dot(tile.load(a, rows=T.m, cols=kb), tile.load(b, kb, cols=T.n))
    return acc


@kernel
def one_block(a: Tensor["M", 45, bf16], b: Tensor[45, "N", bf16]) -> Tensor["M", "N", f32]:
    T = tile.context()
    return tile.dot(tile.load(a, rows=T.m, cols=45), tile.load(b, rows=45, cols=T.n)) * 1.0
"""

#: The K block each function's loop reads (the library gemm's T.k).
BLOCKS = {"matmul_bf16": 512, "odd_blocks": 3, "one_block": 45}
#: (M, K, N): ragged everywhere; the second and third run past one K block of the gemm.
SIZES = [(37, 45, 29), (130, 259, 67), (70, 1030, 45)]
SMALLEST_NORMAL = np.float32(2.0**-126)


def _macros(flags: tuple[str, ...]) -> str:
    """The macros g++ predefines under ``flags`` (how a build knows its instructions)."""
    done = subprocess.run(["g++", *flags, "-dM", "-E", "-x", "c++", "-"], input="",
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout


@functools.cache
def _has_pairs() -> bool:
    """Whether a default build (``-march=native``) takes the ``vdpbf16ps`` path."""
    macros = _macros(("-march=native",))
    return "__AVX512BF16__" in macros and "__AVX512BW__" in macros


@functools.cache
def _libraries() -> dict[str, object]:
    """The program built three ways: by default, with ``-DTSR_PORTABLE_SUMS``, and for
    this CPU without AVX512_BF16 (as a CPU without it would build it)."""
    program = tessera.compile(SOURCE, filename="bf16.tsr", target="cpu")
    meta = program.ir("meta")
    flags = list(meta["build"]["flags"])
    return {
        "default": cpu_runtime.load(program.source, meta, flags),
        "portable": cpu_runtime.load(program.source, meta, [*flags, "-DTSR_PORTABLE_SUMS"]),
        "no_bf16": cpu_runtime.load(program.source, meta, [*flags, "-mno-avx512bf16"]),
    }


def _flush(x: np.ndarray) -> np.ndarray:
    """Subnormal f32s to zero, keeping the sign: the instruction's DAZ and FTZ."""
    return np.where(np.abs(x) < SMALLEST_NORMAL, np.copysign(np.float32(0), x), x).astype(
        np.float32
    )


def pair_sums(a: np.ndarray, b: np.ndarray, block: int) -> np.ndarray:
    """``vdpbf16ps``'s sums of ``a @ b``: within each K block of ``block``, pairs of k
    (2p, 2p + 1) from the block's start, the last one padded with a zero product when the
    block is odd; of each pair the odd k first, then the even, each an FMA into the f32
    sum rounded to nearest even, inputs and results subnormal read as zero."""
    fa, fb = _flush(a.astype(np.float32)), _flush(b.astype(np.float32))
    m, k = fa.shape
    s = np.zeros((m, fb.shape[1]), np.float32)
    zero = np.zeros_like(s)
    for start in range(0, k, block):
        size = min(block, k - start)
        for p in range(0, size, 2):
            for i in (p + 1, p):  # the odd one first
                # bf16 products are exact in f32 at these magnitudes: the FMA rounds once.
                prod = fa[:, start + i, None] * fb[None, start + i] if i < size else zero
                s = _flush(s + prod)
    return s


def sequential_sums(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The portable sums: one FMA per k, k ascending, as every other target adds."""
    fa, fb = a.astype(np.float32), b.astype(np.float32)
    s = np.zeros((fa.shape[0], fb.shape[1]), np.float32)
    for i in range(fa.shape[1]):
        s = s + fa[:, i, None] * fb[None, i]
    return s


def _inputs(m: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random bf16 operands, a few of them subnormal (which the instruction reads as 0)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    a.flat[rng.integers(0, a.size, 5)] = np.float32(3e-39)  # subnormal in bf16 too
    return a, b


def _call(function: object, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The result, written over two poisons that must not show."""
    results = []
    for poison in (np.nan, -7.0):
        out = np.full((a.shape[0], b.shape[1]), poison, np.float32)
        function(a, b, out=out)  # type: ignore[operator]
        results.append(out)
    np.testing.assert_array_equal(results[0].view(np.uint32), results[1].view(np.uint32))
    return results[0]


def _check_reference(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Within f32 summation's bound of the float64 product: K * 2^-24 * sum |a| |b|."""
    fa, fb = a.astype(np.float64), b.astype(np.float64)
    bound = a.shape[1] * 2.0**-24 * (np.abs(fa) @ np.abs(fb)) + 1e-30
    assert np.all(np.abs(got - fa @ fb) <= bound)


@pytest.mark.parametrize(("m", "k", "n"), SIZES)
@pytest.mark.parametrize("function", BLOCKS)
def test_the_portable_build_adds_one_product_at_a_time(function: str, m: int, k: int, n: int):
    """``-DTSR_PORTABLE_SUMS``, and a build for a CPU without the instruction, give the
    sums of every other target, bit for bit, on any CPU."""
    if function == "one_block":
        k = 45
    a, b = _inputs(m, k, n, seed=m + k + n)
    want = sequential_sums(a, b)
    for build in ("portable", "no_bf16"):
        got = _call(getattr(_libraries()[build], function), a, b)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=build)
        _check_reference(got, a, b)


@pytest.mark.parametrize(("m", "k", "n"), SIZES)
@pytest.mark.parametrize("function", BLOCKS)
def test_the_default_build_adds_pairs_where_the_cpu_has_vdpbf16ps(
    function: str, m: int, k: int, n: int
):
    """On a CPU with AVX512_BF16, the default build's sums are the instruction's (the
    emulation above, which differs from the portable sums); on one without, they are the
    portable sums."""
    if function == "one_block":
        k = 45
    a, b = _inputs(m, k, n, seed=m * k + n)
    got = _call(getattr(_libraries()["default"], function), a, b)
    want = pair_sums(a, b, BLOCKS[function]) if _has_pairs() else sequential_sums(a, b)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    _check_reference(got, a, b)


def test_the_pair_emulation_is_not_the_portable_order() -> None:
    """The fast path's check can fail: the two orders differ on these inputs, so a build
    that took the wrong path would not pass it."""
    a, b = _inputs(70, 1030, 45, seed=1)
    assert not np.array_equal(pair_sums(a, b, 512), sequential_sums(a, b))
    if not _has_pairs():
        pytest.skip(
            "this CPU has no AVX512_BF16 (g++ -march=native defines no __AVX512BF16__): "
            "the fast path's bits are not checked here, the portable ones are"
        )


@pytest.mark.parametrize("compiler", ["g++", "clang++"])
@pytest.mark.parametrize(
    "flags", [("-march=native",), ("-march=native", "-DTSR_PORTABLE_SUMS"), ("-march=x86-64",)]
)
def test_bf16_products_compile_warning_free(compiler: str, flags: tuple[str, ...],
                                            tmp_path: Path) -> None:  # fmt: skip
    """With the instruction, without it (the CI machine may have no AVX-512) and with the
    portable sums asked for."""
    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    cpp = tmp_path / "k.cpp"
    cpp.write_text(tessera.compile(SOURCE, filename="bf16.tsr", target="cpu").source)
    done = subprocess.run(
        [compiler, "-std=c++17", "-O2", "-fopenmp", "-Wall", "-Wextra", "-Werror", *flags,
         "-c", str(cpp), "-o", "k.o"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_only_files_with_bf16_products_carry_them() -> None:
    """The product's paragraphs of the header go only into a file that calls it: an f32
    matmul, or a bf16 one accumulated in bf16, carries none of them."""
    bf16 = tessera.compile(SOURCE, filename="bf16.tsr", target="cpu").source
    assert "tsr::mma_bf16(" in bf16 and "tsr::mma_bf16<true>(" in bf16
    assert "inline void dot_pairs" in bf16 and "_mm512_dpbf16_ps" in bf16
    for dtype in ("f32", "bf16 @accum(bf16)"):
        source = tessera.compile(
            f'@kernel\ndef f(a: Tensor["M", "K", {dtype}], b: Tensor["K", "N", {dtype}])'
            f' -> Tensor["M", "N", {dtype.split()[0]}]:\n    return a @ b\n',
            target="cpu",
        ).source
        assert not re.search(r"mma_bf16|dot_pairs|pack_pairs|dpbf16|TSR_PORTABLE_SUMS", source)
        assert not re.search(r"mma_i8|dot_quads|dpbusd", source)
    assert not re.search(r"mma_i8|dot_quads|dpbusd", bf16)


# -- int8 products ----------------------------------------------------------------------

#: An i8 dot per K block of 64, summed in f32 (the shape of ``w8a8``'s loop), and one dot
#: over a whole K of 1100, whose sums can pass 2^24, where f32 sums stop being exact.
I8_SOURCE = """
@kernel
def blocks_i8(x: Tensor["M", "K", i8], w: Tensor["K", "N", i8]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(x.shape[-1], 64):
        acc += tile.cast(tile.dot(tile.load(x, rows=T.m, cols=kb), tile.load(w, kb, cols=T.n)),
                         f32)
    return acc


@kernel
def long_i8(x: Tensor["M", 1100, i8], w: Tensor[1100, "N", i8]) -> Tensor["M", "N", f32]:
    T = tile.context()
    return tile.cast(tile.dot(tile.load(x, rows=T.m, cols=1100),
                              tile.load(w, rows=1100, cols=T.n)), f32)
"""

#: Products added to an accumulator (an int8 GEMM's main loop): an i32 one over K blocks
#: of 64, an f32 one over K blocks of 70 (not a multiple of four: each block's last quad
#: is padded), and an f32 one over K blocks of 1100, whose sums pass 2^24.
MMA_SOURCE = """
@kernel
def mma_i32(x: Tensor["M", "K", i8], w: Tensor["K", "N", i8]) -> Tensor["M", "N", i32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), i32)
    for kb in tile.range_n(x.shape[-1], 64):
        acc += tile.dot(tile.load(x, rows=T.m, cols=kb), tile.load(w, kb, cols=T.n))
    return acc


@kernel
def mma_f32(x: Tensor["M", "K", i8], w: Tensor["K", "N", i8]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(x.shape[-1], 70):
        acc += tile.dot(tile.load(x, rows=T.m, cols=kb), tile.load(w, kb, cols=T.n))
    return acc


@kernel
def mma_long(x: Tensor["M", "K", i8], w: Tensor["K", "N", i8]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(x.shape[-1], 1100):
        acc += tile.dot(tile.load(x, rows=T.m, cols=kb), tile.load(w, kb, cols=T.n))
    return acc
"""


@functools.cache
def _has_vnni() -> bool:
    """Whether a default build (``-march=native``) takes the ``vpdpbusd`` path."""
    macros = _macros(("-march=native",))
    return "__AVX512VNNI__" in macros and "__AVX512BW__" in macros


@functools.cache
def _i8_libraries() -> dict[str, object]:
    """The int8 program built by default, with the portable sums, and without VNNI."""
    program = tessera.compile(I8_SOURCE + MMA_SOURCE, filename="i8.tsr", target="cpu")
    meta = program.ir("meta")
    flags = list(meta["build"]["flags"])
    assert program.source.count("tsr::mma_i8<true>(") == 2
    assert program.source.count("tsr::mma_i8(") == 3
    assert "tsr::mma(" not in program.source
    return {
        "default": cpu_runtime.load(program.source, meta, flags),
        "portable": cpu_runtime.load(program.source, meta, [*flags, "-DTSR_PORTABLE_SUMS"]),
        "no_vnni": cpu_runtime.load(program.source, meta, [*flags, "-mno-avx512vnni"]),
    }


@pytest.mark.parametrize("build", ["default", "portable", "no_vnni"])
@pytest.mark.parametrize(("m", "k", "n"), [*SIZES, (9, 3, 33)])
def test_int8_dots_are_the_exact_sums(build: str, m: int, k: int, n: int) -> None:
    """Below 2^24 every build gives the int64 sums exactly, the extremes of i8 included."""
    rng = np.random.default_rng(m + k + n)
    x = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    x[0], w[:, 0] = -128, -128  # the offset's edge: -128 + 128 = 0
    x[-1], w[:, -1] = 127, -128
    got = _call(_i8_libraries()[build].blocks_i8, x, w)  # type: ignore[attr-defined]
    want = x.astype(np.int64) @ w.astype(np.int64)
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_int8_dots_past_2_to_the_24_are_exact_on_vnni() -> None:
    """Sums past 2^24: vpdpbusd's are the exact sums, rounded once to f32; the f32
    micro-kernel's are not (so the check can fail), and a build without VNNI gives them."""
    rng = np.random.default_rng(3)
    x = np.full((20, 1100), 127, np.int8)
    w = np.full((1100, 30), 127, np.int8)
    x[rng.random(x.shape) < 0.3] = 125
    w[rng.random(w.shape) < 0.3] = 123
    exact = (x.astype(np.int64) @ w.astype(np.int64)).astype(np.float32)
    assert exact.min() > 2**24
    portable = _call(_i8_libraries()["portable"].long_i8, x, w)  # type: ignore[attr-defined]
    assert not np.array_equal(portable, exact)
    np.testing.assert_array_equal(_call(_i8_libraries()["no_vnni"].long_i8, x, w), portable)
    default = _call(_i8_libraries()["default"].long_i8, x, w)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(default, exact if _has_vnni() else portable)
    if not _has_vnni():
        pytest.skip(
            "this CPU has no AVX512_VNNI (g++ -march=native defines no __AVX512VNNI__): "
            "the exact sums past 2^24 are not checked here, the portable ones are"
        )


def _int8_operands(m: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random i8 operands with both extremes in every row of x and column of w."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    x[:, 0], x[:, -1], w[0], w[-1] = -128, 127, 127, -128
    return x, w


def _call_i32(function: object, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """An i32 result, written over two poisons that must not show."""
    results = []
    for poison in (np.iinfo(np.int32).min, 12345):
        out = np.full((x.shape[0], w.shape[1]), poison, np.int32)
        function(x, w, out=out)  # type: ignore[operator]
        results.append(out)
    np.testing.assert_array_equal(results[0], results[1])
    return results[0]


@pytest.mark.parametrize("build", ["default", "portable", "no_vnni"])
@pytest.mark.parametrize(("m", "k", "n"), [(37, 259, 45), (130, 1030, 67), (9, 3, 33)])
def test_int8_products_into_an_accumulator_are_the_exact_sums(
    build: str, m: int, k: int, n: int
) -> None:
    """An int8 GEMM's K loop (``acc += tile.dot(x_block, w_block)``, K blocks that do not
    divide K), into an i32 or an f32 accumulator: below 2^24 every build gives the int64
    sums exactly."""
    x, w = _int8_operands(m, k, n, seed=m * k + n)
    want = x.astype(np.int64) @ w.astype(np.int64)
    assert np.abs(want).max() < 2**24
    library = _i8_libraries()[build]
    np.testing.assert_array_equal(_call_i32(library.mma_i32, x, w), want)  # type: ignore
    got = _call(library.mma_f32, x, w)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(got, want.astype(np.float32))


def block_sums(x: np.ndarray, w: np.ndarray, block: int) -> np.ndarray:
    """vpdpbusd's accumulation: each K block's exact sum added to the f32 accumulator in
    float64 and rounded once to f32."""
    acc = np.zeros((x.shape[0], w.shape[1]), np.float32)
    for start in range(0, x.shape[1], block):
        s = x[:, start : start + block].astype(np.int64) @ w[start : start + block].astype(np.int64)
        acc = (acc.astype(np.float64) + s).astype(np.float32)
    return acc


def test_int8_products_into_an_accumulator_past_2_to_the_24() -> None:
    """Past 2^24, vpdpbusd adds each block's exact sum to the accumulator with one
    rounding; the portable build (and one without VNNI) adds one product at a time. The
    two differ here, so the check can fail; and element [0, 0] tells one rounding from
    two (the block's sum rounded to f32, then the addition)."""
    x, w = _int8_operands(20, 2300, 30, seed=5)
    x[:, 1:-1] = np.where(x[:, 1:-1] < 0, 125, 127)  # large sums, of odd products
    w[1:-1] = np.where(w[1:-1] < 0, 123, 127)
    assert (x.astype(np.int64) @ w.astype(np.int64)).min() > 2**25
    # Blocks of 1100 summing to 2^24 + 2, then 2^24 + 1: one rounding of 2^25 + 3 gives
    # 2^25 + 4; rounding 2^24 + 1 to 2^24 first leaves a tie that rounds to 2^25.
    x[0], w[:, 0] = 0, 0
    for start, last in ((0, (1, 2)), (1100, (1, 1))):
        x[0, start : start + 1024], w[start : start + 1024, 0] = -128, -128
        x[0, start + 1024], w[start + 1024, 0] = last
    blocks = block_sums(x, w, 1100)
    assert blocks[0, 0] == 2**25 + 4
    sequential = sequential_sums(x, w)
    assert not np.array_equal(blocks, sequential)
    libraries = _i8_libraries()
    portable = _call(libraries["portable"].mma_long, x, w)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(portable, sequential)
    np.testing.assert_array_equal(_call(libraries["no_vnni"].mma_long, x, w), sequential)
    default = _call(libraries["default"].mma_long, x, w)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(default, blocks if _has_vnni() else sequential)
    if not _has_vnni():
        pytest.skip(
            "this CPU has no AVX512_VNNI (g++ -march=native defines no __AVX512VNNI__): "
            "the block sums past 2^24 are not checked here, the portable ones are"
        )


@pytest.mark.parametrize("compiler", ["g++", "clang++"])
@pytest.mark.parametrize(
    "flags", [("-march=native",), ("-march=native", "-DTSR_PORTABLE_SUMS"), ("-march=x86-64",)]
)
def test_int8_products_compile_warning_free(compiler: str, flags: tuple[str, ...],
                                            tmp_path: Path) -> None:  # fmt: skip
    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    cpp = tmp_path / "k.cpp"
    source = tessera.compile(I8_SOURCE + MMA_SOURCE, filename="i8.tsr", target="cpu").source
    cpp.write_text(source)
    done = subprocess.run(
        [compiler, "-std=c++17", "-O2", "-fopenmp", "-Wall", "-Wextra", "-Werror", *flags,
         "-c", str(cpp), "-o", "k.o"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


SANITIZED = """
import sys, numpy as np, ml_dtypes
sys.path.insert(0, {root!r})
import tessera
from tessera.runtime.cpu import load
from tests.test_cpu_low_precision import I8_SOURCE, MMA_SOURCE, SOURCE
flags = ["-std=c++17", "-O0", "-g", "-fopenmp", "-shared", "-fPIC", "-march=native",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
rng = np.random.default_rng(4)
bf16 = tessera.compile(SOURCE, filename="bf16.tsr", target="cpu")
i8 = tessera.compile(I8_SOURCE + MMA_SOURCE, filename="i8.tsr", target="cpu")
fast = load(bf16.source, bf16.ir("meta"), flags)
ints = load(i8.source, i8.ir("meta"), flags)
for m, k, n in ((37, 45, 29), (130, 67, 259), (9, 3, 33)):  # each operand its own block
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    fast.matmul_bf16(a, b)
    fast.odd_blocks(a, b)
    x = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    for function in (ints.blocks_i8, ints.mma_i32, ints.mma_f32):
        function(x, w)
print("clean")
"""


def test_the_products_read_nothing_past_their_tensors() -> None:
    """Both operands are read in place, in pairs and quads of k: at ragged sizes, odd and
    not multiples of four, no read leaves a tensor (AddressSanitizer, with the fast paths
    where this CPU has them)."""
    done = run_sanitized(SANITIZED.format(root=str(ROOT)), ROOT)
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr[-4000:]
