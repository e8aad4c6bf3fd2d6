"""``@loss_scale(k)``: the backward pass runs on ``k`` times the cotangent, the gradients
are divided by ``k``; and ``all_finite``, the check a training step reads.

A loss declared ``-> Tensor[1, f32 @loss_scale(1024)]`` is returned as computed. Its
gradient (``F_vjp``, ``grad(F)``, ``value_and_grad(F)``) is the backward pass of ``k``
times the loss: every cotangent in between is ``k`` times larger, so that small bf16 or
f16 gradients do not flush to zero; each gradient is divided by ``k`` at the end (in its
dtype, exactly for a power of two). A step whose scaled cotangents overflowed has an
infinity or NaN in some gradient, and dividing keeps it: ``all_finite(g)`` says whether
a gradient has none, so that the step can skip the update (``docs/numerics.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..frontend import ast
from .autodiff import Builder
from .dtypes import F32
from .graph_ops import register
from .ir import Value
from .opcall import OpCall, P, SemanticError
from .types import TensorType

__all__ = ["loss_scale", "scaled"]


def loss_scale(declared: Sequence[Any], returns: ast.TypeExpr | None) -> float | None:
    """The ``k`` of the results' ``@loss_scale(k)``, None without one; the results must
    all have the same one, since the gradients are divided by one number."""
    scales = {t.policies.loss_scale for t in declared if isinstance(t, TensorType)}
    if scales == {None}:
        return None
    if len(scales) > 1:
        raise SemanticError(
            "@loss_scale: the results have different scales (or only some have one): the "
            "gradients are divided by one number, so give every result the same "
            "@loss_scale(k)",
            returns.span if returns is not None else None,
        )
    return scales.pop()


def scaled(
    b: Builder, values: Sequence[Value], factor: float | None, kind: str = "mul"
) -> list[Value]:
    """Each of ``values`` times ``factor`` (or divided by it, ``kind="div"``), rounded to
    its dtype; as it is where there is no factor."""
    return [v if factor is None else b(kind, v, factor) for v in values]


@register("all_finite", P("x"))
def _all_finite(call: OpCall) -> object:
    """``[1.0]`` when every element of the float tensor ``x`` is finite, ``[0.0]`` when one
    is an infinity or NaN (a ``Tensor[1, f32]``): the check of a loss-scaled training
    step, whose overflowed gradients hold one (``where(all_finite(g) == 1.0, updated,
    param)`` keeps the parameters of a step that overflowed). It is ``sum(x * 0.0) == 0.0``, which
    only an infinity or NaN makes NaN, on every target."""
    x = call.tensor("x")
    if not x.type.dtype.is_float:
        raise call.error(f"'x' must be a float tensor, not {x.type}", at="x")
    b = Builder(call.emitter, call.span)
    wide = x if x.type.dtype == F32 else b("cast", x, F32)
    total = b("sum", b("mul", wide, 0.0), axis=None, keepdims=True)
    if total.type.rank != 1:
        total = b("reshape", total, (1,))
    return b("where", b("equal", total, 0.0), 1.0, 0.0)
