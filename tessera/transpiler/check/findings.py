"""What a static check of the Tile IR reports: a finding at one or two ``.tsr`` lines.

A finding is a warning, not an error: the checks are conservative where the Tile IR
does not say enough (a slot index they cannot compare, a layout they do not model),
and a program with a finding still compiles. ``tesserac check`` prints them as
diagnostics and exits 1 when there is any, so a build can refuse them.
"""

from __future__ import annotations

from ...frozen import frozen
from ..frontend.diagnostics import Diagnostic, Note, Severity
from ..frontend.source import Span

__all__ = ["Finding"]


@frozen
class Finding:
    """One problem in one kernel: ``check`` names the check that found it ("race",
    "bank-conflict"); ``other`` is the second access of a pair, with what it does."""

    check: str
    kernel: str
    message: str
    span: Span | None
    other: tuple[str, Span | None] | None = None

    def diagnostic(self) -> Diagnostic:
        notes = () if self.other is None else (Note(self.other[0], self.other[1]),)
        message = f"{self.check}: {self.message} (kernel '{self.kernel}')"
        return Diagnostic(Severity.WARNING, message, self.span, notes)

    def as_json(self) -> dict[str, object]:
        """The finding as ``--emit meta`` and the inspector show it."""
        data: dict[str, object] = {
            "check": self.check,
            "message": self.message,
            "line": self.span.line if self.span else None,
        }
        if self.other is not None:
            data["other_line"] = self.other[1].line if self.other[1] else None
        return data
