"""``OptimizerState[w] @fp32_master``: the optimizer state of a parameter, as a type.

A state is no Graph IR value. Analysis flattens it into its tensors (the f32 master
copy where ``@fp32_master`` keeps one, then the Adam moments ``m`` and ``v``), which
become parameters and results of the function like any tensor, named
``<state>_master``, ``<state>_m`` and ``<state>_v``; the function's ``StateSlot``s say
which of them make up a state, so that a runtime takes and returns a
``tessera.OptimizerState`` in their place (``tessera.runtime.optstate``).

``fused_adam(w, dw, state, lr=..., step=...)`` updates a state: it is ``fused_adam``'s
step with the state's moments and master, and returns the new parameter and a new
state. The state's tensors are SSA values, so every update reads the one before it and
the updates keep their order in the Graph IR whatever fusion does; a state that an
update consumed (donated) cannot be read again, as the arrays behind it are overwritten
by the runtime.
"""

from __future__ import annotations

from typing import Any

from ..frontend import ast
from ..frontend.source import Span
from .ir import StateSlot, Value
from .opcall import OpSpec, SemanticError
from .types import OptimizerStateType, TensorType
from .values import Ev, StateValue

__all__ = ["StateValue", "bind", "adam_on_state", "flat_names", "slot"]


def flat_names(name: str, t: OptimizerStateType) -> tuple[str, ...]:
    """The names a state parameter's tensors take in the Graph IR and at the entry."""
    return tuple(f"{name}_{field}" for field in t.fields)


def slot(t: OptimizerStateType, name: str = "", result: int | None = None) -> StateSlot:
    """Where a state parameter (``name``) or a returned state (its first ``result``) is."""
    return StateSlot(name, t.param, t.fp32_master, len(t.fields), result)


def bind(
    t: OptimizerStateType, node: ast.TypeExpr, tensors: dict[str, Any], function: str
) -> OptimizerStateType:
    """``t`` bound to the type of its parameter among ``tensors`` (the function's
    parameters by name, with their types); a ``SemanticError`` at the parameter's name in
    the brackets, or at ``@fp32_master``, where it cannot be."""
    at = node.args[0].span
    kind = tensors.get(t.param)
    if kind is None:
        raise SemanticError(
            f"OptimizerState[{t.param}]: '{t.param}' is not a parameter of '{function}'; a "
            "state belongs to a tensor parameter of its function (w: Tensor[...], "
            "state: OptimizerState[w])",
            at,
        )
    if not isinstance(kind, TensorType) or not kind.dtype.is_float:
        what = "a tensor" if not isinstance(kind, TensorType) else "a float tensor"
        raise SemanticError(
            f"OptimizerState[{t.param}]: '{t.param}' is {kind}; an optimizer state belongs "
            f"to {what} parameter",
            at,
        )
    if t.fp32_master and kind.dtype.bits >= 32:
        policy = next(p for p in node.policies if p.name == "fp32_master")
        raise SemanticError(
            f"@fp32_master keeps an f32 copy of a narrower parameter (bf16, f16), and "
            f"'{t.param}' is {kind.dtype} already: drop @fp32_master",
            policy.span,
        )
    return OptimizerStateType(t.param, t.fp32_master, t.policies, kind)


def adam_on_state(
    evaluator: Any, spec: OpSpec, args: list[Ev], keywords: list, span: Span, shown: str
) -> tuple[Value, StateValue] | Any:
    """``fused_adam(param, grad, state, *, lr, step, ...)``: the step with the state's
    moments (and master), returning ``(param, state)`` updated (``POISON`` where an
    argument's own error was reported already)."""
    state_ev = args[2] if len(args) == 3 else None
    if state_ev is None or not isinstance(state_ev.value, StateValue):
        raise SemanticError(
            f"{shown} takes an OptimizerState as its third argument and no fourth: "
            "fused_adam(w, dw, state, lr=lr, step=step)",
            args[3].span if len(args) > 3 else span,
        )
    taken = [k for k in keywords if k[0] in ("exp_avg", "exp_avg_sq", "master")]
    if taken:
        raise SemanticError(
            f"{shown}: the state holds the moments and the master; '{taken[0][0]}' is not "
            "given with it",
            taken[0][2],
        )
    state: StateValue = state_ev.value
    param = args[0].value
    want = state.type.tensor
    if isinstance(param, Value) and (
        not isinstance(param.type, TensorType)
        or (param.type.dims, param.type.dtype) != (want.dims, want.dtype)
    ):
        raise SemanticError(
            f"{shown}: {state_ev.text} is the state of '{state.type.param}' ({want}); "
            f"param {args[0].text} is {param.type}",
            args[0].span,
        )

    def field(name: str) -> Ev:
        return Ev(state.field(name), state_ev.span, f"{state_ev.text}.{name}")

    operands = [args[0], args[1], field("m"), field("v")]
    if state.type.fp32_master:
        keywords = [*keywords, ("master", field("master"), state_ev.span)]
    results = evaluator.call_op(spec, operands, keywords, span, shown)
    if not isinstance(results, tuple):  # poisoned: reported already
        return results
    if state.type.fp32_master:
        new_param, master, m, v = results
        return new_param, StateValue(state.type, (master, m, v))
    new_param, m, v = results
    return new_param, StateValue(state.type, (m, v))
