"""Tile-level operations: what a tile kernel's program instance does with its tiles.

A tile kernel calls ``tile.context()`` and works on tiles whose sizes are the
context's symbolic tile dims (``T.m``, ``T.n``, ``T.k``, ``T.d``); the
schedule stage gives them values. These rules type the seeds' FlashAttention
kernel and its relatives; each checks its tiles' dims against each other.
"""

from __future__ import annotations

from .dims import Dim
from .dtypes import F32, I32, accumulator
from .dtypes import Policies as _Policies
from .graph_ops import broadcast, register
from .ir import Value
from .opcall import OpCall, P
from .types import BlockType, ScalarType, TensorType, TileType, dims_text
from .values import Const, DimValue, ShapeValue

__all__ = ["TILE_DIMS"]

#: The attributes of ``tile.context()``: each a symbolic tile size.
TILE_DIMS = {
    "m": "rows of the output block",
    "n": "columns of the output block, or the key/value block",
    "k": "the reduction step",
    "d": "the head dim",
    "vector": "elements per vector load",
}


def _tile_shape(call: OpCall, name: str) -> tuple[Dim, ...]:
    value = call.raw(name)
    items = (
        value.value if isinstance(value, Const) and isinstance(value.value, (tuple, list)) else None
    )
    if items is None or not items:
        raise call.error(f"'{name}' must be a tuple of sizes such as (T.m, T.d)", at=name)
    dims = []
    for item in items:
        if isinstance(item, Dim):
            dims.append(item)
        elif isinstance(item, int) and not isinstance(item, bool) and item > 0:
            dims.append(Dim.const(item))
        else:
            raise call.error(f"'{name}' holds {item!r}, which is not a size", at=name)
    return tuple(dims)


def _same(call: OpCall, a: Dim, b: Dim, what: str) -> None:
    call.same_dim(a, b, lambda: f"{what}: {a} and {b} differ", what)


@register("tile.load", P("src"), P("block", None), P("rows", None, keyword_only=True),
          P("cols", None, keyword_only=True), P("vector", None, keyword_only=True),
          P("prefetch", None, keyword_only=True), level="tile")  # fmt: skip
def _load(call: OpCall) -> object:
    """Load a tile of a tensor argument: ``rows`` x ``cols`` (default: the whole last dim).
    With a block index from ``tile.range_n``, the rows are that block. ``vector`` and
    ``prefetch`` are hints for the schedule."""
    src = call.raw("src")
    if not isinstance(src, Value) or not isinstance(src.type, TensorType):
        raise call.error("'src' must be a tensor parameter of the kernel", at="src")
    if src.type.rank < 2:
        raise call.error(f"'src' needs at least 2 dims; {call.shape_of('src')}", at="src")
    block = call.raw("block")
    attrs: tuple = ()
    if isinstance(block, Value) and isinstance(block.type, BlockType):
        rows = block.type.size
        _same(
            call,
            block.type.extent,
            src.type.dims[-2],
            f"the block ranges over {block.type.extent} rows but "
            f"{call.ev('src').text} has {src.type.dims[-2]}",
        )
        operands: tuple[Value, ...] = (src, block)
    elif isinstance(block, Const) and block.value is None:
        if not call.given("rows"):
            raise call.error(
                "needs rows= (a tile size such as T.m) or a block index from tile.range_n"
            )
        rows = call.dim("rows")
        operands = (src,)
    else:
        raise call.error("'block' must be a block index from tile.range_n", at="block")
    cols = call.dim("cols") if call.given("cols") else src.type.dims[-1]
    for hint in ("vector", "prefetch"):
        if call.given(hint):
            attrs += ((hint, str(call.dim(hint))),)
    return call.emit("tile.load", operands, TileType((rows, cols), src.type.dtype), attrs=attrs)


@register("tile.store", P("dst"), P("value"), P("block", None), level="tile")
def _store(call: OpCall) -> object:
    """Store a tile into a tensor argument (a write effect). Returning a tile from a tile
    kernel stores it into the result; ``tile.store`` writes other outputs."""
    dst = call.raw("dst")
    if not isinstance(dst, Value) or not isinstance(dst.type, TensorType):
        raise call.error("'dst' must be a tensor parameter of the kernel", at="dst")
    value = call.tensor("value")
    if value.type.dtype != dst.type.dtype:
        raise call.error(
            f"stores {value.type.dtype} into {dst.type.dtype}; tile.cast it first", at="value"
        )
    return call.emit("tile.store", (dst, value), effects=("write",))


