"""Where a tile's elements live on a SIMT target: which thread, which slot, which address.

A value held in registers is spread over the program's threads in one of three
distributions. Each thread keeps its elements in a private array, one slot per
element:

- ``Flat``: the row-major element ``e`` in thread ``e % threads``, slot
  ``e / threads``. Elementwise work and stores of any shape use it.
- ``Grid``: a 2-D tile over ``ty x tx`` threads, element ``(i, j)`` in thread
  ``(i % ty, j % tx)``. Each thread holds a register block of
  ``rows / ty x cols / tx`` elements, strided so that neighbouring threads touch
  neighbouring columns (coalesced global accesses, no bank conflicts on the
  shared-memory operand rows). Products and online softmax use it.
- ``Fragments``: a 2-D tile in the accumulator layout of a warp's matrix
  instructions (``mma.sync`` on NVIDIA GPUs, MFMA on CDNA), which products on those
  targets keep.
- ``Rows``: a per-row vector of a ``Grid`` tile (a running max, a denominator):
  row ``i`` in every thread of thread row ``i % ty``, so that it meets the tile's
  row where the tile is; ``FragmentRows`` is the same for a ``Fragments`` tile.

Shared-memory buffers keep the layout the planner chose; ``smem_index`` is the
one definition of where element ``(i, j)`` of a slot lives in each of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import field

from ...frozen import frozen
from ..graph.dims import Dim
from ..schedule.hardware import GRID_COLUMNS

__all__ = ["NotLowered", "Flat", "Grid", "Rows", "FragmentShape", "MFMA_32X32", "MMA_16X8",
           "Fragments", "FragmentRows", "rows_of", "parenthesized", "Distribution", "Form",
           "Element", "CHUNK_BYTES", "FRAGMENT_SHAPES", "grid_for", "rows_for", "smem_index",
           "sw128_panel", "product", "WARPGROUP"]  # fmt: skip

#: The XOR swizzle permutes 16-byte chunks within groups of at most 8.
CHUNK_BYTES = 16
_SWIZZLE_GROUP = 8
#: Warps of a ``wgmma`` warpgroup, which the Tile IR counts as one.
WARPGROUP = 4


class NotLowered(Exception):
    """The kernel uses an operation this backend does not lower yet."""


@frozen
class Flat:
    dims: tuple[Dim, ...]


@frozen
class Grid:
    rows: int
    cols: int
    ty: int
    tx: int

    @property
    def rm(self) -> int:
        """Rows of a thread's register block."""
        return self.rows // self.ty

    @property
    def rn(self) -> int:
        """Columns of a thread's register block."""
        return self.cols // self.tx

    @property
    def slots(self) -> int:
        return self.rm * self.rn


@frozen
class Rows:
    rows: int
    ty: int

    @property
    def slots(self) -> int:
        return self.rows // self.ty


@frozen
class FragmentShape:
    """The accumulator fragment of one matrix instruction on one warp (wavefront): ``m x
    n`` elements, ``regs`` per lane. A lane holds ``row_slots`` rows of a fragment:
    register ``reg`` is in row slot ``row_slot``, and row slot ``rs`` is row ``slot_row``
    of the fragment; ``col`` is the column of register ``reg``. The lanes that hold one
    row differ in the bits of ``row_lanes``. Where registers ``reg`` and ``reg + 1`` (``reg``
    even) hold neighbouring columns of one row, ``pair_col`` is the first one's column
    ("" where they do not)."""

    m: int
    n: int
    regs: int
    row_slots: int
    row_slot: str
    slot_row: str
    col: str
    row_lanes: tuple[int, ...]
    pair_col: str = ""

    @property
    def row(self) -> str:
        """The row of register ``reg`` of lane ``lane`` in the fragment."""
        return re.sub(r"\brs\b", parenthesized(self.row_slot), self.slot_row)


