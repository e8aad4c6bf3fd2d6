"""Staging and software pipelining of the operands of dots.

Every load that feeds a dot (through a ``transpose`` or ``cast``, or as the
``v`` of ``softmax_accumulate``) goes through shared memory: ``copy`` global
to shared, then ``read`` into registers, which is where ``ldmatrix``,
``wgmma`` descriptors and the CPU's packed micro-kernel operands come from. On
GPUs so does a load that a ``transpose`` reads: its block is copied along the
rows of the tensor and read back along the columns, so that both the loads and
the stores of a transposing copy are whole rows (coalesced).

Inside a loop, on targets whose copies can run ahead of compute
(``cp.async``, TMA) and with ``stages`` >= 2, the buffers get one slot per
stage and the loop is pipelined: a prologue issues the copies of the first
``stages - 1`` iterations; each iteration waits for its own group, issues
the copies of iteration ``i + stages - 1`` into the slot read last
iteration, and reads slot ``i % stages``. Copies for iterations past the end
are skipped (``when``). Elsewhere a copy is synchronous and single-slot.

A loop whose one product is an asynchronous ``wgmma`` that only accumulates
(a GEMM's main loop) leaves each iteration's batch running into the next
(``in_flight = 1``), with ``stages >= 3``: the copies run ``stages - 2``
iterations ahead, into the slot the batch before last read, which every
warpgroup has waited for by the barrier at the top of the iteration. A
``wait_mma`` after the loop waits for the last batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

from ..graph.dims import Dim
from ..graph.dtypes import DTYPES
from ..graph.ir import Block, Op, Value, new_value, walk
from ..graph.types import TileType
from ..schedule.hardware import Hardware
from .ir import Access, Mma, SharedType, Slot, TileKernel, When
from .rewrite import producers, shift

__all__ = ["stage_operands", "ENGINES"]

#: What moves an asynchronous copy, per arch; the emitters read it.
ENGINES = {"sm_80": "cp.async", "sm_90a": "tma", "gfx90a": "lds-prefetch", "gfx942": "lds-prefetch"}
_THROUGH = ("transpose", "cast")


def stage_operands(kernel: TileKernel, hw: Hardware) -> TileKernel:
    staged = _dot_operand_loads(kernel.body, hw.kind == "gpu")
    if not staged:
        return kernel
    stager = _Stager(kernel, hw, staged)
    body = stager.block(kernel.body, top=True)
    return replace(kernel, body=replace(body, ops=(*stager.allocs, *body.ops)))


def _dot_operand_loads(body: Block, gpu: bool) -> set[int]:
    defs = producers(body)
    found: set[int] = set()
    for op in walk(body):
        if op.kind in ("dot", "mma"):
            operands = op.operands[:2]
        elif op.kind == "softmax_accumulate":
            operands = (op.operands[4],)
        elif op.kind == "transpose" and gpu:  # read along rows, written along columns
            operands = (op.operands[0],)
        else:
            continue
        for v in operands:
            source = defs.get(v.id)
            while source is not None and source.kind in _THROUGH:
                source = defs.get(source.operands[0].id)
            if source is not None and source.kind == "load":
                found.add(source.result.id)
    return found


class _Stager:
    def __init__(self, kernel: TileKernel, hw: Hardware, staged: set[int]) -> None:
        self.kernel = kernel
        self.staged = staged
        self.stages = kernel.stages if hw.async_copy and kernel.stages >= 2 else 1
        self.engine = ENGINES.get(hw.arch) if self.stages > 1 else None
        self.allocs: list[Op] = []
        self.buffers: dict[int, Value] = {}

    def buffer(self, load: Op, stages: int) -> Value:
        t: TileType = load.result.type
        base = name = f"{load.result.name or 'operand'}_smem"
        taken = {a.result.name for a in self.allocs}
        suffix = 0
        while name in taken:
            suffix += 1
            name = f"{base}_{suffix}"
        # An i4 tile is held a byte to an element: the copy unpacks it.
        dtype = DTYPES["i8"] if t.dtype.name == "i4" else t.dtype
        buf = new_value(SharedType(t.dims, dtype, stages, t.tiles), name)
        self.allocs.append(Op("alloc", (), (buf,), (("space", "shared"),)))
        self.buffers[load.result.id] = buf
        return buf

    def block(self, block: Block, top: bool = False) -> Block:
        ops: list[Op] = []
        for op in block.ops:
            if op.kind == "for" and self.stages > 1 and self._loads(op.regions[0]):
                ops += self.pipeline(op)
            elif op.kind == "load" and op.result.id in self.staged:
                buf = self.buffer(op, 1)
                ops += [_copy(op, buf, Slot(Dim.const(0))), _read(op, buf, Slot(Dim.const(0)))]
            elif op.regions:
                ops.append(replace(op, regions=tuple(self.block(r) for r in op.regions)))
            else:
                ops.append(op)
        return replace(block, ops=tuple(ops))

    def _loads(self, body: Block) -> list[Op]:
        return [op for op in body.ops if op.kind == "load" and op.result.id in self.staged]

    def pipeline(self, loop: Op) -> list[Op]:
        body = loop.regions[0]
        counter = body.args[0].name
        assert counter is not None
        loads = self._loads(body)
        buffers = [self.buffer(load, self.stages) for load in loads]
        s = self.stages
        overlapped = _accumulating_wgmma(body) if s >= 3 else None
        ahead_by = s - 2 if overlapped is not None else s - 1
        prologue: list[Op] = []
        for j in range(ahead_by):
            for load, buf in zip(loads, buffers, strict=True):
                first = functools.partial(_at_iteration, counter=counter, iteration=j)
                prologue.append(_copy(load, buf, Slot(Dim.const(j), s), first, self.engine, loop))
            prologue.append(Op("commit", (), ()))
        ahead = Dim.sym(counter) + Dim.const(ahead_by)
        current = Slot(Dim.sym(counter), s)
        # TMA's copies complete a barrier per stage, so its wait names the stage it reads.
        waits_on = (("slot", current),) if self.engine == "tma" else ()
        inner: list[Op] = [Op("wait", (), (), (("pending", ahead_by - 1), *waits_on))]
        for load, buf in zip(loads, buffers, strict=True):
            later = functools.partial(shift, counter=counter, delta=ahead_by)
            inner.append(_copy(load, buf, Slot(ahead, s), later, self.engine, loop))
        inner.append(Op("commit", (), ()))
        by_load = {load.result.id: buf for load, buf in zip(loads, buffers, strict=True)}
        for op in body.ops:
            if op.kind == "load" and op.result.id in by_load:
                inner.append(_read(op, by_load[op.result.id], current))
            elif op is overlapped:
                mma = replace(op.attr("mma"), in_flight=1)
                attrs = tuple((k, mma if k == "mma" else v) for k, v in op.attrs)
                inner.append(replace(op, attrs=attrs))
            elif op.regions:
                inner.append(replace(op, regions=tuple(self.block(r) for r in op.regions)))
            else:
                inner.append(op)
        pipelined = replace(loop, regions=(replace(body, ops=tuple(inner)),))
        if overlapped is None:
            return [*prologue, pipelined]
        return [*prologue, pipelined, Op("wait_mma", (), (), (("pending", 0),), (), (), loop.span)]


def _accumulating_wgmma(body: Block) -> Op | None:
    """The loop body's one product, if it is a ``wgmma`` that only accumulates into a
    value the loop carries: nothing else in the body reads its accumulator or its
    result, which the body yields in the accumulator's place."""
    products = [op for op in walk(body) if op.kind in ("dot", "mma", "softmax_accumulate")]
    if len(products) != 1 or products[0].kind != "mma" or products[0] not in body.ops:
        return None
    op = products[0]
    plan = op.attr("mma")
    if not isinstance(plan, Mma) or not plan.inst.startswith("wgmma"):
        return None
    acc, carried = op.operands[2], body.args[1:]
    if acc not in carried or body.yields[carried.index(acc)] is not op.result:
        return None
    readers = [other for other in walk(body) if other is not op
               and (acc in other.operands or op.result in other.operands)]  # fmt: skip
    return None if readers else op


