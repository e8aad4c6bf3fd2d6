"""A debug build's bounds checks on shared memory, on the SIMT targets.

A global access is checked once per program, on the program's offsets
(``debug_checks.py``). A shared buffer's addresses are the compiler's own: each
thread's coordinates in the tile (from a walk over its elements, a fragment's lanes, a
product's reduction step), its slot (modulo the stages, so always one of them) and the
layout (which keeps a tile inside its slot). So a debug build checks the coordinates,
at every element a copy writes and a read, an ``ldmatrix`` or an FMA loop reads: each
must lie inside the buffer's tile. A coordinate past it is a tile used with a larger
shape than its buffer holds, which would read or write another stage's slot or
another buffer. The check is an expression (``tsr_smem_index``), so it fits inside
the address wherever the address is written: a failed one records itself in the
launch's fault record and sends the access to coordinate 0, inside the buffer, and
the program runs on; the runtime raises ``BoundsError`` after the launch.

Not checked: the copies of the Tensor Memory Accelerator and the operands ``wgmma``
reads through descriptors, which the hardware addresses from the tile's shape, and
the compiler's scratch arrays (row reductions, staged probabilities), which are
indexed by loop counters over their own sizes.
"""

from __future__ import annotations

from ..check.bounds import FAULT, Sites
from ..graph.ir import Op
from ..tile.ir import TileKernel

__all__ = ["SharedChecks"]


class SharedChecks:
    """Mixed into the SIMT emitter, whose state it uses."""

    kernel: TileKernel
    sites: Sites | None
    checked: bool
    #: The number of each shared check made so far, by (op, axis): an op's elements are
    #: written in several expressions, all with the one check per axis.
    shared_sites: dict[tuple[int, int], int]

    def shared_coords(
        self, op: Op | None, buffer: str, extents: tuple[int, ...], coords: tuple[str, ...]
    ) -> tuple[str, ...]:
        """The coordinates of an element of ``buffer``'s tile of ``extents`` that ``op``
        accesses, one per axis: as they are, or in a debug build, each checked."""
        if self.sites is None or op is None:
            return coords
        checked = []
        for axis, (index, extent) in enumerate(zip(coords, extents, strict=True)):
            if index.isdigit() and int(index) < extent:
                checked.append(index)
                continue
            key = (id(op), axis)
            if key not in self.shared_sites:
                self.shared_sites[key] = self.sites.add_shared(self.kernel, op, buffer, axis)
            checked.append(f"tsr_smem_index({FAULT}, {self.shared_sites[key]}, {index}, {extent})")
            self.checked = True
        return tuple(checked)
