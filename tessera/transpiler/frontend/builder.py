"""Parse to AST in one pass, with the checks the grammar leaves to code.

The builder is Lark's internal transformer: each grammar rule's method runs
as the LALR parser reduces it, so no parse tree is built and walked later.
Lark keeps every token (``keep_all_tokens``) and the builder takes a node's
span from its first and last child, which is what lets spans include
keywords and brackets without Lark's slower position propagation.

Like CPython, the grammar accepts an expression where Python decides by the
left-hand side (assignment targets, keyword arguments); this builder checks
those and parameter lists, so the messages can name the construct ("cannot
assign to a function call") instead of a token.
"""

from __future__ import annotations

import ast as pyast
import warnings
from collections.abc import Callable
from typing import Any

from . import ast
from .diagnostics import Diagnostics, Note
from .indenter import LAYOUT_TYPES
from .lark_runtime import Token, Tree
from .source import SourceFile, Span
from .syntax_errors import UNSUPPORTED_KEYWORDS

__all__ = ["Builder"]

#: Rules whose methods need their operator tokens (``+``, ``not in``, ``:``).
_KEEP_OPERATORS = frozenset({"aug_assign", "comparison", "expr", "term", "unary", "slice"})


class _Suite(tuple):
    """A block of statements (a marker, so funcdef can tell its children apart)."""

    span: Span


class _Params(tuple):
    span: Span


class _Decorators(tuple):
    span: Span


class _Items(tuple):
    """The index of a subscript or the arguments of a type."""

    span: Span


class _Dotted(str):
    """A dotted name such as ``kernel.autotune``."""

    span: Span


class _Args:
    def __init__(self, args: tuple, keywords: tuple, span: Span) -> None:
        self.args = args
        self.keywords = keywords
        self.span = span


class _StarMarker:
    def __init__(self, span: Span) -> None:
        self.span = span


class _Clause:
    """An ``elif`` or ``else`` clause, before it is folded into its ``If``."""

    def __init__(self, test: Any, body: _Suite, span: Span) -> None:
        self.test = test
        self.body = body
        self.span = span