def _copy(
    load: Op, buf: Value, slot: Slot, move: Callable[[Dim], Dim] | None = None,
    engine: str | None = None, loop: Op | None = None,
) -> Op:  # fmt: skip
    """A copy of ``load``'s place into ``buf``; ``move`` advances the counter of
    ``loop``, the loop the copy runs ahead in."""
    at: Access = load.attr("at")
    attrs: tuple = ()
    if move is not None and loop is not None:
        counter = loop.regions[0].args[0].name
        moving = next(a for a in at.axes if counter in a.offset.symbols())
        stop, position = loop.attr("stop"), move(Dim.sym(counter) * loop.attr("step"))
        # A causal stop lies past the program's first row: the first iteration always runs.
        runs = None if stop is None or position == Dim.const(0) else (position, stop)
        attrs = (("when", When(move(moving.offset), moving.extent, runs)),)
        at = Access(tuple(replace(a, offset=move(a.offset)) for a in at.axes))
    attrs = (("at", at), ("slot", slot), *((("async", engine),) if engine else ()), *attrs)
    return Op("copy", (load.operands[0], buf), (), attrs, ("write",), (), load.span)


def _at_iteration(offset: Dim, counter: str, iteration: int) -> Dim:
    return offset.substitute({counter: iteration})


def _read(load: Op, buf: Value, slot: Slot) -> Op:
    return Op("read", (buf,), load.results, (("slot", slot),), (), (), load.span)
