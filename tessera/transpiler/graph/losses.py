"""PyTorch's losses, with ``torch.nn.functional``'s signatures: ``mse_loss``,
``l1_loss``, ``smooth_l1_loss``, ``huber_loss``, ``binary_cross_entropy``,
``binary_cross_entropy_with_logits`` and ``nll_loss`` (``cross_entropy`` is in
``array_ops``).

Each rule checks the call with PyTorch's argument names, computes each element's loss
from the ops Tessera has (with PyTorch's numerically stable formulas), and reduces it
as PyTorch's ``reduction`` says: ``"mean"`` (the default), ``"sum"`` or ``"none"``.
Their gradients are those ops', which are PyTorch's. PyTorch's deprecated
``size_average`` and ``reduce`` are not taken: ``reduction`` says the same.
"""

from __future__ import annotations

from .activations import log_sigmoid
from .array_ops import reduction_argument
from .dims import Dim
from .dtypes import F32
from .graph_ops import _float_input, _then, register
from .ir import Value
from .opcall import OpCall, P

__all__: list[str] = []


def _pair(call: OpCall) -> tuple[Value, Value]:
    """``input`` and ``target``: float tensors of one shape. PyTorch broadcasts two
    others with a warning that the result is likely wrong; here that is an error."""
    x, target = _float_input(call, "input"), _float_input(call, "target")

    def mismatch() -> str:
        return (f"input and target must have one shape: {call.shape_of('input')}, "
                f"{call.shape_of('target')}")  # fmt: skip

    if x.type.rank != target.type.rank:
        raise call.error(mismatch(), at="target")
    for axis, (a, b) in enumerate(zip(x.type.dims, target.type.dims, strict=True)):
        call.same_dim(a, b, mismatch, f"{call.shown} dim {axis}", ("input", "target"))
    return x, target


def _weighted(call: OpCall, name: str, loss: Value) -> Value:
    """``loss`` times the tensor argument ``name`` (a ``weight``), which broadcasts to the
    loss's shape; the loss itself where ``name`` is left out or ``None``."""
    if call.left_out(name):
        return loss
    _float_input(call, name)
    weighted = _then(call, "mul", loss, call.ev(name))
    if weighted.type.dims != loss.type.dims:
        raise call.error(
            f"'{name}' must broadcast to the input's shape; {call.shape_of(name)}, "
            f"{call.shape_of('input')}",
            at=name,
        )
    return weighted


def _reduced(call: OpCall, loss: Value) -> Value:
    """The elements' losses as ``reduction`` says: each (``"none"``), their sum, or
    their mean over every element (a 0-d f32 tensor)."""
    reduction = reduction_argument(call)
    return loss if reduction == "none" else _then(call, reduction, loss, None)


def _absolute_error(call: OpCall) -> Value:
    """``|input - target|``, the two checked."""
    _pair(call)
    return _then(call, "abs", _then(call, "sub", call.ev("input"), call.ev("target")))


def _squared(call: OpCall, z: Value) -> Value:
    return _then(call, "mul", _then(call, "mul", z, z), 0.5)


