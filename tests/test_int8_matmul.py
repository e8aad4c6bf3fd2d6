"""``a @ b`` of int8 tensors in a graph function (``graph/int8_products.py``): an i32
tensor equal to NumPy's exact int64 product on every target, 2-D, batched and
broadcast, at ragged sizes and at a K whose sums an f32 cannot hold; a W8A8 layer's
scales after it against float64; and the products it refuses, at the user's line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tessera
from tessera.transpiler.frontend.diagnostics import CompileError
from tessera.transpiler.tile.interpret import run_function

from .builds import assert_cpu_builds_warning_free, assert_gpu_builds_warning_free
from .everywhere import built_everywhere
from .test_cpu import COMPILERS
from .test_sycl import check_syntax, needs_sycl_headers

pytestmark = pytest.mark.execute

SOURCE = """\
@jit
def int_mm(a: Tensor["M", "K", i8], b: Tensor["K", "N", i8]) -> Tensor["M", "N", i32]:
    return a @ b


@jit
def batched(a: Tensor["B", "M", "K", i8], b: Tensor["B", "K", "N", i8]
            ) -> Tensor["B", "M", "N", i32]:
    return matmul(a, b)


@jit
def broadcast(a: Tensor["B", "M", "K", i8], b: Tensor["K", "N", i8]
              ) -> Tensor["B", "M", "N", i32]:
    return a @ b


@jit
def linear_layout(a: Tensor["M", "K", i8], b: Tensor["N", "K", i8]) -> Tensor["M", "N", i32]:
    return a @ b.T


@jit
def vectors(a: Tensor["M", "K", i8], v: Tensor["K", i8], b: Tensor["K", "N", i8]
            ) -> tuple[Tensor["M", i32], Tensor["N", i32]]:
    return a @ v, v @ b


@jit
def both(x: Tensor["M", "K", i8], w: Tensor["K", "N", i8], s: Tensor["N", f32]
         ) -> tuple[Tensor["M", "N", i32], Tensor["M", "N", f32]]:
    y = x @ w
    return y, cast(y, f32) * s


@jit
def w8a8(x: Tensor["M", "K", i8], w: Tensor["K", "N", i8], x_scale: Tensor["M", f32],
         w_scale: Tensor["N", f32]) -> Tensor["M", "N", f32]:
    return cast(x @ w, f32) * x_scale[:, None] * w_scale[None, :]
"""

#: The CPU and OpenCL (whose kernels are the SIMT emitter's) here; the simulated GPUs
#: exhaustive.
built = built_everywhere(SOURCE, "cpu", "opencl")

#: A poison that no product here gives.
POISON = -123456789


def _int8(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Random int8s over the whole range, -128 and 127 among them."""
    q = rng.integers(-128, 128, shape, dtype=np.int8)
    q.flat[:2] = (-128, 127)
    return q


def _exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.int64) @ b.astype(np.int64)


def _poisoned(shape: tuple[int, ...]) -> np.ndarray:
    return np.full(shape, POISON, np.int32)


@pytest.mark.parametrize(("m", "k", "n"), [(37, 300, 45), (1, 1, 1), (70, 129, 3)])
def test_int8_product_is_numpys_exact_sum(built: Any, m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * k + n)
    a, b = _int8(rng, m, k), _int8(rng, k, n)
    have = built.int_mm(a, b, out=_poisoned((m, n)))
    assert np.asarray(have).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(have), _exact(a, b))


def test_sums_beyond_f32s_integers_are_exact(built: Any) -> None:
    """K = 2100 products of -127 (and one of -128): sums near 2^25, odd, which an f32
    cannot hold, so a product summed in f32 fails here; one column all -128 by -128
    (2^14 * 2100) and one that cancels to a small number."""
    m, k, n = 5, 2100, 9
    a = np.full((m, k), -127, np.int8)
    b = np.full((k, n), -127, np.int8)
    b[0, 0], b[:, 1], a[1] = -128, -128, -128
    b[::2, 2] = 127
    rng = np.random.default_rng(3)
    b[:, 3:] = _int8(rng, k, n - 3)
    want = _exact(a, b)
    assert np.abs(want).max() > 2**24 and want[0, 0] % 2 == 1
    have = built.int_mm(a, b, out=_poisoned((m, n)))
    np.testing.assert_array_equal(np.asarray(have), want)


