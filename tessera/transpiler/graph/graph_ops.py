"""The graph-level operations: shape and dtype rules, one function each.

A rule's docstring is its documentation: ``docs/ops.md`` is generated from
this registry (``python -m tessera.transpiler.graph.opdocs``) and a test keeps
the two in step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from .dims import Dim, DimSyntaxError, parse_dim
from .dtypes import BOOL, F32, I32, DType, accumulator, promote, saturation_error
from .ir import Op, Value
from .opcall import OpCall, OpSpec, P
from .types import ScalarType, TensorType, TileType, dims_text
from .values import Const, DimValue, DTypeRef, Ev, describe

__all__ = [
    "GRAPH_OPS", "UNARY_DOCS", "register", "broadcast", "elementwise_type", "binary_operands",
    "last_two_swapped", "rows_permuted", "retyping_view", "view_starts", "folded",
    "ELEMENTWISE_MATH", "COMPARISONS", "LOGICAL", "named_operands", "is_mask", "DRAWN",
    "COUNTING", "C_MATH", "attention_inputs", "attention_scale",
]  # fmt: skip

#: The comparison operators and the ops they are: each gives a mask (dtype ``bool``).
COMPARISONS = {
    "<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal", "==": "equal",
    "!=": "not_equal",
}  # fmt: skip

#: ``and``, ``or`` and ``not`` of masks, and the ops they are: each gives a mask.
LOGICAL = {"and": "logical_and", "or": "logical_or", "not": "logical_not"}

#: The unary math that C's ``<math.h>`` has under the op's own name: each backend calls
#: its library's function (``floorf`` in CUDA and HIP, ``floor`` in OpenCL C, ``sycl::floor``,
#: ``std::floor`` on the CPU).
C_MATH = ("floor", "ceil", "exp2", "log2", "log1p", "expm1", "erf", "tan")

#: The elementwise math a kernel computes on each element of a tile, wherever it is
#: fused (before or after a library kernel's op, or alone): arithmetic, the extremes,
#: the unary math, casts, comparisons and ``where``. Fusion, canonicalization and the
#: tile passes share it.
ELEMENTWISE_MATH = frozenset({
    "add", "sub", "mul", "div", "floordiv", "mod", "pow", "maximum", "minimum", "neg", "exp",
    "log", "sqrt",
    "rsqrt", "tanh", "sigmoid", "gelu", "silu", "relu", "abs", "round", "sin", "cos", "cast",
    *C_MATH, "where", "join_i32",
    *COMPARISONS.values(), *LOGICAL.values(),
})  # fmt: skip

#: Elementwise ops that read the element's row-major place in their result: those that draw
#: from Philox by it (``dropout``; ``stochastic_cast``, which ``@stochastic_round`` makes of
#: a cast), and ``index_along``, the element's index along one axis (``argmax``'s). The
#: tile lowering gives each the place of its tile (``at``).
DRAWN = frozenset({"dropout", "stochastic_cast", "index_along"})

GRAPH_OPS: dict[str, OpSpec] = {}


def register(
    name: str, *params: P, level: str = "graph", in_place: bool = False
) -> Callable[[Callable[[OpCall], object]], Callable[[OpCall], object]]:
    def add(rule: Callable[[OpCall], object]) -> Callable[[OpCall], object]:
        doc = " ".join((rule.__doc__ or "").split())
        GRAPH_OPS[name] = OpSpec(name, params, rule, level, doc, in_place)
        return rule

    return add


# ------------------------------------------------------------------- helpers


def broadcast(
    call: OpCall, a: str, b: str, left: tuple[Dim, ...], right: tuple[Dim, ...]
) -> tuple[Dim, ...]:
    """NumPy broadcasting: align trailing dims; a 1 stretches to the other size."""
    out: list[Dim] = []
    one = Dim.const(1)
    for i in range(1, max(len(left), len(right)) + 1):
        x = left[-i] if i <= len(left) else one
        y = right[-i] if i <= len(right) else one
        if x == one:
            out.append(y)
        elif y == one:
            out.append(x)
        else:
            call.same_dim(
                x, y,
                lambda: f"shapes do not broadcast: {call.shape_of(a)}, {call.shape_of(b)}",
                f"broadcast {x} with {y}", (a, b),
            )  # fmt: skip
            out.append(x)
    return tuple(reversed(out))


def elementwise_type(value: Value) -> TensorType | TileType:
    """A tensor or tile type without policies: an intermediate result."""
    t = value.type
    return TensorType(t.dims, t.dtype) if isinstance(t, TensorType) else t


def _float_input(call: OpCall, name: str) -> Value:
    x = call.tensor(name)
    if not x.type.dtype.is_float:
        raise call.error(
            f"needs a floating-point input; {call.ev(name).text} is {x.type.dtype}", at=name
        )
    return x


def _reduce_dims(dims: tuple[Dim, ...], axis: int, keepdims: bool) -> tuple[Dim, ...]:
    if keepdims:
        return (*dims[:axis], Dim.const(1), *dims[axis + 1 :])
    return dims[:axis] + dims[axis + 1 :]


# ---------------------------------------------------------------- arithmetic


def _binary(kind: str, symbol: str | None) -> Callable[[OpCall], object]:
    compare = kind in COMPARISONS.values()

    def rule(call: OpCall) -> object:
        operands = []
        types = []
        for name in ("a", "b"):
            value = call.raw(name)
            if isinstance(value, Value) and isinstance(value.type, (TensorType, TileType)):
                types.append(value.type)
                operands.append(value)
        if not types and compare:
            raise call.error("compares tensors or tiles, elementwise; one side must be one")
        if not types:  # sema folds the operators on numbers and scalars; these are calls
            return _larger_or_smaller(call, kind)
        dtype = types[0].dtype
        for t in types[1:]:
            dtype = promote(dtype, t.dtype)
        if not dtype.is_float and (kind == "div" or _has_float_number(call)):
            dtype = F32  # NumPy's and PyTorch's: 7 / 2 is 3.5, and so is i * 0.5 of i = 7
        if compare:
            dtype = BOOL
        dims = types[0].dims
        if len(types) == 2:
            dims = broadcast(call, "a", "b", types[0].dims, types[1].dims)
        attrs: tuple = ()
        for name in ("a", "b"):
            value = call.raw(name)
            if isinstance(value, Const):
                attrs += ((f"{name}", value.value),)
            elif isinstance(value, Value) and isinstance(value.type, ScalarType):
                operands.append(value)
                attrs += ((f"{name}", "scalar"),)
        result = types[0].with_(dims=dims, dtype=dtype)
        if isinstance(result, TensorType):
            result = TensorType(dims, dtype)
        return call.emit(kind, tuple(operands), result, attrs=attrs)

    if compare:
        rule.__doc__ = (
            f"Elementwise ``a {symbol} b`` with NumPy broadcasting: a mask, true where it "
            "holds, which ``where`` and ``cast`` read (``cast`` makes it 1.0 and 0.0). Either "
            "side may be a number or a scalar parameter. With a NaN on either side it is "
            + ("true." if symbol == "!=" else "false.")
        )
        return rule
    what = f"``a {symbol} b``" if symbol else f"the {_EXTREMES[kind][0]} of ``a`` and ``b``"
    rule.__doc__ = (
        f"Elementwise {what} with NumPy broadcasting. Either side may be a "
        "number or a scalar parameter. The result dtype is the wider of the two (a float "
        "beats an integer, and an integer tensor with a float number or a float scalar "
        "gives f32; bf16 and f16 together give f32)." + _BINARY_NOTES.get(kind, "")
    )
    return rule


#: What the documentation of each binary op adds to the common text.
_BINARY_NOTES = {
    "div": " Two integers divide as NumPy's and PyTorch's ``/`` do: true division, to f32.",
    "floordiv": (
        " The quotient rounded toward minus infinity, as Python and NumPy define it "
        "(``-7 // 2`` is -4); of integers, an integer, and 0 where ``b`` is 0 (NumPy's)."
    ),
    "mod": (
        " The remainder of ``a // b``, with the sign of ``b``, as Python and NumPy define "
        "it (``-7 % 2`` is 1); of integers, 0 where ``b`` is 0 (NumPy's)."
    ),
    "maximum": " A NaN operand gives the other one, as C's ``fmax`` and ``fmin`` do.",
    "minimum": " A NaN operand gives the other one, as C's ``fmax`` and ``fmin`` do.",
}


def _has_float_number(call: OpCall) -> bool:
    """Whether ``a`` or ``b`` is a float number or a float scalar parameter."""
    for name in ("a", "b"):
        value = call.raw(name)
        if isinstance(value, Const) and isinstance(value.value, float):
            return True
        if isinstance(value, Value) and value.type == ScalarType("float"):
            return True
    return False


#: The binary ops written as calls: what each picks, and of two numbers, how.
_EXTREMES = {"maximum": ("larger", max), "minimum": ("smaller", min)}


def _larger_or_smaller(call: OpCall, kind: str) -> Const | Value:
    """``maximum`` or ``minimum`` without a tensor: of two numbers, a number the compiler
    computes; with a scalar parameter, a scalar that each kernel reading it computes."""
    a, b = call.raw("a"), call.raw("b")
    operands, attrs = [], []
    for name, value in (("a", a), ("b", b)):
        if isinstance(value, Value) and value.type == ScalarType("float"):
            operands.append(value)
        elif isinstance(value, Const) and type(value.value) in (int, float):
            attrs.append((name, value.value))
        else:
            raise call.error(
                f"needs a tensor, a float or a number, not {call.ev(name).text}", at=name
            )
    if not operands:
        return Const(_EXTREMES[kind][1](a.value, b.value))
    return call.emit(kind, tuple(operands), ScalarType("float"), attrs=tuple(attrs))


def binary_operands(op: Op) -> tuple[Any, Any]:
    """``a`` and ``b`` of a binary op as built above: a Value, or the constant its
    attribute holds."""
    a, b = named_operands(op, ("a", "b"))
    return a, b


def named_operands(op: Op, names: tuple[str, ...]) -> list[Any]:
    """The operands ``names`` of an elementwise op whose operands may be numbers or
    scalars (a binary op, ``where``): each a Value, or the constant its attribute holds.
    Tensor and tile operands come first, then scalar ones."""
    values = [v for v in op.operands if not isinstance(v.type, ScalarType)]
    scalars = [v for v in op.operands if isinstance(v.type, ScalarType)]
    picked = []
    for name in names:
        attr = op.attr(name)
        if attr is None:
            picked.append(values.pop(0) if values else scalars.pop(0))
        elif attr == "scalar":
            picked.append(scalars.pop(0))
        else:
            picked.append(attr)
    return picked


for _kind, _symbol in (("add", "+"), ("sub", "-"), ("mul", "*"), ("div", "/"),
                       ("floordiv", "//"), ("mod", "%"), ("pow", "**")):  # fmt: skip
    register(_kind, P("a"), P("b"), level="any")(_binary(_kind, _symbol))
for _kind in _EXTREMES:
    register(_kind, P("a"), P("b"))(_binary(_kind, None))
    register(f"tile.{_kind}", P("a"), P("b"), level="tile")(_binary(_kind, None))
for _symbol, _kind in COMPARISONS.items():
    register(_kind, P("a"), P("b"), level="any")(_binary(_kind, _symbol))


def is_mask(value: object) -> bool:
    """Whether ``value`` is a comparison's result: a tensor or tile of dtype ``bool``."""
    return isinstance(value, Value) and getattr(value.type, "dtype", None) == BOOL


