"""The matrix-instruction fragment layouts, checked element by element.

The emitter writes a fragment's layout as C expressions of ``lane`` and ``reg``; these
tests evaluate them for every lane and register, so that a wrong formula fails here
rather than as a wrong number on a GPU.
"""

from __future__ import annotations

import pytest

from tessera.transpiler.target.simt_layout import MFMA_32X32, MMA_16X8, FragmentShape

pytestmark = pytest.mark.unit

#: (shape, lanes of a warp)
SHAPES = [(MMA_16X8, 32), (MFMA_32X32, 64)]


def _eval(expr: str, **names: int) -> int:
    """A C integer expression of non-negative values (``/`` truncates)."""
    return int(eval(expr.replace(" / ", " // "), {}, names))


@pytest.mark.parametrize(("shape", "lanes"), SHAPES)
def test_every_element_of_a_fragment_is_in_one_register_of_one_lane(
    shape: FragmentShape, lanes: int
) -> None:
    seen = [
        (_eval(shape.row, lane=lane, reg=reg), _eval(shape.col, lane=lane, reg=reg))
        for lane in range(lanes)
        for reg in range(shape.regs)
    ]
    assert sorted(seen) == [(i, j) for i in range(shape.m) for j in range(shape.n)]


def test_mma_sync_accumulators_are_where_the_ptx_isa_puts_them() -> None:
    """PTX ISA, m16n8 accumulators: c0, c1 at row groupID, c2, c3 at groupID + 8, in
    columns threadID_in_group * 2 + (i & 1)."""
    for lane in range(32):
        group, thread = lane >> 2, lane % 4
        for reg in range(4):
            want = (group + 8 * (reg >= 2), thread * 2 + (reg & 1))
            have = (
                _eval(MMA_16X8.row, lane=lane, reg=reg),
                _eval(MMA_16X8.col, lane=lane, reg=reg),
            )
            assert have == want


@pytest.mark.parametrize(("shape", "lanes"), SHAPES)
def test_row_slots_name_the_rows_and_the_lanes_of_a_row_exchange(
    shape: FragmentShape, lanes: int
) -> None:
    """Each register's row slot gives its row; a row's lanes are exactly those reached
    from any of them through the xor masks of ``row_lanes``."""
    holders: dict[int, set[int]] = {}
    for lane in range(lanes):
        for reg in range(shape.regs):
            slot = _eval(shape.row_slot, reg=reg)
            row = _eval(shape.slot_row, rs=slot, lane=lane)
            assert row == _eval(shape.row, lane=lane, reg=reg)
            holders.setdefault(row, set()).add(lane)
    for lanes_of_row in holders.values():
        lane = min(lanes_of_row)
        reached = {lane}
        for mask in shape.row_lanes:
            reached |= {other ^ mask for other in reached}
        assert reached == lanes_of_row
