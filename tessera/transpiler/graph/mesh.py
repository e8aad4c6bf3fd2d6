"""Meshes and shard specs: which device holds which block of each tensor.

A function that holds a ``with mesh(axes={"dp": 2, "tp": 2}):`` block runs on every
device of the mesh at once (SPMD), each device on its shard. Types keep the global
view: a parameter ``Tensor["B", "D", f32] @shard("dp", None)`` is the whole ``[B, D]``
tensor, split along its first dim over the mesh axis ``dp``. The function's body is
the program of one device, so its values have the per-device shapes this module
computes (``[B/2, D]`` on a mesh where ``dp`` is 2).

A size that a parameter takes split (``B`` above) is known at run time only through
its shard, so it becomes ``n * B_local``, where ``B_local`` is the size of the shard
the device is given; a size no parameter takes split stays as it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import field
from typing import Any

from ...frozen import frozen
from ..frontend import ast
from ..frontend.diagnostics import did_you_mean
from ..frontend.printer import print_expr
from ..frontend.source import Span
from .dims import Dim
from .opcall import SemanticError
from .types import TensorType

__all__ = ["Mesh", "ShardSpec", "find_mesh", "shard_spec", "Localizer", "MESH_EXAMPLE"]

MESH_EXAMPLE = 'with mesh(axes={"dp": 2, "tp": 2}):'

#: One entry per dim of a tensor: the mesh axis it is split over, or None (whole).
ShardSpec = tuple[str | None, ...]


@frozen
class Mesh:
    """Named axes and their sizes, in the order written; rank ``r`` of the world has the
    coordinates of ``r`` in row-major order over the axes (the last axis varies fastest)."""

    axes: tuple[tuple[str, int], ...]
    #: sums combine the devices' values in rank order: the same bits on every run
    deterministic: bool = False
    #: the largest message of a bucket of all-reduced tensors (a data-parallel step's
    #: gradients), in MiB
    bucket_mb: int = 16
    span: Span | None = field(default=None, compare=False, repr=False)

    def size(self, axis: str) -> int:
        return dict(self.axes)[axis]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def devices(self) -> int:
        return math.prod(n for _, n in self.axes)

    def __str__(self) -> str:
        text = ", ".join(f"{name} = {n}" for name, n in self.axes)
        text += f", bucket_mb = {self.bucket_mb}" if self.bucket_mb != 16 else ""
        return text + (", deterministic" if self.deterministic else "")

    def check_axis(self, axis: str, span: Span | None) -> None:
        """An error at ``span`` unless ``axis`` is one of the mesh's."""
        if axis not in self.names:
            raise SemanticError(
                f"the mesh has no axis '{axis}'{did_you_mean(axis, self.names)}; its axes: "
                f"{', '.join(self.names)}",
                span,
            )


def _mesh_calls(body: Iterable[ast.Stmt]) -> Iterable[ast.Call]:
    for stmt in body:
        if isinstance(stmt, ast.With):
            for item in stmt.items:
                call = item.context
                if isinstance(call, ast.Call) and print_expr(call.func) == "mesh":
                    yield call
            yield from _mesh_calls(stmt.body)
        elif isinstance(stmt, ast.If):
            yield from _mesh_calls(stmt.body)
            yield from _mesh_calls(stmt.orelse)
        elif isinstance(stmt, ast.For):
            yield from _mesh_calls(stmt.body)


def find_mesh(body: tuple[ast.Stmt, ...], evaluate: Callable[[ast.Expr], Any]) -> Mesh | None:
    """The mesh of the function's ``with mesh(...)`` blocks (all must name the same one),
    or None; ``evaluate`` gives a compile-time expression's value (a ``Const``)."""
    found: Mesh | None = None
    for call in _mesh_calls(body):
        mesh = parse_mesh(call, evaluate)
        if found is not None and mesh != found:
            raise SemanticError(
                f"a function runs on one mesh: this one is {{{mesh}}}, an earlier block's "
                f"{{{found}}}",
                call.span,
            )
        found = found or mesh
    return found