class _LarkCallbacks:
    """Looked up by Lark once per grammar rule when the parser is built."""

    def __init__(self, builder: Builder) -> None:
        self._builder = builder

    def __getattr__(self, name: str) -> Callable[[list], Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._builder.wrap(name)

    def __default__(self, data: str, children: list, meta: object) -> Tree:
        # Rules named '_...' (Lark's helpers for repetitions included) are
        # spliced into their parent, which needs them as trees.
        if data.startswith("_"):
            return Tree(data, children)
        raise AssertionError(f"the AST builder has no method for grammar rule '{data}'")


def _marked(cls: type, items: Any, span: Span) -> Any:
    marker = cls(items)
    marker.span = span
    return marker


_TARGET_WORDS: dict[type, str] = {
    ast.Call: "a function call",
    ast.IntLit: "a literal",
    ast.FloatLit: "a literal",
    ast.StrLit: "a literal",
    ast.BoolLit: "a literal",
    ast.NoneLit: "None",
    ast.EllipsisLit: "'...'",
    ast.BinOp: "an expression",
    ast.UnaryOp: "an expression",
    ast.BoolOp: "an expression",
    ast.Compare: "a comparison",
    ast.IfExp: "a conditional expression",
    ast.DictExpr: "a dict literal",
}


def _start(item: Any) -> tuple[int, int]:
    if isinstance(item, Token):
        return item.line, item.column
    if isinstance(item, list):
        return _start(item[0])
    return item.span.line, item.span.column


def _end(item: Any) -> tuple[int, int]:
    if isinstance(item, Token):
        return item.end_line, item.end_column
    if isinstance(item, list):
        return _end(item[-1])
    return item.span.end_line, item.span.end_column


class Builder:
    """One method per grammar rule, called with the rule's children and span.

    ``begin()`` points the builder at the file being parsed and a fresh
    diagnostics list; ``lark_callbacks()`` is what Lark calls on each
    reduction. ``punctuation`` names the keyword and punctuation terminals,
    which methods do not see unless they ask for operators.
    """

    def __init__(self) -> None:
        self.punctuation: frozenset[str] = frozenset()
        self.source = SourceFile("<none>", "")
        self.diags = Diagnostics()

    def begin(self, source: SourceFile, diags: Diagnostics) -> None:
        self.source = source
        self.diags = diags

    def lark_callbacks(self) -> object:
        return _LarkCallbacks(self)

    def wrap(self, name: str) -> Callable[[list], Any]:
        """The Lark callback for rule ``name``: filter the children, compute the span."""
        method = getattr(self, name)
        keep_operators = name in _KEEP_OPERATORS

        def callback(children: list) -> Any:
            real = [c for c in children if not (type(c) is Token and c.type in LAYOUT_TYPES)]
            if real:
                (line, column), (end_line, end_column) = _start(real[0]), _end(real[-1])
                span = Span(self.source, line, column, end_line, end_column)
            else:
                span = self.source.end_span()
            if not keep_operators:
                real = [c for c in real if not (type(c) is Token and c.type in self.punctuation)]
            return method(real, span)

        return callback

    def _tok(self, token: Token) -> Span:
        return Span(self.source, token.line, token.column, token.end_line, token.end_column)

    def _identifier(self, token: Token) -> str:
        if token.value in UNSUPPORTED_KEYWORDS:
            self.diags.error(UNSUPPORTED_KEYWORDS[token.value], self._tok(token))
        return str(token.value)

    # ---------------------------------------------------------------- module

    def start(self, children: list, span: Span) -> ast.Module:
        return ast.Module(self._flatten(children), span=span)

    @staticmethod
    def _flatten(children: list) -> tuple:
        out: list = []
        for child in children:
            if isinstance(child, list):
                out.extend(child)
            elif not isinstance(child, Token):
                out.append(child)
        return tuple(out)

    def simple_stmt(self, children: list, span: Span) -> list:
        return list(children)

    def suite(self, children: list, span: Span) -> _Suite:
        return _marked(_Suite, self._flatten(children), span)

    # ------------------------------------------------------------ statements

    def expr_stmt(self, children: list, span: Span) -> ast.ExprStmt:
        return ast.ExprStmt(children[0], span=span)

    def assign(self, children: list, span: Span) -> ast.Assign:
        target, value = children
        self._check_target(target, "assign to")
        return ast.Assign(target, value, span=span)

    def aug_assign(self, children: list, span: Span) -> ast.AugAssign:
        target, op, value = children
        if not isinstance(target, (ast.Name, ast.Attribute, ast.Subscript)):
            self.diags.error(f"cannot use '{op}' on {self._what(target)}", target.span)
        return ast.AugAssign(target, str(op)[:-1], value, span=span)

    def return_stmt(self, children: list, span: Span) -> ast.Return:
        return ast.Return(children[0] if children else None, span=span)

    def pass_stmt(self, children: list, span: Span) -> ast.Pass:
        return ast.Pass(span=span)

    def import_name(self, children: list, span: Span) -> ast.Import:
        asname = str(children[1]) if len(children) > 1 else None
        return ast.Import(str(children[0]), asname, span=span)

    def import_from(self, children: list, span: Span) -> ast.ImportFrom:
        module, *names = children
        return ast.ImportFrom(str(module), tuple(names), span=span)

    def import_alias(self, children: list, span: Span) -> ast.Alias:
        asname = str(children[1]) if len(children) > 1 else None
        return ast.Alias(str(children[0]), asname, span=span)

    def if_stmt(self, children: list, span: Span) -> ast.If:
        test, body, *clauses = children
        orelse: tuple = ()
        for clause in reversed(clauses):
            if clause.test is None:
                orelse = tuple(clause.body)
            else:
                orelse = (ast.If(clause.test, tuple(clause.body), orelse, span=clause.span),)
        return ast.If(test, tuple(body), orelse, span=span)

    def elif_clause(self, children: list, span: Span) -> _Clause:
        return _Clause(children[0], children[1], span)

    def else_clause(self, children: list, span: Span) -> _Clause:
        return _Clause(None, children[0], span)

    def for_stmt(self, children: list, span: Span) -> ast.For:
        target, iterable, body = children
        self._check_target(target, "assign to")
        return ast.For(target, iterable, tuple(body), span=span)

    def target_tuple(self, children: list, span: Span) -> ast.TupleExpr:
        return ast.TupleExpr(tuple(children), span=span)

    def with_stmt(self, children: list, span: Span) -> ast.With:
        *items, body = children
        return ast.With(tuple(items), tuple(body), span=span)

    def with_item(self, children: list, span: Span) -> ast.WithItem:
        target = children[1] if len(children) > 1 else None
        if target is not None:
            self._check_target(target, "bind")
        return ast.WithItem(children[0], target, span=span)

    def _check_target(self, target: Any, verb: str) -> None:
        if isinstance(target, (ast.TupleExpr, ast.ListExpr)):
            for element in target.elts:
                self._check_target(element, verb)
        elif not isinstance(target, (ast.Name, ast.Attribute, ast.Subscript)):
            self.diags.error(f"cannot {verb} {self._what(target)}", target.span)

    @staticmethod
    def _what(node: Any) -> str:
        if isinstance(node, (ast.TupleExpr, ast.ListExpr)):
            return "a tuple"
        return _TARGET_WORDS.get(type(node), "this expression")

    # ------------------------------------------------------------- functions

    def funcdef(self, children: list, span: Span) -> ast.FunctionDef:
        decorators: tuple = ()
        params: tuple = ()
        returns = None
        name_token = None
        body: tuple = ()
        for child in children:
            if isinstance(child, _Decorators):
                decorators = tuple(child)
            elif isinstance(child, Token):
                name_token = child
            elif isinstance(child, _Params):
                params = tuple(child)
            elif isinstance(child, ast.TypeExpr):
                returns = child
            elif isinstance(child, _Suite):
                body = tuple(child)
        assert name_token is not None
        name = self._identifier(name_token)
        return ast.FunctionDef(name, params, returns, decorators, body, span=span)

    def decorators(self, children: list, span: Span) -> _Decorators:
        return _marked(_Decorators, [c for c in children if isinstance(c, ast.Decorator)], span)

    def decorator(self, children: list, span: Span) -> ast.Decorator:
        if len(children) == 1:
            return ast.Decorator(str(children[0]), span=span)
        call: _Args = children[1]
        return ast.Decorator(str(children[0]), call.args, call.keywords, span=span)

    def parameters(self, children: list, span: Span) -> _Params:
        params: list[ast.Param] = []
        seen: dict[str, ast.Param] = {}
        star: _StarMarker | None = None
        default_seen = False
        for item in children:
            if isinstance(item, _StarMarker):
                if star is not None:
                    self.diags.error("only one '*' is allowed in a parameter list", item.span)
                star = item
                continue
            keyword_only = star is not None
            if item.name in seen:
                self.diags.error(
                    f"duplicate parameter '{item.name}'",
                    item.span,
                    (Note(f"'{item.name}' first declared here", seen[item.name].span),),
                )
            seen[item.name] = item
            if not keyword_only:
                if item.default is not None:
                    default_seen = True
                elif default_seen:
                    self.diags.error(
                        f"parameter '{item.name}' without a default follows a parameter "
                        "with a default",
                        item.span,
                    )
            params.append(
                ast.Param(item.name, item.annotation, item.default, keyword_only, span=item.span)
            )
        if star is not None and (not params or not params[-1].keyword_only):
            self.diags.error("a bare '*' must be followed by keyword-only parameters", star.span)
        return _marked(_Params, params, span)

    def star_marker(self, children: list, span: Span) -> _StarMarker:
        return _StarMarker(span)

    def param(self, children: list, span: Span) -> ast.Param:
        name = self._identifier(children[0])
        annotation = None
        default = None
        for child in children[1:]:
            if isinstance(child, ast.TypeExpr):
                annotation = child
            else:
                default = child
        return ast.Param(name, annotation, default, False, span=span)

    # ----------------------------------------------------------------- types

    def type_expr(self, children: list, span: Span) -> ast.TypeExpr:
        name, *rest = children
        args = None
        policies = []
        for child in rest:
            if isinstance(child, _Items):
                args = tuple(child)
            else:
                policies.append(child)
        return ast.TypeExpr(str(name), args, tuple(policies), span=span)

    def result_tuple(self, children: list, span: Span) -> ast.TypeExpr:
        """``-> (A, B)``: the same type as ``-> tuple[A, B]``, which the printer writes."""
        return ast.TypeExpr("tuple", tuple(children), span=span)

    def type_args(self, children: list, span: Span) -> _Items:
        return _marked(_Items, children, span)

    def dim_string(self, children: list, span: Span) -> ast.StrLit:
        return ast.StrLit(self._string_value(children[0]), span=span)

    def dim_int(self, children: list, span: Span) -> ast.IntLit:
        return self.int_lit(children, span)

    def policy(self, children: list, span: Span) -> ast.Policy:
        if len(children) == 1:
            return ast.Policy(str(children[0]), span=span)
        call: _Args = children[1]
        return ast.Policy(str(children[0]), call.args, call.keywords, span=span)

    def dotted_name(self, children: list, span: Span) -> _Dotted:
        return _marked(_Dotted, ".".join(str(c) for c in children), span)

    # ----------------------------------------------------------- expressions

    def atom(self, children: list, span: Span) -> Any:
        """A parenthesised expression: the parentheses only group."""
        return children[0]

    def tuple(self, children: list, span: Span) -> ast.TupleExpr:
        return ast.TupleExpr(tuple(children), span=span)

    def ternary(self, children: list, span: Span) -> ast.IfExp:
        body, test, orelse = children
        return ast.IfExp(test, body, orelse, span=span)

    def or_test(self, children: list, span: Span) -> ast.BoolOp:
        return ast.BoolOp("or", tuple(children), span=span)

    def and_test(self, children: list, span: Span) -> ast.BoolOp:
        return ast.BoolOp("and", tuple(children), span=span)

    def not_(self, children: list, span: Span) -> ast.UnaryOp:
        return ast.UnaryOp("not", children[0], span=span)

    def comparison(self, children: list, span: Span) -> ast.Compare:
        left = children[0]
        ops: list[str] = []
        comparators: list = []
        pending: list[str] = []
        for child in children[1:]:
            if isinstance(child, Token):
                pending.append(str(child))
            else:
                ops.append(" ".join(pending))
                pending = []
                comparators.append(child)
        return ast.Compare(left, tuple(ops), tuple(comparators), span=span)

    def _fold(self, children: list, span: Span) -> Any:
        """Left-associative chain ``a + b - c``: each BinOp spans its own operands."""
        node = children[0]
        for i in range(1, len(children), 2):
            right = children[i + 1]
            node = ast.BinOp(str(children[i]), node, right, span=node.span.to(right.span))
        return node

    expr = _fold
    term = _fold

    def _chain(self, op: str, children: list) -> Any:
        """A chain whose operator token the grammar drops: ``a | b | c``."""
        node = children[0]
        for right in children[1:]:
            node = ast.BinOp(op, node, right, span=node.span.to(right.span))
        return node

    def bit_or(self, children: list, span: Span) -> Any:
        return self._chain("|", children)

    def bit_xor(self, children: list, span: Span) -> Any:
        return self._chain("^", children)

    def bit_and(self, children: list, span: Span) -> Any:
        return self._chain("&", children)

    def unary(self, children: list, span: Span) -> ast.UnaryOp:
        return ast.UnaryOp(str(children[0]), children[1], span=span)

    def power(self, children: list, span: Span) -> ast.BinOp:
        return ast.BinOp("**", children[0], children[1], span=span)

    def call(self, children: list, span: Span) -> ast.Call:
        func, call = children
        return ast.Call(func, call.args, call.keywords, span=span)

    def call_args(self, children: list, span: Span) -> _Args:
        if not children:
            return _Args((), (), span)
        return _Args(children[0].args, children[0].keywords, span)

    def arguments(self, children: list, span: Span) -> _Args:
        args: list = []
        keywords: dict[str, ast.Keyword] = {}
        for child in children:
            if isinstance(child, ast.Keyword):
                if child.name in keywords:
                    self.diags.error(
                        f"keyword argument '{child.name}' repeated",
                        child.span,
                        (Note("first given here", keywords[child.name].span),),
                    )
                keywords[child.name] = child
            elif keywords:
                self.diags.error("positional argument follows keyword argument", child.span)
            else:
                args.append(child)
        return _Args(tuple(args), tuple(keywords.values()), span)

    def keyword(self, children: list, span: Span) -> ast.Keyword:
        name, value = children
        if not isinstance(name, ast.Name):
            self.diags.error(
                "expected a parameter name before '='",
                name.span,
                (Note("to compare two values, use '=='"),),
            )
            return ast.Keyword("_", value, span=span)
        return ast.Keyword(name.id, value, span=span)

    def getitem(self, children: list, span: Span) -> ast.Subscript:
        return ast.Subscript(children[0], tuple(children[1]), span=span)

    def subscripts(self, children: list, span: Span) -> _Items:
        return _marked(_Items, children, span)

    def slice(self, children: list, span: Span) -> ast.Slice:
        parts: list = [None]
        for child in children:
            if isinstance(child, Token) and child.type == "COLON":
                parts.append(None)
            else:
                parts[-1] = child
        parts += [None] * (3 - len(parts))
        return ast.Slice(parts[0], parts[1], parts[2], span=span)

    def getattr(self, children: list, span: Span) -> ast.Attribute:
        return ast.Attribute(children[0], str(children[1]), span=span)

    def name(self, children: list, span: Span) -> ast.Name:
        return ast.Name(self._identifier(children[0]), span=span)

    def int_lit(self, children: list, span: Span) -> ast.IntLit:
        value = int(children[0].replace("_", ""))
        if value > ast.INT64_MAX:
            self.diags.error(
                f"the integer {value} does not fit in 64 bits (the largest is {ast.INT64_MAX})",
                span,
            )
        return ast.IntLit(value, span=span)

    def float_lit(self, children: list, span: Span) -> ast.FloatLit:
        return ast.FloatLit(float(children[0].replace("_", "")), span=span)

    def str_lit(self, children: list, span: Span) -> ast.StrLit:
        return ast.StrLit("".join(self._string_value(t) for t in children), span=span)

    def _string_value(self, token: Token) -> str:
        """Decode a literal with Python's escape rules; bad escapes are errors here."""
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                return pyast.literal_eval(str(token))
            except (SyntaxError, ValueError, Warning) as exc:
                reason = getattr(exc, "msg", None) or str(exc)
                self.diags.error(f"invalid string literal: {reason}", self._tok(token))
                return ""

    def ellipsis_lit(self, children: list, span: Span) -> ast.EllipsisLit:
        return ast.EllipsisLit(span=span)

    def none_lit(self, children: list, span: Span) -> ast.NoneLit:
        return ast.NoneLit(span=span)

    def true_lit(self, children: list, span: Span) -> ast.BoolLit:
        return ast.BoolLit(True, span=span)

    def false_lit(self, children: list, span: Span) -> ast.BoolLit:
        return ast.BoolLit(False, span=span)

    def empty_tuple(self, children: list, span: Span) -> ast.TupleExpr:
        return ast.TupleExpr((), span=span)

    def list_lit(self, children: list, span: Span) -> ast.ListExpr:
        return ast.ListExpr(tuple(children), span=span)

    def dict_lit(self, children: list, span: Span) -> ast.DictExpr:
        keys = tuple(k for k, _ in children)
        values = tuple(v for _, v in children)
        return ast.DictExpr(keys, values, span=span)

    def dict_item(self, children: list, span: Span) -> tuple:
        return (children[0], children[1])
