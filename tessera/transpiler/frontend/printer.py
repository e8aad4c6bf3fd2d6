"""Print an AST as canonical ``.tsr`` source (``--emit ast``).

Canonical means: 4-space indentation, one statement per line, black-like
spacing, double-quoted strings, two blank lines around top-level functions,
and parentheses only where precedence needs them. Comments are not part of
the AST and do not survive. Parsing the output gives back an equal AST, and
printing that AST gives the same text again; the tests hold both.
"""

from __future__ import annotations

import re
from functools import singledispatchmethod

from . import ast

__all__ = ["print_module", "print_expr", "format_float"]

#: A function signature longer than this is split one parameter per line.
LINE_LENGTH = 100
INDENT = "    "

# Binding strength, as in Python's grammar (higher binds tighter).
(_TUPLE, _TERNARY, _OR, _AND, _NOT, _COMPARE, _BIT_OR, _BIT_XOR, _BIT_AND, _ARITH, _TERM, _UNARY,
 _POWER, _PRIMARY) = range(14)  # fmt: skip
_BINARY = {"+": _ARITH, "-": _ARITH, "*": _TERM, "/": _TERM, "//": _TERM, "%": _TERM, "@": _TERM,
           "|": _BIT_OR, "^": _BIT_XOR, "&": _BIT_AND}  # fmt: skip


def print_module(module: ast.Module) -> str:
    return _Printer().module(module)


def _string(value: str) -> str:
    out = []
    for char in value:
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif not char.isprintable():
            code = ord(char)
            out.append(
                f"\\x{code:02x}"
                if code < 0x100
                else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
            )
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def format_float(value: float) -> str:
    """Shortest round-trip form, exponent written as people do: 1e-5, 1e16."""
    return re.sub(r"e\+?(-?)0*(\d)", r"e\1\2", repr(value))


def print_expr(node: ast.Expr) -> str:
    """One expression in canonical form, as diagnostics quote the user's arguments."""
    return _Printer().expr(node)


