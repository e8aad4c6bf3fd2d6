"""The Graph IR verifier, run after semantic analysis and after every pass.

It checks what every pass must preserve: each value is defined once and
before its uses, regions yield what their op returns, and fused kernels
partition the body in an order that respects data flow. A failure is a
compiler bug and is reported as an internal error naming the pass.
"""

from __future__ import annotations

from .ir import Block, Function, GraphModule, Value

__all__ = ["verify", "VerifyError"]


class VerifyError(AssertionError):
    pass


def verify(module: GraphModule) -> None:
    for function in module.functions:
        _Verifier(function).run()


class _Verifier:
    def __init__(self, function: Function) -> None:
        self.function = function
        self.defined: set[int] = set()

    def fail(self, message: str) -> VerifyError:
        return VerifyError(f"function '{self.function.name}': {message}")

    def define(self, value: Value) -> None:
        if value.id in self.defined:
            raise self.fail(f"value {value.name or value.id} is defined twice")
        self.defined.add(value.id)

    def run(self) -> None:
        f = self.function
        for param in f.params:
            self.define(param.value)
        self.block(f.body, visible=set(self.defined))
        for value in f.body.yields:
            if value.id not in self.defined:
                raise self.fail(f"returns {value.name or value.id}, which is not defined")
        self.groups()

    def block(self, block: Block, visible: set[int]) -> None:
        visible = set(visible)
        for arg in block.args:
            self.define(arg)
            visible.add(arg.id)
        for op in block.ops:
            for operand in op.operands:
                if operand.id not in visible:
                    raise self.fail(
                        f"{op.kind} uses {operand.name or operand.id} before it is defined"
                    )
            for region in op.regions:
                self.block(region, visible)
                if len(region.yields) != len(op.results):
                    raise self.fail(
                        f"{op.kind} yields {len(region.yields)} values "
                        f"for {len(op.results)} results"
                    )
                for got, result in zip(region.yields, op.results, strict=True):
                    if got.type != result.type:
                        raise self.fail(f"{op.kind} yields {got.type} for a {result.type} result")
            if op.kind == "tile.for" and len(op.regions[0].args) != len(op.operands) + 1:
                raise self.fail(
                    "tile.for needs one region argument per carried value, plus the index"
                )
            for result in op.results:
                self.define(result)
                visible.add(result.id)
        for value in block.yields:
            if value.id not in visible:
                raise self.fail(f"yields {value.name or value.id}, which is not visible here")

    def groups(self) -> None:
        f = self.function
        if not f.groups:
            return
        indices = [i for g in f.groups for i in g.ops]
        if sorted(indices) != list(range(len(f.body.ops))):
            raise self.fail("fused kernels do not cover every op exactly once")
        group_of = {}
        for g, group in enumerate(f.groups):
            for i in group.ops:
                for result in f.body.ops[i].results:
                    group_of[result.id] = g
        for g, group in enumerate(f.groups):
            if list(group.ops) != sorted(group.ops):
                raise self.fail(f"kernel {group.name} lists its ops out of order")
            for i in group.ops:
                for operand in f.body.ops[i].operands:
                    if group_of.get(operand.id, -1) > g:
                        raise self.fail(f"kernel {group.name} uses a value from a later kernel")
