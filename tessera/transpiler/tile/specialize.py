"""Warp specialization on sm_90a: a producer warpgroup copies, the others compute.

A GEMM-shaped kernel, whose one pipelined loop copies through TMA (``tma.py``) and
leaves its one product, a ``wgmma`` that only accumulates, in flight, gets a producer
warpgroup of 128 threads beside its computing threads (``producer = 128``). The
producer issues each iteration's copies as soon as the stage they fill is free; the
computing warpgroups wait only for their stage's copies, and free a stage once the
batch that read it has finished. Two mbarriers per stage carry both hand-overs (the
copies have landed; the stage is free again), so the barrier at the top of the loop,
which made every thread wait for the slowest, goes.

The producer leaves before the loop's results are used, so everything outside the loop
must run without a block-wide barrier: copies, the accumulator's fill, elementwise
epilogues and stores. A kernel with anything else (a reduction, online softmax) keeps
every thread computing.
"""

from __future__ import annotations

from dataclasses import replace

from ..graph.ir import walk
from ..schedule.hardware import Hardware
from .ir import TileKernel
from .tma import pipelined_loop, tma_stages

__all__ = ["specialize_warps", "PRODUCER_THREADS"]

#: The producer is one warpgroup: wgmma's unit, so the computing warpgroups stay whole.
PRODUCER_THREADS = 128
#: Ops that every thread runs on its own elements, with no barrier among threads.
_PER_THREAD = frozenset({
    "alloc", "copy", "commit", "wait", "wait_mma", "read", "mma", "full", "load", "store",
    "yield", "cast", "expand_dims", "add", "sub", "mul", "div", "pow", "neg", "exp", "log",
    "sqrt", "rsqrt", "tanh", "sigmoid", "gelu", "silu", "relu", "abs",
})  # fmt: skip


def specialize_warps(kernel: TileKernel, hw: Hardware) -> TileKernel:
    loop = pipelined_loop(kernel)
    if hw.arch != "sm_90a" or loop is None or tma_stages(kernel) is None:
        return kernel
    products = [op for op in walk(loop.regions[0]) if op.kind == "mma"]
    in_flight = len(products) == 1 and getattr(products[0].attr("mma"), "in_flight", 0)
    others = [op for op in walk(kernel.body) if op is not loop and op.kind != "barrier"]
    if not in_flight or any(op.kind not in _PER_THREAD for op in others):
        return kernel
    body = loop.regions[0]
    unbarred = replace(body, ops=tuple(op for op in body.ops if op.kind != "barrier"))
    ops = tuple(replace(loop, regions=(unbarred,)) if op is loop else op
                for op in kernel.body.ops)  # fmt: skip
    return replace(kernel, body=replace(kernel.body, ops=ops), producer=PRODUCER_THREADS)
