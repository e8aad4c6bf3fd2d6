"""Postlexer: indentation to _INDENT/_DEDENT tokens, bracket tracking.

Lark's stock ``Indenter`` does the same job but raises bare exceptions with no
position; this one reports tabs mixed with spaces, unindents that match no
outer level and mismatched brackets at the offending character, and remembers
the open brackets and the last tokens so that a parse error can say what it
was in the middle of.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from .lark_runtime import PostLex, Token

__all__ = ["Indenter", "IndentState", "LayoutError"]

OPENERS = {"LPAR": ")", "LSQB": "]", "LBRACE": "}"}
CLOSERS = {"RPAR": "(", "RSQB": "[", "RBRACE": "{"}
LAYOUT_TYPES = frozenset({"_NEWLINE", "_INDENT", "_DEDENT"})


class LayoutError(Exception):
    """An error found by the postlexer, with the token it concerns.

    ``note`` is an optional (message, token) pair pointing elsewhere, such as
    the bracket that a wrong closer should have matched.
    """

    def __init__(self, message: str, token: Token, note: tuple[str, Token] | None = None):
        super().__init__(message)
        self.message = message
        self.token = token
        self.note = note


@dataclass
class IndentState:
    """What the postlexer knew when parsing stopped."""

    brackets: list[Token] = field(default_factory=list)
    levels: list[int] = field(default_factory=lambda: [0])
    indent_char: str | None = None
    first_indent: Token | None = None
    #: The last two tokens that were neither newlines nor indentation.
    recent: list[Token] = field(default_factory=list)


class Indenter(PostLex):
    always_accept = ("_NEWLINE",)

    def __init__(self) -> None:
        self.state = IndentState()

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        self.state = state = IndentState()
        last = Token("_NEWLINE", "", 0, 1, 1, 1, 1, 0)
        for token in stream:
            last = token
            if token.type == "_NEWLINE":
                if not state.brackets:
                    yield from self._newline(token, state)
                continue
            if token.type in OPENERS:
                state.brackets.append(token)
            elif token.type in CLOSERS:
                self._close(token, state)
            state.recent = [*state.recent[-1:], token]
            yield token
        while len(state.levels) > 1:
            state.levels.pop()
            yield Token.new_borrow_pos("_DEDENT", "", last)

    @staticmethod
    def _close(token: Token, state: IndentState) -> None:
        if not state.brackets:
            raise LayoutError(f"unmatched '{token.value}'", token)
        opener = state.brackets[-1]
        if OPENERS[opener.type] != token.value:
            raise LayoutError(
                f"closing '{token.value}' does not match '{opener.value}'",
                token,
                (f"'{opener.value}' opened here", opener),
            )
        state.brackets.pop()

    @staticmethod
    def _newline(token: Token, state: IndentState) -> Iterator[Token]:
        yield token
        indent = token.value.rsplit("\n", 1)[1]
        line, column = token.end_line, token.end_column
        here = Token("_INDENT", indent, token.end_pos, line, column, line, column, token.end_pos)
        if indent:
            chars = set(indent)
            if len(chars) > 1 or (state.indent_char and state.indent_char not in chars):
                first = state.first_indent
                note = None
                if first is not None:
                    what = "tabs" if state.indent_char == "\t" else "spaces"
                    note = (f"the file is indented with {what} from here on", first)
                raise LayoutError("inconsistent use of tabs and spaces in indentation", here, note)
            if state.indent_char is None:
                state.indent_char = indent[0]
                state.first_indent = here
        width = len(indent)
        if width > state.levels[-1]:
            state.levels.append(width)
            yield here
            return
        while width < state.levels[-1]:
            state.levels.pop()
            yield Token.new_borrow_pos("_DEDENT", indent, here)
        if width != state.levels[-1]:
            raise LayoutError("unindent does not match any outer indentation level", here)
