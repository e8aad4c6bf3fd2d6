"""The standard library's tile kernels (``tessera/stdlib/*.tsr``), typed for a caller.

Each kernel is written once, for one representative dtype. A graph op that a library
kernel computes gets the kernel re-typed for its operands: the parameter annotations
are replaced by the operands' actual types (dims, dtype, policies) and the result's by
the op's, and the kernel goes through semantic analysis again, so every dtype rule
applies as if the user had written it. The tile stage does this for the ops it
instantiates a kernel for (``tile.instantiate``); a graph pass that turns a pattern of
ops into a call of a library kernel (``graph.dequantized``) does it to build the call.
"""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources
from typing import Any

from ..frontend import ast
from ..frontend.diagnostics import CompileError, Diagnostic, Diagnostics, Note, Severity
from ..frontend.kept_parse import parse_library_file
from ..options import Options
from .annotations import resolve_result, resolve_type, typed_for_caller
from .ir import Function
from .sema import analyze
from .types import TensorType, result_types

__all__ = ["TEMPLATE_PARAMS", "stdlib_kernel"]

#: Each library kernel's tensor parameters, by its file's name.
TEMPLATE_PARAMS = {
    "gemm": ("a", "b"),
    "gemm_nt": ("a", "b"),
    "flash_attention": ("q", "k", "v"),
    "softmax": ("x",),
    "log_softmax": ("x",),
    "layernorm": ("x", "weight", "bias"),
    "rmsnorm": ("x", "weight"),
    "rotary_embedding": ("x", "cos", "sin"),
    "elementwise": ("x",),
    "transpose": ("x",),
    "row_sum": ("x",),
    "row_mean": ("x",),
    "row_max": ("x",),
    "logsumexp": ("x",),
    "take_along_axis": ("x", "index"),
    "put_along_axis": ("x", "index", "values"),
    "scatter_add": ("x", "index", "values"),
    "pad": ("g", "like"),
    "attention_stats": ("q", "k", "v", "do"),
    "attention_dq": ("q", "k", "v", "do", "stats"),
    "attention_dkdv": ("q", "k", "v", "do", "stats"),
    "softmax_grad": ("y", "g"),
    "log_softmax_grad": ("y", "g"),
    "layernorm_grad": ("x", "weight", "g"),
    "rmsnorm_grad": ("x", "weight", "g"),
    "norm_param_grad": ("x", "g", "stats"),
    "gemm_dequant": ("a", "q", "scale", "zero_point"),
    "gemm_dequant_grouped": ("a", "q", "scale", "zero_point"),
    "gemm_i8": ("a", "b"),
}


@functools.cache
def _stdlib_module(template: str) -> ast.Module:
    text = resources.files("tessera.stdlib").joinpath(f"{template}.tsr").read_text("utf-8")
    return parse_library_file(f"tessera/stdlib/{template}.tsr", text)


@functools.cache
def _declared_types(template: str) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """The library kernel's parameter and result types as it declares them, in its own
    sizes (``a: [M, K]``), by parameter name, for ``FixedSizes``."""
    (fn,) = _stdlib_module(template).functions()
    params = {p.name: resolve_type(p.annotation, {}) for p in fn.params if p.annotation}
    return params, result_types(resolve_result(fn.returns, {}))


def stdlib_kernel(
    template: str, operands: tuple[TensorType, ...], results: tuple[TensorType, ...],
    span: Any, names: tuple[str, ...],
) -> Function:  # fmt: skip
    """The library kernel ``template`` typed for ``operands`` and ``results`` (one, or
    several for a kernel that returns several tiles); ``names`` are the tensor
    parameters they are. A parameter the op leaves out (a norm's weight or bias) is
    typed as a vector along the first operand's last dim: the analyser checks both
    sides of the kernel's ``with_`` branches, though one never runs. An op of fewer
    results than the kernel returns takes its first ones (``layernorm_grad``'s dx
    without the row statistics): the others are neither computed nor stored."""
    try:
        return _typed_kernel(template, operands, results, names)
    except CompileError as exc:
        first = exc.diagnostics[0]
        message = (
            f"the standard library's {template} kernel does not accept these operands: "
            f"{first.message}"
        )
        note = Note(f"operands: {', '.join(str(t) for t in operands)}")
        raise CompileError((Diagnostic(Severity.ERROR, message, span, (note,)),)) from None


@functools.lru_cache(maxsize=512)
def _typed_kernel(
    template: str, operands: tuple[TensorType, ...], results: tuple[TensorType, ...],
    names: tuple[str, ...],
) -> Function:  # fmt: skip
    """``stdlib_kernel``'s analysed function, made once for each typing: a file's
    functions that call one another instantiate the same kernels for the same types
    (each is a tenth of a kernel's compile time). The IR is immutable, so the kernels
    lowered from it may share it."""
    (fn,) = _stdlib_module(template).functions()
    fn = _first_results(fn, len(results))
    typed = dict(zip(names, operands, strict=True))
    first = operands[0]
    absent = TensorType((first.dims[-1],), first.dtype)
    typed.update((n, absent) for n in TEMPLATE_PARAMS[template] if n not in typed)
    sizes = frozenset(s for t in (*operands, *results) for d in t.dims for s in d.symbols())
    # the library's own names for the sizes that the caller fixes (gemm's K of 256)
    declared, declared_results = _declared_types(template)
    fn, fixed = typed_for_caller(fn, declared, declared_results, typed, results, sizes)
    diags = Diagnostics()
    options = Options(defines=tuple(sorted(fixed.items())))
    module = analyze(ast.Module((fn,), span=fn.span), options, diags, sizes)
    diags.check()
    return module.functions[0]


def _first_results(fn: ast.FunctionDef, count: int) -> ast.FunctionDef:
    """``fn`` returning the first ``count`` of the tiles its last statement, the library
    kernel's one ``return``, returns."""
    *body, last = fn.body
    assert isinstance(last, ast.Return), fn.name
    if not isinstance(last.value, ast.TupleExpr) or len(last.value.elts) == count:
        return fn
    kept = last.value.elts[:count]
    value = kept[0] if count == 1 else dataclasses.replace(last.value, elts=kept)
    return dataclasses.replace(fn, body=(*body, dataclasses.replace(last, value=value)))
