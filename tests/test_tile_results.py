"""Tile kernels that return several tiles: the same programs store their block of each
result. Every target against float64 NumPy on ragged sizes, results poisoned first
(and allocated by the call); the errors of a return that does not fit the declaration
or whose tiles the same programs could not store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera

from .builds import assert_cpu_builds_warning_free, assert_gpu_builds_warning_free
from .everywhere import EVERY_TARGET, load_everywhere
from .reference import f64
from .test_cpu import COMPILERS
from .test_sycl import check_syntax, needs_sycl_headers

BF16 = ml_dtypes.bfloat16
#: Ragged sizes: multiples of no tile any schedule picks.
R, C, K, N = 37, 53, 45, 29

SOURCE = """\
@kernel
def row_pair(x: Tensor["R", "C", f32], scale: float
             ) -> tuple[Tensor["R", "C", f32], Tensor["R", "C", bf16]]:
    T = tile.context()
    rows = tile.load(x, rows=T.m) * scale
    e = tile.exp(rows - tile.max(rows, axis=1)[:, None])
    return e / tile.sum(e, axis=1)[:, None], tile.cast(e, bf16)

@kernel
def row_stats(x: Tensor["R", "C", f32]) -> tuple[Tensor["R", "C", f32], Tensor["R", 2, f32]]:
    T = tile.context()
    rows = tile.load(x, rows=T.m)
    mean = (tile.sum(rows, axis=1) / float(x.shape[-1]))[:, None]
    top = tile.max(rows, axis=1)[:, None]
    return rows - mean, tile.concat((mean, top), axis=1)

@kernel
def row_vectors(x: Tensor["B", "R", "C", f32]
                ) -> tuple[Tensor["B", "R", "C", f32], Tensor["B", "R", f32],
                           Tensor["B", "R", i32]]:
    T = tile.context()
    rows = tile.load(x, rows=T.m)
    mean = tile.sum(rows, axis=1) / float(x.shape[-1])
    positive = tile.sum(tile.where(rows > 0.0, 1.0, 0.0), axis=1)
    return rows - mean[:, None], mean, tile.cast(positive, i32)

@kernel
def gemm_pair(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]
              ) -> tuple[Tensor["M", "N", f32], Tensor["M", "N", f32]]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(a.shape[1], T.k):
        acc += tile.dot(tile.load(a, rows=T.m, cols=kb), tile.load(b, kb, cols=T.n))
    return acc, tile.tanh(acc)

