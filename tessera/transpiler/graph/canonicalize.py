"""Canonical forms, so later passes match one shape of each pattern.

- A constant operand of a commutative op goes on the right: ``2 * x`` is ``x * 2``.
- Subtracting a constant is adding its negation: ``x - 1`` is ``x + -1``.
"""

from __future__ import annotations

from dataclasses import replace

from .ir import GraphModule, Op, Value
from .rewrite import Rewriter, map_functions

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


def canonicalize(module: GraphModule) -> GraphModule:
    return map_functions(module, Rewriter(_rule).function)