def parse_mesh(call: ast.Call, evaluate: Callable[[ast.Expr], Any]) -> Mesh:
    """``mesh(axes={"dp": 2, "tp": 2}, deterministic=True)``, checked."""
    keywords = {k.name: k.value for k in call.keywords}
    if call.args or "axes" not in keywords or set(keywords) - {"axes", "deterministic",
                                                               "bucket_mb"}:  # fmt: skip
        raise SemanticError(
            f"mesh(...) takes its axes and their sizes, deterministic= and bucket_mb=: "
            f"{MESH_EXAMPLE}",
            call.span,
        )
    bucket = 16
    if "bucket_mb" in keywords:
        bucket = getattr(evaluate(keywords["bucket_mb"]), "value", None)
        if isinstance(bucket, bool) or not isinstance(bucket, int) or not 1 <= bucket <= 1024:
            raise SemanticError(
                f"bucket_mb= is a whole number of MiB from 1 to 1024, not {bucket!r}",
                keywords["bucket_mb"].span,
            )
    deterministic = False
    if "deterministic" in keywords:
        deterministic = getattr(evaluate(keywords["deterministic"]), "value", None)
        if not isinstance(deterministic, bool):
            raise SemanticError("deterministic= is True or False", keywords["deterministic"].span)
    node = keywords["axes"]
    value = getattr(evaluate(node), "value", None)
    if not isinstance(value, dict) or not value:
        raise SemanticError(
            f"axes= is a dict of axis names and device counts: {MESH_EXAMPLE}", node.span
        )
    axes = []
    for name, size in value.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise SemanticError(f"a mesh axis is named by an identifier, not {name!r}", node.span)
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 4096:
            raise SemanticError(
                f"mesh axis '{name}' has 1 to 4096 devices, not {size!r}", node.span
            )
        axes.append((name, size))
    return Mesh(tuple(axes), deterministic, bucket, call.span)


def shard_policy(node: ast.TypeExpr | None) -> ast.Policy | None:
    """The ``@shard(...)`` of a type annotation, if it has one."""
    if node is None:
        return None
    return next((p for p in node.policies if p.name == "shard"), None)


def shard_spec(policy: ast.Policy, rank: int, mesh: Mesh | None) -> ShardSpec:
    """``@shard("dp", None)``: the mesh axis of each dim, checked against the mesh."""
    if mesh is None:
        raise SemanticError(
            f"@shard needs a mesh: put the function's body in a '{MESH_EXAMPLE}' block",
            policy.span,
        )
    if policy.keywords or len(policy.args) != rank:
        raise SemanticError(
            f"@shard gives one entry per dim, a mesh axis or None: {rank} for this "
            f"tensor, as in @shard({', '.join(['None'] * rank)})",
            policy.span,
        )
    spec: list[str | None] = []
    for arg in policy.args:
        if isinstance(arg, ast.NoneLit):
            spec.append(None)
            continue
        if not isinstance(arg, ast.StrLit):
            raise SemanticError(
                f"a @shard entry is a mesh axis name or None, not {print_expr(arg)}", arg.span
            )
        mesh.check_axis(arg.value, arg.span)
        if arg.value in spec:
            raise SemanticError(f"mesh axis '{arg.value}' splits two dims of one tensor", arg.span)
        spec.append(arg.value)
    return tuple(spec)


class Localizer:
    """The per-device types of a mesh function's parameters and result.

    ``sharded`` lists each (global type, spec) that parameters declare: a size that
    some parameter takes split by ``n`` devices becomes ``L * S_local`` (``L`` the
    least common multiple of those ``n``), so that a shard's size binds it."""

    def __init__(
        self, mesh: Mesh, sharded: Iterable[tuple[TensorType, ShardSpec]], taken: set[str]
    ) -> None:
        self.mesh = mesh
        counts: dict[str, int] = {}
        for t, spec in sharded:
            for dim, axis in zip(t.dims, spec, strict=True):
                if axis is not None and dim.symbol is not None:
                    counts[dim.symbol] = math.lcm(counts.get(dim.symbol, 1), mesh.size(axis))
        #: the global sizes, as multiples of the per-device ones
        self.sizes: dict[str, Dim] = {}
        for symbol, n in sorted(counts.items()):
            local = f"{symbol}_local"
            while local in taken:
                local += "_"
            taken.add(local)
            self.sizes[symbol] = Dim.sym(local) * n

    def local(self, t: TensorType, spec: ShardSpec | None, what: str, span: Span) -> TensorType:
        """``t`` as one device holds it; a constant dim that does not split evenly is an
        error at ``span``."""
        spec = spec or (None,) * t.rank
        dims = []
        for i, (dim, axis) in enumerate(zip(t.dims, spec, strict=True)):
            dim = dim.substitute(self.sizes)
            if axis is not None:
                n = self.mesh.size(axis)
                if dim.constant is not None and dim.constant % n:
                    raise SemanticError(
                        f"dim {i} of {what} is {dim.constant}, which the {n} devices of mesh "
                        f"axis '{axis}' cannot split evenly",
                        span,
                    )
                dim = dim / n
            dims.append(dim)
        return TensorType(tuple(dims), t.dtype, t.policies)