@register("tile.dot", P("a"), P("b"), level="tile")
def _dot(call: OpCall) -> object:
    """Tile matrix product ``[M, K] x [K, N] -> [M, N]``, accumulated in f32 (or the
    operand's ``@accum`` dtype)."""
    a, b = call.tensor("a"), call.tensor("b")
    if a.type.rank != 2 or b.type.rank != 2:
        raise call.error(f"takes 2-D tiles: {call.shape_of('a')}, {call.shape_of('b')}")
    call.same_dim(
        a.type.dims[1], b.type.dims[0],
        lambda: f"inner dimensions differ: {call.shape_of('a')}, {call.shape_of('b')}",
        "inner dimension",
    )  # fmt: skip
    if a.type.dtype != b.type.dtype:
        raise call.error(f"operands have different dtypes: {a.type.dtype} and {b.type.dtype}")
    out = TileType((a.type.dims[0], b.type.dims[1]), accumulator(a.type.dtype, _Policies()))
    return call.emit("tile.dot", (a, b), out)


@register("tile.transpose", P("x"), level="tile")
def _transpose(call: OpCall) -> object:
    """Swap the two dims of a 2-D tile."""
    x = call.tensor("x")
    if x.type.rank != 2:
        raise call.error(f"takes a 2-D tile; {call.shape_of('x')}", at="x")
    return call.emit("tile.transpose", (x,), x.type.with_(dims=x.type.dims[::-1]))


@register("tile.zeros", P("shape"), P("dtype", None), level="tile")
def _zeros(call: OpCall) -> object:
    """A tile of zeros of ``shape`` (a tuple of sizes) and ``dtype`` (default f32)."""
    dims = _tile_shape(call, "shape")
    dtype = F32 if not call.given("dtype") else call.dtype("dtype")
    return call.emit("tile.full", (), TileType(dims, dtype), attrs=(("value", 0.0),))


@register("tile.full", P("shape"), P("value"), P("dtype", None), level="tile")
def _full(call: OpCall) -> object:
    """A tile of ``shape`` filled with the number ``value`` (``-INF`` included)."""
    dims = _tile_shape(call, "shape")
    value = call.number("value")
    dtype = F32 if not call.given("dtype") else call.dtype("dtype")
    return call.emit("tile.full", (), TileType(dims, dtype), attrs=(("value", value),))


@register("tile.cast", P("x"), P("dtype"), level="tile")
def _cast(call: OpCall) -> object:
    """Convert a tile to ``dtype``, rounding to nearest even."""
    x = call.tensor("x")
    dtype = call.dtype("dtype")
    return call.emit("tile.cast", (x,), x.type.with_(dtype=dtype), attrs=(("dtype", dtype),))


@register("tile.rsqrt", P("x"), level="tile")
def _rsqrt(call: OpCall) -> object:
    """``1 / sqrt(x)`` of a tile or of a float scalar (``tile.rsqrt(float(T.d))``)."""
    x = call.raw("x")
    if isinstance(x, Value) and x.type == ScalarType("float"):
        return call.emit("rsqrt", (x,), x.type)
    x = call.tensor("x")
    return call.emit("tile.rsqrt", (x,), x.type)


@register("tile.softmax_online", P("s"), level="tile")
def _softmax_online(call: OpCall) -> object:
    """One step of online softmax over the rows of a score tile ``[M, N]``: returns
    ``P`` (``exp(s - m_c)``, ``[M, N]``), the block's row maxima ``m_c`` and row sums
    ``l_c`` (``[M]`` each), all f32."""
    s = call.tensor("s")
    if s.type.rank != 2:
        raise call.error(f"takes a 2-D score tile; {call.shape_of('s')}", at="s")
    rows = s.type.dims[0]
    return call.emit(
        "tile.softmax_online", (s,),
        TileType(s.type.dims, F32), TileType((rows,), F32), TileType((rows,), F32),
    )  # fmt: skip


@register("tile.softmax_accumulate", P("acc"), P("m"), P("l"), P("p"), P("v"), P("m_c"), P("l_c"),
          level="tile")  # fmt: skip