def _logical(call: OpCall) -> object:
    """``and``, ``or`` and ``not`` of masks: one rule, registered for each with its own
    reference text (``_logical_rule``)."""
    names = ("x",) if call.spec.name == "logical_not" else ("a", "b")
    values = [call.raw(name) for name in names]
    for name, value in zip(names, values, strict=True):
        if not is_mask(value):
            numbers = isinstance(value, Value) and isinstance(value.type, (TensorType, TileType))
            nonzero = f" (numpy's reading of numbers: {call.ev(name).text} != 0)" if numbers else ""
            raise call.error(
                f"'{name}' must be a mask (a comparison, such as x > 0.0), not "
                f"{describe(value)}{nonzero}",
                at=name,
            )
    if len({type(v.type) for v in values}) > 1:
        raise call.error("combines two tensors or two tiles, not a tensor and a tile")
    dims = values[0].type.dims
    if len(values) == 2:
        dims = broadcast(call, "a", "b", dims, values[1].type.dims)
    return call.emit(call.spec.name, tuple(values), type(values[0].type)(dims, BOOL))


#: What each op of masks holds where, and an example: the reference text of each.
_LOGICAL_DOCS = {
    "logical_and": "true where both ``a`` and ``b`` are, elementwise with NumPy broadcasting: "
    "``x > lo and x < hi`` holds inside the interval.",
    "logical_or": "true where ``a`` or ``b`` is, elementwise with NumPy broadcasting: "
    "``x < lo or x > hi`` holds outside the interval. ``and`` binds tighter, as in Python.",
    "logical_not": "true where ``x`` is false, elementwise: ``not x > 0.0`` holds where ``x`` "
    "is at most 0 and where it is NaN.",
}


def _logical_rule(kind: str) -> Callable[[OpCall], object]:
    """The rule of one op of masks, with its own reference text."""

    def rule(call: OpCall) -> object:
        return _logical(call)

    operands = (
        "The operand is a mask (a comparison, or one of these)"
        if kind == "logical_not"
        else "The operands are masks (comparisons, or these)"
    )
    rule.__doc__ = (
        f"A mask {_LOGICAL_DOCS[kind]} {operands}, and so is the result, which ``where`` "
        "and ``cast`` read."
    )
    return rule


for _kind in ("logical_and", "logical_or"):
    register(_kind, P("a"), P("b"), level="any")(_logical_rule(_kind))
register("logical_not", P("x"), level="any")(_logical_rule("logical_not"))


@register("logical_xor", P("a"), P("b"), level="any")
def _logical_xor(call: OpCall) -> object:
    """A mask true where exactly one of ``a`` and ``b`` is, elementwise with NumPy
    broadcasting, as numpy's and PyTorch's ``logical_xor``: ``(x > 0.0) ^ (y > 0.0)``
    holds where the two differ in sign. The operands are masks (comparisons, or these);
    a tensor of numbers is compared first (``x != 0.0``). It is ``(a or b) and not (a
    and b)``, which ``where`` and ``cast`` read."""
    a, b = call.ev("a"), call.ev("b")
    both = _then(call, "logical_not", _then(call, "logical_and", a, b))
    return _then(call, "logical_and", _then(call, "logical_or", a, b), both)


def _where(call: OpCall) -> object:
    """``a`` where ``cond`` holds, else ``b``, elementwise, with NumPy broadcasting over
    all three: ``where(x > 0.0, x, 0.01 * x)`` is a leaky ReLU, and
    ``where(mask == 0.0, -INF, s)`` masks scores. ``cond`` is a comparison (a mask);
    ``a`` and ``b`` are tensors, numbers or scalar parameters. The result has the wider
    dtype of the tensors among them, as arithmetic does, or f32 when both are numbers."""
    want = TileType if call.spec.level == "tile" else TensorType
    cond = call.raw("cond")
    if not is_mask(cond) or not isinstance(cond.type, want):
        raise call.error(
            f"'cond' must be a comparison, such as x > 0.0, not {describe(cond)}",
            at="cond",
        )
    tensors, scalars, attrs = [cond], [], []
    dims, dtype = cond.type.dims, None
    for name in ("a", "b"):
        value = call.raw(name)
        if isinstance(value, Value) and isinstance(value.type, want) and not is_mask(value):
            tensors.append(value)
            dims = broadcast(call, "cond", name, dims, value.type.dims)
            dtype = value.type.dtype if dtype is None else promote(dtype, value.type.dtype)
        elif isinstance(value, Value) and value.type in (ScalarType("float"), ScalarType("int")):
            scalars.append(value)
            attrs.append((name, "scalar"))
        elif isinstance(value, Const) and type(value.value) in (int, float):
            attrs.append((name, value.value))
        elif is_mask(value):
            raise call.error(
                f"'{name}' is a mask; cast({call.ev(name).text}, f32) makes it 1.0 and 0.0",
                at=name,
            )
        else:
            kind = "a tile" if want is TileType else "a tensor"
            raise call.error(
                f"'{name}' must be {kind}, a number or a scalar, not {describe(value)}", at=name
            )
    result = want(dims, dtype or F32)
    return call.emit("where", (*tensors, *scalars), result, attrs=tuple(attrs))


register("where", P("cond"), P("a"), P("b"))(_where)
register("tile.where", P("cond"), P("a"), P("b"), level="tile")(_where)


def _clamp(call: OpCall) -> object:
    """``x`` limited to ``[min, max]``: ``minimum(maximum(x, min), max)``. Each bound is a
    number, a float parameter or a tensor that broadcasts, and either may be left out:
    ``clamp(x, 0.0, 6.0)`` is ReLU6, ``clamp(x, max=448.0)`` caps at fp8 e4m3's largest."""
    prefix = "tile." if call.spec.level == "tile" else ""
    name = call.spec.name.removeprefix("tile.")
    value = call.ev("x")
    bounds = [
        (b, k) for b, k in (("min", "maximum"), ("max", "minimum"))
        if call.given(b) and not (isinstance(call.raw(b), Const) and call.raw(b).value is None)
    ]  # fmt: skip
    if not bounds:
        raise call.error(
            f"needs a bound: {name}(x, min, max), {name}(x, min=0.0) or {name}(x, max=1.0)"
        )
    for bound, kind in bounds:
        spec = GRAPH_OPS[prefix + kind]
        result = spec.rule(OpCall(spec, {"a": value, "b": call.ev(bound)}, call.span,
                                  call.emitter, call.shown))  # fmt: skip
        value = Ev(result, call.span, call.shown)
    return value.value


register("clamp", P("x"), P("min", None), P("max", None))(_clamp)


@register("clip", P("x"), P("min", None), P("max", None))
def _clip(call: OpCall) -> object:
    """``x`` limited to ``[min, max]``, as numpy's ``clip``: ``clamp``, except that a NaN
    stays NaN, as in numpy and PyTorch (``clamp``, as C's ``fmax``, gives the bound).
    Either bound may be left out or ``None``: ``clip(x, None, 1.0)``. The bounds are
    ``min=`` and ``max=``, as in numpy 2.1 (for its older ``a_min=`` and ``a_max=`` the
    error names them)."""
    x = call.tensor("x")
    return _then(call, "where", _then(call, "not_equal", x, x), x, _clamp(call))


register("tile.clamp", P("x"), P("min", None), P("max", None), level="tile")(_clamp)


@register("neg", P("x"), level="any")
def _neg(call: OpCall) -> object:
    """``-x``, elementwise."""
    x = call.raw("x")
    if isinstance(x, Value) and isinstance(x.type, TileType):
        return call.emit("neg", (x,), x.type)
    x = call.tensor("x")
    return call.emit("neg", (x,), elementwise_type(x))


@register("matmul", P("a"), P("b"))
def _matmul(call: OpCall) -> object:
    """Matrix product, also written ``a @ b``: ``[..., M, K] @ [..., K, N] -> [..., M, N]``,
    batch dims broadcast. A vector operand is one row (``[K] @ [K, N] -> [N]``) or one
    column (``[M, K] @ [K] -> [M]``), as in numpy; a matrix times a vector runs as the row
    sums of the products, one pass over the matrix. Both operands have one dtype; the
    result has the accumulation dtype: the operand's ``@accum`` policy, else f32 for
    floats and i32 for integers. ``a @ b.T`` reads ``b`` where it lies, with no
    transposed copy (a ``[N, K]`` weight). Of i8 operands the result is the exact i32
    sum (``torch._int_mm``'s, NumPy's of int32 copies), for K up to 131071, beyond which
    it could wrap: a larger K is an error, or a run-time check where it is symbolic
    (docs/numerics.md, W8A8); their ``a @ b.T`` copies ``b`` transposed first."""
    a, b = call.tensor("a"), call.tensor("b")
    for name, value in (("a", a), ("b", b)):
        if value.type.rank < 1:
            raise call.error(
                f"needs vectors or matrices; {call.shape_of(name)}", at=name,
                notes=call.notes_for(name),
            )  # fmt: skip
    ta, tb = a.type, b.type
    inner = tb.dims[-2] if tb.rank > 1 else tb.dims[0]
    # A [N, K] weight (PyTorch's Linear layout) meets [.., K] by its last dim.
    transposed = tb.rank > 1 and tb.dims[-1] == ta.dims[-1]
    hint = f"; to multiply by its transpose, write {call.ev('b').text}.T" if transposed else ""
    call.same_dim(
        ta.dims[-1], inner,
        lambda: f"inner dimensions differ: {call.shape_of('a')}, {call.shape_of('b')}{hint}",
        f"inner dimension {ta.dims[-1]} == {inner}", ("a", "b"),
    )  # fmt: skip
    if ta.dtype != tb.dtype:
        raise call.error(
            f"operands have different dtypes: {call.ev('a').text} is {ta.dtype}, "
            f"{call.ev('b').text} is {tb.dtype}; cast one of them, e.g. "
            f"cast({call.ev('b').text}, {ta.dtype})",
            notes=call.notes_for("a", "b"),
        )
    if ta.dtype.name == "i8":
        _int8_depth(call, ta.dims[-1])
    batch = broadcast(call, "a", "b", ta.dims[:-2], tb.dims[:-2])
    policies = ta.policies if ta.policies.accum is not None else tb.policies
    dtype = accumulator(ta.dtype, policies)
    rows = ta.dims[-2:-1]  # none for a vector
    columns = tb.dims[-1:] if tb.rank > 1 else ()
    return call.emit("matmul", (a, b), TensorType((*batch, *rows, *columns), dtype))


#: The longest K of an ``i8 @ i8`` product: its i32 sum, of K products of at most 2^14
#: (``-128 * -128``), cannot overflow below 2^17 (docs/numerics.md, W8A8).
INT8_MAX_K = 2**17 - 1


def _int8_depth(call: OpCall, k: Dim) -> None:
    """Refuse, or check at run time, a K for which an i8 product's i32 sum could wrap."""
    if k.constant is None:
        call.emitter.guard(
            "at_most", k, Dim.const(INT8_MAX_K),
            f"an i8 product's inner dimension (its i32 sum is exact up to {INT8_MAX_K})",
            call.span,
        )  # fmt: skip
    elif k.constant > INT8_MAX_K:
        raise call.error(
            f"an i8 product's inner dimension is {k.constant}, more than {INT8_MAX_K}: its "
            "i32 sum could overflow; split K and add the partial products in i64 or f64, "
            "or cast the operands to a float dtype"
        )


# ----------------------------------------------------------------- unary math

