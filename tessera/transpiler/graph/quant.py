"""``quantize`` and ``dequantize``: a tensor to i8 or fp8 with scales, and back.

Both are elementwise math the graph already has (``round``, a saturating ``cast``,
``*``), so every target runs them and fuses them like any other elementwise op; this
module only checks the scales' shapes and writes that math. The scales' granularity
follows from their shape, against ``x`` of shape ``[..., K, N]``:

- ``[1]``: one scale for the whole tensor;
- any shape that broadcasts to ``x``'s (NumPy's rules): ``[N]`` one per column (the output
  channels of a weight used as ``a @ w``), ``[K, 1]`` one per row;
- with ``group=G``, ``[..., K/G, N]``: one per column for each group of ``G`` consecutive
  rows, as GPTQ and AWQ store them. ``G`` must divide ``K``.

``docs/numerics.md`` gives the rounding of each step.
"""

from __future__ import annotations

from .dims import Dim
from .dtypes import F32, saturation_error
from .graph_ops import broadcast, register
from .ir import Value
from .opcall import OpCall, P
from .types import TensorType, dims_text

__all__ = ["QUANTIZED"]

#: The dtypes a tensor is quantized to.
QUANTIZED = ("i8", "i4", "fp8_e4m3", "fp8_e5m2")


@register(
    "quantize", P("x"), P("scale"), P("dtype"),
    P("zero_point", None, keyword_only=True), P("group", None, keyword_only=True),
)  # fmt: skip
def _quantize(call: OpCall) -> object:
    """``x`` (a float tensor) in ``dtype`` (i8, fp8_e4m3 or fp8_e5m2) with ``scale``:
    ``round(x * (1 / scale)) + zero_point`` for i8 (ties to even), ``x * (1 / scale)``
    for fp8, converted with saturation (past the dtype's range, its largest value). The
    scale's shape says its granularity: ``[1]`` per tensor, a shape that broadcasts
    (``[N]``) per column, ``[K/G, N]`` with ``group=G`` per group of ``G`` rows."""
    dtype = call.dtype("dtype")
    if dtype.name not in QUANTIZED:
        raise call.error(f"quantizes to {', '.join(QUANTIZED)}, not {dtype}", at="dtype")
    x = _float(call, "x")
    grouped = _Grouped(call, x)
    inverse = call.emit("div", (grouped.scale,), TensorType(grouped.scale.type.dims, F32),
                        attrs=(("a", 1.0),))  # fmt: skip
    scaled = grouped.binary("mul", grouped.x, inverse)
    if grouped.zero_point is not None:
        if dtype.is_float:
            raise call.error("a zero point applies to i8 and i4, not to fp8 dtypes",
                             at="zero_point")  # fmt: skip
        scaled = grouped.binary("add", grouped.unary("round", scaled), grouped.zero_point)
    elif not dtype.is_float:
        scaled = grouped.unary("round", scaled)
    assert saturation_error(dtype) is None
    q = call.emit("cast", (scaled,), TensorType(scaled.type.dims, dtype),
                  attrs=(("dtype", dtype), ("saturate", True)))  # fmt: skip
    return grouped.ungroup(q)


@register(
    "dequantize", P("q"), P("scale"), P("zero_point", None, keyword_only=True),
    P("group", None, keyword_only=True), P("dtype", None, keyword_only=True),
)  # fmt: skip
def _dequantize(call: OpCall) -> object:
    """``(q - zero_point) * scale`` in f32, as ``dtype`` (f32 unless given): ``q`` an i8,
    i4 or fp8 tensor, ``scale`` shaped as ``quantize``'s. ``x @ dequantize(q, ...)`` of
    an i8 or i4 weight is one kernel that dequantizes it a block at a time in the
    product's main loop, with the same bits (``docs/numerics.md``)."""
    q = call.tensor("q")
    if q.type.dtype.name not in QUANTIZED:
        raise call.error(
            f"dequantizes {', '.join(QUANTIZED)} tensors; {call.ev('q').text} is "
            f"{q.type.dtype}",
            at="q",
        )
    dtype = F32 if not call.given("dtype") else call.dtype("dtype")
    if not dtype.is_float:
        raise call.error(f"dequantizes to a float dtype, not {dtype}", at="dtype")
    grouped = _Grouped(call, q)
    wide = call.emit("cast", (grouped.x,), TensorType(grouped.x.type.dims, F32),
                     attrs=(("dtype", F32),))  # fmt: skip
    if grouped.zero_point is not None:
        wide = grouped.binary("sub", wide, grouped.zero_point)
    y = grouped.binary("mul", wide, grouped.scale)
    if dtype != F32:
        y = call.emit("cast", (y,), TensorType(y.type.dims, dtype), attrs=(("dtype", dtype),))
    return grouped.ungroup(y)


