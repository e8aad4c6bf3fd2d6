"""numpy's ``split`` and PyTorch's ``chunk`` and ``Tensor.split``: a tensor cut along one
axis into consecutive parts, each a slice (a view, as ``x[:, a:b]`` is), returned as a
tuple: ``a, b = (x @ w).chunk(2, dim=-1)`` is a gated MLP's two halves.

The three differ in what their number means, as in the libraries they come from:
``split(x, 3)`` is three equal sections (numpy; a list is the indices to cut at),
``chunk(x, 3)`` at most three parts of ``ceil(n / 3)`` (PyTorch), and ``x.split(3)`` parts
of three elements (PyTorch's method; a list is the parts' sizes). A symbolic size must
divide as asked: a guard checks it at the call."""

from __future__ import annotations

from typing import Any

from ..frontend.source import Span
from .dims import Dim
from .opcall import SemanticError
from .values import Const, DimValue, Ev, describe

__all__ = ["SPLITS", "split_parts"]

#: The callables, by the name the evaluator gives each: the builtins ``split`` and
#: ``chunk``, and the methods ``x.chunk`` and ``x.split`` (PyTorch's).
SPLITS = ("split", "chunk", "split.method")


def split_parts(
    evaluator: Any, name: str, args: list[Ev], keywords: list, span: Span, shown: str
) -> tuple:
    """The parts of ``args[0]`` (a tensor) that ``name`` cuts it into."""
    if len(args) != 2:
        raise SemanticError(
            f"{shown} takes the tensor and {_COUNTS[name]}, and axis= (or dim=)", span
        )
    x, count = args
    value = x.value
    if not hasattr(value, "type") or not hasattr(value.type, "dims"):
        raise SemanticError(f"{shown} cuts a tensor, not {describe(value)}", x.span)
    axis = _axis(keywords, value.type.rank, shown, span)
    size = value.type.dims[axis]
    cuts = _cuts(evaluator, name, size, count, shown)
    bounds = list(zip([Dim.const(0), *cuts], [*cuts, size], strict=True))
    for i, (a, b) in enumerate(bounds):
        gap = b - a
        if gap.constant is not None and gap.constant < 1:
            raise SemanticError(
                f"{shown}: part {i} would be {a}:{b} of an axis of {size}: a part holds at "
                "least one element",
                count.span,
            )
        if gap.constant is None:
            where = f"{shown}: part {i} is {a}:{b} of an axis of {size}"
            evaluator._runtime(span).guard("at_most", a + Dim.const(1), b, where, span)
    return tuple(evaluator._sliced(value, {axis: (a, b, span)}, span) for a, b in bounds)


_COUNTS = {
    "split": "the number of equal sections (or the indices to cut at)",
    "chunk": "the number of chunks",
    "split.method": "the size of each part (or a list of sizes)",
}


def _axis(keywords: list, rank: int, shown: str, span: Span) -> int:
    axis = 0
    for key, ev, key_span in keywords:
        if key not in ("axis", "dim"):
            raise SemanticError(f"{shown} has no parameter '{key}'", key_span)
        if not isinstance(ev.value, Const) or type(ev.value.value) is not int:
            raise SemanticError(f"{shown}: {key} is an integer, not {describe(ev.value)}", ev.span)
        axis = ev.value.value
    if not -rank <= axis < rank:
        raise SemanticError(f"{shown}: axis {axis} is out of range for rank {rank}", span)
    return axis % rank


def _cuts(evaluator: Any, name: str, size: Dim, count: Ev, shown: str) -> list[Dim]:
    """Where the parts start, after the first."""
    raw = count.value.value if isinstance(count.value, Const) else None
    if isinstance(count.value, DimValue):
        if count.value.dim.constant is not None:
            raw = int(count.value.dim.constant)
        elif name == "split.method":  # parts of C elements: x.split(C, dim=2) of [.., 3*C]
            return _of_size(size, count.value.dim, shown, count.span)
    if isinstance(raw, (list, tuple)):
        given = list(raw)
        if name == "chunk" or not all(isinstance(g, (int, Dim)) for g in given):
            raise SemanticError(f"{shown} takes {_COUNTS[name]}", count.span)
        sizes = [Dim.const(g) if isinstance(g, int) else g for g in given]
        if name == "split":  # numpy's indices
            return sizes
        return _sized(evaluator, size, sizes, shown, count.span)
    if type(raw) is not int or raw < 1:
        raise SemanticError(f"{shown} takes {_COUNTS[name]}, a positive integer", count.span)
    if size.constant is not None:
        n = int(size.constant)
        if name == "split":
            if n % raw:
                raise SemanticError(
                    f"{shown}: {n} elements do not split into {raw} equal sections (numpy's "
                    "rule); chunk() makes the last part smaller",
                    count.span,
                )
            step = n // raw
        else:
            step = -(-n // raw) if name == "chunk" else raw
        return [Dim.const(i) for i in range(step, n, step)]
    if name == "split.method":
        raise SemanticError(
            f"{shown}: parts of {raw} elements of a symbolic size {size} are a number of "
            "parts the compiler does not know; chunk(n) cuts n equal parts",
            count.span,
        )
    part = size / raw
    if not part.is_integral:
        evaluator._runtime(count.span).guard(
            "divisible", *part.fraction(), f"{shown}: {raw} equal parts of {size}", count.span
        )
    return [part * i for i in range(1, raw)]


def _of_size(size: Dim, part: Dim, shown: str, span: Span) -> list[Dim]:
    """Parts of a symbolic ``part`` elements each: the axis must hold a number of them
    that the compiler knows (``3*C`` holds three ``C``)."""
    count = size / part if len(part.terms) == 1 else None
    if count is None or count.constant is None or count.constant.denominator != 1:
        raise SemanticError(
            f"{shown}: an axis of {size} does not hold a number of parts of {part} that the "
            'compiler knows; declare it as a multiple ("3*C"), or use chunk(n)',
            span,
        )
    return [part * i for i in range(1, int(count.constant))]


def _sized(evaluator: Any, size: Dim, sizes: list[Dim], shown: str, span: Span) -> list[Dim]:
    """PyTorch's list of part sizes: they add up to the axis."""
    total = sum(sizes, start=Dim.const(0))
    if total != size:
        if (total - size).constant is not None:
            raise SemanticError(
                f"{shown}: the sizes add up to {total}, but the axis has {size}", span
            )
        evaluator._runtime(span).guard("equal", total, size, f"{shown}: the sizes add up", span)
    cuts, start = [], Dim.const(0)
    for part in sizes[:-1]:
        start = start + part
        cuts.append(start)
    return cuts
