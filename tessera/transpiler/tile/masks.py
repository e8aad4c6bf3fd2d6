"""When an access axis can run past the end of its tensor.

An axis is safe without a mask when it spans the whole dim (offset 0, size
the extent), when it is an index (a batch dim, one element), or when the
extent is a known multiple of the block size and blocks start at multiples
of it: a run-time extent only where every term is (``64*H``, the merged columns of
``H`` heads of 64). Everything else needs a mask.
"""

from __future__ import annotations

from ..graph.dims import Dim
from .ir import Axis

__all__ = ["needs_mask"]


def needs_mask(axis: Axis) -> bool:
    if axis.index or (axis.offset == Dim.const(0) and axis.size == axis.extent):
        return False
    size = axis.size.constant
    if size is None:
        return True
    return not (_multiple_of(axis.extent, size) and _multiple_of(axis.offset, size))


def _multiple_of(dim: Dim, size: int) -> bool:
    """Whether every term of ``dim`` is a multiple of ``size`` (``pid_m*128``)."""
    return dim.is_integral and all(c % size == 0 for _, c in dim.terms)
