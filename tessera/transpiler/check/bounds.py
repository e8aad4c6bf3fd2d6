"""Bounds checks of a debug build: where each global access must lie, checked at run time.

A load, store or staged copy covers each axis of its tensor with an ``Axis`` of the
Tile IR: ``size`` elements from ``offset``, in a tensor of ``extent``. The compiler
makes every program's accesses safe element by element (a masked axis touches
nothing past its end), so what a debug build checks is the program's intent: a batch
index must be inside its axis, a masked tile (a ragged edge) must start inside its
axis, and an unmasked one must end inside it. A tile that starts past the end of its
tensor reads nothing but zeros, or, unmasked, memory that is not the tensor's: either
way the kernel indexes out of range, and the check names its ``.tsr`` line, the index
and the extent.

Axes whose check cannot fail are left out: an axis read whole, and a masked tile that
starts at 0 (an empty axis reads nothing). The backends number the checks they emit
(``Sites``); the metadata's ``bounds`` list says what each number is, for the runtime's
``BoundsError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...frozen import frozen
from ..graph.dims import Dim
from ..graph.ir import Op, Value
from ..tile.ir import Access, Axis, TileKernel

__all__ = ["AxisCheck", "FAULT", "FAULT_BYTES", "Sites", "axis_checks", "accessed"]

#: The buffer through which a GPU kernel of a debug build reports a failed check: four
#: 64-bit words (the check's number + 1, the index, the tile's size, the extent), zero
#: until a check fails. The function's metadata lists it with its intermediates.
FAULT = "tsr_fault"
FAULT_BYTES = 32

_WHAT = {"load": "load", "store": "store", "copy": "load"}


@frozen
class AxisCheck:
    """One axis of one access: fails when ``first`` is at or past ``extent`` (a batch
    index, a masked tile) or when ``first + size`` is past it (an unmasked tile)."""

    axis: int
    first: Dim
    size: Dim
    extent: Dim
    #: Whether the whole tile must be inside (an unmasked tile), not only its start.
    whole: bool


def axis_checks(at: Access) -> list[AxisCheck]:
    """The checks of an access that can fail, one per axis."""
    found = []
    for number, axis in enumerate(at.axes):
        check = _check(number, axis)
        if check is not None:
            found.append(check)
    return found


def _check(number: int, axis: Axis) -> AxisCheck | None:
    zero = Dim.const(0)
    if axis.index:
        return AxisCheck(number, axis.offset, Dim.const(1), axis.extent, whole=True)
    if axis.masked:
        if axis.offset == zero:
            return None
        return AxisCheck(number, axis.offset, axis.size, axis.extent, whole=False)
    if axis.offset == zero and axis.size == axis.extent:
        return None
    return AxisCheck(number, axis.offset, axis.size, axis.extent, whole=True)


@dataclass
class Sites:
    """The bounds checks a module's code makes, numbered in the order it makes them:
    check ``n`` reports itself as number ``n``, which is entry ``n`` of ``table``."""

    table: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kernel: TileKernel, op: Op, tensor: Value, check: AxisCheck) -> int:
        what = {"access": _WHAT.get(op.kind, op.kind), "tensor": tensor.name}
        return self._add(kernel, op, what | {"axis": check.axis, "whole": check.whole})

    def add_shared(self, kernel: TileKernel, op: Op, buffer: str, axis: int) -> int:
        """A check of one coordinate of a shared buffer's tile (``shared``): a copy
        writes it, a read (and the product that takes it) reads it."""
        access = "write" if op.kind == "copy" else "read"
        what = {"access": access, "tensor": buffer, "shared": True}
        return self._add(kernel, op, what | {"axis": axis, "whole": False})

    def _add(self, kernel: TileKernel, op: Op, what: dict[str, Any]) -> int:
        span = op.span or kernel.span  # a returned tile's store: the kernel's line
        line = f"{span.file.rsplit('/', 1)[-1]}:{span.line}" if span is not None else "?"
        self.table.append({"kernel": kernel.name, "line": line, **what})
        return len(self.table) - 1


def accessed(check: Mapping[str, Any]) -> str:
    """What a check of the metadata's ``bounds`` list guards, as its failure says it:
    ``load of 'k'``, ``read of shared buffer 'Kb_smem'``."""
    where = "shared buffer " if check.get("shared") else ""
    return f"{check['access']} of {where}'{check['tensor']}'"
