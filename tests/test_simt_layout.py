"""The matrix-instruction fragment layouts and wgmma's shared-memory operands, checked
element by element.

The emitter writes a fragment's layout as C expressions of ``lane`` and ``reg``, and a
shared buffer's layout and a wgmma descriptor's start as C expressions of the element
and the step; these tests evaluate them for every lane, register and element, so that
a wrong formula fails here rather than as a wrong number on a GPU.
"""

from __future__ import annotations

import functools
from types import CodeType

import pytest

from tessera.transpiler.graph.dims import Dim
from tessera.transpiler.target.simt_layout import MFMA_32X32, MMA_16X8, FragmentShape, smem_index
from tessera.transpiler.target.simt_tiles import SmemView, wgmma_leading, wgmma_start

pytestmark = pytest.mark.unit

#: (shape, lanes of a warp)
SHAPES = [(MMA_16X8, 32), (MFMA_32X32, 64)]


@functools.cache
def _compiled(expr: str) -> CodeType:
    return compile(expr.replace(" / ", " // "), "<c>", "eval")


#: The tile header's names for the fragment shape, as the HIP header gives them: MFMA's
#: layout reads them (``lane % TSR_MMA_N``); mma.sync's writes its numbers.
_HEADER = {"TSR_MMA_M": MFMA_32X32.m, "TSR_MMA_N": MFMA_32X32.n}


def _eval(expr: str, **names: int) -> int:
    """A C integer expression of non-negative values (``/`` truncates)."""
    return int(eval(_compiled(expr), {}, {**_HEADER, **names}))


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


#: Buffers of 16-bit elements in the 128-byte swizzle: (rows, cols).
SW128_BUFFERS = [(64, 64), (128, 64), (64, 128), (128, 128), (32, 256)]


#: The names a kernel gives a buffer's rows and columns and a panel's row, as the
#: swizzled indices below are printed with them.
_NAMED = ("ROWS", "COLS")


def _sw128_offset(rows: int, cols: int, slot: int, i: int, j: int) -> int:
    dims = (Dim.const(rows), Dim.const(cols))
    index = smem_index("sw128", dims, 16, str(slot), "i", "j", _NAMED, "8", "PANEL")
    return _eval(index, i=i, j=j, ROWS=rows, COLS=cols, PANEL=64)


@pytest.mark.parametrize(("rows", "cols"), SW128_BUFFERS)
def test_sw128_puts_every_element_of_a_slot_in_its_own_place(rows: int, cols: int) -> None:
    for slot in (0, 1):
        seen = {_sw128_offset(rows, cols, slot, i, j) for i in range(rows) for j in range(cols)}
        assert seen == set(range(slot * rows * cols, (slot + 1) * rows * cols))


def _canonical_byte(start: int, leading: int, stride: int, k_major: bool, mn: int, k: int) -> int:
    """Where wgmma reads element (mn, k) of a 16-bit operand in the 128-byte swizzle,
    as the PTX ISA's canonical layouts put it ("Shared Memory Matrix Layout"): K-major,
    rows of 128 bytes along m or n, eight of them per stride step, k along a row;
    MN-major, rows of 128 bytes (64 elements) along m or n and eight k rows per stride
    step, the next 64 of m or n a leading step on. The swizzle then moves the 16-byte
    chunk (address bits 4-6) by the row within its eight (bits 7-9)."""
    if k_major:
        logical = start + mn // 8 * stride + mn % 8 * 128 + k * 2
    else:
        logical = start + k // 8 * stride + k % 8 * 128 + mn // 64 * leading + mn % 64 * 2
    return logical ^ (logical >> 7 & 7) << 4


@pytest.mark.parametrize("role", ["a", "b"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize(("rows", "cols"), SW128_BUFFERS)
def test_wgmma_descriptors_read_the_elements_the_copies_wrote(
    rows: int, cols: int, transposed: bool, role: str
) -> None:
    """Every step of 16 along k, from every 64th row of m (n), reads each element of
    the operand where ``smem_index`` stored it."""
    for slot in (0, 1):
        view = SmemView("buf", rows, cols, 16, "bf16", "sw128", str(slot), transposed,
                        extents=_NAMED)  # fmt: skip
        named = {"ROWS": rows, "COLS": cols, "PANEL": 64}
        k_major = view.k_major(role)
        mn_extent, k_extent = (rows, cols) if k_major else (cols, rows)
        # the header's steps: a K-major operand's leading one is its default, the stride
        # eight 128-byte rows
        leading_bytes = wgmma_leading(view, k_major, "PANEL")
        leading = 16 if leading_bytes is None else _eval(leading_bytes, **named)
        stride = 1024
        for kk in range(0, k_extent, 16):
            for mn0 in range(0, mn_extent, 64):
                start = wgmma_start(view, k_major, "kk", "mn0", "PANEL")
                start = 2 * _eval(start, kk=kk, mn0=mn0, **named)
                for mn in range(min(64, mn_extent - mn0)):
                    for k in range(16):
                        i, j = (mn0 + mn, kk + k) if k_major else (kk + k, mn0 + mn)
                        want = 2 * _sw128_offset(rows, cols, slot, i, j)
                        got = _canonical_byte(start, leading, stride, k_major, mn, k)
                        assert got == want, (slot, kk, mn0, mn, k)
