"""NumPy's and PyTorch's array vocabulary: shapes, creation, joins, triangles, truth,
gathers, losses, ``einsum`` and running sums.

``squeeze``, ``unsqueeze`` (``expand_dims``), ``flatten``, ``broadcast_to`` (``expand``),
``zeros``, ``ones``, ``full``, ``arange``, ``concat`` (``concatenate``, ``cat``),
``stack``, ``tril``, ``triu``, ``any``, ``all``, ``take`` (``w[ids]``), ``embedding``,
``cross_entropy``, ``einsum`` and ``cumsum``. Each is a composition: its rule checks the
call, then emits graph ops that exist (views, ``where``, ``matmul``, the library's
``pad`` and ``take_along_axis``) through their own rules, so that every backend, fusion
and autodiff get it with no kernel of its own. The one op added for them is an
``index_along`` with no operand: the index of each element of a result of a given
shape, which ``arange``, the fills, the broadcasts and the triangles are made of.
"""

from __future__ import annotations

import math
from typing import Any

from .dims import Dim, DimSyntaxError, parse_dim
from .dtypes import F32, I32, DType, promote
from .graph_ops import GRAPH_OPS, _as_ev, _then, is_mask, register
from .ir import Value
from .opcall import OpCall, P
from .types import ScalarType, TensorType, dims_text
from .values import Const, DimValue, ShapeValue, describe

__all__ = ["indices_of", "shape_argument", "reduction_argument", "MASK_READERS"]

_ONE = Dim.const(1)

#: The ops here that take a mask as well as a tensor: views, broadcasts and ``any``/``all``.
MASK_READERS = frozenset({
    "squeeze", "unsqueeze", "expand_dims", "flatten", "broadcast_to", "expand", "any", "all",
})  # fmt: skip


# -------------------------------------------------------------------- helpers


def _axis_argument(call: OpCall, rank: int, default: Any = None) -> Any:
    """The call's ``axis``, or PyTorch's ``dim`` for it: an integer in ``[-rank, rank)``
    (``rank`` counts the result's axes where a new one is made), a tuple of them, or
    ``default`` where neither is given."""
    given = [n for n in ("axis", "dim") if call.given(n) and call.raw(n) != Const(None)]
    if len(given) == 2:
        raise call.error("give 'axis' or 'dim' (its PyTorch name), not both", at="dim")
    if not given:
        return default
    name = given[0]
    value = call.raw(name).value if isinstance(call.raw(name), Const) else None
    axes = value if isinstance(value, (tuple, list)) else (value,)
    for a in axes:
        if not isinstance(a, int) or isinstance(a, bool):
            raise call.error(
                f"'{name}' must be an integer or a tuple of them, not {describe(call.raw(name))}",
                at=name,
            )
        if not -rank <= a < rank:
            raise call.error(f"axis {a} is out of range for a rank-{rank} result", at=name)
    picked = tuple(a % rank for a in axes)
    if len(set(picked)) != len(picked):
        raise call.error(f"axes {tuple(axes)} name an axis twice", at=name)
    return picked if isinstance(value, (tuple, list)) else picked[0]


def _reshaped(call: OpCall, x: Value, dims: tuple[Dim, ...]) -> Value:
    """``x`` viewed with ``dims`` (the same elements): ``x`` itself where they are its own."""
    if tuple(dims) == tuple(x.type.dims):
        return x
    return call.emit("reshape", (x,), TensorType(tuple(dims), x.type.dtype),
                     attrs=(("shape", tuple(dims)),))  # fmt: skip


def shape_argument(call: OpCall, name: str, keep: bool = False) -> tuple[Dim | None, ...]:
    """A shape: an integer or a size (``N``, ``x.shape[0]``, an ``int`` parameter), or a
    tuple or list of them and of dim strings (``"B*S"``), or ``x.shape``. With ``keep``
    (``broadcast_to``, ``expand``), -1 stands for "the operand's size", as None."""
    value = call.raw(name)
    if isinstance(value, ShapeValue):
        return value.dims
    if isinstance(value, Const) and type(value.value) is int:
        items: Any = (value.value,)
    elif isinstance(value, DimValue) or (
        isinstance(value, Value) and value.type == ScalarType("int")
    ):
        items = (call.dim(name),)
    elif isinstance(value, Const) and isinstance(value.value, (tuple, list)):
        items = value.value
    else:
        raise call.error(
            f"'{name}' must be a shape: a size, or a tuple of sizes, not {describe(value)}",
            at=name,
        )
    dims: list[Dim | None] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str, Dim)):
            raise call.error(f"'{name}' holds {item!r}, which is not a size", at=name)
        if keep and isinstance(item, int) and item == -1:
            dims.append(None)
            continue
        if isinstance(item, int):
            dim = Dim.const(item)
        elif isinstance(item, str):
            try:
                dim = parse_dim(item).substitute(call.emitter.defines)
            except DimSyntaxError as exc:
                raise call.error(f'bad dim "{item}": {exc.message}', at=name) from None
            unknown = sorted(dim.symbols() - set(call.emitter.dims))
            if unknown:
                raise call.error(
                    f'"{item}" names {", ".join(unknown)}, which no parameter has as a size',
                    at=name,
                )
        else:
            dim = item
        least = 1 if keep else 0  # a broadcast stretches an axis of 1, never to 0
        if dim.constant is not None and dim.constant < least:
            raise call.error(f"sizes are at least {least}, not {dim.constant}", at=name)
        if not dim.is_integral:
            raise call.error(f"the size {dim} is not a whole number", at=name)
        dims.append(dim)
    return tuple(dims)


