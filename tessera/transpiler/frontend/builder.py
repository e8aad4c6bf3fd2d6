"""Lark parse tree to AST, with the checks the grammar leaves to code.

Like CPython, the grammar accepts an expression where Python decides by the
left-hand side (assignment targets, keyword arguments); this builder checks
those and parameter lists, so the messages can name the construct
("cannot assign to a function call") instead of a token.
"""

from __future__ import annotations

import ast as pyast
import warnings
from typing import Any

from lark import Token, Transformer, Tree, v_args
from lark.tree import Meta

from . import ast
from .diagnostics import Diagnostics, Note
from .source import SourceFile, Span
from .syntax_errors import UNSUPPORTED_KEYWORDS

__all__ = ["build_module"]


def build_module(tree: Tree, source: SourceFile, diags: Diagnostics) -> ast.Module:
    return _Builder(source, diags).transform(tree)


class _Suite(tuple):
    """A block of statements (a marker, so funcdef can tell its children apart)."""


class _Params(tuple):
    pass


class _Decorators(tuple):
    pass


class _Items(tuple):
    """The index of a subscript or the arguments of a type."""


class _Args:
    def __init__(self, args: tuple, keywords: tuple) -> None:
        self.args = args
        self.keywords = keywords


class _StarMarker:
    def __init__(self, span: Span) -> None:
        self.span = span


class _Clause:
    """An ``elif`` or ``else`` clause, before it is folded into its ``If``."""

    def __init__(self, test: Any, body: _Suite, span: Span) -> None:
        self.test = test
        self.body = body
        self.span = span


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


