"""Edge masking: nothing out of bounds is touched, and padding never leaks.

A tile that crosses a ragged edge has padding: a masked load fills it with
zeros. Most ops keep zero padding harmless (a dot over zero-padded K adds
nothing; a stored row past the edge is not written), but some reductions do
not: the max of a row of scores padded with zeros is wrong when every score
is negative, and ``exp`` turns zero padding into ones. The pass

1. marks every access axis that can run past its tensor's end as masked;
2. follows each tile's padding (none, zeros, or anything) through the ops;
3. before a reduction over a padded axis whose padding is not that
   reduction's identity, inserts ``mask_edge`` with the identity (``-inf``
   for max and online softmax, ``0`` for sums and the ``p @ v`` product);
4. gives every dot, mma and ``softmax_accumulate`` the ``live`` corner of its
   product: the rows, columns and reduction steps that zero padding does not
   cover, which a backend may limit its loops to (for ``softmax_accumulate``, the
   rows before any row padding: its padded rows come out as anything).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from ...frozen import frozen
from ..graph.dims import Dim
from ..graph.graph_ops import COMPARISONS, DRAWN, LOGICAL
from ..graph.ir import Block, Op, Value, new_value
from ..graph.types import TileType
from ..schedule.hardware import Hardware
from .ir import Access, Live, TileKernel
from .masks import needs_mask

__all__ = ["mask_edges", "ZERO_PRESERVING"]

#: Elementwise ops with f(0) == 0: zero padding stays zero.
ZERO_PRESERVING = frozenset({
    "neg", "relu", "sqrt", "tanh", "gelu", "silu", "cast", "abs", "round", "sin", "mask_causal",
    "floor", "ceil", "log1p", "expm1", "erf", "tan", *(DRAWN - {"index_along"}),
})  # fmt: skip
_BINARY = ("add", "sub", "mul", "div", "floordiv", "mod", "pow", "maximum", "minimum")
#: Elementwise ops whose padding is taken as anything (0 > 0 is false, but 0 == 0 true).
_DIRTYING = frozenset({*COMPARISONS.values(), *LOGICAL.values(), "where"})


@frozen
class Pad:
    """Padding along one tile axis past ``extent`` (starting at ``offset``)."""

    zero: bool
    offset: Dim
    extent: Dim

    def dirty(self) -> Pad:
        return replace(self, zero=False)


State = tuple[Pad | None, ...]


def mask_edges(kernel: TileKernel, hw: Hardware) -> TileKernel:
    del hw
    masker = _Masker()
    return replace(kernel, body=masker.block(kernel.body))


def _live(pad: Pad | None) -> Dim | None:
    """How many elements of a zero-padded axis can be non-zero (None: all of them)."""
    return pad.extent - pad.offset if pad is not None and pad.zero else None


def _with_live(op: Op, a_rows: Pad | None, b_cols: Pad | None, depth: tuple) -> Op:
    """``op`` with its ``live`` corner: rows of ``a`` and columns of ``b`` that zero
    padding does not cover, and reduction steps where neither operand is zero padding
    (one zero factor is enough)."""
    k = next((d for d in map(_live, depth) if d is not None), None)
    live = Live(_live(a_rows), _live(b_cols), k)
    attrs = tuple((key, value) for key, value in op.attrs if key != "live")
    return replace(op, attrs=(*attrs, ("live", live)))


def _join(a: Pad | None, b: Pad | None) -> Pad | None:
    if a is None or b is None:
        return a or b
    return a if not a.zero else b if not b.zero else a


class _Masker:
    def __init__(self) -> None:
        self.pads: dict[int, State] = {}
        #: The values a loop carries (its block arguments), by id, and its counters.
        self.carried: set[int] = set()
        self.counters: set[str] = set()

    def state(self, v: Value) -> State:
        rank = len(getattr(v.type, "dims", ()))
        return self.pads.get(v.id, (None,) * rank)

    def block(self, block: Block) -> Block:
        ops: list[Op] = []
        for op in block.ops:
            ops += self.op(op)
        return replace(block, ops=tuple(ops))

    def op(self, op: Op) -> list[Op]:
        handler = getattr(self, "op_" + op.kind, None)
        if handler is not None:
            return handler(op)
        if op.kind in _BINARY:
            self.binary(op)
        elif op.kind in _DIRTYING:
            self.dirtied(op)
        elif op.kind == "index_along" and not op.operands:
            self.created(op)
        elif op.kind in DRAWN or (len(op.operands) == 1 and len(op.results) == 1):
            self.unary(op)  # the other operands of a drawing op are scalars
        return [op]

    # -- accesses --------------------------------------------------------------

    def _masked(self, op: Op) -> Op:
        at: Access = op.attr("at")
        axes = tuple(replace(a, masked=needs_mask(a)) for a in at.axes)
        attrs = tuple((k, Access(axes) if k == "at" else v) for k, v in op.attrs)
        return replace(op, attrs=attrs)

    def op_load(self, op: Op) -> list[Op]:
        op = self._masked(op)
        axes = op.attr("at").tile_axes
        self.pads[op.result.id] = tuple(
            Pad(True, a.offset, a.extent) if a.masked else None for a in axes
        )
        return [op]

    def op_store(self, op: Op) -> list[Op]:
        return [self._masked(op)]

    # -- elementwise -------------------------------------------------------------

    def _aligned(self, v: Value, rank: int) -> State:
        state = self.state(v)
        return (None,) * (rank - len(state)) + state

    def binary(self, op: Op) -> None:
        if not isinstance(op.result.type, TileType):
            return
        rank = op.result.type.rank
        tiles = [v for v in op.operands if len(getattr(v.type, "dims", ())) > 0]
        with_scalar = len(tiles) < 2
        out: list[Pad | None] = []
        for axis in range(rank):
            pads = [self._aligned(v, rank)[axis] for v in tiles]
            padded = [p for p in pads if p is not None]
            if not padded or self._accumulates(op, tiles, pads):
                out.append(None)
                continue
            first = padded[0]
            if op.kind == "mul":
                zero = any(p.zero for p in padded)
            elif op.kind in ("div", "floordiv", "mod"):  # 0 / b is 0 where b is not
                zero = pads[0] is not None and pads[0].zero and len(padded) == 1
            else:
                zero = (
                    op.kind != "pow"
                    and not with_scalar
                    and all(p is not None and p.zero for p in pads)
                )
            out.append(replace(first, zero=zero))
        self.pads[op.result.id] = tuple(out)

    def _accumulates(self, op: Op, tiles: list[Value], pads: list[Pad | None]) -> bool:
        """Whether ``op`` adds zero padding that moves with a loop counter (a block loaded
        at it) to a loop's running sum without padding (``acc = acc + g_blk * x_blk``):
        past the edge it adds nothing, so every element of the sum stays one the loop
        summed, and the running sum's axis lies nowhere in the tensor. (A bias broadcast
        along the rows, added to a block, is no loop's running sum: the sum keeps the
        block's padding.)"""
        moving = [p for p in pads if p is not None and p.offset.symbols() & self.counters]
        return (
            op.kind == "add"
            and bool(moving)
            and any(p is None and v.id in self.carried for v, p in zip(tiles, pads, strict=True))
            and all(p is None or p.zero for p in pads)
        )

    def dirtied(self, op: Op) -> None:
        """Padding along each axis where an operand has it, and not zero."""
        if not isinstance(op.result.type, TileType):
            return
        rank = op.result.type.rank
        tiles = [v for v in op.operands if len(getattr(v.type, "dims", ())) > 0]
        out = []
        for axis in range(rank):
            padded = [p for p in (self._aligned(v, rank)[axis] for v in tiles) if p is not None]
            out.append(padded[0].dirty() if padded else None)
        self.pads[op.result.id] = tuple(out)

    def created(self, op: Op) -> None:
        """An op that reads no tile (``arange``'s ``index_along`` of a shape): its padding is
        anything along each axis of its access that runs past the end."""
        at: Access = op.attr("at")
        self.pads[op.result.id] = tuple(
            Pad(False, a.offset, a.extent) if needs_mask(a) else None for a in at.tile_axes
        )

    def unary(self, op: Op) -> None:
        x = op.operands[0]
        state = self.state(x)
        if op.kind == "transpose":
            state = state[::-1]
        elif op.kind == "expand_dims":
            items = list(state)
            for axis in op.attr("axes"):
                items.insert(axis, None)
            state = tuple(items)
        elif op.kind not in ZERO_PRESERVING:
            state = tuple(p.dirty() if p else None for p in state)
        if len(state) == len(getattr(op.result.type, "dims", ())):
            self.pads[op.result.id] = state

    # -- reductions --------------------------------------------------------------

    def _neutral(self, x: Value, axis: int, fill: float, ops: list[Op]) -> Value:
        """``x`` with its padding along ``axis`` set to ``fill`` when it is not already."""
        pad = self.state(x)[axis]
        if pad is None or (pad.zero and fill == 0.0):
            return x
        masked = new_value(x.type)
        attrs = (("axis", axis), ("offset", pad.offset), ("extent", pad.extent), ("fill", fill))
        ops.append(Op("mask_edge", (x,), (masked,), attrs))
        state = list(self.state(x))
        state[axis] = Pad(fill == 0.0, pad.offset, pad.extent) if fill == 0.0 else pad.dirty()
        self.pads[masked.id] = tuple(state)
        return masked

    def _reduce(self, op: Op, operand: int, axis: int, fill: float) -> tuple[list[Op], Op]:
        ops: list[Op] = []
        x = op.operands[operand]
        masked = self._neutral(x, axis, fill, ops)
        if masked is not x:
            operands = list(op.operands)
            operands[operand] = masked
            op = replace(op, operands=tuple(operands))
        return ops, op

    def op_max(self, op: Op) -> list[Op]:
        axis = op.attr("axis")
        ops, op = self._reduce(op, 0, axis, -math.inf)
        state = list(self.state(op.operands[0]))
        del state[axis]
        self.pads[op.result.id] = tuple(state)
        return [*ops, op]

    def op_sum(self, op: Op) -> list[Op]:
        axis = op.attr("axis")
        ops, op = self._reduce(op, 0, axis, 0.0)
        state = list(self.state(op.operands[0]))
        del state[axis]
        self.pads[op.result.id] = tuple(state)
        return [*ops, op]

    def op_scatter(self, op: Op) -> list[Op]:
        """A scatter keeps ``x``'s padding, which a clamped index may write into: taken
        as anything."""
        x, _, values = op.operands
        rows, cols = self.state(x)
        rows = _join(rows, self.state(values)[0])
        self.pads[op.result.id] = tuple(p.dirty() if p else None for p in (rows, cols))
        return [op]

    op_scatter_add = op_scatter

    def op_softmax_online(self, op: Op) -> list[Op]:
        ops, op = self._reduce(op, 0, 1, -math.inf)
        rows, cols = self.state(op.operands[0])
        rows = rows.dirty() if rows else None
        cols = Pad(True, cols.offset, cols.extent) if cols else None
        self.pads[op.results[0].id] = (rows, cols)
        self.pads[op.results[1].id] = (rows,)
        self.pads[op.results[2].id] = (rows,)
        return [*ops, op]

    def op_softmax_accumulate(self, op: Op) -> list[Op]:
        """The state's rows past an edge of ``p`` or ``acc`` are padding, zero or not: each
        row of the result depends on its own row alone and comes out as anything, so the
        live rows stop there, and a backend may leave the padded rows' state as it was
        (a decode step's 4 live query rows of a 128-row block then cost 4 rows, not 128)."""
        ops, op = self._reduce(op, 3, 1, 0.0)
        p, v = self.state(op.operands[3]), self.state(op.operands[4])
        rows = _join(self.state(op.operands[0])[0], self.state(op.operands[3])[0])
        rows = rows.dirty() if rows else None
        edge = Pad(True, rows.offset, rows.extent) if rows else None
        op = _with_live(op, a_rows=edge, b_cols=v[1], depth=(p[1], v[0]))
        cols = self.state(op.operands[4])[1]
        self.pads[op.results[0].id] = (rows, cols)
        self.pads[op.results[1].id] = (rows,)
        self.pads[op.results[2].id] = (rows,)
        return [*ops, op]

    def _dot(self, op: Op) -> list[Op]:
        ops: list[Op] = []
        a, b = op.operands[:2]
        pa, pb = self.state(a)[1], self.state(b)[0]
        if (pa is not None and not pa.zero) or (pb is not None and not pb.zero):
            a = self._neutral(a, 1, 0.0, ops)
            b = self._neutral(b, 0, 0.0, ops)
            op = replace(op, operands=(a, b, *op.operands[2:]))
        out = (self.state(a)[0], self.state(b)[1])
        op = _with_live(op, a_rows=out[0], b_cols=out[1], depth=(pa, pb))
        if op.kind == "mma":
            acc = self.state(op.operands[2])
            out = (_join(out[0], acc[0]), _join(out[1], acc[1]))
        self.pads[op.result.id] = out
        return [*ops, op]

    op_dot = _dot
    op_mma = _dot

    # -- several operands or results -----------------------------------------------

    def op_mask_causal(self, op: Op) -> list[Op]:
        self.pads[op.result.id] = tuple(
            p.dirty() if p else None for p in self.state(op.operands[0])
        )
        return [op]

    def op_split(self, op: Op) -> list[Op]:
        state = self.state(op.operands[0])
        axis = op.attr("axis")
        if state[axis] is not None:
            state = (*state[:axis], state[axis].dirty(), *state[axis + 1 :])
        for result in op.results:
            self.pads[result.id] = state
        return [op]

    def op_concat(self, op: Op) -> list[Op]:
        states = [self.state(v) for v in op.operands]
        joined = tuple(
            functools.reduce(_join, (s[i] for s in states)) for i in range(len(states[0]))
        )
        self.pads[op.result.id] = tuple(p.dirty() if p else None for p in joined)
        return [op]

    # -- control flow ------------------------------------------------------------

    def op_for(self, op: Op) -> list[Op]:
        body = op.regions[0]
        carried = body.args[1:]
        self.carried.update(a.id for a in carried)
        if body.args[0].name is not None:
            self.counters.add(body.args[0].name)
        for arg, init in zip(carried, op.operands, strict=True):
            self.pads[arg.id] = self.state(init)
        for _ in range(4):  # padding only grows: none, zeros, anything
            before = [self.state(a) for a in carried]
            new_body = self.block(body)
            for arg, out in zip(carried, new_body.yields, strict=True):
                joined = tuple(
                    _join(x, y) for x, y in zip(self.state(arg), self.state(out), strict=True)
                )
                self.pads[arg.id] = joined
            if [self.state(a) for a in carried] == before:
                break
        for result, arg in zip(op.results, carried, strict=True):
            self.pads[result.id] = self.state(arg)
        return [replace(op, regions=(new_body,))]

    def op_if(self, op: Op) -> list[Op]:
        regions = tuple(self.block(r) for r in op.regions)
        for i, result in enumerate(op.results):
            states = [self.state(r.yields[i]) for r in regions]
            self.pads[result.id] = tuple(_join(*pair) for pair in zip(*states, strict=True))
        return [replace(op, regions=regions)]