def indices_of(call: OpCall, dims: tuple[Dim, ...], axis: int) -> Value:
    """Each element's index along ``axis`` of a tensor of ``dims``, as f32 (exact below
    2**24): ``index_along`` of no operand, computed from the element's row-major place."""
    stride = math.prod(dims[axis + 1 :], start=_ONE)
    return call.emit("index_along", (), TensorType(tuple(dims), F32),
                     attrs=(("stride", stride), ("size", dims[axis])))  # fmt: skip


def _zeros(call: OpCall, dims: tuple[Dim, ...]) -> Value:
    """f32 zeros of ``dims``: each element's index along an axis of one (a rank-0 result
    is the index of a 1-element vector, viewed without its axis)."""
    if not dims:
        return _reshaped(call, _zeros(call, (_ONE,)), ())
    return call.emit("index_along", (), TensorType(tuple(dims), F32),
                     attrs=(("stride", _ONE), ("size", _ONE)))  # fmt: skip


def _as_dtype(call: OpCall, x: Value, dtype: DType) -> Value:
    return x if x.type.dtype == dtype else _then(call, "cast", x, dtype)


def _everywhere(call: OpCall, dims: tuple[Dim, ...]) -> Value:
    """A mask of ``dims`` true everywhere: the broadcast that ``where`` makes of its
    operands."""
    return _then(call, "equal", _zeros(call, dims), 0.0)


def _broadcast_value(call: OpCall, x: Value, dims: tuple[Dim, ...]) -> Value:
    """``x`` (not a mask) broadcast to ``dims``, which it broadcasts to: ``where`` of a mask
    of ``dims`` true everywhere, which ``where``'s gradient sums back."""
    if tuple(dims) == tuple(x.type.dims):
        return x
    return _then(call, "where", _everywhere(call, dims), x, x)


# -------------------------------------------------------------------- shapes


@register("squeeze", P("x"), P("axis", None), P("dim", None, keyword_only=True))
def _squeeze(call: OpCall) -> object:
    """``x`` without axes of size 1, as numpy's ``squeeze``: ``axis`` (an integer or a
    tuple; ``dim`` is PyTorch's name for it) names them, each of which must be of size 1
    (an error otherwise, as in numpy; PyTorch leaves such an axis alone); without it,
    every axis whose size is 1 at compile time goes. A view: no copy. Also a method,
    ``x.squeeze(1)``."""
    x = call.tensor("x")
    rank, dims = x.type.rank, x.type.dims
    axis = _axis_argument(call, max(rank, 1))
    if axis is None:
        dropped = {a for a, d in enumerate(dims) if d == _ONE}
    else:
        dropped = set(axis) if isinstance(axis, tuple) else {axis}
        if rank == 0:  # numpy's: axis 0 or -1 of a 0-d array is no axis to drop
            return x
        for a in sorted(dropped):
            if dims[a] != _ONE:
                where = "axis" if call.given("axis") else "dim"
                raise call.error(
                    f"can only drop axes of size 1; axis {a} of {call.shape_of('x')} is "
                    f"{dims[a]}",
                    at=where,
                )
    return _reshaped(call, x, tuple(d for a, d in enumerate(dims) if a not in dropped))


def _unsqueeze(name: str, extra: str) -> Any:
    """``unsqueeze`` (PyTorch's) or ``expand_dims`` (numpy's): new axes of size 1, each at
    its place in the result."""

    def rule(call: OpCall) -> object:
        x = call.tensor("x")
        if not call.given("axis") and not call.given("dim"):
            raise call.error(f"needs the new axis: {name}(x, 0), {name}(x, -1)")
        given = call.raw("axis" if call.given("axis") else "dim")
        added = len(given.value) if isinstance(given, Const) and isinstance(
            given.value, (tuple, list)) else 1  # fmt: skip
        picked = _axis_argument(call, x.type.rank + added)
        axes = tuple(sorted(picked)) if isinstance(picked, tuple) else (picked,)
        dims = list(x.type.dims)
        for a in axes:
            dims.insert(a, _ONE)
        return call.emit("expand_dims", (x,), TensorType(tuple(dims), x.type.dtype),
                         attrs=(("axes", axes),))  # fmt: skip

    rule.__doc__ = (
        "``x`` with a new axis of size 1 at ``axis`` (``dim`` is PyTorch's name for it), "
        f"counted in the result: ``{name}(x, 0)`` of ``[N]`` is ``[1, N]``, ``{name}(x, -1)`` "
        f"is ``[N, 1]``, as ``x[None, :]`` and ``x[:, None]`` are. {extra}A view: no copy. "
        f"Also a method, ``x.{name}(1)``."
    )
    return rule


register("unsqueeze", P("x"), P("axis", None), P("dim", None, keyword_only=True))(
    _unsqueeze("unsqueeze", "PyTorch's name. ")
)
register("expand_dims", P("x"), P("axis", None), P("dim", None, keyword_only=True))(
    _unsqueeze(
        "expand_dims", "numpy's name; a tuple of axes adds each, at its place in the result. "
    )
)