class _Printer:
    # ---------------------------------------------------------------- module

    def module(self, module: ast.Module) -> str:
        chunks: list[str] = []
        previous: ast.Stmt | None = None
        for stmt in module.body:
            if previous is not None:
                functions = isinstance(stmt, ast.FunctionDef) or isinstance(
                    previous, ast.FunctionDef
                )
                chunks.append("\n\n" if functions else "")
            chunks.append("".join(self.stmt(stmt, 0)))
            previous = stmt
        return "".join(chunks)

    def block(self, body: tuple[ast.Stmt, ...], level: int) -> list[str]:
        lines: list[str] = []
        for stmt in body:
            lines += self.stmt(stmt, level)
        return lines

    # ------------------------------------------------------------ statements

    @singledispatchmethod
    def stmt(self, node: ast.Stmt, level: int) -> list[str]:
        raise TypeError(f"no printer for statement {type(node).__name__}")

    def _line(self, level: int, text: str) -> list[str]:
        return [INDENT * level + text + "\n"]

    @stmt.register
    def _(self, node: ast.ExprStmt, level: int) -> list[str]:
        return self._line(level, self.expr(node.value, _TUPLE))

    @stmt.register
    def _(self, node: ast.Assign, level: int) -> list[str]:
        return self._line(
            level, f"{self.expr(node.target, _TUPLE)} = {self.expr(node.value, _TUPLE)}"
        )

    @stmt.register
    def _(self, node: ast.AugAssign, level: int) -> list[str]:
        return self._line(
            level, f"{self.expr(node.target)} {node.op}= {self.expr(node.value, _TUPLE)}"
        )

    @stmt.register
    def _(self, node: ast.Return, level: int) -> list[str]:
        if node.value is None:
            return self._line(level, "return")
        return self._line(level, "return " + self.expr(node.value, _TUPLE))

    @stmt.register
    def _(self, node: ast.Pass, level: int) -> list[str]:
        return self._line(level, "pass")

    @stmt.register
    def _(self, node: ast.Import, level: int) -> list[str]:
        alias = f" as {node.asname}" if node.asname else ""
        return self._line(level, f"import {node.module}{alias}")

    @stmt.register
    def _(self, node: ast.ImportFrom, level: int) -> list[str]:
        names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
        return self._line(level, f"from {node.module} import {names}")

    @stmt.register
    def _(self, node: ast.If, level: int, keyword: str = "if") -> list[str]:
        lines = self._line(level, f"{keyword} {self.expr(node.test)}:")
        lines += self.block(node.body, level + 1)
        orelse = node.orelse
        if len(orelse) == 1 and isinstance(orelse[0], ast.If):
            return lines + self.stmt(orelse[0], level, "elif")
        if orelse:
            lines += self._line(level, "else:") + self.block(orelse, level + 1)
        return lines

    @stmt.register
    def _(self, node: ast.For, level: int) -> list[str]:
        target = self.expr(node.target, _TUPLE)
        header = f"for {target} in {self.expr(node.iter, _TUPLE)}:"
        return self._line(level, header) + self.block(node.body, level + 1)

    @stmt.register
    def _(self, node: ast.With, level: int) -> list[str]:
        items = ", ".join(
            self.expr(i.context) + (f" as {self.expr(i.target)}" if i.target is not None else "")
            for i in node.items
        )
        return self._line(level, f"with {items}:") + self.block(node.body, level + 1)

    @stmt.register
    def _(self, node: ast.FunctionDef, level: int) -> list[str]:
        lines: list[str] = []
        for decorator in node.decorators:
            lines += self.decorator(decorator, level)
        params = self.params(node.params)
        returns = f" -> {self.type(node.returns)}" if node.returns is not None else ""
        header = f"def {node.name}({', '.join(params)}){returns}:"
        if len(INDENT * level + header) <= LINE_LENGTH or not params:
            lines += self._line(level, header)
        else:
            lines += self._line(level, f"def {node.name}(")
            for param in params:
                lines += self._line(level + 1, param + ",")
            lines += self._line(level, f"){returns}:")
        return lines + self.block(node.body, level + 1)

    def params(self, params: tuple[ast.Param, ...]) -> list[str]:
        out: list[str] = []
        star = False
        for param in params:
            if param.keyword_only and not star:
                out.append("*")
                star = True
            text = param.name
            if param.annotation is not None:
                text += ": " + self.type(param.annotation)
            if param.default is not None:
                sep = " = " if param.annotation is not None else "="
                text += sep + self.expr(param.default)
            out.append(text)
        return out

    def decorator(self, node: ast.Decorator, level: int) -> list[str]:
        if node.args is None and not node.keywords:
            return self._line(level, "@" + node.name)
        args = node.args or ()
        text = "@" + node.name + self.call_args(args, node.keywords)
        if len(INDENT * level + text) <= LINE_LENGTH:
            return self._line(level, text)
        lines = self._line(level, f"@{node.name}(")
        for part in self.arg_list(args, node.keywords):
            lines += self._line(level + 1, part + ",")
        return lines + self._line(level, ")")

    # ----------------------------------------------------------------- types

    def type(self, node: ast.TypeExpr) -> str:
        text = node.name
        if node.args is not None:
            args = (
                self.type(a) if isinstance(a, ast.TypeExpr) else self.expr(a) for a in node.args
            )
            text += "[" + ", ".join(args) + "]"
        for policy in node.policies:
            text += " @" + policy.name
            if policy.args or policy.keywords:
                text += self.call_args(policy.args, policy.keywords)
        return text

    # ----------------------------------------------------------- expressions

    def arg_list(self, args: tuple[ast.Expr, ...], keywords: tuple[ast.Keyword, ...]) -> list[str]:
        return [self.expr(a) for a in args] + [f"{k.name}={self.expr(k.value)}" for k in keywords]

    def call_args(self, args: tuple[ast.Expr, ...], keywords: tuple[ast.Keyword, ...]) -> str:
        return "(" + ", ".join(self.arg_list(args, keywords)) + ")"

    def expr(self, node: ast.Expr, context: int = _TERNARY) -> str:
        """Print ``node`` where an expression of strength ``context`` is expected."""
        text, strength = self._expr(node)
        return f"({text})" if strength < context else text

    @singledispatchmethod
    def _expr(self, node: ast.Expr) -> tuple[str, int]:
        raise TypeError(f"no printer for expression {type(node).__name__}")

    @_expr.register
    def _(self, node: ast.Name) -> tuple[str, int]:
        return node.id, _PRIMARY

    @_expr.register
    def _(self, node: ast.IntLit) -> tuple[str, int]:
        return str(node.value), _PRIMARY

    @_expr.register
    def _(self, node: ast.FloatLit) -> tuple[str, int]:
        return format_float(node.value), _PRIMARY

    @_expr.register
    def _(self, node: ast.StrLit) -> tuple[str, int]:
        return _string(node.value), _PRIMARY

    @_expr.register
    def _(self, node: ast.BoolLit) -> tuple[str, int]:
        return ("True" if node.value else "False"), _PRIMARY

    @_expr.register
    def _(self, node: ast.NoneLit) -> tuple[str, int]:
        return "None", _PRIMARY

    @_expr.register
    def _(self, node: ast.EllipsisLit) -> tuple[str, int]:
        return "...", _PRIMARY

    @_expr.register
    def _(self, node: ast.TupleExpr) -> tuple[str, int]:
        if len(node.elts) == 1:
            return f"({self.expr(node.elts[0])},)", _PRIMARY
        if not node.elts:
            return "()", _PRIMARY
        return ", ".join(self.expr(e) for e in node.elts), _TUPLE

    @_expr.register
    def _(self, node: ast.ListExpr) -> tuple[str, int]:
        return "[" + ", ".join(self.expr(e) for e in node.elts) + "]", _PRIMARY

    @_expr.register
    def _(self, node: ast.DictExpr) -> tuple[str, int]:
        items = (
            f"{self.expr(k)}: {self.expr(v)}" for k, v in zip(node.keys, node.values, strict=True)
        )
        return "{" + ", ".join(items) + "}", _PRIMARY

    @_expr.register
    def _(self, node: ast.UnaryOp) -> tuple[str, int]:
        if node.op == "not":
            return "not " + self.expr(node.operand, _NOT), _NOT
        return node.op + self.expr(node.operand, _UNARY), _UNARY

    @_expr.register
    def _(self, node: ast.BinOp) -> tuple[str, int]:
        if node.op == "**":
            # Right-associative, and its right operand may be unary: -x ** -y.
            return f"{self.expr(node.left, _PRIMARY)} ** {self.expr(node.right, _UNARY)}", _POWER
        strength = _BINARY[node.op]
        left = self.expr(node.left, strength)
        right = self.expr(node.right, strength + 1)
        return f"{left} {node.op} {right}", strength

    @_expr.register
    def _(self, node: ast.BoolOp) -> tuple[str, int]:
        strength = _AND if node.op == "and" else _OR
        return f" {node.op} ".join(self.expr(v, strength + 1) for v in node.values), strength

    @_expr.register
    def _(self, node: ast.Compare) -> tuple[str, int]:
        parts = [self.expr(node.left, _BIT_OR)]
        for op, right in zip(node.ops, node.comparators, strict=True):
            parts += [op, self.expr(right, _BIT_OR)]
        return " ".join(parts), _COMPARE

    @_expr.register
    def _(self, node: ast.IfExp) -> tuple[str, int]:
        body = self.expr(node.body, _OR)
        test = self.expr(node.test, _OR)
        return f"{body} if {test} else {self.expr(node.orelse, _TERNARY)}", _TERNARY

    @_expr.register
    def _(self, node: ast.Call) -> tuple[str, int]:
        return self.expr(node.func, _PRIMARY) + self.call_args(node.args, node.keywords), _PRIMARY

    @_expr.register
    def _(self, node: ast.Attribute) -> tuple[str, int]:
        value = self.expr(node.value, _PRIMARY)
        if isinstance(node.value, ast.IntLit):
            value = f"({value})"  # 1.real would lex as a float
        return f"{value}.{node.attr}", _PRIMARY

    @_expr.register
    def _(self, node: ast.Subscript) -> tuple[str, int]:
        items = ", ".join(self.subscript_item(i) for i in node.index)
        if len(node.index) == 1 and isinstance(node.index[0], ast.TupleExpr):
            items = self.expr(node.index[0], _PRIMARY)
        return f"{self.expr(node.value, _PRIMARY)}[{items}]", _PRIMARY

    def subscript_item(self, item: ast.Expr | ast.Slice) -> str:
        if not isinstance(item, ast.Slice):
            return self.expr(item)
        parts = ["" if p is None else self.expr(p) for p in (item.lower, item.upper)]
        text = ":".join(parts)
        if item.step is not None:
            text += ":" + self.expr(item.step)
        return text