def test_batched_and_broadcast_products(built: Any) -> None:
    rng = np.random.default_rng(7)
    a, b = _int8(rng, 3, 19, 203), _int8(rng, 3, 203, 21)
    have = built.batched(a, b, out=_poisoned((3, 19, 21)))
    np.testing.assert_array_equal(np.asarray(have), _exact(a, b))
    have = built.broadcast(a, b[1], out=_poisoned((3, 19, 21)))
    np.testing.assert_array_equal(np.asarray(have), _exact(a, b[1]))


def test_a_weight_stored_n_by_k_and_vectors(built: Any) -> None:
    """``a @ b.T`` of a ``[N, K]`` weight (PyTorch's Linear layout), and a vector on
    either side, with sums beyond 2^24."""
    rng = np.random.default_rng(9)
    m, k, n = 37, 2100, 45
    a, b = _int8(rng, m, k), _int8(rng, n, k)
    a[:3], b[:2] = -127, -127
    have = built.linear_layout(a, b, out=_poisoned((m, n)))
    np.testing.assert_array_equal(np.asarray(have), _exact(a, b.T))
    v, w = a[0].copy(), np.ascontiguousarray(b.T)
    left, right = built.vectors(a, v, w, out=(_poisoned((m,)), _poisoned((n,))))
    np.testing.assert_array_equal(np.asarray(left), _exact(a, v))
    np.testing.assert_array_equal(np.asarray(right), _exact(v, w))


def test_w8a8_scales_round_the_exact_sum_once(built: Any) -> None:
    """``f32(x @ w) * x_scale * w_scale``: the exact sum rounded once to f32, then each
    product rounded to f32, against the float64 reference to f32's rounding."""
    rng = np.random.default_rng(5)
    m, k, n = 37, 1500, 45
    x, w = _int8(rng, m, k), _int8(rng, k, n)
    x[0], w[:, 0] = -128, -128  # one sum of 2^14 * K, beyond 2^24
    xs = rng.uniform(0.001, 0.02, m).astype(np.float32)
    ws = rng.uniform(0.001, 0.02, n).astype(np.float32)
    have = np.asarray(built.w8a8(x, w, xs, ws, out=np.full((m, n), np.nan, np.float32)))
    exact = _exact(x, w)
    want = exact.astype(np.float64) * xs[:, None] * ws[None, :]
    np.testing.assert_allclose(have, want, rtol=3e-7, atol=0)
    # bit for bit against NumPy's f32 steps of the exact sum
    steps = exact.astype(np.float32) * xs[:, None] * ws[None, :]
    np.testing.assert_array_equal(have, steps)


def test_the_product_returned_and_scaled_too(built: Any) -> None:
    """The exact product read twice in one kernel, stored and cast: both exact."""
    rng = np.random.default_rng(8)
    m, k, n = 21, 2100, 13
    x, w = _int8(rng, m, k), _int8(rng, k, n)
    x[:4], w[:, :3] = -127, -127
    s = rng.uniform(0.5, 1.5, n).astype(np.float32)
    y, scaled = built.both(x, w, s, out=(_poisoned((m, n)), np.full((m, n), np.nan, np.float32)))
    exact = _exact(x, w)
    np.testing.assert_array_equal(np.asarray(y), exact)
    np.testing.assert_array_equal(np.asarray(scaled), exact.astype(np.float32) * s)


def _error(source: str) -> CompileError:
    with pytest.raises(CompileError) as info:
        tessera.compile(source, filename="w8a8.tsr", target="cpu")
    return info.value