@v_args(meta=True)
class _Builder(Transformer):
    """One method per grammar rule, called with the rule's position and children."""

    def __init__(self, source: SourceFile, diags: Diagnostics) -> None:
        super().__init__(visit_tokens=False)
        self.source = source
        self.diags = diags

    def _span(self, meta: Meta) -> Span:
        if getattr(meta, "empty", True):
            return self.source.end_span()
        return Span(self.source, meta.line, meta.column, meta.end_line, meta.end_column)

    def _tok(self, token: Token) -> Span:
        return Span(self.source, token.line, token.column, token.end_line, token.end_column)

    def _identifier(self, token: Token) -> str:
        if token.value in UNSUPPORTED_KEYWORDS:
            self.diags.error(UNSUPPORTED_KEYWORDS[token.value], self._tok(token))
        return str(token.value)

    # ---------------------------------------------------------------- module

    def start(self, meta: Meta, children: list) -> ast.Module:
        span = self._span(meta)
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

    def simple_stmt(self, meta: Meta, children: list) -> list:
        return list(children)

    def suite(self, meta: Meta, children: list) -> _Suite:
        return _Suite(self._flatten(children))

    # ------------------------------------------------------------ statements

    def expr_stmt(self, meta: Meta, children: list) -> ast.ExprStmt:
        span = self._span(meta)
        return ast.ExprStmt(children[0], span=span)

    def assign(self, meta: Meta, children: list) -> ast.Assign:
        span = self._span(meta)
        target, value = children
        self._check_target(target, "assign to")
        return ast.Assign(target, value, span=span)

    def aug_assign(self, meta: Meta, children: list) -> ast.AugAssign:
        span = self._span(meta)
        target, op, value = children
        if not isinstance(target, (ast.Name, ast.Attribute, ast.Subscript)):
            self.diags.error(f"cannot use '{op}' on {self._what(target)}", target.span)
        return ast.AugAssign(target, str(op)[:-1], value, span=span)

    def return_stmt(self, meta: Meta, children: list) -> ast.Return:
        span = self._span(meta)
        return ast.Return(children[0] if children else None, span=span)

    def pass_stmt(self, meta: Meta, children: list) -> ast.Pass:
        span = self._span(meta)
        return ast.Pass(span=span)

    def import_name(self, meta: Meta, children: list) -> ast.Import:
        span = self._span(meta)
        asname = str(children[1]) if len(children) > 1 else None
        return ast.Import(children[0], asname, span=span)

    def import_from(self, meta: Meta, children: list) -> ast.ImportFrom:
        span = self._span(meta)
        module, *names = children
        return ast.ImportFrom(module, tuple(names), span=span)

    def import_alias(self, meta: Meta, children: list) -> ast.Alias:
        span = self._span(meta)
        asname = str(children[1]) if len(children) > 1 else None
        return ast.Alias(str(children[0]), asname, span=span)

    def if_stmt(self, meta: Meta, children: list) -> ast.If:
        span = self._span(meta)
        test, body, *clauses = children
        orelse: tuple = ()
        for clause in reversed(clauses):
            if clause.test is None:
                orelse = tuple(clause.body)
            else:
                orelse = (ast.If(clause.test, tuple(clause.body), orelse, span=clause.span),)
        return ast.If(test, tuple(body), orelse, span=span)

    def elif_clause(self, meta: Meta, children: list) -> _Clause:
        span = self._span(meta)
        return _Clause(children[0], children[1], span)

    def else_clause(self, meta: Meta, children: list) -> _Clause:
        span = self._span(meta)
        return _Clause(None, children[0], span)

    def for_stmt(self, meta: Meta, children: list) -> ast.For:
        span = self._span(meta)
        target, iterable, body = children
        self._check_target(target, "assign to")
        return ast.For(target, iterable, tuple(body), span=span)

    def target_tuple(self, meta: Meta, children: list) -> ast.TupleExpr:
        span = self._span(meta)
        return ast.TupleExpr(tuple(children), span=span)

    def with_stmt(self, meta: Meta, children: list) -> ast.With:
        span = self._span(meta)
        *items, body = children
        return ast.With(tuple(items), tuple(body), span=span)

    def with_item(self, meta: Meta, children: list) -> ast.WithItem:
        span = self._span(meta)
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

    def funcdef(self, meta: Meta, children: list) -> ast.FunctionDef:
        span = self._span(meta)
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

    def decorators(self, meta: Meta, children: list) -> _Decorators:
        return _Decorators(c for c in children if isinstance(c, ast.Decorator))

    def decorator(self, meta: Meta, children: list) -> ast.Decorator:
        span = self._span(meta)
        if len(children) == 1:
            return ast.Decorator(children[0], span=span)
        call: _Args = children[1]
        return ast.Decorator(children[0], call.args, call.keywords, span=span)

    def parameters(self, meta: Meta, children: list) -> _Params:
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
        return _Params(params)

    def star_marker(self, meta: Meta, children: list) -> _StarMarker:
        span = self._span(meta)
        return _StarMarker(span)

    def param(self, meta: Meta, children: list) -> ast.Param:
        span = self._span(meta)
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

    def type_expr(self, meta: Meta, children: list) -> ast.TypeExpr:
        span = self._span(meta)
        name, *rest = children
        args = None
        policies = []
        for child in rest:
            if isinstance(child, _Items):
                args = tuple(child)
            else:
                policies.append(child)
        return ast.TypeExpr(name, args, tuple(policies), span=span)

    def type_args(self, meta: Meta, children: list) -> _Items:
        return _Items(children)

    def dim_string(self, meta: Meta, children: list) -> ast.StrLit:
        span = self._span(meta)
        return ast.StrLit(self._string_value(children[0]), span=span)

    def dim_int(self, meta: Meta, children: list) -> ast.IntLit:
        span = self._span(meta)
        return ast.IntLit(int(children[0].replace("_", "")), span=span)

    def policy(self, meta: Meta, children: list) -> ast.Policy:
        span = self._span(meta)
        if len(children) == 1:
            return ast.Policy(str(children[0]), span=span)
        call: _Args = children[1]
        return ast.Policy(str(children[0]), call.args, call.keywords, span=span)

    def dotted_name(self, meta: Meta, children: list) -> str:
        return ".".join(str(c) for c in children)

    # ----------------------------------------------------------- expressions

    def tuple(self, meta: Meta, children: list) -> ast.TupleExpr:
        span = self._span(meta)
        return ast.TupleExpr(tuple(children), span=span)

    def ternary(self, meta: Meta, children: list) -> ast.IfExp:
        span = self._span(meta)
        body, test, orelse = children
        return ast.IfExp(test, body, orelse, span=span)

    def or_test(self, meta: Meta, children: list) -> ast.BoolOp:
        span = self._span(meta)
        return ast.BoolOp("or", tuple(children), span=span)

    def and_test(self, meta: Meta, children: list) -> ast.BoolOp:
        span = self._span(meta)
        return ast.BoolOp("and", tuple(children), span=span)

    def not_(self, meta: Meta, children: list) -> ast.UnaryOp:
        span = self._span(meta)
        return ast.UnaryOp("not", children[0], span=span)

    def comparison(self, meta: Meta, children: list) -> ast.Compare:
        span = self._span(meta)
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

    def _fold(self, meta: Meta, children: list) -> Any:
        """Left-associative chain ``a + b - c``: each BinOp spans its own operands."""
        node = children[0]
        for i in range(1, len(children), 2):
            right = children[i + 1]
            node = ast.BinOp(str(children[i]), node, right, span=node.span.to(right.span))
        return node

    expr = _fold
    term = _fold

    def unary(self, meta: Meta, children: list) -> ast.UnaryOp:
        span = self._span(meta)
        return ast.UnaryOp(str(children[0]), children[1], span=span)

    def power(self, meta: Meta, children: list) -> ast.BinOp:
        span = self._span(meta)
        return ast.BinOp("**", children[0], children[1], span=span)

    def call(self, meta: Meta, children: list) -> ast.Call:
        span = self._span(meta)
        func, call = children
        return ast.Call(func, call.args, call.keywords, span=span)

    def call_args(self, meta: Meta, children: list) -> _Args:
        return children[0] if children else _Args((), ())

    def arguments(self, meta: Meta, children: list) -> _Args:
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
        return _Args(tuple(args), tuple(keywords.values()))

    def keyword(self, meta: Meta, children: list) -> ast.Keyword:
        span = self._span(meta)
        name, value = children
        if not isinstance(name, ast.Name):
            self.diags.error(
                "expected a parameter name before '='",
                name.span,
                (Note("to compare two values, use '=='"),),
            )
            return ast.Keyword("_", value, span=span)
        return ast.Keyword(name.id, value, span=span)

    def getitem(self, meta: Meta, children: list) -> ast.Subscript:
        span = self._span(meta)
        return ast.Subscript(children[0], tuple(children[1]), span=span)

    def subscripts(self, meta: Meta, children: list) -> _Items:
        return _Items(children)

    def slice(self, meta: Meta, children: list) -> ast.Slice:
        span = self._span(meta)
        parts: list = [None]
        for child in children:
            if isinstance(child, Token) and child.type == "COLON":
                parts.append(None)
            else:
                parts[-1] = child
        parts += [None] * (3 - len(parts))
        return ast.Slice(parts[0], parts[1], parts[2], span=span)

    def getattr(self, meta: Meta, children: list) -> ast.Attribute:
        span = self._span(meta)
        return ast.Attribute(children[0], str(children[1]), span=span)

    def name(self, meta: Meta, children: list) -> ast.Name:
        span = self._span(meta)
        return ast.Name(self._identifier(children[0]), span=span)

    def int_lit(self, meta: Meta, children: list) -> ast.IntLit:
        span = self._span(meta)
        return ast.IntLit(int(children[0].replace("_", "")), span=span)

    def float_lit(self, meta: Meta, children: list) -> ast.FloatLit:
        span = self._span(meta)
        return ast.FloatLit(float(children[0].replace("_", "")), span=span)

    def str_lit(self, meta: Meta, children: list) -> ast.StrLit:
        span = self._span(meta)
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

    def ellipsis_lit(self, meta: Meta, children: list) -> ast.EllipsisLit:
        span = self._span(meta)
        return ast.EllipsisLit(span=span)

    def none_lit(self, meta: Meta, children: list) -> ast.NoneLit:
        span = self._span(meta)
        return ast.NoneLit(span=span)

    def true_lit(self, meta: Meta, children: list) -> ast.BoolLit:
        span = self._span(meta)
        return ast.BoolLit(True, span=span)

    def false_lit(self, meta: Meta, children: list) -> ast.BoolLit:
        span = self._span(meta)
        return ast.BoolLit(False, span=span)

    def empty_tuple(self, meta: Meta, children: list) -> ast.TupleExpr:
        span = self._span(meta)
        return ast.TupleExpr((), span=span)

    def list_lit(self, meta: Meta, children: list) -> ast.ListExpr:
        span = self._span(meta)
        return ast.ListExpr(tuple(children), span=span)

    def dict_lit(self, meta: Meta, children: list) -> ast.DictExpr:
        span = self._span(meta)
        keys = tuple(k for k, _ in children)
        values = tuple(v for _, v in children)
        return ast.DictExpr(keys, values, span=span)

    def dict_item(self, meta: Meta, children: list) -> tuple:
        return (children[0], children[1])
