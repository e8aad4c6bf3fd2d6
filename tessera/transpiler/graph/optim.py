"""``fused_adam``: one Adam or AdamW optimizer step, as a graph op a training step calls.

It is made of elementwise graph ops (the moments, their bias correction, the decoupled
weight decay and the update), so that it lowers on every target as the rest of the
step does and fusion puts it into elementwise kernels. The standard library's tile
kernel of the same name (``tessera/stdlib/fused_adam.tsr``) is the same step as one
kernel that updates its arguments in place, for a host program to launch.
"""

from __future__ import annotations

import operator
from typing import Any

from .autodiff import Builder
from .dtypes import F32
from .graph_ops import register
from .ir import Value
from .opcall import OpCall, P
from .types import ScalarType
from .values import Const

__all__: list[str] = []

_TENSORS = ("param", "grad", "exp_avg", "exp_avg_sq")
FLOAT = ScalarType("float")
_FOLD = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
         "div": operator.truediv, "pow": operator.pow}  # fmt: skip


@register(
    "fused_adam", *(P(name) for name in _TENSORS), P("lr", keyword_only=True),
    P("step", keyword_only=True), P("beta1", 0.9, keyword_only=True),
    P("beta2", 0.999, keyword_only=True), P("eps", 1e-8, keyword_only=True),
    P("weight_decay", 0.0, keyword_only=True), P("master", None, keyword_only=True),
)  # fmt: skip
def _fused_adam(call: OpCall) -> object:
    """One AdamW step, as ``torch.optim.AdamW`` takes it: ``m = beta1 m + (1 - beta1)
    grad``, ``v = beta2 v + (1 - beta2) grad^2``, then ``param (1 - lr weight_decay) - lr
    m_hat / (sqrt(v_hat) + eps)`` with ``m_hat = m / (1 - beta1^step)`` and ``v_hat = v /
    (1 - beta2^step)`` (``step`` counts from 1). Returns ``(param, exp_avg, exp_avg_sq)``
    updated, each of ``param``'s shape and dtype; ``weight_decay=0.0`` (the default) is
    Adam. ``grad`` and the moments must have ``param``'s type. ``lr``, ``step`` and the
    other scalars are numbers or scalar parameters (``lr: float``, ``step: int``).

    ``master=`` is an f32 master copy of a narrower ``param`` (bf16, f16: mixed-precision
    training's ``@fp32_master``): the step updates it, in f32, with f32 moments (``grad``
    has param's dims, in param's dtype or f32, and is widened), and returns ``(param,
    master, exp_avg, exp_avg_sq)``, ``param`` the new master rounded to its dtype (the
    library's ``fused_adam_master`` is the same step in one pass, in place).

    ``fused_adam(param, grad, state, *, lr, step, ...)`` takes an ``OptimizerState[param]``
    (``@fp32_master`` or not) in place of the moments and ``master=``, and returns
    ``(param, state)`` updated (``docs/autodiff.md``)."""
    param, grad, m, v = (call.tensor(name) for name in _TENSORS)
    if not param.type.dtype.is_float:
        raise call.error(f"'param' must be a float tensor, not {param.type}", at="param")
    master = _master(call, param, grad)
    state = master if master is not None else param
    for name, value in zip(_TENSORS[1:], (grad, m, v), strict=True):
        dtypes = (state.type.dtype,) if name != "grad" else (param.type.dtype, state.type.dtype)
        if value.type.dims != param.type.dims or value.type.dtype not in dtypes:
            want = (
                "param's type"
                if master is None
                else (
                    "param's dims, in param's dtype or f32" if name == "grad" else "master's type"
                )
            )
            raise call.error(
                f"'{name}' must have {want}; {call.shape_of('param')}, {call.shape_of(name)}",
                at=name,
            )  # fmt: skip
    lr, beta1, beta2, eps, decay = (
        call.scalar(name, "float") for name in ("lr", "beta1", "beta2", "eps", "weight_decay")
    )
    step = call.scalar("step", "int")
    if isinstance(step, Value):  # float(step), widened as C widens it
        step = call.emitter.emit("mul", (step,), (FLOAT,), (("b", 1.0),), (), call.span)[0]
    b = Builder(call.emitter, call.span)
    f = _Arithmetic(b)
    if master is not None and grad.type.dtype != F32:
        grad = b("cast", grad, F32)
    m = f("add", f("mul", m, beta1), f("mul", grad, f("sub", 1.0, beta1)))
    v = f("add", f("mul", v, beta2), f("mul", f("mul", grad, grad), f("sub", 1.0, beta2)))
    m_hat = f("div", m, f("sub", 1.0, f("pow", beta1, step)))
    v_hat = f("div", v, f("sub", 1.0, f("pow", beta2, step)))
    if getattr(decay, "value", None) != 0.0:
        state = f("mul", state, f("sub", 1.0, f("mul", lr, decay)))
    update = f("div", f("mul", m_hat, lr), f("add", f("sqrt", v_hat), eps))
    state = f("sub", state, update)
    if master is None:
        return state, m, v
    return b("cast", state, param.type.dtype), state, m, v


def _master(call: OpCall, param: Value, grad: Value) -> Value | None:
    """``master=``, checked: an f32 tensor of param's dims, for a param narrower than it."""
    if not call.given("master"):
        return None
    master = call.tensor("master")
    if master.type.dtype != F32 or master.type.dims != param.type.dims:
        raise call.error(
            f"'master' must be the f32 copy of param ({call.shape_of('param')}, in f32), "
            f"not {master.type}",
            at="master",
        )
    if param.type.dtype.bits >= 32:
        raise call.error(
            f"master= keeps an f32 copy of a narrower param (bf16, f16), and param is "
            f"{param.type.dtype} already: drop master=",
            at="master",
        )
    return master


class _Arithmetic:
    """Ops on tensors, scalars and numbers: of numbers alone, the number, computed now
    (as the evaluator folds ``1.0 - 0.9``), else the op."""

    def __init__(self, b: Builder) -> None:
        self.b = b

    def __call__(self, kind: str, *args: Any) -> Any:
        numbers = [a.value if isinstance(a, Const) else a for a in args]
        if kind in _FOLD and all(isinstance(n, (int, float)) for n in numbers):
            return Const(float(_FOLD[kind](*numbers)))
        return self.b(kind, *args)
