"""What every backend's printing shares: its templates, its header, source-line comments."""

from __future__ import annotations

from importlib import resources

import jinja2

from ..frontend.source import SourceFile, Span

__all__ = ["environment", "header", "SourceLines"]


def environment(target: str) -> jinja2.Environment:
    """The Jinja environment of ``tessera/templates/<target>``: strict, no escaping."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("tessera", f"templates/{target}"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def header(path: str) -> str:
    """A tile-primitives header's text, without its include guard, for inlining."""
    text = resources.files("tessera.templates").joinpath(path).read_text()
    return text.replace("#pragma once\n", "").strip()


class SourceLines:
    """Comments that say which ``.tsr`` line a block of generated code comes from: one
    per line, where the code moves to another line."""

    def __init__(self) -> None:
        self.last: tuple[str, int] | None = None
        #: The lines of the source last commented on, split once, not once a comment.
        self.source: SourceFile | None = None
        self.lines: list[str] = []

    def comment(self, span: Span | None) -> str | None:
        if span is None or (span.file, span.line) == self.last:
            return None
        self.last = (span.file, span.line)
        if span.source is not self.source:
            self.source, self.lines = span.source, span.source.text.split("\n")
        lines = self.lines
        text = lines[span.line - 1].strip() if span.line <= len(lines) else ""
        return f"// {span.file.rsplit('/', 1)[-1]}:{span.line}: {text}"
