"""``@stochastic_round`` on a declared result: the conversion that produces it draws.

A result typed ``bf16 @stochastic_round(seed=step)`` is rounded to one of the two bf16
values around the exact f32 one, the farther one with the probability of its share of
the gap, so that the rounding is unbiased on average (``docs/numerics.md`` gives the
exact rule). The draw is Philox4x32-10 under the key ``seed``, counting the element's
row-major place in the result, on stream 1 (dropout's is stream 0): the same bits on
every target, in whichever program and thread computes the element.

The conversion is the op that produces the returned value, as for ``@saturate``
(``saturate.py``): a ``cast`` (written, or the one semantic analysis adds after a
product or a reduction accumulated in f32) becomes a ``stochastic_cast``; elementwise
math computed in the result's dtype is computed in f32 and followed by one. A
parameter returned as it is holds values of the dtype already. Any other op (a library
kernel that rounds its own result) is an error at the return: it would round to
nearest without a word.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..frontend.diagnostics import Diagnostics
from .graph_ops import ELEMENTWISE_MATH
from .ir import Function, GraphModule, Op, Value
from .saturate import through_f32
from .types import ScalarType, TensorType, result_types

__all__ = ["stochastic_results", "stochastic_operands", "STOCHASTIC_FORMATS"]

#: Per dtype, its stored mantissa bits and the exponent of its smallest normal value:
#: what ``tsr::stochastic_round`` needs to know of a format.
STOCHASTIC_FORMATS = {"bf16": (7, -126), "f16": (10, -14), "fp8_e4m3": (3, -6),
                      "fp8_e5m2": (2, -14)}  # fmt: skip


def stochastic_results(module: GraphModule, diags: Diagnostics) -> GraphModule:
    """Every function with its ``@stochastic_round`` results drawn; errors to ``diags``."""
    return replace(module, functions=tuple(_function(f, diags) for f in module.functions))


def stochastic_operands(op: Op) -> tuple[Value, Any]:
    """``x`` and the seed of a ``stochastic_cast``: the seed a Value (an int parameter)
    or the number its attribute holds."""
    seed = op.attr("seed")
    return op.operands[0], op.operands[1] if seed == "scalar" else seed


def _function(function: Function, diags: Diagnostics) -> Function:
    declared = result_types(function.result_type)
    wanted = {
        value.id: t
        for value, t in zip(function.body.yields, declared, strict=False)
        if isinstance(t, TensorType) and t.policies.stochastic_round
    }
    if not wanted:
        return function
    params = {p.value.name: p.value for p in function.params}
    ops: list[Op] = []
    for op in function.body.ops:
        t = next((wanted[r.id] for r in op.results if r.id in wanted), None)
        if t is None:
            ops.append(op)
            continue
        seed = _seed(t, params, function, diags)
        if function.kind == "tile":
            _cannot("a tile kernel's result", t, function, diags)
            ops.append(op)
        elif op.kind == "cast":
            ops.append(_drawn(op, seed, t.policies.saturate))
        elif op.kind in ELEMENTWISE_MATH and len(op.results) == 1:
            wide, cast = through_f32(op)
            ops += [wide, _drawn(cast, seed, t.policies.saturate)]
        else:
            _cannot(f"{op.kind}'s result", t, function, diags)
            ops.append(op)
    return replace(function, body=replace(function.body, ops=tuple(ops)))


def _cannot(what: str, t: TensorType, function: Function, diags: Diagnostics) -> None:
    diags.error(
        f"@stochastic_round cannot round {what}, which is rounded to nearest where it is "
        f"computed; compute it in f32 in a graph function and return cast(..., {t.dtype}), "
        "which the policy rounds",
        function.return_span or t.policies.stochastic_span,
    )


def _seed(t: TensorType, params: dict[str, Value], function: Function, diags: Diagnostics) -> Any:
    """The seed's Value or number; an error where it names no int parameter."""
    seed = t.policies.seed
    if not isinstance(seed, str):
        return seed
    value = params.get(seed)
    if value is None or value.type != ScalarType("int"):
        what = "no parameter" if value is None else f"a {value.type} parameter"
        diags.error(
            f"@stochastic_round's seed '{seed}' names {what} of '{function.name}': it takes "
            "a number or an int parameter",
            t.policies.stochastic_span,
        )
        return 0
    return value


def _drawn(cast: Op, seed: Any, saturate: bool) -> Op:
    """``cast`` as a ``stochastic_cast`` under ``seed`` (clamping first where the result
    saturates)."""
    operands = (cast.operands[0], *((seed,) if isinstance(seed, Value) else ()))
    attrs = (
        ("dtype", cast.attr("dtype")),
        ("seed", "scalar" if isinstance(seed, Value) else seed),
        *((("saturate", True),) if saturate else ()),
    )
    return Op("stochastic_cast", operands, cast.results, attrs, span=cast.span)