def _softmax_accumulate(call: OpCall) -> object:
    """Fold a block into the running attention state: rescale ``acc [M, D]``, ``m`` and
    ``l`` (``[M]``) to the new row maxima and add ``p [M, N] x v [N, D]``. Returns the new
    ``acc, m, l``."""
    acc, m, l_, p, v, m_c, l_c = (call.tensor(n) for n in ("acc", "m", "l", "p", "v", "m_c", "l_c"))
    rows, width = acc.type.dims if acc.type.rank == 2 else (None, None)
    if rows is None:
        raise call.error(f"'acc' must be a 2-D tile; {call.shape_of('acc')}", at="acc")
    for name, value in (("m", m), ("l", l_), ("m_c", m_c), ("l_c", l_c)):
        if value.type.rank != 1:
            raise call.error(
                f"'{name}' must be a row vector [{rows}]; {call.shape_of(name)}", at=name
            )
        _same(
            call,
            value.type.dims[0],
            rows,
            f"'{name}' has {value.type.dims[0]} rows, acc has {rows}",
        )
    if p.type.rank != 2 or v.type.rank != 2:
        raise call.error(f"'p' and 'v' must be 2-D: {call.shape_of('p')}, {call.shape_of('v')}")
    _same(call, p.type.dims[0], rows, f"'p' has {p.type.dims[0]} rows, acc has {rows}")
    _same(
        call,
        p.type.dims[1],
        v.type.dims[0],
        f"'p' has {p.type.dims[1]} columns, v has {v.type.dims[0]} rows",
    )
    _same(call, v.type.dims[1], width, f"'v' has {v.type.dims[1]} columns, acc has {width}")
    return call.emit(
        "tile.softmax_accumulate", (acc, m, l_, p, v, m_c, l_c), acc.type, m.type, l_.type
    )


@register("tile.mask_causal", P("s"), P("rows"), P("cols"), level="tile", in_place=True)
def _mask_causal(call: OpCall) -> object:
    """Set ``s[i, j]`` to ``-inf`` where column ``cols[j]`` is after row ``rows[i]``.
    Updates ``s`` in place: ``tile.mask_causal(S, tile.row_index(), tile.col_index(b))``."""
    s, rows, cols = call.tensor("s"), call.tensor("rows"), call.tensor("cols")
    if s.type.rank != 2:
        raise call.error(f"takes a 2-D score tile; {call.shape_of('s')}", at="s")
    _same(
        call,
        rows.type.dims[0],
        s.type.dims[0],
        f"row indices cover {rows.type.dims[0]} rows, the tile has {s.type.dims[0]}",
    )
    _same(
        call,
        cols.type.dims[0],
        s.type.dims[1],
        f"column indices cover {cols.type.dims[0]} columns, the tile has {s.type.dims[1]}",
    )
    return call.emit("tile.mask_causal", (s, rows, cols), s.type)


@register("tile.row_index", level="tile")
def _row_index(call: OpCall) -> object:
    """The global row index of each row of this program's output block: ``[T.m]`` i32."""
    return call.emit("tile.row_index", (), TileType((Dim.sym("T.m"),), I32))


@register("tile.col_index", P("block"), level="tile")
def _col_index(call: OpCall) -> object:
    """The global column index of each column of a block from ``tile.range_n``: ``[size]`` i32."""
    block = call.raw("block")
    if not isinstance(block, Value) or not isinstance(block.type, BlockType):
        raise call.error("'block' must be a block index from tile.range_n", at="block")
    return call.emit("tile.col_index", (block,), TileType((block.type.size,), I32))


@register("tile.broadcast", P("x"), P("shape"), level="tile")
def _broadcast(call: OpCall) -> object:
    """Stretch a tile to ``shape``; dims of size 1 stretch, others must match."""
    x = call.tensor("x")
    dims = _tile_shape(call, "shape")
    out = broadcast(call, "x", "shape", x.type.dims, dims)
    if len(out) != len(dims):
        raise call.error(f"cannot broadcast {dims_text(x.type.dims)} to {dims_text(dims)}")
    return call.emit("tile.broadcast", (x,), x.type.with_(dims=dims))


@register("tile.range_n", P("extent"), P("block"), P("prefetch", None, keyword_only=True),
          level="tile")  # fmt: skip
def _range_n(call: OpCall) -> object:
    """Loop over ``extent`` in blocks of ``block`` rows: ``for b in tile.range_n(k.shape,
    T.n, prefetch=2)``. ``extent`` is a size, or a tensor's shape, whose second-to-last dim
    (its rows) is used. ``prefetch`` is how many blocks to load ahead."""
    raise call.error("can only be used as the iterable of a 'for' loop")


def range_extent(call: OpCall) -> tuple[Dim, Dim, str | None]:
    """``tile.range_n``'s (extent, block, prefetch), for the analyser's ``for`` loop."""
    extent_value = call.raw("extent")
    if isinstance(extent_value, ShapeValue):
        if len(extent_value.dims) < 2:
            raise call.error("the shape has fewer than 2 dims", at="extent")
        extent = extent_value.dims[-2]
    elif isinstance(extent_value, DimValue):
        extent = extent_value.dim
    else:
        extent = call.dim("extent")
    block = call.dim("block")
    prefetch = str(call.dim("prefetch")) if call.given("prefetch") else None
    return extent, block, prefetch
