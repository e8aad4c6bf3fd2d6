"""``tile.concat`` of tiles held in registers (a product's accumulator): each element of
such a piece sits in the thread that computed it, at an index the concat moves, so the
SIMT backends stage the pieces through shared memory before the joined tile is read
(``simt_kernel.op_concat``). On every target (the CPU, OpenCL and the simulated sm_80 in
the default tier, the others in the exhaustive one): a row vector before a product along the
columns, two products and a row vector side by side, and two products stacked along the
rows, each against a float64 reference on random, ragged inputs, the output poisoned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera

from .builds import assert_cpu_builds_warning_free, assert_gpu_builds_warning_free
from .everywhere import built_everywhere
from .test_cpu import COMPILERS

pytestmark = pytest.mark.execute

SOURCE = """\
@kernel.schedule(Schedule(block=(64, 32), warps=4, stages=2))
def joined(a: Tensor["M", "K", f32], b: Tensor["K", 16, f32]) -> Tensor["M", 17, f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(a.shape[-1], T.k):
        acc += tile.dot(tile.load(a, rows=T.m, cols=kb), tile.load(b, kb, cols=T.n))
    return tile.concat((tile.sum(acc, axis=1)[:, None], acc), axis=1)


@kernel
def side_by_side(a: Tensor["M", "K", bf16 @accum(f32)], b: Tensor["K", 16, bf16],
                 c: Tensor["K", 16, bf16]) -> Tensor["M", 33, f32]:
    T = tile.context()
    ab = tile.zeros((T.m, T.d), f32)
    ac = tile.zeros((T.m, T.d), f32)
    for kb in tile.range_n(a.shape[-1], T.k):
        x = tile.load(a, rows=T.m, cols=kb)
        ab += tile.dot(x, tile.load(b, kb, cols=T.d))
        ac += tile.dot(x, tile.load(c, kb, cols=T.d))
    return tile.concat((ab, tile.max(ac, axis=1)[:, None], ac * 2.0), axis=1)


@kernel.schedule(Schedule(block=(64, 32), warps=4, stages=2))
def stacked(a: Tensor["K", 13, f32], b: Tensor["K", 13, f32],
            c: Tensor["K", 13, f32]) -> Tensor[64, 13, f32]:
    T = tile.context()
    ab = tile.zeros((T.n, T.n), f32)
    ac = tile.zeros((T.n, T.n), f32)
    for kb in tile.range_n(a.shape[0], T.k):
        x = tile.transpose(tile.load(a, kb, cols=T.n))
        ab += tile.dot(x, tile.load(b, kb, cols=T.n))
        ac += tile.dot(x, tile.load(c, kb, cols=T.n))
    return tile.concat((ab, ac), axis=0)


@kernel.schedule(Schedule(block=(64, 32), warps=4, stages=2))
def in_a_loop(a: Tensor["M", "K", f32], b: Tensor["K", 16, f32]) -> Tensor["M", 16, f32]:
    T = tile.context()
    total = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(a.shape[-1], T.k):
        p = tile.dot(tile.load(a, rows=T.m, cols=kb), tile.load(b, kb, cols=T.n))
        doubled, once = tile.split(tile.concat((p * 2.0, p), axis=1), 2, axis=1)
        total = total + doubled - once
    return total
"""


built = built_everywhere(SOURCE, "cpu", "opencl", "sm_80")


def _random(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_a_row_vector_before_a_product(built: Any) -> None:
    """The product's columns move right by one, past its rows' sums."""
    rng = np.random.default_rng(4)
    a, b = _random(rng, 37, 20), _random(rng, 20, 16)
    product = a.astype(np.float64) @ b
    want = np.concatenate([product.sum(1, keepdims=True), product], axis=1)
    poison = np.full(want.shape, np.nan, np.float32)
    np.testing.assert_allclose(built.joined(a, b, out=poison), want, rtol=1e-5, atol=1e-5)


def test_two_products_and_a_row_vector_side_by_side(built: Any) -> None:
    """Two register pieces, one of them computed from the product (``ac * 2``), around
    a row vector of the second; bf16 operands, which the GPUs multiply on their matrix
    instructions (``mma.sync``, ``wgmma``, MFMA fragments). Their products are exact in
    f32, so only the f32 sums round."""
    rng = np.random.default_rng(5)
    a, b, c = (_random(rng, *shape).astype(ml_dtypes.bfloat16)
               for shape in ((45, 29), (29, 16), (29, 16)))  # fmt: skip
    ab, ac = (a.astype(np.float64) @ x.astype(np.float64) for x in (b, c))
    want = np.concatenate([ab, ac.max(1, keepdims=True), ac * 2.0], axis=1)
    poison = np.full(want.shape, np.nan, np.float32)
    got = built.side_by_side(a, b, c, out=poison)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_two_products_stacked_along_the_rows(built: Any) -> None:
    """``a.T @ b`` over ``a.T @ c``, each a 32x32 tile (``T.n``, the schedule's) of
    which 13x13 are live: the first tile's rows past 13 (zeros) come before the second
    product's. One program (64 rows of output, ``T.m``) writes all of it."""
    rng = np.random.default_rng(6)
    a, b, c = (_random(rng, 37, 13) for _ in range(3))
    tiles = np.zeros((2, 32, 13))
    tiles[0, :13], tiles[1, :13] = a.T.astype(np.float64) @ b, a.T.astype(np.float64) @ c
    want = tiles.reshape(64, 13)
    poison = np.full(want.shape, np.nan, np.float32)
    np.testing.assert_allclose(built.stacked(a, b, c, out=poison), want, rtol=1e-5, atol=1e-5)


WIDE = """\
@kernel
def wide(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32],
         c: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    T = tile.context()
    ab = tile.zeros((T.m, T.n), f32)
    ac = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(a.shape[-1], T.k):
        x = tile.load(a, rows=T.m, cols=kb)
        ab += tile.dot(x, tile.load(b, kb, cols=T.n))
        ac += tile.dot(x, tile.load(c, kb, cols=T.n))
    left, right = tile.split(tile.concat((ab, ac), axis=1), 2, axis=1)
    return left - right
"""


def test_staging_beyond_the_shared_memory_is_refused() -> None:
    """Two 128x128 f32 products staged (129 KiB) on top of the schedule's pipeline: more
    than sm_80 has, which the schedule did not see; the message says so, no internal
    error."""
    program = tessera.compile(WIDE, filename="wide.tsr", target="cuda", arch="sm_80")
    with pytest.raises(tessera.StageNotImplemented, match=r"staged through 132096 bytes"):
        _ = program.source


def test_a_concat_in_a_loop_stages_each_iterations_product(built: Any) -> None:
    """Each step's product joined to itself, then split: the staging buffers are
    written again every iteration, after every thread has read the last one's."""
    rng = np.random.default_rng(7)
    a, b = _random(rng, 37, 300), _random(rng, 300, 16)
    want = a.astype(np.float64) @ b
    poison = np.full(want.shape, np.nan, np.float32)
    np.testing.assert_allclose(built.in_a_loop(a, b, out=poison), want, rtol=1e-4, atol=1e-4)


@pytest.mark.compile
@pytest.mark.parametrize("compiler", COMPILERS)
def test_cpu_code_compiles_warning_free(compiler: str, tmp_path: Path) -> None:
    assert_cpu_builds_warning_free(SOURCE, "concat.tsr", compiler, tmp_path)


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
    """nvcc and hipcc, every warning an error: the staging buffers and their walks."""
    assert_gpu_builds_warning_free(SOURCE, "concat.tsr", target, arch, tmp_path)
