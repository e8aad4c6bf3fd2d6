"""Tile-level operations: what a tile kernel's program instance does with its tiles.

A tile kernel calls ``tile.context()`` and works on tiles whose sizes are the
context's symbolic tile dims (``T.m``, ``T.n``, ``T.k``, ``T.d``); the
schedule stage gives them values. These rules type the seeds' FlashAttention
kernel and its relatives; each checks its tiles' dims against each other.
"""

from __future__ import annotations

from collections.abc import Callable

from .dims import Dim
from .dtypes import F32, I32, accumulator
from .dtypes import Policies as _Policies
from .graph_ops import UNARY_DOCS, broadcast, cast_attrs, register
from .ir import Value
from .not_yet import not_yet
from .opcall import OpCall, P
from .types import BlockType, ScalarType, TensorType, TileType, dims_text
from .values import Const, DimValue, Ev, ShapeValue

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


def _axis(call: OpCall, name: str, extent: Dim) -> tuple[str, Dim, Value | None]:
    """How a load or store covers one axis of a tensor, from ``rows=`` or ``cols=``.

    A size is the program's own block of that size; a block index from
    ``tile.range_n`` is that block, whose extent must be the axis; nothing is
    the whole axis.
    """
    value = call.raw(name)
    if isinstance(value, Value) and isinstance(value.type, BlockType):
        group = _group(value.type, extent)
        if group is not None:
            return "block", value.type.size / group, value
        _same(
            call, value.type.extent, extent,
            f"the block ranges over {value.type.extent} but that axis of "
            f"{call.ev('src' if call.given('src') else 'dst').text} has {extent}",
        )  # fmt: skip
        return "block", value.type.size, value
    if isinstance(value, Const) and value.value is None:
        return "all", extent, None
    return "program", call.dim(name), None


def _group(block: BlockType, extent: Dim) -> int | None:
    """``G`` where a block of ``tile.range_n`` over ``K`` indexes an axis of ``K/G``
    elements, one per group of ``G`` (a per-group scale): the block then covers the
    groups of its own rows, ``size / G`` of them. None where the axis is not such, or
    ``G`` does not divide the block's (constant) size."""
    if extent == block.extent or len(extent.terms) != 1:
        return None
    ratio, size = (block.extent / extent).constant, block.size.constant
    if ratio is None or ratio < 2 or size is None or size % ratio:
        return None
    return ratio


def _access(call: OpCall, tensor: Value, what: str) -> tuple[tuple[Dim, ...], tuple, tuple]:
    """The tile dims, block operands and attrs of a load from or store into ``tensor``."""
    dims = tensor.type.dims
    if len(dims) == 1:
        if call.given("rows") and call.given("cols"):
            raise call.error("a 1-D tensor takes rows= or cols=, not both", at="cols")
        axis = "rows" if call.given("rows") else "cols"
        mode, size, block = _axis(call, axis, dims[0])
        return (size,), ((block,) if block is not None else ()), ((axis, mode),)
    if not call.given("rows"):
        raise call.error(
            f"needs rows= (a tile size such as T.m) or a block index from tile.range_n "
            f"to say which rows of {call.ev(what).text} it covers"
        )
    row_mode, rows, row_block = _axis(call, "rows", dims[-2])
    col_mode, cols, col_block = _axis(call, "cols", dims[-1])
    blocks = tuple(b for b in (row_block, col_block) if b is not None)
    return (rows, cols), blocks, (("rows", row_mode), ("cols", col_mode))


@register("tile.load", P("src"), P("rows", None), P("cols", None, keyword_only=True),
          P("vector", None, keyword_only=True), P("prefetch", None, keyword_only=True),
          level="tile")  # fmt: skip
def _load(call: OpCall) -> object:
    """Load a tile of a tensor argument. ``rows`` and ``cols`` each take a size (this
    program's own block of that size) or a block index from ``tile.range_n`` (that
    block); ``cols`` left out is the whole last dim. The rows may be given positionally:
    ``tile.load(k, nblk, cols=T.d)``. A block over ``K`` (of a constant size that ``G``
    divides) also indexes an axis of ``K/G``, one element per group of ``G``: its rows
    of a per-group scale ``[K/G, N]``. A 1-D tensor takes ``rows=`` or ``cols=``, or
    neither for the whole vector. ``vector`` and ``prefetch`` are hints that do nothing
    yet (the schedule decides both), and warn."""
    src = call.raw("src")
    if not isinstance(src, Value) or not isinstance(src.type, TensorType):
        raise call.error("'src' must be a tensor parameter of the kernel", at="src")
    dims, blocks, attrs = _access(call, src, "src")
    for hint in ("vector", "prefetch"):
        if call.given(hint):
            attrs += ((hint, str(call.dim(hint))),)
            call.warn(not_yet(f"{hint}="), at=hint)
    return call.emit("tile.load", (src, *blocks), TileType(dims, src.type.dtype), attrs=attrs)