#: 32x32 MFMA on 64-lane wavefronts (AMD's CDNA matrix-instruction layout): column
#: ``lane % 32``, and sixteen rows per lane.
MFMA_32X32 = FragmentShape(32, 32, 16, 16, "reg", "rs / 4 * 8 + lane / TSR_MMA_N * 4 + rs % 4",
                           "lane % TSR_MMA_N", (1, 2, 4, 8, 16))  # fmt: skip
#: ``mma.sync`` m16n8 on 32-lane warps (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
#: rows ``lane / 4`` and ``lane / 4 + 8``, two neighbouring columns in each. A ``wgmma``
#: accumulator is the same fragment repeated along its columns.
MMA_16X8 = FragmentShape(16, 8, 4, 2, "reg / 2", "lane / 4 + rs * 8", "lane % 4 * 2 + reg % 2",
                         (1, 2), "lane % 4 * 2")  # fmt: skip
#: The fragment of each dialect's matrix instructions, whose shape the tile header names
#: (``TSR_MMA_M``): ``mma.sync``'s and ``wgmma``'s accumulators, MFMA's.
FRAGMENT_SHAPES = {"cuda": MMA_16X8, "hip": MFMA_32X32}


@frozen
class Fragments:
    """A 2-D tile in the accumulator layout of a matrix instruction: ``wm x wn`` warps
    each own a ``rows/wm x cols/wn`` part, made of ``shape`` fragments. The terms it
    prints name the instruction's shape and the warp's part (``TSR_MMA_M``, ``WARP_M``), which
    the kernel declares (``numbers``)."""

    rows: int
    cols: int
    wm: int
    wn: int
    shape: FragmentShape
    #: Its rows and columns as the code prints them (the tiles' names), where known.
    extents: tuple[str, str] | None = field(default=None, compare=False, repr=False)

    @property
    def fm(self) -> int:
        return self.rows // self.wm // self.shape.m

    @property
    def fn(self) -> int:
        return self.cols // self.wn // self.shape.n

    @property
    def fm_text(self) -> str:
        """``fm`` as the code prints it: a warp's rows in fragments (``WARP_M / TSR_MMA_M``,
        ``BM / TSR_MMA_M``)."""
        return self._fragments(self.fm, self.wm, 0, "TSR_MMA_M")

    @property
    def fn_text(self) -> str:
        """``fn`` as the code prints it: a warp's columns in fragments (``BD / TSR_MMA_N``)."""
        return self._fragments(self.fn, self.wn, 1, "TSR_MMA_N")

    @property
    def frags(self) -> str:
        """The fragments of a warp's part, ``fm * fn``, as the code prints them."""
        fm, fn = self.fm_text, self.fn_text
        return fn if fm == "1" else fm if fn == "1" else f"{fm} * {parenthesized(fn)}"

    def _fragments(self, count: int, warps: int, axis: int, mma: str) -> str:
        part = ("WARP_M", "WARP_N")[axis] if warps > 1 else (self.extents or ("", ""))[axis]
        return f"{part} / {mma}" if count > 1 and re.fullmatch(r"[A-Z_]\w*", part) else str(count)

    @property
    def slots(self) -> int:
        return self.fm * self.fn * self.shape.regs

    def numbers(self) -> dict[str, int]:
        """The named numbers its terms print, and their values (a warp's part along an
        axis that one warp spans is the tile's, never printed)."""
        numbers = {"MMA_M": self.shape.m, "MMA_N": self.shape.n, "MMA_REGS": self.shape.regs}
        if self.wm > 1:
            numbers["WARP_M"] = self.rows // self.wm
        if self.wn > 1:
            numbers["WARP_N"] = self.cols // self.wn
        return numbers

    @property
    def frag_row(self) -> str:
        """The first row of fragment ``frag`` in its warp's part, as a term of a sum (""
        where the part is one fragment high, whose ``frag / fn`` is 0)."""
        return "" if self.fm == 1 else f"frag / {parenthesized(self.fn_text)} * TSR_MMA_M + "

    @property
    def frag_col(self) -> str:
        """The first column of fragment ``frag`` in its warp's part, as a term of a sum
        ("" where the part is one fragment wide, whose ``frag % fn`` is 0)."""
        return "" if self.fn == 1 else f"frag % {parenthesized(self.fn_text)} * TSR_MMA_N + "

    @property
    def warp_row(self) -> str:
        """The first row of warp ``wave``'s part, as a term of a sum ("" for row 0)."""
        if self.wm == 1:
            return ""
        wave = "wave" if self.wn == 1 else f"wave / {self.wn}"
        return f"{wave} * WARP_M + "

    @property
    def warp_col(self) -> str:
        """The first column of warp ``wave``'s part, as a term of a sum."""
        return "" if self.wn == 1 else f"wave % {self.wn} * WARP_N + "