@register("flatten", P("x"), P("start_dim", 0), P("end_dim", -1))
def _flatten(call: OpCall) -> object:
    """The axes ``start_dim`` to ``end_dim`` (both included; negative counts from the end)
    merged into one, as PyTorch's ``flatten``: ``flatten(x)`` of ``[B, S, C]`` is
    ``[B*S*C]``, ``x.flatten(1)`` is ``[B, S*C]``, and a 0-d tensor becomes ``[1]``. A
    view: no copy. Also a method, as numpy's ``x.flatten()``."""
    x = call.tensor("x")
    rank, dims = x.type.rank, x.type.dims
    if rank == 0:
        return _reshaped(call, x, (_ONE,))
    bounds = []
    for name in ("start_dim", "end_dim"):
        value = call.const(name, int)
        if not -rank <= value < rank:
            raise call.error(f"{name} {value} is out of range for {call.shape_of('x')}", at=name)
        bounds.append(value % rank)
    start, end = bounds
    if start > end:
        raise call.error(f"start_dim {start} comes after end_dim {end}", at="start_dim")
    merged = math.prod(dims[start : end + 1], start=_ONE)
    return _reshaped(call, x, (*dims[:start], merged, *dims[end + 1 :]))


def _broadcast(call: OpCall, x: Value, name: str) -> Value:
    """``x`` broadcast to the shape the call's ``name`` gives, numpy's rules with
    PyTorch's -1 (the operand's size)."""
    given = shape_argument(call, name, keep=True)
    rank, dims = x.type.rank, x.type.dims
    if len(given) < rank:
        raise call.error(
            f"cannot broadcast {call.shape_of('x')} to {len(given)} dims: fewer than its "
            f"{rank}",
            at=name,
        )
    lead = len(given) - rank
    out: list[Dim] = []
    for i, want in enumerate(given):
        have = dims[i - lead] if i >= lead else None
        if want is None:
            if have is None:
                raise call.error(f"-1 keeps a size of x, but axis {i} is a new one", at=name)
            want = have
        if have is not None and have not in (_ONE, want):
            call.same_dim(
                have, want,
                lambda: f"cannot broadcast {call.shape_of('x')} to "
                f"{dims_text(tuple(d if d is not None else Dim.sym('-1') for d in given))}: "
                "only an axis of size 1 stretches",
                f"broadcast_to size {have} == {want}", ("x",),
            )  # fmt: skip
        out.append(want)
    if is_mask(x) and tuple(out) != tuple(dims):
        return _then(call, "logical_and", _everywhere(call, tuple(out)), x)
    return _broadcast_value(call, x, tuple(out))


@register("broadcast_to", P("x"), P("shape"))
def _broadcast_to(call: OpCall) -> object:
    """``x`` repeated along axes of size 1 (and new leading axes) to ``shape``, numpy's
    broadcasting rules, as numpy's and PyTorch's ``broadcast_to``: ``broadcast_to(b, ("N",
    "C"))`` of ``b [C]``. ``shape`` is a tuple of sizes (numbers, dims such as ``"N"`` or
    ``x.shape``); -1 keeps x's size there (PyTorch's). Any dtype, masks too; a gradient
    sums back over the repeated axes. Computed where it is read, as broadcasting
    operands are."""
    return _broadcast(call, call.tensor("x"), "shape")


@register("expand", P("x"), P("sizes"))
def _expand(call: OpCall) -> object:
    """PyTorch's ``x.expand(*sizes)``: ``broadcast_to(x, sizes)``, a size -1 keeping x's
    size there: ``x.expand(4, -1)`` of ``[1, C]`` is ``[4, C]``. The sizes are one tuple
    or one argument each."""
    return _broadcast(call, call.tensor("x"), "sizes")


# -------------------------------------------------------------------- creation


def _created_dtype(call: OpCall, default: DType) -> DType:
    return (
        call.dtype("dtype") if call.given("dtype") and call.raw("dtype") != Const(None) else default
    )


def _filled(call: OpCall, value: Any, dtype: DType) -> Value:
    """A tensor of the call's ``shape`` holding ``value``, of ``dtype``."""
    dims = shape_argument(call, "shape")
    zeros = _as_dtype(call, _zeros(call, dims), dtype)  # type: ignore[arg-type]
    filled = zeros if value == Const(0.0) else _then(call, "add", zeros, value)
    return _as_dtype(call, filled, dtype)


def _fill(number: float) -> Any:
    def rule(call: OpCall) -> object:
        return _filled(call, Const(number), _created_dtype(call, F32))

    name = "zeros" if number == 0.0 else "ones"
    rule.__doc__ = (
        f"A tensor of ``shape`` holding {name}, as numpy's and PyTorch's ``{name}``: "
        f'``{name}(("N", 4))``, ``{name}(x.shape)``, ``{name}(N)`` (a size, a number or '
        'a tuple of them and of dims such as ``"B*S"``), or PyTorch\'s sizes one argument '
        f"each, ``{name}(T, T)``; of ``dtype``, f32 by default. "
        "Computed where it is read: no memory is filled unless it is returned."
    )
    return rule


register("zeros", P("shape"), P("dtype", None))(_fill(0.0))
register("ones", P("shape"), P("dtype", None))(_fill(1.0))


@register("full", P("shape"), P("fill_value"), P("dtype", None))
def _full(call: OpCall) -> object:
    """A tensor of ``shape`` holding ``fill_value`` (a number, or a float or int
    parameter), as numpy's and PyTorch's ``full``; of ``dtype``, by default i32 for an
    integer value and f32 for a float one (Tessera's integers are i32, where numpy's and
    PyTorch's default is int64)."""
    value = call.raw("fill_value")
    if isinstance(value, Value) and value.type in (ScalarType("float"), ScalarType("int")):
        default = F32 if value.type == ScalarType("float") else I32
    elif isinstance(value, Const) and type(value.value) in (int, float):
        default = F32 if isinstance(value.value, float) else I32
    else:
        raise call.error(
            f"'fill_value' must be a number or a scalar parameter, not {describe(value)}",
            at="fill_value",
        )
    return _filled(call, call.ev("fill_value"), _created_dtype(call, default))


