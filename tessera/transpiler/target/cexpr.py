"""C expressions for sizes, offsets and constants."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

from ..graph.dims import Dim
from ..graph.dtypes import SATURATION, DType

__all__ = [
    "c_dim",
    "c_factor",
    "c_float",
    "saturated",
    "integer_variant",
    "kv_slot",
    "kv_visible",
    "param_name",
    "names_used",
    "words",
    "MAX_INLINED_OPS",
]

#: The most elementwise ops that one expression of generated code holds: a longer chain
#: is computed into an array every so many ops, so that each expression, and the time
#: to write it, stays bounded (a chain of n ops written as one expression takes time
#: n^2 to write, and as deep a recursion).
MAX_INLINED_OPS = 64


def c_dim(
    dim: Dim,
    names: dict[str, str] | None = None,
    strides: dict[str, tuple[int, str]] | None = None,
    unit: tuple[int, str] | None = None,
    spelled: dict[str, str] | None = None,
) -> str:
    """An integer C expression for ``dim``; ``names`` renames symbols (program ids,
    loop counters), and ``spelled`` gives the C names of the sizes that a constant may
    be spelled in (``Dim.spelled``): a constant spelled in them prints as its spelling
    (``K``, ``D/2``), any other as its number. ``strides`` names the tile size a symbol
    steps by, which its term's coefficient is printed as where it equals it
    (``BM*pid_m``), as is a constant term of a multiple of that size beside it (the next
    blocks, ``BN*nblk + BN``, ``BK*kb + 2*BK``). ``unit`` is the size and name of the
    tile that the dim counts whole tiles of (an offset along an axis of tiles of that
    size): a constant of a multiple of it prints as that (``BK``, ``2*BK``), and so does
    a symbol's coefficient of its size (``BD*pid_b0``). Fractions divide last, after the
    symbols multiply, so ``D/2`` is exact whenever the guards hold."""
    names = names or {}
    strides = strides or {}
    stepped = {
        strides[m[0][0]][0]: strides[m[0][0]][1]
        for m, c in dim.terms
        if len(m) == 1 == m[0][1] and m[0][0] in strides and abs(c) == strides[m[0][0]][0]
    }
    if unit is not None:
        stepped.setdefault(*unit)
    if dim.constant is not None:
        by_name = dim.spelled is not None and spelled and dim.spelled.symbols() <= spelled.keys()
        if by_name:  # a size alone over a number reads without parentheses: D/2
            return re.sub(r"^\((\w+)\)/", r"\1/", c_dim(dim.spelled, spelled))
        return _tiles(dim.constant, stepped) or str(dim.constant)
    parts = []
    for monomial, coeff in sorted(dim.terms, key=lambda t: t[0] == ()):
        tiles = _tiles(abs(coeff), stepped) if monomial == () else None
        if tiles is not None:
            parts.append(("-" if coeff < 0 else "+", tiles))
            continue
        ups = [names.get(s, s) for s, p in monomial for _ in range(p) if p > 0]
        downs = [names.get(s, s) for s, p in monomial for _ in range(-p) if p < 0]
        coeff = Fraction(coeff)
        sign = "-" if coeff < 0 else "+"
        coeff = abs(coeff)
        stride = strides.get(monomial[0][0]) if len(monomial) == 1 == monomial[0][1] else None
        if stride is None and unit is not None and len(monomial) == 1 == monomial[0][1]:
            stride = unit  # whole tiles of the axis, one per index (a head's columns)
        if stride is not None and coeff == stride[0]:
            parts.append((sign, f"{stride[1]}*{ups[0]}"))
            continue
        factors = ([str(coeff.numerator)] if coeff.numerator != 1 or not ups else []) + ups
        text = "*".join(factors)
        divisor = "*".join(([str(coeff.denominator)] if coeff.denominator != 1 else []) + downs)
        if divisor:
            text = f"({text})/({divisor})" if "*" in divisor else f"({text})/{divisor}"
        parts.append((sign, text))
    out = parts[0][1] if parts[0][0] == "+" else f"-{parts[0][1]}"
    for sign, text in parts[1:]:
        out += f" {sign} {text}"
    return out


def _tiles(value: int, sizes: dict[int, str]) -> str | None:
    """``value`` as a whole number of one of the tiles ``sizes`` names (``BK``,
    ``2*BK``), or None."""
    for size, name in sizes.items():
        if value and size and value % size == 0:
            count = value // size
            return name if count == 1 else f"{count}*{name}"
    return None


def c_factor(
    dim: Dim,
    names: dict[str, str] | None = None,
    strides: dict[str, tuple[int, str]] | None = None,
    spelled: dict[str, str] | None = None,
) -> str:
    """``c_dim``, parenthesized where it is a sum (``C - 8``) or a quotient (``(D)/2``),
    to multiply by."""
    text = c_dim(dim, names, strides, spelled=spelled)
    if len(dim.terms) > 1 or (dim.spelled is not None and not re.fullmatch(r"[\w*]+", text)):
        return f"({text})"
    return text


def kv_slot(op: Any, lengths: str, c: Callable[[Dim], str]) -> str:
    """The C expression of a ``kv_slot`` op (``tile.kvcache``) over the lengths pointer
    ``lengths``, sizes printed by ``c``: ``(length % ring + ring + row) % ring``, which
    is in ``[0, ring)`` for any length, a negative one too, so no store through it is
    out of bounds."""
    ring = f"({c(op.attr('ring'))})"
    length = f"{lengths}[{c(Dim.sym(op.attr('batch')))}]"
    return f"({length} % {ring} + {ring} + {c(Dim.sym(op.attr('row')))}) % {ring}"


def kv_visible(op: Any, seen: str, lengths: str, index: str, c: Callable[[Dim], str]) -> str:
    """The C statement of a ``kv_visible`` op (``tile.kvcache``): this program's entry of
    ``seen``, the keys of its split that its query row sees, over the pointers ``seen``
    and ``lengths`` (sizes printed by ``c``, integers of type ``index``). The row is
    query ``row % n`` of the ``n`` last positions, which sees the positions up to its
    own when causal, at most the last ``W`` with a window; the split's count is that
    less the split's start, within ``[0, C]``. A row that sees nothing of the cache
    (fewer positions than queries), or causal rows over a window that has wrapped
    (whose own keys are overwritten), sees no key in any split: its output is NaN."""
    n, chunk = f"({c(op.attr('rows'))})", f"({c(op.attr('chunk'))})"
    batch, program, row = (c(Dim.sym(op.attr(a))) for a in ("batch", "program", "row"))
    length = f"{lengths}[{batch}]"
    count = f"{length} - ({n} - 1 - {row} % {n})" if op.attr("causal") else length
    window = op.attr("window")
    if window is not None:
        count = f"({count} < {window} ? {count} : {window})"
        if op.attr("causal"):
            count = f"({n} > 1 && {length} > {window} ? 0 : {count})"
    start = f"({program} % {op.attr('splits')}) * {chunk}"
    at = f"({batch} * ({c(op.attr('programs'))}) + {program}) * ({c(op.attr('stacked'))}) + {row}"
    return (
        f"{{ const {index} seen_ = ({count}) - {start}; "
        f"{seen}[{at}] = (int)(seen_ < 0 ? 0 : (seen_ > {chunk} ? {chunk} : seen_)); }}"
    )


def c_float(value: float) -> str:
    """A float constant of C++; infinity and NaN by the tile header's names for them."""
    if math.isinf(value):
        return ("-" if value < 0 else "") + "tsr::infinity()"
    if math.isnan(value):
        return "tsr::nan()"
    text = repr(float(value))
    if "e" not in text and "." not in text:
        text += ".0"
    return text + "f"


