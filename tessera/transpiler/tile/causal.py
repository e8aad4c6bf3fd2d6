"""Causal bounds: a loop over key blocks stops at the program's last query row; on
the CPU, a loop over query blocks starts at the program's first key.

In causal attention, key block ``b`` is masked out entirely for every query row
of the program when its first key comes after the last row, ``b*BN > R0 + BM -
1``. Such a block adds nothing (its probabilities are 0, its row maxima -inf,
and ``softmax_accumulate`` leaves the state as it was), so the loop can stop
before it: ``stop = R0 + BM`` on the keys' start position. The pass recognises
``mask_causal(s, iota(R0), iota(counter*BN))`` directly in a loop body and
gives the loop that bound, which halves the work of causal attention.

The backward kernel that owns keys (``attention_dkdv``) loops over
query blocks, ``mask_causal(s, iota(counter*BM), iota(C0))``: query block ``b``
sees none of the program's keys when its last query comes before the first key,
``b*BM + BM - 1 < C0``, and its probabilities, hence its gradients, are all 0.
The loop gets ``start = C0``, a position: it runs from block ``floor(C0 / BM)``.
Only the CPU takes it; the GPU targets' pipelined loops copy their first block
ahead of the loop, so they visit those blocks and add their zeros.
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
    defs = producers(kernel.body)

    def visit(op: Op) -> list[Op]:
        if op.kind != "for" or op.attr("stop") is not None or op.attr("start") is not None:
            return [op]
        body = op.regions[0]
        counter = body.args[0].name
        for inner in body.ops:
            if inner.kind != "mask_causal":
                continue
            rows, cols = (defs.get(v.id) for v in inner.operands[1:])
            if rows is None or cols is None or rows.kind != "iota" or cols.kind != "iota":
                continue
            if cols.attr("offset") == Dim.sym(counter) * cols.result.type.dims[0]:
                stop = rows.attr("offset") + rows.result.type.dims[0]
                return [replace(op, attrs=(*op.attrs, ("stop", stop)))]
            if hw.kind == "cpu" and rows.attr("offset") == Dim.sym(counter) * op.attr("step"):
                return [replace(op, attrs=(*op.attrs, ("start", cols.attr("offset"))))]
        return [op]

    return replace(kernel, body=rewrite(kernel.body, visit))
