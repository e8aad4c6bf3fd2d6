"""The Graph IR: typed SSA operations on tensors, grouped into kernels.

Values are defined once; an operation consumes values and defines new ones,
in program order. Tile kernels use two structured operations with regions,
``tile.for`` (a loop with loop-carried values) and ``if``, in the manner of
MLIR's ``scf`` dialect. Everything is a frozen dataclass carrying the source
span it came from; passes rebuild with ``dataclasses.replace``.
"""

from __future__ import annotations

import itertools
from dataclasses import field
from typing import Any

from ...frozen import frozen
from ..frontend.source import Span
from .dims import Dim
from .schedule_spec import ScheduleSpec
from .types import TupleType, ValueType

__all__ = [
    "Value",
    "Op",
    "Block",
    "Guard",
    "Group",
    "Param",
    "StateSlot",
    "Function",
    "GraphModule",
    "TileCallee",
    "new_value",
    "walk",
    "result_names",
    "RESULT",
]

#: The name a function's result goes by from the Tile IR on, and the keyword a call
#: passes a preallocated result under (``f(x, out=y)``). No parameter may have it
#: (semantic analysis says so), so that only a declared result is ever taken for one.
RESULT = "out"

_ids = itertools.count()


@frozen(eq=False)
class Value:
    """An SSA value. Compared by identity; ``name`` is the source name, for printing."""

    type: ValueType
    name: str | None = None
    span: Span | None = field(default=None, repr=False)
    id: int = field(default_factory=lambda: next(_ids))


def new_value(type: ValueType, name: str | None = None, span: Span | None = None) -> Value:
    return Value(type, name, span)


@frozen
class Block:
    """A region body: arguments, operations in order, and the values it yields."""

    args: tuple[Value, ...]
    ops: tuple[Op, ...]
    yields: tuple[Value, ...] = ()


@frozen
class Op:
    """One operation. ``attrs`` keep their order; ``effects`` pin the op in place."""

    kind: str
    operands: tuple[Value, ...]
    results: tuple[Value, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    effects: tuple[str, ...] = ()
    regions: tuple[Block, ...] = ()
    span: Span | None = field(default=None, compare=False, repr=False)
    #: Whether the op is part of a backward pass (``@autodiff``, ``grad``), for the memory
    #: plan, which says what the backward reads of the forward's values.
    backward: bool = field(default=False, compare=False, repr=False)

    def attr(self, name: str, default: Any = None) -> Any:
        return next((v for k, v in self.attrs if k == name), default)

    @property
    def result(self) -> Value:
        assert len(self.results) == 1, self.kind
        return self.results[0]


@frozen
class Guard:
    """A condition on sizes that only the run time can check.

    ``kind`` is ``"equal"`` (``left == right``), ``"divisible"`` (``left``
    is a multiple of ``right``), ``"at_most"`` (``left <= right``) or ``"at_least"``
    (``left >= right``). The left side is the one a failed check names.
    ``"indices"`` is on the values of the integer tensor parameter ``tensor``: each is
    in ``[left, right)`` (a gather's index, ``take_along_axis``'s, within the axis).
    """

    kind: str
    left: Dim
    right: Dim
    reason: str
    span: Span | None = field(default=None, compare=False, repr=False)
    tensor: str = ""

    def __str__(self) -> str:
        if self.kind == "indices":
            return f"{self.left} <= {self.tensor}[...] < {self.right}"
        if self.kind == "divisible":
            return f"{self.left} % {self.right} == 0"
        relation = {"equal": "==", "at_most": "<=", "at_least": ">="}[self.kind]
        return f"{self.left} {relation} {self.right}"


@frozen
class Group:
    """Operations fused into one kernel. ``ops`` index the function body's ops."""

    name: str
    kind: str  # gemm, elementwise, reduction, attention, tile, state
    ops: tuple[int, ...]


@frozen
class Param:
    value: Value
    keyword_only: bool = False
    #: A scalar parameter's default, as the ``.tsr`` file gives it: what an entry
    #: point passes when its caller leaves the argument out.
    default: bool | int | float | None = None


@frozen
class StateSlot:
    """Which of a function's flattened tensors make up an ``OptimizerState``: the
    ``count`` parameters named ``<name>_<field>`` of the state parameter ``name``, or
    the ``count`` results from ``result`` on (then ``name`` is empty). ``param`` is the
    parameter the state belongs to; ``fp32_master`` whether its first tensor is the f32
    master copy."""

    name: str
    param: str
    fp32_master: bool
    count: int
    result: int | None = None


@frozen
class Function:
    name: str
    #: "graph" (ops on tensors), "tile" (a tile kernel) or "declaration" (body ``...``).
    kind: str
    params: tuple[Param, ...]
    #: The declared result: one type, a ``TupleType`` for several, or None.
    result_type: ValueType | TupleType | None
    body: Block
    guards: tuple[Guard, ...] = ()
    #: Decorators as written (canonical text), e.g. ``kernel.schedule(base)``.
    decorators: tuple[str, ...] = ()
    groups: tuple[Group, ...] = ()
    span: Span | None = field(default=None, compare=False, repr=False)
    #: The schedule from ``@kernel.schedule`` or ``@kernel.autotune(space=...)``.
    schedule: ScheduleSpec | None = None
    schedule_span: Span | None = field(default=None, compare=False, repr=False)
    #: The mesh of a function with a ``with mesh(...)`` block (``graph.mesh.Mesh``), and
    #: the shard spec of each parameter, then of the result (None: whole on each device).
    mesh: Any = None
    shards: tuple[Any, ...] = ()
    #: the returned expression, where the distribution pass reports a result's layout
    return_span: Span | None = field(default=None, compare=False, repr=False)
    #: The ``OptimizerState`` parameters and results, flattened into tensors.
    states: tuple[StateSlot, ...] = ()


@frozen
class GraphModule:
    name: str
    functions: tuple[Function, ...]
    #: Module-level compile-time values (schedules), name and canonical text.
    constants: tuple[tuple[str, str], ...] = ()


@frozen(eq=False)
class TileCallee:
    """The tile kernel that a ``tile_call`` op runs: the file's kernel ``name``, analysed
    again with the call's argument types (``function``, whose sizes are the caller's
    dims), so that the schedule and tile stages lower it as they lower the library's
    kernels for a graph op. It prints as its name; two calls are two launches."""

    name: str
    function: Function

    def __str__(self) -> str:
        return self.name


def walk(block: Block) -> Any:
    """Every op of a block, nested regions included, in program order."""
    for op in block.ops:
        yield op
        for region in op.regions:
            yield from walk(region)


def result_names(count: int) -> tuple[str, ...]:
    """The names a function's results are passed under, in order: ``out`` for one (a
    call's ``out=``), ``out0``, ``out1``, ... for several (``out=(a, b)``)."""
    return (RESULT,) if count == 1 else tuple(f"{RESULT}{i}" for i in range(count))
