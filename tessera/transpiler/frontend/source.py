"""Source files and spans.

Every diagnostic points into a ``SourceFile`` through a ``Span``; keeping the
file object on the span means a diagnostic can be rendered anywhere (CLI,
pytest, a notebook) without a separate registry of open files.
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path

from ...frozen import frozen

__all__ = ["SourceFile", "Span", "SourceReadError", "read_source"]


@frozen(eq=False)
class SourceFile:
    """A decoded ``.tsr`` file. Compared by identity: two loads are two files."""

    name: str
    text: str
    _lines: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Lines end at "\n" alone, as the lexer counts them: splitlines() would also end
        # one at a lone CR or a form feed, and put a position past the file's last line.
        lines = self.text.split("\n")
        if lines[-1] == "":  # a final line break ends the last line; it starts none
            lines.pop()
        object.__setattr__(self, "_lines", tuple(lines))

    def line_text(self, line: int) -> str:
        """The text of a 1-based line, without its line break ('' past the end)."""
        if 1 <= line <= len(self._lines):
            return self._lines[line - 1]
        return ""

    def end_span(self) -> Span:
        """A zero-width span just after the last character of the file."""
        line = max(1, len(self._lines))
        column = len(self.line_text(line)) + 1
        return Span(self, line, column, line, column)


@frozen
class Span:
    """A range in a source file: 1-based lines and columns, end column exclusive."""

    source: SourceFile = field(repr=False, compare=False)
    line: int
    column: int
    end_line: int
    end_column: int

    @property
    def file(self) -> str:
        return self.source.name

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"

    def to(self, other: Span) -> Span:
        """The span from the start of ``self`` to the end of ``other``."""
        return Span(self.source, self.line, self.column, other.end_line, other.end_column)


class SourceReadError(Exception):
    """A file could not be read or decoded; carries a ready-to-print message.

    ``span`` locates a decoding error (in the text decoded with replacement
    characters), so it prints as ``file:line:col:`` like any other error.
    """

    def __init__(self, message: str, span: Span | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.span = span


def decode_source(name: str, data: bytes) -> SourceFile:
    """Decode UTF-8 (an optional BOM is dropped); report the first bad byte by position."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        line_start = before.rfind(b"\n") + 1
        column = len(data[line_start : exc.start].decode("utf-8", errors="replace")) + 1
        shown = SourceFile(name, data.decode("utf-8", errors="replace"))
        raise SourceReadError(
            f"invalid UTF-8 byte 0x{data[exc.start]:02x}: .tsr files must be UTF-8 text",
            Span(shown, line, column, line, column + 1),
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return SourceFile(name, text)


def read_source(path: str | Path) -> SourceFile:
    """Read a ``.tsr`` file, turning every OS failure into one clear sentence."""
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise SourceReadError(f"no such file: '{name}'") from None
    except IsADirectoryError:
        raise SourceReadError(f"'{name}' is a directory, not a .tsr file") from None
    except PermissionError:
        raise SourceReadError(f"permission denied reading '{name}'") from None
    except OSError as exc:
        raise SourceReadError(f"cannot read '{name}': {exc.strerror}") from None
    return decode_source(name, data)
