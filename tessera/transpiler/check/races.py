"""Race checker: two accesses to one address from different threads, unordered.

The Tile IR states every shared-memory access a program's threads make: a ``copy``
writes a buffer's slot (each thread some of its elements), a ``read`` reads one (each
thread any element), and only a ``barrier`` orders one thread's access before
another's. An asynchronous copy (``cp.async``) writes when it likes until a ``wait``
covers its group, and is visible to the other threads only after a barrier that
follows the wait; a copy through TMA is complete, for every thread that waits on its
stage's barrier, at the ``wait`` of its slot; a ``release`` hands a stage's slot back
to the producer warpgroup once the reads of it are done. So the checker walks a kernel
as the threads do, keeping the accesses that no barrier has ordered yet, and reports
a read of a slot that an unordered write may still be writing, and a write of a slot
that an unordered read may still be reading, at the ``.tsr`` lines of both.

Branches merge what each path leaves unordered, so an access is ordered only when
every path has a barrier. Loops run their first iterations one after another with the
counter's value in each slot index (``(nblk + 1) % 2`` is slot 1, then 0, ...), until
every stage of every buffer has come round twice, so that a hazard carried around the
loop or from the copies before it is found; the loop may stop after any iteration.
Two slots whose difference is not a known constant may be the same one and count as
one (the check is conservative there).

Global tensors: programs run in any order and no barrier orders them, so a kernel
that writes a tensor and touches it again at another place races, barrier or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...frozen import frozen
from ..graph.dims import Dim
from ..graph.ir import Block, Op, walk
from ..tile.ir import Slot, TileKernel
from .findings import Finding

__all__ = ["find_races"]


@frozen
class _Access:
    op: Op
    write: bool
    buffer: int
    slot: Dim
    stages: int
    #: An asynchronous copy's commit group while it runs (None once it is complete).
    group: int | None = None

    def key(self) -> tuple[int, bool, str]:
        return (id(self.op), self.write, str(self.slot))


@dataclass
class _State:
    unordered: dict[tuple[int, bool, str], _Access] = field(default_factory=dict)
    running: dict[tuple[int, bool, str], _Access] = field(default_factory=dict)
    group: int = 0  # the commit group that copies issued now join

    def copy(self) -> _State:
        return _State(dict(self.unordered), dict(self.running), self.group)

    def merge(self, other: _State) -> None:
        self.unordered.update(other.unordered)
        self.running.update(other.running)
        self.group = max(self.group, other.group)


def find_races(kernel: TileKernel) -> list[Finding]:
    """Every unordered pair of accesses in ``kernel`` with at least one write."""
    checker = _Checker(kernel)
    if kernel.threads + kernel.producer > 1:
        checker.block(kernel.body, _State())
    checker.global_races()
    return checker.findings


class _Checker:
    def __init__(self, kernel: TileKernel) -> None:
        self.kernel = kernel
        self.findings: list[Finding] = []
        self.seen: set[tuple[int, int]] = set()
        self.values: dict[str, int] = {}
        #: Enough iterations for every stage of every buffer to come round twice.
        self.passes = 2 + 2 * max(
            (op.result.type.stages for op in walk(kernel.body) if op.kind == "alloc"), default=1
        )

    def block(self, block: Block, state: _State) -> _State:
        for op in block.ops:
            state = self.op(op, state)
        return state

    def op(self, op: Op, state: _State) -> _State:
        if op.kind == "copy":
            self.write(op, state)
        elif op.kind == "read":
            self.read(op, state)
        elif op.kind == "commit":
            state.group += 1
        elif op.kind == "wait":
            self.wait(op, state)
        elif op.kind == "barrier":
            state.unordered.clear()
        elif op.kind == "release":
            released = op.attr("slot").index.substitute(self.values)
            for key, a in list(state.unordered.items()):
                if not a.write and _same_slot(a.slot, released, a.stages):
                    del state.unordered[key]
        elif op.kind == "for":
            return self.loop(op, state)
        elif op.regions:
            # Every path through the branch; one without an else region also goes past.
            after = state.copy() if len(op.regions) == 1 else _State(group=state.group)
            for region in op.regions:
                after.merge(self.block(region, state.copy()))
            return after
        return state

    def loop(self, op: Op, state: _State) -> _State:
        """The first iterations one after another, with the counter's value in each slot
        index; the loop may stop after any of them, or run none."""
        body = op.regions[0]
        counter = body.args[0].name or ""
        after = state.copy()
        for iteration in range(self.passes):
            self.values[counter] = iteration
            state = self.block(body, state)
            after.merge(state)
            state = state.copy()
        del self.values[counter]
        return after

    def access(self, op: Op, buffer_at: int, write: bool) -> _Access:
        buf = op.operands[buffer_at]
        slot: Slot = op.attr("slot") or Slot(Dim.const(0))
        return _Access(op, write, buf.id, slot.index.substitute(self.values), buf.type.stages)

    def write(self, op: Op, state: _State) -> None:
        mine = self.access(op, 1, True)
        for other in state.unordered.values():
            if not other.write and _alias(mine, other):
                self.report(other, mine, "writes a slot that another thread may still be reading")
        # A producer warpgroup issues every copy, and a stage's barrier shows the ones
        # before the loop with the first stage's (specialize.py).
        if op.attr("async") or self.kernel.producer:
            mine = replace(mine, group=state.group)
            state.running[mine.key()] = mine
        else:
            state.unordered[mine.key()] = mine

    def read(self, op: Op, state: _State) -> None:
        mine = self.access(op, 0, False)
        for other in state.running.values():
            if _alias(mine, other):
                self.report(other, mine, "reads a slot that an asynchronous copy may still be "
                            "writing (no wait covers it)")  # fmt: skip
        for other in state.unordered.values():
            if other.write and _alias(mine, other):
                self.report(other, mine, "reads a slot that another thread may still be writing")
        state.unordered[mine.key()] = mine

    def wait(self, op: Op, state: _State) -> None:
        """``wait {pending = N}`` completes all but the newest N committed groups, which
        a barrier then shows every thread; ``wait {slot = s}`` waits on the stage's
        barrier, which completes and shows its copies to the waiting threads."""
        slot: Slot | None = op.attr("slot")
        index = slot.index.substitute(self.values) if slot is not None else None
        for key, a in list(state.running.items()):
            if slot is not None:
                if _same_slot(a.slot, index, a.stages):
                    del state.running[key]
            elif a.group is not None and a.group < state.group - op.attr("pending", 0):
                del state.running[key]
                state.unordered[key] = replace(a, group=None)

    def report(self, first: _Access, second: _Access, what: str) -> None:
        pair = (id(first.op), id(second.op))
        if pair in self.seen:
            return
        self.seen.add(pair)
        name = second.op.operands[1 if second.write else 0].name or "smem"
        first_kind = "write" if first.write else "read"
        self.findings.append(
            Finding(
                "race",
                self.kernel.name,
                f"this {'write' if second.write else 'read'} of shared buffer '{name}' {what}: "
                "no barrier orders them on every path",
                second.op.span,
                (f"the other access, a {first_kind} of '{name}', is here", first.op.span),
            )
        )

    def global_races(self) -> None:
        """A tensor written at one place and touched at another: programs are unordered."""
        by_tensor: dict[int, list[Op]] = {}
        for op in walk(self.kernel.body):
            if op.kind in ("load", "store", "copy"):
                by_tensor.setdefault(op.operands[0].id, []).append(op)
        for ops in by_tensor.values():
            for index, first in enumerate(ops):
                for second in ops[index + 1 :]:
                    writes = "store" in (first.kind, second.kind)
                    if writes and str(first.attr("at")) != str(second.attr("at")):
                        name = first.operands[0].name or "tensor"
                        self.findings.append(
                            Finding(
                                "race",
                                self.kernel.name,
                                f"global tensor '{name}' is written and accessed at different "
                                "places in one kernel, which other programs may run between",
                                second.span,
                                ("the other access is here", first.span),
                            )
                        )


def _alias(a: _Access, b: _Access) -> bool:
    return a.buffer == b.buffer and _same_slot(a.slot, b.slot, a.stages, exact=False)


def _same_slot(a: Dim, b: Dim, stages: int, exact: bool = True) -> bool:
    """Whether slot indices ``a`` and ``b`` (taken modulo ``stages``) are the same slot:
    surely (``exact``), or possibly (a difference that is not a known constant)."""
    if stages == 1:
        return True
    difference = (a - b).constant
    if difference is None:
        return not exact
    return difference % stages == 0
