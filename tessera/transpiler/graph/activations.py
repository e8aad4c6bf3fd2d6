"""PyTorch's activation functions that Tessera composes from its elementwise ops:
``relu6``, ``hardtanh``, ``hardsigmoid``, ``hardswish``, ``mish``, ``logsigmoid``,
``softsign``, ``selu``, ``celu`` and ``glu``, with ``torch.nn.functional``'s signatures.

Model code ported from PyTorch calls them as builtins (``F.hardswish(x)`` is
``hardswish(x)``). Each rule checks the call with PyTorch's argument names, then emits
the ops it is made of (``clamp``, ``where``, ``expm1``, ``softplus``, a slice) through
their own rules, so that each fuses into its neighbours' kernels on every backend and
differentiates by those ops' rules, to PyTorch's gradient.
"""

from __future__ import annotations

from .dims import Dim
from .graph_ops import _float_input, _then, register
from .ir import Value
from .opcall import OpCall, P
from .types import TensorType

__all__: list[str] = []

#: SELU's constants, as PyTorch's (Klambauer et al., 2017).
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _input(call: OpCall) -> Value:
    """The float ``input``, once PyTorch's ``inplace`` (where the function has one) is
    checked: a bool, with no effect, as a graph value is never changed in place."""
    if any(p.name == "inplace" for p in call.spec.params):
        call.const("inplace", bool)
    return _float_input(call, "input")


def _clamped(call: OpCall, x: Value, low: float, high: float) -> Value:
    """``x`` limited to ``[low, high]``: ``clamp``, PyTorch's ``hardtanh``."""
    return _then(call, "clamp", x, low, high)


@register("relu6", P("input"), P("inplace", False))
def _relu6(call: OpCall) -> object:
    """Elementwise ``min(max(x, 0), 6)``, as PyTorch's ``relu6`` (MobileNet's):
    ``clamp(x, 0.0, 6.0)``. Float inputs; same shape and dtype; ``inplace`` is taken and
    has no effect (a graph value is never changed in place). Its gradient is 1 inside
    ``(0, 6)`` and 0 outside, as PyTorch's."""
    return _clamped(call, _input(call), 0.0, 6.0)


@register("hardtanh", P("input"), P("min_val", -1.0), P("max_val", 1.0), P("inplace", False))
def _hardtanh(call: OpCall) -> object:
    """Elementwise ``x`` limited to ``[min_val, max_val]`` (default ``[-1, 1]``), as
    PyTorch's ``hardtanh``: ``clamp(x, min_val, max_val)``; ``max_val`` below ``min_val``
    is an error, as in PyTorch. Float inputs; same shape and dtype. Its gradient is 1
    inside the interval and 0 outside."""
    x = _input(call)
    low, high = call.number("min_val"), call.number("max_val")
    if high < low:
        raise call.error(f"max_val {high} is below min_val {low}", at="max_val")
    return _clamped(call, x, low, high)


def _hard_gate(call: OpCall, x: Value) -> Value:
    """``relu6(x + 3) / 6``: PyTorch's ``hardsigmoid``, the gate of ``hardswish``."""
    return _then(call, "div", _clamped(call, _then(call, "add", x, 3.0), 0.0, 6.0), 6.0)


@register("hardsigmoid", P("input"), P("inplace", False))
def _hardsigmoid(call: OpCall) -> object:
    """Elementwise ``relu6(x + 3) / 6``, as PyTorch's ``hardsigmoid``: 0 below -3, 1
    above 3, linear between. Float inputs; same shape and dtype. Its gradient is 1/6
    inside ``(-3, 3)`` and 0 outside."""
    return _hard_gate(call, _input(call))


@register("hardswish", P("input"), P("inplace", False))
def _hardswish(call: OpCall) -> object:
    """Elementwise ``x * relu6(x + 3) / 6``, as PyTorch's ``hardswish`` (MobileNetV3's):
    0 below -3, ``x`` above 3. Float inputs; same shape and dtype. Its gradient is
    ``x / 3 + 0.5`` inside ``(-3, 3)``, as PyTorch's."""
    x = _input(call)
    return _then(call, "mul", x, _hard_gate(call, x))


@register("mish", P("input"), P("inplace", False))
def _mish(call: OpCall) -> object:
    """Elementwise ``x * tanh(softplus(x))``, as PyTorch's ``mish``, with ``softplus``'s
    stable form (``x`` itself above 20), so that it never overflows. Float inputs; same
    shape and dtype. Its gradient is the ops'."""
    x = _input(call)
    return _then(call, "mul", x, _then(call, "tanh", _then(call, "softplus", x)))