UNARY_DOCS = {
    "exp": "e to the power ``x``",
    "log": "natural logarithm",
    "sqrt": "square root",
    "rsqrt": "``1 / sqrt(x)``",
    "tanh": "hyperbolic tangent",
    "sigmoid": "``1 / (1 + exp(-x))``",
    "gelu": "GELU, the tanh approximation used by GPT-2 and BERT",
    "silu": "``x * sigmoid(x)`` (swish)",
    "abs": "absolute value",
    "round": "rounding to the nearest integer, ties to even (as Python's ``round``)",
    "sin": "sine (of radians: the tables of ``rotary_embedding``)",
    "cos": "cosine (of radians)",
    "tan": "tangent (of radians)",
    "exp2": "2 to the power ``x``",
    "log2": "base-2 logarithm",
    "log1p": "``log(1 + x)``",
    "expm1": "``exp(x) - 1``",
    "erf": "error function",
    "floor": "rounding down, to the largest integer not above ``x``",
    "ceil": "rounding up, to the smallest integer not below ``x``",
}

#: What the documentation of some unary math adds to the common text.
_UNARY_NOTES = {
    "log1p": "Exact for ``x`` near 0, where ``log(1.0 + x)`` loses the digits of ``x``.",
    "expm1": "Exact for ``x`` near 0, where ``exp(x) - 1.0`` cancels.",
    "erf": "``2/sqrt(pi)`` times the integral of ``exp(-t**2)`` from 0 to ``x``.",
}

#: Unary math that is the identity on integers, as numpy (2.x) and PyTorch define it: the
#: integer tensor itself, where the other unary math needs floating-point inputs.
_INTEGER_IDENTITY = frozenset({"floor", "ceil"})


def _sigmoid(x: float) -> float:
    """``1 / (1 + e^-x)``, without overflow on either side."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    return math.exp(x) / (1.0 + math.exp(x))


#: The unary math of a number, which the analyser computes (``q @ k.T / sqrt(64.0)``).
_FOLD: dict[str, Callable[[float], float]] = {
    "exp": math.exp,
    "log": math.log,
    "sqrt": math.sqrt,
    "rsqrt": lambda x: 1.0 / math.sqrt(x),
    "tanh": math.tanh,
    "sigmoid": _sigmoid,
    "gelu": lambda x: 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x * _sigmoid(x),
    "abs": abs,
    "round": lambda x: float(round(x)),
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "exp2": lambda x: 2.0**x,
    "log2": math.log2,
    "log1p": math.log1p,
    "expm1": math.expm1,
    "erf": math.erf,
    "floor": lambda x: float(math.floor(x)),
    "ceil": lambda x: float(math.ceil(x)),
}


def folded(kind: str, value: Any) -> Const | str | None:
    """``kind`` of a number, computed now: a ``Const``, or why it has none (``log(0.0)``);
    None when ``kind`` is not unary math of a number."""
    if kind not in _FOLD or not isinstance(value, Const) or type(value.value) not in (int, float):
        return None
    try:
        return Const(_FOLD[kind](float(value.value)))
    except (ValueError, ZeroDivisionError, OverflowError):
        return f"{kind}({value.value}) has no finite value"


def _as_scalar(value: Any, call: OpCall) -> Any:
    """A size as the float it is (``sqrt(q.shape[-1])`` means ``sqrt(float(D))``):
    a number when the size is known, a run-time scalar otherwise."""
    if not isinstance(value, DimValue):
        return value
    if value.dim.constant is not None:
        return Const(float(value.dim.constant))
    return call.emit("dim_to_float", (), ScalarType("float"), attrs=(("dim", value.dim),))


def _unary(kind: str) -> Callable[[OpCall], object]:
    def rule(call: OpCall) -> object:
        x = _as_scalar(call.raw("x"), call)
        number = folded(kind, x)
        if isinstance(number, str):
            raise call.error(number, at="x")
        if number is not None:
            return number
        if isinstance(x, Value) and x.type == ScalarType("float"):
            return call.emit(kind, (x,), x.type)
        if kind in _INTEGER_IDENTITY and not call.tensor("x").type.dtype.is_float:
            return call.tensor("x")
        if kind == "abs" and not call.tensor("x").type.dtype.is_float:
            x = call.tensor("x")  # numpy's and PyTorch's: an integer, of the same dtype
            return _then(call, "where", _then(call, "less", x, 0), _then(call, "neg", x), x)
        x = _float_input(call, "x")
        return call.emit(kind, (x,), elementwise_type(x))

    inputs = (
        "Floating-point inputs, same shape and dtype; of an integer tensor, the tensor itself "
        "(numpy's and PyTorch's). Its gradient is zero, as PyTorch's is"
        if kind in _INTEGER_IDENTITY
        else (
            "Any numeric dtype; same shape and dtype"
            if kind == "abs"
            else "Floating-point inputs; same shape and dtype"
        )
    )
    note = f" {_UNARY_NOTES[kind]}" if kind in _UNARY_NOTES else ""
    rule.__doc__ = (
        f"Elementwise {UNARY_DOCS[kind]}.{note} {inputs}. Of a "
        "number, a number the compiler computes (``q @ k.T * rsqrt(64.0)``); of a float "
        "scalar or a size, a scalar that each kernel reading it computes "
        "(``q @ k.T / sqrt(float(D))``)."
    )
    return rule


for _kind in [k for k in UNARY_DOCS if k != "gelu"]:
    register(_kind, P("x"))(_unary(_kind))

_gelu_tanh = _unary("gelu")


@register("gelu", P("x"), P("approximate", "tanh", keyword_only=True))
def _gelu(call: OpCall) -> object:
    """Elementwise GELU. By default the tanh approximation, ``0.5 x (1 + tanh(sqrt(2/pi)
    (x + 0.044715 x^3)))``, which GPT-2 and BERT were trained with and JAX's ``gelu``
    computes; ``approximate="none"`` (or ``False``) is the exact ``0.5 x (1 + erf(x /
    sqrt(2)))``, PyTorch's default, and ``"tanh"`` (or ``True``) names the default. The two
    differ by at most 5e-4. Floating-point inputs; same shape and dtype."""
    how = call.raw("approximate")
    value = how.value if isinstance(how, Const) else None
    if value not in ("tanh", "none", True, False):
        raise call.error(
            f'approximate is "tanh" (or True) or "none" (or False), not '
            f"{call.ev('approximate').text}",
            at="approximate",
        )
    if value in ("tanh", True):
        return _gelu_tanh(call)
    x = _as_scalar(call.raw("x"), call)
    if isinstance(x, Const) and type(x.value) in (int, float):
        return Const(0.5 * x.value * (1.0 + math.erf(x.value / math.sqrt(2.0))))
    if not (isinstance(x, Value) and x.type == ScalarType("float")):
        x = _float_input(call, "x")
    half = _then(call, "mul", x, 0.5)
    return _then(
        call,
        "mul",
        half,
        _then(call, "add", _then(call, "erf", _then(call, "mul", x, 1.0 / math.sqrt(2.0))), 1.0),
    )


@register("relu", P("x"))
def _relu(call: OpCall) -> object:
    """Elementwise ``max(x, 0)``. Any numeric dtype; same shape and dtype."""
    x = call.tensor("x")
    return call.emit("relu", (x,), elementwise_type(x))


# ----------------------------------------------------------------- compositions
#
# Operations made of others: each rule checks its inputs, then emits the ops it is
# made of through their own rules, so that they fuse, fold and differentiate as those
# ops written out do, and every backend computes them with no kernel of their own.


def _then(call: OpCall, kind: str, *args: Any, **keywords: Any) -> Any:
    """``kind`` of ``args`` by its own rule, at the call's line and under its name."""
    inner = _call_as(call, kind, *args, **keywords)
    return inner.spec.rule(inner)


def _call_as(call: OpCall, kind: str, *args: Any, **keywords: Any) -> OpCall:
    """A call of ``kind`` with ``args``, at the call's line and under its name, for a
    composition that needs part of that op's rule (its checks) rather than the op."""
    spec = GRAPH_OPS[kind]
    bound = dict(zip((p.name for p in spec.params), args, strict=False)) | keywords
    evs = {name: _as_ev(call, value) for name, value in bound.items()}
    return OpCall(spec, evs, call.span, call.emitter, call.shown)


def _as_ev(call: OpCall, value: Any) -> Ev:
    """An argument of an op that a composition emits, as the analyser passes one."""
    if isinstance(value, Ev):
        return value
    if isinstance(value, Value):
        shown = call.ev("x").text if call.given("x") else call.shown
        return Ev(value, call.span, value.name or shown)
    if isinstance(value, DType):
        return Ev(DTypeRef(value), call.span, str(value))
    return Ev(value if isinstance(value, Const) else Const(value), call.span, repr(value))


def _positive(call: OpCall, name: str) -> float:
    value = call.number(name)
    if not value > 0:
        raise call.error(f"'{name}' must be positive, not {value}", at=name)
    return value


@register("softplus", P("x"), P("beta", 1.0), P("threshold", 20.0))
def _softplus(call: OpCall) -> object:
    """Elementwise ``log(1 + exp(beta * x)) / beta``, as PyTorch's ``softplus``, in its
    stable form: ``x`` itself where ``beta * x`` is above ``threshold`` (where the two
    agree to f32's precision), ``log1p(exp(beta * x)) / beta`` elsewhere, so that it never
    overflows and keeps the small values of a large negative ``x``. Float inputs; same
    shape and dtype; ``beta`` (positive) and ``threshold`` are numbers. Its gradient is
    ``sigmoid(beta * x)``, and 1 above the threshold: finite everywhere."""
    x = _float_input(call, "x")
    beta, threshold = _positive(call, "beta"), call.number("threshold")
    scaled = x if beta == 1.0 else _then(call, "mul", x, beta)
    # exp of at most the threshold: the branch that `where` drops never overflows, so
    # its gradient (zero times exp's) is never 0 * inf
    soft = _then(call, "log1p", _then(call, "exp", _then(call, "minimum", scaled, threshold)))
    if beta != 1.0:
        soft = _then(call, "div", soft, beta)
    return _then(call, "where", _then(call, "greater", scaled, threshold), x, soft)


@register("leaky_relu", P("x"), P("negative_slope", 0.01))
def _leaky_relu(call: OpCall) -> object:
    """Elementwise ``x`` where ``x > 0``, else ``negative_slope * x``, as PyTorch's
    ``leaky_relu``: ``where(x > 0.0, x, negative_slope * x)``. Float inputs; same shape
    and dtype; ``negative_slope`` is a number. At 0 its gradient is ``negative_slope``
    (PyTorch's)."""
    x = _float_input(call, "x")
    slope = call.number("negative_slope")
    return _then(call, "where", _then(call, "greater", x, 0.0), x, _then(call, "mul", x, slope))


@register("elu", P("x"), P("alpha", 1.0))
def _elu(call: OpCall) -> object:
    """Elementwise ``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)``, as PyTorch's
    ``elu``, with ``expm1`` (exact near 0, and of at most 0, so the branch not taken never
    overflows). Float inputs; same shape and dtype; ``alpha`` is a number. At 0 its
    gradient is ``alpha`` (PyTorch's)."""
    x = _float_input(call, "x")
    alpha = call.number("alpha")
    negative = _then(call, "mul", _then(call, "expm1", _then(call, "minimum", x, 0.0)), alpha)
    return _then(call, "where", _then(call, "greater", x, 0.0), x, negative)


@register("square", P("x"))
def _square(call: OpCall) -> object:
    """Elementwise ``x * x``, as numpy's and PyTorch's ``square``. Any numeric dtype; same
    shape and dtype."""
    x = call.tensor("x")
    return _then(call, "mul", x, x)


