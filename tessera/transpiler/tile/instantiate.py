"""Instantiate a tile kernel for a fused Graph IR group: the standard library's, or the
one that a ``tile_call`` runs (the file's own kernel that a graph function calls, or a
library kernel that a graph pass calls, ``graph.dequantized``).

A group anchored at ``matmul``, ``flash_attention``, ``softmax``, ``layernorm``,
``rmsnorm`` or ``rotary_embedding`` gets its library kernel typed for its operands
(``graph.library.stdlib_kernel``). The group's other ops (bias, activation, residual,
cast) become the epilogue, applied to the result tile before it is stored. Elementwise
ops that compute the anchor's first operand (``softmax(x * scale)``) become its
prologue, applied where the kernel loads that operand; a group of elementwise ops alone
is the prologue of the ``elementwise`` kernel, which only loads it. The kernel that a
``tile_call`` runs was typed for its arguments when the call was made; its group's
elementwise ops after it are its epilogue likewise.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..graph.dims import Dim
from ..graph.dtypes import DType
from ..graph.graph_ops import DRAWN, rows_permuted, view_starts
from ..graph.ir import Function, Op, Value, new_value
from ..graph.library import TEMPLATE_PARAMS, stdlib_kernel
from ..graph.types import ScalarType, TensorType, TileType, in_memory
from .ir import Access, Axis
from .lower import KernelInput, Prologue, View
from .rewrite import rewrite

__all__ = [
    "TEMPLATE_PARAMS", "stdlib_kernel", "instantiate", "chain_builder", "kept_axis_dropped",
    "merged_rows", "rows_permuted_load", "view_of",
]  # fmt: skip


def instantiate(
    group_ops: list[Op], anchor: Op | None, template: str, params: tuple[Value, ...],
    rename: dict[int, Value], views: dict[int, View], name: str, function: str, kind: str,
    beside: dict[int, Value] | None = None,
) -> tuple[Function, KernelInput]:  # fmt: skip
    """The typed kernel for a group, and how to lower it: the library kernel
    ``template``, or for a ``tile_call`` the file's tile kernel that it calls. ``rename``
    maps the graph values the group reads and writes to the kernel's parameters; the
    last parameter is the output, unless ``views`` stores the group's result through
    one; ``views`` also has the anchor's operands that the kernel reads where they lie.
    Without an ``anchor`` (a group of elementwise ops) the kernel is ``elementwise`` and
    every op is its prologue, which also stores the values of ``beside`` (by value id,
    the parameter each goes to) where it computes them: they have the result's shape.
    An anchor of several results (``attention_dkdv``) is alone in its group, and its
    kernel returns a tile for each, stored into each result's parameter."""
    split = group_ops.index(anchor) if anchor is not None else len(group_ops)
    prologue, epilogue = group_ops[:split], group_ops[split + 1 :]
    if anchor is not None and anchor.kind == "tile_call":
        fn, bind = _called_kernel(anchor, rename)
    else:
        fn, bind = _library_kernel(group_ops, anchor, template, prologue, rename, views, beside)
    several = anchor.results if anchor is not None and len(anchor.results) > 1 else ()
    output = rename[several[0].id] if several else views.get(group_ops[-1].result.id, params[-1])
    given = KernelInput(
        name, function, params, bind, output,
        chain_builder(epilogue, rename, anchor.result) if epilogue and anchor else None,
        template, kind, tuple(rename[r.id] for r in several[1:]),
    )  # fmt: skip
    return fn, given


def _called_kernel(anchor: Op, rename: dict[int, Value]) -> tuple[Function, dict[int, Any]]:
    """The tile kernel that a ``tile_call`` runs, typed for its arguments when the call
    was made (``TileCallee``), and its parameters bound: each argument the op reads to
    the kernel parameter it maps to, each number (a scalar given as a constant, or a
    default) to itself, and a tensor the call leaves out (``constants`` maps it to None:
    a library kernel's absent zero points) to nothing."""
    fn = anchor.attr("kernel").function
    read = dict(zip(anchor.attr("params"), anchor.operands, strict=True))
    numbers = dict(anchor.attr("constants"))
    bind: dict[int, Any] = {}
    for param in fn.params:
        name = param.value.name
        bind[param.value.id] = rename[read[name].id] if name in read else numbers[name]
    return fn, bind