@register("tile.store", P("dst"), P("value"), P("rows", None, keyword_only=True),
          P("cols", None, keyword_only=True), level="tile")  # fmt: skip
def _store(call: OpCall) -> object:
    """Store a tile into a tensor argument (a write effect), at the place ``rows`` and
    ``cols`` give, as for ``tile.load``; by default this program's own block of the
    tile's size. Returning a tile from a tile kernel stores it into the result;
    ``tile.store`` writes other outputs and updates arguments in place."""
    dst = call.raw("dst")
    if not isinstance(dst, Value) or not isinstance(dst.type, TensorType):
        raise call.error("'dst' must be a tensor parameter of the kernel", at="dst")
    value = call.tensor("value")
    if value.type.rank != min(dst.type.rank, 2):
        raise call.error(
            f"stores a rank-{value.type.rank} tile into {call.shape_of('dst')}", at="value"
        )
    if value.type.dtype != dst.type.dtype:
        raise call.error(
            f"stores {value.type.dtype} into {dst.type.dtype}; tile.cast it first", at="value"
        )
    if not call.given("rows") and not (dst.type.rank == 1 and call.given("cols")):
        call.args = {**call.args, "rows": _size_ev(call, value.type.dims[0])}
    if dst.type.rank >= 2 and not call.given("cols"):
        call.args = {**call.args, "cols": _size_ev(call, value.type.dims[-1])}
    dims, blocks, attrs = _access(call, dst, "dst")
    for have, want in zip(value.type.dims, dims, strict=True):
        _same(
            call,
            have,
            want,
            f"the tile is {dims_text(value.type.dims)}, the place {dims_text(dims)}",
        )
    return call.emit("tile.store", (dst, value, *blocks), attrs=attrs, effects=("write",))


def _size_ev(call: OpCall, dim: Dim) -> Ev:
    return Ev(DimValue(dim), call.span, str(dim))


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


@register("tile.cast", P("x"), P("dtype"), P("saturate", False, keyword_only=True), level="tile")
def _cast(call: OpCall) -> object:
    """Convert a tile to ``dtype``, rounding to nearest even; ``saturate=True`` clamps
    values past the dtype's range to its largest finite value, as ``cast`` does."""
    x = call.tensor("x")
    dtype = call.dtype("dtype")
    return call.emit("tile.cast", (x,), x.type.with_(dtype=dtype), attrs=cast_attrs(call, dtype))


#: The graph's elementwise math, and relu, which tiles of integers may take too.
_TILE_MATH = {**UNARY_DOCS, "relu": "``max(x, 0)``"}


def _tile_math(kind: str) -> Callable[[OpCall], object]:
    def rule(call: OpCall) -> object:
        x = call.raw("x")
        if isinstance(x, Value) and x.type == ScalarType("float"):
            return call.emit(kind, (x,), x.type)
        x = call.tensor("x")
        if not x.type.dtype.is_float and kind != "relu":
            raise call.error(
                f"needs a floating-point tile; {call.ev('x').text} is {x.type.dtype}", at="x"
            )
        return call.emit(f"tile.{kind}", (x,), x.type)

    rule.__doc__ = f"Elementwise {_TILE_MATH[kind]} of a tile, or of a float scalar."
    return rule


for _kind in _TILE_MATH:
    register(f"tile.{_kind}", P("x"), level="tile")(_tile_math(_kind))


