"""The abstract syntax tree of a ``.tsr`` file.

Nodes are frozen dataclasses; passes build new trees with
``dataclasses.replace``. Every node carries its source span, which is left out
of equality so that a tree parsed from the canonical printout of another tree
compares equal to it (the round-trip property the tests rely on).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import field, fields

from ...frozen import frozen
from .source import Span


@frozen
class Node:
    span: Span = field(kw_only=True, compare=False, repr=False)


# ------------------------------------------------------------------ expressions


@frozen
class Name(Node):
    id: str


#: The largest integer of a program: every integer is a 64-bit signed one in the
#: generated code (sizes, ``int`` scalars, literals), and a larger one would not compile
#: or would wrap.
INT64_MAX = 2**63 - 1


@frozen
class IntLit(Node):
    #: From 0 to ``INT64_MAX``; a minus sign is an operator.
    value: int


@frozen
class FloatLit(Node):
    value: float


@frozen
class StrLit(Node):
    value: str


@frozen
class BoolLit(Node):
    value: bool


@frozen
class NoneLit(Node):
    pass


@frozen
class EllipsisLit(Node):
    pass


@frozen
class TupleExpr(Node):
    elts: tuple[Expr, ...]


@frozen
class ListExpr(Node):
    elts: tuple[Expr, ...]


@frozen
class DictExpr(Node):
    keys: tuple[Expr, ...]
    values: tuple[Expr, ...]


@frozen
class UnaryOp(Node):
    """``-x``, ``+x``, ``~x`` or ``not x``."""

    op: str
    operand: Expr


@frozen
class BinOp(Node):
    """Arithmetic, ``+ - * / // % @ **``, and ``& | ^`` (of masks: and, or, xor)."""

    op: str
    left: Expr
    right: Expr


@frozen
class BoolOp(Node):
    """``a and b and c`` or ``a or b``: one node per chain, as in Python."""

    op: str
    values: tuple[Expr, ...]


@frozen
class Compare(Node):
    """``a < b <= c``: a chain of comparisons, as in Python."""

    left: Expr
    ops: tuple[str, ...]
    comparators: tuple[Expr, ...]


@frozen
class IfExp(Node):
    test: Expr
    body: Expr
    orelse: Expr


@frozen
class Keyword(Node):
    name: str
    value: Expr


@frozen
class Call(Node):
    func: Expr
    args: tuple[Expr, ...]
    keywords: tuple[Keyword, ...]


@frozen
class Attribute(Node):
    value: Expr
    attr: str


@frozen
class Slice(Node):
    lower: Expr | None
    upper: Expr | None
    step: Expr | None


@frozen
class Subscript(Node):
    """``x[i, :, None]``: the index is always a tuple of items."""

    value: Expr
    index: tuple[Expr | Slice, ...]


Expr = (
    Name
    | IntLit
    | FloatLit
    | StrLit
    | BoolLit
    | NoneLit
    | EllipsisLit
    | TupleExpr
    | ListExpr
    | DictExpr
    | UnaryOp
    | BinOp
    | BoolOp
    | Compare
    | IfExp
    | Call
    | Attribute
    | Subscript
)

# ------------------------------------------------------------------------ types


@frozen
class Policy(Node):
    """A numerics or placement policy: ``@accum(f32)``, ``@saturate``."""

    name: str
    args: tuple[Expr, ...] = ()
    keywords: tuple[Keyword, ...] = ()


@frozen
class TypeExpr(Node):
    """``Tensor["B", "S", 64, bf16 @accum(f32)]``, ``Tile``, ``KVCache[...] @paged``.

    ``args`` is None when the type has no brackets. Arguments are dims (string
    or integer literals, or names) and nested types such as the dtype.
    """

    name: str
    args: tuple[TypeExpr | StrLit | IntLit, ...] | None = None
    policies: tuple[Policy, ...] = ()


# ------------------------------------------------------------------- statements


@frozen
class ExprStmt(Node):
    value: Expr


@frozen
class Assign(Node):
    target: Expr
    value: Expr


@frozen
class AugAssign(Node):
    target: Expr
    op: str
    value: Expr


@frozen
class Return(Node):
    value: Expr | None


@frozen
class Pass(Node):
    pass


@frozen
class Alias(Node):
    name: str
    asname: str | None = None


@frozen
class Import(Node):
    """``import tessera.stdlib as std``."""

    module: str
    asname: str | None = None


@frozen
class ImportFrom(Node):
    """``from tessera.stdlib import (softmax, layernorm as ln)``."""

    module: str
    names: tuple[Alias, ...]


@frozen
class If(Node):
    """``elif`` is an ``If`` alone in ``orelse``, as in Python's own AST."""

    test: Expr
    body: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...]


@frozen
class For(Node):
    target: Expr
    iter: Expr
    body: tuple[Stmt, ...]


@frozen
class WithItem(Node):
    context: Expr
    target: Expr | None = None


@frozen
class With(Node):
    items: tuple[WithItem, ...]
    body: tuple[Stmt, ...]


@frozen
class Param(Node):
    name: str
    annotation: TypeExpr | None
    default: Expr | None
    keyword_only: bool


@frozen
class Decorator(Node):
    """``@kernel.autotune(space=...)``; ``args`` is None when there are no parentheses."""

    name: str
    args: tuple[Expr, ...] | None = None
    keywords: tuple[Keyword, ...] = ()


@frozen
class FunctionDef(Node):
    name: str
    params: tuple[Param, ...]
    returns: TypeExpr | None
    decorators: tuple[Decorator, ...]
    body: tuple[Stmt, ...]


Stmt = (
    ExprStmt
    | Assign
    | AugAssign
    | Return
    | Pass
    | Import
    | ImportFrom
    | If
    | For
    | With
    | FunctionDef
)


@frozen
class Module(Node):
    body: tuple[Stmt, ...]

    def functions(self) -> tuple[FunctionDef, ...]:
        return tuple(s for s in self.body if isinstance(s, FunctionDef))


def walk(root: Node) -> Iterator[tuple[Node, int]]:
    """Every node under ``root`` (itself included) with its depth below it, parents before
    children, in source order. Iterative, so that no tree is too deep to walk."""
    stack: list[tuple[Node, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        yield node, depth
        children = [c for value in _fields(node) for c in _nodes(value)]
        stack.extend((c, depth + 1) for c in reversed(children))


def _fields(node: Node) -> Iterator[object]:
    return (getattr(node, f.name) for f in fields(node) if f.name != "span")


def _nodes(value: object) -> Iterator[Node]:
    if isinstance(value, Node):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from _nodes(item)
