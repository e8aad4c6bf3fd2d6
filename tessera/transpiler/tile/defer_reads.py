"""Reads of shared memory move to where the instruction really reads it.

A ``read`` says when a staged operand leaves shared memory. For the CPU's
micro-kernel, whose operands are packed into registers, that is where the
``read`` stands. A GPU product takes its operands from shared memory as it
runs (``wgmma`` descriptors; ``mma.sync`` and MFMA fragments, loaded a k step
at a time; the FMA loop of a SIMT target, where each thread reads the elements
it multiplies), so it reads them at the mma itself, and the ``read`` moves down
to just before its first use: into the loop that uses it, when that is where
the use is. The barrier pass, which runs
next, then sees the buffer busy until the product is done, and the planner
keeps the buffer alive as long (the query tile of attention no longer gives
its bytes to the key tile).

A read that no product takes (a block loaded for elementwise ops, as
``norm_param_grad`` loads its blocks of x and g) is read where the GPU emitters print the
element, at its first use, and moves there too: the barrier before the next
iteration's copy into its buffer then waits for it.
"""

from __future__ import annotations

from dataclasses import replace

from ..graph.ir import Block, Op, walk
from ..schedule.hardware import Hardware
from .ir import Mma, TileKernel
from .rewrite import producers

__all__ = ["defer_reads"]

_THROUGH = ("transpose", "cast")


def defer_reads(kernel: TileKernel, hw: Hardware) -> TileKernel:
    deferred = _reads_of_shared_operands(kernel.body)
    if not deferred:
        return kernel
    body, left = _place(kernel.body, deferred, [])
    return replace(kernel, body=replace(body, ops=(*body.ops, *left)))


def _reads_of_shared_operands(body: Block) -> set[int]:
    defs = producers(body)
    found = _reads_of_no_product(body)
    for op in walk(body):
        mma = op.attr("mma")
        if not isinstance(mma, Mma) or mma.operands != "shared":
            continue
        operands = (op.operands[4],) if op.kind == "softmax_accumulate" else op.operands[:2]
        for v in operands:
            # the read and the casts and transposes between it and the product, which
            # reads through them: they move together, reading the buffer where it stands
            chain = [defs.get(v.id)]
            while chain[-1] is not None and chain[-1].kind in _THROUGH:
                chain.append(defs.get(chain[-1].operands[0].id))
            if chain[-1] is not None and chain[-1].kind == "read":
                found |= {id(op) for op in chain}
    return found


def _reads_of_no_product(body: Block) -> set[int]:
    """The reads (and the casts and transposes after them) whose values no product
    takes, directly or through casts and transposes: elementwise ops read them where
    they are used."""
    users: dict[int, list[Op]] = {}
    for op in walk(body):
        for v in op.operands:
            users.setdefault(v.id, []).append(op)

    def chain(op: Op) -> list[Op] | None:
        """``op`` and the casts and transposes that read it, or None if a product reads
        one of them."""
        found = [op]
        for user in users.get(op.result.id, []):
            if user.kind in _PRODUCTS:
                return None
            if user.kind in _THROUGH:
                after = chain(user)
                if after is None:
                    return None
                found += after
        return found

    found: set[int] = set()
    for op in walk(body):
        if op.kind == "read":
            reads = chain(op)
            found |= {id(r) for r in reads or ()}
    return found


#: Ops that read their operands from shared memory as they run, or that the CPU packs.
_PRODUCTS = ("dot", "mma", "softmax_accumulate")


def _place(block: Block, deferred: set[int], pending: list[Op]) -> tuple[Block, list[Op]]:
    """``block`` with its deferred reads (and ``pending`` ones from outside) placed before
    their first use; returns the reads nothing in the block used."""
    ops: list[Op] = []
    pending = list(pending)
    for op in block.ops:
        if id(op) in deferred:
            pending.append(op)
            continue
        direct = {v.id for v in op.operands}
        inner = _inner_uses(op)
        here = _with_producers(pending, direct)
        if op.kind == "for":
            down = [r for r in _with_producers(pending, inner) if r not in here]
        else:  # a read used in one branch of an `if` stays before the `if`
            here = _with_producers(pending, direct | inner)
            down = []
        ops += here
        pending = [r for r in pending if r not in here and r not in down]
        if down:
            body, unused = _place(op.regions[0], deferred, down)
            assert not unused, "a read pushed into a loop is used there"
            op = replace(op, regions=(body,))
        elif op.regions:
            regions = []
            for region in op.regions:
                placed, left = _place(region, deferred, [])
                regions.append(replace(placed, ops=(*placed.ops, *left)))
            op = replace(op, regions=tuple(regions))
        ops.append(op)
    uses = {v.id for v in block.yields}
    ops += [r for r in pending if r.result.id in uses]
    return replace(block, ops=tuple(ops)), [r for r in pending if r.result.id not in uses]


def _with_producers(pending: list[Op], used: set[int]) -> list[Op]:
    """The pending ops whose results ``used`` names, with the pending ops they read
    (a read before the cast of it), in their order."""
    wanted, chosen = set(used), set()
    for op in reversed(pending):
        if op.result.id in wanted:
            chosen.add(id(op))
            wanted |= {v.id for v in op.operands}
    return [op for op in pending if id(op) in chosen]


def _inner_uses(op: Op) -> set[int]:
    found: set[int] = set()
    for region in op.regions:
        for inner in walk(region):
            found |= {v.id for v in inner.operands}
        found |= {v.id for v in region.yields}
    return found
