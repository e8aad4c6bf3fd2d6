"""The parts of a tile-primitives header that one generated file uses.

A header is split at its section rules (``// ------ name``). What comes before the
first rule (includes, the namespace, basic types) always goes in; a section goes in
when the generated code names a symbol the section defines (``tsr::exp`` in C++,
``tsr_exp`` in OpenCL C), or when a section that goes in uses one. A file with no
attention leaves out online softmax, one with no dot leaves out the micro-kernel, and
a reader sees only what runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Section", "split", "needed", "CPP_SYMBOL", "C_SYMBOL"]

_RULE = re.compile(r"^// -{10,} (.+)$", re.M)
_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
#: Top-level declarations and the names they define.
_FUNCTION = re.compile(r"^(?:__device__ )?inline [^(]*?\b(\w+)\s*\(", re.M)
_CONSTANT = re.compile(r"^constexpr [^;]*;", re.M)
_TYPE = re.compile(r"^(?:struct (\w+)|typedef [^;]*?(\w+)\s*(?:__attribute__|;))", re.M)


@dataclass(frozen=True)
class Section:
    name: str
    text: str

    @property
    def defines(self) -> frozenset[str]:
        names = set(_FUNCTION.findall(self.text))
        for decl in _CONSTANT.findall(self.text):
            names.update(re.findall(r"(\w+)\s*=", decl))
        for struct, typedef in _TYPE.findall(self.text):
            names.add(struct or typedef)
        return frozenset(names)


def split(header: str) -> tuple[str, list[Section], str]:
    """(preamble, sections, closing): the closing is the header's last line (the end of
    the namespace, or a comment)."""
    body, _, closing = header.rstrip().rpartition("\n")
    rules = list(_RULE.finditer(body))
    preamble = body[: rules[0].start()] if rules else body
    sections = [
        Section(rule.group(1), body[rule.start() : nxt.start() if nxt else len(body)])
        for rule, nxt in zip(rules, [*rules[1:], None], strict=True)
    ]
    return preamble, sections, closing


#: How generated C++ names a header symbol (``tsr::exp``); OpenCL C has no namespaces.
CPP_SYMBOL = r"\btsr::(\w+)"
C_SYMBOL = r"\b(tsr_\w+)"


def needed(header: str, code: str, symbol: str = CPP_SYMBOL) -> str:
    """The header with only the sections ``code`` needs, directly or through others;
    ``symbol`` is a pattern whose group is a header symbol's name."""
    preamble, sections, closing = split(header)
    wanted = set(re.findall(symbol, code))
    keep: set[str] = set()
    changed = True
    while changed:
        changed = False
        for section in sections:
            if section.name not in keep and section.defines & wanted:
                keep.add(section.name)
                wanted |= set(_WORD.findall(section.text))
                changed = True
    kept = "".join(s.text for s in sections if s.name in keep)
    return preamble + kept.rstrip() + "\n\n" + closing