def _tile_reduce(kind: str) -> Callable[[OpCall], object]:
    def rule(call: OpCall) -> object:
        x = call.tensor("x")
        axis = call.axis("axis", x.type.rank)
        dims = x.type.dims[:axis] + x.type.dims[axis + 1 :]
        if not dims:
            raise call.error("reduces a 1-D tile to a scalar, which tiles do not hold", at="x")
        return call.emit(f"tile.{kind}", (x,), x.type.with_(dims=dims), attrs=(("axis", axis),))

    rule.__doc__ = (
        f"The {'maximum' if kind == 'max' else 'sum'} of a tile along ``axis``, which is "
        f"dropped: ``tile.{kind}(s, axis=1)`` is the row "
        f"{'maxima' if kind == 'max' else 'sums'} of ``s``."
    )
    return rule


for _kind in ("max", "sum"):
    register(f"tile.{_kind}", P("x"), P("axis"), level="tile")(_tile_reduce(_kind))


@register("tile.min", P("x"), P("axis"), level="tile")
def _tile_min(call: OpCall) -> object:
    """The minimum of a tile along ``axis``, which is dropped: ``-tile.max(-x, axis)``,
    exactly."""
    x = call.tensor("x")
    negated = call.emit("neg", (x,), x.type)
    axis = call.axis("axis", x.type.rank)
    dims = x.type.dims[:axis] + x.type.dims[axis + 1 :]
    if not dims:
        raise call.error("reduces a 1-D tile to a scalar, which tiles do not hold", at="x")
    top = call.emit("tile.max", (negated,), x.type.with_(dims=dims), attrs=(("axis", axis),))
    return call.emit("neg", (top,), top.type)


#: The most tiles one split gives: each is a value of its own (a split of a symbolic dim
#: into 2**63 parts once exhausted the compiler's memory).
_MAX_PARTS = 64


@register("tile.split", P("x"), P("parts"), P("axis"), level="tile")
def _split(call: OpCall) -> object:
    """Split a tile into ``parts`` equal tiles along ``axis``: ``x1, x2 = tile.split(t, 2,
    axis=1)`` gives the two halves of each row."""
    x = call.tensor("x")
    parts = call.const("parts", int)
    axis = call.axis("axis", x.type.rank)
    if not 2 <= parts <= _MAX_PARTS:
        raise call.error(f"parts must be 2 to {_MAX_PARTS}, not {parts}", at="parts")
    size = x.type.dims[axis] / parts
    if not size.is_integral:
        if x.type.dims[axis].constant is not None:
            raise call.error(f"{x.type.dims[axis]} does not split into {parts} equal parts", at="x")
        call.emitter.guard(
            "divisible", x.type.dims[axis], Dim.const(parts), "tile.split", call.span
        )
    dims = (*x.type.dims[:axis], size, *x.type.dims[axis + 1 :])
    part = x.type.with_(dims=dims)
    return call.emit("tile.split", (x,), *([part] * parts), attrs=(("axis", axis),))


@register("tile.concat", P("tiles"), P("axis"), level="tile")
def _concat(call: OpCall) -> object:
    """Join a tuple of tiles along ``axis``, as ``np.concatenate``; the other dims and
    the dtype must agree. Any tiles join, on every target: loaded tiles, elementwise
    results, row vectors (``mean[:, None]``) and products (a ``tile.dot`` accumulator).
    On the GPU targets and OpenCL a product's elements are spread over the threads in
    registers, so a concat with one goes through shared memory (local memory in
    OpenCL): each such piece is written to a staging buffer, then the joined tile is
    read from it, at a barrier's cost and the buffers' bytes
    (``docs/opencl-backend.md``)."""
    tiles = call.raw("tiles")
    if (
        not isinstance(tiles, tuple)
        or len(tiles) < 2
        or not all(isinstance(t, Value) and isinstance(t.type, TileType) for t in tiles)
    ):
        raise call.error("'tiles' must be a tuple of two or more tiles: (a, b)", at="tiles")
    first = tiles[0].type
    axis = call.axis("axis", first.rank)
    total = Dim.const(0)
    for t in tiles:
        if t.type.rank != first.rank or t.type.dtype != first.dtype:
            raise call.error(f"joins {first} with {t.type}", at="tiles")
        for i, (a, b) in enumerate(zip(t.type.dims, first.dims, strict=True)):
            if i != axis:
                _same(call, a, b, f"the tiles differ in dim {i}: {a} and {b}")
        total = total + t.type.dims[axis]
    dims = (*first.dims[:axis], total, *first.dims[axis + 1 :])
    return call.emit("tile.concat", tiles, first.with_(dims=dims), attrs=(("axis", axis),))


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
    """The global column index of each column of a block from ``tile.range_n``: ``[size]``
    i32; or, given a size ``n`` (``x.shape[-1]``), the indices ``0 .. n-1`` of a whole row,
    which a kernel whose programs own whole rows compares and gathers with."""
    block = call.raw("block")
    if isinstance(block, DimValue):
        return call.emit("tile.col_index", (), TileType((block.dim,), I32))
    if not isinstance(block, Value) or not isinstance(block.type, BlockType):
        raise call.error(
            "'block' must be a block index from tile.range_n, or a size (x.shape[-1])",
            at="block",
        )
    return call.emit("tile.col_index", (block,), TileType((block.type.size,), I32))


