"""Instantiate a standard-library tile kernel for a fused Graph IR group.

The library's kernels (``tessera/stdlib/*.tsr``) are written once, for one
representative dtype. A group anchored at ``matmul``, ``flash_attention``,
``softmax``, ``layernorm``, ``rmsnorm`` or ``rotary_embedding`` gets the
kernel re-typed for its operands: the parameter annotations are replaced by
the operands' actual types (dims, dtype, policies) and the result's by the
anchor's, and the kernel goes through semantic analysis again, so every
dtype rule applies as if the user had written it. The group's other ops
(bias, activation, residual, cast) become the epilogue, applied to the
result tile before it is stored.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from importlib import resources
from typing import Any

from ..frontend import ast
from ..frontend.diagnostics import CompileError, Diagnostic, Diagnostics, Note, Severity
from ..frontend.parser import parse
from ..frontend.source import SourceFile
from ..graph.dims import Dim
from ..graph.ir import Function, Op, Value
from ..graph.sema import analyze
from ..graph.types import ScalarType, TensorType, TileType
from ..options import Options
from .ir import Access, Axis
from .lower import KernelInput

__all__ = ["TEMPLATE_PARAMS", "stdlib_kernel", "instantiate", "epilogue_builder"]

#: The library kernel each anchor op instantiates: (file, tensor parameters).
TEMPLATE_PARAMS = {
    "gemm": ("a", "b"),
    "flash_attention": ("q", "k", "v"),
    "softmax": ("x",),
    "layernorm": ("x", "weight", "bias"),
    "rmsnorm": ("x", "weight"),
    "rotary_embedding": ("x", "cos", "sin"),
}


@functools.cache
def _stdlib_module(template: str) -> ast.Module:
    text = resources.files("tessera.stdlib").joinpath(f"{template}.tsr").read_text("utf-8")
    diags = Diagnostics()
    module = parse(SourceFile(f"tessera/stdlib/{template}.tsr", text), diags)
    assert module is not None and not diags.items, f"stdlib {template} does not parse"
    return module


def _type_expr(t: TensorType) -> ast.TypeExpr:
    """The annotation that spells ``t``, parsed as a user would have written it."""
    dims = ", ".join(f'"{d}"' for d in t.dims)
    policies = f" {t.policies}" if str(t.policies) else ""
    diags = Diagnostics()
    module = parse(SourceFile("<type>", f"def f(x: Tensor[{dims}, {t.dtype}{policies}]): ...\n"),
                   diags)  # fmt: skip
    assert module is not None and not diags.items, f"cannot spell {t}"
    annotation = module.functions()[0].params[0].annotation
    assert annotation is not None
    return annotation


def stdlib_kernel(
    template: str, operands: tuple[TensorType, ...], result: TensorType, span: Any
) -> Function:
    """The library kernel ``template`` typed for ``operands`` and ``result``."""
    (fn,) = _stdlib_module(template).functions()
    names = TEMPLATE_PARAMS[template]
    typed = dict(zip(names, operands, strict=True))
    params = tuple(
        dataclasses.replace(p, annotation=_type_expr(typed[p.name])) if p.name in typed else p
        for p in fn.params
    )
    fn = dataclasses.replace(fn, params=params, returns=_type_expr(result))
    diags = Diagnostics()
    try:
        module = analyze(ast.Module((fn,), span=fn.span), Options(), diags)
        diags.check()
    except CompileError as exc:
        first = exc.diagnostics[0]
        message = (
            f"the standard library's {template} kernel does not accept these operands: "
            f"{first.message}"
        )
        note = Note(f"operands: {', '.join(str(t) for t in operands)}")
        raise CompileError((Diagnostic(Severity.ERROR, message, span, (note,)),)) from None
    return module.functions[0]


def instantiate(
    group_ops: list[Op], anchor: Op, template: str, params: tuple[Value, ...],
    rename: dict[int, Value], name: str, function: str, kind: str,
) -> tuple[Function, KernelInput]:  # fmt: skip
    """The typed library kernel for a group, and how to lower it. ``rename`` maps the
    graph values the group reads and writes to the kernel's parameters; the last
    parameter is the output."""
    tensors = anchor.operands[: len(TEMPLATE_PARAMS[template])]
    fn = stdlib_kernel(template, tuple(v.type for v in tensors), anchor.result.type, anchor.span)
    bind: dict[int, Any] = {}
    for param in fn.params:
        if param.value.name in TEMPLATE_PARAMS[template]:
            bind[param.value.id] = rename[
                tensors[TEMPLATE_PARAMS[template].index(param.value.name)].id
            ]
        else:
            bind[param.value.id] = _keyword(anchor, param.value.name, tensors)
    epilogue = [op for op in group_ops if op is not anchor]
    given = KernelInput(
        name, function, params, bind, params[-1],
        epilogue_builder(anchor.result, epilogue, rename) if epilogue else None, template, kind,
    )  # fmt: skip
    return fn, given


def _keyword(anchor: Op, name: str, tensors: tuple[Value, ...]) -> Any:
    """A library kernel's keyword parameter, from the graph op's attributes."""
    value = anchor.attr(name)
    if name == "scale" and value is None:
        head_dim = tensors[0].type.dims[-1]
        if head_dim.constant is not None:
            return 1.0 / math.sqrt(head_dim.constant)
        return lambda lowering: lowering.rsqrt_of(head_dim)
    assert value is not None, f"{anchor.kind} gives no {name}"
    return value


def epilogue_builder(first: Value, ops: list[Op], rename: dict[int, Value]) -> Any:
    """A function that applies the group's remaining ops to the result tile."""

    def build(lowering: Any, tile: Value, access: Access) -> Value:
        inside: dict[int, Value] = {first.id: tile}
        current = tile
        for op in ops:
            operands = tuple(
                (
                    inside[v.id]
                    if v.id in inside
                    else _epilogue_operand(lowering, rename[v.id], access)
                )
                for v in op.operands
            )
            result_type = TileType(current.type.dims, op.result.type.dtype)
            (current,) = lowering.emit(
                op.kind, operands, (result_type,), op.attrs, op.effects, (), op.span,
                (op.result.name,),
            )  # fmt: skip
            inside[op.result.id] = current
        return current

    return build


def _epilogue_operand(lowering: Any, value: Value, out: Access) -> Value:
    """Load the part of an outside tensor that lines up with the output tile (a bias
    of ``[N]`` gives the tile's columns, broadcast over its rows)."""
    if isinstance(value.type, ScalarType):
        return value
    dims = value.type.dims
    axes = []
    for extent, place in zip(dims, out.axes[len(out.axes) - len(dims) :], strict=True):
        if extent == Dim.const(1) and place.extent != extent:
            axes.append(Axis(Dim.const(0), Dim.const(1), extent, index=place.index))
        else:
            axes.append(dataclasses.replace(place, extent=extent))
    access = Access(tuple(axes))
    sizes = tuple(a.size for a in access.tile_axes)
    (loaded,) = lowering.emit("load", (value,), (TileType(sizes, value.type.dtype),),
                              (("at", access),))  # fmt: skip
    missing = len(out.tile_axes) - len(sizes)
    if missing:
        (loaded,) = lowering.emit(
            "expand_dims", (loaded,),
            (TileType((Dim.const(1),) * missing + sizes, value.type.dtype),),
            (("axes", tuple(range(missing))),),
        )  # fmt: skip
    return loaded
