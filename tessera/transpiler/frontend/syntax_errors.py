"""Words for parse failures.

Lark reports what went wrong as terminal names (``COLON``, ``__ANON_5``); a
kernel author needs "expected ':' after the function signature" at the right
column. This module turns a Lark exception plus what the postlexer saw into a
``Diagnostic``: first the specific situations users actually hit (a missing
colon, an unclosed bracket, a missing indented block, an unterminated
string, a Python feature Tessera does not have), then a generic "expected X
before Y" with the expected terminals summarised in words.
"""

from __future__ import annotations

from .diagnostics import Diagnostic, Note, Severity
from .indenter import CLOSERS, OPENERS, IndentState, LayoutError
from .lark_runtime import Token, UnexpectedCharacters, UnexpectedToken
from .source import SourceFile, Span

__all__ = ["describe_syntax_error", "UNSUPPORTED_KEYWORDS"]

#: Python keywords a Tessera author may reach for, with what to say instead.
UNSUPPORTED_KEYWORDS = {
    "while": "'while' loops are not supported; use 'for ... in range(...)' or tile.range_n",
    "break": "'break' is not supported: Tessera loops always run to completion",
    "continue": "'continue' is not supported: Tessera loops always run to completion",
    "class": "classes are not supported in .tsr files",
    "lambda": "'lambda' is not supported; define a function with 'def'",
    "try": "exceptions are not supported in Tessera",
    "except": "exceptions are not supported in Tessera",
    "finally": "exceptions are not supported in Tessera",
    "raise": "exceptions are not supported in Tessera",
    "yield": "generators ('yield') are not supported in Tessera",
    "async": "'async' is not supported in Tessera",
    "await": "'await' is not supported in Tessera",
    "del": "'del' is not supported in Tessera",
    "global": "'global' is not supported in Tessera",
    "nonlocal": "'nonlocal' is not supported in Tessera",
    "assert": "'assert' is not supported in Tessera",
}

_EXPR_START = {
    "NAME", "INT", "FLOAT", "STRING", "LPAR", "LSQB", "LBRACE",
    "MINUS", "PLUS", "NOT", "NONE", "TRUE", "FALSE",
}  # fmt: skip
#: Terminals that may follow a complete expression; summarised as "an operator".
_AFTER_EXPR_VALUES = {
    "+", "-", "*", "/", "//", "%", "@", "**", "<", ">", "==", ">=", "<=", "!=",
    "and", "or", "in", "is", "not", "if", ".", "(", "[",
}  # fmt: skip
_WORDS = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "STRING": "a string",
    "_NEWLINE": "end of line",
    "_INDENT": "an indented block",
    "_DEDENT": "end of the block",
    "$END": "end of file",
}
# Lower sorts first when listing what was expected.
_RANK = {"closer": 0, ":": 1, "end of line": 2, ",": 3, "an expression": 4, "an operator": 5}

_COMPOUND = {"def", "if", "elif", "else", "for", "with"}
_COLON_AFTER = {
    "def": "the function signature",
    "if": "the condition",
    "elif": "the condition",
    "else": "'else'",
    "for": "the 'for' clause",
    "with": "the 'with' items",
}
_BLOCK_AFTER = {
    "def": "function definition",
    "if": "'if' statement",
    "elif": "'elif' clause",
    "else": "'else' clause",
    "for": "'for' loop",
    "with": "'with' statement",
}
_NEEDS_AFTER = {
    "->": "a return type",
    "def": "a function name",
    ".": "an attribute name",
    "@": "a decorator or policy name",
    "import": "a module name",
    "from": "a module name",
    "as": "a name",
}


def describe_syntax_error(
    exc: Exception, state: IndentState, source: SourceFile, literals: dict[str, str]
) -> Diagnostic:
    """Turn a parse failure into one diagnostic. ``literals`` maps terminal names
    to the fixed text they match (``COLON`` to ``:``)."""
    if isinstance(exc, LayoutError):
        notes = ()
        if exc.note:
            notes = (Note(exc.note[0], _token_span(source, exc.note[1])),)
        return _error(exc.message, _token_span(source, exc.token), notes)
    if isinstance(exc, UnexpectedCharacters):
        return _bad_character(exc, source)
    assert isinstance(exc, UnexpectedToken)
    return _ErrorContext(exc, state, source, literals).diagnose()


def _error(message: str, span: Span | None, notes: tuple[Note, ...] = ()) -> Diagnostic:
    return Diagnostic(Severity.ERROR, message, span, notes)