@register("tile.gather", P("x"), P("index"), level="tile")
def _gather(call: OpCall) -> object:
    """Elements of each row of ``x`` picked by an integer tile: ``out[i, j] = x[i,
    index[i, j]]`` (numpy's ``take_along_axis`` over the last axis). ``index`` has
    ``x``'s rows; the result has ``index``'s shape and ``x``'s dtype. An index outside
    ``[0, columns)`` is clamped into it, so no read is out of bounds: a graph function's
    ``take_along_axis`` checks its index parameter's range before the launch."""
    x, index = _rows_and_index(call, "gathers from")
    return call.emit("tile.gather", (x, index), x.type.with_(dims=index.type.dims))


@register("tile.scatter", P("x"), P("index"), P("values"), level="tile")
def _scatter(call: OpCall) -> object:
    """``x`` with each row's ``values`` written where an integer tile says: ``out[i,
    index[i, j]] = values[i, j]`` (numpy's ``put_along_axis`` over the last axis), the
    last ``j`` winning where a row repeats an index. ``index`` and ``values`` have one
    shape and ``x``'s rows; the result has ``x``'s shape and dtype. An index outside
    ``[0, columns)`` is clamped into it, so no write is out of bounds."""
    return _scattered(call, "tile.scatter")


@register("tile.scatter_add", P("x"), P("index"), P("values"), level="tile")
def _scatter_add(call: OpCall) -> object:
    """``x`` with each row's ``values`` added where an integer tile says: ``out[i,
    index[i, j]] += values[i, j]``, a repeated index summing in ``j`` order (numpy's
    ``add.at``), the same on every target. Shapes and clamping as ``tile.scatter``."""
    return _scattered(call, "tile.scatter_add")


def _scattered(call: OpCall, kind: str) -> Value:
    x, index = _rows_and_index(call, "scatters into")
    values = call.tensor("values")
    if values.type.rank != 2:
        raise call.error(f"the values are a 2-D tile, not {dims_text(values.type.dims)}")
    for a, b in zip(values.type.dims, index.type.dims, strict=True):
        _same(call, a, b, "the values' shape and the index's")
    return call.emit(kind, (x, index, values), x.type)


def _rows_and_index(call: OpCall, verb: str) -> tuple[Value, Value]:
    """(x, index) of a gather or a scatter along rows: an integer 2-D index with the
    rows of the 2-D ``x``."""
    x, index = call.tensor("x"), call.tensor("index")
    if index.type.dtype.kind != "int":
        raise call.error(
            f"the index must be an integer tile; {call.ev('index').text} is {index.type.dtype}",
            at="index",
        )
    if x.type.rank != 2 or index.type.rank != 2:
        raise call.error(
            f"{verb} rows of a 2-D tile by a 2-D index; {dims_text(x.type.dims)} by "
            f"{dims_text(index.type.dims)}"
        )
    _same(call, x.type.dims[0], index.type.dims[0], "the index's rows and x's")
    return x, index


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
    (its rows) is used. ``prefetch`` is a hint that does nothing yet: the schedule's
    ``stages`` decide how many blocks are loaded ahead."""
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
    if block.constant is None and not all(name.startswith("T.") for name in block.symbols()):
        # a block's tiles are staged in shared memory, whose size a kernel fixes
        raise call.error(
            f"the block must be known when the kernel compiles, a number or a tile size "
            f"(T.k, T.n), not {call.ev('block').text}; the extent comes first: "
            "tile.range_n(extent, block)",
            at="block",
        )
    prefetch = str(call.dim("prefetch")) if call.given("prefetch") else None
    return extent, block, prefetch