@register("reciprocal", P("x"))
def _reciprocal(call: OpCall) -> object:
    """Elementwise ``1 / x``, as PyTorch's ``reciprocal``: of an integer tensor, an f32
    one (true division, as ``/`` is). Same shape; ``1 / 0.0`` is ``inf``."""
    x = call.tensor("x")
    return _then(call, "div", 1.0, x)


@register("sign", P("x"))
def _sign(call: OpCall) -> object:
    """Elementwise 1 where ``x > 0``, -1 where ``x < 0``, and 0 where ``x`` is 0, as numpy's
    and PyTorch's ``sign``; NaN where ``x`` is NaN, as numpy's (PyTorch's gives 0): that
    is ``x * 0``, which also makes its gradient zero, as PyTorch's is. Any numeric dtype;
    same shape and dtype."""
    x = call.tensor("x")
    one = 1.0 if x.type.dtype.is_float else 1
    zero = _then(call, "mul", x, 0.0 if x.type.dtype.is_float else 0)
    below = _then(call, "where", _then(call, "less", x, 0), -one, zero)
    return _then(call, "where", _then(call, "greater", x, 0), one, below)


def _classify(kind: str) -> Callable[[OpCall], object]:
    """``isnan``, ``isinf`` or ``isfinite``: a comparison of ``x`` (with itself, or of its
    magnitude with infinity). Of integers, which are never NaN nor infinite, the same
    comparisons hold everywhere or nowhere."""
    what = {
        "isnan": "NaN",
        "isinf": "infinite (either sign)",
        "isfinite": "neither NaN nor infinite",
    }

    def rule(call: OpCall) -> object:
        x = call.tensor("x")
        if kind == "isnan" or not x.type.dtype.is_float:
            return _then(call, "equal" if kind == "isfinite" else "not_equal", x, x)
        return _then(call, "equal" if kind == "isinf" else "less", _then(call, "abs", x), math.inf)

    rule.__doc__ = (
        f"Elementwise: a mask true where ``x`` is {what[kind]}, as numpy's ``{kind}``; like "
        "a comparison, a mask that ``where`` and ``cast`` read "
        f"(``cast({kind}(x), f32)`` is 1.0 and 0.0). Any numeric dtype; of integers, "
        + ("true everywhere." if kind == "isfinite" else "false everywhere.")
    )
    return rule


for _kind in ("isnan", "isinf", "isfinite"):
    register(_kind, P("x"))(_classify(_kind))


def _like(fill: float | None) -> Callable[[OpCall], object]:
    """``zeros_like`` (0), ``ones_like`` (1) or ``full_like`` (None: its ``fill_value``):
    ``where(x == x, v, v)``, elementwise math that every kernel computes (there is no fill
    op on tensors), ``v`` wherever ``x`` is NaN too."""

    def rule(call: OpCall) -> object:
        x = call.tensor("x")
        value: Any = fill
        if fill is None:
            value = call.raw("fill_value")
            scalar = isinstance(value, Value) and value.type in (
                ScalarType("float"), ScalarType("int")
            )  # fmt: skip
            if not scalar and not (isinstance(value, Const) and type(value.value) in (int, float)):
                raise call.error(
                    f"'fill_value' must be a number or a scalar parameter, not {describe(value)}",
                    at="fill_value",
                )
            value = call.ev("fill_value")
        dtype = call.dtype("dtype") if call.given("dtype") else x.type.dtype
        filled = _then(call, "where", _then(call, "equal", x, x), value, value)
        return filled if filled.type.dtype == dtype else _then(call, "cast", filled, dtype)

    what = {0.0: "zeros", 1.0: "ones", None: "``fill_value``"}[fill]
    name = {0.0: "zeros_like", 1.0: "ones_like", None: "full_like"}[fill]
    rule.__doc__ = (
        f"A tensor of ``x``'s shape holding {what}, as numpy's and PyTorch's ``{name}``: of "
        "``x``'s dtype, or of ``dtype`` where given (a value is converted as ``cast`` "
        "converts it)"
        + ("; ``fill_value`` is a number or a float or int parameter" if fill is None else "")
        + ". No gradient flows through it (nor through PyTorch's)."
    )
    return rule


register("zeros_like", P("x"), P("dtype", None))(_like(0.0))
register("ones_like", P("x"), P("dtype", None))(_like(1.0))
register("full_like", P("x"), P("fill_value"), P("dtype", None))(_like(None))


# ----------------------------------------------------------------- reductions


#: What a reduction's ``axis`` may be, for its documentation.
_AXES = (
    "a tuple of axes reduces them all, in any order: ``axis=(0, 2)`` of ``[A, B, C]`` "
    "reduces the rows of ``C``, then the ``[A, B]`` partial results over ``A``. Without "
    "``axis`` (or with ``axis=None``) it reduces every axis, to a 0-d tensor, as numpy "
    "and PyTorch do; on a tensor of rank 2 or more that warns, since the default used to "
    "be the last axis: write ``axis=-1`` for that."
)
#: One reduction over one axis: ``(call, x, axis, keepdims)`` to the reduced value.
Reduce = Callable[[OpCall, Value, int, bool], Value]


def _over_axes(call: OpCall, x: Value, reduce: Reduce) -> Value:
    """``reduce`` over the ``axis`` and with the ``keepdims`` of the call. A tuple of axes
    is reduced one run of adjacent axes at a time, each run merged (a view), the last
    run first: of ``[A, B, C]`` over ``(0, 2)``, the rows of ``C`` and then the columns
    of the ``[A, B]`` partial results, so that the large pass is a row reduction and no
    copy of ``x`` is made. Max and min are exact so; sums are reassociated, as any
    parallel sum is; a mean of means over equal groups is the mean."""
    axes = call.raw("axis")
    keepdims = call.const("keepdims", bool)
    if isinstance(axes, Const) and axes.value is None:
        _all_axes_by_default(call, x, keepdims)
        axes = Const(tuple(range(x.type.rank)))
    if not (isinstance(axes, Const) and isinstance(axes.value, (tuple, list))):
        return reduce(call, x, call.axis("axis", x.type.rank), keepdims)
    rank, dims = x.type.rank, x.type.dims
    whole = all(isinstance(a, int) and not isinstance(a, bool) for a in axes.value)
    if not axes.value or not whole or not all(-rank <= a < rank for a in axes.value):
        raise call.error(f"axes {tuple(axes.value)} are not axes of a rank-{rank} value", at="axis")
    picked = sorted({a % rank for a in axes.value})
    if len(picked) != len(axes.value):
        raise call.error(f"axes {tuple(axes.value)} name an axis twice", at="axis")
    runs: list[list[int]] = []
    for a in picked:
        if runs and runs[-1][-1] == a - 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    for run in reversed(runs):
        first, last = run[0], run[-1]
        if first != last:
            d = x.type.dims
            shape = (*d[:first], math.prod(d[first : last + 1], start=Dim.const(1)), *d[last + 1 :])
            x = call.emit("reshape", (x,), TensorType(shape, x.type.dtype, x.type.policies),
                          attrs=(("shape", shape),))  # fmt: skip
        x = reduce(call, x, first, False)
    if not keepdims:
        return x
    kept = tuple(Dim.const(1) if i in picked else d for i, d in enumerate(dims))
    return call.emit("reshape", (x,), x.type.with_(dims=kept), attrs=(("shape", kept),))


def _all_axes_by_default(call: OpCall, x: Value, keepdims: bool) -> None:
    """Without ``axis=``, a reduction reduces every axis, as numpy's and PyTorch's do.
    It used to reduce the last one only, so a program that relied on that would now
    compute another number: where the two differ (a rank of 2 or more) the call warns,
    and tells the analyser what the old default gave, so that a declared result of
    that shape is an error that says to write ``axis=-1``. ``axis=None`` says "every
    axis" without the warning."""
    if call.given("axis") or x.type.rank < 2:
        return
    old = (*x.type.dims[:-1], *((Dim.const(1),) if keepdims else ()))
    call.warn(
        f"without axis=, this reduces every axis of {dims_text(x.type.dims)}, as numpy and "
        "PyTorch do (it used to reduce only the last one): write axis=-1 for the last "
        "axis, or axis=None for every axis"
    )
    call.emitter.reduced_every_axis(old, call.span)


def _one_axis(kind: str, keeps_dtype: bool) -> Reduce:
    """The reduction ``kind`` over one axis, in its result dtype."""

    def one(call: OpCall, x: Value, axis: int, keepdims: bool) -> Value:
        narrow = x.type.policies.accum
        if not keeps_dtype and narrow is not None and narrow.bits == 16:
            raise call.error(
                f"@accum({narrow}) applies to products (matmul): {kind} accumulates in f32; "
                "drop the policy or write @accum(f32)",
                at="x",
            )
        dtype = x.type.dtype if keeps_dtype else accumulator(x.type.dtype, x.type.policies)
        if kind == "sum" and x.type.dtype != dtype:  # the terms in the accumulation dtype
            x = call.emit("cast", (x,), TensorType(x.type.dims, dtype), attrs=(("dtype", dtype),))
        dims = _reduce_dims(x.type.dims, axis, keepdims)
        return call.emit(
            kind, (x,), TensorType(dims, dtype), attrs=(("axis", axis), ("keepdims", keepdims))
        )

    return one


#: The reductions that also read a mask, as numpy's and PyTorch's: ``(x > 0).sum()``
#: counts the true elements (an i32), ``mean`` gives their fraction (an f32).
COUNTING = {"sum": I32, "mean": F32}


def _reduction(kind: str, keeps_dtype: bool) -> Callable[[OpCall], object]:
    one = _one_axis(kind, keeps_dtype)

    def rule(call: OpCall) -> object:
        x = call.tensor("x")
        if is_mask(x):
            dtype = COUNTING[kind]
            x = call.emit("cast", (x,), TensorType(x.type.dims, dtype), attrs=(("dtype", dtype),))
        return _over_axes(call, x, one)

    what = {"sum": "Sum", "max": "Maximum", "mean": "Mean"}[kind]
    dtype = (
        "Keeps the input dtype."
        if keeps_dtype
        else "The result has the accumulation dtype (f32 for floats, i32 for integers)."
    )
    notes = {
        "sum": " Over an empty axis it is 0. Of a mask, the count of its true elements (an "
        "i32), as numpy's and PyTorch's ``(x > 0).sum()``.",
        "max": " Over an empty axis it is -inf (numpy and PyTorch raise): the identity of "
        "the maximum, which ``any`` of no element (False) relies on.",
        "mean": " Over an empty axis it is NaN (0/0), as numpy's. Of a mask, the fraction "
        "of its true elements (an f32).",
    }[kind]
    rule.__doc__ = f"{what} over ``axis``, dropping it unless ``keepdims``; {_AXES} {dtype}{notes}"
    return rule


for _kind, _keeps in (("sum", False), ("max", True), ("mean", False)):
    register(_kind, P("x"), P("axis", None), P("keepdims", False))(_reduction(_kind, _keeps))


@register("min", P("x"), P("axis", None), P("keepdims", False))
def _min(call: OpCall) -> object:
    """Minimum over ``axis``, dropping it unless ``keepdims``; as for ``max``, a tuple of
    axes reduces them all, and no ``axis`` every axis. Keeps the input dtype. It is
    ``-max(-x)``, exactly: the maximum's kernels, negating where the first loads and the
    last stores. Over an empty axis it is +inf (numpy and PyTorch raise)."""
    x = call.tensor("x")
    top = _over_axes(call, call.emit("neg", (x,), elementwise_type(x)), _one_axis("max", True))
    return call.emit("neg", (top,), top.type)


