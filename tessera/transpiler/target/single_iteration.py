"""Loops of one iteration written as their body: ``for (int fm = 0; fm < 1; ++fm)``
says nothing a reader needs, and hides that ``fm`` is 0.

The SIMT lowering opens its loops over fragments and register slots by the shape of a
tile's distribution, which makes some of them run once (one fragment per warp along
M). This pass, on a kernel's finished lines, writes each such loop as its body, the
counter replaced by 0 and the terms that 0 cancels dropped (``fm * 2 + rs`` reads
``rs``). The body keeps braces of its own only where one of its declarations would
otherwise meet a declaration of the same name in the enclosing block.
"""

from __future__ import annotations

import re

__all__ = ["without_single_iterations"]

#: A loop of one iteration: its indent, its counter and what follows its head (`` {``
#: for a block, else the one statement).
_ONCE = re.compile(r"^(\s*)for \([\w: ]+? (\w+) = 0; \2 < 1; (?:\+\+\2|\2\+\+|\2 \+= 1)\)(.*)$")
#: A line that asks for the loop after it to unroll.
_UNROLL = re.compile(r"^\s*(?:#pragma unroll\b.*|__attribute__\(\(opencl_unroll_hint.*)$")
#: A declaration's name, at the start of a line (``const long long i =``, ``float* const
#: t =``, ``unsigned a_frag[1][4];``); a statement such as ``return x;`` passes for one,
#: which costs at most a pair of braces.
_DECLARED = re.compile(r"^\s*(?:const )?(?:[\w:]+\*? (?:const )?)+(\w+)(?:\[[^\]]*\])* ?[=;]")
#: A factor of a product: a name, a number or a parenthesized group without parentheses.
_FACTOR = r"(?:\w+|\([^()]*\))"
#: A term that is zero: 0, times or divided by anything (``0 * 2``, ``0 / 4 * 16``).
_ZERO = rf"(?<![\w.])0(?: [*/%] {_FACTOR})*(?![\w.(])"
#: Where a term ends and where one begins.
_END = r"(?=\s*(?:[-+)\],;?:<>=&|]|$))"
_START = r"(^\s*|[(\[,=?:] ?|\breturn )"


def without_single_iterations(lines: list[str]) -> list[str]:
    """``lines`` (one statement or brace per line, indented two spaces a level) with
    every loop of one iteration replaced by its body."""
    lines = list(lines)
    k = 0
    while k < len(lines):
        match = _ONCE.match(lines[k])
        if match is None or lines[k].lstrip().startswith("//"):
            k += 1
            continue
        indent, counter, rest = match.groups()
        start = k - 1 if k > 0 and _UNROLL.match(lines[k - 1]) else k
        if rest != " {":
            lines[start : k + 1] = [indent + _fixed(rest.strip(), counter)]
            k = start
            continue
        end = _closing(lines, k, indent)
        body = [_fixed(line[2:], counter) for line in lines[k + 1 : end]]
        if _clashes(lines, start, end, indent, body):
            body = [indent + "{", *(f"  {line}" for line in body), indent + "}"]
        lines[start : end + 1] = body
        k = start
    return lines


def _closing(lines: list[str], k: int, indent: str) -> int:
    """The line that closes the block opened at line ``k``."""
    for end in range(k + 1, len(lines)):
        if lines[end] == indent + "}":
            return end
    raise AssertionError(f"no closing brace for {lines[k].strip()!r}")


def _clashes(lines: list[str], start: int, end: int, indent: str, body: list[str]) -> bool:
    """Whether a declaration at the top level of ``body`` names something declared at
    the same level of the block around the loop (``lines[start:end + 1]``)."""
    names = {m.group(1) for line in body if (m := _DECLARED.match(line)) and _level(line) == indent}
    if not names:
        return False
    lo = start
    while lo > 0 and not (_level(lines[lo - 1]) < indent and lines[lo - 1].endswith("{")):
        lo -= 1
    hi = end + 1
    while hi < len(lines) and not (_level(lines[hi]) < indent):
        hi += 1
    around = [*lines[lo:start], *lines[end + 1 : hi]]
    return any(
        (m := _DECLARED.match(line)) and _level(line) == indent and m.group(1) in names
        for line in around
    )


def _level(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _fixed(line: str, counter: str) -> str:
    """``line`` with ``counter`` at 0 and the terms that makes zero dropped."""
    if line.lstrip().startswith("//") or not re.search(rf"\b{counter}\b", line):
        return line
    line = re.sub(rf"\b{counter}\b", "0", line)
    previous = None
    while previous != line:
        previous = line
        line = re.sub(rf" [-+] {_ZERO}{_END}", "", line)
        line = re.sub(rf"{_START}{_ZERO} \+ ", r"\1", line)
        # what a dropped term leaves: a name alone in parentheses
        line = re.sub(r"(?<![\w\]])\((\w+)\)(?=\s*(?:[-+*/%\]),;]|$))", r"\1", line)
    return line
