"""Reverse-mode differentiation of a graph function's operations.

The backward pass is Graph IR made of the same graph ops as the forward one (a
product's gradients are products, a softmax's is arithmetic and a row sum), so that
every backend lowers it and fusion fuses it like any other code. Each op's rule
(``VJP_RULES``) maps the cotangents of its results to those of its operands; ops are
emitted through the ops' own rules (``Builder``), so their types are the ones the
analyser gives.

A cotangent may be smaller than its value where the value is a broadcast (the
gradient of ``sum(x, axis=1)`` is the same for every element of a row): it is kept
with the value's rank and 1 on the broadcast axes, and only ``_fit`` widens or sums
it to an operand's shape, the one place that handles broadcasting and reduction
adjoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ...frozen import frozen
from ..frontend.source import Span
from .dims import Dim
from .dtypes import F32, DType
from .graph_ops import GRAPH_OPS, binary_operands, dropout_operands, named_operands
from .ir import Op, Value
from .opcall import Emitter, OpCall, SemanticError
from .types import ScalarType, TensorType
from .values import Const, DTypeRef, Ev

__all__ = [
    "Builder",
    "CONSTANT_OPS",
    "NO_GRADIENT",
    "REMAT_POLICIES",
    "VJP_RULES",
    "Region",
    "adjoints",
    "backward",
    "differentiable",
    "filled",
]

#: A cotangent: a tensor value, or None where no gradient flows.
Cotangent = Value | None
#: A rule: (builder, the op, one cotangent per result) to (operand, cotangent) pairs.
Rule = Callable[["Builder", Op, Sequence[Cotangent]], list[tuple[Value, Cotangent]]]


def differentiable(value: Value) -> bool:
    """Whether ``value`` has a gradient: a floating-point tensor."""
    return isinstance(value.type, TensorType) and value.type.dtype.is_float


class Builder:
    """Emits ops through their own rules, at one line: the backward ops of one forward op,
    or the ops a composite library op is made of."""

    def __init__(self, emitter: Emitter, span: Span) -> None:
        self.emitter = emitter
        self.span = span

    def __call__(self, kind: str, *args: Any, **keywords: Any) -> Value:
        spec = GRAPH_OPS[kind]
        names = [p.name for p in spec.params]
        bound = {name: self._ev(a) for name, a in zip(names, args, strict=False)}
        bound.update({name: self._ev(a) for name, a in keywords.items()})
        return spec.rule(OpCall(spec, bound, self.span, self.emitter, kind))

    def _ev(self, value: Any) -> Ev:
        if isinstance(value, Value):
            return Ev(value, self.span, value.name or "the gradient")
        if isinstance(value, Const):
            return Ev(value, self.span, repr(value.value))
        if isinstance(value, DType):
            return Ev(DTypeRef(value), self.span, str(value))
        return Ev(Const(value), self.span, repr(value))

    def size(self, dim: Dim) -> float | Value:
        """A size as a float: a number where it is known, else a run-time scalar."""
        if dim.constant is not None:
            return float(dim.constant)
        return self.emitter.emit(
            "dim_to_float", (), (ScalarType("float"),), (("dim", dim),), (), self.span
        )[0]


def filled(emitter: Emitter, like: Value, number: float, span: Span) -> Value:
    """A tensor of ``like``'s shape holding ``number``: ``where(like == like, n, n)``,
    elementwise math that every kernel computes (there is no fill op on tensors)."""
    b = Builder(emitter, span)
    return b("where", b("equal", like, like), number, number)


def _expanded(b: Builder, g: Value, like: Value) -> Value:
    """``g`` broadcast to ``like``'s shape: both sides of a ``where`` whose condition has
    that shape (and holds everywhere, NaN or not)."""
    return b("where", b("equal", like, like), g, g)


def _fit(b: Builder, g: Value, like: Value, widen: bool = True) -> Value:
    """The cotangent ``g`` of a value that ``like`` was broadcast into, as ``like``'s
    own: summed over the axes the broadcast added or stretched from 1, and widened
    where ``g`` itself is the broadcast one (unless ``widen`` is false: a cotangent
    may stay a broadcast until a rule needs every element)."""
    have, want = g.type.dims, like.type.dims
    if have == want:
        return g
    extra = len(have) - len(want)
    if extra > 0:
        g = b("sum", g, axis=tuple(range(extra)), keepdims=False)
        have = g.type.dims
    pad = len(want) - len(have)
    one = Dim.const(1)
    axes = tuple(i for i, d in enumerate(have) if d != one and want[pad + i] == one)
    if axes:
        g = b("sum", g, axis=axes, keepdims=True)
    if widen and g.type.dims != want:
        g = _expanded(b, g, like)
    return g


def _whole(b: Builder, g: Value, like: Value) -> Value:
    """``g`` with every element of ``like`` present (for a rule that reads it by
    position or sums it), not a broadcast of fewer."""
    return g if g.type.dims == like.type.dims else _expanded(b, g, like)


def _kept(b: Builder, value: Value, op: Op) -> Value:
    """A reduction's result (or its cotangent) with the reduced axis kept as 1."""
    value = _whole(b, value, op.result)
    dims, axis = op.operands[0].type.dims, op.attr("axis")
    if op.attr("keepdims"):
        return value
    kept = (*dims[:axis], Dim.const(1), *dims[axis + 1 :])
    return b("reshape", value, kept)


