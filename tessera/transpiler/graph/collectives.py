"""The collectives: graph ops that exchange values between the devices of a mesh.

Each works on the value one device holds (the body of a mesh function is one device's
program) and carries the ``collective`` effect: every device must reach the same
collectives in the same order, so no pass reorders, merges or removes one. A
collective names the mesh axis (or axes) it runs over, and is written inside the
function's ``with mesh(...)`` block.
"""

from __future__ import annotations

from .dims import Dim
from .graph_ops import elementwise_type, register
from .ir import Function, Op, Value
from .opcall import OpCall, P, SemanticError
from .types import TensorType
from .values import Const

__all__ = ["COLLECTIVES", "REDUCTIONS", "group_size", "collective_of"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
REDUCTIONS = ("sum", "max", "min", "mean")


def collective_of(function: Function, group: int) -> tuple[Op, tuple[Value, ...]]:
    """The collective of a kernel that fusion made around one, and where each of its
    operands lies: the group may also hold views of an operand (the reshape of a full
    reduction's result), which share its memory, so the collective reads the viewed
    tensor where it lies."""
    ops = [function.body.ops[i] for i in function.groups[group].ops]
    found = [op for op in ops if op.kind in COLLECTIVES]
    views = {op.result.id: op.operands[0] for op in ops if op.kind == "reshape"}
    assert len(found) == 1 and len(views) == len(ops) - 1, ops
    sources = []
    for v in found[0].operands:
        while v.id in views:
            v = views[v.id]
        sources.append(v)
    return found[0], tuple(sources)


def _axes(call: OpCall) -> tuple[str, ...]:
    """The mesh axes the collective runs over, checked against the enclosing mesh."""
    scope = getattr(call.emitter, "mesh_scope", lambda: None)()
    given = call.raw("axis")
    given = given.value if isinstance(given, Const) else given
    if scope is None:
        raise call.error(
            "a collective runs inside the function's 'with mesh(...)' block, over one of "
            "its axes: this function is not mapped over a mesh here"
        )
    if given is None:
        return scope.names
    names = given if isinstance(given, (tuple, list)) else (given,)
    if not names or not all(isinstance(n, str) for n in names):
        raise call.error("axis= is a mesh axis name, or a tuple of them", at="axis")
    for name in names:
        try:
            scope.check_axis(name, None)
        except SemanticError as exc:
            raise call.error(exc.message, at="axis") from None
    if len(set(names)) != len(names):
        raise call.error("axis= names a mesh axis twice", at="axis")
    return tuple(n for n in scope.names if n in names)


def group_size(call: OpCall, axes: tuple[str, ...]) -> int:
    scope = call.emitter.mesh_scope()
    n = 1
    for axis in axes:
        n *= scope.size(axis)
    return n


def _reduction(call: OpCall) -> str:
    """The reduction ``op``; the values it combines are f32 or i32 (MPI's own types)."""
    dtype = call.tensor("x").type.dtype.name
    if dtype not in ("f32", "i32"):
        raise call.error(f"combines f32 or i32 values, not {dtype}: cast(x, f32) first", at="x")
    op = call.const("op", str)
    if op not in REDUCTIONS:
        raise call.error(f"op must be sum, max, min or mean, not {op!r}", at="op")
    return op


def _split(call: OpCall, dim: Dim, n: int, at: str) -> Dim:
    """``dim / n``: an error where ``dim`` is a constant that does not split evenly, a
    run-time check otherwise."""
    if dim.constant is not None:
        if dim.constant % n:
            raise call.error(
                f"dim {call.raw(at).value} is {dim.constant}, which {n} devices cannot split "
                "evenly",
                at=at,
            )
        return Dim.const(dim.constant // n)
    call.emitter.guard(
        "divisible", dim, Dim.const(n), f"{call.shown}: the dim it splits", call.span
    )
    return dim / n


def _emit(call: OpCall, kind: str, result: TensorType, attrs: tuple) -> object:
    x = call.tensor("x")
    return call.emit(kind, (x,), result, attrs=attrs, effects=("collective",))


def _with_dims(t: TensorType, changes: dict[int, Dim]) -> TensorType:
    return TensorType(tuple(changes.get(i, d) for i, d in enumerate(t.dims)), t.dtype)


@register("all_reduce", P("x"), P("axis", None, keyword_only=True),
          P("op", "sum", keyword_only=True))  # fmt: skip
def _all_reduce(call: OpCall) -> object:
    """Combine ``x`` across the devices of the mesh axis ``axis`` (a name, a tuple of
    names, or every axis when not given) with ``op`` (``"sum"``, ``"max"``, ``"min"`` or
    ``"mean"``): same shape and dtype on every device."""
    x = call.tensor("x")
    axes = _axes(call)
    op = _reduction(call)
    return _emit(call, "all_reduce", elementwise_type(x), (("axis", ",".join(axes)), ("op", op)))


@register("all_gather", P("x"), P("axis", None, keyword_only=True),
          P("dim", 0, keyword_only=True))  # fmt: skip
def _all_gather(call: OpCall) -> object:
    """Every device's ``x``, joined along ``dim`` in the order of the devices on
    ``axis``: that dim grows by the number of devices."""
    x = call.tensor("x")
    axes = _axes(call)
    dim = call.axis("dim", x.type.rank)
    n = group_size(call, axes)
    result = _with_dims(elementwise_type(x), {dim: x.type.dims[dim] * n})
    return _emit(call, "all_gather", result, (("axis", ",".join(axes)), ("dim", dim)))


@register("reduce_scatter", P("x"), P("axis", None, keyword_only=True),
          P("dim", 0, keyword_only=True), P("op", "sum", keyword_only=True))  # fmt: skip
def _reduce_scatter(call: OpCall) -> object:
    """``all_reduce`` of ``x``, of which each device keeps its block along ``dim`` (the
    ``i``-th device on ``axis`` the ``i``-th block): that dim shrinks by the number of
    devices, which must divide it."""
    x = call.tensor("x")
    axes = _axes(call)
    op = _reduction(call)
    dim = call.axis("dim", x.type.rank)
    local = _split(call, x.type.dims[dim], group_size(call, axes), "dim")
    result = _with_dims(elementwise_type(x), {dim: local})
    return _emit(
        call, "reduce_scatter", result, (("axis", ",".join(axes)), ("dim", dim), ("op", op))
    )


@register("all_to_all", P("x"), P("axis", None, keyword_only=True),
          P("split_dim", 0, keyword_only=True), P("concat_dim", 0, keyword_only=True))  # fmt: skip
def _all_to_all(call: OpCall) -> object:
    """Split ``x`` along ``split_dim`` into one block per device of ``axis``, send the
    ``i``-th block to the ``i``-th device, and join the blocks received along
    ``concat_dim``, in device order (the exchange that moves a sharded dim)."""
    x = call.tensor("x")
    axes = _axes(call)
    split = call.axis("split_dim", x.type.rank)
    concat = call.axis("concat_dim", x.type.rank)
    n = group_size(call, axes)
    block = _with_dims(x.type, {split: _split(call, x.type.dims[split], n, "split_dim")})
    result = _with_dims(elementwise_type(x), {**dict(enumerate(block.dims)),
                                              concat: block.dims[concat] * n})  # fmt: skip
    attrs = (("axis", ",".join(axes)), ("split_dim", split), ("concat_dim", concat))
    return _emit(call, "all_to_all", result, attrs)
