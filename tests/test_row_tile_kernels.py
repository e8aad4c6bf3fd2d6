"""A tile kernel that returns one value per row and carries a ``[T.m, T.k]`` tile through
its loop over the columns: a program's threads hold that tile as rows of 16 columns,
so on the GPU targets its schedule gives it as many rows as a program has rows of
threads (8 under four 32-wide warps, 16 under four 64-wide wavefronts; it had 4, which
the SIMT targets refused to lower). Against numpy in float64, ragged sizes, the output
poisoned, on every target."""

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
"""

built = built_everywhere(SOURCE, "cpu", "opencl", "sm_80")


def test_rows_summed_through_a_carried_tile(built: Any) -> None:
    x = np.random.default_rng(5).standard_normal((101, 300)).astype(np.float32)
    poison = np.full(101, np.nan, np.float32)
    have = built.row_sums(x, out=poison)
    np.testing.assert_allclose(have, x.astype(np.float64).sum(1) * 0.5, rtol=1e-5, atol=1e-5)