# ------------------------------------------------------------------- the rules

VJP_RULES: dict[str, Rule] = {}


def _rule(*kinds: str) -> Callable[[Rule], Rule]:
    def add(rule: Rule) -> Rule:
        for kind in kinds:
            VJP_RULES[kind] = rule
        return rule

    return add


def _pairs(op: Op, names: tuple[str, ...], grads: Sequence[Cotangent]) -> list:
    """(operand, cotangent) for the tensor operands among ``names``, in order."""
    values = named_operands(op, names)
    return [(v, g) for v, g in zip(values, grads, strict=True) if isinstance(v, Value)]


@_rule("add", "sub")
def _add(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    g = gs[0]
    return _pairs(op, ("a", "b"), (g, g if op.kind == "add" else b("neg", g)))


def _scaled(b: Builder, op: Op, g: Value) -> Value:
    """The cotangent of a product or quotient by a scalar that a kernel computes from a
    size (``x / float(N)``): with every element present, so that the kernel that
    multiplies it reads a tensor of those sizes."""
    if any(isinstance(v.type, ScalarType) for v in op.operands):
        return _whole(b, g, op.result)
    return g


@_rule("mul")
def _mul(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    g = _scaled(b, op, gs[0])
    x, y = binary_operands(op)
    return _pairs(op, ("a", "b"), (b("mul", g, y), b("mul", g, x)))


@_rule("div")
def _div(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    g = _scaled(b, op, gs[0])
    y = binary_operands(op)[1]
    ga = b("div", g, y)
    gb = b("neg", b("mul", ga, op.result)) if isinstance(y, Value) else None
    return _pairs(op, ("a", "b"), (ga, gb))


@_rule("mod")
def _mod(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """``a % b`` is ``a - (a // b) * b``, whose quotient is constant where it is
    differentiable (as PyTorch's ``remainder``): 1 for ``a``, ``-(a // b)`` for ``b``."""
    g = _scaled(b, op, gs[0])
    x, y = binary_operands(op)
    gb = b("neg", b("mul", g, b("floordiv", x, y))) if isinstance(y, Value) else None
    return _pairs(op, ("a", "b"), (g, gb))


@_rule("pow")
def _pow(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    g = gs[0]
    x, y = binary_operands(op)
    if isinstance(y, Value) and isinstance(y.type, ScalarType):
        raise SemanticError(
            "cannot differentiate '**' by a scalar parameter yet: write the power with a "
            "number (x ** 2.0) or as a product",
            op.span,
        )
    ga = gb = None
    if isinstance(x, Value):
        if isinstance(y, Value):
            ga = b("mul", b("mul", g, y), b("pow", x, b("add", y, -1.0)))
        elif y == 2:
            ga = b("mul", g, b("mul", x, 2.0))
        else:
            ga = b("mul", g, b("mul", b("pow", x, float(y) - 1.0), float(y)))
    if isinstance(y, Value):
        log_x = b("log", x) if isinstance(x, Value) else math.log(x)
        gb = b("mul", b("mul", g, op.result), log_x)
    return _pairs(op, ("a", "b"), (ga, gb))


@_rule("maximum", "minimum")
def _extreme(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """The larger (smaller) side gets the gradient; a tie gives it to ``a``."""
    g = gs[0]
    x, y = binary_operands(op)
    picks_a = b("greater_equal" if op.kind == "maximum" else "less_equal", x, y)
    return _pairs(op, ("a", "b"), (b("where", picks_a, g, 0.0), b("where", picks_a, 0.0, g)))


@_rule("neg")
def _neg(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    return [(op.operands[0], b("neg", gs[0]))]


def _unary(derivative: Callable[[Builder, Value, Value], Any]) -> Rule:
    """A rule for elementwise math: the cotangent times ``derivative(x, y)`` of the
    operand ``x`` and the result ``y``."""

    def rule(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
        x = op.operands[0]
        return [(x, b("mul", gs[0], derivative(b, x, op.result)))]

    return rule


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _gelu_derivative(b: Builder, x: Value, _: Value) -> Value:
    """Of the tanh approximation: ``0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3a x^2)``, with
    ``t = tanh(c (x + a x^3))``."""
    square = b("mul", x, x)
    t = b("tanh", b("mul", b("mul", x, b("add", b("mul", square, 0.044715), 1.0)), _SQRT_2_OVER_PI))
    slope = b("mul", b("add", b("mul", square, 3 * 0.044715), 1.0), _SQRT_2_OVER_PI)
    inner = b("mul", b("mul", x, b("sub", 1.0, b("mul", t, t))), slope)
    return b("mul", b("add", b("add", t, 1.0), inner), 0.5)


def _silu_derivative(b: Builder, x: Value, _: Value) -> Value:
    s = b("sigmoid", x)
    return b("mul", s, b("add", b("mul", x, b("sub", 1.0, s)), 1.0))


VJP_RULES.update({
    "exp": _unary(lambda b, x, y: y),
    "log": _unary(lambda b, x, y: b("div", 1.0, x)),
    "sqrt": _unary(lambda b, x, y: b("div", 0.5, y)),
    "rsqrt": _unary(lambda b, x, y: b("mul", b("mul", b("mul", y, y), y), -0.5)),
    "tanh": _unary(lambda b, x, y: b("sub", 1.0, b("mul", y, y))),
    "sigmoid": _unary(lambda b, x, y: b("mul", y, b("sub", 1.0, y))),
    "gelu": _unary(_gelu_derivative),
    "silu": _unary(_silu_derivative),
    "sin": _unary(lambda b, x, y: b("cos", x)),
    "cos": _unary(lambda b, x, y: b("neg", b("sin", x))),
    "tan": _unary(lambda b, x, y: b("add", b("mul", y, y), 1.0)),
    "exp2": _unary(lambda b, x, y: b("mul", y, math.log(2.0))),
    "log2": _unary(lambda b, x, y: b("div", 1.0 / math.log(2.0), x)),
    "log1p": _unary(lambda b, x, y: b("div", 1.0, b("add", x, 1.0))),
    "expm1": _unary(lambda b, x, y: b("add", y, 1.0)),
    "erf": _unary(lambda b, x, y: b("mul", b("exp", b("neg", b("mul", x, x))), _TWO_OVER_SQRT_PI)),
})  # fmt: skip


@_rule("floor", "ceil")
def _stepwise(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """Zero: the derivative wherever there is one, and PyTorch's at the steps too, so no
    cotangent flows back. (``round`` is an error instead, which predates these: code
    ported from PyTorch differentiates through ``floor`` and expects zero.)"""
    return [(op.operands[0], None)]


@_rule("relu")
def _relu(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    x = op.operands[0]
    return [(x, b("where", b("greater", x, 0.0), gs[0], 0.0))]


@_rule("abs")
def _abs(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    x, g = op.operands[0], gs[0]
    return [
        (x, b("where", b("greater", x, 0.0), g, b("where", b("less", x, 0.0), b("neg", g), 0.0)))
    ]


@_rule("cast")
def _cast(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    return [(op.operands[0], gs[0])]


@_rule("where")
def _where(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    g = gs[0]
    cond, x, y = named_operands(op, ("cond", "a", "b"))
    pairs = []
    if isinstance(x, Value):
        pairs.append((x, b("where", cond, g, 0.0)))
    if isinstance(y, Value):
        pairs.append((y, b("where", cond, 0.0, g)))
    return pairs


@_rule("dropout")
def _dropout(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """The same mask, from the same seed: dropout of the cotangent, never stored."""
    x, p, seed = dropout_operands(op)
    return [(x, b("dropout", _whole(b, gs[0], op.result), p, seed=seed))]


@_rule("all_reduce")
def _all_reduce(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    how = op.attr("op")
    if how not in ("sum", "mean"):
        raise SemanticError(
            f"cannot differentiate all_reduce(op={how!r}): only sum and mean have gradients "
            "here",
            op.span,
        )
    return [(op.operands[0], b("all_reduce", _whole(b, gs[0], op.result), op=how))]


@_rule("reshape")
def _reshape(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    x, g = op.operands[0], gs[0]
    one = Dim.const(1)
    if all(d == one for d in g.type.dims):  # a broadcast number stays one
        return [(x, b("reshape", g, (one,) * x.type.rank) if x.type.rank else g)]
    return [(x, b("reshape", _whole(b, g, op.result), x.type.dims))]


@_rule("expand_dims")
def _expand_dims(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """The new axes of one element dropped again: a reshape."""
    x = op.operands[0]
    return [(x, b("reshape", _whole(b, gs[0], op.result), x.type.dims))]


@_rule("transpose")
def _transpose(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    perm = op.attr("perm")
    back = tuple(perm.index(k) for k in range(len(perm)))
    return [(op.operands[0], b("transpose", _whole(b, gs[0], op.result), back))]


@_rule("matmul")
def _matmul(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """Both gradients as products: ``g @ b.T`` reads ``b`` in place; ``a.T @ g``. A
    vector operand's gradient is a broadcast product and a sum."""
    x, y = op.operands
    g = _whole(b, gs[0], op.result)
    if g.type.dtype != x.type.dtype:
        g = b("cast", g, x.type.dtype)
    one = Dim.const(1)
    if x.type.rank >= 2 and y.type.rank >= 2:
        return [(x, b("matmul", g, b("transpose", y))), (y, b("matmul", b("transpose", x), g))]
    if x.type.rank == 1 and y.type.rank == 1:
        return [(x, b("mul", g, y)), (y, b("mul", g, x))]
    if x.type.rank == 1:  # [K] @ [..., K, N] -> [..., N]
        row = b("reshape", g, (*g.type.dims[:-1], one, g.type.dims[-1]))
        column = b("reshape", x, (x.type.dims[0], one))
        return [(x, b("sum", b("mul", row, y), axis=-1)), (y, b("mul", column, row))]
    column = b("reshape", g, (*g.type.dims, one))  # [..., M, K] @ [K] -> [..., M]
    return [(x, b("mul", column, y)), (y, b("mul", column, x))]


@_rule("sum", "mean")
def _sum(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    x = op.operands[0]
    axis = op.attr("axis")
    g = _kept(b, gs[0], op)
    if op.kind == "mean":
        count = x.type.dims[axis]
        if count.constant is None:  # a kernel knows the sizes of the tensors it reads
            g = _expanded(b, g, x)
        g = b("div", g, b.size(count))
    return [(x, g)]


@_rule("max")
def _max(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """Shared evenly among the elements that tie for the maximum, as ``torch.amax``."""
    x = op.operands[0]
    top = _kept(b, op.result, op)
    g = _kept(b, gs[0], op)
    hit = b("equal", x, top)
    ties = b("sum", b("cast", hit, F32), axis=op.attr("axis"), keepdims=True)
    return [(x, b("where", hit, b("div", g, ties), 0.0))]


@_rule("softmax", "softmax_safe")
def _softmax(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """``y * (g - sum(g * y))``: over the last axis of f32 rows, the library's one-pass
    row kernel ``softmax_grad``; else as ops."""
    y, axis = op.result, op.attr("axis")
    g = _whole(b, gs[0], y)
    if _last_axis_f32(y, g, axis):
        return [(op.operands[0], _row_grad(b, "softmax_grad", (y, g), ()))]
    gy = b("mul", g, y)
    return [(op.operands[0], b("sub", gy, b("mul", y, b("sum", gy, axis=axis, keepdims=True))))]


@_rule("softmax_grad")
def _softmax_grad_rule(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """Linear in ``g`` with a symmetric Jacobian, ``diag(y) - y y^T``: its own transpose
    (which ``F_jvp`` reads). None of ``y``: no second derivatives of a softmax."""
    y, _ = op.operands
    h = _whole(b, gs[0], op.result)
    return [(op.operands[1], _row_grad(b, "softmax_grad", (y, h), ())), (y, _NO_RULE)]


@_rule("log_softmax")
def _log_softmax(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """``g - exp(y) * sum(g)``: over the last axis of f32 rows, the library's one-pass
    row kernel ``log_softmax_grad``; else as ops."""
    y, axis = op.result, op.attr("axis")
    g = _whole(b, gs[0], y)
    if _last_axis_f32(y, g, axis):
        return [(op.operands[0], _row_grad(b, "log_softmax_grad", (y, g), ()))]
    total = b("sum", g, axis=axis, keepdims=True)
    return [(op.operands[0], b("sub", g, b("mul", b("exp", y), total)))]


@_rule("log_softmax_grad")
def _log_softmax_grad_rule(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """Linear in ``g``, with the Jacobian ``I - exp(y) 1^T``; its transpose (which
    ``F_jvp`` reads) takes ``h - sum(exp(y) * h)``. None of ``y``: no second derivatives
    of a log-softmax."""
    y, g = op.operands
    h = _whole(b, gs[0], op.result)
    total = b("sum", b("mul", b("exp", y), h), axis=-1, keepdims=True)
    return [(g, b("sub", h, total)), (y, _NO_RULE)]


def _last_axis_f32(y: Value, g: Value, axis: int) -> bool:
    """Whether a row op's gradient is a library row kernel's: over the last axis of a
    matrix (or a batch of them) of f32, with an f32 cotangent."""
    return axis == y.type.rank - 1 and y.type.rank > 1 and y.type.dtype == g.type.dtype == F32


def _row_grad(
    b: Builder, kind: str, operands: tuple[Value, ...], attrs: tuple[tuple[str, Any], ...]
) -> Value:
    """The library's one-pass row kernel ``kind`` of a gradient: f32, the shape of its
    first operand."""
    out = TensorType(operands[0].type.dims, F32)
    return b.emitter.emit(kind, operands, (out,), attrs, (), b.span)[0]


@_rule("logsumexp_safe")
def _logsumexp(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    x = op.operands[0]
    top = _kept(b, op.result, op)
    g = _kept(b, gs[0], op)
    return [(x, b("mul", g, b("exp", b("sub", x, top))))]


@_rule("layernorm", "layernorm_safe", "rmsnorm", "rmsnorm_safe")
def _norm(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """The statistics recomputed, not stored; the weight's and bias's gradients are
    column sums over every row. Over f32 rows, the input's is the library's one-pass
    row kernel (``layernorm_grad``, ``rmsnorm_grad``), which also gives each row's
    statistics to ``norm_param_grad`` for the weight's and bias's (``_norm_params``);
    else as ops."""
    x, *params = op.operands
    g = gs_whole = _whole(b, gs[0], op.result)
    centred = op.kind.startswith("layernorm")
    eps = op.attr("eps")
    weight = params.pop(0) if op.attr("weight") else None
    bias = params.pop(0) if op.attr("bias") else None
    one_pass = _last_axis_f32(x, g, x.type.rank - 1) and (
        weight is None or weight.type.dtype == F32
    )
    if one_pass:
        kind = "layernorm_grad" if centred else "rmsnorm_grad"
        operands = (x, g) if weight is None else (x, weight, g)
        attrs = (("eps", eps), ("weight", weight is not None))
        if weight is None and bias is None:
            return [(x, _row_grad(b, kind, operands, attrs))]
        return _norm_params(b, kind, operands, attrs, weight, bias)
    rows = x if not centred else b("sub", x, b("mean", x, axis=-1, keepdims=True))
    scale = b("rsqrt", b("add", b("mean", b("mul", rows, rows), axis=-1, keepdims=True), eps))
    normed = b("mul", rows, scale)
    pairs = []
    leading = tuple(range(x.type.rank - 1))
    if weight is not None:
        gw = b("mul", g, normed)
        pairs.append((weight, b("sum", gw, axis=leading) if leading else gw))
    if bias is not None:
        pairs.append((bias, b("sum", gs_whole, axis=leading) if leading else gs_whole))
    if weight is not None:
        g = b("mul", g, weight)
    along = b("mul", normed, b("mean", b("mul", g, normed), axis=-1, keepdims=True))
    inner = b("sub", g, along)
    if centred:
        inner = b("sub", inner, b("mean", g, axis=-1, keepdims=True))
    return [(x, b("mul", inner, scale)), *pairs]


def _norm_params(
    b: Builder, kind: str, operands: tuple[Value, ...], attrs: tuple[tuple[str, Any], ...],
    weight: Value | None, bias: Value | None,
) -> list:  # fmt: skip
    """Every gradient of a norm over f32 rows, in two passes: the row kernel ``kind``
    gives ``dx`` and, as its second result, each row's mean and scale ``s`` (a mean of 0
    for an rmsnorm), and ``norm_param_grad`` the weight's and the bias's, ``sum(g *
    xhat)`` and ``sum(g)`` over every row, in one pass over ``x`` and ``g``, a block of
    columns per program, as the two columns of a ``[C, 2]`` result that two slices take
    apart. Leading dims are rows (a reshape, which is a view)."""
    x, g = operands[0], operands[-1]
    rows, columns = math.prod(x.type.dims[:-1], start=Dim.const(1)), x.type.dims[-1]
    outs = (TensorType(x.type.dims, F32), TensorType((*x.type.dims[:-1], Dim.const(2)), F32))
    dx, stats = b.emitter.emit(kind, operands, outs, attrs, (), b.span)
    if x.type.rank > 2:
        x, g, stats = (b("reshape", v, (rows, v.type.dims[-1])) for v in (x, g, stats))
    sums = b.emitter.emit(
        "norm_param_grad", (x, g, stats), (TensorType((columns, Dim.const(2)), F32),), (),
        (), b.span,
    )[0]  # fmt: skip
    return [(operands[0], dx)] + [
        (param, b("reshape", _column(b, sums, column), (columns,)))
        for column, param in enumerate((weight, bias))
        if param is not None
    ]


def _column(b: Builder, t: Value, column: int) -> Value:
    """Column ``column`` of a matrix, ``t[:, column:column + 1]``: a slice, which its
    readers load where it lies."""
    one = TensorType((t.type.dims[0], Dim.const(1)), t.type.dtype)
    attrs = (("perm", (0, 1)), ("starts", (Dim.const(0), Dim.const(column))))
    return b.emitter.emit("slice", (t,), (one,), attrs, (), b.span)[0]


@_rule("norm_param_grad")
def _norm_param_grad_rule(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """Linear in ``g``: its transpose (which ``F_jvp`` reads) of ``h``, ``[C, 2]``, is
    ``xhat * h[:, 0] + h[:, 1]`` broadcast over the rows, ``xhat`` from the statistics
    (as ops). None of ``x``: no second derivatives of a norm. The statistics are of
    ``x`` alone, so they give nothing where ``x`` is constant (the row kernel that
    writes them reads ``g`` too, which makes them look like a function of it)."""
    x, g, stats = op.operands
    h = _whole(b, gs[0], op.result)
    columns = x.type.dims[-1]
    normed = b("mul", b("sub", x, _column(b, stats, 0)), _column(b, stats, 1))
    dw, db = (b("reshape", _column(b, h, k), (columns,)) for k in (0, 1))
    return [(g, b("add", b("mul", normed, dw), db)), (x, _NO_RULE), (stats, None)]


@_rule("layernorm_grad", "rmsnorm_grad")
def _norm_grad_rule(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """Linear in ``g``: ``s (I - P) diag(w)`` with ``P`` symmetric (``xhat xhat^T / n``,
    plus ``1 1^T / n`` for a layer norm), so its transpose (which ``F_jvp`` reads) is the
    same kernel without the weight, times the weight. The row statistics, a second
    result where the weight's or the bias's gradient reads them, do not depend on
    ``g``. None of ``x`` or the weight: no second derivatives of a norm."""
    x, *weight, g = op.operands
    dx = op.results[0]
    h = _whole(b, gs[0], dx)
    back = _row_grad(b, op.kind, (x, h), (("eps", op.attr("eps")), ("weight", False)))
    if weight:
        return [(g, b("mul", back, weight[0])), (x, _NO_RULE), (weight[0], _NO_RULE)]
    return [(g, back), (x, _NO_RULE)]


@_rule("rotary_embedding")
def _rotary(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """The inverse rotation: the same angles' cosines, the sines negated."""
    x, cos, sin = op.operands
    g = _whole(b, gs[0], op.result)
    return [(x, b("rotary_embedding", g, cos, b("neg", sin))), (cos, _NO_RULE), (sin, _NO_RULE)]


@_rule("flash_attention")
def _attention(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """FlashAttention-2's backward: the library's ``attention_stats`` runs the forward
    loop again and gives each query's logsumexp of the scores and ``delta = rowsum(g *
    o)``, as two columns; ``attention_dq`` (programs owning queries) and
    ``attention_dkdv`` (programs owning keys, which give both of their gradients from
    one pass) compute the probabilities again from them, a block at a time. In f32;
    causal or not, grouped-query k and v heads summed over their group by ``_fit``."""
    if op.attr("dropout") is not None:
        raise SemanticError(
            "cannot differentiate an attention with dropout yet: write the attention out, "
            "dropout(softmax(q @ k.T * scale), p, seed=s) @ v",
            op.span,
        )
    q, k, v = (_f32(b, x) for x in op.operands[:3])
    scale = op.attr("scale")
    scalars = (op.operands[-1],) if scale == "scalar" else ()
    attrs = (("causal", op.attr("causal")), ("scale", scale))
    g = _f32(b, _whole(b, gs[0], op.result))
    batch, rows, keys = op.result.type.dims[:-2], q.type.dims[-2], k.type.dims[-2]

    def kernel(kind: str, operands: tuple[Value, ...], *dims: tuple[Dim, ...]) -> tuple:
        outs = tuple(TensorType((*batch, *d), F32) for d in dims)
        return b.emitter.emit(kind, (*operands, *scalars), outs, attrs, (), b.span)

    (stats,) = kernel("attention_stats", (q, k, v, g), (rows, Dim.const(2)))
    (dq,) = kernel("attention_dq", (q, k, v, g, stats), q.type.dims[-2:])
    dk, dv = kernel("attention_dkdv", (q, k, v, g, stats), k.type.dims[-2:],
                    (keys, v.type.dims[-1]))  # fmt: skip
    return list(zip(op.operands[:3], (dq, dk, dv), strict=True))


def _f32(b: Builder, x: Value) -> Value:
    return x if x.type.dtype == F32 else b("cast", x, F32)


@_rule("take_along_axis")
def _take_along_axis(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """Each picked element's cotangent added back where it was picked, into zeros: a
    repeated index sums its cotangents (``scatter_add``). The op gathers along its last
    axis (another axis is moved there by transposes, which have their own rule)."""
    x, indices = op.operands
    zeros = filled(b.emitter, x, 0.0, b.span)
    return [(x, b("scatter_add", zeros, indices, _whole(b, gs[0], op.result), -1))]


@_rule("slice")
def _slice(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """The cotangent written where the slice lies, into zeros of the operand's shape."""
    x = op.operands[0]
    return [(x, _padded(b, _whole(b, gs[0], op.result), x, op.attr("starts")))]


@_rule("split_qkv")
def _split_qkv(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """Each part's cotangent, its heads moved back after the rows (the part's permutation
    is its own inverse), written into its third of the projection's columns; the three
    parts' add up."""
    qkv = op.operands[0]
    g = b("transpose", _whole(b, gs[0], op.result), op.attr("perm"))
    g = b("reshape", g, (*g.type.dims[:-2], g.type.dims[-2] * g.type.dims[-1]))
    zero = Dim.const(0)
    starts = (*(zero,) * (qkv.type.rank - 1), g.type.dims[-1] * op.attr("part"))
    return [(qkv, _padded(b, g, qkv, starts))]


@_rule("pad")
def _pad(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """The block of the cotangent where ``g`` was written (a slice); ``like`` gives only
    a length, and no gradient."""
    g, like = op.operands
    attrs = (("perm", (0, 1)), ("starts", (Dim.const(0), op.attr("start"))))
    (block,) = b.emitter.emit("slice", (_whole(b, gs[0], op.result),), (g.type,), attrs, (), b.span)
    return [(g, block), (like, None)]


def _padded(b: Builder, g: Value, x: Value, starts: tuple[Dim, ...]) -> Value:
    """``g``, a block of ``x``'s shape that starts at ``starts``, written into zeros of
    ``x``'s shape: one axis at a time, from the last, each a ``pad`` of columns."""
    for axis in reversed(range(x.type.rank)):
        if g.type.dims[axis] != x.type.dims[axis]:
            g = _pad_axis(b, g, x, axis, starts[axis])
    return g


def _pad_axis(b: Builder, g: Value, x: Value, axis: int, start: Dim) -> Value:
    """``g`` padded with zeros along ``axis`` to ``x``'s size there, its elements starting
    at ``start``; its axes after ``axis`` are ``x``'s already. Both are seen as rows whose
    columns are ``axis`` and the axes after it, so that the block is a block of columns
    (the library's ``pad``, which reads ``x`` seen so only for its row length)."""
    have, want = g.type.dims, x.type.dims
    after = math.prod(want[axis + 1 :], start=Dim.const(1))
    rows = math.prod(have[:axis], start=Dim.const(1))
    flat = b("reshape", g, (rows, have[axis] * after))
    like = b("reshape", x, (math.prod(want[:axis], start=Dim.const(1)), want[axis] * after))
    offset = start * after
    out = TensorType((rows, want[axis] * after), g.type.dtype)
    attrs = (("start", offset),)
    (padded,) = b.emitter.emit("pad", (flat, like), (out,), attrs, (), b.span)
    return b("reshape", padded, (*have[:axis], *want[axis:]))


@_rule("scatter_add")
def _scatter_add(b: Builder, op: Op, gs: Sequence[Cotangent]) -> list:
    """``x``'s cotangent as it is; each added value's, the cotangent where it was added
    (``take_along_axis``, the converse gather)."""
    x, indices, values = op.operands
    g = _whole(b, gs[0], op.result)
    return [(x, g), (values, b("take_along_axis", g, indices, -1))]


#: A cotangent that no rule gives: an error where the operand needs a gradient.
_NO_RULE: Any = object()

# ------------------------------------------------------------------- the pass

#: Ops whose results carry no gradient, whatever their operands.
CONSTANT_OPS = frozenset({"less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
                       "logical_and", "logical_or", "logical_not", "dim_to_float",
                       "all_finite", "index_along"})  # fmt: skip

#: The ops with floating-point results that have no gradient rule, why, and what to
#: write instead: differentiating through one is an error at its line.
NO_GRADIENT = {
    "round": "its derivative is zero wherever it exists; round outside the differentiated "
    "function, or keep the value unrounded",
    "floordiv": "its derivative is zero wherever it exists; compute the quotient outside the "
    "differentiated function (a % b, the remainder, has a gradient)",
    "put_along_axis": "an element written twice takes one of the values, and which one "
    "decides the gradients; add with scatter_add into zeros instead",
    "all_gather": "only all_reduce has a gradient among the collectives yet; gather "
    "outside the differentiated function",
    "reduce_scatter": "only all_reduce has a gradient among the collectives yet; write "
    "all_reduce and a slice",
    "all_to_all": "only all_reduce has a gradient among the collectives yet; exchange "
    "outside the differentiated function",
    **dict.fromkeys(
        ("kvcache.append", "kvcache.advance"),
        "keep state updates out of the differentiated function",
    ),
    **dict.fromkeys(
        ("attention_stats", "attention_dq", "attention_dkdv"),
        "flash_attention's backward kernels have no derivatives of their own: F_jvp and "
        "second derivatives of an attention need it written out, softmax(q @ k.T * scale) @ v",
    ),
}


@frozen
class Region:
    """Ops that the backward pass differentiates as one, by a rule of their own: a call
    of a function with ``@custom_vjp`` or ``@custom_jvp``, or a ``checkpoint(F)``. The
    ops are those whose results ``values`` holds; the backward pass gives ``rule`` the
    rule one cotangent per output (None where none flows), and it gives one cotangent
    per input (None where it gives none)."""

    values: frozenset[int]
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    rule: Callable[[list[Cotangent]], list[Cotangent]]


#: What each ``remat=`` policy saves: the forward ops whose results the backward pass
#: reads as the forward computed them. It computes the others again from saved values,
#: where it first reads them (and fusion fuses that into the kernels that read them).
REMAT_POLICIES: dict[str, Callable[[Op], bool]] = {
    "everything": lambda op: True,
    "save_matmuls": lambda op: op.kind in ("matmul", "flash_attention"),
    "nothing": lambda op: False,
}


def backward(
    emitter: Emitter,
    ops: Sequence[Op],
    outputs: Sequence[Value],
    seeds: Sequence[Value],
    wrt: Sequence[Value],
    span: Span,
    regions: Sequence[Region] = (),
    remat: str = "everything",
) -> list[Value]:
    """The cotangents of ``wrt`` given ``seeds``, the cotangents of ``outputs``, through
    ``ops`` (in program order): one value of each ``wrt``'s shape, in its dtype. Ops
    that no ``wrt`` reaches are not differentiated; the ops of a ``Region`` are
    differentiated by its rule; ``remat`` names the policy (``REMAT_POLICIES``) that
    says which forward values the backward ops read as they are."""
    found = adjoints(emitter, ops, outputs, seeds, wrt, span, regions, remat)
    b = Builder(emitter, span)
    grads = []
    for v, g in zip(wrt, found, strict=True):
        g = filled(emitter, v, 0.0, span) if g is None else _fit(b, g, v)
        grads.append(g if g.type.dtype == v.type.dtype else b("cast", g, v.type.dtype))
    return grads


def adjoints(
    emitter: Emitter,
    ops: Sequence[Op],
    outputs: Sequence[Value],
    seeds: Sequence[Cotangent],
    wrt: Sequence[Value],
    span: Span,
    regions: Sequence[Region] = (),
    remat: str = "everything",
) -> list[Cotangent]:
    """``backward``'s cotangents as they come, None for a ``wrt`` that none reaches, a
    cotangent possibly a broadcast of fewer elements (``_fit`` widens it)."""
    active = {v.id for v in wrt}
    for op in ops:
        if op.kind in CONSTANT_OPS or not any(v.id in active for v in op.operands):
            continue
        active.update(r.id for r in op.results if differentiable(r))
    adjoint: dict[int, Value] = {}

    def add(value: Value, g: Value) -> None:
        old = adjoint.get(value.id)
        adjoint[value.id] = g if old is None else Builder(emitter, span)("add", old, g)

    for out, seed in zip(outputs, seeds, strict=True):
        if out.id in active and seed is not None:
            add(out, seed)
    targets = {v.id for v in wrt}
    inside = {i: r for r in regions for i in r.values}
    done: set[int] = set()
    again = _Recomputed(emitter, ops, REMAT_POLICIES[remat])
    for op in reversed(ops):
        if any(r.id in targets for r in op.results):
            continue  # a value differentiated for: its cotangent is the answer
        region = next((inside[r.id] for r in op.results if r.id in inside), None)
        if region is not None:
            if id(region) not in done:
                done.add(id(region))
                _through(emitter, region, adjoint, active, add, span)
            continue
        gs = [adjoint.pop(r.id, None) for r in op.results]
        if all(g is None for g in gs):
            continue
        rule = VJP_RULES.get(op.kind)
        if rule is None:
            raise _no_rule(op)
        b = Builder(emitter, op.span or span)
        read, original = again.op(op)
        for operand, g in rule(b, read, gs):
            operand = original.get(operand.id, operand)
            if operand.id not in active or g is None:
                continue
            if g is _NO_RULE:
                raise _no_rule(op, operand)
            add(operand, _fit(b, g, operand, widen=False))
    return [adjoint.get(v.id) for v in wrt]


def _through(
    emitter: Emitter,
    region: Region,
    adjoint: dict[int, Value],
    active: set[int],
    add: Callable[[Value, Value], None],
    span: Span,
) -> None:
    """The cotangents of a region's inputs, by its rule, from those of its outputs."""
    gs = [adjoint.pop(v.id, None) for v in region.outputs]
    if all(g is None for g in gs) or not any(v.id in active for v in region.inputs):
        return
    b = Builder(emitter, span)
    gs = [None if g is None else _whole(b, g, v) for g, v in zip(gs, region.outputs, strict=True)]
    for value, g in zip(region.inputs, region.rule(gs), strict=True):
        if g is not None and value.id in active:
            add(value, _fit(b, g, value, widen=False))


class _Recomputed:
    """The forward values a backward rule reads, as the ``remat=`` policy has them: the
    value itself where the policy saves the op that computed it, else that op emitted
    again on such values (once: later rules read the same copy)."""

    def __init__(self, emitter: Emitter, ops: Sequence[Op], saves: Callable[[Op], bool]) -> None:
        self.emitter = emitter
        self.saves = saves
        self.producer = {r.id: op for op in ops for r in op.results}
        self.copies: dict[int, Value] = {}

    def op(self, op: Op) -> tuple[Op, dict[int, Value]]:
        """``op`` reading (and giving) the values the backward reads, and the value each
        of its new operands stands for."""
        operands = tuple(self.value(v) for v in op.operands)
        results = tuple(self.value(v) for v in op.results)
        original = {new.id: old for old, new in zip(op.operands, operands, strict=True)}
        return replace(op, operands=operands, results=results), original

    def value(self, v: Value) -> Value:
        op = self.producer.get(v.id)
        if op is None or self.saves(op) or op.regions or set(op.effects) - {"rng"}:
            return v
        if v.id not in self.copies:
            operands = tuple(self.value(o) for o in op.operands)
            types = tuple(r.type for r in op.results)
            copies = self.emitter.emit(op.kind, operands, types, op.attrs, op.effects, op.span)
            self.copies.update((r.id, c) for r, c in zip(op.results, copies, strict=True))
        return self.copies[v.id]


def _no_rule(op: Op, operand: Value | None = None) -> SemanticError:
    which = f" with respect to '{operand.name}'" if operand is not None and operand.name else ""
    if op.kind == "tile_call":
        name = op.attr("kernel")
        return SemanticError(
            f"cannot differentiate {name}(){which}: it is a tile kernel, and its tile code "
            f"has no derivative the compiler derives; give it a rule, @custom_vjp({name}_vjp) "
            f"on the kernel, where {name}_vjp is a function that takes its arguments and "
            "the result's cotangent and returns the cotangents of its float tensors",
            op.span,
        )
    why = NO_GRADIENT.get(
        op.kind, "it has no gradient rule yet; compute it from ops that have gradients"
    )
    return SemanticError(f"cannot differentiate {op.kind}{which}: {why}", op.span)
