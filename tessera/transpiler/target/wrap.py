"""Generated lines under 100 columns, broken where a person would break them.

A statement, a signature or a comment that the emitters write on one line can be longer
than a reader's window (a kernel's parameters, an index expression). A line of code
breaks at a space outside as many parentheses as it can: after a comma or a semicolon,
after an assignment, or before another binary operator, as late as fits (after a
declaration's opening parenthesis where its first parameter ends past the column; never
inside a compiler attribute's parentheses), and goes on four columns deeper; a loop or
an ``if`` with its body on the same line breaks after its head first. A comment after
code moves to a line of its own above it, and a comment line breaks between words and
goes on as a comment. Lines that hold a string or character literal, and preprocessor
lines, are left as they are: a break there could change what they mean.
"""

from __future__ import annotations

import re
import string

__all__ = ["wrap_lines", "COLUMNS"]

#: Lines are shorter than this.
COLUMNS = 100
#: Operators a line may break before (with a space on either side in generated code).
_OPERATORS = re.compile(r" (?:\+|-|\*|/|%|&&|\|\||\?|:|<<|>>|<=|>=|==|!=|<|>|=) ")
_OPEN, _CLOSE = "([{", ")]}"
#: The characters that open or close a bracket or may be a place to break.
_MARKS = re.compile(r"[()\[\]{} ]")
#: The fewest characters a piece of a broken line holds, where a deeper break gives more.
_SHORTEST = 24
#: How loosely each operator binds (lower breaks first); the rest rank 7.
_RANK = {"?": 2, ":": 2, "||": 3, "&&": 4, "==": 5, "!=": 5, "<": 5, ">": 5, "<=": 5, ">=": 5,
         "+": 6, "-": 6}  # fmt: skip
#: A compiler attribute's name, just before its parentheses, which hold no break.
_ATTRIBUTE = re.compile(r"__\w+__")
#: The characters of a C identifier.
_WORD = string.ascii_letters + string.digits + "_"
#: A statement that starts with a loop's or a condition's head.
_CONTROL = re.compile(r"\s*(?:for|if|while) \(")
#: What may not end a comment line: a backslash or its trigraph splices the next line.
_SPLICE = ("\\", "??/")


def wrap_lines(source: str) -> str:
    """``source`` with every line of 100 columns or more broken, where it can be."""
    out: list[str] = []
    wrapped: dict[str, list[str]] = {}  # a file repeats its long lines (twin kernels)
    for line in source.split("\n"):
        if len(line) < COLUMNS:
            out.append(line)
            continue
        if line not in wrapped:
            wrapped[line] = _wrap(line)
        out += wrapped[line]
    return "\n".join(out)


def _wrap(line: str) -> list[str]:
    if len(line) < COLUMNS:
        return [line]
    stripped = line.lstrip()
    indent = line[: len(line) - len(stripped)]
    if stripped.startswith("//"):
        return _wrap_comment(line, indent)
    code = line.replace('extern "C" ', "")
    if stripped.startswith("#") or '"' in code or "'" in code:
        return [line]
    if "//" in line:  # a comment after code goes on a line of its own, above the code
        code, comment = line.split("//", 1)
        return [*_wrap_comment(f"{indent}//{comment}", indent), *_wrap(code.rstrip())]
    lines = []
    while len(line) >= COLUMNS:
        at = _break_at(line, len(line) - len(line.lstrip()))
        if at is None:
            break
        lines.append(line[:at].rstrip())
        line = indent + "    " + line[at:].lstrip()
    lines.append(line)
    return _continued(lines)


def _continued(lines: list[str]) -> list[str]:
    """Continuation lines all at the first one's depth (four columns past the first)."""
    if len(lines) < 2:
        return lines
    depth = len(lines[1]) - len(lines[1].lstrip())
    return [lines[0]] + [" " * depth + line.lstrip() for line in lines[1:]]


def _break_at(line: str, start: int) -> int | None:
    """Where to break ``line`` (the index of the space to drop), or None: the last
    place before column 100 among the best: outside the fewest brackets, and there at
    the loosest separator."""
    depth, spots, opened, attribute = 0, [], None, None
    control = _CONTROL.match(line) is not None
    # (parentheses, rank, index) of each place: the fewest parentheses first, then a
    # comma before an assignment before the operators, loosest binding first.
    # Nothing past the column is a place to break, nor changes one before it.
    for mark in _MARKS.finditer(line, 0, COLUMNS - 1):
        i, ch = mark.start(), mark[0]
        if ch in _OPEN:
            if ch == "(" and depth == 0 and line[i + 1 : i + 2] != ")":
                opened = i + 1
            if attribute is None and _attribute_before(line, i):
                attribute = depth  # no break inside ``__launch_bounds__(384, 1)``
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            attribute = None if attribute == depth else attribute
        elif ch == " " and start < i < COLUMNS - 1 and attribute is None:
            if control and depth == 0 and line[i - 1] == ")":
                spots.append((-1, 0, i))  # after a loop's or an if's head: the body below it
                control = False
            operator = _OPERATORS.match(line, i)
            if line[i - 1] in ",;":
                spots.append((depth, 0, i))
            elif line[i - 2 : i] == " =":
                spots.append((depth, 1, i))
            elif operator is not None and line[i + 1] != "=":
                spots.append((depth, _RANK.get(operator.group().strip(), 7), i))
    if not spots:  # a declaration whose first parameter ends past the column: after "("
        return opened
    # A piece of a few characters (``r =`` then ``r``) says less than a deeper break.
    ranked = sorted({spot[:2] for spot in spots})
    for best in ranked:
        at = max(i for d, r, i in spots if (d, r) == best)
        if at - start >= _SHORTEST:
            return at
    return max(i for d, r, i in spots if (d, r) == ranked[0])


def _attribute_before(line: str, i: int) -> bool:
    """Whether the word that ends at ``i`` is a compiler attribute's name (``__x__``)."""
    before = line[:i]
    word = before[len(before.rstrip(_WORD)) :]
    return _ATTRIBUTE.fullmatch(word) is not None


def _wrap_comment(line: str, indent: str) -> list[str]:
    """A comment line broken between words, each piece a comment of its own."""
    lines = []
    while len(line) >= COLUMNS:
        # Break only after some of the comment's text, so each piece makes progress
        # (a space of the "//   " prefix is not a break: a deep indent looped forever).
        text = line.index("//") + 2
        text += len(line[text:]) - len(line[text:].lstrip())
        at = line.rfind(" ", text + 1, COLUMNS - 1)
        while at > text and line[:at].rstrip().endswith(_SPLICE):
            at = line.rfind(" ", text + 1, at)
        if at <= text:
            break
        lines.append(line[:at].rstrip())
        line = indent + "//   " + line[at:].lstrip()
    lines.append(line)
    return lines