def _library_kernel(
    group_ops: list[Op], anchor: Op | None, template: str, prologue: list[Op],
    rename: dict[int, Value], views: dict[int, View], beside: dict[int, Value] | None,
) -> tuple[Function, dict[int, Any]]:  # fmt: skip
    """The library kernel ``template`` typed for the group, and its parameters bound:
    each operand to its kernel parameter, or to the prologue that computes it where it
    is loaded (and stores the values of ``beside``), and each keyword parameter to the
    anchor's attribute (``_keyword``)."""
    if anchor is None:
        tensors: tuple[Value, ...] = (group_ops[-1].result,)
        results = (group_ops[-1].result.type,)
    else:
        results = tuple(r.type for r in anchor.results)
        if anchor.attr("keepdims"):
            results = (kept_axis_dropped(anchor.result.type),)
    # a norm's weight and bias are optional: absent ones are bound to nothing, and the
    # kernel's with_weight and with_bias branches leave them unread
    names = tuple(n for n in TEMPLATE_PARAMS[template] if _has_operand(anchor, n))
    if anchor is not None:
        tensors = anchor.operands[: len(names)]
    span = (anchor or group_ops[-1]).span
    operands = tuple(in_memory(v.type) for v in tensors)
    fn = stdlib_kernel(template, operands, tuple(in_memory(t) for t in results), span, names)
    if anchor is not None and anchor.kind == "matmul":
        fn = narrow_accumulation(fn, anchor.result.type.dtype)
    bind: dict[int, Any] = {}
    for param in fn.params:
        if param.value.name not in TEMPLATE_PARAMS[template]:
            assert anchor is not None
            bind[param.value.id] = _keyword(anchor, param.value.name, tensors, rename)
            continue
        if param.value.name not in names:
            bind[param.value.id] = None
            continue
        tensor = tensors[names.index(param.value.name)]
        if prologue and prologue[-1].result is tensor:  # computed where it is loaded
            build = chain_builder(prologue, rename, stores=beside)
            bind[param.value.id] = Prologue(new_value(tensor.type, param.value.name), build)
        else:
            bind[param.value.id] = views.get(tensor.id) or rename[tensor.id]
    return fn, bind


def narrow_accumulation(fn: Function, dtype: DType) -> Function:
    """A matmul whose result is a 16-bit float accumulates in it (``@accum(bf16)``,
    ``@accum(f16)``): each dot of its library kernel says so, for legalization (which
    runs it on FMAs, in order) and the emitters (which round the running sum to ``dtype``
    after each product is added: ``docs/numerics.md``)."""
    if not (dtype.is_float and dtype.bits == 16):
        return fn

    def visit(op: Op) -> list[Op]:
        if op.kind != "tile.dot":
            return [op]
        return [dataclasses.replace(op, attrs=(*op.attrs, ("accum", dtype)))]

    return dataclasses.replace(fn, body=rewrite(fn.body, visit))


def kept_axis_dropped(t: TensorType) -> TensorType:
    """A reduction's result with ``keepdims=True`` as its kernel writes it: the kept
    axis has one element, so the layout is the same without it."""
    return dataclasses.replace(t, dims=t.dims[:-1])


def _has_operand(anchor: Op | None, name: str) -> bool:
    """Whether the op gives the library kernel's tensor parameter ``name``: all but a
    norm's absent weight or bias, which its attribute of that name says are absent."""
    return anchor is None or anchor.attr(name) is not False


def _keyword(anchor: Op, name: str, tensors: tuple[Value, ...], rename: dict[int, Value]) -> Any:
    """A library kernel's keyword parameter, from the graph op's attributes; ``with_X``
    says whether the op has the operand ``X`` (a norm's weight or bias), and a scale
    given at run time is the op's last operand, a parameter of the kernel."""
    if name.startswith("with_"):
        return _has_operand(anchor, name.removeprefix("with_"))
    value = anchor.attr(name)
    if name == "scale" and value == "scalar":
        return rename[anchor.operands[-1].id]
    if name == "scale" and value is None:
        head_dim = tensors[0].type.dims[-1]
        if head_dim.constant is not None:
            return 1.0 / math.sqrt(head_dim.constant)
        return lambda lowering: lowering.rsqrt_of(head_dim)
    assert value is not None, f"{anchor.kind} gives no {name}"
    if isinstance(value, Dim):  # a float parameter that depends on the sizes
        if value.constant is not None:
            return float(value.constant)
        return lambda lowering: lowering.float_of(value)
    return value