def _token_span(source: SourceFile, token: Token) -> Span:
    if token.type == "$END" or token.line is None:
        return source.end_span()
    end_line = token.end_line or token.line
    end_column = token.end_column or token.column + 1
    if token.type in ("_NEWLINE", "_INDENT", "_DEDENT"):
        end_line, end_column = token.line, token.column + 1
    return Span(source, token.line, token.column, end_line, end_column)


def _bad_character(exc: UnexpectedCharacters, source: SourceFile) -> Diagnostic:
    char = exc.char
    line_text = source.line_text(exc.line)
    start = exc.column
    span = Span(source, exc.line, start, exc.line, start + 1)
    if char in "\"'":
        triple = line_text[start - 1 : start + 2] == char * 3
        kind = "triple-quoted string literal" if triple else "string literal"
        end = Span(source, exc.line, start, exc.line, max(start + 1, len(line_text) + 1))
        note = () if triple else (Note("a string must end on the line where it starts"),)
        return _error(f"unterminated {kind}", end, note)
    if char == "\\":
        return _error("a '\\' outside a string must be the last character of its line", span)
    if not char.isprintable():
        return _error(f"unexpected control character U+{ord(char):04X}", span)
    if ord(char) > 127:
        return _error(
            f"unexpected character '{char}' (U+{ord(char):04X}); "
            "names and operators in .tsr files are ASCII",
            span,
        )
    return _error(f"unexpected character '{char}'", span)