@frozen
class FragmentRows:
    """A per-row vector of a Fragments tile whose rows each lie in one warp: row slot
    ``rs`` of strip ``fm`` in every lane that holds that row."""

    rows: int
    wm: int
    shape: FragmentShape

    @property
    def fm(self) -> int:
        return self.rows // self.wm // self.shape.m

    @property
    def slots(self) -> int:
        return self.fm * self.shape.row_slots


Distribution = Flat | Grid | Rows | Fragments | FragmentRows


def rows_of(dist: Grid | Fragments) -> Rows | FragmentRows:
    """The distribution of a per-row vector that meets the tile's rows where they are."""
    if isinstance(dist, Grid):
        return Rows(dist.rows, dist.ty)
    if dist.wn != 1:
        raise NotLowered(f"row vectors of a product split over {dist.wn} warps along its rows")
    return FragmentRows(dist.rows, dist.wm, dist.shape)


#: An element of a value at an index: one C expression per axis of the value.
Element = Callable[[tuple[str, ...]], str]


@frozen
class Form:
    """How the emitter holds a value (see ``simt_kernel.py``)."""

    kind: str  # "scalar", "replicated", "lazy", "owned", "tensor" or "shared"
    dims: tuple[Dim, ...]
    name: str = ""
    element: Element | None = None
    #: Where an owned value lives; for a lazy one, where the owned values it reads live.
    dist: Distribution | None = None


def grid_for(dims: tuple[Dim, ...], threads: int) -> Grid:
    """The Grid distribution of a 2-D tile of constant size. Every Grid of a kernel has
    the same thread shape, so that a row vector meets every tile of its rows."""
    tx = min(GRID_COLUMNS, threads)
    ty = threads // tx
    if len(dims) != 2 or any(d.constant is None for d in dims):
        raise NotLowered(f"a product or carried tile of shape {list(map(str, dims))}")
    rows, cols = (d.constant for d in dims)
    assert rows is not None and cols is not None
    if rows % ty or cols % tx:
        raise NotLowered(f"a {rows}x{cols} tile over {ty}x{tx} threads")
    return Grid(rows, cols, ty, tx)


def rows_for(rows: Dim, threads: int) -> Rows:
    """The Rows distribution of a row vector of ``rows`` elements."""
    grid = grid_for((rows, Dim.const(GRID_COLUMNS)), threads)
    return Rows(grid.rows, grid.ty)


