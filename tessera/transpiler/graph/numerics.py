"""``@verify.numerics``: interval analysis over the Graph IR.

``@verify.numerics(stable=True, bounded=[lo, hi])`` declares that every float tensor
input lies in ``[lo, hi]`` and that the result must stay there;
``bounded={"x": [lo, hi], ...}`` declares inputs one by one (and no result range).
A scalar parameter is taken at its default, or unbounded. From these ranges the
check carries an interval ``[lo, hi]`` through each op of the function, in order, and
warns at the op's line where:

- ``exp`` may overflow its dtype (its argument can exceed ``log(max)``: 88.7 for f32),
  naming the argument's range;
- a division (or ``rsqrt``) is by a range that contains zero;
- with ``stable=True``, a difference of two terms of one sign whose ranges overlap
  (``mean(x*x) - mean(x)**2``) may cancel catastrophically;
- the result may leave the declared range.

Two facts that plain intervals lose are kept, because the library's stable forms rest
on them: ``x - max(x)`` (along an axis, broadcast back) is at most 0, and the sum of
``exp(x - max(x))`` along that axis is at least 1 (the maximum's own term), so a
softmax never divides by zero; ``x * x`` is not negative. The library's ``softmax``
and ``softmax_safe``, ``log_softmax``, ``logsumexp_safe``, ``layernorm``, ``rmsnorm``
and ``flash_attention`` are stable by construction (they subtract the maximum or
normalize by a variance plus epsilon) and have the ranges their math gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from ...frozen import frozen
from ..frontend import ast
from ..frontend.diagnostics import Diagnostics
from .graph_ops import named_operands
from .ir import Block, Function, GraphModule, Op, Value

__all__ = ["Interval", "verify_numerics"]

INF = math.inf


@frozen
class Interval:
    lo: float
    hi: float

    def __str__(self) -> str:
        return f"[{_number(self.lo)}, {_number(self.hi)}]"

    def __add__(self, other: Interval) -> Interval:
        return Interval(_sum(self.lo, other.lo, -INF), _sum(self.hi, other.hi, INF))

    def __neg__(self) -> Interval:
        return Interval(-self.hi, -self.lo)

    def __mul__(self, other: Interval) -> Interval:
        products = [_product(a, b) for a in (self.lo, self.hi) for b in (other.lo, other.hi)]
        return Interval(min(products), max(products))

    def contains_zero(self) -> bool:
        return self.lo <= 0 <= self.hi

    def map(self, f: Callable[[float], float]) -> Interval:
        """A monotonically increasing ``f`` applied to both ends."""
        return Interval(f(self.lo), f(self.hi))


UNBOUNDED = Interval(-INF, INF)
#: log of each float dtype's largest finite value: where exp overflows.
_EXP_LIMIT = {"f32": 88.72, "tf32": 88.72, "bf16": 88.72, "f16": 11.09, "fp8_e4m3": 6.1,
              "fp8_e5m2": 10.96}  # fmt: skip


#: The later results of online softmax: (``P``, the row maximum, the row sum) and
#: (``acc``, the running maximum, the running sum); a row sum holds the maximum's 1.
_ONLINE = {
    "softmax_online": (UNBOUNDED, Interval(1.0, INF)),
    "softmax_accumulate": (UNBOUNDED, Interval(1.0, INF)),
}


def _number(x: float) -> str:
    return "inf" if x == INF else "-inf" if x == -INF else f"{x:.4g}"


def _sum(a: float, b: float, unknown: float) -> float:
    total = a + b
    return unknown if math.isnan(total) else total


def _product(a: float, b: float) -> float:
    return 0.0 if a == 0 or b == 0 else a * b


def _exp(x: float) -> float:
    return INF if x > 709 else math.exp(x)


def _whole(f: Callable[[float], int]) -> Callable[[float], float]:
    """``math.floor`` or ``math.ceil`` of an end of a range, which may be infinite."""
    return lambda x: float(f(x)) if math.isfinite(x) else x


#: Increasing elementwise functions, each with the end of its domain (None where it has
#: none), which an operand's range must lie above: the result's range is then the
#: function of the ends of the operand's.
_INCREASING: dict[str, tuple[Callable[[float], float], float | None]] = {
    "floor": (_whole(math.floor), None),
    "ceil": (_whole(math.ceil), None),
    "exp2": (lambda x: INF if x > 1023 else 2.0**x, None),
    "expm1": (lambda x: INF if x > 709 else math.expm1(x), None),
    "erf": (math.erf, None),
    "log2": (math.log2, 0.0),
    "log1p": (math.log1p, -1.0),
}


def verify_numerics(module: ast.Module, graph: GraphModule, diags: Diagnostics) -> None:
    """Warn at each op of a ``@verify.numerics`` function that the ranges cannot clear."""
    specs = {
        f.name: d for f in module.functions() for d in f.decorators if d.name == "verify.numerics"
    }
    for function in graph.functions:
        decorator = specs.get(function.name)
        if decorator is not None and function.kind != "declaration":
            _Ranges(function, decorator, diags).run()


def _literal(expr: ast.Expr) -> object:
    """A decorator argument's value: numbers, booleans, lists and dicts of them."""
    if isinstance(expr, ast.IntLit | ast.FloatLit | ast.StrLit | ast.BoolLit):
        return expr.value
    if isinstance(expr, ast.UnaryOp) and expr.op == "-":
        value = _literal(expr.operand)
        return -value if isinstance(value, int | float) else None
    if isinstance(expr, ast.ListExpr | ast.TupleExpr):
        return [_literal(e) for e in expr.elts]
    if isinstance(expr, ast.DictExpr):
        return {_literal(k): _literal(v) for k, v in zip(expr.keys, expr.values, strict=True)}
    return None


