"""What an expression evaluates to during semantic analysis.

Run-time data are SSA ``Value``s of the Graph IR. Everything else is known at
compile time and never becomes an operation by itself: Python constants,
dtypes, dims, shapes, schedules, and the namespaces ``tile`` and ``ops``.
``Poison`` stands for a value whose computation already failed with an error,
so the mistake is reported once and not again by every use.
"""

from __future__ import annotations

from typing import Any

from ...frozen import frozen
from ..frontend import ast
from ..frontend.printer import print_expr
from ..frontend.source import Span
from .dims import Dim
from .dtypes import DType
from .ir import Value
from .schedule_spec import ScheduleSpec
from .types import OptimizerStateType

__all__ = [
    "Const",
    "DTypeRef",
    "DimValue",
    "ShapeValue",
    "Namespace",
    "ScheduleValue",
    "OpRef",
    "FunctionRef",
    "GradRef",
    "StateValue",
    "Poison",
    "POISON",
    "Ev",
    "describe",
]


@frozen
class Const:
    """A compile-time Python value: number, bool, string, None, or a list/tuple/dict of them."""

    value: Any


@frozen
class DTypeRef:
    dtype: DType


@frozen
class DimValue:
    """A size: ``T.m``, ``x.shape[0]``, or an integer used as a size."""

    dim: Dim


@frozen
class ShapeValue:
    dims: tuple[Dim, ...]


@frozen
class Namespace:
    """``tile``, ``ops``, ``tessera`` and the like: only their attributes mean something."""

    name: str


@frozen
class ScheduleValue:
    """A ``Schedule(...)`` expression or one derived from it."""

    spec: ScheduleSpec

    @property
    def text(self) -> str:
        return str(self.spec)


@frozen
class OpRef:
    """A callable: a graph or tile operation, a builtin, or a method bound to a receiver."""

    name: str
    receiver: Any = None


@frozen
class FunctionRef:
    """Another function of the file, called by name: its body runs in the caller."""

    node: Any


@frozen
class GradRef:
    """``grad(F)`` or ``value_and_grad(F)``: calling it runs ``F`` and its backward pass.
    ``wanted`` are the ``wrt=`` names, or None for every float tensor parameter."""

    node: Any
    wanted: tuple[str, ...] | None
    with_value: bool
    #: the ``remat=`` policy: which forward values the backward pass reads as they are
    remat: str = "everything"


@frozen
class StateValue:
    """An ``OptimizerState`` during analysis (``graph.optstate``): its type, bound to its
    parameter, and its tensors in the type's ``fields`` order."""

    type: OptimizerStateType
    values: tuple[Value, ...]

    def field(self, name: str) -> Value:
        return self.values[self.type.fields.index(name)]


class Poison:
    """The value of an expression that already produced an error."""

    def __repr__(self) -> str:
        return "POISON"


POISON = Poison()


@frozen
class Ev:
    """An evaluated expression: its value, where it was written, and its source.

    ``source`` is the expression itself, printed only when a message quotes it,
    or the text to quote.
    """

    value: Any
    span: Span
    source: ast.Expr | str

    @property
    def text(self) -> str:
        return self.source if isinstance(self.source, str) else print_expr(self.source)


def describe(value: Any) -> str:
    """A few words for what a value is, for "expected a tensor, got ..." messages."""
    if isinstance(value, Value):
        return str(value.type)
    if isinstance(value, Const):
        v = value.value
        if isinstance(v, bool):
            return "a bool"
        if isinstance(v, int):
            return "an integer"
        if isinstance(v, float):
            return "a float"
        if isinstance(v, str):
            return "a string"
        if v is None:
            return "None"
        return f"a {type(v).__name__}"
    if isinstance(value, DTypeRef):
        return f"the dtype {value.dtype}"
    if isinstance(value, DimValue):
        return f"the size {value.dim}"
    if isinstance(value, ShapeValue):
        return "a shape"
    if isinstance(value, Namespace):
        return f"the namespace '{value.name}'"
    if isinstance(value, ScheduleValue):
        return "a schedule"
    if isinstance(value, GradRef):
        return f"the gradient of '{value.node.name}'"
    if isinstance(value, OpRef):
        return f"the function '{value.name.removeprefix('stdlib.')}'"
    if isinstance(value, StateValue):
        return str(value.type)
    return "a value"
