"""The diagnostics engine shared by every stage.

Stages report problems in the user's terms, at the user's line, and keep
going where that makes sense; ``Diagnostics.check()`` turns the collected
errors into one ``CompileError`` at the end of a stage. Rendering follows
clang: ``file:line:col: error: message``, the source line, and a caret with
``~`` under the rest of the span.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Iterable
from dataclasses import replace

from ...frozen import frozen
from .source import Span

__all__ = [
    "Severity",
    "Note",
    "Diagnostic",
    "Diagnostics",
    "CompileError",
    "render",
    "did_you_mean",
]

#: After this many errors a stage stops reporting: later ones are usually echoes.
ERROR_LIMIT = 20


class Severity(enum.Enum):
    ERROR = "error"
    WARNING = "warning"


@frozen
class Note:
    """Extra context for a diagnostic, such as where a bracket was opened."""

    message: str
    span: Span | None = None


@frozen
class Diagnostic:
    severity: Severity
    message: str
    span: Span | None = None
    notes: tuple[Note, ...] = ()
    #: The file the diagnostic is about: its span's, or given for a location-less one
    #: (an empty file, say).
    file: str | None = None

    def __post_init__(self) -> None:
        if self.file is None and self.span is not None:
            object.__setattr__(self, "file", self.span.file)

    def render(self) -> str:
        lines = [_headline(self.span, self.file, self.severity.value, self.message)]
        lines += _snippet(self.span)
        for note in self.notes:
            lines.append(_headline(note.span, None, "note", note.message))
            lines += _snippet(note.span)
        return "\n".join(lines)


def _headline(span: Span | None, file: str | None, kind: str, message: str) -> str:
    if span is not None:
        return f"{span}: {kind}: {message}"
    if file is not None:
        return f"{file}: {kind}: {message}"
    return f"{kind}: {message}"


def _snippet(span: Span | None) -> list[str]:
    """The source line and a caret line; tabs are kept so the caret lines up."""
    if span is None:
        return []
    text = span.source.line_text(span.line)
    if not text.strip() and span.column > len(text) + 1:
        return []
    start = min(span.column, len(text) + 1) - 1
    if span.end_line == span.line:
        end = max(start + 1, min(span.end_column - 1, len(text)))
    else:
        end = max(start + 1, len(text.rstrip()))
    pad = "".join(c if c == "\t" else " " for c in text[:start])
    return [text, pad + "^" + "~" * (end - start - 1)]


def render(diagnostics: tuple[Diagnostic, ...] | list[Diagnostic]) -> str:
    """All diagnostics, then a clang-style count line when there are errors."""
    parts = [d.render() for d in diagnostics]
    errors = sum(d.severity is Severity.ERROR for d in diagnostics)
    if errors:
        parts.append(f"{errors} error{'s' if errors != 1 else ''} generated.")
    return "\n".join(parts)


class CompileError(Exception):
    """The program has errors; ``str()`` is the rendered diagnostics."""

    def __init__(self, diagnostics: tuple[Diagnostic, ...]) -> None:
        super().__init__(render(diagnostics))
        self.diagnostics = diagnostics


class Diagnostics:
    """Collects the diagnostics of one compilation."""

    def __init__(self) -> None:
        self._items: list[Diagnostic] = []

    @property
    def items(self) -> tuple[Diagnostic, ...]:
        return tuple(self._items)

    @property
    def error_count(self) -> int:
        return sum(d.severity is Severity.ERROR for d in self._items)

    @property
    def at_limit(self) -> bool:
        return self.error_count >= ERROR_LIMIT

    def error(
        self,
        message: str,
        span: Span | None = None,
        notes: tuple[Note, ...] = (),
        file: str | None = None,
    ) -> None:
        self.report(Diagnostic(Severity.ERROR, message, span, notes, file))

    def report(self, diagnostic: Diagnostic) -> None:
        """Add a ready-made diagnostic; errors past ``ERROR_LIMIT`` are dropped."""
        if diagnostic.severity is Severity.ERROR:
            if self.at_limit:
                return
            if self.error_count == ERROR_LIMIT - 1:
                note = Note(f"too many errors ({ERROR_LIMIT}); stopping here")
                diagnostic = replace(diagnostic, notes=(*diagnostic.notes, note))
        self._items.append(diagnostic)

    def warning(self, message: str, span: Span | None = None, notes: tuple[Note, ...] = ()) -> None:
        self.report(Diagnostic(Severity.WARNING, message, span, notes))

    def check(self) -> None:
        """Raise ``CompileError`` if any error was reported."""
        if self.error_count:
            raise CompileError(self.items)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'gelu'?"`` for the closest candidate, or ``""``."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""
