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
- ``Fragments``: a 2-D tile in the accumulator layout of a wavefront's matrix
  instructions (MFMA on CDNA), which products on those targets keep.
- ``Rows``: a per-row vector of a ``Grid`` tile (a running max, a denominator):
  row ``i`` in every thread of thread row ``i % ty``, so that it meets the tile's
  row where the tile is.

Shared-memory buffers keep the layout the planner chose; ``smem_index`` is the
one definition of where element ``(i, j)`` of a slot lives in each of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..graph.dims import Dim

__all__ = ["NotLowered", "Flat", "Grid", "Rows", "Fragments", "Distribution", "Form",
           "Element", "grid_for", "rows_for", "smem_index"]  # fmt: skip

#: Threads along a Grid tile's columns: a half warp reads 16 neighbouring elements.
GRID_COLUMNS = 16
#: The XOR swizzle permutes 16-byte chunks within groups of at most 8.
_CHUNK_BYTES = 16
_SWIZZLE_GROUP = 8


class NotLowered(Exception):
    """The kernel uses an operation this backend does not lower yet."""


@dataclass(frozen=True)
class Flat:
    dims: tuple[Dim, ...]


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Rows:
    rows: int
    ty: int

    @property
    def slots(self) -> int:
        return self.rows // self.ty


@dataclass(frozen=True)
class Fragments:
    """A 2-D tile in the accumulator layout of 32x32 MFMA on 64-lane wavefronts: ``wm x
    wn`` waves each own a ``rows/wm x cols/wn`` part, made of 32x32 fragments; lane
    ``l`` holds column ``l % 32`` of a fragment, rows ``8 (g / 4) + 4 (l / 32) + g % 4``
    for its registers ``g < 16`` (AMD's CDNA matrix-instruction layout)."""

    rows: int
    cols: int
    wm: int
    wn: int

    @property
    def fm(self) -> int:
        return self.rows // self.wm // 32

    @property
    def fn(self) -> int:
        return self.cols // self.wn // 32

    @property
    def slots(self) -> int:
        return self.fm * self.fn * 16


Distribution = Flat | Grid | Rows | Fragments

#: An element of a value at an index: one C expression per axis of the value.
Element = Callable[[tuple[str, ...]], str]


@dataclass(frozen=True)
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


def smem_index(layout: str, dims: tuple[Dim, ...], bits: int, slot: str, i: str, j: str) -> str:
    """The element offset of ``(i, j)`` in slot ``slot`` of a ``[rows, cols]`` buffer.

    ``row-major`` and ``padded +P`` (rows ``cols + P`` elements apart) are plain. In
    ``xor``, 16-byte chunk ``k`` of row ``i`` is stored at chunk ``k ^ (i % g)``, where
    ``g`` is the largest power of two up to 8 that divides the chunks of a row: rows
    that a column walk visits land in different banks, and no row grows.
    """
    rows, cols = (d.constant for d in dims[-2:]) if len(dims) > 1 else (1, dims[0].constant)
    assert rows is not None and cols is not None
    stride = cols + int(layout.removeprefix("padded +")) if layout.startswith("padded") else cols
    row = i if slot == "0" else f"{slot} * {rows} + {i}"
    column = j
    if layout == "xor":
        per_chunk = _CHUNK_BYTES * 8 // bits
        chunks = cols // per_chunk
        group = _SWIZZLE_GROUP
        while group > 1 and chunks % group:
            group //= 2
        if group > 1:
            chunk = f"({_p(j)} / {per_chunk} ^ {_p(i)} % {group})"
            column = f"{chunk} * {per_chunk} + {_p(j)} % {per_chunk}"
    return f"{_p(row)} * {stride} + {column}"


def _p(expr: str) -> str:
    """``expr`` parenthesized unless it is a name or a number."""
    return expr if re.fullmatch(r"\w+", expr) else f"({expr})"
