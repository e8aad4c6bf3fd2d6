"""The text form of the Graph IR (``--emit graph``, ``inspect_ir("graph")``).

MLIR-flavoured and meant for people: every value shows its shape, dtype and
policies; values keep their source names (``%acc``, then ``%acc.1`` for the
next definition); each op ends with the ``line:col`` it came from; fused
kernels are blocks of their own.
"""

from __future__ import annotations

import math
from typing import Any

from ..frontend.printer import format_float
from .ir import Block, Function, GraphModule, Op, StateSlot, Value, walk

__all__ = ["print_graph", "value_names", "name_values", "OpPrinter", "format_attr"]


def print_graph(module: GraphModule) -> str:
    lines = [f"// graph IR of {module.name}"]
    for name, text in module.constants:
        lines += ["", f"schedule {name} = {text}"]
    for function in module.functions:
        lines += ["", *_FunctionPrinter(function).lines()]
    return "\n".join(lines) + "\n"


def format_attr(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return format_float(value)
    if isinstance(value, (tuple, list)):
        return (
            "(" + ", ".join(format_attr(v) for v in value) + ("," if len(value) == 1 else "") + ")"
        )
    if value is None:
        return "none"
    return str(value)  # ints, names, dims and dtypes print as themselves


def _shard_text(spec: tuple[str | None, ...] | None) -> str:
    """`` shard(dp, none)`` for a tensor split over a mesh; nothing for a whole one."""
    return f" shard({', '.join(a or 'none' for a in spec)})" if spec else ""


def _state_text(state: StateSlot) -> str:
    """An ``OptimizerState`` parameter or result, and the tensors that make it up."""
    master = " @fp32_master" if state.fp32_master else ""
    if state.result is None:
        where = f"param {state.name}"
    else:
        where = f"result {state.result}..{state.result + state.count - 1}"
    return f"state {where} : OptimizerState[{state.param}]{master}"


def value_names(function: Function) -> dict[int, str]:
    """The printed name of every value, in definition order: ``%acc``, ``%acc.1``, ``%0``.

    Shared with the later stages' printers, so one value has one name in every dump.
    """
    return name_values([p.value for p in function.params], function.body)


def name_values(params: list[Value], body: Block) -> dict[int, str]:
    """``value_names`` for any parameters and body (a Tile IR kernel's, say)."""
    names: dict[int, str] = {}
    used: dict[str, int] = {}
    counter = 0
    # Kernels take %h.1 as h_1 and %3 as t3 (``schedule.ir.param_name``): a later
    # definition of h is h.1 unless some value is named h_1, and an unnamed value is not
    # numbered 3 where one is named t3.
    taken = {v.name for v in params}
    for op in walk(body):
        taken |= {v.name for v in op.results} | {a.name for r in op.regions for a in r.args}

    def add(value: Value) -> None:
        nonlocal counter
        if value.name is None:
            while f"t{counter}" in taken:
                counter += 1
            text = str(counter)
            counter += 1
        else:
            count = used.get(value.name, 0)
            while count and f"{value.name}_{count}" in taken:
                count += 1
            used[value.name] = count + 1
            text = value.name if count == 0 else f"{value.name}.{count}"
        names[value.id] = "%" + text

    def block(ops: tuple[Op, ...]) -> None:
        for op in ops:
            for result in op.results:
                add(result)
            for region in op.regions:
                for arg in region.args:
                    add(arg)
                block(region.ops)

    for param in params:
        add(param)
    block(body.ops)
    return names


class OpPrinter:
    """Prints ops and regions with a fixed naming; a function's printer and the
    later stages' printers share it, so an op looks the same at every level."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names

    def name(self, value: Value) -> str:
        return self.names[value.id]

    def attrs(self, op: Op) -> str:
        return ", ".join(f"{k} = {format_attr(v)}" for k, v in op.attrs)

    def op(self, op: Op, depth: int) -> list[str]:
        pad = "  " * depth
        results = ", ".join(self.name(r) for r in op.results)
        text = f"{results} = " if results else ""
        text += op.kind
        if op.operands:
            text += " " + ", ".join(self.name(v) for v in op.operands)
        if op.attrs:
            text += " {" + self.attrs(op) + "}"
        if op.effects:
            text += " effects(" + ", ".join(op.effects) + ")"
        if op.results:
            text += " : " + ", ".join(str(r.type) for r in op.results)
        if op.regions:
            text += " {"
        if op.span is not None:
            text += f"  // {op.span.line}:{op.span.column}"
        if not op.regions:
            return [pad + text]
        lines = [pad + text]
        for i, region in enumerate(op.regions):
            if i:
                lines.append(pad + "} else {")
            lines += self.region(region, depth + 1)
        return [*lines, pad + "}"]

    def region(self, block: Block, depth: int) -> list[str]:
        pad = "  " * depth
        lines = []
        if block.args:
            args = ", ".join(f"{self.name(a)}: {a.type}" for a in block.args)
            lines.append(f"{pad[:-2]}^({args}):")
        for op in block.ops:
            lines += self.op(op, depth)
        yielded = ", ".join(self.name(v) for v in block.yields)
        return [*lines, f"{pad}yield {yielded}".rstrip()]


class _FunctionPrinter(OpPrinter):
    def __init__(self, function: Function) -> None:
        super().__init__(value_names(function))
        self.function = function

    def lines(self) -> list[str]:
        f = self.function
        out = [f"func @{f.name} ({f.kind}) {{"]
        for decorator in f.decorators:
            out.append(f"  @{decorator}")
        if f.mesh is not None:
            out.append(f"  mesh {{{f.mesh}}}  // one device's program: per-device shapes")
        shards = iter(f.shards)
        for param in f.params:
            keyword = " keyword-only" if param.keyword_only else ""
            default = "" if param.default is None else f" = {param.default!r}"
            shard = _shard_text(next(shards, None))
            out.append(
                f"  param {self.name(param.value)} : {param.value.type}{shard}{default}{keyword}"
            )
        if f.result_type is not None:
            out.append(f"  result : {f.result_type}{_shard_text(next(shards, None))}")
        for state in f.states:
            out.append(f"  {_state_text(state)}")
        for guard in f.guards:
            where = f"  at {guard.span.line}:{guard.span.column}" if guard.span is not None else ""
            out.append(f"  guard {guard}  // {guard.reason}{where}")
        if f.kind == "declaration":
            return [*out, "  // declaration only: the body is '...'", "}"]
        out.append("")
        ops = f.body.ops
        if f.groups:
            for group in f.groups:
                out.append(f"  kernel {group.name} {group.kind} {{")
                for index in group.ops:
                    out += self.op(ops[index], 2)
                out.append("  }")
        else:
            for op in ops:
                out += self.op(op, 1)
        returned = ", ".join(self.name(v) for v in f.body.yields)
        out.append(f"  return {returned}".rstrip())
        return [*out, "}"]