def second_only(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    p, e = row_pair(x, 0.75)
    return cast(e, f32) + 1.0

def calls(x: Tensor["R", "C", f32], a: Tensor["R", "K", f32], b: Tensor["K", "N", f32]
          ) -> tuple[Tensor["R", "C", f32], Tensor["R", "N", f32], Tensor["R", "N", f32]]:
    p, e = row_pair(x, 0.75)
    c, t = gemm_pair(a, b)
    return p * 2.0 + cast(e, f32), c, relu(t) @ transpose(b) @ b
"""


def _poisoned(*likes: tuple[tuple[int, ...], Any]) -> tuple[np.ndarray, ...]:
    return tuple(np.full(shape, np.nan).astype(dtype) for shape, dtype in likes)


def test_a_graph_function_calls_it_as_one_launch() -> None:
    """``p, e = row_pair(x, 0.75)``: one ``tile_call`` of two results, one launch that
    writes both, and the elementwise ops that read them a kernel after it (the results
    are stored as returned: no epilogue joins a kernel of several)."""
    program = tessera.compile(SOURCE, filename="program.tsr", target="cpu")
    graph = program.inspect_ir("graph").split("func @calls")[1]
    assert "%p, %e = tile_call %x {kernel = row_pair" in graph, graph
    sched = program.inspect_ir("sched").split("host @calls")[1]
    assert "reads %x  writes %p, %e" in sched and "reads %a, %b  writes %c, %t" in sched, sched
    assert "template elementwise  prologue [relu]" in sched, sched
    # a result that nothing reads is written all the same: the kernel stores it
    unread = program.inspect_ir("sched").split("host @second_only")[1].split("host @")[0]
    assert "buffer %p : tensor<[R, C], f32>" in unread and "writes %p, %e" in unread, unread


def test_each_result_is_stored_by_the_same_programs() -> None:
    """The Tile IR: one store per result, at the same block of the one grid; the entry
    takes ``out0`` and ``out1``."""
    program = tessera.compile(SOURCE, filename="program.tsr", target="cpu")
    tile = program.inspect_ir("tile")
    kernel = tile.split("kernel @gemm_pair ")[1].split("\nkernel @")[0]
    # the first result grids the programs: its columns, not a's (a result of each size)
    grid = next(line.strip() for line in kernel.splitlines() if line.strip().startswith("grid"))
    assert "pid_n < ceil(N/" in grid and "pid_m < ceil(M/" in grid, grid
    stores = [line.strip() for line in kernel.splitlines() if line.strip().startswith("store")]
    assert [s.split(",")[0] for s in stores] == ["store %out0", "store %out1"], stores
    places = {s.split("{at = ")[1] for s in stores}
    assert len(places) == 1 and "pid_m" in places.pop(), stores
    assert "float* out0, float* out1" in program.source


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_two_results_match_float64(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib: Any = load_everywhere(SOURCE, target, arch, monkeypatch)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((R, C)).astype(np.float32)
    rows = f64(x) * 0.75
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    out = _poisoned(((R, C), np.float32), ((R, C), BF16))
    lib.row_pair(x, 0.75, out=out)
    np.testing.assert_allclose(out[0], e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(f64(out[1]), e, rtol=1e-2, atol=1e-3)

    # a result that nothing reads is stored all the same, into a buffer of its own
    out = _poisoned(((R, C), np.float32))[0]
    lib.second_only(x, out=out)
    np.testing.assert_allclose(out, e + 1.0, rtol=1e-2, atol=1e-2)

    # tiles of different widths, [T.m, C] and [T.m, 2]: the same rows of each result
    mean = f64(x).mean(axis=1, keepdims=True)
    out = _poisoned(((R, C), np.float32), ((R, 2), np.float32))
    lib.row_stats(x, out=out)
    np.testing.assert_allclose(out[0], f64(x) - mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], np.hstack([mean, f64(x).max(axis=1, keepdims=True)]),
                               rtol=1e-5, atol=1e-6)  # fmt: skip

    # a row's statistic as a vector, [T.m] beside [T.m, C], under a batch dim
    x3 = rng.standard_normal((3, R, C)).astype(np.float32)
    mean = f64(x3).mean(axis=-1)
    out = (*_poisoned(((3, R, C), np.float32), ((3, R), np.float32)), np.full((3, R), -7, np.int32))
    lib.row_vectors(x3, out=out)
    np.testing.assert_allclose(out[0], f64(x3) - mean[..., None], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[2], (x3 > 0).sum(axis=-1))

    a = rng.standard_normal((R, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    product = f64(a) @ f64(b)
    out = _poisoned(((R, N), np.float32), ((R, N), np.float32))
    lib.gemm_pair(a, b, out=out)
    np.testing.assert_allclose(out[0], product, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[1], np.tanh(product), rtol=1e-4, atol=1e-4)

    # called from a graph function: one launch writes both, later kernels read them
    out = _poisoned(((R, C), np.float32), ((R, N), np.float32), ((R, N), np.float32))
    lib.calls(x, a, b, out=out)
    np.testing.assert_allclose(out[0], 2.0 * e / e.sum(axis=1, keepdims=True) + e, rtol=1e-2,
                               atol=1e-2)  # fmt: skip
    np.testing.assert_allclose(out[1], product, rtol=1e-4, atol=1e-4)
    relu = np.maximum(np.tanh(product), 0.0) @ f64(b).T @ f64(b)
    np.testing.assert_allclose(out[2], relu, rtol=1e-4, atol=1e-4)
    if target in ("cpu", "opencl"):  # a call without out= returns a tuple of new arrays
        got = lib.gemm_pair(a, b)
        assert isinstance(got, tuple) and len(got) == 2
        np.testing.assert_allclose(got[1], np.tanh(product), rtol=1e-4, atol=1e-4)


CUSTOM = """\
def two_vjp(x: Tensor["N", f32], ga: Tensor["N", f32], gb: Tensor["N", f32]) -> Tensor["N", f32]:
    return 2.0 * x * ga + gb

@kernel
@custom_vjp(two_vjp)
def two(x: Tensor["N", f32]) -> tuple[Tensor["N", f32], Tensor["N", f32]]:
    T = tile.context()
    t = tile.load(x, rows=T.m)
    return t * t, t

@autodiff
def loss(x: Tensor["N", f32]) -> Tensor[f32]:
    a, b = two(x)
    return sum(a * 3.0 + b)
"""


@pytest.mark.execute
def test_a_custom_vjp_takes_a_cotangent_per_result() -> None:
    """``@custom_vjp`` on a kernel of two results: its rule takes both cotangents."""
    lib: Any = tessera.compile(CUSTOM, filename="custom.tsr", target="cpu").load()
    x = np.random.default_rng(2).standard_normal(1031).astype(np.float32)
    out = np.full_like(x, np.nan)
    lib.loss_vjp(x, np.float32(1.0), out=out)
    np.testing.assert_allclose(out, 6.0 * f64(x) + 1.0, rtol=1e-6, atol=1e-6)


HEAD = """@kernel
def two(x: Tensor["R", "C", f32], y: Tensor["S", "C", f32]) -> {declared}:
    T = tile.context()
    a = tile.load(x, rows=T.m)
    b = tile.load(y, rows=T.m)
    return {returned}
"""
PAIR = 'tuple[Tensor["R", "C", f32], Tensor["R", "C", f32]]'


@pytest.mark.parametrize(
    ("declared", "returned", "message"),
    [
        (PAIR, "a", "returns 1 value, but the declared result is 2"),
        (PAIR, "a, b, a", "returns 3 values, but the declared result is 2"),
        ('Tensor["R", "C", f32]', "a, b", "returns 2 values, but the declared result is one"),
        ('tuple[Tensor["R", "C", f32], Tensor["R", f32]]', "a, b",
         "returns a rank-2 tile into a rank-1 result"),
        ('tuple[Tensor["R", "C", f32], Tensor["R", "C", i32]]', "a, b",
         "returns f32, but the declared result is i32"),
        ('tuple[Tensor["R", "C", f32], Tensor["C", f32]]', "a, tile.sum(b, axis=0)",
         "agree in the axes T.m and T.n tile, and leave out only trailing axes that one "
         "program covers whole: the first is [T.m, C], value 2 [C]"),
        ('tuple[Tensor["R", "C", f32], Tensor["S", f32]]', "a, tile.sum(b, axis=1)",
         "result 2 is [S], the first [R, C]"),
        ('tuple[Tensor["R", "C", f32], Tensor["C", "R", f32]]', "a, tile.transpose(b)",
         "the first is [T.m, C], value 2 [C, T.m]"),
        ('tuple[Tensor["R", "C", f32], Tensor["S", "C", f32]]', "a, b",
         "result 2 is [S, C], the first [R, C]"),
        (PAIR, "a, x", "a tile kernel returns tiles: value 2 of the return is"),
    ],
)  # fmt: skip
def test_a_return_that_does_not_fit_is_an_error_at_its_line(
    declared: str, returned: str, message: str
) -> None:
    source = HEAD.format(declared=declared, returned=returned)
    with pytest.raises(tessera.CompileError) as info:
        tessera.compile(source, filename="k.tsr", target="cpu")
    text = str(info.value)
    assert message in text, text
    assert text.startswith("k.tsr:6:12: error:"), text


def test_a_row_vector_beside_column_blocks_is_an_error() -> None:
    """Beside a ``[T.m, T.n]`` tile, whose programs split the columns, a ``[T.m]`` row
    vector would be stored by every program of a row over the same elements."""
    source = """@kernel
def sums(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]
         ) -> tuple[Tensor["M", "N", f32], Tensor["M", f32]]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(a.shape[1], T.k):
        acc += tile.dot(tile.load(a, rows=T.m, cols=kb), tile.load(b, kb, cols=T.n))
    return acc, tile.sum(acc, axis=1)
