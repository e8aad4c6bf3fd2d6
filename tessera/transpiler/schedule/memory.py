"""Memory planning for a host program: intermediates into reusable slots.

Each intermediate lives from the launch that writes it to the last launch
that reads it. Slots are assigned greedily in order of first write; a slot
is reused when its previous tenant is dead before the new one is born and
both have the same size (sizes are symbolic, so "same" means the same
expression: a slot never has to be resized at run time).
"""

from __future__ import annotations

from ...frozen import frozen
from ..graph.dims import Dim
from ..graph.types import TensorType
from .ir import Buffer

__all__ = ["Interval", "plan_buffers", "tensor_bytes"]


@frozen
class Interval:
    name: str
    type: TensorType
    first: int
    last: int


def tensor_bytes(t: TensorType) -> Dim:
    size = Dim.const(max(1, t.dtype.bits // 8))
    for dim in t.dims:
        size = size * dim
    return size


def plan_buffers(intervals: list[Interval]) -> tuple[Buffer, ...]:
    slots: list[tuple[Dim, int]] = []  # (bytes, last launch that uses it)
    buffers = []
    for interval in sorted(intervals, key=lambda i: (i.first, i.name)):
        size = tensor_bytes(interval.type)
        slot = next(
            (i for i, (s, last) in enumerate(slots) if s == size and last < interval.first), None
        )
        if slot is None:
            slots.append((size, interval.last))
            slot = len(slots) - 1
        else:
            slots[slot] = (size, interval.last)
        buffers.append(
            Buffer(interval.name, interval.type, size, slot, interval.first, interval.last)
        )
    return tuple(buffers)