class _Ranges:
    def __init__(self, function: Function, decorator: ast.Decorator, diags: Diagnostics) -> None:
        self.function = function
        self.diags = diags
        keywords = {k.name: _literal(k.value) for k in decorator.keywords}
        self.stable = keywords.get("stable") is True
        self.span = decorator.span
        bounded = keywords.get("bounded")
        self.result: Interval | None = None
        self.inputs: dict[str, Interval] = {}
        if isinstance(bounded, list) and len(bounded) == 2:
            self.result = _interval(bounded)
        elif isinstance(bounded, dict):
            self.inputs = {str(k): _interval(v) for k, v in bounded.items()}
        elif bounded is not None:
            diags.warning("@verify.numerics: bounded= takes [lo, hi] or {\"name\": [lo, hi]}; "
                          "ignored", decorator.span)  # fmt: skip
        self.ranges: dict[int, Interval] = {}
        #: value -> the value it is the maximum of, along an axis (broadcast back or not)
        self.max_of: dict[int, int] = {}
        #: value -> the value it is a reduction of (a maximum, a sum, a mean), scaled by
        #: a size or not: ``x - mean(x)`` centers, which is the stable form
        self.reduced_of: dict[int, int] = {}
        #: values at most 0 that are 0 somewhere along every row: x - max(x)
        self.peaked: set[int] = set()
        #: values whose every row holds a 1: exp(x - max(x))
        self.has_one: set[int] = set()
        #: each value's computation, so that two computations of one value are one
        #: (``mean(x) * mean(x)`` is a square)
        self.keys: dict[int, object] = {}

    def run(self) -> None:
        for param in self.function.params:
            value = param.value
            dtype = getattr(value.type, "dtype", None)
            if param.default is not None and isinstance(param.default, int | float):
                self.ranges[value.id] = Interval(float(param.default), float(param.default))
            elif dtype is not None and dtype.is_float:
                given = self.inputs.get(value.name or "", self.result)
                self.ranges[value.id] = given or UNBOUNDED
        self.block(self.function.body)
        if self.result is None:
            return
        for value in self.function.body.yields:
            got = self.range(value.id)
            if got.lo < self.result.lo or got.hi > self.result.hi:
                self.diags.warning(
                    f"@verify.numerics: the result of '{self.function.name}' may reach {got}, "
                    f"outside the declared {self.result}",
                    self.span,
                )

    def range(self, value_id: int) -> Interval:
        return self.ranges.get(value_id, UNBOUNDED)

    def operands(self, op: Op) -> list[Interval]:
        """The operands' ranges, with a constant ``a`` or ``b`` attribute in its place."""
        found = [self.range(v.id) for v in op.operands]
        for position, name in ((0, "a"), (1, "b")):
            constant = op.attr(name)
            if isinstance(constant, int | float) and not isinstance(constant, bool):
                found.insert(position, Interval(float(constant), float(constant)))
        return found

    def warn(self, op: Op, message: str) -> None:
        self.diags.warning(f"@verify.numerics: {message}", op.span or self.span)

    def inputs_text(self) -> str:
        names = {p.value.name for p in self.function.params}
        given = {k: v for k, v in self.inputs.items() if k in names}
        if self.result is not None:
            given = {"inputs": self.result}
        return ", ".join(f"{k} in {v}" for k, v in given.items()) or "unbounded inputs"

    def block(self, block: Block) -> list[Interval]:
        """The ops of ``block`` in order; the ranges of what it yields. A loop's carried
        values are unbounded in its body and its results are what the body yields: the
        loop is taken to run at least once. A branch's results span its regions'."""
        for op in block.ops:
            if op.kind == "for":
                body = op.regions[0]
                yields = self.block(body)
                for value, got in zip(op.results, yields, strict=False):
                    self.ranges[value.id] = got
            elif op.regions:
                arms = [self.block(region) for region in op.regions]
                for index, value in enumerate(op.results):
                    got = [arm[index] for arm in arms if index < len(arm)]
                    self.ranges[value.id] = (
                        Interval(min(g.lo for g in got), max(g.hi for g in got))
                        if got
                        else UNBOUNDED
                    )
            else:
                self.op(op)
        return [self.range(v.id) for v in block.yields]

    def key(self, value_id: int) -> object:
        return self.keys.get(value_id, value_id)

    def op(self, op: Op) -> None:
        kind = op.kind.removeprefix("tile.")
        if not op.results:
            return
        result = op.results[0]
        if len(op.results) == 1 and not op.regions and not op.effects:
            self.keys[result.id] = (kind, tuple(self.key(v.id) for v in op.operands), op.attrs)
        args = self.operands(op)
        got = self.rule(op, kind, args)
        dtype = getattr(result.type, "dtype", None)
        if kind == "exp" and dtype is not None and args:
            limit = _EXP_LIMIT.get(dtype.name)
            if limit is not None and args[0].hi > limit:
                self.warn(op, f"exp may overflow {dtype.name}: its argument can reach "
                          f"{_number(args[0].hi)} (range {args[0]}, from {self.inputs_text()}); "
                          f"exp overflows above {limit}; subtract the maximum first, as "
                          "softmax_safe does")  # fmt: skip
        if kind in ("div", "rsqrt") and args and args[-1].contains_zero():
            what = "divides by" if kind == "div" else "takes rsqrt of"
            self.warn(op, f"{kind} {what} a range that contains zero: {args[-1]} (from "
                      f"{self.inputs_text()})")  # fmt: skip
        if self.stable and kind in ("sub", "add") and len(args) == 2:
            self.cancellation(op, kind, args)
        rest = _ONLINE.get(kind, ())
        for index, value in enumerate(op.results):
            extra = rest[index - 1] if 0 < index <= len(rest) else UNBOUNDED
            self.ranges[value.id] = got if value is result else extra

    def cancellation(self, op: Op, kind: str, args: list[Interval]) -> None:
        a, b = args if kind == "sub" else (args[0], -args[1])
        operands = [v.id for v in op.operands]
        if len(operands) == 2 and self.reduced_of.get(operands[1]) == operands[0]:
            return  # x - max(x), x - mean(x): the stable forms
        same_sign = (a.lo >= 0 and b.lo >= 0) or (a.hi <= 0 and b.hi <= 0)
        overlap = a.lo <= b.hi and b.lo <= a.hi
        degenerate = a.lo == a.hi or b.lo == b.hi
        if same_sign and overlap and not degenerate:
            self.warn(
                op,
                "catastrophic cancellation: a difference of two terms of one sign whose "
                f"ranges overlap ({a} and {b}) may lose every significant digit",
            )

    def rule(self, op: Op, kind: str, args: list[Interval]) -> Interval:
        first = args[0] if args else UNBOUNDED
        ids = [v.id for v in op.operands]
        if kind in ("load", "cast", "cast_like", "expand_dims", "reshape", "transpose",
                    "broadcast", "load_all"):  # fmt: skip
            for table in (self.max_of, self.reduced_of):
                if ids and ids[0] in table:
                    table[op.results[0].id] = table[ids[0]]
            for tags in (self.peaked, self.has_one):
                if ids and ids[0] in tags:
                    tags.add(op.results[0].id)
            return first
        if kind == "add":
            return args[0] + args[1] if len(args) == 2 else UNBOUNDED
        if kind == "sub":
            if len(ids) == 2 and self.max_of.get(ids[1]) == ids[0]:
                self.peaked.add(op.results[0].id)
                return Interval(_sum(first.lo, -first.hi, -INF), 0.0)
            return args[0] + -args[1] if len(args) == 2 else UNBOUNDED
        if kind == "neg":
            return -first
        if kind == "where":  # either branch: the smallest range holding both
            branches = [
                self.range(v.id) if isinstance(v, Value) else Interval(float(v), float(v))
                for v in named_operands(op, ("cond", "a", "b"))[1:]
            ]
            return Interval(min(b.lo for b in branches), max(b.hi for b in branches))
        if kind == "mul":
            if len(ids) == 2 and self.key(ids[0]) == self.key(ids[1]):
                top = max(_product(first.lo, first.lo), _product(first.hi, first.hi))
                return Interval(0.0 if first.contains_zero() else min(first.lo**2, first.hi**2),
                                top)  # fmt: skip
            return args[0] * args[1] if len(args) == 2 else UNBOUNDED
        if kind == "div":
            if ids and ids[0] in self.reduced_of:  # a sum over a size: a mean
                self.reduced_of[op.results[0].id] = self.reduced_of[ids[0]]
            if len(args) != 2 or args[1].contains_zero():
                return UNBOUNDED
            return args[0] * Interval(1 / args[1].hi, 1 / args[1].lo)
        if kind in ("floordiv", "mod") and len(args) == 2 and not args[1].contains_zero():
            divisor = args[1]
            if kind == "mod":  # the divisor's sign, smaller than it in magnitude
                return Interval(0.0, divisor.hi) if divisor.lo > 0 else Interval(divisor.lo, 0.0)
            quotient = args[0] * Interval(1 / divisor.hi, 1 / divisor.lo)
            return Interval(
                math.floor(quotient.lo) if math.isfinite(quotient.lo) else quotient.lo,
                math.floor(quotient.hi) if math.isfinite(quotient.hi) else quotient.hi,
            )
        if kind == "exp":
            if ids and ids[0] in self.peaked:
                self.has_one.add(op.results[0].id)
            return first.map(_exp)
        if kind in ("max", "min", "mean", "sum") and len(ids) == 1:
            self.reduced_of[op.results[0].id] = ids[0]
        if kind in ("max", "min", "mean") and len(ids) == 1:
            if kind == "max":
                self.max_of[op.results[0].id] = ids[0]
            return first
        if kind == "sum" and len(ids) == 1:
            lo = first.lo if first.lo >= 0 else -INF
            if ids[0] in self.has_one and first.lo >= 0:
                lo = 1.0
            return Interval(lo, INF if first.hi > 0 else 0.0)
        return _library(kind, first, args)