def _softmax(kind: str) -> Callable[[OpCall], object]:
    def rule(call: OpCall) -> object:
        x = _float_input(call, "x")
        axis = call.axis("axis", x.type.rank)
        return call.emit(kind, (x,), elementwise_type(x), attrs=(("axis", axis),))

    rule.__doc__ = (
        "Softmax over ``axis`` (default: the last); same shape and dtype, computed in f32."
        + (
            " Subtracts the row maximum first, so large inputs cannot overflow."
            if kind == "softmax_safe"
            else ""
        )
    )
    return rule


register("softmax", P("x"), P("axis", -1))(_softmax("softmax"))
register("softmax_safe", P("x"), P("axis", -1))(_softmax("softmax_safe"))


@register("log_softmax", P("x"), P("axis", -1))
def _log_softmax(call: OpCall) -> object:
    """``log(softmax(x))`` over ``axis`` (default: the last), as PyTorch's ``log_softmax``:
    ``x - max(x) - log(sum(exp(x - max(x))))``, computed in f32, so it neither overflows
    nor gives ``-inf`` where the softmax rounds to 0; same shape and dtype. The loss of
    a classifier reads it (``-sum(t * log_softmax(logits), axis=-1)``)."""
    x = _float_input(call, "x")
    axis = call.axis("axis", x.type.rank)
    return call.emit("log_softmax", (x,), elementwise_type(x), attrs=(("axis", axis),))


@register("logsumexp_safe", P("x"), P("axis", -1), P("keepdims", False))
def _logsumexp(call: OpCall) -> object:
    """``log(sum(exp(x)))`` over ``axis``, computed with the maximum subtracted first so it
    cannot overflow (an infinite maximum is not: a row of ``-inf`` gives ``-inf``, one
    holding ``inf`` gives ``inf``). Float inputs; the result is f32 with ``axis``
    dropped."""
    x = _float_input(call, "x")
    axis = call.axis("axis", x.type.rank)
    keepdims = call.const("keepdims", bool)
    return call.emit(
        "logsumexp_safe", (x,), TensorType(_reduce_dims(x.type.dims, axis, keepdims), F32),
        attrs=(("axis", axis), ("keepdims", keepdims)),
    )  # fmt: skip


@register("logsumexp", P("x"), P("axis", -1), P("keepdims", False))
def _logsumexp_plain(call: OpCall) -> object:
    """``log(sum(exp(x)))`` over ``axis`` (default: the last), as PyTorch's
    ``torch.logsumexp`` and SciPy's ``logsumexp``: the stable form, ``m + log(sum(exp(x -
    m)))`` with ``m`` the maximum, so that neither large nor very negative inputs overflow
    or lose the result; a row of ``-inf`` gives ``-inf`` and one holding ``inf`` gives
    ``inf``, as theirs do. It is ``logsumexp_safe``, whose ``_safe`` names that same stable
    form (as ``softmax_safe``'s does); there is no unstable one. Float inputs; the result
    is f32, ``axis`` dropped unless ``keepdims``. One axis; SciPy's default of every axis
    is ``logsumexp(x.reshape(-1))``."""
    spec = GRAPH_OPS["logsumexp_safe"]
    return spec.rule(OpCall(spec, call.args, call.span, call.emitter, call.shown))


def _moment(root: bool) -> Callable[[OpCall], object]:
    """``var``, or ``std`` (``root``): the mean of the squared deviations from the mean,
    two passes over ``x`` as numpy computes it (not ``mean(x*x) - mean(x)**2``, which
    cancels), divided by ``n - ddof`` instead of ``n`` where ``ddof`` is given."""

    def rule(call: OpCall) -> object:
        x = call.tensor("x")
        if not x.type.dtype.is_float:  # numpy's: the variance of integers is a float
            x = _then(call, "cast", x, F32)
        ddof = call.const("ddof", int)
        keepdims = call.const("keepdims", bool)
        axis = call.ev("axis") if call.given("axis") else Const(None)
        deviation = _then(call, "sub", x, _then(call, "mean", x, axis, True))
        squares = _then(call, "mul", deviation, deviation)
        if ddof == 0:
            result = _then(call, "mean", squares, axis, keepdims)
        else:
            count = _reduced_count(call, x, axis) - ddof
            if count.constant is not None and count.constant <= 0:
                raise call.error(
                    f"ddof={ddof} leaves {count.constant} degrees of freedom: it must be less "
                    "than the number of elements reduced",
                    at="ddof",
                )
            divisor = _as_scalar(DimValue(count), call)
            result = _then(call, "div", _then(call, "sum", squares, axis, keepdims), divisor)
        return _then(call, "sqrt", result) if root else result

    what = "Standard deviation" if root else "Variance"
    rule.__doc__ = (
        f"{what} over ``axis``, as numpy's ``{'std' if root else 'var'}``: "
        f"{'the square root of ' if root else ''}the mean of "
        "``(x - mean(x))**2``, computed in two passes (so that a large mean does not cancel "
        "the digits of a small spread). ``axis`` and ``keepdims`` are ``mean``'s (a tuple "
        "of axes, or none for every axis); ``ddof`` (numpy's name for PyTorch's "
        "``correction``) divides by ``n - ddof`` instead of ``n``: its default is 0, the "
        "population variance, while PyTorch's ``var`` and ``std`` default to 1, the sample "
        "variance: "
        "write ``ddof=1`` for PyTorch's numbers. The result is f32 (of integers too)."
        + (" Its gradient at a constant row is NaN (0/0), as PyTorch's is." if root else "")
    )
    return rule


def _reduced_count(call: OpCall, x: Value, axis: Any) -> Dim:
    """How many elements of ``x`` each result of a reduction over ``axis`` (a mean's,
    which has checked it) reads: the product of the reduced dims."""
    value = axis.value if isinstance(axis, Ev) else axis
    rank = x.type.rank
    axes = value.value if isinstance(value.value, (tuple, list)) else (value.value,)
    picked = range(rank) if value.value is None else {a % rank for a in axes}
    return math.prod((x.type.dims[a] for a in picked), start=Dim.const(1))


for _kind, _root in (("var", False), ("std", True)):
    register(_kind, P("x"), P("axis", None), P("keepdims", False), P("ddof", 0, keyword_only=True))(
        _moment(_root)
    )


#: The vector norms ``norm`` takes: numpy's ``ord``, PyTorch's ``p``.
_NORMS = {None: "two", 2: "two", "fro": "two", 1: "one", math.inf: "inf"}


@register("norm", P("x"), P("ord", None), P("axis", None), P("keepdims", False),
          P("p", None, keyword_only=True))  # fmt: skip
def _norm(call: OpCall) -> object:
    """The vector norm over ``axis``, as numpy's ``linalg.norm`` and PyTorch's ``norm``:
    ``ord`` (PyTorch's ``p``) 2, the default, is ``sqrt(sum(x * x))`` (over every axis
    without ``axis``: the Frobenius norm of a matrix, as both give), 1 is ``sum(abs(x))``
    and ``inf`` is ``max(abs(x))``. ``axis`` and ``keepdims`` are ``sum``'s (a tuple of
    axes reads them as one vector: a matrix norm other than Frobenius's, numpy's
    ``ord=2`` over two axes, is not computed). The result is f32 (of integers too). The
    gradient of the 2-norm of a zero vector is 0, as PyTorch's."""
    x = call.tensor("x")
    if not x.type.dtype.is_float:
        x = _then(call, "cast", x, F32)
    given = "p" if call.given("p") else "ord"
    if call.given("p") and call.given("ord"):
        raise call.error("give the norm's order once: ord (numpy's name) or p (PyTorch's)",
                         at="p")  # fmt: skip
    raw = call.raw(given)
    order = raw.value if isinstance(raw, Const) else raw
    order = order if not isinstance(order, float) or not order.is_integer() else int(order)
    if order not in _NORMS:
        raise call.error(
            f"ord={order!r} is not a vector norm it computes: 2 (the default), 1 or inf",
            at=given,
        )
    axis = call.ev("axis") if call.given("axis") else Const(None)
    keepdims = call.const("keepdims", bool)
    if _NORMS[order] == "two":
        # sqrt's slope at 0 is infinite: a zero vector's gradient is 0, as PyTorch's, by
        # taking the root of 1 there (a NaN sum is not 0, and stays NaN)
        squares = _then(call, "sum", _then(call, "mul", x, x), axis, keepdims)
        nonzero = _then(call, "not_equal", squares, 0.0)
        root = _then(call, "sqrt", _then(call, "where", nonzero, squares, 1.0))
        return _then(call, "where", nonzero, root, 0.0)
    size = _then(call, "abs", x)
    return _then(call, "sum" if _NORMS[order] == "one" else "max", size, axis, keepdims)


def _arg_extreme(kind: str) -> Callable[[OpCall], object]:
    """``argmax`` or ``argmin``: of the positions where ``x`` is NaN (numpy's and PyTorch's
    NaN beats every number) or else equals its maximum (minimum), the first. Made of
    graph ops in f32, exact below 2**23 positions: ``i`` the element's index along the
    axis and ``n`` the axis's size, the key ``i`` at a NaN, ``i + n`` at an extreme and
    ``2n`` elsewhere; the smallest key, less ``n`` where at least ``n``, is the index."""
    extreme = "max" if kind == "argmax" else "min"

    def rule(call: OpCall) -> object:
        x = call.tensor("x")
        keepdims = call.const("keepdims", bool)
        if isinstance(call.raw("axis"), Const) and call.raw("axis").value is None:
            # one row of every element: the row kernels of a single axis
            whole = (Dim.const(1), math.prod(x.type.dims, start=Dim.const(1)))
            flat = call.emit("reshape", (x,), TensorType(whole, x.type.dtype),
                             attrs=(("shape", whole),))  # fmt: skip
            found = _first_extreme(call, flat, 1, extreme)
            dims = (Dim.const(1),) * x.type.rank if keepdims else ()
            return call.emit("reshape", (found,), found.type.with_(dims=dims),
                             attrs=(("shape", dims),))  # fmt: skip
        axis = call.axis("axis", x.type.rank)
        found = _first_extreme(call, x, axis, extreme)
        if keepdims:
            return found
        dims = _reduce_dims(x.type.dims, axis, False)
        return call.emit("reshape", (found,), found.type.with_(dims=dims), attrs=(("shape", dims),))

    what = "largest" if kind == "argmax" else "smallest"
    rule.__doc__ = (
        f"The index of the {what} element along ``axis``, as numpy's and PyTorch's "
        f"``{kind}``: an i32 tensor, ``axis`` dropped unless ``keepdims``; without ``axis`` "
        "(or with ``axis=None``), the index in the flattened tensor. Of equal elements, the "
        "first wins; a NaN wins over every number (the first NaN, as numpy and PyTorch "
        "take it). Any numeric dtype; the axis may hold up to 2**23 elements. An index "
        "carries no gradient: differentiated through, it contributes zero, as in PyTorch."
    )
    return rule


def _first_extreme(call: OpCall, x: Value, axis: int, extreme: str) -> Value:
    """The ``argmax`` (``extreme`` "max") or ``argmin`` of ``x`` along ``axis``, the axis
    kept (of size 1)."""
    size = x.type.dims[axis]
    n = _as_scalar(DimValue(size), call)
    stride = math.prod(x.type.dims[axis + 1 :], start=Dim.const(1))
    index = call.emit("index_along", (x,), TensorType(x.type.dims, F32),
                      attrs=(("stride", stride), ("size", size)))  # fmt: skip
    top = _then(call, extreme, x, axis, True)
    twice = _as_scalar(DimValue(size * 2), call)
    picked = _then(call, "where", _then(call, "equal", x, top), _then(call, "add", index, n), twice)
    key = _then(call, "where", _then(call, "not_equal", x, x), index, picked)
    first = _then(call, "min", key, axis, True)
    found = _then(call, "where", _then(call, "greater_equal", first, n),
                  _then(call, "sub", first, n), first)  # fmt: skip
    return _then(call, "cast", found, I32)


