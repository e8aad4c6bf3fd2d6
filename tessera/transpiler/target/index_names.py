"""Named row and column indices: ``row`` for ``BM*pid_m + i``, ``col`` for
``BN*nblk + j``.

A SIMT kernel walks a tile with local indices (``i``, ``j``, ``j0``) and reaches the
tensor at the tile's offset plus them, so that one statement group writes
``BM*pid_m + i`` in a bound check, in an address and again in a mask. This pass, on a
kernel's finished lines, gives each such sum a name at the head of a block of
straight-line code that writes it twice or more (``const long long row = BM*pid_m +
i;`` after the declaration of ``i``, or at the top of a loop's body), and writes the
name in its place. Not in the body of a loop that unrolls, where the sum's constant
part is an immediate of each copy's address. A sum is replaced only where it stands as one
operand (after ``(``, ``,``, ``=``, ``+``, a comparison; before a comparison, ``+``,
``-``, ``)``), so that ``T - BM*pid_m + i`` or ``BM*pid_m + i * 8`` keep their meaning.
"""

from __future__ import annotations

import re
from collections import Counter

from .cexpr import words

__all__ = ["with_named_indices"]

#: The name given to the global index of each local one.
_NAMES = {"i": "row", "j": "col", "j0": "col0"}
#: A line that declares a local index: its indent, then the name (``const int i =``), or a
#: loop over one whose body is a block (``for (int i = 0; i < BM; ++i) {``).
_DECLARED = re.compile(r"^(\s*)(?:const [\w ]+? (\w+) = .*;|for \([\w ]+? (\w+) = .*\{)$")
#: A loop's head.
_LOOP = re.compile(r"^\s*(?:for|while) \(")
#: A loop of a constant trip count (``c < 8``, ``i < BM``, ``fn < BD / TSR_MMA_N``).
_CONSTANT_TRIPS = re.compile(r"^\s*for \(int \w+ = \w+; \w+ < [A-Z0-9_ */()]+;")
#: A line that asks for the loop after it to unroll (``#pragma unroll 1`` does not).
_UNROLL = re.compile(r"^\s*(?:#pragma unroll(?! 1\b)|__attribute__\(\(opencl_unroll_hint(?!\(1\)))")
#: What may stand before an operand that is a sum (operators that bind looser than +).
_BEFORE = re.compile(r"(?:^|[(\[,{]|[=?:&|^+]|[^<]<|[^>]>|\breturn)\s*$")
#: What may follow it.
_AFTER = re.compile(r"^\s*(?:$|[)\],;?:&|^]|[-+](?![-+])|[<>](?![<>])|[=!]=)")


def with_named_indices(lines: list[str], tiles: frozenset[str], index_type: str) -> list[str]:
    """``lines`` (one statement or brace per line, indented two spaces a level) with the
    offsets plus a local index that repeat in its scope named; ``tiles`` are the kernel's
    tile constants (the offsets are ``BM*pid_m``), ``index_type`` the type of the sum."""
    if not tiles:
        return list(lines)
    lines = list(lines)
    text = "\n".join(lines)
    taken = words(text).intersection(_NAMES.values())
    offset = rf"(?:{'|'.join(sorted(tiles))})\*\w+"
    k = 0
    while k < len(lines):
        match = _DECLARED.match(lines[k])
        if match is None:
            k += 1
            continue
        indent = match[1] + ("  " if match[3] else "")
        if _unrolled(lines, k if match[3] else _opener(lines, k)):
            k += 1
            continue
        end = _scope_end(lines, k, len(indent))
        for index, name in _NAMES.items():
            body = lines[k + 1 : end]
            # Only straight-line code: a name held across a loop is one more register
            # live through it (ptxas spilled for one in a row reduction's loop).
            if name in taken or any(_LOOP.match(line) or _declares(line, index) for line in body):
                continue
            term = re.compile(rf"(?<![\w*.]){offset} \+ {index}(?![\w(\[])")
            counts = Counter(m[0] for line in body for m in _operands(term, line))
            if counts and counts.most_common(1)[0][1] >= 2:
                sum_ = counts.most_common(1)[0][0]
                body = [_replace(line, sum_, name) for line in body]
                declaration = f"{indent}const {index_type} {name} = {sum_};"
                lines[k + 1 : end] = [declaration, *body]
                end += 1
        k += 1
    return lines


def _opener(lines: list[str], k: int) -> int:
    """The line that opens the block around line ``k`` (-1 at the top)."""
    indent = len(lines[k]) - len(lines[k].lstrip())
    opener = k - 1
    while opener >= 0 and (
        not lines[opener].strip() or len(lines[opener]) - len(lines[opener].lstrip()) >= indent
    ):
        opener -= 1
    return opener


def _unrolled(lines: list[str], k: int) -> bool:
    """Whether line ``k`` is the head of a loop that unrolls (asked to, or of a constant
    trip count, which the compilers unroll unasked): there, each copy of the
    body adds its constant part (``j`` of ``tx + c * 16``) to the address as an
    immediate, which a sum named before it turns into one more register per copy
    (ptxas spilled at a GEMM's register limit)."""
    if k < 0 or not _LOOP.match(lines[k]):
        return False
    return bool(_CONSTANT_TRIPS.match(lines[k])) or (k > 0 and bool(_UNROLL.match(lines[k - 1])))


def _declares(line: str, index: str) -> bool:
    match = _DECLARED.match(line)
    return bool(match) and index in (match[2], match[3])


def _scope_end(lines: list[str], k: int, indent: int) -> int:
    """The index of the first line after ``k`` that is indented less than ``indent``."""
    end = k + 1
    while end < len(lines) and (
        not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) >= indent
    ):
        end += 1
    return end


def _operands(term: re.Pattern[str], line: str) -> list[re.Match[str]]:
    """The matches of ``term`` in ``line`` that stand as one operand."""
    return [
        m
        for m in term.finditer(line)
        if _BEFORE.search(line[: m.start()]) and _AFTER.match(line[m.end() :])
    ]


def _replace(line: str, sum_: str, name: str) -> str:
    term = re.compile(rf"(?<![\w*.]){re.escape(sum_)}(?![\w(\[])")
    for m in reversed(_operands(term, line)):
        line = line[: m.start()] + name + line[m.end() :]
    return re.sub(rf"(?<![\w\])])\(({name})\)", r"\1", line)