def chain_builder(
    ops: list[Op], rename: dict[int, Value], first: Value | None = None,
    stores: dict[int, Value] | None = None,
) -> Any:  # fmt: skip
    """A function that applies a chain of the group's elementwise ops at a place: to
    the kernel's result tile, the value ``first`` (an epilogue), or, without one, to
    the tensors the ops read, loaded there (a prologue). A value of ``stores`` (by value
    id, the tensor it goes to, of the place's shape) is stored there once computed."""
    stores = stores or {}

    def build(lowering: Any, tile: Value | None, access: Access) -> Value:
        inside = {first.id: tile} if first is not None and tile is not None else {}
        dims = tile.type.dims if tile is not None else tuple(a.size for a in access.tile_axes)
        tiles = tile.type.tiles if tile is not None else _tiles_of(lowering.sizes, dims)
        current = tile
        for op in ops:
            if op.kind == "expand_dims" and op.operands[0].id not in inside:
                view = rename[op.operands[0].id]
                current = _epilogue_operand(
                    lowering, view, access, op.result.type, op.attr("axes"), tiles=tiles
                )
                inside[op.result.id] = current
                continue
            if rows_permuted(op) and op.operands[0].id not in inside:
                current = rows_permuted_load(lowering, view_of(op, rename), access)
                inside[op.result.id] = current
                continue
            if op.kind == "reshape" and op.operands[0].id not in inside:
                # the parameter has the reshape's dims (``build``; fusion copies a view of
                # a tensor the kernel also reads otherwise): loading it reshapes
                current = _epilogue_operand(
                    lowering, rename[op.operands[0].id], access, tiles=tiles
                )
                inside[op.result.id] = current
                continue
            for v in op.operands:  # each tensor loaded once, however many ops read it
                if v.id not in inside:
                    inside[v.id] = _epilogue_operand(
                        lowering, rename[v.id], access, span=op.span, tiles=tiles
                    )
            operands = tuple(inside[v.id] for v in op.operands)
            scalar = isinstance(op.result.type, ScalarType)  # computed once, not per element
            result_type = op.result.type if scalar else TileType(dims, op.result.type.dtype, tiles)
            # dropout draws by the element's place in the tensor: where the tile lies
            attrs = (*op.attrs, ("at", access)) if op.kind in DRAWN else op.attrs
            (value,) = lowering.emit(
                op.kind, operands, (result_type,), attrs, op.effects, (), op.span,
                (op.result.name,),
            )  # fmt: skip
            inside[op.result.id] = value
            current = current if scalar else value
            if op.result.id in stores:
                lowering.emit("store", (stores[op.result.id], value), (), (("at", access),),
                              ("write",), (), op.span)  # fmt: skip
        assert current is not None
        return current

    return build


def _tiles_of(sizes: dict[str, int], dims: tuple[Dim, ...]) -> tuple[str | None, ...]:
    """The schedule's tile each of a prologue's dims is: its window's axes are the
    schedule's blocks, so a dim is the one tile (of ``sizes``) of its size; a size that
    two tiles share, or none, is no tile's."""
    by_size: dict[int, list[str]] = {}
    for tile, size in sizes.items():
        by_size.setdefault(size, []).append(tile)
    found = (by_size.get(d.constant, []) if d.constant is not None else [] for d in dims)
    return tuple(names[0] if len(names) == 1 else None for names in found)


def merged_rows(t: TensorType, perm: tuple[int, ...]) -> TensorType:
    """``t`` with the axes after ``perm[-2]`` (the one that becomes the rows) as one: the
    dims a transpose that keeps the last axis reads its operand with."""
    rows = perm[-2]
    columns = math.prod(t.dims[rows + 1 :], start=Dim.const(1))
    return dataclasses.replace(t, dims=(*t.dims[: rows + 1], columns))