@register("arange", P("start"), P("stop", None), P("step", 1), P("dtype", None))
def _arange(call: OpCall) -> object:
    """The numbers ``start, start + step, ...`` below ``stop`` (above it for a negative
    step), as numpy's and PyTorch's ``arange``: ``arange(stop)`` starts at 0. The bounds
    are numbers or sizes (``arange(N)``, ``arange(1, x.shape[0])``); a size needs a step
    of 1. The dtype is i32 where every bound is an integer (numpy's and PyTorch's int64,
    in Tessera's integer), f32 where one is a float, or ``dtype``. Values are exact up to
    2**24. Computed where it is read (each element's index), so ``arange(C) < k`` costs
    no memory."""
    integer = True

    def bound(name: str) -> int | float | Dim:
        nonlocal integer
        value = call.raw(name)
        if isinstance(value, DimValue):
            return value.dim
        if isinstance(value, Const) and type(value.value) in (int, float):
            integer = integer and isinstance(value.value, int)
            return value.value
        raise call.error(f"'{name}' must be a number or a size, not {describe(value)}", at=name)

    if call.raw("stop") == Const(None):
        bounds = {"start": 0, "stop": bound("start"), "step": bound("step")}
    else:
        bounds = {"start": bound("start"), "stop": bound("stop"), "step": bound("step")}
    start, stop, step = bounds["start"], bounds["stop"], bounds["step"]
    if isinstance(step, Dim) or step == 0:
        raise call.error(f"'step' must be a nonzero number, not {step}", at="step")
    if isinstance(start, Dim) or isinstance(stop, Dim):
        if step != 1 or isinstance(start, float) or isinstance(stop, float):
            raise call.error("a size as a bound needs integer bounds and a step of 1", at="step")
        start_dim = start if isinstance(start, Dim) else Dim.const(start)
        stop_dim = stop if isinstance(stop, Dim) else Dim.const(stop)
        count = stop_dim - start_dim
        if count.constant is not None and count.constant < 0:
            count = Dim.const(0)
        elif count.constant is None and any(c < 0 for _, c in count.terms):
            call.emitter.guard("at_most", start_dim, stop_dim,
                               f"{call.shown}: start <= stop", call.span)  # fmt: skip
    else:
        count = Dim.const(max(0, math.ceil((stop - start) / step)))
    values = indices_of(call, (count,), 0)
    if step != 1:
        values = _then(call, "mul", values, float(step))
    if start != 0:
        offset = start if not isinstance(start, Dim) else call.emit(
            "dim_to_float", (), ScalarType("float"), attrs=(("dim", start),)
        )  # fmt: skip
        values = _then(call, "add", values, float(offset) if not isinstance(offset, Value)
                       else offset)  # fmt: skip
    return _as_dtype(call, values, _created_dtype(call, I32 if integer else F32))


# -------------------------------------------------------------------- joining


def _tensors(call: OpCall, name: str) -> list[Value]:
    value = call.raw(name)
    items = value if isinstance(value, (tuple, list)) else None
    if isinstance(value, Const) and isinstance(value.value, (tuple, list)):
        items = value.value
    if not items or not all(isinstance(v, Value) and isinstance(v.type, TensorType) for v in items):
        raise call.error(
            f"'{name}' must be a list or tuple of tensors, such as [a, b], not "
            f"{describe(value) if not isinstance(value, (tuple, list)) else 'that sequence'}",
            at=name,
        )
    return list(items)


def _joined(call: OpCall, tensors: list[Value], axis_of: Any) -> Value:
    """The concatenation of ``tensors`` along the call's axis (``axis_of`` of the rank)."""
    rank = tensors[0].type.rank
    for t in tensors[1:]:
        if t.type.rank != rank:
            raise call.error(
                "the tensors must have one rank: "
                + ", ".join(dims_text(v.type.dims) for v in tensors),
                at="tensors",
            )
    if rank == 0:
        raise call.error("cannot join 0-d tensors along an axis; stack them", at="tensors")
    axis = axis_of(rank)
    first = tensors[0].type.dims
    for t in tensors[1:]:
        for k in range(rank):
            if k != axis:
                call.same_dim(
                    t.type.dims[k], first[k],
                    lambda: "the tensors' sizes differ off the joined axis "
                    f"{axis}: " + ", ".join(dims_text(v.type.dims) for v in tensors),
                    f"joined size {t.type.dims[k]} == {first[k]}", ("tensors",),
                )  # fmt: skip
    masks = [is_mask(t) for t in tensors]
    if any(masks) and not all(masks):
        raise call.error("joins masks with masks only; cast a mask to join it with numbers",
                         at="tensors")  # fmt: skip
    dtype = tensors[0].type.dtype
    for t in tensors[1:]:
        dtype = promote(dtype, t.type.dtype)
    if len(tensors) == 1:
        return tensors[0]
    total = sum((t.type.dims[axis] for t in tensors), start=Dim.const(0))
    after = math.prod(first[axis + 1 :], start=_ONE)
    rows = math.prod(first[:axis], start=_ONE)
    like = _zeros(call, (_ONE, total * after))  # gives the pad kernel its row length only
    out: Value | None = None
    start = Dim.const(0)
    for t in tensors:
        part = _as_dtype(call, t, F32)
        flat = _reshaped(call, part, (rows, t.type.dims[axis] * after))
        padded = call.emit("pad", (flat, like), TensorType((rows, total * after), F32),
                           attrs=(("start", start * after),))  # fmt: skip
        out = padded if out is None else _then(call, "add", out, padded)
        start = start + t.type.dims[axis]
    assert out is not None
    joined = _reshaped(call, out, (*first[:axis], total, *first[axis + 1 :]))
    if all(masks):
        return _then(call, "not_equal", joined, 0.0)
    return _as_dtype(call, joined, dtype)