def test_mixed_operands_are_an_error_at_the_product() -> None:
    error = _error(
        "@jit\n"
        'def f(a: Tensor["M", "K", i8], b: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:\n'
        "    return a @ b\n"
    )
    (diagnostic,) = error.diagnostics
    assert diagnostic.span.line == 3
    assert "different dtypes" in diagnostic.message and "cast(b, i8)" in diagnostic.message


def test_a_k_past_the_exact_range_is_an_error_at_the_product() -> None:
    error = _error(
        "@jit\n"
        'def f(a: Tensor["M", 131072, i8], b: Tensor[131072, "N", i8]) -> Tensor["M", "N", i32]:\n'
        "    y = a @ b\n"
        "    return y\n"
    )
    (diagnostic,) = error.diagnostics
    assert diagnostic.span.line == 3
    assert "131072, more than 131071" in diagnostic.message


def test_integer_arithmetic_past_f32s_integers_is_an_error_at_its_line() -> None:
    """``a @ b + c`` in i32 computes in f32 (exact below 2^24): with K = 2000 the sums
    pass 2^24, so the add is refused at its line, the product named in a note."""
    error = _error(
        "@jit\n"
        'def f(a: Tensor["M", 2000, i8], b: Tensor[2000, "N", i8], c: Tensor["M", "N", i32]'
        ') -> Tensor["M", "N", i32]:\n'
        "    y = a @ b\n"
        "    return y + c\n"
    )
    (diagnostic,) = error.diagnostics
    assert diagnostic.span.line == 4 and "cast the product to f32 first" in diagnostic.message
    assert diagnostic.notes[0].span.line == 3


def test_integer_arithmetic_on_a_symbolic_k_is_guarded_at_the_call() -> None:
    """The same with K symbolic: a K of at most 1024 runs, exact while the sums with
    ``c`` stay below 2^24 (as any i32 arithmetic of a graph function), and 1025 is
    refused."""
    source = (
        "@jit\n"
        'def f(a: Tensor["M", "K", i8], b: Tensor["K", "N", i8], c: Tensor["M", "N", i32]'
        ') -> Tensor["M", "N", i32]:\n'
        "    return a @ b + c\n"
    )
    lib = tessera.compile(source, filename="w8a8.tsr", target="cpu").load()
    rng = np.random.default_rng(4)
    a, b = np.full((3, 1000), -128, np.int8), _int8(rng, 1000, 5)
    b[:, 0] = -128
    c = rng.integers(-1000, 1000, (3, 5)).astype(np.int32)
    np.testing.assert_array_equal(lib.f(a, b, c), _exact(a, b) + c)
    with pytest.raises(ValueError, match="1024"):
        lib.f(np.ones((3, 1025), np.int8), np.ones((1025, 5), np.int8), c)


def test_the_tile_interpreter_joins_the_parts_exactly() -> None:
    """The Tile IR's reference semantics (``tile/interpret.py``) of ``gemm_i8`` and the
    ``join_i32`` after it."""
    module = tessera.compile(SOURCE, "w8a8.tsr", target="cpu", until="tile").ir("tile")
    rng = np.random.default_rng(6)
    a, b = _int8(rng, 7, 2100), _int8(rng, 2100, 5)
    a[:2], b[:, :2] = -127, -127
    out = run_function(module, "int_mm", {"a": a, "b": b})["out"]
    np.testing.assert_array_equal(out, _exact(a, b))


@pytest.mark.parametrize(
    ("target", "arch"),
    [("cpu", None), ("opencl", None), ("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", "gfx90a"),
     ("sycl", None)],
)  # fmt: skip
def test_each_block_of_k_sums_below_two_to_the_24(target: str, arch: str | None) -> None:
    """``gemm_i8`` splits each block's dot exactly only while it is below 2^24: every
    target's schedule takes at most 1024 rows of K a block (2^14 each)."""
    program = tessera.compile(SOURCE, "w8a8.tsr", target=target, arch=arch, until="sched")
    blocks = [dict(launch.tiles)["T.k"] for p in program.ir("sched").programs
              for launch in p.launches if launch.template == "gemm_i8"]  # fmt: skip
    assert blocks and all(0 < k <= 1024 for k in blocks), blocks


