"""What every backend's printing shares: its templates, its header, source-line comments."""

from __future__ import annotations

import re
from importlib import resources

import jinja2

from ...cachedir import private_cache_dir
from ..frontend.source import SourceFile, Span

__all__ = ["environment", "header", "SourceLines", "comment_text", "python_text"]

#: What ends a line in a C-family compiler when it stands at a line's end: a backslash
#: (which splices the next line on) and its trigraph ``??/`` (C99 and OpenCL C).
_SPLICE = re.compile(r"(?:\\|\?\?/|\s)+\Z")


def environment(target: str) -> jinja2.Environment:
    """The Jinja environment of ``tessera/templates/<target>``: strict, no escaping but
    where a template asks for it: text the source decides (its file's name) goes
    through the ``comment`` filter into a C comment, the ``python`` filter into a
    Python string. Compiling a template takes a tenth of a second, so the compiled form
    is kept between runs where a private cache folder can be had."""
    compiled = private_cache_dir("templates")
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tessera", f"templates/{target}"),
        bytecode_cache=jinja2.FileSystemBytecodeCache(str(compiled)) if compiled else None,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["comment"] = comment_text
    env.filters["python"] = python_text
    return env


def header(path: str) -> str:
    """A tile-primitives header's text, without its include guard, for inlining."""
    text = resources.files("tessera.templates").joinpath(path).read_text()
    return text.replace("#pragma once\n", "").strip()


def comment_text(text: str) -> str:
    """``text`` (a ``.tsr`` line, a file name: anything the source decides) as it may
    stand in a ``//`` comment of generated C++, CUDA, HIP or OpenCL C, with nothing that
    could end the comment or reach the next line: every character Python does not
    print (CR and LF, which end a line for g++ and clang though not for Tessera, the
    other controls, Unicode line and paragraph separators, bidirectional overrides) is
    written as its escape (``\\r``), ``*/`` as ``*\\/``, and a backslash or ``??/`` at the
    end, which would splice the next generated line into the comment, is dropped. An
    ordinary line comes out as it is."""
    escaped = "".join(
        ch if ch.isprintable() or ch == "\t" else ch.encode("unicode_escape").decode("ascii")
        for ch in text.strip()
    )
    return _SPLICE.sub("", escaped.replace("*/", "*\\/"))


def python_text(text: str, quote: str = '"') -> str:
    """``text`` escaped to stand between ``quote`` characters in generated Python, in a
    string literal or a docstring: backslashes, the quote and every character Python
    does not print are escaped, so that no name or file name ends the string."""
    escaped = text.encode("unicode_escape").decode("ascii")
    return escaped.replace(quote, "\\" + quote)


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
        return "// " + comment_text(f"{span.file.rsplit('/', 1)[-1]}:{span.line}: {text}")
