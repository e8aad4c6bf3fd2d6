"""Tile sizes read as numbers: the rule that keeps a kernel's result off its schedule.

The schedule picks ``T.m``, ``T.n``, ``T.k`` and ``T.vector`` per target (the CPU's row
block is not OpenCL's), so a number computed from one of them (``float(T.m)``) would
make the result depend on the target. They may shape tiles and loops, never values:
reading one as a number is an error that says which size of the problem to read.

``T.d`` is different: it is one tile that spans the whole head dim, so it has a value
of the problem's, the head dim itself. The tile is padded to the schedule's block
(a run-time ``D`` of 64 under a 128-wide tile), so ``float(T.d)`` reads the dim the
tile spans, never the tile's width: seed 004's ``tile.rsqrt(float(T.d))`` is
``1/sqrt(D)`` on every target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..frontend.source import Span
from .dims import Dim
from .ir import Block, Op, walk
from .opcall import SemanticError
from .types import TensorType

__all__ = ["check_size_as_number", "head_dim_values"]

HEAD = "T.d"


def check_size_as_number(dim: Dim, text: str, span: Span) -> None:
    """Refuse a size read as a number (``float(T.m)``, ``x / T.k``) when it mentions
    a tile size that the schedule chooses."""
    chosen = sorted(s for s in dim.symbols() if s.startswith("T.") and s != HEAD)
    if chosen:
        raise SemanticError(
            f"{' and '.join(chosen)} {'are tile sizes' if len(chosen) > 1 else 'is a tile size'} "
            f"that the schedule picks for each target (--emit sched shows it), so a number "
            f"computed from {text} would change with the target; read a size of the problem "
            "instead, such as float(x.shape[-1])",
            span,
        )


def head_dim_values(body: Block, error: Callable[[str, Span], None]) -> Block:
    """``body`` with each number read from ``T.d`` (``float(T.d)``) reading the dim
    the ``T.d`` tile spans instead. ``error(message, span)`` reports a kernel where
    that dim is not one dim: no load or store spans one, or they span several."""
    reads = [op for op in walk(body) if op.kind == "dim_to_float" and HEAD in _dim(op).symbols()]
    if not reads:
        return body
    spanned = _spanned_by_head(body)
    if len(spanned) != 1:
        what = (
            "no tile.load or tile.store has a T.d block (cols=T.d)"
            if not spanned
            else "its T.d blocks span different dims: " + ", ".join(map(str, spanned))
        )
        for op in reads:
            error(
                f"T.d read as a number is the head dim its tile spans, but {what}; "
                "read the size from a tensor instead, such as float(q.shape[-1])",
                op.span,
            )
        return body
    (head,) = spanned
    return _map_ops(body, lambda op: _with_head(op, head))


def _dim(op: Op) -> Dim:
    return op.attr("dim")


def _with_head(op: Op, head: Dim) -> Op:
    if op.kind != "dim_to_float":
        return op
    attrs = tuple((k, v.substitute({HEAD: head}) if k == "dim" else v) for k, v in op.attrs)
    return replace(op, attrs=attrs)


def _spanned_by_head(body: Block) -> list[Dim]:
    """The tensor dims that a load or store covers with one ``T.d`` block."""
    found: list[Dim] = []
    for op in walk(body):
        if op.kind not in ("tile.load", "tile.store"):
            continue
        tensor = op.operands[0].type
        tile = (op.result if op.kind == "tile.load" else op.operands[1]).type
        if not isinstance(tensor, TensorType):
            continue
        modes = [mode for name, mode in op.attrs if name in ("rows", "cols")]
        extents = tensor.dims[-len(tile.dims) :]
        for mode, size, extent in zip(modes, tile.dims, extents, strict=False):
            if mode == "program" and size == Dim.sym(HEAD) and extent not in found:
                found.append(extent)
    return found


def _map_ops(block: Block, fn: Callable[[Op], Op]) -> Block:
    ops = tuple(
        fn(replace(op, regions=tuple(_map_ops(r, fn) for r in op.regions))) for op in block.ops
    )
    return replace(block, ops=ops)
