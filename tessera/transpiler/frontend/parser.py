"""Parsing: ``.tsr`` text to AST, with recovery so one run reports several errors.

Recovery is by top-level statement: after a syntax error, the definition that
holds it is blanked out (line breaks kept, so every position stays valid) and
the file is parsed again. Each broken definition gets one error, later ones
are still checked, and nothing has to guess at repairing a parse state.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

from . import ast
from .builder import Builder
from .depth import MAX_DEPTH
from .diagnostics import ERROR_LIMIT, Diagnostic, Diagnostics
from .indenter import Indenter, LayoutError
from .lark_runtime import PatternStr, UnexpectedInput, new_parser
from .source import SourceFile
from .syntax_errors import describe_syntax_error

__all__ = ["parse"]

_DEFINITION_START = re.compile(r"(def|from|import)\b|@")

# The Lark parser and its postlexer are shared and keep per-parse state.
_LOCK = threading.Lock()


@functools.cache
def _parser() -> tuple[Any, Indenter, Builder, dict[str, str]]:
    indenter = Indenter()
    builder = Builder()
    lark = new_parser(postlex=indenter, transformer=builder.lark_callbacks())
    literals = {
        t.name: t.pattern.value for t in lark.terminals if isinstance(t.pattern, PatternStr)
    }
    builder.punctuation = frozenset(literals)
    return lark, indenter, builder, literals


def parse(source: SourceFile, diags: Diagnostics) -> ast.Module | None:
    """Parse a file; errors go to ``diags``, in source order. None if nothing parsed."""
    if not source.text.strip():
        diags.error("empty file: there is nothing to compile", file=source.name)
        return None
    lark, indenter, builder, literals = _parser()
    lines = source.text.split("\n")
    starts = _statement_starts(lines)
    syntax_errors: list[Diagnostic] = []
    while True:
        # The builder runs during the parse; only the last, successful
        # attempt's findings count, since earlier ones are repeated in it.
        attempt = Diagnostics()
        with _LOCK:
            builder.begin(source, attempt)
            try:
                module = lark.parse("\n".join(lines) + "\n")
                break
            except (UnexpectedInput, LayoutError) as exc:
                diagnostic = describe_syntax_error(exc, indenter.state, source, literals)
                token_line = _line_of(exc)
        syntax_errors.append(diagnostic)
        if len(syntax_errors) >= ERROR_LIMIT or not _blank_statement(
            lines, starts, diagnostic, token_line
        ):
            module = None
            break
    found = syntax_errors + list(attempt.items if module is not None else ())
    for diagnostic in sorted(found, key=_position):
        diags.report(diagnostic)
    if module is not None and not module.body and not diags.error_count:
        diags.error("file has no code, only comments and blank lines", file=source.name)
    if module is not None:
        _check_depth(module, diags)
    return module


def _check_depth(module: ast.Module, diags: Diagnostics) -> None:
    """One error for each top-level statement that nests deeper than ``MAX_DEPTH``
    levels, at the first node past the limit: later passes recurse on the nesting."""
    for statement in module.body:
        too_deep = next((n for n, depth in ast.walk(statement) if depth >= MAX_DEPTH), None)
        if too_deep is not None:
            diags.error(
                f"nested too deeply: more than {MAX_DEPTH} levels of expressions and blocks; "
                "give parts of it names",
                too_deep.span,
            )


def _position(diagnostic: Diagnostic) -> tuple[int, int]:
    span = diagnostic.span
    return (span.line, span.column) if span is not None else (0, 0)


def _line_of(exc: Exception) -> int:
    token = getattr(exc, "token", None)
    line = getattr(token, "line", None) or getattr(exc, "line", None)
    return line if isinstance(line, int) and line > 0 else 1 << 30


def _blank_statement(lines: list[str], starts: list[int], diagnostic, token_line: int) -> bool:
    """Blank the top-level statements from the error's location to the token that
    revealed it (a token that starts the next statement stays); False if there
    was nothing left to blank."""
    error_line = diagnostic.span.line if diagnostic.span is not None else token_line
    token_line = min(max(token_line, error_line), len(lines))
    first = _statement_of(starts, error_line - 1)
    last = _statement_of(starts, token_line - 1)
    if last > first and starts[last] == token_line - 1:
        last -= 1
    end = starts[last + 1] if last + 1 < len(starts) else len(lines)
    begin = starts[first] if starts else 0
    if all(not line.strip() for line in lines[begin:end]):
        return False
    for i in range(begin, end):
        lines[i] = "\r" if lines[i].endswith("\r") else ""
    return True


def _statement_of(starts: list[int], index: int) -> int:
    found = 0
    for k, start in enumerate(starts):
        if start <= index:
            found = k
    return found


def _statement_starts(lines: list[str]) -> list[int]:
    """0-based indices of lines that begin a top-level statement.

    A line at column 0 outside brackets and strings begins a statement, except
    right after decorators, which belong to the definition below them. A line
    that opens with ``def``, ``@``, ``from`` or ``import`` always does: it ends
    whatever bracket or string an earlier broken line left open.
    """
    starts: list[int] = []
    depth = 0
    quote = ""
    after_decorator = False
    for index, line in enumerate(lines):
        if _DEFINITION_START.match(line):
            depth, quote = 0, ""
        if depth == 0 and not quote and line[:1] not in ("", " ", "\t", "\r", "#"):
            if not after_decorator:
                starts.append(index)
            after_decorator = line.startswith("@")
        i = 0
        while i < len(line):
            if quote:
                if line.startswith(quote, i):
                    i += len(quote)
                    quote = ""
                    continue
                i += 2 if line[i] == "\\" else 1
                continue
            char = line[i]
            if char == "#":
                break
            if char in "\"'":
                quote = char * 3 if line.startswith(char * 3, i) else char
                i += len(quote)
                continue
            if char in "([{":
                depth += 1
            elif char in ")]}":
                depth = max(0, depth - 1)
            i += 1
        if len(quote) == 1:
            quote = ""
    return starts or [0]