for _kind in ("argmax", "argmin"):
    register(_kind, P("x"), P("axis", None), P("keepdims", False))(_arg_extreme(_kind))


@register("take_along_axis", P("x"), P("indices"), P("axis", -1))
def _take_along_axis(call: OpCall) -> object:
    """Elements of ``x`` picked along ``axis`` by an integer tensor, as numpy's
    ``take_along_axis``: ``out[i, j] = x[i, indices[i, j]]`` for ``axis=-1``, the gather
    that a loss from integer labels reads (``take_along_axis(logits, labels, axis=-1)`` of
    ``labels [N, 1]``). ``indices`` has ``x``'s rank and its sizes on the other axes; the
    result has ``indices``' shape and ``x``'s dtype. Where ``indices`` is a parameter, a
    value outside ``[0, x.shape[axis])`` is a ``ValueError`` before the launch, on every
    target; an index computed in the function is clamped into that range, so no read is
    ever out of bounds. Another axis than the last is gathered between transposes."""
    x, indices, axis = _along_axis(call)
    return _by_rows(call, "take_along_axis", axis, (x, indices), indices.type.dims)


@register("put_along_axis", P("x"), P("indices"), P("values"), P("axis", -1))
def _put_along_axis(call: OpCall) -> object:
    """``x`` with ``values`` written along ``axis`` where an integer tensor says, as
    numpy's ``put_along_axis`` but as a new tensor (``x`` is unchanged): ``out[i,
    indices[i, j]] = values[i, j]`` for ``axis=-1``; where a row repeats an index, its
    last ``j`` wins, on every target. ``indices`` is checked as ``take_along_axis``'s;
    ``values`` has its shape; the result has ``x``'s shape and dtype."""
    return _scattered(call, "put_along_axis")


@register("scatter_add", P("x"), P("indices"), P("values"), P("axis", -1))
def _scatter_add(call: OpCall) -> object:
    """``x`` with ``values`` added along ``axis`` where an integer tensor says:
    ``out[i, indices[i, j]] += values[i, j]`` for ``axis=-1``, a repeated index summing
    its values in ``j`` order (numpy's ``add.at``), so that the result is the same on
    every target and every run. It is the gradient of ``take_along_axis``: the ``dy``
    of ``take_along_axis(x, indices)`` flows back to a finite ``x`` as
    ``scatter_add(x * 0.0, indices, dy)``. ``indices`` is checked as
    ``take_along_axis``'s; ``values`` has its shape; the result has ``x``'s shape and
    dtype."""
    return _scattered(call, "scatter_add")


def _scattered(call: OpCall, kind: str) -> Value:
    x, indices, axis = _along_axis(call)
    values = _float_input(call, "values")

    def mismatch() -> str:
        return (
            f"the values need the indices' shape; {call.shape_of('indices')}, "
            f"{call.shape_of('values')}"
        )

    if values.type.rank != indices.type.rank:
        raise call.error(mismatch(), at="values")
    for v, i in zip(values.type.dims, indices.type.dims, strict=True):
        call.same_dim(v, i, mismatch, f"values size {v} == {i}", ("indices", "values"))
    return _by_rows(call, kind, axis, (x, indices, values), x.type.dims)


def _along_axis(call: OpCall) -> tuple[Value, Value, int]:
    """(x, indices, axis) of a gather or a scatter along an axis: ``indices`` is an
    integer tensor of ``x``'s rank and its sizes on the other axes. An index parameter
    is checked against ``x.shape[axis]`` before the launch; the kernels clamp any other
    index into the row, which must then hold an element, so no access is out of
    bounds."""
    x = _float_input(call, "x")
    indices = call.tensor("indices")
    if indices.type.dtype.kind != "int":
        raise call.error(
            f"the indices must be an integer tensor; {call.ev('indices').text} is "
            f"{indices.type.dtype}", at="indices",
        )  # fmt: skip
    rank = x.type.rank
    if indices.type.rank != rank or rank == 0:
        raise call.error(
            f"the indices need x's rank, at least 1; {call.shape_of('x')}, "
            f"{call.shape_of('indices')}", at="indices",
        )  # fmt: skip
    axis = call.axis("axis", rank)
    for k in range(rank):
        if k != axis:
            call.same_dim(
                indices.type.dims[k], x.type.dims[k],
                lambda: f"the indices' sizes on the other axes are x's: {call.shape_of('x')}, "
                f"{call.shape_of('indices')}",
                f"indices size {indices.type.dims[k]} == {x.type.dims[k]}", ("x", "indices"),
            )  # fmt: skip
    bound = x.type.dims[axis]
    if not call.emitter.index_guard(indices, bound, call.shown, call.span) and not bound.constant:
        # an index the function computes is clamped into the axis: an empty one has no
        # element to clamp it to (the index would be -1)
        reason = f"{call.shown}: an index computed in the function needs an element to name"
        call.emitter.guard("at_least", bound, Dim.const(1), reason, call.span)
    return x, indices, axis


def _by_rows(
    call: OpCall, kind: str, axis: int, operands: tuple[Value, ...], dims: tuple[Dim, ...]
) -> Value:
    """The library row kernel ``kind`` along ``axis``, its result of ``dims`` in the
    first operand's dtype: another axis than the last is moved last by transposes and
    back, and a vector is the one row of itself viewed as ``[1, N]``."""
    rank = len(dims)
    perm = (*(k for k in range(rank) if k != axis), axis)
    if perm != tuple(range(rank)):
        back = tuple(perm.index(k) for k in range(rank))
        moved = tuple(_permuted(call, v, perm) for v in operands)
        row = _by_rows(call, kind, rank - 1, moved, tuple(dims[k] for k in perm))
        return _permuted(call, row, back)
    out = TensorType(dims, operands[0].type.dtype)
    if rank > 1:
        return call.emit(kind, operands, out)
    rows = tuple(_as_row(call, v) for v in operands)
    row = call.emit(kind, rows, TensorType((Dim.const(1), *dims), out.dtype))
    return call.emit("reshape", (row,), out, attrs=(("shape", out.dims),))


def _permuted(call: OpCall, x: Value, perm: tuple[int, ...]) -> Value:
    dims = tuple(x.type.dims[i] for i in perm)
    return call.emit("transpose", (x,), TensorType(dims, x.type.dtype), attrs=(("perm", perm),))


def _as_row(call: OpCall, v: Value) -> Value:
    dims = (Dim.const(1), *v.type.dims)
    return call.emit("reshape", (v,), TensorType(dims, v.type.dtype), attrs=(("shape", dims),))


def _norm(kind: str, with_bias: bool) -> Callable[[OpCall], object]:
    def rule(call: OpCall) -> object:
        x = _float_input(call, "x")
        operands = [x]
        last = x.type.dims[-1]
        present = []
        for name in ("weight", "bias") if with_bias else ("weight",):
            value = call.raw(name)
            if isinstance(value, Const) and value.value is None:
                continue
            param = call.tensor(name)
            if param.type.rank != 1:
                raise call.error(
                    f"'{name}' must have one dim, the normalised size {last}; "
                    f"{call.shape_of(name)}", at=name, notes=call.notes_for(name),
                )  # fmt: skip
            call.same_dim(
                param.type.dims[0], last,
                lambda name=name: f"'{name}' does not match the normalised dim: "
                f"{call.shape_of('x')}, {call.shape_of(name)}",
                f"{name} size {param.type.dims[0]} == {last}", ("x", name),
            )  # fmt: skip
            operands.append(param)
            present.append(name)
        epsilon = call.number("eps")
        if not epsilon > 0:
            raise call.error(f"eps must be positive, not {epsilon}", at="eps")
        attrs = (("eps", epsilon), ("weight", "weight" in present))
        if with_bias:
            attrs += (("bias", "bias" in present),)
        return call.emit(kind, tuple(operands), elementwise_type(x), attrs=attrs)

    name = "Layer" if with_bias else "RMS"
    scale = " times ``weight``, plus ``bias``" if with_bias else " times ``weight``"
    safe = (
        " The ``_safe`` form clamps the variance so a constant row cannot divide by zero."
        if kind.endswith("_safe")
        else ""
    )
    rule.__doc__ = (
        f"{name} normalisation over the last dim{scale} (each optional, shape ``[D]``). "
        f"Float inputs; same shape and dtype, computed in f32.{safe}"
    )
    return rule


for _kind in ("layernorm", "layernorm_safe"):
    register(_kind, P("x"), P("weight", None), P("bias", None), P("eps", 1e-5, keyword_only=True))(
        _norm(_kind, True)
    )
for _kind in ("rmsnorm", "rmsnorm_safe"):
    register(_kind, P("x"), P("weight", None), P("eps", 1e-6, keyword_only=True))(
        _norm(_kind, False)
    )


# ------------------------------------------------------------------ attention


def _kv_groups(
    call: OpCall, q: tuple[Dim, ...], k: tuple[Dim, ...], v: tuple[Dim, ...]
) -> Dim | None:
    """The number of k and v heads, where they are fewer than q's and each serves a
    group of q heads (grouped-query attention: Llama's, Mistral's): k's and v's head
    axis (third from the end) is another size than q's, and not 1 (which broadcasts).
    Sizes known at compile time must divide; a symbolic one (``q [B, H, S, D]``,
    ``k [B, G, S, D]``) adds the guard ``H % G == 0``, checked at run time. None where
    k and v have q's heads, or their head axes differ."""
    if len(q) < 3:
        return None
    heads, groups = q[-3], k[-3]
    if v[-3] != groups or groups in (Dim.const(1), heads):
        return None
    if heads.constant is not None and groups.constant is not None:
        if heads.constant % groups.constant:
            raise call.error(
                f"grouped-query attention needs k's and v's heads to divide q's: "
                f"{call.shape_of('q')}, {call.shape_of('k')} ({heads.constant} heads are not "
                f"a multiple of {groups.constant})",
                notes=call.notes_for("q", "k"),
            )
        return groups
    call.emitter.guard(
        "divisible", heads, groups,
        f"{call.shown}: grouped-query attention: q's heads are a multiple of k's and v's",
        call.span,
    )  # fmt: skip
    return groups


