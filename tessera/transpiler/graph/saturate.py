"""``@saturate`` on a declared result: the conversion that produces it clamps.

A result typed ``fp8_e4m3 @saturate`` holds 448 where the computation gave 1000, not
NaN (``docs/numerics.md``). The conversion into the result's dtype is the op that
produces the returned value: a ``cast`` (written, or the one semantic analysis adds
after a product or a reduction accumulated in f32), which this pass marks
``saturate``; or elementwise math computed in the result's dtype (``a * b`` of two fp8
tensors), which this pass computes in f32 and follows with a saturating cast, so that
the result is rounded once. A returned value that no op of the function converts (a
parameter, a transpose of one) already holds values of the dtype and is left alone.
"""

from __future__ import annotations

from dataclasses import replace

from .dtypes import F32
from .graph_ops import ELEMENTWISE_MATH
from .ir import Function, GraphModule, Op, new_value
from .types import TensorType, TileType, result_types

__all__ = ["saturate_results", "through_f32"]

_CASTS = ("cast", "tile.cast")


def saturate_results(module: GraphModule) -> GraphModule:
    return replace(module, functions=tuple(_function(f) for f in module.functions))


def _function(function: Function) -> Function:
    declared = result_types(function.result_type)
    wanted = {
        value.id
        for value, t in zip(function.body.yields, declared, strict=False)
        if isinstance(t, TensorType) and t.policies.saturate
    }
    if not wanted:
        return function
    ops: list[Op] = []
    for op in function.body.ops:
        if not any(r.id in wanted for r in op.results):
            ops.append(op)
        elif op.kind in _CASTS:
            ops.append(replace(op, attrs=(*op.attrs, ("saturate", True))))
        elif op.kind.removeprefix("tile.") in ELEMENTWISE_MATH and len(op.results) == 1:
            ops.extend(through_f32(op))
        else:
            ops.append(op)
    return replace(function, body=replace(function.body, ops=tuple(ops)))


def through_f32(op: Op) -> tuple[Op, Op]:
    """``op`` computed in f32, and a saturating cast of that into its result."""
    result = op.result
    t = result.type
    wide_type = t.with_(dtype=F32) if isinstance(t, TileType) else TensorType(t.dims, F32)
    wide = new_value(wide_type, result.name, result.span)
    kind = "tile.cast" if isinstance(t, TileType) else "cast"
    cast = Op(kind, (wide,), (result,), (("dtype", t.dtype), ("saturate", True)), span=op.span)
    return replace(op, results=(wide,)), cast