def _float(call: OpCall, name: str) -> Value:
    x = call.tensor(name)
    if not x.type.dtype.is_float:
        raise call.error(f"{call.ev(name).text} must be a float tensor, not {x.type.dtype}",
                         at=name)  # fmt: skip
    return x


class _Grouped:
    """``x`` and its scale (and zero point) as the math sees them: with ``group=G``,
    ``x`` ``[..., K, N]`` as ``[..., K/G, G, N]`` and the scales ``[..., K/G, N]`` as
    ``[..., K/G, 1, N]``, so that they broadcast; otherwise as they are."""

    def __init__(self, call: OpCall, x: Value) -> None:
        self.call = call
        self.dims = x.type.dims
        scale = _float(call, "scale")
        zero_point = call.tensor("zero_point") if call.given("zero_point") else None
        group = None if not call.given("group") else call.const("group", int)
        self.group = group
        if group is None:
            for name, v in (("scale", scale), ("zero_point", zero_point)):
                if v is not None:
                    self._broadcasts(name, v)
            self.x, self.scale, self.zero_point = x, scale, zero_point
            return
        if group < 1:
            raise call.error(f"group must be a positive number of rows, not {group}", at="group")
        if len(self.dims) < 2:
            raise call.error(f"groups are of rows: {call.shape_of(_first(call))} has none",
                             at="group")  # fmt: skip
        k = self.dims[-2]
        if k.constant is not None and k.constant % group:
            raise call.error(
                f"group {group} does not divide the {k} rows of {call.ev(_first(call)).text}",
                at="group",
            )
        if k.constant is None:
            call.emitter.guard("divisible", k, Dim.const(group),
                               f"{call.shown}: group {group} divides {k}", call.span)  # fmt: skip
        grouped = (*self.dims[:-2], k / group, Dim.const(group), self.dims[-1])
        per_group = (*self.dims[:-2], k / group, self.dims[-1])
        for name, v in (("scale", scale), ("zero_point", zero_point)):
            if v is not None and v.type.dims != per_group:
                raise call.error(
                    f"with group={group}, {name} must be {dims_text(per_group)} (one per "
                    f"column for each {group} rows), but {call.shape_of(name)}",
                    at=name,
                )
        self.x = self._reshape(x, grouped)
        one = (*self.dims[:-2], k / group, Dim.const(1), self.dims[-1])
        self.scale = self._reshape(scale, one)
        self.zero_point = None if zero_point is None else self._reshape(zero_point, one)

    def _broadcasts(self, name: str, v: Value) -> None:
        first = _first(self.call)
        if broadcast(self.call, first, name, self.dims, v.type.dims) != self.dims:
            raise self.call.error(
                f"{name} must broadcast to {dims_text(self.dims)} ([1], or one per column: "
                f"[{self.dims[-1]}]; group=G for groups of rows), but "
                f"{self.call.shape_of(name)}",
                at=name,
            )

    def _reshape(self, v: Value, dims: tuple[Dim, ...]) -> Value:
        return self.call.emit("reshape", (v,), TensorType(dims, v.type.dtype),
                              attrs=(("shape", dims),))  # fmt: skip

    def binary(self, kind: str, a: Value, b: Value) -> Value:
        dims = broadcast(self.call, _first(self.call), "scale", a.type.dims, b.type.dims)
        return self.call.emit(kind, (a, b), TensorType(dims, F32))

    def unary(self, kind: str, a: Value) -> Value:
        return self.call.emit(kind, (a,), TensorType(a.type.dims, F32))

    def ungroup(self, v: Value) -> Value:
        if self.group is None:
            return v
        return self._reshape(v, self.dims)


def _first(call: OpCall) -> str:
    return "x" if "x" in call.args else "q"
