"""Persistent GEMMs on sm_90a: one program per multiprocessor, looping over output tiles.

A specialized GEMM (``tile/specialize.py``) whose schedule asks for it (``persistent``)
is launched with as many programs as the GPU has multiprocessors, or as it has tiles
where they are fewer (the runtime reads the count from the device at launch). Each
program takes every ``gridDim.x``-th tile of one order, in which groups of 8 rows of
tiles go column by column, so that the tiles running at once share rows of ``a`` and
columns of ``b`` in L2. Both roles walk the same tiles: the producer's copies of the
next tile start as soon as their stages are free, while the computing warpgroups
still finish this tile's products and store its results.

The stages' ring and their barriers' phases run on across tiles: the ``n``-th
iteration a program runs, counted over all its tiles (``tsr_kt``, the iterations of
the tiles before, plus the loop's counter), uses stage ``n % stages`` and waits for
phase ``n / stages``. Everything that names a stage (the buffers' slots, both barriers,
the waits' parities, a lagged release) goes through ``pipelined``, so the loop's code
is the one-tile kernel's with the iteration count offset. The stage the last product
of a tile read is freed by the lagged release of the next tile's first iteration, as
within a tile; a program's last stage is never refilled, so never freed.
"""

from __future__ import annotations

from dataclasses import replace

from ..graph.dims import Dim
from ..graph.ir import Op
from ..tile.ir import Slot, TileKernel
from .simt_dialect import Dialect

__all__ = ["PersistentTiles", "GROUP_ROWS"]

#: Rows of tiles a group of the order covers: the tiles running at once (one a
#: multiprocessor) span this many rows of tiles and some columns.
GROUP_ROWS = 8
#: Iterations of the pipelined loop in this program's tiles before the current one.
_DONE = "tsr_kt"


class PersistentTiles:
    """The tile loop of a persistent kernel; mixed into the SIMT emitter."""

    kernel: TileKernel
    d: Dialect
    symbols: dict[str, str]

    def pipelined(self, slot: Slot) -> Slot:
        """``slot`` counted over all the iterations this program has run: in a
        persistent kernel, the iterations of its earlier tiles come first."""
        if not self.kernel.persistent or slot.stages == 1:
            return slot
        return replace(slot, index=slot.index + Dim.sym(_DONE))

    def open_tiles(self, loop: Op) -> None:
        """In a persistent kernel, the loop over this program's tiles and their
        program ids (``close_tiles`` ends it); elsewhere nothing."""
        if not self.kernel.persistent:
            return
        index = self.d.index_type
        n_axis, m_axis = self.kernel.grid
        pid_n, pid_m = self.symbols[n_axis.name], self.symbols[m_axis.name]
        step, extent = loop.attr("step"), loop.attr("extent")
        self.line(f"// this program's tiles: every {self.d.program_count[0]}-th, in groups of "
                  f"{GROUP_ROWS} rows of tiles taken column by column")  # fmt: skip
        assert step.constant is not None, "a pipelined loop's step is a tile size"
        self.line(f"const {index} tsr_tiles_n = {_blocks(self.c(n_axis.extent), n_axis.block)};")
        self.line(f"const {index} tsr_tiles_m = {_blocks(self.c(m_axis.extent), m_axis.block)};")
        self.line(f"const {index} tsr_steps = {_blocks(self.c(extent), int(step.constant))};"
                  "  // iterations a tile")  # fmt: skip
        self.line(f"{index} {_DONE} = 0;  // iterations of this program's tiles before this one")
        tile = "tsr_tile"
        self.open(f"for ({index} {tile} = {self.d.program_index[0]}; {tile} < tsr_tiles_m * "
                  f"tsr_tiles_n; {tile} += {self.d.program_count[0]})")  # fmt: skip
        self.line(f"const {index} tsr_first = {tile} / ({GROUP_ROWS} * tsr_tiles_n) * "
                  f"{GROUP_ROWS};  // the group's first row of tiles")  # fmt: skip
        self.line(f"const {index} tsr_rows = tsr_tiles_m - tsr_first < {GROUP_ROWS} ? "
                  f"tsr_tiles_m - tsr_first : {GROUP_ROWS};")  # fmt: skip
        self.line(f"const {index} tsr_in_group = {tile} - tsr_first * tsr_tiles_n;")
        self.line(f"const {index} {pid_m} = tsr_first + tsr_in_group % tsr_rows;")
        self.line(f"const {index} {pid_n} = tsr_in_group / tsr_rows;")

    def close_tiles(self) -> None:
        if not self.kernel.persistent:
            return
        self.line(f"{_DONE} += tsr_steps;")
        self.close()


def _blocks(extent: str, block: int) -> str:
    """Blocks of ``block`` covering ``extent``, rounded up, in C."""
    if block == 1:
        return extent
    wrapped = extent if extent.isidentifier() or extent.isdigit() else f"({extent})"
    return f"({wrapped} + {block - 1}) / {block}"