"""
    with pytest.raises(tessera.CompileError) as info:
        tessera.compile(source, filename="k.tsr", target="cpu")
    text = str(info.value)
    assert "k.tsr:8:12" in text and "the first is [T.m, T.n], value 2 [T.m]" in text, text


@pytest.mark.compile
@pytest.mark.parametrize("compiler", COMPILERS)
def test_cpu_code_compiles_warning_free(compiler: str, tmp_path: Path) -> None:
    assert_cpu_builds_warning_free(SOURCE, "pairs.tsr", compiler, tmp_path)


@pytest.mark.compile
@pytest.mark.parametrize(("target", "arch"), [("cuda", "sm_80"), ("cuda", "sm_90a"),
                                              ("hip", "gfx90a")])  # fmt: skip
def test_gpu_code_compiles_warning_free(target: str, arch: str, tmp_path: Path) -> None:
    """nvcc and hipcc, every warning an error."""
    assert_gpu_builds_warning_free(SOURCE, "pairs.tsr", target, arch, tmp_path)


@pytest.mark.compile
@needs_sycl_headers
def test_sycl_code_parses_warning_free(tmp_path: Path) -> None:
    check_syntax({"pairs": tessera.compile(SOURCE, "pairs.tsr", target="sycl").source}, tmp_path)
