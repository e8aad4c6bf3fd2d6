"""Calling an operation: binding arguments, checking them, emitting IR.

Each operation is an ``OpSpec``: its parameters and a rule, a function that
gets an ``OpCall`` and returns the result. The rule checks shapes and dtypes
through ``OpCall``'s helpers, whose errors name the operation, both sides of
a mismatch and where the offending argument was declared; it emits Graph IR
through ``OpCall.emit``. A failed check raises ``SemanticError``, which the
analyser turns into one diagnostic for the statement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...frozen import frozen
from ..frontend.diagnostics import Note, did_you_mean
from ..frontend.source import Span
from .dims import Dim
from .dtypes import DType
from .ir import Value
from .types import ScalarType, TensorType, TileType, ValueType, dims_text
from .values import Const, DimValue, DTypeRef, Ev, describe

__all__ = ["SemanticError", "P", "OpSpec", "OpCall", "Emitter", "REQUIRED"]

REQUIRED = object()

#: PyTorch's names of the axis parameters, which its own functions take beside numpy's
#: (``x.sum(dim=-1, keepdim=True)``): a call may use either.
_ALIASES = {"dim": "axis", "keepdim": "keepdims"}

#: Parameter names from NumPy and PyTorch, and what Tessera calls them.
_SYNONYMS = {
    **_ALIASES,
    "epsilon": "eps",
    "is_causal": "causal",
    "num_heads": "heads",
    "n_heads": "heads",
    "dropout_p": "dropout",
    "a_min": "min",
    "a_max": "max",
    "correction": "ddof",
}
#: PyTorch's parameters that Tessera spells otherwise: its own name, and how.
_SPELLED = {
    "unbiased": (
        "ddof",
        "ddof=1 for unbiased=True (PyTorch's default), ddof=0 for unbiased=False (numpy's "
        "default, and Tessera's)",
    ),
}


class SemanticError(Exception):
    def __init__(self, message: str, span: Span | None, notes: tuple[Note, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.span = span
        self.notes = notes


@frozen
class P:
    """A parameter of an operation."""

    name: str
    default: Any = REQUIRED
    keyword_only: bool = False


@frozen
class OpSpec:
    name: str
    params: tuple[P, ...]
    rule: Callable[[OpCall], Any]
    #: "graph" ops work on tensors in graph functions, "tile" ops in tile kernels.
    level: str
    doc: str = ""
    #: Tile ops whose first argument is updated in place (``tile.mask_causal(S, ...)``).
    in_place: bool = False

    def signature(self) -> str:
        parts: list[str] = []
        star = False
        for p in self.params:
            if p.keyword_only and not star:
                parts.append("*")
                star = True
            parts.append(p.name if p.default is REQUIRED else f"{p.name}={_show(p.default)}")
        return f"{self.name}({', '.join(parts)})"


def _show(value: Any) -> str:
    return "None" if value is None else repr(value)


class Emitter(Protocol):
    """What the analyser offers an operation rule."""

    #: The sizes fixed on the command line (``-D H=8``), which a dim written as a
    #: string in a call (``reshape(x, ("S", "H", "D"))``) takes as a declaration does.
    defines: dict[str, int]
    #: The sizes the parameters' types name, by name: a shape written in a call
    #: (``zeros(("N", 4))``) may use them.
    dims: dict[str, Dim]

    def emit(
        self,
        kind: str,
        operands: tuple[Value, ...],
        result_types: tuple[ValueType, ...],
        attrs: tuple[tuple[str, Any], ...],
        effects: tuple[str, ...],
        span: Span,
    ) -> tuple[Value, ...]: ...

    def guard(self, kind: str, left: Dim, right: Dim, reason: str, span: Span) -> None: ...

    def index_guard(self, indices: Value, bound: Dim, reason: str, span: Span) -> bool: ...

    def declaration_note(self, value: Any) -> tuple[Note, ...]: ...

    def warning(self, message: str, span: Span) -> None: ...

    def reduced_every_axis(self, old: tuple[Dim, ...], span: Span) -> None: ...


@dataclass
class OpCall:
    spec: OpSpec
    args: dict[str, Ev]
    span: Span
    emitter: Emitter
    #: The name the user wrote (``a @ b`` calls matmul as '@').
    shown: str = field(default="")

    def __post_init__(self) -> None:
        self.shown = self.shown or self.spec.name

    # -- arguments ---------------------------------------------------------------

    def given(self, name: str) -> bool:
        return name in self.args

    def ev(self, name: str) -> Ev:
        return self.args[name]

    def left_out(self, name: str) -> bool:
        """The argument was left out, or passed as ``None`` (an optional tensor, such as
        PyTorch's ``bias=None``)."""
        return self.raw(name) == Const(None)

    def raw(self, name: str) -> Any:
        """The argument's value, or the parameter's default."""
        if name in self.args:
            return self.args[name].value
        default = next(p.default for p in self.spec.params if p.name == name)
        return Const(default)

    def error(
        self, message: str, at: str | None = None, notes: tuple[Note, ...] = ()
    ) -> SemanticError:
        span = self.args[at].span if at is not None and at in self.args else self.span
        return SemanticError(f"{self.shown}: {message}", span, notes)

    def warn(self, message: str, at: str | None = None) -> None:
        """Warn at an argument, or at the call, as ``error`` reports."""
        span = self.args[at].span if at is not None else self.span
        self.emitter.warning(f"{self.shown}: {message}", span)

    def tensor(self, name: str) -> Value:
        """A tensor argument (a tile in a tile op)."""
        value = self.raw(name)
        want = TileType if self.spec.level == "tile" else TensorType
        if not isinstance(value, Value) or not isinstance(value.type, want):
            noun = "a tile" if want is TileType else "a tensor"
            raise self.error(f"'{name}' must be {noun}, not {describe(value)}", at=name)
        return value

    def const(self, name: str, *kinds: type) -> Any:
        """A compile-time constant of one of ``kinds`` (``bool`` is not an ``int`` here)."""
        value = self.raw(name)
        ok = isinstance(value, Const) and any(
            isinstance(value.value, k) and not (k is int and isinstance(value.value, bool))
            for k in kinds
        )
        if not ok:
            names = " or ".join(_kind_word(k) for k in kinds)
            raise self.error(
                f"'{name}' must be {names} known at compile time, not {describe(value)}", at=name
            )
        return value.value

    def number(self, name: str) -> float:
        """A compile-time number as a float (an integer too large for one is an error)."""
        value = self.const(name, float, int)
        try:
            return float(value)
        except OverflowError:
            raise self.error(
                f"'{name}' is too large for a floating-point number", at=name
            ) from None

    def scalar(self, name: str, kind: str) -> Value | Const:
        """A constant, or a run-time scalar of ``kind`` (a parameter such as ``p: float``)."""
        value = self.raw(name)
        if isinstance(value, Value) and getattr(value.type, "kind", None) == kind:
            return value
        if kind == "float":
            return Const(self.number(name))
        return Const(self.const(name, {"int": int, "bool": bool}[kind]))

    def dtype(self, name: str) -> DType:
        value = self.raw(name)
        if not isinstance(value, DTypeRef):
            raise self.error(
                f"'{name}' must be a dtype such as f32 or bf16, not {describe(value)}", at=name
            )
        return value.dtype

    def dim(self, name: str) -> Dim:
        value = self.raw(name)
        if isinstance(value, DimValue):
            return value.dim
        if isinstance(value, Value) and value.type == ScalarType("int") and value.name:
            return Dim.sym(value.name)  # an int parameter used as a size
        if (
            isinstance(value, Const)
            and isinstance(value.value, int)
            and not isinstance(value.value, bool)
        ):
            return Dim.const(value.value)
        raise self.error(f"'{name}' must be a size, not {describe(value)}", at=name)

    def axis(self, name: str, rank: int) -> int:
        axis = self.const(name, int)
        if not -rank <= axis < rank:
            raise self.error(f"axis {axis} is out of range for a rank-{rank} value", at=name)
        return axis % rank

    # -- checks ------------------------------------------------------------------

    def same_dim(
        self,
        left: Dim,
        right: Dim,
        mismatch: Callable[[], str],
        reason: str,
        about: tuple[str, ...] = (),
    ) -> None:
        """``left`` and ``right`` must be one size.

        Equal expressions pass. Two different constants, or two different
        symbolic expressions, are an error: distinct names are distinct sizes.
        A symbol against a constant becomes a guard checked at run time. The
        error's notes point at the declarations of the arguments in ``about``.
        """
        if left == right:
            return
        if (left.constant is None) == (right.constant is None):
            raise self.error(mismatch(), notes=self.notes_for(*about))
        self.emitter.guard("equal", left, right, f"{self.shown}: {reason}", self.span)

    def notes_for(self, *names: str) -> tuple[Note, ...]:
        notes: tuple[Note, ...] = ()
        for name in names:
            if name in self.args:
                notes += self.emitter.declaration_note(self.args[name])
        return notes

    def shape_of(self, name: str) -> str:
        """``"A is [M, K]"``: the argument as written, and its dims."""
        value = self.args[name].value
        dims = value.type.dims if isinstance(value, Value) else ()
        return f"{self.args[name].text} is {dims_text(dims)}"

    # -- output ------------------------------------------------------------------

    def emit(
        self,
        kind: str,
        operands: tuple[Value, ...],
        *result_types: ValueType,
        attrs: tuple[tuple[str, Any], ...] = (),
        effects: tuple[str, ...] = (),
    ) -> Any:
        """Emit one op; returns its result, or a tuple for several."""
        results = self.emitter.emit(kind, operands, result_types, attrs, effects, self.span)
        return results[0] if len(results) == 1 else results


def _kind_word(kind: type) -> str:
    return {bool: "a bool", int: "an integer", float: "a number", str: "a string"}.get(
        kind, kind.__name__
    )


def bind(
    spec: OpSpec,
    positional: list[Ev],
    keywords: list[tuple[str, Ev, Span]],
    span: Span,
    shown: str,
) -> dict[str, Ev]:
    """Match call arguments to parameters, as Python does, with clear errors."""
    slots = [p for p in spec.params if not p.keyword_only]
    if len(positional) > len(slots):
        names = ", ".join(p.name for p in slots) or "none"
        raise SemanticError(
            f"{shown} takes {len(slots)} positional argument{'s' if len(slots) != 1 else ''} "
            f"({names}), {len(positional)} given",
            positional[len(slots)].span,
        )
    bound = {p.name: ev for p, ev in zip(slots, positional, strict=False)}
    known = {p.name for p in spec.params}
    for name, ev, key_span in keywords:
        if name not in known and _ALIASES.get(name) in known:
            name = _ALIASES[name]
        if name not in known:
            hint = did_you_mean(name, known)
            if not hint and _SYNONYMS.get(name) in known:
                hint = f"; did you mean '{_SYNONYMS[name]}'?"
            if not hint and name in _SPELLED and _SPELLED[name][0] in known:
                hint = f"; write {_SPELLED[name][1]}"
            raise SemanticError(
                f"{shown} has no parameter '{name}'{hint}",
                key_span,
                (Note(f"signature: {spec.signature()}"),),
            )
        if name in bound:
            raise SemanticError(f"{shown} got two values for '{name}'", key_span)
        bound[name] = ev
    for p in spec.params:
        if p.default is REQUIRED and p.name not in bound:
            raise SemanticError(
                f"{shown} is missing its argument '{p.name}'",
                span,
                (Note(f"signature: {spec.signature()}"),),
            )
    return bound
