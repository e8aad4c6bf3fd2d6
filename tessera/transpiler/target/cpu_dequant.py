"""Products whose right operand is a packed i4 weight, dequantized where the product
reads it (the CPU's ``tsr::mma_i4``).

A W4A16 tile kernel writes ``b = cast(cast(load(w_i4), f32) * s, bf16)`` (or, with
zero points, ``cast((cast(load(w_i4), f32) - z) * s, bf16)``) and then
``acc += dot(a, b)``: load a block of the packed weight, widen it, scale it by a row of
per-column scales and round it to the activations' dtype. Emitted op by op, each of these
steps walks a tile of floats (32 x 256, 32 KiB) in and out of the cache, and W4A16 ran at
a few percent of the bandwidth of reading the weight. When every step has the next as its
one reader, the CPU backend emits none of them and passes the weight's window and the
scales to the product, which dequantizes a panel of columns at a time in L1 as its
register blocks consume them, with the same bits.
"""

from __future__ import annotations

from ...frozen import frozen
from ..graph.dims import Dim
from ..graph.ir import Op, Value

__all__ = ["Dequantized", "dequantized_operands"]


@frozen
class Dequantized:
    """A product's right operand computed from a packed i4 load: the ``load`` of the
    weight's window, the ``scale`` tile (a row, ``[1, n]`` or ``[n]``), the ``zero``
    points subtracted before the scale (a row too, or None), the dtype the scaled weight
    is rounded to (``None``: it stays f32), and the ids of the results of the ops the
    product takes over."""

    load: Op
    scale: Value
    zero: Value | None
    rounding: str | None
    folded: frozenset[int]


def _dtype(v: Value) -> str | None:
    dtype = getattr(v.type, "dtype", None)
    return None if dtype is None else dtype.name


def _one_use(v: Value, uses: dict[int, int]) -> bool:
    return uses.get(v.id) == 1


def _chain(b: Value, defs: dict[int, Op], uses: dict[int, int]) -> Dequantized | None:
    """The dequantization that computes ``b``, when each step's result has one reader.
    Zeros past the weight's last row (``mask_edge``, which a zero point that shifts the
    masked rows away from zero asks for) come free: the product reads no row past it."""
    op = defs.get(b.id)
    masked = None
    if op is not None and op.kind == "mask_edge" and op.attr("axis") == 0 and _one_use(b, uses):
        masked, b = op, op.operands[0]
        op = defs.get(b.id)
    rounding = None
    if op is not None and op.kind == "cast" and _one_use(b, uses) and not op.attr("saturate"):
        rounding = _dtype(b) if _dtype(b) in ("bf16", "f16") else None
        if rounding is None and _dtype(b) != "f32":
            return None
        op = defs.get(op.operands[0].id)
    if op is None or op.kind != "mul" or _dtype(op.result) != "f32":
        return None
    if not _one_use(op.result, uses) or len(op.operands) != 2:
        return None
    for widened, scale in (op.operands, op.operands[::-1]):
        shifted, zero = _less_zero_points(widened, defs, uses)
        cast = defs.get(shifted.id)
        if cast is None or cast.kind != "cast" or not _one_use(shifted, uses):
            continue
        load = defs.get(cast.operands[0].id)
        if load is None or load.kind != "load" or not _one_use(load.result, uses):
            continue
        dims = getattr(shifted.type, "dims", ())
        if _dtype(load.result) != "i4" or _dtype(shifted) != "f32" or len(dims) != 2:
            continue
        if not all(v is None or _row(v, dims[1]) for v in (scale, zero)):
            continue
        if masked is not None and not _rows_end(masked, load):
            continue
        steps = (load, cast, op, defs[b.id]) + ((defs[widened.id],) if zero else ())
        steps += (masked,) if masked is not None else ()
        folded = frozenset(o.result.id for o in steps)
        return Dequantized(load, scale, zero, rounding, folded)
    return None


def _rows_end(mask: Op, load: Op) -> bool:
    """Whether ``mask`` zeroes the rows of the loaded window from the weight's last on:
    the rows that the product, bounded by the load's own, never reads."""
    rows = load.attr("at").tile_axes[0]
    return mask.attr("offset") == rows.offset and mask.attr("extent") == rows.extent


def _less_zero_points(
    v: Value, defs: dict[int, Op], uses: dict[int, int]
) -> tuple[Value, Value | None]:
    """``v`` as ``widened - zero`` (the widened weight and its zero points) where a
    subtraction read by nothing else gives it, else ``v`` with no zero points."""
    op = defs.get(v.id)
    if op is None or op.kind != "sub" or len(op.operands) != 2 or not _one_use(v, uses):
        return v, None
    if _dtype(v) != "f32":
        return v, None
    return op.operands[0], op.operands[1]


def _row(v: Value, columns: Dim) -> bool:
    """Whether ``v`` is a row of f32s, one per column: ``[1, n]`` or ``[n]``."""
    dims = tuple(getattr(v.type, "dims", ()))
    return _dtype(v) == "f32" and dims in ((Dim.const(1), columns), (columns,))


def dequantized_operands(
    ops: tuple[Op, ...] | list[Op], uses: dict[int, int]
) -> dict[int, Dequantized]:
    """The right operands of the block's accumulating products (``mma``) that are a
    packed i4 weight dequantized in the same block, by the operand's id."""
    defs = {r.id: op for op in ops for r in op.results}
    found = {}
    for op in ops:
        if op.kind == "mma":
            chain = _chain(op.operands[1], defs, uses)
            if chain is not None:
                found[op.operands[1].id] = chain
    return found
