"""Helpers shared by the graph passes: per-function op rewriting, use
replacement and dead-code removal, all producing new frozen IR."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .ir import Block, Function, GraphModule, Op, Value

__all__ = [
    "map_functions", "substitute", "remove_dead", "has_effects", "use_counts", "block_uses",
    "Rewriter",
]  # fmt: skip


def map_functions(module: GraphModule, fn: Callable[[Function], Function]) -> GraphModule:
    return replace(module, functions=tuple(fn(f) for f in module.functions))


def substitute(block: Block, mapping: dict[int, Value]) -> Block:
    """Replace every use of a value by its mapping, regions included."""

    def get(value: Value) -> Value:
        while value.id in mapping:
            value = mapping[value.id]
        return value

    ops = []
    for op in block.ops:
        ops.append(
            replace(
                op,
                operands=tuple(get(v) for v in op.operands),
                regions=tuple(substitute(r, mapping) for r in op.regions),
            )
        )
    return Block(block.args, tuple(ops), tuple(get(v) for v in block.yields))


def has_effects(op: Op) -> bool:
    """Whether ``op`` or any op in its regions has an effect: a loop or branch whose body
    stores is itself a store, kept even when it yields nothing."""
    return bool(op.effects) or any(has_effects(o) for r in op.regions for o in r.ops)


#: Library ops whose results after the first are extras that a use may go without
#: (a norm's row statistics beside its input's gradient): the kernel of one that lost
#: them neither computes nor stores them (``tile.instantiate.stdlib_kernel``).
TRAILING_EXTRAS = frozenset({"layernorm_grad", "rmsnorm_grad"})


def remove_dead(block: Block) -> Block:
    """Drop ops without effects whose results nobody uses, innermost first, and the
    unused extra results at the end of a ``TRAILING_EXTRAS`` op."""
    used: set[int] = {v.id for v in block.yields}
    kept: list[Op] = []
    for op in reversed(block.ops):
        regions = tuple(remove_dead(r) for r in op.regions)
        live = any(r.id in used for r in op.results) or has_effects(op)
        if not live:
            continue
        results = op.results
        if op.kind in TRAILING_EXTRAS:
            while len(results) > 1 and results[-1].id not in used:
                results = results[:-1]
        op = replace(op, regions=regions, results=results)
        kept.append(op)
        used |= {v.id for v in op.operands}
        for region in regions:
            used |= block_uses(region)
    return Block(block.args, tuple(reversed(kept)), block.yields)


def use_counts(block: Block) -> dict[int, int]:
    """How many times each value is used, as an operand or yielded from a region."""
    counts: dict[int, int] = {}

    def count(b: Block) -> None:
        for v in b.yields:
            counts[v.id] = counts.get(v.id, 0) + 1
        for op in b.ops:
            for v in op.operands:
                counts[v.id] = counts.get(v.id, 0) + 1
            for region in op.regions:
                count(region)

    count(block)
    return counts


def reader_counts(block: Block) -> dict[int, int]:
    """How many ops of ``block`` read each value (one that reads it twice, ``v * v``,
    counts once), and a yield of it as one more."""
    counts: dict[int, int] = {}
    for op in block.ops:
        for v in {v.id for v in op.operands}:
            counts[v] = counts.get(v, 0) + 1
    for v in block.yields:
        counts[v.id] = counts.get(v.id, 0) + 1
    return counts


def block_uses(block: Block) -> set[int]:
    """The ids of every value that ``block``'s ops (nested ones too) and yields read."""
    found = {v.id for v in block.yields}
    for op in block.ops:
        found |= {v.id for v in op.operands}
        for region in op.regions:
            found |= block_uses(region)
    return found


class Rewriter:
    """Walk a block's ops in order; ``rule(op, producers)`` returns a replacement
    op, a ``Value`` that replaces the op's single result, or None to keep it.
    ``producers`` maps value ids to the (already rewritten) ops that define them."""

    def __init__(self, rule: Callable[[Op, dict[int, Op]], Op | Value | None]) -> None:
        self.rule = rule

    def block(self, block: Block) -> Block:
        mapping: dict[int, Value] = {}
        producers: dict[int, Op] = {}
        ops: list[Op] = []
        for op in block.ops:
            op = replace(
                op,
                operands=tuple(_follow(v, mapping) for v in op.operands),
                regions=tuple(self.block(substitute(r, mapping)) for r in op.regions),
            )
            result = self.rule(op, producers)
            if isinstance(result, Value):
                mapping[op.result.id] = result
                continue
            op = result or op
            ops.append(op)
            for value in op.results:
                producers[value.id] = op
        yields = tuple(_follow(v, mapping) for v in block.yields)
        return remove_dead(Block(block.args, tuple(ops), yields))

    def function(self, function: Function) -> Function:
        return replace(function, body=self.block(function.body))


def _follow(value: Value, mapping: dict[int, Value]) -> Value:
    while value.id in mapping:
        value = mapping[value.id]
    return value