def saturated(expr: str, dtype: DType, prefix: str) -> str:
    """``expr`` clamped into ``dtype``'s range by the tile header's ``saturate`` (NaN to 0
    for an integer, which has none), before it is rounded: C++ (``prefix`` ``tsr::``)
    and the SIMT languages (``tsr_``) spell the header's functions alike."""
    lo, hi = (c_float(bound) for bound in SATURATION[dtype.name])
    function = "saturate" if dtype.is_float else "saturate_int"
    return f"{prefix}{function}({expr}, {lo}, {hi})"


def integer_variant(op: Any) -> str:
    """The suffix of the tile header's function for a binary op called as a function:
    ``_int`` for ``//`` and ``%`` of integers (NumPy's: a zero divisor gives 0, not the
    float result's NaN or infinity), nothing otherwise."""
    dtype = getattr(op.results[0].type, "dtype", None)
    integer = dtype is not None and not dtype.is_float and dtype.name != "bool"
    return "_int" if op.kind in ("floordiv", "mod") and integer else ""


#: What does not name a C variable: a string literal, a block comment, a line comment
#: (a quoted ``.tsr`` line, ``// y = x @ w``, cites names that the code may never read).
_NOT_CODE = re.compile(r'"(?:\\.|[^"\\\n])*"|/\*.*?\*/|//[^\n]*', re.S)


def words(text: str) -> frozenset[str]:
    """The words (``\\w+``) of ``text``. For a name, ``name in words(text)`` is
    ``re.search(rf"\\b{name}\\b", text)``, with one scan of the text for all the names
    a caller asks about."""
    return frozenset(re.findall(r"\w+", text))


def names_used(code: Iterable[str]) -> frozenset[str]:
    """The words of generated lines of C, outside comments and string literals: the
    names they may read, which decide whether a parameter is named or commented out."""
    return _words(tuple(code))


@functools.lru_cache(maxsize=256)
def _words(lines: tuple[str, ...]) -> frozenset[str]:
    """``names_used`` of ``lines``, kept for the next ask: twin kernels share theirs."""
    return frozenset(re.findall(r"\w+", _NOT_CODE.sub(" ", "\n".join(lines))))


def param_name(name: str, read: bool) -> str:
    """A parameter's name as a signature prints it: in a comment where the function never
    reads it, which keeps the parameter's place without an unused-parameter warning."""
    return name if read else f"/* {name} */"