def _concat(name: str, what: str) -> Any:
    def rule(call: OpCall) -> object:
        tensors = _tensors(call, "tensors")
        return _joined(call, tensors, lambda rank: _axis_argument(call, rank, 0))

    rule.__doc__ = (
        "The tensors of a list or tuple joined along ``axis`` (default 0; ``dim`` is "
        f"PyTorch's name for it), as {what}: ``{name}([a, b], axis=-1)`` of ``[N, 3]`` and "
        "``[N, 5]`` is ``[N, 8]``. The tensors have one rank and the same sizes off that "
        "axis; the result has the wider dtype of them (any dtype, masks too; integers "
        "are exact below 2**24, as all integer elementwise math is). Each tensor is "
        "written into its block of the result by the library's ``pad`` kernel and the "
        "blocks are added, a pass over the result per tensor; the gradient of each tensor "
        "is its block of the result's (a slice)."
    )
    return rule


for _name, _what in (("concat", "numpy's ``concat``"), ("concatenate", "numpy's ``concatenate``"),
                     ("cat", "PyTorch's ``cat``")):  # fmt: skip
    register(_name, P("tensors"), P("axis", None), P("dim", None, keyword_only=True))(
        _concat(_name, _what)
    )


@register("stack", P("tensors"), P("axis", None), P("dim", None, keyword_only=True))
def _stack(call: OpCall) -> object:
    """The tensors of a list or tuple, all of one shape, joined along a new axis ``axis``
    (default 0; ``dim`` is PyTorch's name; counted in the result), as numpy's and PyTorch's
    ``stack``: ``stack([a, b], axis=-1)`` of two ``[N, C]`` is ``[N, C, 2]``. It is
    ``concat`` of each with that axis added (a view), and so has its dtypes and its
    gradient."""
    tensors = _tensors(call, "tensors")
    rank = tensors[0].type.rank + 1
    axis = _axis_argument(call, rank, 0)
    if isinstance(axis, tuple):
        raise call.error("'axis' must be one integer", at="axis" if call.given("axis") else "dim")
    for t in tensors[1:]:
        if t.type.rank + 1 != rank:
            raise call.error(
                "the tensors must have one shape: "
                + ", ".join(dims_text(v.type.dims) for v in tensors),
                at="tensors",
            )
    added = []
    for t in tensors:
        dims = (*t.type.dims[:axis], _ONE, *t.type.dims[axis:])
        added.append(call.emit("expand_dims", (t,), TensorType(dims, t.type.dtype),
                               attrs=(("axes", (axis,)),)))  # fmt: skip
    return _joined(call, added, lambda _: axis)


# -------------------------------------------------------------------- triangles


def _triangle(lower: bool) -> Any:
    def rule(call: OpCall) -> object:
        x = call.tensor("x")
        if x.type.rank < 2:
            raise call.error(f"needs at least 2 dims; {call.shape_of('x')}", at="x")
        if is_mask(x):
            raise call.error(f"{call.ev('x').text} is a mask; cast it to f32 first", at="x")
        k = call.const("diagonal", int)
        dims = x.type.dims
        rows, cols = indices_of(call, dims, x.type.rank - 2), indices_of(
            call, dims, x.type.rank - 1
        )
        offset = _then(call, "sub", cols, rows)
        keep = _then(call, "less_equal" if lower else "greater_equal", offset, float(k))
        zero = 0.0 if x.type.dtype.is_float else 0
        return _then(call, "where", keep, x, zero)

    which = "lower" if lower else "upper"
    name = "tril" if lower else "triu"
    side = "on or below" if lower else "on or above"
    rule.__doc__ = (
        f"The {which} triangle of the last two axes, as numpy's and PyTorch's ``{name}``: "
        f"``x`` {side} the diagonal ``diagonal`` (``k`` in numpy; 0 the main one, 1 the "
        "one above it, -1 below), 0 elsewhere (NaN too). Any numeric dtype; same shape; "
        "a batch of matrices is each one's. A causal mask: ``where(tril(ones_like(s)) > "
        "0.0, s, -INF)``. Its gradient is the same triangle of the cotangent. Also a "
        "method."
    )
    return rule


for _lower in (True, False):
    register("tril" if _lower else "triu", P("x"), P("diagonal", 0))(_triangle(_lower))


# -------------------------------------------------------------------- truth