class _ErrorContext:
    """An ``UnexpectedToken`` with what surrounds it."""

    def __init__(
        self, exc: UnexpectedToken, state: IndentState, source: SourceFile, literals: dict
    ) -> None:
        self.token: Token = exc.token
        self.state = state
        self.source = source
        self.literals = literals
        recent = [t for t in state.recent if t is not self.token]
        self.previous: Token | None = recent[-1] if recent else None
        parser = getattr(exc, "interactive_parser", None)
        stack = parser.parser_state.value_stack if parser is not None else []
        # Lark's own expected set is the LALR lookahead of a state that has not
        # reduced yet; trying each terminal gives only those really accepted.
        self.expected: set[str] = set(parser.accepts()) if parser is not None else set(exc.expected)
        self.keyword = self._innermost_statement_keyword(stack)

    # -- the specific situations, most specific first -------------------------

    def diagnose(self) -> Diagnostic:
        for check in (
            self._unsupported_keyword,
            self._unexpected_indent,
            self._missing_block,
            self._unclosed_bracket,
            self._missing_def,
            self._missing_colon,
            self._shift,
            self._missing_operand,
        ):
            found = check()
            if found is not None:
                return found
        return _error(
            f"expected {self._expected_words()} before {self._describe(self.token)}",
            self._token_span(self.token),
            self._bracket_note(),
        )

    def _unsupported_keyword(self) -> Diagnostic | None:
        for token in (self.previous, self.token):
            if token is not None and token.type == "NAME" and token.value in UNSUPPORTED_KEYWORDS:
                return _error(UNSUPPORTED_KEYWORDS[token.value], self._token_span(token))
        return None

    def _unexpected_indent(self) -> Diagnostic | None:
        if self.token.type != "_INDENT":
            return None
        return _error("unexpected indent", self._token_span(self.token))

    def _missing_block(self) -> Diagnostic | None:
        if "_INDENT" not in self.expected or self.token.type == "_INDENT":
            return None
        where = ""
        if self.keyword is not None:
            what = _BLOCK_AFTER[self.keyword.value]
            where = f" after {what} on line {self.keyword.line}"
        return _error(f"expected an indented block{where}", self._token_span(self.token))

    def _unclosed_bracket(self) -> Diagnostic | None:
        if not self.state.brackets:
            return None
        opener = self.state.brackets[-1]
        token = self.token
        # Newlines inside brackets are dropped, so a dedent means end of file.
        if token.type not in ("$END", "_DEDENT"):
            # A token that starts a line no further right than the line that
            # opened the bracket is a new statement: the bracket was never
            # closed. Further right, it is a continuation line (a missing comma).
            if token.line is None or token.line <= opener.line or not self._starts_line(token):
                return None
            opener_indent = _indent_width(self.source.line_text(opener.line))
            if token.column - 1 > opener_indent:
                return None
        return _error(f"'{opener.value}' was never closed", self._token_span(opener))

    def _missing_def(self) -> Diagnostic | None:
        if "DEF" not in self.expected or self.token.type == "DEF":
            return None
        return _error(
            "expected a function definition after the decorator", self._token_span(self.token)
        )

    def _missing_colon(self) -> Diagnostic | None:
        keyword = self.keyword
        if "COLON" not in self.expected or keyword is None or self.previous is None:
            return None
        if self.state.brackets and _after(self.state.brackets[-1], keyword):
            return None
        notes: tuple[Note, ...] = ()
        if self.token.value == "=" and keyword.value in ("if", "elif"):
            notes = (Note("to compare two values, use '=='", self._token_span(self.token)),)
        span = self._after_span(self.previous)
        return _error(f"expected ':' after {_COLON_AFTER[keyword.value]}", span, notes)

    def _shift(self) -> Diagnostic | None:
        """``a << b``: two comparison tokens side by side, which Python reads as a shift."""
        previous = self.previous
        if previous is None or self.token.value not in "<>" or previous.value != self.token.value:
            return None
        if (previous.end_line, previous.end_column) != (self.token.line, self.token.column):
            return None
        span = Span(self.source, previous.line, previous.column, self.token.line,
                    self.token.column + 1)  # fmt: skip
        return _error(
            f"the shift operator '{self.token.value * 2}' is not supported in Tessera", span
        )

    def _missing_operand(self) -> Diagnostic | None:
        previous = self.previous
        if previous is None or previous.type in ("NAME", "INT", "FLOAT", "STRING"):
            return None
        needs = _NEEDS_AFTER.get(previous.value)
        if needs is None and self.expected >= {"NAME", "INT", "LPAR"}:
            needs = "an expression"
        if needs is None:
            return None
        return _error(
            f"expected {needs} after '{previous.value}'",
            self._token_span(self.token),
        )

    # -- helpers ---------------------------------------------------------------

    def _innermost_statement_keyword(self, stack: list) -> Token | None:
        """The keyword of the compound statement being parsed, if any.

        Keywords of finished statements are reduced into trees, so a bare
        keyword token on the value stack belongs to a statement in progress;
        one that does not start its line is part of an expression
        (``a if b else c``) and is skipped.
        """
        for item in reversed(stack):
            if (
                isinstance(item, Token)
                and item.type != "NAME"
                and item.value in _COMPOUND
                and self._starts_line(item)
            ):
                return item
        return None

    def _starts_line(self, token: Token) -> bool:
        text = self.source.line_text(token.line)
        return not text[: token.column - 1].strip() or text[: token.column - 1].strip() == "@"

    def _token_span(self, token: Token) -> Span:
        return _token_span(self.source, token)

    def _after_span(self, token: Token) -> Span:
        line, column = token.end_line, token.end_column
        return Span(self.source, line, column, line, column + 1)

    def _bracket_note(self) -> tuple[Note, ...]:
        if not self.state.brackets:
            return ()
        opener = self.state.brackets[-1]
        if self.token.line is not None and self.token.line > opener.line:
            return (Note(f"'{opener.value}' opened here", self._token_span(opener)),)
        return ()

    def _describe(self, token: Token) -> str:
        kind = token.type
        if kind == "NAME":
            return f"name '{token.value}'"
        if kind in ("INT", "FLOAT"):
            return f"number {token.value}"
        if kind == "STRING":
            text = token.value if len(token.value) <= 20 else token.value[:17] + "..."
            return f"string {text}"
        if kind in _WORDS:
            return _WORDS[kind]
        return f"'{token.value}'"

    def _expected_words(self) -> str:
        expected = set(self.expected)
        words: set[str] = set()
        if expected >= {"NAME", "INT", "LPAR"}:
            words.add("an expression")
            expected -= _EXPR_START
        after_expr = {n for n in expected if self.literals.get(n) in _AFTER_EXPR_VALUES}
        if len(after_expr) >= 3:
            words.add("an operator")
            expected -= after_expr
        if "_NEWLINE" in expected:
            expected.discard("SEMICOLON")
        closers = {n for n in expected if n in CLOSERS}
        if self.state.brackets:
            wanted = OPENERS[self.state.brackets[-1].type]
            closers = {n for n in closers if self.literals.get(n) == wanted}
        expected -= {n for n in expected if n in CLOSERS}
        for name in closers | expected:
            if name in _WORDS:
                words.add(_WORDS[name])
            elif name in self.literals:
                words.add(f"'{self.literals[name]}'")

        def rank(word: str) -> tuple[int, str]:
            if word in ("')'", "']'", "'}'"):
                return (0, word)
            return (_RANK.get(word.strip("'"), _RANK.get(word, 6)), word)

        ordered = sorted(words, key=rank)[:3] or ["something else"]
        if len(ordered) == 1:
            return ordered[0]
        return ", ".join(ordered[:-1]) + " or " + ordered[-1]


def _after(a: Token, b: Token) -> bool:
    return (a.line, a.column) > (b.line, b.column)


def _indent_width(text: str) -> int:
    return len(text) - len(text.lstrip(" \t"))
