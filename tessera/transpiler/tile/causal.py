"""Causal bounds: a loop over key blocks stops at the program's last query row.

In causal attention, key block ``b`` is masked out entirely for every query row
of the program when its first key comes after the last row, ``b*BN > R0 + BM -
1``. Such a block adds nothing (its probabilities are 0, its row maxima -inf,
and ``softmax_accumulate`` leaves the state as it was), so the loop can stop
before it: ``stop = R0 + BM`` on the keys' start position. The pass recognises
``mask_causal(s, iota(R0), iota(counter*BN))`` directly in a loop body and
gives the loop that bound, which halves the work of causal attention.
"""

from __future__ import annotations

from dataclasses import replace

from ..graph.dims import Dim
from ..graph.ir import Op
from ..schedule.hardware import Hardware
from .ir import TileKernel
from .rewrite import producers, rewrite

__all__ = ["bound_causal_loops"]


def bound_causal_loops(kernel: TileKernel, hw: Hardware) -> TileKernel:
    del hw
    defs = producers(kernel.body)

    def visit(op: Op) -> list[Op]:
        if op.kind != "for" or op.attr("stop") is not None:
            return [op]
        body = op.regions[0]
        counter = body.args[0].name
        for inner in body.ops:
            if inner.kind != "mask_causal":
                continue
            rows, cols = (defs.get(v.id) for v in inner.operands[1:])
            if rows is None or cols is None or rows.kind != "iota" or cols.kind != "iota":
                continue
            block = cols.result.type.dims[0]
            if cols.attr("offset") != Dim.sym(counter) * block:
                continue
            stop = rows.attr("offset") + rows.result.type.dims[0]
            return [replace(op, attrs=(*op.attrs, ("stop", stop)))]
        return [op]

    return replace(kernel, body=rewrite(kernel.body, visit))
