"""Symbolic dimensions: ``"S"``, ``64``, ``"B*H"``, ``"S/2"``, ``"E/heads"``.

A dim is a sum of terms, each a rational coefficient times a product of
symbols raised to integer powers (a Laurent polynomial). That canonical form
makes ``"B*H"`` equal ``"H*B"`` and ``"(B*H)/H"`` equal ``"B"`` by plain
comparison, and prints back the way a person writes it. Dim strings are
parsed here, by a small grammar of names, integers, ``+ - * /`` and
parentheses; nothing else is a dim, and a dim's text never reaches C++.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import field
from fractions import Fraction
from functools import cache, cached_property, lru_cache
from typing import Any

from ...frozen import frozen
from ..frontend.depth import MAX_DEPTH

__all__ = ["Dim", "DimSyntaxError", "parse_dim"]

_ZERO, _ONE = Fraction(0), Fraction(1)

#: A product of symbols with integer powers, sorted by symbol name.
Monomial = tuple[tuple[str, int], ...]


@frozen
class Dim:
    terms: tuple[tuple[Monomial, Fraction], ...]
    #: For a constant written by a name: that spelling (a ``Dim``), or how to make it
    #: from the operands of the arithmetic that gave the constant (``(combine, a, b)``),
    #: which only a backend that prints it pays for. ``spelled`` reads it.
    written: Any = field(default=None, compare=False, repr=False)

    @cached_property
    def spelled(self) -> Dim | None:
        """For a constant: the sizes it was written as, where a name gave it (a library
        kernel's ``K`` that its caller fixes to 256, ``K/2``, a loop's literal step), so
        that generated code may print that in its place. It takes no part in equality,
        hashing or ``str``: the dim is its value to every pass and printer of the IR."""
        if self.written is None or isinstance(self.written, Dim):
            return self.written
        combine, a, b = self.written
        spelled = combine(a.spelled or a, b.spelled or b)
        return spelled if spelled.constant is None else None

    # -- construction ----------------------------------------------------------

    @staticmethod
    @cache
    def const(value: int | Fraction) -> Dim:
        """The dim ``value``; made once a process for each value, as ``sym`` for each
        name: dims are immutable, and compiling a program makes thousands."""
        return Dim._make({(): Fraction(value)})

    @staticmethod
    @cache
    def sym(name: str) -> Dim:
        return Dim._make({((name, 1),): _ONE})

    @staticmethod
    def named(value: int, spelled: Dim) -> Dim:
        """The constant ``value``, spelled ``spelled`` (``Dim.named(256, Dim.sym("K"))``)."""
        return Dim(Dim.const(value).terms, spelled)

    @staticmethod
    def _make(terms: dict[Monomial, Fraction]) -> Dim:
        kept = sorted((m, c) for m, c in terms.items() if c != 0)
        return Dim(tuple(kept))

    def _spelled_too(self, result: Dim, other: Dim, combine: Callable[[Dim, Dim], Dim]) -> Dim:
        """``result`` of ``self`` and ``other``, where it is a constant and either operand
        was written by a name: spelled as ``combine`` of their spellings (``K/2`` of
        ``K``), once asked."""
        if result.constant is None or not result.terms or result is self or result is other:
            return result
        return Dim(result.terms, (combine, self, other))

    # -- arithmetic ------------------------------------------------------------

    def __add__(self, other: Dim | int) -> Dim:
        other = _as_dim(other)
        if not other.terms or not self.terms:  # x + 0, 0 + x
            return self if other.terms == () else other
        terms = dict(self.terms)
        for monomial, coeff in other.terms:
            terms[monomial] = terms.get(monomial, _ZERO) + coeff
        if self.written is None and other.written is None:
            return Dim._make(terms)
        return self._spelled_too(Dim._make(terms), other, Dim.__add__)

    def __neg__(self) -> Dim:
        negated = Dim._make({m: -c for m, c in self.terms})
        if self.written is None or not negated.terms:
            return negated
        return Dim(negated.terms, (Dim.__mul__, self, Dim.const(-1)))

    def __sub__(self, other: Dim | int) -> Dim:
        return self + -_as_dim(other)

    def __mul__(self, other: Dim | int) -> Dim:
        other = _as_dim(other)
        if other is _UNIT or not self.terms:  # x * 1, 0 * x
            return self
        if self is _UNIT or not other.terms:
            return other
        terms: dict[Monomial, Fraction] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                monomial = _multiply(m1, m2)
                terms[monomial] = terms.get(monomial, _ZERO) + c1 * c2
        if self.written is None and other.written is None:
            return Dim._make(terms)
        return self._spelled_too(Dim._make(terms), other, Dim.__mul__)

    def __truediv__(self, other: Dim | int) -> Dim:
        """Exact division; only by a single term (``S/2``, ``E/heads``)."""
        other = _as_dim(other)
        if not other.terms:
            raise ZeroDivisionError("division by zero in a dim")
        if len(other.terms) != 1:
            raise ValueError(f"cannot divide by a sum ({other})")
        monomial, coeff = other.terms[0]
        inverse = Dim(((tuple((s, -p) for s, p in monomial), 1 / coeff),))
        if self.written is None and other.written is None:
            return self * inverse
        return self._spelled_too(self * inverse, other, Dim.__truediv__)

    # -- queries ---------------------------------------------------------------

    @cached_property
    def constant(self) -> int | None:
        """The value if this dim is an integer constant (kept once computed, as
        ``symbol``)."""
        if not self.terms:
            return 0
        if len(self.terms) == 1 and self.terms[0][0] == () and self.terms[0][1].denominator == 1:
            return int(self.terms[0][1])
        return None

    @cached_property
    def symbol(self) -> str | None:
        """The name, if this dim is exactly one symbol (``S``, not ``2*S`` or ``S/2``).
        Kept once computed: shape checks ask it of the same dims on every call."""
        if len(self.terms) == 1:
            monomial, coeff = self.terms[0]
            if coeff == 1 and len(monomial) == 1 and monomial[0][1] == 1:
                return monomial[0][0]
        return None

    @property
    def is_integral(self) -> bool:
        """True when the dim is integer-valued for every value of its symbols."""
        return all(c.denominator == 1 and all(p > 0 for _, p in m) for m, c in self.terms)

    def symbols(self) -> frozenset[str]:
        return frozenset(s for m, _ in self.terms for s, _ in m)

    def fraction(self) -> tuple[Dim, Dim]:
        """This dim as numerator / denominator, both integral (``S/2`` -> ``S``, ``2``): a
        fractional dim is whole where the numerator is a multiple of the denominator."""
        denominator = Dim.const(1)
        for monomial, coeff in self.terms:
            denominator = denominator * Dim.const(coeff.denominator)
            for symbol, power in monomial:
                if power < 0:
                    denominator = denominator * Dim.sym(symbol)
        return self * denominator, denominator

    def substitute(self, values: Mapping[str, int | Dim]) -> Dim:
        """This dim with each symbol that ``values`` gives replaced: by a number (``-D``),
        or by a dim (a called function's sizes, which are its caller's dims)."""
        if self.symbol is not None:  # most dims of a tile's type: no arithmetic to do
            given = values.get(self.symbol)
            if given is None:
                return self
            return given if isinstance(given, Dim) else Dim.const(given)
        if not any(symbol in values for monomial, _ in self.terms for symbol, _ in monomial):
            return self
        result = Dim.const(0)
        for monomial, coeff in self.terms:
            term = Dim.const(coeff)
            for symbol, power in monomial:
                given = values.get(symbol)
                base = Dim.sym(symbol) if given is None else given
                base = base if isinstance(base, Dim) else Dim.const(base)
                for _ in range(abs(power)):
                    term = term * base if power > 0 else term / base
            result = result + term
        return result

    def value(self, values: Mapping[str, int]) -> int | Fraction:
        """The number this dim stands for when ``values`` gives every symbol: an int
        when the sum is whole term by term, else a Fraction. Unlike ``substitute`` it
        builds no intermediate dims: a runtime checks shapes this way on every call,
        where microseconds count."""
        total: int | Fraction = 0
        for monomial, coeff in self.terms:
            top, bottom = coeff.numerator, coeff.denominator
            for symbol, power in monomial:
                if power > 0:
                    top *= values[symbol] ** power
                else:
                    bottom *= values[symbol] ** -power
            total += top if bottom == 1 else Fraction(top, bottom)
        return total

    # -- printing --------------------------------------------------------------

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        ordered = sorted(self.terms, key=lambda t: (-sum(abs(p) for _, p in t[0]), t[0]))
        text = ""
        for i, (monomial, coeff) in enumerate(ordered):
            body = _term(monomial, abs(coeff))
            if i == 0:
                text = ("-" if coeff < 0 else "") + body
            else:
                text += (" - " if coeff < 0 else " + ") + body
        return text

    def __repr__(self) -> str:
        return f"Dim({str(self)!r})"


#: The dim 1, which a product skips.
_UNIT = Dim.const(1)


def _as_dim(value: Dim | int) -> Dim:
    return value if isinstance(value, Dim) else Dim.const(value)


def _multiply(a: Monomial, b: Monomial) -> Monomial:
    powers = dict(a)
    for symbol, power in b:
        powers[symbol] = powers.get(symbol, 0) + power
    return tuple(sorted((s, p) for s, p in powers.items() if p != 0))


def _term(monomial: Monomial, coeff: Fraction) -> str:
    top = [str(coeff.numerator)] if coeff.numerator != 1 or not monomial else []
    bottom = [str(coeff.denominator)] if coeff.denominator != 1 else []
    for symbol, power in monomial:
        (top if power > 0 else bottom).extend([symbol] * abs(power))
    text = "*".join(top) or "1"
    if bottom:
        below = "*".join(bottom)
        text += "/" + (f"({below})" if len(bottom) > 1 else below)
    return text


class DimSyntaxError(ValueError):
    """A malformed dim string; ``offset`` is the 0-based index of the problem."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset


_TOKEN = re.compile(r"\s*(?:(?P<int>\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>//|[-+*/()]))")


@lru_cache(maxsize=4096)
def parse_dim(text: str) -> Dim:
    """Parse a dim expression such as ``"B*H"`` or ``"S/2"``. Dims are immutable, and a
    program (and every call a runtime checks) parses the same few texts again and again,
    so the parses are kept."""
    return _DimParser(text).parse()


class _DimParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                if text[pos:].strip() == "":
                    break
                stray = pos + len(text[pos:]) - len(text[pos:].lstrip())
                raise DimSyntaxError(
                    f"unexpected '{text[stray]}' in a dim: dims are names, integers, "
                    "+, -, *, / and parentheses",
                    stray,
                )
            kind = match.lastgroup or ""
            token = match.group(kind)
            # "D//2" is "D/2", as D // 2 of a size is in code: a whole quotient, checked
            self.tokens.append((kind, "/" if token == "//" else token, match.start(kind)))
            pos = match.end()
        self.index = 0
        self.depth = 0

    def parse(self) -> Dim:
        if not self.tokens:
            raise DimSyntaxError("empty dim: expected a name or an integer", 0)
        dim = self._sum()
        if self.index < len(self.tokens):
            _, value, offset = self.tokens[self.index]
            raise DimSyntaxError(f"unexpected '{value}' in a dim", offset)
        return dim

    def _peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def _sum(self) -> Dim:
        dim = self._product()
        while (token := self._peek()) is not None and token[1] in "+-":
            self.index += 1
            right = self._product()
            dim = dim + right if token[1] == "+" else dim - right
        return dim

    def _product(self) -> Dim:
        dim = self._unary()
        while (token := self._peek()) is not None and token[1] in "*/":
            self.index += 1
            right = self._unary()
            if token[1] == "*":
                dim = dim * right
            elif right.constant == 0:
                raise DimSyntaxError("division by zero in a dim", token[2])
            else:
                try:
                    dim = dim / right
                except ValueError as exc:
                    raise DimSyntaxError(str(exc), token[2]) from None
        return dim

    def _unary(self) -> Dim:
        token = self._peek()
        if token is not None and token[1] == "-":
            self.index += 1
            return -self._nested(self._unary, token[2])
        return self._atom()

    def _nested(self, parse: Callable[[], Dim], offset: int) -> Dim:
        """``parse()`` one level deeper, within the depth every nesting is held to."""
        if self.depth >= MAX_DEPTH:
            raise DimSyntaxError(f"nested too deeply: more than {MAX_DEPTH} levels", offset)
        self.depth += 1
        dim = parse()
        self.depth -= 1
        return dim

    def _atom(self) -> Dim:
        token = self._peek()
        if token is None:
            raise DimSyntaxError(
                "dim ends too early: expected a name or an integer", len(self.text)
            )
        kind, value, offset = token
        self.index += 1
        if kind == "int":
            return Dim.const(int(value))
        if kind == "name":
            return Dim.sym(value)
        if value == "(":
            dim = self._nested(self._sum, offset)
            closing = self._peek()
            if closing is None or closing[1] != ")":
                raise DimSyntaxError("'(' in a dim is never closed", offset)
            self.index += 1
            return dim
        raise DimSyntaxError(f"unexpected '{value}' in a dim", offset)