@register(
    "flash_attention", P("q"), P("k"), P("v"),
    P("causal", False, keyword_only=True), P("dropout", 0.0, keyword_only=True),
    P("scale", None, keyword_only=True),
)  # fmt: skip
def _flash_attention(call: OpCall) -> object:
    """Scaled dot-product attention, ``softmax(q @ k^T * scale) @ v``, without materialising
    the scores: ``q [..., Sq, D]``, ``k [..., Sk, D]``, ``v [..., Sk, Dv]`` give
    ``[..., Sq, Dv]`` in q's dtype (the library's kernel takes ``Dv == D`` only). k and
    v may have fewer heads than q: a head axis (third from the end) of ``G`` heads that
    divides q's ``H`` gives each k and v head to ``H/G`` q heads, head ``h`` to group
    ``h // (H/G)`` (grouped-query attention), and a batch dim of 1 serves every q
    (multi-query attention). ``H`` and ``G`` may be sizes (``q [B, H, S, D]``,
    ``k, v [B, G, S, D]``): each call then checks that ``G`` divides ``H``.
    ``causal`` masks the keys after each query, query ``i`` seeing keys ``0..i`` (the
    top-left corner, as PyTorch's ``is_causal``, when ``Sq != Sk``); ``dropout``
    (a probability, or a float parameter) drops attention weights and is an rng effect;
    ``scale`` (a number, or a float parameter) defaults to ``1/sqrt(D)``. Also available as
    ``ops.flash_attention``. ``flash_attention(q, cache, causal=..., scale=...)`` attends
    ``q [B, H_q, n, D]`` (the last ``n`` positions) to the positions a ``KVCache`` holds,
    as ``tessera.decode_attention`` does, split-K on the device (docs/kv-cache.md)."""
    tq, tv = call.tensor("q").type, call.tensor("v").type
    q, k, v, groups = attention_inputs(call)
    causal = call.const("causal", bool)
    operands = [q, k, v]
    attrs: tuple = (("causal", causal),)
    dropout = call.scalar("dropout", "float")
    effects: tuple[str, ...] = ()
    if isinstance(dropout, Const):
        if not 0.0 <= dropout.value < 1.0:
            raise call.error(
                f"dropout is a probability in [0, 1), not {dropout.value}", at="dropout"
            )
        if dropout.value:
            attrs += (("dropout", dropout.value),)
            effects = ("rng",)
    else:
        operands.append(dropout)
        attrs += (("dropout", "scalar"),)
        effects = ("rng",)
    scale = attention_scale(call)
    if isinstance(scale, Value):
        operands.append(scale)  # the last operand
        attrs += (("scale", "scalar"),)
    elif scale is not None:
        attrs += (("scale", scale),)
    out = TensorType((*q.type.dims[:-1], tv.dims[-1]), tq.dtype)
    o = call.emit("flash_attention", tuple(operands), out, attrs=attrs, effects=effects)
    if not groups:
        return o
    dims = (*tq.dims[:-1], tv.dims[-1])
    return call.emit("reshape", (o,), TensorType(dims, tq.dtype), attrs=(("shape", dims),))


def attention_inputs(call: OpCall) -> tuple[Value, Value, Value, Dim | None]:
    """``q``, ``k`` and ``v`` of a call with ``flash_attention``'s arguments, checked
    (ranks, batch and head dims, lengths, one dtype), and the number of k and v heads
    where they serve groups of q heads (None where not). Grouped, the three are views
    ``[..., G, H/G, S, D]`` of q and ``[..., G, 1, S, D]`` of k and v, whose products
    broadcast each k and v head over its group; else the arguments themselves."""
    q, k, v = call.tensor("q"), call.tensor("k"), call.tensor("v")
    for name, value in (("q", q), ("k", k), ("v", v)):
        if value.type.rank < 2:
            raise call.error(f"'{name}' needs at least 2 dims; {call.shape_of(name)}", at=name)
    tq, tk, tv = q.type, k.type, v.type
    if tq.rank != tk.rank or tq.rank != tv.rank:
        raise call.error(
            f"q, k and v must have the same rank: {call.shape_of('q')}, {call.shape_of('k')}, "
            f"{call.shape_of('v')}", notes=call.notes_for("q", "k", "v"),
        )  # fmt: skip
    groups = _kv_groups(call, tq.dims, tk.dims, tv.dims)
    for i in range(tq.rank - 2):
        for name, t in (("k", tk), ("v", tv)):
            if t.dims[i] == Dim.const(1) or (groups and i == tq.rank - 3):
                continue  # broadcast: one k and v for every q, or for each group of q heads
            call.same_dim(
                tq.dims[i], t.dims[i],
                lambda name=name: f"batch dims differ: {call.shape_of('q')}, "
                f"{call.shape_of(name)}",
                f"batch dim {i}", ("q", name),
            )  # fmt: skip
    call.same_dim(
        tq.dims[-1], tk.dims[-1],
        lambda: f"q and k head dims differ: {call.shape_of('q')}, {call.shape_of('k')}",
        "head dim", ("q", "k"),
    )  # fmt: skip
    call.same_dim(
        tk.dims[-2], tv.dims[-2],
        lambda: f"k and v lengths differ: {call.shape_of('k')}, {call.shape_of('v')}",
        "key length", ("k", "v"),
    )  # fmt: skip
    for name, t in (("k", tk), ("v", tv)):
        if t.dtype != tq.dtype:
            raise call.error(
                f"q, k and v must have one dtype: q is {tq.dtype}, {name} is {t.dtype}",
                at=name, notes=call.notes_for(name),
            )  # fmt: skip
    if groups:  # [..., G, H/G, S, D] of q, against [..., G, 1, S, D] of k and v: views
        q, k = (_heads_grouped(call, x, groups) for x in (q, k))
        v = k if v is call.tensor("k") else _heads_grouped(call, v, groups)  # one view of kv
    return q, k, v, groups


def attention_scale(call: OpCall) -> Value | float | None:
    """The ``scale`` argument of an attention: a float parameter, a positive number, or
    None where it was left out (``1/sqrt(D)``, D the head dim)."""
    scale = call.raw("scale")
    if isinstance(scale, Value) and scale.type == ScalarType("float"):
        return scale
    if isinstance(scale, Const) and scale.value is None:
        return None
    value = call.number("scale")
    if not value > 0:
        raise call.error(f"scale must be positive, not {value}", at="scale")
    return value


def _heads_grouped(call: OpCall, x: Value, groups: Dim) -> Value:
    """``x [..., H, S, D]`` as ``[..., groups, H/groups, S, D]``: q head ``h`` is
    ``[h // (H/groups), h % (H/groups)]``, next to k's and v's head ``h // (H/groups)``."""
    t = x.type
    dims = (*t.dims[:-3], groups, t.dims[-3] / groups, *t.dims[-2:])
    return call.emit("reshape", (x,), t.with_(dims=dims), attrs=(("shape", dims),))


@register("rotary_embedding", P("x"), P("cos"), P("sin"))
def _rotary(call: OpCall) -> object:
    """Rotary position embedding: rotates each pair of channels of ``x [..., S, D]`` by the
    angles whose cosines and sines are ``cos`` and ``sin``, each ``[S, D/2]``. ``D`` must be
    even. Same shape and dtype as ``x``."""
    x = _float_input(call, "x")
    if x.type.rank < 2:
        raise call.error(f"'x' needs at least 2 dims; {call.shape_of('x')}", at="x")
    seq, width = x.type.dims[-2], x.type.dims[-1]
    half = width / 2
    if not half.is_integral:
        if width.constant is not None:
            raise call.error(f"the last dim of x must be even, not {width}", at="x")
        call.emitter.guard(
            "divisible", width, Dim.const(2), "rotary_embedding: even head dim", call.span
        )
    operands = [x]
    for name in ("cos", "sin"):
        table = _float_input(call, name)
        want = (seq, half)
        message = functools.partial(_rotary_table_message, call, name, table, want, width)
        if table.type.rank != 2:
            raise call.error(message(), at=name)
        for got, expected in zip(table.type.dims, want, strict=True):
            call.same_dim(got, expected, message, f"{name} shape", ("x", name))
        operands.append(table)
    return call.emit("rotary_embedding", tuple(operands), elementwise_type(x))


def _rotary_table_message(
    call: OpCall, name: str, table: Value, want: tuple[Dim, ...], width: Dim
) -> str:
    """Why ``table`` is not a rotary table of ``want``'s dims, with the slice to write
    where it has whole rows (Hugging Face's tables repeat their first half)."""
    shown = "[S, D/2]" + ("" if dims_text(want) == "[S, D/2]" else f" = {dims_text(want)}")
    hint = ""
    if table.type.rank == 2 and table.type.dims[-1] == width:
        hint = (" (a table of whole rows, as Hugging Face's, repeats its first half: "
                f"pass {call.ev(name).text}[:, :D // 2], D the head dim)")  # fmt: skip
    return f"'{name}' must be {shown}, one angle per pair; {call.shape_of(name)}{hint}"


@register("split_qkv", P("qkv"), P("heads", keyword_only=True))
def _split_qkv(call: OpCall) -> object:
    """Split a fused projection ``[..., S, C]`` into ``q, k, v``, each
    ``[..., heads, S, C/(3*heads)]``: q is columns ``[0, C/3)`` read as ``[..., S, heads,
    D]`` with the heads moved in front, k and v the next thirds, as GPT-2's code splits
    them. ``heads`` is an integer (an ``int`` parameter type-checks, but no kernel takes
    one yet); ``C`` must be a multiple of ``3*heads`` (checked at run time when not
    known). Each of the three is a view of the projection, as a transpose that keeps the
    last axis is: ``flash_attention(q, k, v)``, a product (``q @ k.T``), and an
    elementwise op or a rotary embedding that reads one (``q * 0.5``), read it where it
    lies; any other reader gets a copy."""
    qkv = call.tensor("qkv")
    if qkv.type.rank < 2:
        raise call.error(f"'qkv' needs at least 2 dims; {call.shape_of('qkv')}", at="qkv")
    heads_value = call.raw("heads")
    if isinstance(heads_value, Value) and heads_value.type == ScalarType("int"):
        heads = Dim.sym(heads_value.name or "heads")
    else:
        heads = (
            call.dim("heads")
            if isinstance(heads_value, DimValue)
            else Dim.const(call.const("heads", int))
        )
        if heads.constant is not None and heads.constant <= 0:
            raise call.error(f"heads must be positive, not {heads}", at="heads")
    channels = qkv.type.dims[-1]
    width = channels / (heads * 3)
    if not width.is_integral:
        if channels.constant is not None and heads.constant is not None:
            raise call.error(
                f"the last dim, {channels}, is not a multiple of 3*heads = {3 * heads.constant}",
                at="qkv",
            )
        call.emitter.guard(
            "divisible", channels, heads * 3, "split_qkv: channels divide into 3*heads", call.span
        )
    one = TensorType((*qkv.type.dims[:-2], heads, qkv.type.dims[-2], width), qkv.type.dtype)
    n = len(one.dims)
    perm = (*range(n - 3), n - 2, n - 3, n - 1)  # [..., S, heads, D] with the heads in front
    return tuple(
        call.emit("split_qkv", (qkv,), one, attrs=(("part", part), ("perm", perm)))
        for part in range(3)
    )


@register("dropout", P("x"), P("p"), P("seed", keyword_only=True))
def _dropout(call: OpCall) -> object:
    """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)``. ``p`` is a
    number in [0, 1) or a float parameter; ``seed`` an integer or an ``int`` parameter
    (a step counter, say), which a training loop changes from call to call. The mask
    is Philox4x32-10 of the element's row-major position under the key ``seed``, the
    same on every backend: element ``n`` is kept when the top 24 bits of the first
    output word, as a fraction of 2^24, are at least ``p``. An rng effect: never
    reordered or merged."""
    x = call.tensor("x")
    return _dropped(call, x, "p", "seed")


def _dropped(call: OpCall, x: Value, rate: str, seed: str) -> Value:
    """The ``dropout`` op of ``x`` with the probability and seed the call's ``rate`` and
    ``seed`` arguments give. Scalar operands follow ``x``: the probability's, then the
    seed's."""
    operands, attrs = [x], []
    for name, kind, attr in ((rate, "float", "p"), (seed, "int", "seed")):
        value = call.scalar(name, kind)
        if isinstance(value, Const):
            attrs.append((attr, value.value))
        else:
            operands.append(value)
            attrs.append((attr, "scalar"))
    p = dict(attrs)["p"]
    if p != "scalar" and not 0.0 <= p < 1.0:
        raise call.error(f"{rate} is a probability in [0, 1), not {p}", at=rate)
    return call.emit("dropout", tuple(operands), elementwise_type(x), attrs=tuple(attrs),
                     effects=("rng",))  # fmt: skip