@register("mse_loss", P("input"), P("target"), P("reduction", "mean", keyword_only=True))
def _mse_loss(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.mse_loss``: the squared differences ``(input -
    target)**2`` of two float tensors of one shape (PyTorch's broadcasts two others, with
    a warning; here that is an error), their mean over every element (the default, a 0-d
    f32 tensor), their ``"sum"``, or ``"none"`` (each one, of the inputs' shape). Its
    gradient is the ops'."""
    _pair(call)
    difference = _then(call, "sub", call.ev("input"), call.ev("target"))
    return _reduced(call, _then(call, "mul", difference, difference))


@register(
    "l1_loss", P("input"), P("target"), P("reduction", "mean", keyword_only=True),
    P("weight", None, keyword_only=True),
)  # fmt: skip
def _l1_loss(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.l1_loss``: the absolute differences ``|input -
    target|`` of two float tensors of one shape, reduced as ``reduction`` says ("mean",
    "sum" or "none"). ``weight``, of the input's shape or one that broadcasts to it,
    multiplies each, and then the mean is ``sum(weight * error) / sum(weight)``, as
    PyTorch's. Its gradient is ``sign(input - target)`` (0 where they are equal), as
    PyTorch's."""
    loss = _weighted(call, "weight", _absolute_error(call))
    if call.left_out("weight") or reduction_argument(call) != "mean":
        return _reduced(call, loss)
    weights = _then(call, "broadcast_to", call.ev("weight"), loss.type.dims)
    return _then(call, "div", _then(call, "sum", loss, None), _then(call, "sum", weights, None))


@register(
    "smooth_l1_loss", P("input"), P("target"), P("reduction", "mean", keyword_only=True),
    P("beta", 1.0, keyword_only=True),
)  # fmt: skip
def _smooth_l1_loss(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.smooth_l1_loss``: of ``z = |input - target|``,
    ``0.5 * z**2 / beta`` where ``z < beta`` and ``z - 0.5 * beta`` elsewhere, reduced as
    ``reduction`` says. ``beta`` is at least 0 (default 1); at 0 it is ``l1_loss``, as
    PyTorch's. Float tensors of one shape. Its gradient is ``(input - target) / beta``
    inside and ``sign(input - target)`` outside."""
    beta = call.number("beta")
    if beta < 0:
        raise call.error(f"beta must be at least 0, not {beta}", at="beta")
    z = _absolute_error(call)
    if beta == 0.0:
        return _reduced(call, z)
    inside = _then(call, "div", _squared(call, z), beta)
    outside = _then(call, "sub", z, 0.5 * beta)
    return _reduced(call, _then(call, "where", _then(call, "less", z, beta), inside, outside))


@register(
    "huber_loss", P("input"), P("target"), P("reduction", "mean"), P("delta", 1.0),
    P("weight", None),
)  # fmt: skip
def _huber_loss(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.huber_loss``: of ``z = |input - target|``,
    ``0.5 * z**2`` where ``z < delta`` and ``delta * (z - 0.5 * delta)`` elsewhere,
    reduced as ``reduction`` says; ``delta`` is positive (default 1). It is
    ``smooth_l1_loss`` with ``beta = delta``, times ``delta``. ``weight``, of the input's
    shape or one that broadcasts to it, multiplies each, and the mean is then over every
    element, as PyTorch's. Float tensors of one shape. Its gradient is the ops'."""
    delta = call.number("delta")
    if not delta > 0:
        raise call.error(f"delta must be positive, not {delta}", at="delta")
    z = _absolute_error(call)
    outside = _then(call, "mul", _then(call, "sub", z, 0.5 * delta), delta)
    loss = _then(call, "where", _then(call, "less", z, delta), _squared(call, z), outside)
    return _reduced(call, _weighted(call, "weight", loss))


@register(
    "binary_cross_entropy", P("input"), P("target"), P("weight", None),
    P("reduction", "mean", keyword_only=True),
)  # fmt: skip
def _binary_cross_entropy(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.binary_cross_entropy``: of probabilities ``input``
    in [0, 1] and targets of its shape, ``-(target * log(input) + (1 - target) *
    log(1 - input))``, each log at least -100 (PyTorch's clamp, so that an input of
    exactly 0 or 1 costs 100, not infinity); ``weight`` (broadcast to the input's shape)
    multiplies each; reduced as ``reduction`` says. An input outside [0, 1] gives NaN
    (PyTorch raises). Its gradient is ``(input - target) / (input * (1 - input))``, as
    PyTorch's, where the logs are above -100. ``binary_cross_entropy_with_logits`` is
    the stable form for logits."""
    x, target = _pair(call)
    hit = _then(call, "maximum", _then(call, "log", x), -100.0)
    miss = _then(call, "maximum", _then(call, "log1p", _then(call, "neg", x)), -100.0)
    missed = _then(call, "sub", 1.0, target)
    gain = _then(call, "add", _then(call, "mul", target, hit), _then(call, "mul", missed, miss))
    return _reduced(call, _weighted(call, "weight", _then(call, "neg", gain)))


@register(
    "binary_cross_entropy_with_logits", P("input"), P("target"), P("weight", None),
    P("reduction", "mean", keyword_only=True), P("pos_weight", None, keyword_only=True),
)  # fmt: skip
def _binary_cross_entropy_with_logits(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.binary_cross_entropy_with_logits``: the binary
    cross-entropy of ``sigmoid(input)`` and targets of the input's shape, in PyTorch's
    stable form ``(1 - target) * input - w * logsigmoid(input)``, finite for any logits,
    where ``w`` is 1, or ``1 + (pos_weight - 1) * target`` with ``pos_weight`` (the
    positive examples' weight, which broadcasts to the input's shape: one per class of
    the last dim). ``weight`` (broadcast to the input's shape) multiplies each loss;
    reduced as ``reduction`` says. Its gradient is ``sigmoid(input) - target`` without
    the weights, as PyTorch's."""
    x, target = _pair(call)
    fit = log_sigmoid(call, x)
    if not call.left_out("pos_weight"):  # times 1 + (pos_weight - 1) * target
        scale = _then(call, "sub", _weighted(call, "pos_weight", target), target)
        fit = _then(call, "mul", fit, _then(call, "add", scale, 1.0))
    loss = _then(call, "sub", _then(call, "mul", _then(call, "sub", 1.0, target), x), fit)
    return _reduced(call, _weighted(call, "weight", loss))


@register(
    "nll_loss", P("input"), P("target"), P("weight", None),
    P("ignore_index", -100, keyword_only=True), P("reduction", "mean", keyword_only=True),
)  # fmt: skip
def _nll_loss(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.nll_loss``: of log-probabilities ``input [N, C]``
    (as ``log_softmax`` gives them; ``[C]``, or ``[N, C, d1, ...]``) and integer class
    labels ``target [N]`` (``[]``, or ``[N, d1, ...]``), ``-weight[t] * input[n, t]`` for
    each label ``t``; ``weight [C]`` is 1 for every class when left out. A label of
    ``ignore_index`` (default -100) contributes 0. ``reduction`` "mean" (the default)
    divides the sum by the weights of the labels not ignored (their count, unweighted:
    NaN where every label is ignored, as PyTorch's), "sum" is the sum, "none" each
    loss, of the target's shape; the result is f32. A label outside ``[0, C)`` other
    than ``ignore_index`` is clamped into it (PyTorch raises). Its gradient is the
    gather's (``scatter_add``); the labels carry none."""
    x, labels = _float_input(call, "input"), call.tensor("target")
    if labels.type.dtype.kind != "int":
        raise call.error(
            f"'target' must be integer class labels; {call.ev('target').text} is "
            f"{labels.type.dtype}",
            at="target",
        )
    rank = x.type.rank
    if rank == 0 or labels.type.rank != max(rank - 1, 0):
        raise call.error(
            f"'input' is [N, C] (or [C], or [N, C, d1, ...]) and 'target' the same without C; "
            f"{call.shape_of('input')}, {call.shape_of('target')}",
            at="target",
        )
    classes = x.type.dims[0 if rank == 1 else 1]
    others = (x.type.dims[:1] + x.type.dims[2:]) if rank > 1 else ()
    for axis, (a, b) in enumerate(zip(labels.type.dims, others, strict=True)):
        call.same_dim(
            a, b,
            lambda: f"one label per row: {call.shape_of('input')}, {call.shape_of('target')}",
            f"nll_loss target dim {axis}", ("input", "target"),
        )  # fmt: skip
    reduction = reduction_argument(call)
    ignored = call.const("ignore_index", int)
    shape = labels.type.dims
    if rank == 1:  # one row of scores and its label
        x = _then(call, "reshape", x, (Dim.const(1), classes))
        labels = _then(call, "reshape", labels, (Dim.const(1),))
    kept = _then(call, "not_equal", labels, ignored)
    index = _then(call, "where", kept, labels, 0)
    column = (labels.type.dims[0], Dim.const(1), *labels.type.dims[1:])
    picked = _then(call, "take_along_axis", x, _then(call, "reshape", index, column), 1)
    loss = _then(call, "neg", _then(call, "reshape", _then(call, "cast", picked, F32),
                                   labels.type.dims))  # fmt: skip
    weights = _then(call, "cast", kept, F32)
    if not call.left_out("weight"):
        w = _float_input(call, "weight")
        if w.type.rank != 1:
            raise call.error(f"'weight' is one per class, [C]; {call.shape_of('weight')}",
                             at="weight")  # fmt: skip
        call.same_dim(
            w.type.dims[0], classes,
            lambda: f"'weight' is one per class: {call.shape_of('input')}, "
            f"{call.shape_of('weight')}",
            "nll_loss weight per class", ("input", "weight"),
        )  # fmt: skip
        picked_weight = _then(call, "cast", _then(call, "take", w, index, 0), F32)
        weights = _then(call, "where", kept, picked_weight, 0.0)
    loss = _then(call, "where", kept, _then(call, "mul", loss, weights), 0.0)
    if reduction == "none":
        return _then(call, "reshape", loss, shape)
    total = _then(call, "sum", loss, None)
    if reduction == "sum":
        return total
    return _then(call, "div", total, _then(call, "sum", weights, None))
