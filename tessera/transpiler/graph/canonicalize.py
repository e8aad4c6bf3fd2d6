"""Canonical forms, so later passes match one shape of each pattern.

- A constant operand of a commutative op goes on the right: ``2 * x`` is ``x * 2``.
- Subtracting a constant is adding its negation: ``x - 1`` is ``x + -1``.
- A reduction over the second-to-last axis (``sum(x, axis=0)`` of a matrix: a bias
  gradient, a column mean) is the reduction over the last axis of ``x``'s transpose,
  which the library's row kernels compute; a softmax over it is the transpose of the
  softmax of the transpose. Each transpose is a kernel of its own, a pass over memory;
  a transpose the user wrote there cancels it (``simplify``).
- A row kernel's op on a vector (``softmax(v)``, ``sum(v)`` of a ``[N]`` tensor) is the op
  on the one row of ``v`` reshaped to ``[1, N]``, reshaped back: a reshape is a view, so
  the row kernel reads ``v`` where it lies.
"""

from __future__ import annotations

from dataclasses import replace

from .dims import Dim
from .graph_ops import last_two_swapped
from .ir import Block, Function, GraphModule, Op, Value, new_value
from .rewrite import Rewriter, map_functions

#: Row kernels that drop the last axis, and those that keep every axis.
_ROW_REDUCTIONS = ("sum", "max", "mean", "logsumexp_safe")
_ROW_MAPS = ("softmax", "softmax_safe")
_NORMS = ("layernorm", "layernorm_safe", "rmsnorm", "rmsnorm_safe")

__all__ = ["canonicalize"]

_COMMUTATIVE = ("add", "mul")


def _rule(op: Op, producers: dict[int, Op]) -> Op | Value | None:
    attrs = dict(op.attrs)
    if op.kind in _COMMUTATIVE and _const(attrs.get("a")):
        attrs["b"] = attrs.pop("a")
        return replace(op, attrs=tuple(attrs.items()))
    if op.kind == "sub" and _const(attrs.get("b")):
        attrs["b"] = -attrs["b"]
        return replace(op, kind="add", attrs=tuple(attrs.items()))
    return None


def _const(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _over_rows(function: Function) -> Function:
    ops: list[Op] = []
    for op in function.body.ops:
        x = op.operands[0] if op.operands else None
        if (
            op.kind not in (*_ROW_REDUCTIONS, *_ROW_MAPS) or x is None or op.attr("keepdims")
            or x.type.rank < 2 or op.attr("axis") != x.type.rank - 2
        ):  # fmt: skip
            ops.append(op)
            continue
        perm = last_two_swapped(x.type.rank)
        swapped = new_value(x.type.with_(dims=tuple(x.type.dims[i] for i in perm)), None, op.span)
        ops.append(Op("transpose", (x,), (swapped,), (("perm", perm),), span=op.span))
        attrs = tuple({**dict(op.attrs), "axis": x.type.rank - 1}.items())
        if op.kind in _ROW_REDUCTIONS:
            ops.append(replace(op, operands=(swapped,), attrs=attrs))
            continue
        rows = new_value(swapped.type.with_(dtype=op.result.type.dtype), None, op.span)
        ops.append(replace(op, operands=(swapped,), results=(rows,), attrs=attrs))
        ops.append(Op("transpose", (rows,), op.results, (("perm", perm),), span=op.span))
    return replace(function, body=Block(function.body.args, tuple(ops), function.body.yields))


def _of_vectors(function: Function) -> Function:
    ops: list[Op] = []
    for op in function.body.ops:
        x = op.operands[0] if op.operands else None
        if op.kind not in (*_ROW_REDUCTIONS, *_ROW_MAPS, *_NORMS) or x is None or x.type.rank != 1:
            ops.append(op)
            continue
        row = (Dim.const(1), x.type.dims[0])
        matrix = new_value(x.type.with_(dims=row), None, op.span)
        ops.append(Op("reshape", (x,), (matrix,), (("shape", row),), span=op.span))
        result = op.result.type
        dims = row if op.kind not in _ROW_REDUCTIONS else row[:1] * (1 + op.attr("keepdims"))
        rows = new_value(result.with_(dims=dims), None, op.span)
        attrs = op.attrs
        if op.attr("axis") is not None:
            attrs = tuple({**dict(op.attrs), "axis": 1}.items())
        ops.append(replace(op, operands=(matrix, *op.operands[1:]), results=(rows,), attrs=attrs))
        ops.append(Op("reshape", (rows,), op.results, (("shape", result.dims),), span=op.span))
    return replace(function, body=Block(function.body.args, tuple(ops), function.body.yields))


def canonicalize(module: GraphModule) -> GraphModule:
    return map_functions(module, lambda f: Rewriter(_rule).function(_of_vectors(_over_rows(f))))