def dropout_operands(op: Op) -> tuple[Value, Any, Any]:
    """``x``, the probability and the seed of a ``dropout`` op as built above: each a
    Value or the constant its attribute holds."""
    scalars = iter(op.operands[1:])
    p, seed = (next(scalars) if op.attr(a) == "scalar" else op.attr(a) for a in ("p", "seed"))
    return op.operands[0], p, seed


@register(
    "residual", P("x"), P("y"), P("dropout", 0.0, keyword_only=True),
    P("seed", None, keyword_only=True),
)  # fmt: skip
def _residual(call: OpCall) -> object:
    """The residual connection ``x + dropout(y, dropout, seed=seed)``; ``y`` must have
    ``x``'s shape. Without ``dropout`` (or with 0) it is a plain add and takes no seed;
    the result dtype is the wider of the two."""
    x, y = call.tensor("x"), call.tensor("y")
    if x.type.rank != y.type.rank:
        raise call.error(
            f"x and y must have one shape: {call.shape_of('x')}, {call.shape_of('y')}",
            notes=call.notes_for("x", "y"),
        )
    for a, b in zip(x.type.dims, y.type.dims, strict=True):
        call.same_dim(
            a, b,
            lambda: f"x and y must have one shape: {call.shape_of('x')}, {call.shape_of('y')}",
            "residual shapes", ("x", "y"),
        )  # fmt: skip
    p = call.scalar("dropout", "float")
    if not (isinstance(p, Const) and p.value == 0.0):
        seed = call.raw("seed")
        if isinstance(seed, Const) and seed.value is None:
            raise call.error(
                "a residual with dropout needs a seed: residual(x, y, dropout=0.1, seed=step)",
                at="dropout",
            )
        y = _dropped(call, y, "dropout", "seed")
    dtype = promote(x.type.dtype, y.type.dtype)
    return call.emit("add", (x, y), TensorType(x.type.dims, dtype))


# ------------------------------------------------------------- shape and type


@register("cast", P("x"), P("dtype"), P("saturate", False, keyword_only=True))
def _cast(call: OpCall) -> object:
    """Convert to ``dtype``, rounding to nearest even; past an fp8 dtype's range,
    fp8_e4m3 gives NaN and fp8_e5m2 infinity, unless ``saturate=True`` (or the result's
    type says ``@saturate``): then a value past the range gives the largest finite one
    (``docs/numerics.md``)."""
    x = call.tensor("x")
    dtype = call.dtype("dtype")
    return call.emit("cast", (x,), TensorType(x.type.dims, dtype), attrs=cast_attrs(call, dtype))


def cast_attrs(call: OpCall, dtype: DType) -> tuple[tuple[str, object], ...]:
    """A cast's attributes: its dtype, and ``saturate`` where the call asks for it (and
    ``dtype`` can saturate)."""
    if not call.const("saturate", bool):
        return (("dtype", dtype),)
    why = saturation_error(dtype)
    if why is not None:
        raise call.error(why.replace("@saturate", "saturate=True"), at="saturate")
    return (("dtype", dtype), ("saturate", True))


@register("cast_like", P("x"), P("like"))
def _cast_like(call: OpCall) -> object:
    """Convert ``x`` to the dtype of ``like`` (shapes may differ)."""
    x, like = call.tensor("x"), call.tensor("like")
    dtype: DType = like.type.dtype
    return call.emit("cast", (x,), TensorType(x.type.dims, dtype), attrs=(("dtype", dtype),))


def rows_permuted(op: Op) -> bool:
    """Whether ``op`` is a transpose that keeps the last axis in place (``[S, H, D]`` as
    ``[H, S, D]``), or one of ``split_qkv``'s three, which is such a transpose of a block
    of its operand's columns, or a slice (``x[..., a:b]``, ``x[:, :T]``: a block with no
    transpose): its rows are the operand's rows, which a kernel can load where they
    lie, so it is a view rather than a kernel of its own."""
    perm = op.attr("perm") if op.kind in ("transpose", "split_qkv", "slice") else None
    return perm is not None and keeps_last_axis(perm)


def retyping_view(op: Op) -> bool:
    """Whether ``op`` is a view whose reader takes the tensor it reads as a parameter of
    other dims: a reshape, or a transpose that keeps the last axis (the axes after the
    rows merged), which then serves no other read of that tensor. ``split_qkv``'s parts
    read the projection with its own dims."""
    return op.kind == "reshape" or (op.kind == "transpose" and rows_permuted(op))


def view_starts(op: Op) -> tuple[Dim, ...]:
    """Where a row permutation's view starts along each axis of the access to its operand
    that ``Access.rows_permuted`` gives (the axes after the rows merged): nowhere but 0
    for a transpose; at column ``part * H * D`` for part ``part`` of ``split_qkv`` (q, k,
    v), whose ``[..., H, S, D]`` lies in the rows of ``[..., S, 3*H*D]``; and at ``a``
    along each axis that ``x[..., a:b]`` slices."""
    if op.kind == "slice":
        return op.attr("starts")
    rank = op.attr("perm")[-2] + 2
    zero = Dim.const(0)
    if op.kind != "split_qkv":
        return (zero,) * rank
    dims = op.result.type.dims
    return (*(zero,) * (rank - 1), dims[-3] * dims[-1] * op.attr("part"))


def has_transpose_kernel(perm: tuple[int, ...]) -> bool:
    """Whether a transpose by ``perm`` has a kernel: the swap of the last two axes (a
    product also reads it in place), or a permutation that keeps the last axis. Any
    other is made of those (``canonicalize``)."""
    return perm == last_two_swapped(len(perm)) or keeps_last_axis(perm)


def keeps_last_axis(perm: tuple[int, ...]) -> bool:
    """Whether ``perm`` moves rows but not the elements within them."""
    return perm[-1] == len(perm) - 1


def last_two_swapped(rank: int) -> tuple[int, ...]:
    """The permutation that swaps the last two of ``rank`` axes: ``transpose``'s default,
    the one a product reads in place and the library's transpose kernel computes."""
    return (*range(rank - 2), rank - 1, rank - 2)


@register("transpose", P("x"), P("axes", None))
def _transpose(call: OpCall) -> object:
    """Permute dims: by default swap the last two; ``axes`` gives the full permutation.
    A swap of the last two is read in place by a product, else it is a kernel of 64 x 64
    blocks; a permutation that keeps the last axis (``(0, 2, 1, 3)``) is read in place by
    an elementwise kernel, which loads each row where it lies, and so is one of
    attention's q, k or v, or of its result: heads split and merged back cost no copy.
    Elsewhere it is a copy. Any other is at most
    two copies and one such swap, with the axes it keeps together merged
    (``transpose(x, (2, 0, 1))`` of ``[A, B, C]`` swaps ``[A*B, C]``: one kernel)."""
    x = call.tensor("x")
    rank = x.type.rank
    axes_value = call.raw("axes")
    if isinstance(axes_value, Const) and axes_value.value is None:
        if rank < 2:
            raise call.error(f"needs at least 2 dims; {call.shape_of('x')}", at="x")
        perm = last_two_swapped(rank)
    else:
        axes = call.const("axes", tuple, list)
        perm = tuple(a % rank if isinstance(a, int) and -rank <= a < rank else -1 for a in axes)
        if sorted(perm) != list(range(rank)):
            raise call.error(
                f"axes must be a permutation of 0..{rank - 1}, not {list(axes)}", at="axes"
            )
    if perm == tuple(range(rank)):  # (0, 1) of a matrix, () of a 0-d tensor: x itself
        return x
    dims = tuple(x.type.dims[i] for i in perm)
    return call.emit("transpose", (x,), TensorType(dims, x.type.dtype), attrs=(("perm", perm),))


@register("reshape", P("x"), P("shape"))
def _reshape(call: OpCall) -> object:
    """View with another shape of the same number of elements. ``shape`` is a list of dims:
    integers, strings (``"B*H"``, where ``-D`` sizes apply) or sizes from parameters; one
    of them may be -1, the number of elements over the others, as in numpy. Also a
    method, as in PyTorch: ``x.reshape("B*S", "C")``, ``x.reshape(-1, "C")``. A kernel
    reads the reshaped tensor from memory with the new dims: a copy is made only of a
    reshape that is returned or read by several ops."""
    x = call.tensor("x")
    given = _shape_arg(call, "shape")
    before = math.prod(x.type.dims, start=Dim.const(1))
    others = math.prod((d for d in given if d is not None), start=Dim.const(1))
    dims = tuple(_inferred(call, before, others) if d is None else d for d in given)
    after = math.prod(dims, start=Dim.const(1))
    for d in dims:
        if not d.is_integral:  # "C/4": whole where C is a multiple of 4
            if not d.symbols():
                raise call.error(f"the dim {d} is not a whole number", at="shape")
            call.emitter.guard(
                "divisible", *d.fraction(), f"reshape: {d} is a whole dim", call.span
            )
    call.same_dim(
        before, after,
        lambda: f"changes the number of elements: {call.shape_of('x')} has {before}, "
        f"{dims_text(dims)} has {after}",
        "element count", ("x",),
    )  # fmt: skip
    return call.emit("reshape", (x,), TensorType(dims, x.type.dtype), attrs=(("shape", dims),))


def _inferred(call: OpCall, elements: Dim, others: Dim) -> Dim:
    """The dim that -1 stands for in a reshape: ``elements / others``, which must be whole
    (checked at run time when not known)."""
    dim = elements / others
    if not dim.symbols() and not dim.is_integral:
        raise call.error(
            f"-1 stands for no whole dim: {call.shape_of('x')}, {elements} elements, "
            f"not a multiple of {others}",
            at="shape",
        )
    return dim  # a fraction of sizes is guarded as any other dim of the shape


def _shape_arg(call: OpCall, name: str) -> tuple[Dim | None, ...]:
    """A list of dims: ints, dim strings or sizes (``T.m``, ``x.shape[0]``); None for the
    one -1 (numpy's "the rest")."""
    value = call.raw(name)
    items = (
        value.value if isinstance(value, Const) and isinstance(value.value, (list, tuple)) else None
    )
    if items is None:
        raise call.error(f"'{name}' must be a list of dims, not the value given", at=name)
    dims = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str, Dim)):
            raise call.error(f"'{name}' holds {item!r}, which is not a dim", at=name)
        if item == -1 and not isinstance(item, Dim):
            if None in dims:
                raise call.error("only one dim can be -1", at=name)
            dims.append(None)
            continue
        if isinstance(item, int):
            dim = Dim.const(item)
        elif isinstance(item, str):
            try:
                dim = parse_dim(item).substitute(call.emitter.defines)
            except DimSyntaxError as exc:
                raise call.error(f'bad dim "{item}": {exc.message}', at=name) from None
        else:
            dim = item
        if dim.constant is not None and dim.constant <= 0:
            written = f'"{item}" ({dim.constant})' if isinstance(item, str) else str(dim)
            raise call.error(f"dims are positive (or -1, for the rest), not {written}", at=name)
        dims.append(dim)
    return tuple(dims)


from . import activations as _activations  # noqa: E402,F401  (PyTorch's activations)
from . import array_ops as _array_ops  # noqa: E402,F401  (registers shapes, fills, joins)
from . import collectives as _collectives  # noqa: E402,F401  (registers the collectives)
from . import functional as _functional  # noqa: E402,F401  (registers PyTorch's F names)
from . import losses as _losses  # noqa: E402,F401  (PyTorch's losses)
