"""A tile kernel that returns one value per row and walks its rows' columns in blocks
(``tile.load(x, rows=T.m, cols=kb)`` in a ``tile.range_n`` loop), carrying a ``[T.m,
T.k]`` tile or a ``[T.m]`` vector through the loop. A program's threads hold each block
as rows of 16 columns, so on the GPU targets the schedule gives such a kernel as many
rows as a program has rows of threads (8 under four 32-wide warps, 16 under four 64-wide
wavefronts; with 4, the SIMT targets refused to lower it). The library's row kernels,
which hold whole rows, keep 4 (``tests/test_stdlib.py``). Against numpy in float64,
ragged sizes, the outputs poisoned, on every target."""

from __future__ import annotations

from typing import Any

import numpy as np

from .everywhere import built_everywhere

SOURCE = """\
@kernel
def row_sums(x: Tensor["M", "K", f32]) -> Tensor["M", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.k), f32)
    for kb in tile.range_n(x.shape[1], T.k):
        acc += tile.load(x, rows=T.m, cols=kb) * 0.5
    return tile.sum(acc, axis=1)

@kernel
def row_norms(x: Tensor["M", "K", f32], scale: Tensor["M", f32]) -> Tensor["M", f32]:
    T = tile.context()
    squares = tile.zeros((T.m,), f32)
    biggest = tile.full((T.m,), -1.0e30, f32)
    for kb in tile.range_n(x.shape[1], T.n):
        block = tile.load(x, rows=T.m, cols=kb)
        squares += tile.sum(block * block, axis=1)
        biggest = tile.maximum(biggest, tile.max(block, axis=1))
    return tile.sqrt(squares) * tile.load(scale, rows=T.m) + biggest
"""

built = built_everywhere(SOURCE, "cpu", "opencl", "sm_80")


def test_rows_summed_through_a_carried_tile(built: Any) -> None:
    x = np.random.default_rng(5).standard_normal((101, 300)).astype(np.float32)
    poison = np.full(101, np.nan, np.float32)
    have = built.row_sums(x, out=poison)
    np.testing.assert_allclose(have, x.astype(np.float64).sum(1) * 0.5, rtol=1e-5, atol=1e-5)


def test_row_statistics_carried_as_vectors(built: Any) -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((37, 211)).astype(np.float32)
    scale = rng.standard_normal(37).astype(np.float32)
    poison = np.full(37, np.nan, np.float32)
    have = built.row_norms(x, scale, out=poison)
    x64 = x.astype(np.float64)
    want = np.sqrt((x64 * x64).sum(1)) * scale + x64.max(1)
    np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5)