def _truth(every: bool) -> Any:
    def rule(call: OpCall) -> object:
        x = call.tensor("x")
        nonzero = x if is_mask(x) else _then(call, "not_equal", x, 0.0 if x.type.dtype.is_float
                                              else 0)  # fmt: skip
        flags = _then(call, "cast", nonzero, F32)
        axis = call.raw("axis")
        if isinstance(axis, Const) and axis.value is None:
            axis = Const(tuple(range(x.type.rank)))
        if axis == Const(()):
            reduced = flags
        elif every:
            reduced = _then(call, "min", flags, axis, call.raw("keepdims"))
        else:
            reduced = _then(call, "max", flags, axis, call.raw("keepdims"))
        return _then(call, "greater", reduced, 0.5)

    name = "all" if every else "any"
    which = "every" if every else "some"
    rule.__doc__ = (
        f"Whether {which} element along ``axis`` is true, as numpy's and PyTorch's "
        f"``{name}``: of a mask, or of a tensor (nonzero, NaN included, is true). A mask "
        "(which ``where``, ``cast`` and ``.astype`` read), ``axis`` dropped unless "
        "``keepdims``; ``axis`` is an integer or a tuple, and without it every axis "
        f"is reduced, to a 0-d mask. It is the {'minimum' if every else 'maximum'} of the "
        "mask as 1.0 and 0.0: the reduction kernels."
    )
    return rule


for _every in (False, True):
    register("all" if _every else "any", P("x"), P("axis", None), P("keepdims", False))(
        _truth(_every)
    )


# -------------------------------------------------------------------- gathers and losses


@register("take", P("x"), P("indices"), P("axis", None))
def _take(call: OpCall) -> object:
    """The elements of ``x`` at integer ``indices`` along ``axis``, as numpy's ``take``:
    ``take(w, ids, axis=0)`` of ``w [V, D]`` and ``ids [B, S]`` is ``[B, S, D]``, the rows
    of an embedding table; ``w[ids]`` is the same (numpy's indexing by an integer array
    on the first axis). Without ``axis``, ``x`` is flattened first (numpy's). The result
    is ``x.shape[:axis] + indices.shape + x.shape[axis+1:]``, of ``x``'s dtype (a float).
    Where ``indices`` is a parameter, a value outside ``[0, x.shape[axis])`` is a
    ``ValueError`` before the launch (numpy's ``IndexError``); a computed one is clamped
    into the axis. It is ``take_along_axis`` of the indices broadcast across the other
    axes, and so has its gradient (``scatter_add``); along the first axis, that gather
    runs over ``x`` transposed."""
    x, indices = call.tensor("x"), call.tensor("indices")
    if indices.type.dtype.kind != "int":
        raise call.error(
            f"the indices must be an integer tensor; {call.ev('indices').text} is "
            f"{indices.type.dtype}",
            at="indices",
        )
    if call.raw("axis") == Const(None):
        x = _reshaped(call, x, (math.prod(x.type.dims, start=_ONE),))
        axis = 0
    else:
        axis = call.axis("axis", max(x.type.rank, 1))
    if x.type.rank == 0:
        raise call.error(f"needs at least 1 dim; {call.shape_of('x')}", at="x")
    dims = x.type.dims
    call.emitter.index_guard(indices, dims[axis], call.shown, call.span)
    count = math.prod(indices.type.dims, start=_ONE)
    column = tuple(count if k == axis else _ONE for k in range(x.type.rank))
    spread = tuple(count if k == axis else d for k, d in enumerate(dims))
    index = _broadcast_value(call, _reshaped(call, indices, column), spread)
    picked = _then(call, "take_along_axis", x, index, axis)
    return _reshaped(call, picked, (*dims[:axis], *indices.type.dims, *dims[axis + 1 :]))


@register("embedding", P("input"), P("weight"))
def _embedding(call: OpCall) -> object:
    """The rows of ``weight [V, D]`` at the integer ``input`` (any shape), as PyTorch's
    ``torch.nn.functional.embedding``: ``take(weight, input, axis=0)``, of shape
    ``input.shape + [D]``, with its run-time check of the indices and its gradient (the
    rows' cotangents summed into a ``[V, D]`` of zeros). PyTorch's ``padding_idx`` and
    ``max_norm`` are not taken."""
    weight = call.tensor("weight")
    if weight.type.rank != 2:
        raise call.error(f"'weight' must be a [V, D] table; {call.shape_of('weight')}",
                         at="weight")  # fmt: skip
    spec = GRAPH_OPS["take"]
    args = {"x": call.ev("weight"), "indices": call.ev("input"), "axis": _as_ev(call, 0)}
    return spec.rule(OpCall(spec, args, call.span, call.emitter, call.shown))


_REDUCTIONS = ("mean", "sum", "none")


def reduction_argument(call: OpCall) -> str:
    """A loss's ``reduction``, as PyTorch's losses take it: "mean", "sum" or "none"."""
    reduction = call.const("reduction", str)
    if reduction not in _REDUCTIONS:
        raise call.error(
            f"reduction is one of {', '.join(map(repr, _REDUCTIONS))}, not {reduction!r}",
            at="reduction",
        )
    return reduction