def view_of(op: Op, rename: dict[int, Value]) -> View:
    """The view that a row permutation ``op`` (a transpose, or a part of ``split_qkv``)
    gives of the kernel parameter its operand maps to."""
    return View(op.result, rename[op.operands[0].id], op.attr("perm"), view_starts(op))


def rows_permuted_load(lowering: Any, view: View, out: Access) -> Value:
    """Load the part of the view's tensor that lines up with ``out`` where it lies in
    the view's source, broadcast as any tensor is (``h[:, 3:4]`` read by a kernel over
    ``[R, C]`` gives each row's one element to all its columns)."""
    return _epilogue_operand(lowering, view.tensor, out, through=view)


def _epilogue_operand(
    lowering: Any, value: Value, out: Access, view: TensorType | None = None,
    inserted: tuple[int, ...] = (), through: View | None = None, span: Any = None,
    tiles: tuple[str | None, ...] | None = None,
) -> Value:  # fmt: skip
    """Load the part of an outside tensor that lines up with the output tile (a bias
    of ``[N]`` gives the tile's columns, broadcast over its rows). ``view`` is the
    tensor seen with new axes of one element at ``inserted`` (``s[:, None]``, whose
    ``[R]`` then gives the tile's rows, broadcast over its columns); ``through`` is
    a view that ``value`` is read through, where it lies in the view's source. The
    tile is named after the tensor (``bias_tile``), and ``span`` is the op that reads it;
    ``tiles`` are the schedule's tiles of the output tile's dims, which the loaded tile's
    dims that line up with them are too."""
    if isinstance(value.type, ScalarType):
        return value
    dims = (view or value.type).dims
    axes = []
    of_out = [i for i, a in enumerate(out.axes) if not a.index]
    tile_of = dict(zip(of_out, tiles, strict=True)) if tiles and len(tiles) == len(of_out) else {}
    names: list[str | None] = []
    for place_at, extent in enumerate(dims, len(out.axes) - len(dims)):
        place = out.axes[place_at]
        if extent == Dim.const(1) and place.extent != extent:
            axes.append(Axis(Dim.const(0), Dim.const(1), extent, index=place.index))
            names.append(None)
        else:
            # the output's extent where it is this size spelled as the kernel's (``K``)
            same = place.extent.spelled is not None and place.extent == extent
            axes.append(dataclasses.replace(place, extent=place.extent if same else extent))
            names.append(tile_of.get(place_at))
    access = Access(tuple(a for i, a in enumerate(axes) if i not in inserted))
    source = value
    if through is not None:
        access, source = through.access(access), through.source
    sizes = tuple(a.size for a in access.tile_axes)
    held = tuple(
        t
        for i, (a, t) in enumerate(zip(axes, names, strict=True))
        if not a.index and i not in inserted
    )
    loaded_tiles = (
        held if through is None and tiles is not None else _tiles_of(lowering.sizes, sizes)
    )
    name = f"{value.name}_tile" if value.name else None
    loaded_type = TileType(sizes, source.type.dtype, loaded_tiles)
    (loaded,) = lowering.emit("load", (source,), (loaded_type,),
                              (("at", access),), span=span, names=(name,))  # fmt: skip
    missing = len(out.tile_axes) - len(Access(tuple(axes)).tile_axes)
    tile_axis = [i for i, a in enumerate(axes) if not a.index]
    new = tuple(range(missing)) + tuple(
        missing + tile_axis.index(i) for i in inserted if not axes[i].index
    )
    if new:
        shape = tuple(a.size for a in Access(tuple(axes)).tile_axes)
        kept = tuple(t for a, t in zip(axes, names, strict=True) if not a.index)
        expanded = (None,) * missing + kept if tiles is not None else None
        (loaded,) = lowering.emit(
            "expand_dims", (loaded,),
            (TileType((Dim.const(1),) * missing + shape, value.type.dtype, expanded),),
            (("axes", new),),
        )  # fmt: skip
    return loaded
