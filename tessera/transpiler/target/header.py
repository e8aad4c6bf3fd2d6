"""The parts of a tile-primitives header that one generated file uses.

A header is split at its section rules (``// ------ name``), and a section into
paragraphs at its blank lines. What comes before the first rule (includes, the
namespace, basic types) always goes in; a paragraph goes in when the generated code
names a symbol it defines (``tsr::exp`` in C++, ``tsr_exp`` in OpenCL C), or when a
paragraph that goes in uses one, with its own comment and the introduction of its
section; an overload for a type the file never names (``to_float(e4m3)``) stays out.
A file with no attention leaves out online softmax, one of f32 tensors the bf16
conversions, and a reader sees only what runs.
"""

from __future__ import annotations

import functools
import re

from ...frozen import frozen

__all__ = ["Section", "split", "paragraphs", "needed", "CPP_SYMBOL", "C_SYMBOL"]

_RULE = re.compile(r"^// -{10,} (.+)$", re.M)
_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
#: A function's parameters.
_SIGNATURE = re.compile(r"^(?:__device__ )?inline [^(]*?\w+\s*\(([^)]*)\)", re.M)
#: A string literal, whose braces (PTX's ``{ %0, %1 }``) are no blocks.
_STRING = re.compile(r'"(?:\\.|[^"\\])*"')
#: Top-level declarations and the names they define.
_FUNCTION = re.compile(r"^(?:__device__ )?inline [^(=]*?\b(\w+)\s*\(", re.M)
#: An inline variable (``inline bool forked_child = false;``), whose initializer may call
#: a function that is not the header's.
_VARIABLE = re.compile(r"^inline [^(=;]*?\b(\w+)\s*=", re.M)
_CONSTANT = re.compile(r"^(?:constexpr [^;]*|enum \{[^}]*\});", re.M)
_TYPE = re.compile(r"^(?:struct (\w+)|typedef [^;]*?(\w+)\s*(?:__attribute__|;))", re.M)


@frozen
class Section:
    name: str
    text: str

    @functools.cached_property
    def defines(self) -> frozenset[str]:
        names = set(_FUNCTION.findall(self.text)) | set(_VARIABLE.findall(self.text))
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
C_SYMBOL = r"\b((?:tsr|TSR)_\w+)"


def paragraphs(text: str) -> list[Section]:
    """A section's top-level paragraphs: runs of lines between blank lines that stand
    outside every brace and every ``#if``, each with the comment that opens it."""
    out, start, depth, nesting = [], 0, 0, 0
    lines = text.split("\n")
    for i, line in enumerate(lines):
        code = _STRING.sub('""', line).split("//", 1)[0]
        depth += code.count("{") - code.count("}")
        directive = line.lstrip()
        nesting += directive.startswith("#if") - directive.startswith("#endif")
        if not line.strip() and depth == 0 and nesting == 0:
            if i > start:
                out.append(Section("", "\n".join(lines[start:i]) + "\n"))
            start = i + 1
    if start < len(lines) and "\n".join(lines[start:]).strip():
        out.append(Section("", "\n".join(lines[start:])))
    return out


def _callable(part: Section, types: frozenset[str], wanted: set[str]) -> bool:
    """Whether a paragraph may be called: it declares no function, or one whose
    parameters are of no header type that the file leaves out (``to_float(e4m3)``
    in a file without fp8)."""
    signatures = _SIGNATURE.findall(part.text)
    return not signatures or any(
        set(_WORD.findall(params)) & types <= wanted for params in signatures
    )


@functools.lru_cache(maxsize=16)
def _parsed(
    header: str,
) -> tuple[str, list[Section], str, dict[str, list[Section]], frozenset[str]]:
    """The header split into sections and paragraphs, and the types it declares: the
    same for every file of a target, so worked out once a process."""
    preamble, sections, closing = split(header)
    parts = {s.name: paragraphs(s.text) for s in sections}
    types = frozenset(
        struct or typedef for s in sections for struct, typedef in _TYPE.findall(s.text)
    )
    return preamble, sections, closing, parts, types


def needed(header: str, code: str, symbol: str = CPP_SYMBOL) -> str:
    """The header with only the parts ``code`` needs, directly or through others:
    the sections that define a name it uses and, in them, the paragraphs that define
    one (and those that define none: a section's introduction); ``symbol`` is a
    pattern whose group is a header symbol's name."""
    preamble, sections, closing, parts, types = _parsed(header)
    wanted = set(re.findall(symbol, code))
    keep: set[int] = set()
    changed = True
    while changed:
        changed = False
        for part in (p for s in sections for p in parts[s.name]):
            if id(part) not in keep and part.defines & wanted and _callable(part, types, wanted):
                keep.add(id(part))
                # Its own names are no reason to keep the paragraphs that overload them.
                wanted |= set(_WORD.findall(part.text)) - part.defines
                changed = True
    kept = []
    for s in sections:
        if any(id(p) in keep for p in parts[s.name]):
            kept += [p.text for p in parts[s.name] if id(p) in keep or not p.defines]
    return preamble + "\n".join(kept).rstrip() + "\n\n" + closing