def smem_index(
    layout: str,
    dims: tuple[Dim, ...],
    bits: int,
    slot: str,
    i: str,
    j: str,
    extents: tuple[str, str] | None = None,
    chunk: str | None = None,
    panel: str | None = None,
) -> str:
    """The element offset of ``(i, j)`` in slot ``slot`` of a ``[rows, cols]`` buffer;
    ``extents`` are its rows and columns as the code prints them (``BM``, ``BK``: the
    tiles they are), ``chunk`` the elements of a 16-byte chunk (``CHUNK_BYTES`` of
    1-byte elements) and ``panel`` those of a row of a ``sw128`` panel (``PANEL``), the
    numbers where not given.

    ``row-major`` and ``padded +P`` (rows ``cols + P`` elements apart) are plain. In
    ``xor``, 16-byte chunk ``k`` of row ``i`` is stored at chunk ``k ^ (i % g)``, where
    ``g`` is the largest power of two up to 8 that divides the chunks of a row: rows
    that a column walk visits land in different banks, and no row grows. ``sw128`` is
    the 128-byte swizzle of ``wgmma`` and TMA (see ``sw128_panel``).
    """
    rows, cols = (d.constant for d in dims[-2:]) if len(dims) > 1 else (1, dims[0].constant)
    assert rows is not None and cols is not None
    c_rows, c_cols = extents or (str(rows), str(cols))
    if layout == "sw128":
        return _sw128_index((rows, c_rows), (cols, c_cols), bits, slot, i, j, panel, chunk)
    stride = c_cols
    if layout.startswith("padded"):
        pad = int(layout.removeprefix("padded +"))
        stride = str(cols + pad) if c_cols.isdigit() else f"({c_cols} + {pad})"
    row = i if slot == "0" else f"{slot} * {c_rows} + {i}"
    column = j
    if layout == "xor":
        chunks = cols // (CHUNK_BYTES * 8 // bits)
        per_chunk = chunk or str(CHUNK_BYTES * 8 // bits)
        group = _SWIZZLE_GROUP
        while group > 1 and chunks % group:
            group //= 2
        if group > 1:
            chunk = f"({parenthesized(j)} / {per_chunk} ^ {parenthesized(i)} % {group})"
            column = f"{chunk} * {per_chunk} + {parenthesized(j)} % {per_chunk}"
    return f"{parenthesized(row)} * {stride} + {column}"


def sw128_panel(bits: int) -> int:
    """Columns of one panel of the 128-byte swizzle.

    A ``[rows, cols]`` buffer in ``sw128`` is stored as ``cols / panel`` panels of
    128-byte rows, one after another, each ``rows`` rows long; within a panel, 16-byte
    chunk ``k`` of row ``i`` is stored at chunk ``k ^ (i % 8)``. Eight rows (1024
    bytes) are the swizzle's repeat. This is the canonical "128B swizzling" layout of
    the PTX ISA's wgmma operands in shared memory, either way round: rows along M or N
    and columns along K (K-major), or the other way (MN-major).
    """
    return 128 * 8 // bits


def _sw128_index(
    rows: tuple[int, str],
    cols: tuple[int, str],
    bits: int,
    slot: str,
    i: str,
    j: str,
    panel: str | None,
    chunk: str | None,
) -> str:
    """``smem_index`` in ``sw128``, of a buffer of ``rows`` and ``cols`` (each the number
    and its printed form), whose panel rows and 16-byte chunks are ``panel`` and
    ``chunk`` elements as printed."""
    width, per_chunk = sw128_panel(bits), chunk or str(CHUNK_BYTES * 8 // bits)
    assert cols[0] % width == 0 and rows[0] % _SWIZZLE_GROUP == 0, (rows, cols)
    panel = panel or str(width)
    i, j = parenthesized(i), parenthesized(j)
    within = f"{j} % {panel}" if cols[0] > width else j
    swizzled = f"({within} / {per_chunk} ^ {i} % {_SWIZZLE_GROUP})"
    terms = [] if slot == "0" else [f"{parenthesized(slot)} * {product(rows, cols)}"]
    if cols[0] > width:
        terms.append(f"{j} / {panel} * {product(rows, (width, panel))}")
    terms += [f"{i} * {panel}", f"{swizzled} * {per_chunk}", f"{j} % {per_chunk}"]
    return " + ".join(terms)


def product(*factors: tuple[int, str]) -> str:
    """The product of ``factors`` (each a number and its printed form): the number where
    every one is printed as its number, else their names (``BK*PANEL``)."""
    if all(text.isdigit() for _, text in factors):
        return str(math.prod(value for value, _ in factors))
    return "*".join(parenthesized(text) for _, text in factors)


def parenthesized(expr: str) -> str:
    """``expr`` parenthesized unless it is a name or a number."""
    return expr if re.fullmatch(r"\w+", expr) else f"({expr})"