@register(
    "cross_entropy", P("input"), P("target"), P("ignore_index", -100, keyword_only=True),
    P("reduction", "mean", keyword_only=True), P("label_smoothing", 0.0, keyword_only=True),
)  # fmt: skip
def _cross_entropy(call: OpCall) -> object:
    """The cross-entropy loss of logits ``input [N, C]`` and integer class labels ``target
    [N]``, as PyTorch's ``torch.nn.functional.cross_entropy``: ``-log_softmax(input)[n,
    target[n]]`` for each row; ``reduction`` "mean" (the default: over the rows whose
    label is not ``ignore_index``, NaN where none is, as PyTorch's), "sum" (a 0-d
    tensor) or "none" (``[N]``). A row labelled ``ignore_index`` (default -100)
    contributes 0. ``label_smoothing`` ``e`` in [0, 1] mixes in the uniform target:
    ``(1 - e) * nll + e * mean(-log_softmax(input))`` per row. Float logits; the result
    is f32. Made of ``log_softmax`` and ``take_along_axis``, so its gradient is theirs.
    A label outside ``[0, C)`` other than ``ignore_index`` is clamped into it (PyTorch
    raises); per-class ``weight`` and probability targets are not taken (write
    ``-sum(t * log_softmax(x, axis=-1), axis=-1)`` for the latter)."""
    logits, labels = call.tensor("input"), call.tensor("target")
    if logits.type.rank != 2 or not logits.type.dtype.is_float:
        raise call.error(
            f"'input' must be float logits [N, C]; {call.shape_of('input')}, "
            f"{logits.type.dtype}",
            at="input",
        )
    if labels.type.dtype.kind != "int" or labels.type.rank != 1:
        raise call.error(
            f"'target' must be integer class labels [N]; {call.shape_of('target')}, "
            f"{labels.type.dtype} (probability targets: -sum(t * log_softmax(x, axis=-1), "
            "axis=-1))",
            at="target",
        )
    call.same_dim(
        labels.type.dims[0], logits.type.dims[0],
        lambda: f"one label per row: {call.shape_of('input')}, {call.shape_of('target')}",
        "cross_entropy rows", ("input", "target"),
    )  # fmt: skip
    reduction = reduction_argument(call)
    ignored = call.const("ignore_index", int)
    smoothing = call.number("label_smoothing")
    if not 0.0 <= smoothing <= 1.0:
        raise call.error(f"label_smoothing is in [0, 1], not {smoothing}", at="label_smoothing")
    scores = _then(call, "log_softmax", _as_dtype(call, logits, F32), -1)
    kept = _then(call, "not_equal", labels, ignored)
    index = _then(call, "where", kept, labels, 0)
    column = _reshaped(call, index, (labels.type.dims[0], _ONE))
    picked = _then(call, "take_along_axis", scores, column, -1)
    loss = _then(call, "neg", _reshaped(call, picked, labels.type.dims))
    if smoothing:
        uniform = _then(call, "neg", _then(call, "mean", scores, -1))
        loss = _then(call, "add", _then(call, "mul", loss, 1.0 - smoothing),
                     _then(call, "mul", uniform, smoothing))  # fmt: skip
    loss = _then(call, "where", kept, loss, 0.0)
    if reduction == "none":
        return loss
    total = _then(call, "sum", loss, 0)
    if reduction == "sum":
        return total
    return _then(call, "div", total, _then(call, "sum", _then(call, "cast", kept, F32), 0))


# -------------------------------------------------------------------- einsum


def _einsum_terms(call: OpCall, count: int) -> tuple[list[str], str]:
    """The operands' subscripts and the result's, checked: letters only (no ``...``), one
    term per operand, no letter twice in one term (a diagonal) or in the result, every
    result letter among the operands'. Without ``->``, the result is the letters that
    appear once, in alphabetical order (numpy's and PyTorch's implicit form)."""
    text = call.const("subscripts", str).replace(" ", "")
    if "." in text:
        raise call.error("'...' (broadcast dims) is not supported: name every axis",
                         at="subscripts")  # fmt: skip
    inputs, arrow, output = text.partition("->")
    terms = inputs.split(",")
    for term in [*terms, output]:
        bad = next((c for c in term if not c.isalpha()), None)
        if bad is not None:
            raise call.error(f"subscripts are letters, not {bad!r}: {text!r}", at="subscripts")
    if len(terms) != count:
        raise call.error(
            f"{text!r} has {len(terms)} operand term{'s' if len(terms) != 1 else ''}, "
            f"but {count} operand{'s are' if count != 1 else ' is'} given",
            at="subscripts",
        )
    for term in terms:
        twice = next((c for c in term if term.count(c) > 1), None)
        if twice is not None:
            raise call.error(
                f"{term!r} repeats {twice!r}: a diagonal (a trace) is not supported",
                at="subscripts",
            )
    letters = "".join(terms)
    if not arrow:
        output = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    for c in output:
        if output.count(c) > 1 or c not in letters:
            why = "twice" if output.count(c) > 1 else "in no operand"
            raise call.error(f"the result's {c!r} is {why}: {text!r}", at="subscripts")
    return terms, output


def _merged(sizes: dict[str, Dim], letters: str) -> Dim:
    """The size of the axes ``letters`` name merged into one."""
    return math.prod((sizes[c] for c in letters), start=_ONE)


def _in_order(call: OpCall, x: Value, term: str, order: str) -> Value:
    """``x``, whose axes ``term`` names, with its axes in ``order`` (a permutation)."""
    if term == order:
        return x
    return _then(call, "transpose", x, tuple(term.index(c) for c in order))