def _library(kind: str, first: Interval, args: Iterable[Interval]) -> Interval:
    """The ranges of the elementwise functions and of the library's stable ops."""
    if kind in ("softmax", "softmax_safe", "sigmoid", "softmax_online"):
        return Interval(0.0, 1.0)
    if kind in ("tanh", "sin", "cos"):
        return Interval(-1.0, 1.0)
    if kind == "relu":
        return Interval(max(first.lo, 0.0), max(first.hi, 0.0))
    if kind == "abs":
        return Interval(0.0 if first.contains_zero() else min(abs(first.lo), abs(first.hi)),
                        max(abs(first.lo), abs(first.hi)))  # fmt: skip
    if kind == "sqrt" and first.lo >= 0:
        return first.map(math.sqrt)
    if kind == "rsqrt" and first.lo > 0:
        return Interval(1 / math.sqrt(first.hi), 1 / math.sqrt(first.lo))
    if kind == "log" and first.lo > 0:
        return first.map(math.log)
    if kind in _INCREASING:
        f, domain = _INCREASING[kind]
        if domain is None or first.lo > domain:
            return first.map(f)
    if kind == "log_softmax":
        return Interval(-INF, 0.0)
    if kind in ("dim_to_float", "size"):  # a size: a tensor of size 0 divides nothing
        return Interval(1.0, INF)
    if kind == "flash_attention":  # a convex combination of the rows of V
        values = list(args)
        return values[2] if len(values) > 2 else UNBOUNDED
    return UNBOUNDED


def _interval(value: object) -> Interval:
    if (
        isinstance(value, list) and len(value) == 2
        and all(isinstance(v, int | float) for v in value) and value[0] <= value[1]
    ):  # fmt: skip
        return Interval(float(value[0]), float(value[1]))
    return UNBOUNDED