def log_sigmoid(call: OpCall, x: Value) -> Value:
    """``log(sigmoid(x))`` as PyTorch computes it, ``min(x, 0) - log1p(exp(-|x|))``:
    exact for large ``|x|`` of either sign (``log(sigmoid(x))`` is ``-inf`` below -104 in
    f32), with the gradient ``1 - sigmoid(x)``, finite everywhere."""
    tail = _then(call, "log1p", _then(call, "exp", _then(call, "neg", _then(call, "abs", x))))
    return _then(call, "sub", _then(call, "minimum", x, 0.0), tail)


@register("logsigmoid", P("input"))
def _logsigmoid(call: OpCall) -> object:
    """Elementwise ``log(sigmoid(x))``, as PyTorch's ``logsigmoid``, in its stable form
    ``min(x, 0) - log1p(exp(-|x|))``: finite for every finite ``x``, and ``x`` itself far
    below 0. Float inputs; same shape and dtype. Its gradient is ``1 - sigmoid(x)``."""
    return log_sigmoid(call, _input(call))


@register("softsign", P("input"))
def _softsign(call: OpCall) -> object:
    """Elementwise ``x / (1 + |x|)``, as PyTorch's ``softsign``. Float inputs; same shape
    and dtype. Its gradient is ``1 / (1 + |x|)**2``."""
    x = _input(call)
    return _then(call, "div", x, _then(call, "add", _then(call, "abs", x), 1.0))


@register("selu", P("input"), P("inplace", False))
def _selu(call: OpCall) -> object:
    """Elementwise ``scale * elu(x, alpha)``, as PyTorch's ``selu``, with its constants
    ``alpha = 1.6732632423543772`` and ``scale = 1.0507009873554805``. Float inputs; same
    shape and dtype. Its gradient is ``elu``'s, scaled."""
    x = _input(call)
    return _then(call, "mul", _then(call, "elu", x, _SELU_ALPHA), _SELU_SCALE)


@register("celu", P("input"), P("alpha", 1.0), P("inplace", False))
def _celu(call: OpCall) -> object:
    """Elementwise ``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``, as PyTorch's
    ``celu``: ``x`` where ``x > 0``, else ``alpha * expm1(x / alpha)`` (the branch not
    taken never overflows). ``alpha`` is a nonzero number (PyTorch divides by it).
    Float inputs; same shape and dtype. Its gradient is 1 above 0 and ``exp(x / alpha)``
    below."""
    x = _input(call)
    alpha = call.number("alpha")
    if alpha == 0.0:
        raise call.error("alpha must not be 0: celu divides by it", at="alpha")
    scaled = _then(call, "div", _then(call, "minimum", x, 0.0), alpha)
    negative = _then(call, "mul", _then(call, "expm1", scaled), alpha)
    return _then(call, "where", _then(call, "greater", x, 0.0), x, negative)


def _half(call: OpCall, x: Value, axis: int, which: int) -> Value:
    """The first (``which`` 0) or second half of ``x`` along ``axis``: a slice, which the
    kernels reading it read where it lies (a vector's, that of its one row)."""
    if x.type.rank == 1:
        row = _then(call, "reshape", x, (Dim.const(1), x.type.dims[0]))
        return _then(call, "reshape", _half(call, row, 1, which), (x.type.dims[0] / 2,))
    dims = list(x.type.dims)
    dims[axis] = dims[axis] / 2
    starts = [Dim.const(0)] * x.type.rank
    starts[axis] = dims[axis] * which
    attrs = (("perm", tuple(range(x.type.rank))), ("starts", tuple(starts)))
    return call.emit("slice", (x,), TensorType(tuple(dims), x.type.dtype), attrs=attrs)


@register("glu", P("input"), P("dim", -1))
def _glu(call: OpCall) -> object:
    """The gated linear unit, as PyTorch's ``glu``: ``input`` split in two halves ``a``
    and ``b`` along ``dim`` (default -1), and ``a * sigmoid(b)``, of half the size there.
    The size along ``dim`` is even (a symbolic one is checked when the function is
    called); each half is a view of the input. Float inputs. Its gradient is the
    product's, written into each half."""
    x = _input(call)
    if x.type.rank == 0:
        raise call.error(f"needs at least 1 dim; {call.shape_of('input')}", at="input")
    axis = call.axis("dim", x.type.rank)
    size = x.type.dims[axis]
    if size.constant is not None and size.constant % 2:
        raise call.error(
            f"halves dim {axis}, of odd size {size}; {call.shape_of('input')}", at="input"
        )
    if size.constant is None:
        call.emitter.guard(
            "divisible", size, Dim.const(2), f"{call.shown}: dim {axis} is even", call.span
        )
    gate = _then(call, "sigmoid", _half(call, x, axis, 1))
    return _then(call, "mul", _half(call, x, axis, 0), gate)
