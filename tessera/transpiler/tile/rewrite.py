"""Rebuilding a Tile IR body, for the passes.

Passes keep values: an op that replaces another reuses its result values, so
nothing downstream needs renaming. ``rewrite`` rebuilds nested regions first
and then asks ``visit`` what each op becomes (a list, possibly empty).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ..graph.dims import Dim
from ..graph.ir import Block, Op, walk
from ..graph.rewrite import use_counts

__all__ = ["rewrite", "use_counts", "producers", "shift"]


def rewrite(block: Block, visit: Callable[[Op], Sequence[Op]]) -> Block:
    ops: list[Op] = []
    for op in block.ops:
        if op.regions:
            op = replace(op, regions=tuple(rewrite(r, visit) for r in op.regions))
        ops.extend(visit(op))
    return replace(block, ops=tuple(ops))


def producers(block: Block) -> dict[int, Op]:
    """The op that defines each value, nested regions included."""
    return {r.id: op for op in walk(block) for r in op.results}


def shift(offset: Dim, counter: str, delta: int) -> Dim:
    """``offset`` with the loop counter advanced by ``delta`` (offsets are linear in it)."""
    step = sum((c for m, c in offset.terms if m == ((counter, 1),)), start=0)
    return offset + Dim.const(step * delta)