@register("einsum", P("subscripts"), P("a"), P("b", None))
def _einsum(call: OpCall) -> object:
    """Einstein summation of one or two tensors, as numpy's and PyTorch's ``einsum``:
    ``einsum("bij,bjk->bik", a, b)`` is a batched product, ``"ij->ji"`` a transpose,
    ``"ij->j"`` a column sum, ``"i,j->ij"`` an outer product, ``"bhqd,bhkd->bhqk"``
    attention's scores; without ``->``, the result's letters are those that appear
    once, in alphabetical order. Two operands may also come as one list, as PyTorch
    allows. It is made of ``sum``, ``transpose``, ``reshape``, ``mul`` and ``matmul``
    (the letters summed over both operands become the product's inner dim, those of
    both kept its batch), so every backend, fusion and autodiff take it as those ops;
    the product's dtype rules apply (both operands of one dtype; f32 from bf16).
    Not supported, each an error at the call: ``...``, a letter twice in one operand (a
    diagonal or a trace), more than two operands (write two einsums)."""
    operands = call.raw("a")
    if isinstance(operands, (tuple, list)):
        if call.raw("b") != Const(None):
            raise call.error("give the operands as arguments or as one list, not both", at="b")
        tensors = _tensors(call, "a")
    else:
        tensors = [call.tensor("a")]
        if call.raw("b") != Const(None):
            tensors.append(call.tensor("b"))
    if len(tensors) > 2:
        raise call.error("takes one or two operands; write a product of more as two einsums",
                         at="a")  # fmt: skip
    terms, output = _einsum_terms(call, len(tensors))
    sizes: dict[str, Dim] = {}
    for t, term in zip(tensors, terms, strict=True):
        if len(term) != t.type.rank:
            raise call.error(
                f"the term {term!r} names {len(term)} axes of a tensor of {t.type.rank}: "
                f"{dims_text(t.type.dims)}",
                at="subscripts",
            )
        for c, d in zip(term, t.type.dims, strict=True):
            if c in sizes:
                call.same_dim(
                    d, sizes[c],
                    lambda c=c, d=d: f"{c!r} is {sizes[c]} in one operand and {d} in another",
                    f"einsum size of {c}", ("a", "b"),
                )  # fmt: skip
            sizes.setdefault(c, d)
    # letters of one operand alone that the result drops: summed first
    reduced = []
    for k, (t, term) in enumerate(zip(tensors, terms, strict=True)):
        others = "".join(u for j, u in enumerate(terms) if j != k) + output
        alone = tuple(i for i, c in enumerate(term) if c not in others)
        if alone:
            t = _then(call, "sum", t, alone, False)
            term = "".join(c for c in term if c in others)
        reduced.append((t, term))
    if len(reduced) == 1:
        x, term = reduced[0]
        return _in_order(call, x, term, output)
    (a, ta), (b, tb) = reduced
    batch = "".join(c for c in ta if c in tb and c in output)
    inner = "".join(c for c in ta if c in tb and c not in output)
    left = "".join(c for c in ta if c not in tb)
    right = "".join(c for c in tb if c not in ta)
    if not inner:  # an outer or elementwise product: a broadcasting mul
        a = _in_order(call, a, ta, batch + left)
        b = _in_order(call, b, tb, batch + right)
        a = _reshaped(call, a, (*a.type.dims, *(_ONE,) * len(right)))
        b = _reshaped(call, b, (*b.type.dims[: len(batch)], *(_ONE,) * len(left),
                                *b.type.dims[len(batch) :]))  # fmt: skip
        product = _then(call, "mul", a, b)
    else:
        batch_dims = tuple(sizes[c] for c in batch)
        a = _reshaped(call, _in_order(call, a, ta, batch + left + inner),
                      (*batch_dims, _merged(sizes, left), _merged(sizes, inner)))  # fmt: skip
        b = _reshaped(call, _in_order(call, b, tb, batch + inner + right),
                      (*batch_dims, _merged(sizes, inner), _merged(sizes, right)))  # fmt: skip
        product = _then(call, "matmul", a, b)
        product = _reshaped(call, product, (*batch_dims, *(sizes[c] for c in left + right)))
    return _in_order(call, product, batch + left + right, output)


# -------------------------------------------------------------------- running sums


@register("cumsum", P("x"), P("axis", None), P("dim", None, keyword_only=True))
def _cumsum(call: OpCall) -> object:
    """The running sums along ``axis`` (``dim`` is PyTorch's name), as numpy's and
    PyTorch's ``cumsum``: element ``i`` is the sum of elements ``0..i``; without an axis,
    of ``x`` flattened (numpy's). Same shape and dtype (an i32 stays i32, where numpy and
    PyTorch widen to int64; integers are exact below 2**24). It is a product with a
    triangle of ones, ``x @ triu(ones((n, n)))`` along the axis in f32, so it runs on
    every backend's product kernels and differentiates as a product (the reversed
    running sums of the cotangent); it costs ``n`` times a sum's work and an ``[n, n]``
    matrix of memory, so it suits axes of up to a few thousand elements. Also a
    method."""
    x = call.tensor("x")
    if is_mask(x):
        raise call.error(f"{call.ev('x').text} is a mask; cast it first", at="x")
    axis = _axis_argument(call, max(x.type.rank, 1))
    if isinstance(axis, tuple):
        raise call.error("takes one axis", at="axis" if call.given("axis") else "dim")
    dtype = x.type.dtype
    if axis is None or x.type.rank == 0:
        x = _reshaped(call, x, (math.prod(x.type.dims, start=_ONE),))
        axis = 0
    rank, n = x.type.rank, x.type.dims[axis]
    perm = (*(k for k in range(rank) if k != axis), axis)
    moved = _then(call, "transpose", _as_dtype(call, x, F32), perm)
    square = (n, n)
    above = _then(call, "sub", indices_of(call, square, 1), indices_of(call, square, 0))
    ones = _then(call, "where", _then(call, "greater_equal", above, 0.0), 1.0, 0.0)
    summed = _then(call, "matmul", moved, ones)
    back = tuple(perm.index(k) for k in range(rank))
    return _as_dtype(call, _then(call, "transpose", summed, back), dtype)