def test_a_schedule_of_longer_blocks_of_i8_is_refused() -> None:
    """A schedule (explicit, or a tuned one) whose i8 blocks of K could sum past 2^24."""
    error = _error(
        "@kernel.schedule(Schedule(block=(64, 64), k=2048))\n"
        'def t(x: Tensor["M", "K", i8], w: Tensor["K", "N", i8]) -> Tensor["M", "N", f32]:\n'
        "    T = tile.context()\n"
        "    acc = tile.zeros((T.m, T.n), f32)\n"
        "    for kb in tile.range_n(x.shape[-1], T.k):\n"
        "        acc += tile.dot(tile.load(x, rows=T.m, cols=kb), tile.load(w, kb, cols=T.n))\n"
        "    return acc\n"
    )
    assert "a K block of 2048 rows of i8 operands" in error.diagnostics[0].message


def test_a_symbolic_k_is_checked_at_the_call() -> None:
    """K = 131071 at most: the check names the product's dim; the largest K passes it."""
    lib = tessera.compile(SOURCE, filename="w8a8.tsr", target="cpu").load()
    a = np.ones((1, 131072), np.int8)
    with pytest.raises(ValueError, match="131071"):
        lib.int_mm(a, np.ones((131072, 2), np.int8))
    b = np.full((131071, 2), -128, np.int8)
    have = lib.int_mm(np.full((1, 131071), -128, np.int8), b)
    np.testing.assert_array_equal(have, np.full((1, 2), 131071 * 16384, np.int64))


@pytest.mark.compile
@pytest.mark.parametrize("compiler", COMPILERS)
def test_cpu_code_compiles_warning_free(compiler: str, tmp_path: Path) -> None:
    """g++ and clang++ with -Wall -Wextra -Werror: the join's i32 storage and store."""
    assert_cpu_builds_warning_free(SOURCE, "w8a8.tsr", compiler, tmp_path)


@pytest.mark.compile
@pytest.mark.parametrize(
    ("target", "arch"),
    [
        ("cuda", "sm_80"),
        pytest.param("cuda", "sm_90a", marks=pytest.mark.exhaustive),
        pytest.param("hip", "gfx90a", marks=pytest.mark.exhaustive),  # hipcc: minutes of one core
    ],
)
def test_gpu_code_compiles_warning_free(target: str, arch: str, tmp_path: Path) -> None:
    """nvcc and hipcc, every warning an error."""
    assert_gpu_builds_warning_free(SOURCE, "w8a8.tsr", target, arch, tmp_path)


@pytest.mark.compile
@pytest.mark.exhaustive
@needs_sycl_headers
def test_sycl_code_parses_warning_free(tmp_path: Path) -> None:
    check_syntax({"w8a8": tessera.compile(SOURCE, "w8a8.tsr", target="sycl").source}, tmp_path)


def test_a_derivative_skips_the_int8_operands() -> None:
    """``@autodiff`` differentiates the float parameters only (docs/autodiff.md): the
    scale's gradient is the column sums of the exact product times the cotangent."""
    source = (
        "@autodiff\n"
        'def f(x: Tensor["M", "K", i8], w: Tensor["K", "N", i8], s: Tensor["N", f32]'
        ') -> Tensor["M", "N", f32]:\n'
        "    return cast(x @ w, f32) * s\n"
    )
    lib = tessera.compile(source, filename="w8a8.tsr", target="cpu").load()
    rng = np.random.default_rng(2)
    x, w = _int8(rng, 5, 3000), _int8(rng, 3000, 4)
    s = rng.uniform(0.5, 1.5, 4).astype(np.float32)
    g = rng.standard_normal((5, 4)).astype(np.float32)
    want = (_exact(x, w).astype(np.float32).astype(np.float64) * g).sum(axis=0)
    np.testing.assert_allclose(lib.f_vjp(x, w, s, g), want, rtol=1e-6)
