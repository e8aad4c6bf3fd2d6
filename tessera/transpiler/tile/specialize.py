"""Warp specialization on sm_90a: a producer warpgroup copies, the others compute.

A kernel whose one pipelined loop copies through TMA (``tma.py``) gets a producer
warpgroup of 128 threads beside its computing threads (``producer = 128``). The
producer issues every copy of the kernel: the ones before the loop (attention's query
tile, with the first stage's) and each iteration's, as soon as the stage they fill is
free. The computing warpgroups wait only for their stage's copies, and free the stage
once the last product that reads it has finished: a ``release`` after it in the loop
(``release {slot = (nblk) % 2}``), or, where that product is a ``wgmma`` left in flight
(a GEMM's), a ``release`` of the stage the iteration before read (``lag = 1``), after
the wait that leaves one batch running. Two mbarriers per stage carry both hand-overs,
so the barrier at the top of the loop, which made every thread wait for the slowest,
goes.

The producer leaves before the loop's results are used, so everything outside the loop
must run without a block-wide barrier: copies, fills, elementwise epilogues and stores;
and the loop's body must have no barrier but the one at its top. Products on ``wgmma``
and online softmax over their fragments combine rows within a warp, so GEMMs and
attention qualify.
"""

from __future__ import annotations

from dataclasses import replace

from ..graph.dims import Dim
from ..graph.graph_ops import DRAWN, ELEMENTWISE_MATH
from ..graph.ir import Op, walk
from ..schedule.hardware import Hardware
from .ir import Mma, SharedType, Slot, TileKernel
from .tma import pipelined_loop, tma_stages

__all__ = ["specialize_warps", "PRODUCER_THREADS"]

#: The producer is one warpgroup: wgmma's unit, so the computing warpgroups stay whole.
PRODUCER_THREADS = 128
#: Ops outside the loop that every thread runs on its own elements, with no barrier.
_PER_THREAD = frozenset({
    "alloc", "copy", "commit", "wait_mma", "full", "load", "store", "cast", "expand_dims",
    "dim_to_float", "const", *DRAWN, *ELEMENTWISE_MATH,
})  # fmt: skip
#: Ops through which a read of a stage reaches the product that reads it.
_THROUGH = ("transpose", "cast")


def specialize_warps(kernel: TileKernel, hw: Hardware) -> TileKernel:
    specialized = _specialized(kernel, hw)
    # A persistent kernel loops over output tiles in both roles, with the stages' phases
    # running on across tiles: only a specialized GEMM over a 2-D grid of tiles does.
    persistent = (
        kernel.persistent and specialized.producer > 0 and len(kernel.grid) == 2
        and kernel.kind == "gemm"
        and all(op.attr("stop") is None for op in walk(kernel.body) if op.kind == "for")
    )  # fmt: skip
    return replace(specialized, persistent=persistent)


def _specialized(kernel: TileKernel, hw: Hardware) -> TileKernel:
    loop, stages = pipelined_loop(kernel), tma_stages(kernel)
    if hw.arch != "sm_90a" or loop is None or stages is None:
        return kernel
    outside = [op for top in kernel.body.ops if top is not loop for op in _walk_op(top)]
    body = loop.regions[0]
    nested_barriers = [op for op in walk(body) if op.kind == "barrier" and op not in body.ops]
    # The producer makes the loop's copies: every one must run ahead on TMA.
    in_place = [op for op in walk(body) if op.kind == "copy" and op.attr("async") != "tma"]
    if any(op.kind not in _PER_THREAD for op in outside) or nested_barriers or in_place:
        return kernel
    last, lag = _last_reader(body.ops)
    if last is None:
        return kernel
    counter = Dim.sym(body.args[0].name or "")
    release = Op("release", (), (), (("slot", Slot(counter - Dim.const(lag), stages)),
                                     ("lag", lag)))  # fmt: skip
    ops: list[Op] = []
    for op in body.ops:
        if op.kind != "barrier":
            ops.append(op)
        if op is last:
            ops.append(release)
    specialized = replace(loop, regions=(replace(body, ops=tuple(ops)),))
    top = tuple(specialized if op is loop else op for op in kernel.body.ops)
    return replace(kernel, body=replace(kernel.body, ops=top), producer=PRODUCER_THREADS)


def _walk_op(op: Op) -> list[Op]:
    return [op, *(inner for region in op.regions for inner in walk(region))]


def _last_reader(ops: tuple[Op, ...]) -> tuple[Op | None, int]:
    """The last op of the loop's body that reads a stage of a pipelined buffer, and
    the iterations after which the stage is free: 1 when it is a ``wgmma`` left in
    flight, else 0."""
    staged: set[int] = set()
    last = None
    for op in ops:
        reads = {v.id for v in op.operands} & staged
        if op.kind == "read" and isinstance(op.operands[0].type, SharedType):
            if op.operands[0].type.stages > 1:
                staged.add(op.result.id)
        elif op.kind in _THROUGH and reads:
            staged.add(op.result.id)
        elif reads or any({v.id for v in inner.operands} & staged
                          for region in op.regions for inner in walk(region)):  # fmt: skip
            last = op
    if last is None:
        return None, 0
    plan = last.attr("mma")
    return last, 1 if isinstance(plan, Mma) and plan.in_flight else 0
