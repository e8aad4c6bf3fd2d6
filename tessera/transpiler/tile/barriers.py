"""Barrier insertion: a barrier wherever threads hand shared memory over.

Threads of a program share its shared-memory buffers, so a ``read`` must not
start before every thread's write to that buffer is done (read after write),
and a write must not start while another thread may still read the old
contents (write after read). Writes are synchronous ``copy`` ops, or
asynchronous ones, which count as done at the ``wait`` that covers them. A
barrier clears both hazards. A product reads its operands from shared memory as it
runs, and its reads stand just before it (``defer_reads``), so a barrier that one of
them needs goes before all of them; a product that reads a buffer again later (attention's
backward multiplies by its key tile twice) reads it there too. Loops are walked twice so
that the hazards
carried from one iteration into the next are seen; CPU programs are one
thread and need none.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..graph.ir import Block, Op
from ..schedule.hardware import Hardware
from .ir import Mma, TileKernel

__all__ = ["insert_barriers"]


@dataclass
class _Hazards:
    written: set[int] = field(default_factory=set)  # done writes not yet fenced
    read: set[int] = field(default_factory=set)  # reads not yet fenced
    pending: set[int] = field(default_factory=set)  # async writes not yet waited for

    def copy(self) -> _Hazards:
        return _Hazards(set(self.written), set(self.read), set(self.pending))

    def merge(self, other: _Hazards) -> None:
        self.written |= other.written
        self.read |= other.read
        self.pending |= other.pending


def insert_barriers(kernel: TileKernel, hw: Hardware) -> TileKernel:
    if hw.kind != "gpu" or kernel.threads <= 1:
        return kernel
    body, _ = _block(kernel.body, _Hazards(), {})
    return replace(kernel, body=body)


def _block(block: Block, state: _Hazards, sources: dict[int, int]) -> tuple[Block, _Hazards]:
    """``block`` with its barriers; ``sources`` maps each value read from shared memory
    (and its casts and transposes) to its buffer."""
    ops: list[Op] = []
    for op in block.ops:
        if isinstance(op.attr("mma"), Mma) and op.attr("mma").operands == "shared":
            # a product reads its shared operands as it runs, wherever their reads stand
            state.read |= {sources[v.id] for v in op.operands if v.id in sources}
        elif op.kind in _READING[1:] and op.operands[0].id in sources:
            sources[op.result.id] = sources[op.operands[0].id]
        if op.kind == "copy":
            buf = op.operands[1].id
            if buf in state.read:
                ops.append(_barrier())
                state = _Hazards(pending=state.pending)
            (state.pending if op.attr("async") else state.written).add(buf)
        elif op.kind == "wait":
            state.written |= state.pending
            state.pending = set()
        elif op.kind == "read":
            buf = op.operands[0].id
            if buf in state.written:
                # before the reads (and their casts) just before it too: they read
                # their buffers at the product they feed, after this barrier
                run = len(ops)
                while run and ops[run - 1].kind in _READING:
                    run -= 1
                ops.insert(run, _barrier())
                read = {r.operands[0].id for r in ops[run + 1 :] if r.kind == "read"}
                state = _Hazards(read=read, pending=state.pending)
            state.read.add(buf)
            sources[op.result.id] = buf
        elif op.kind == "for":
            body = op.regions[0]
            _, end = _block(body, state.copy(), sources)
            entry = state.copy()
            entry.merge(end)
            new_body, end = _block(body, entry, sources)
            state.merge(end)
            op = replace(op, regions=(new_body,))
        elif op.regions:
            regions = []
            after = state.copy()
            for region in op.regions:
                new_region, end = _block(region, state.copy(), sources)
                regions.append(new_region)
                after.merge(end)
            state = after
            op = replace(op, regions=tuple(regions))
        ops.append(op)
    return replace(block, ops=tuple(ops)), state


#: What stands between a deferred read and the product that reads it (``defer_reads``).
_READING = ("read", "cast", "transpose")


def _barrier() -> Op:
    return Op("barrier", (), ())
