"""Algebraic simplification and dead-code removal.

- ``x * 1``, ``x + 0``, ``x / 1``, ``x ** 1`` are ``x`` (when the type is unchanged).
- ``transpose(transpose(x))`` is one transpose, or ``x`` when the two cancel; but two
  that each have a kernel stay two when their product has none.
- ``reshape(reshape(x))`` is one reshape, and a reshape to ``x``'s own dims is ``x``:
  the reshapes around the swaps of ``canonicalize`` cancel like the swaps do.
- ``a @ transpose(b)`` reads ``b`` as it lies: ``matmul(a, b) {trans_b = true}``. The
  library kernel then loads ``b``'s rows as the product's columns (``x @ w.T`` of a
  ``[N, K]`` weight, ``q @ k.T``) and no transposed copy is ever written. Only a swap of
  the last two axes folds; another permutation stays a transpose.
- ``cast(x, x.dtype)`` is ``x``; ``cast(cast(x, a), b)`` is ``cast(x, b)`` when the first
  cast was exact (``a`` holds every value of ``x``'s dtype).
- Results nobody uses disappear, unless the op has an effect.

Constant folding happens earlier: compile-time arithmetic (``1.0 / 8``,
``T.m * 2``, ``float(64)``) never becomes IR, because the analyser computes it.
"""

from __future__ import annotations

from dataclasses import replace

from .dtypes import DType
from .graph_ops import has_transpose_kernel, last_two_swapped
from .ir import GraphModule, Op, Value
from .rewrite import Rewriter, map_functions
from .types import ScalarType

__all__ = ["simplify"]

_IDENTITY = {"mul": 1, "div": 1, "pow": 1, "add": 0}


def _same_type(a: Value, b: Value) -> bool:
    ta, tb = a.type, b.type
    if isinstance(ta, ScalarType) or isinstance(tb, ScalarType):
        return ta == tb  # n * 1.0 of an int n is a float: float(n)
    return (
        getattr(ta, "dims", None) == getattr(tb, "dims", None)
        and getattr(ta, "dtype", None) == getattr(tb, "dtype", None)
        and type(ta) is type(tb)
    )


def _exact(source: DType, middle: DType) -> bool:
    """Every value of ``source`` survives a cast to ``middle``."""
    if source.is_float != middle.is_float:
        return False
    if source.is_float:
        return middle.mantissa >= source.mantissa and middle.bits >= source.bits
    return middle.bits >= source.bits


def _rule(op: Op, producers: dict[int, Op]) -> Op | Value | None:
    attrs = dict(op.attrs)
    if op.kind in _IDENTITY and len(op.operands) == 1 and attrs.get("b") == _IDENTITY[op.kind]:
        x = op.operands[0]
        if "a" not in attrs and _same_type(x, op.result):
            return x
    if op.kind == "matmul" and not op.attr("trans_b"):
        inner = producers.get(op.operands[1].id)
        swap = inner is not None and inner.kind == "transpose"
        if swap and inner.attr("perm") == last_two_swapped(op.operands[1].type.rank):
            return replace(op, operands=(op.operands[0], inner.operands[0]),
                           attrs=(*op.attrs, ("trans_b", True)))  # fmt: skip
    if op.kind == "reshape":
        inner = producers.get(op.operands[0].id)
        source = inner.operands[0] if inner is not None and inner.kind == "reshape" else None
        if _same_type(source or op.operands[0], op.result):
            return source or op.operands[0]
        if source is not None:
            return replace(op, operands=(source,))
    if op.kind in ("transpose", "cast"):
        inner = producers.get(op.operands[0].id)
        if op.kind == "transpose" and inner is not None and inner.kind == "transpose":
            perm = tuple(inner.attr("perm")[i] for i in op.attr("perm"))
            source = inner.operands[0]
            if perm == tuple(range(len(perm))) and _same_type(source, op.result):
                return source
            kernels = has_transpose_kernel(inner.attr("perm")) and has_transpose_kernel(
                op.attr("perm")
            )
            if kernels and not has_transpose_kernel(perm):  # canonicalize split it so
                return None
            return replace(op, operands=(source,), attrs=(("perm", perm),))
        if op.kind == "cast":
            x = op.operands[0]
            if x.type.dtype == op.attr("dtype") and _same_type(x, op.result):
                return x
            if inner is not None and inner.kind == "cast":
                source = inner.operands[0]
                if _exact(source.type.dtype, inner.attr("dtype")):
                    if source.type.dtype == op.attr("dtype") and _same_type(source, op.result):
                        return source
                    return replace(op, operands=(source,))
    return None


def simplify(module: GraphModule) -> GraphModule:
    return map_functions(module, Rewriter(_rule).function)
