"""A tile kernel's returned tile is the program's own block of the result: ``T.m`` rows
by ``T.n`` columns where the grid steps over both. A tile of another size along a
stepped axis (two row blocks stacked by ``tile.concat``), or a block whose rows are the
program's column block (``tile.transpose`` of a ``rows=T.m, cols=T.n`` load), would be
stored where it does not belong: NaN, garbage or another block's values on every
target. Both are errors at the return; the transposed block loaded the right way round
runs, against numpy on random ragged inputs with the output poisoned."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tessera

from .everywhere import EVERY_TARGET, built_everywhere

ROW_BLOCKS = """\
@kernel
def row_blocks(x: Tensor["M", "N", f32], y: Tensor["M", "N", f32]) -> Tensor["2*M", "N", f32]:
    T = tile.context()
    a = tile.load(x, rows=T.m, cols=T.n)
    b = tile.load(y, rows=T.m, cols=T.n)
    return tile.concat((a, b), axis=0)
"""

CROSSED = """\
@kernel
def crossed(x: Tensor["M", "N", f32]) -> Tensor["N", "M", f32]:
    T = tile.context()
    return tile.transpose(tile.load(x, rows=T.m, cols=T.n))
"""

TRANSPOSED = """\
@kernel
def transposed(x: Tensor["M", "N", f32]) -> Tensor["N", "M", f32]:
    T = tile.context()
    return tile.transpose(tile.load(x, rows=T.n, cols=T.m)) * 2.0
"""

TARGETS = [pytest.param(*p.values, marks=p.marks, id=p.id) for p in EVERY_TARGET]


def _error(source: str, target: str, arch: str | None) -> tessera.Diagnostic:
    with pytest.raises(tessera.CompileError) as caught:
        tessera.compile(source, filename="k.tsr", target=target, arch=arch, until="tile")
    (error,) = caught.value.diagnostics
    return error


@pytest.mark.parametrize("target, arch", TARGETS)
def test_a_returned_tile_larger_than_the_programs_block_is_an_error(
    target: str, arch: str | None
) -> None:
    error = _error(ROW_BLOCKS, target, arch)
    assert error.span.line == 6, error
    assert "each program of the grid owns a block of" in error.message
    assert "every program would store its tile over the same rows" in error.message


@pytest.mark.parametrize("target, arch", TARGETS)
def test_a_returned_block_that_is_the_programs_column_block_is_an_error(
    target: str, arch: str | None
) -> None:
    error = _error(CROSSED, target, arch)
    assert error.span.line == 4, error
    assert "the returned tile is [T.n, T.m], but a program stores its block" in error.message
    assert "load the block it transposes from with rows=T.n, cols=T.m" in error.message


built = built_everywhere(TRANSPOSED, "cpu", "opencl", "sm_80")


def test_a_block_loaded_the_right_way_round_transposes_into_place(built: Any) -> None:
    x = np.random.default_rng(3).standard_normal((300, 70)).astype(np.float32)
    poison = np.full((70, 300), np.nan, np.float32)
    np.testing.assert_array_equal(built.transposed(x, out=poison), x.T * 2.0)
