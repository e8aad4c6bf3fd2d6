"""Expressions to values, during semantic analysis.

The ``Evaluator`` computes what compile-time expressions mean (constants,
sizes, dtypes, schedules) and turns run-time ones into Graph IR through the
function analyser that owns it: arithmetic on tensors becomes elementwise
ops, calls are bound and checked by their operation's rule.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from fractions import Fraction
from typing import Any

from ..frontend import ast
from ..frontend.diagnostics import Note, did_you_mean
from ..frontend.printer import print_expr
from ..frontend.source import Span
from .array_ops import MASK_READERS
from .custom_rules import CheckpointRef, checkpoint_ref, checkpointed
from .differentiate import grad_ref, gradient_of
from .dims import Dim, DimSyntaxError, parse_dim
from .dtypes import ALIASES, DTYPES, I32, lookup_dtype
from .graph_ops import COMPARISONS, COUNTING, GRAPH_OPS, LOGICAL, folded, is_mask
from .ir import Value
from .kvattend import AttendCall, check_attend, default_scale, length_guards, library_module
from .kvcache import cache_param, check_append, rolling_window, room_guard
from .opcall import OpCall, OpSpec, SemanticError, bind
from .optstate import adam_on_state
from .schedule_spec import ScheduleSpec, apply_method
from .splits import SPLITS, split_parts
from .tile_ops import TILE_DIMS
from .tile_sizes import check_size_as_number
from .types import KVCacheType, ScalarType, TensorType, TileType
from .values import (
    POISON,
    Const,
    DimValue,
    DTypeRef,
    Ev,
    FunctionRef,
    GradRef,
    Namespace,
    OpRef,
    Poison,
    ScheduleValue,
    ShapeValue,
    StateValue,
    describe,
)

__all__ = ["Evaluator", "TileContext", "is_number", "is_int", "STDLIB", "SCHEDULE_ARGS"]

SCHEDULE_ARGS = (
    "block", "k", "warps", "stages", "vector", "swizzle", "persistent",
    "block_m", "block_n", "block_k", "block_d",
)  # fmt: skip
SCHEDULE_METHODS = {
    **{f"with_{a}": a for a in SCHEDULE_ARGS},
    **{a: a for a in SCHEDULE_ARGS},
}
#: The standard library's names in seed 004, and the graph op each one is.
STDLIB = {
    "flash_attention_2": "flash_attention",
    "flash_attention": "flash_attention",
    "efficient_layernorm": "layernorm",
    "stable_softmax": "softmax_safe",
    "rotary_embedding": "rotary_embedding",
    "fused_adam": "fused_adam",
}
#: ``inf`` and ``nan`` are numpy's and PyTorch's spellings (``-np.inf``, ``torch.nan``).
CONSTANTS = {"INF": math.inf, "NAN": math.nan, "inf": math.inf, "nan": math.nan}
#: Modules a Python user reaches for (``math.sqrt``, ``np.inf``): a ``.tsr`` file has
#: none, and their names are builtins here.
_MODULES = ("math", "np", "numpy", "torch", "jnp", "jax", "F")
NAMESPACES = ("tile", "ops", "tessera")
BUILTINS = (
    "float", "int", "range", "dict", "Schedule", "device", "prefetch", "grad", "value_and_grad",
    "checkpoint", "split", "chunk", "len",
)  # fmt: skip
#: The ops that read a mask: ``where`` its ``cond``, ``cast``, the ops of masks, ``any``
#: and ``all``, the views and broadcasts of ``array_ops``, and PyTorch's attention its
#: ``attn_mask`` (its rule refuses one elsewhere).
_READ_MASKS = frozenset({"where", "tile.where", "cast", "tile.cast", *LOGICAL.values(),
                         "logical_xor", *MASK_READERS, *COUNTING,
                         "scaled_dot_product_attention"})  # fmt: skip
#: Operators that numpy, PyTorch and Python also spell as functions: ``pow(x, 2)``,
#: ``logical_and(a, b)``.
_OPERATOR_FUNCTIONS = {"pow": "pow", "power": "pow", **{k: k for k in LOGICAL.values()},
                       "logical_xor": "logical_xor"}  # fmt: skip
#: numpy's and PyTorch's other names of ops, as functions and methods: ``x.amax(-1)``.
_NAME_ALIASES = {"amax": "max", "amin": "min"}

#: ``&``, ``|`` and ``^``: of compile-time ints and bools as Python computes them, of masks
#: the ops of ``LOGICAL`` (``_mask_binary``).
_MASK_OPERATORS = {"&": operator.and_, "|": operator.or_, "^": operator.xor}
_ARITH = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floordiv", "%": "mod",
          "**": "pow"}  # fmt: skip
#: Graph ops that are methods of a tensor too, as in NumPy and PyTorch: ``x.sum(axis=0)``
#: is ``sum(x, axis=0)``. (``transpose`` and ``permute`` are read by ``_reordered``.)
#: On a tile, a method is the tile operation of that name (``s.max(axis=1)``), where
#: there is one.
_METHODS = (
    "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu", "silu", "relu", "abs", "round",
    "sin", "cos", "clamp", "pow", "sum", "max", "min", "mean", "softmax", "softmax_safe",
    "log_softmax", "logsumexp_safe", "floor", "ceil", "exp2", "log2", "log1p", "expm1", "erf",
    "tan", "clip", "square", "reciprocal", "sign", "isnan", "isinf", "isfinite", "logsumexp",
    "var", "std", "argmax", "argmin", "squeeze", "unsqueeze", "flatten", "broadcast_to", "expand",
    "tril", "triu", "any", "all", "take", "cumsum", "norm",
)  # fmt: skip


#: PyTorch's tensor methods that are the graph op of their name, on a tensor only (a tile's
#: ``gather`` is ``tile.gather``): ``x.gather(dim, index)``, ``k.repeat_interleave(n, dim=1)``.
_TENSOR_METHODS = ("gather", "repeat_interleave")

#: Tensor methods that reorder axes, read by ``Evaluator._reordered``: PyTorch's
#: ``x.permute(2, 0, 1)``, NumPy's ``x.transpose((2, 0, 1))`` and PyTorch's swap
#: ``x.transpose(1, 2)``.
_AXIS_METHODS = {"transpose": "transpose()", "permute": "permute()"}

#: PyTorch's tensor methods that are other ops here (``Evaluator._torch_method``): a cast's
#: dtype, or None.
_TORCH_METHODS = {"float": "f32", "half": "f16", "bfloat16": "bf16", "int": "i32", "t": None,
                  "matmul": None, "mm": None, "chunk": None, "split": None, "size": None,
                  "masked_fill": None, "contiguous": None, "clone": None,
                  "type_as": None}  # fmt: skip

#: What to write instead of a tensor method that PyTorch or NumPy code has and a
#: tensor here does not: each one's hint in the error.
_METHOD_HINTS = {
    "detach": "x, and differentiate with wrt= to leave a parameter out",
    "repeat": "broadcast_to(x, shape) or concat([x, x], axis)",
    # x.max(dim=-1).values: Tessera's max, as numpy's, gives the values themselves
    **dict.fromkeys(
        ("values", "indices"),
        "x.max(axis) for the values (as numpy's max: PyTorch's max(dim) gives a pair) "
        "and argmax(x, axis) for the indices",
    ),
    "clamp_min": "clamp(x, min=v) or maximum(x, v)",
    "clamp_max": "clamp(x, max=v) or minimum(x, v)",
    "long": "x.int(): integer tensors are i32 here",
    "double": "x.float(): f32 is the widest float here",
    "cpu": "x: a tensor lives where the compiled function runs",
    **dict.fromkeys(
        ("numpy", "item", "tolist"),
        "x itself: a compiled function computes on tensors; return it and read it in Python",
    ),
}


_FOLD = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
}


def _sizes_one_by_one(callee: Any, args: tuple[ast.Expr, ...]) -> bool:
    """Whether a call is PyTorch's ``zeros(T, T)`` or ``ones(2, 3, 4)``: its sizes one
    argument each, where numpy's second argument is a dtype (``ones((T, T), f32)``)."""
    if not isinstance(callee, OpRef) or callee.name not in ("zeros", "ones") or len(args) < 2:
        return False
    second = args[1]
    return not (isinstance(second, ast.Name) and (second.id in DTYPES or second.id in ALIASES))


class Evaluator:
    """Expressions to values. At the top level (``function`` None) nothing may
    be emitted: top-level values are compile-time only."""

    def __init__(self, owner: Any, function: Any) -> None:
        self.owner = owner
        self.function = function

    # -- names -------------------------------------------------------------------

    def lookup(self, name: str, span: Span) -> Any:
        if self.function is not None and name in self.function.env:
            value = self.function.env[name]
            # by id, with the value kept beside it: an id alone may be a dead object's
            donor, where = self.function.donated.get(id(value), (None, None))
            if donor is not value:
                return value
            if isinstance(value, StateValue):
                raise SemanticError(
                    f"'{name}' was updated by the fused_adam at line {where.line}, which "
                    "donated its arrays: use the state that call returned",
                    span,
                )
            raise SemanticError(  # a KVCache, which an append wrote in place
                f"'{name}' was appended to at line {where.line}, which writes the cache's "
                f"arrays in place: use the cache that append returned ({name} = "
                f"{name}.append(k, v))",
                span,
            )
        if name in self.owner.globals:
            return self.owner.globals[name]
        if name in CONSTANTS:
            return Const(CONSTANTS[name])
        dtype = lookup_dtype(name)
        if dtype is not None:
            return DTypeRef(dtype)
        if name in NAMESPACES:
            return Namespace(name)
        if self.function is not None:
            called = self.function.function_named(name, span)
            if called is not None:
                return called
        if name in GRAPH_OPS and GRAPH_OPS[name].level != "any":
            return OpRef(name)
        if name in _OPERATOR_FUNCTIONS:
            return OpRef(_OPERATOR_FUNCTIONS[name])
        if name in _NAME_ALIASES:
            return self.lookup(_NAME_ALIASES[name], span)
        if name in BUILTINS:
            return OpRef(name)
        if name in ("kernel", "verify", "jit", "autodiff"):
            raise SemanticError(f"'{name}' is a decorator, not a value", span)
        if self.function is not None and name in self.function.dims:
            return DimValue(self.function.dims[name])  # a size named by a parameter's type
        known = set(self.owner.globals) | set(CONSTANTS) | set(DTYPES) | set(ALIASES)
        known |= set(NAMESPACES) | {n for n, s in GRAPH_OPS.items() if s.level == "graph"}
        known |= set(BUILTINS) | set(_OPERATOR_FUNCTIONS)
        if self.function is not None:
            known |= {n for n, v in self.function.env.items() if not isinstance(v, Poison)}
            known |= set(self.function.dims)
        raise SemanticError(f"unknown name '{name}'{did_you_mean(name, known)}", span)

    # -- expressions -------------------------------------------------------------

    def eval(self, node: ast.Expr) -> Ev:
        return Ev(self._eval(node), node.span, node)

    def operand(self, node: ast.Expr) -> Ev:
        """An operand or argument of a larger expression. Its own error is reported here
        and the operand poisoned, so that the others are still checked: one statement
        can hold several mistakes (``softmax(x, axis=2) + gleu(x)``), each reported once."""
        try:
            return self.eval(node)
        except SemanticError as exc:
            (self.function or self.owner).diags.error(exc.message, exc.span, exc.notes)
            return Ev(POISON, node.span, node)

    def _eval(self, node: ast.Expr) -> Any:
        if isinstance(node, ast.Name):
            return self.lookup(node.id, node.span)
        if isinstance(node, (ast.IntLit, ast.FloatLit, ast.StrLit, ast.BoolLit)):
            return Const(node.value)
        if isinstance(node, ast.NoneLit):
            return Const(None)
        if isinstance(node, ast.EllipsisLit):
            return Const(...)
        if isinstance(node, (ast.TupleExpr, ast.ListExpr)):
            return self._sequence(node)
        if isinstance(node, ast.DictExpr):
            return self._dict(node)
        if isinstance(node, ast.UnaryOp):
            return self._unary(node)
        if isinstance(node, ast.BinOp):
            return self._binary(node)
        if isinstance(node, (ast.BoolOp, ast.Compare)):
            return self._logic(node)
        if isinstance(node, ast.IfExp):
            test = self.eval(node.test)
            if not isinstance(test.value, Const):
                raise SemanticError(
                    "a conditional expression needs a condition known at compile time",
                    node.test.span,
                )
            return self._eval(node.body if test.value.value else node.orelse)
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        raise SemanticError("this expression is not supported here", node.span)

    def _sequence(self, node: ast.TupleExpr | ast.ListExpr) -> Any:
        items = [self.operand(e) for e in node.elts]
        if any(isinstance(i.value, Poison) for i in items):
            return POISON
        if any(isinstance(i.value, DimValue) for i in items):  # a shape: (B, S, heads, E // heads)
            sizes = [self._int_parameter_as_size(i) for i in items]
            if all(isinstance(i.value, (DimValue, Const)) for i in sizes):
                items = sizes
        values = []
        for item in items:
            v = item.value
            if isinstance(v, Const):
                values.append(v.value)
            elif isinstance(v, DimValue):
                values.append(v.dim)
            elif isinstance(v, Value) and isinstance(node, ast.TupleExpr):
                return tuple(i.value for i in items)
            elif isinstance(v, Value) and all(isinstance(i.value, Value) for i in items):
                return [i.value for i in items]  # [a, b], which concat and stack take
            else:
                raise SemanticError(
                    f"a list or tuple here holds constants and sizes, not {describe(v)}", item.span
                )
        return Const(tuple(values) if isinstance(node, ast.TupleExpr) else list(values))

    def _dict(self, node: ast.DictExpr) -> Const:
        out = {}
        for key, value in zip(node.keys, node.values, strict=True):
            k, v = self.eval(key), self.eval(value)
            if not isinstance(k.value, Const) or not isinstance(k.value.value, str):
                raise SemanticError("dict keys must be strings", key.span)
            if not isinstance(v.value, Const):
                raise SemanticError(
                    f"dict values must be constants, not {describe(v.value)}", value.span
                )
            out[k.value.value] = v.value.value
        return Const(out)

    def _unary(self, node: ast.UnaryOp) -> Any:
        operand = self.eval(node.operand)
        v = operand.value
        if isinstance(v, Poison):
            return POISON
        if node.op in ("not", "~"):
            if isinstance(v, Const):  # ~ of an int is Python's, of a bool numpy's: not
                bits = node.op == "~" and type(v.value) is int
                return Const(~v.value if bits else not v.value)
            if is_mask(v):
                return self.call_op(GRAPH_OPS["logical_not"], [operand], [], node.span, node.op)
            bits = f", not {describe(v)}: Tessera has no bitwise operations on tensors"
            raise SemanticError(
                f"'{node.op}' needs a mask (a comparison of tensors) or a value known at compile "
                f"time{bits if node.op == '~' else ''}",
                node.span,
            )
        if (
            isinstance(v, Const)
            and isinstance(v.value, (int, float))
            and not isinstance(v.value, bool)
        ):
            return Const(-v.value if node.op == "-" else v.value)
        if isinstance(v, DimValue):
            return DimValue(-v.dim if node.op == "-" else v.dim)
        if node.op == "+":
            return v
        if isinstance(v, Value):
            return self.call_op(GRAPH_OPS["neg"], [operand], [], node.span, "-")
        raise SemanticError(f"cannot negate {describe(v)}", node.span)

    def _binary(self, node: ast.BinOp) -> Any:
        left, right = self.operand(node.left), self.operand(node.right)
        a, b = left.value, right.value
        if isinstance(a, Poison) or isinstance(b, Poison):
            return POISON
        if node.op in _MASK_OPERATORS:
            return self._mask_binary(node, left, right)
        for operand in (left, right):  # a function, dtype or namespace is no operand
            if not isinstance(operand.value, (Value, Const, DimValue)):
                raise SemanticError(
                    f"'{node.op}' is not supported on {describe(operand.value)}", operand.span
                )
        if is_number(a) and is_number(b):
            return Const(_fold(node, a.value, b.value))
        if (
            isinstance(a, (DimValue, Const))
            and isinstance(b, (DimValue, Const))
            and (isinstance(a, DimValue) or isinstance(b, DimValue))
        ):
            return self._dim_arith(node, left, right)
        if node.op == "@":
            tile = isinstance(a, Value) and isinstance(a.type, TileType)
            spec = GRAPH_OPS["tile.dot" if tile else "matmul"]
            return self.call_op(spec, [left, right], [], node.span, "@")
        if node.op not in _ARITH:
            raise SemanticError(
                f"'{node.op}' is not supported on {describe(a)} and {describe(b)}", node.span
            )
        values = [v for v in (a, b) if isinstance(v, Value)]
        if isinstance(a, DimValue) or isinstance(b, DimValue):
            sizes = [self._int_parameter_as_size(ev) for ev in (left, right)]
            if all(isinstance(ev.value, DimValue) or is_int(ev.value) for ev in sizes):
                return self._dim_arith(node, *sizes)
            _refuse_run_time_size(node, left, right)
        left, right = (self._size_as_number(ev, values, node.span) for ev in (left, right))
        if node.op in ("/", "//", "%") and is_number(right.value) and right.value.value == 0:
            # as when both sides are numbers: a constant zero divisor is a mistake, not inf
            raise SemanticError("division by zero", node.span)
        if not any(isinstance(v.type, (TensorType, TileType)) for v in values):
            return self._scalar_arith(node, left, right)
        return self.call_op(GRAPH_OPS[_ARITH[node.op]], [left, right], [], node.span, node.op)

    def _int_parameter_as_size(self, ev: Ev) -> Ev:
        """An ``int`` parameter, in arithmetic with a size (``E // heads``), as the size it
        names: the launch reads its value as it reads any size, and ``E // heads`` is the
        size ``E/heads``, with a guard that ``heads`` divides ``E`` where a shape uses it."""
        v = ev.value
        owner = self.function
        if (
            owner is not None
            and isinstance(v, Value)
            and v.type == ScalarType("int")
            and v.id in owner.param_spans
        ):
            return Ev(DimValue(Dim.sym(owner.param_spans[v.id][0])), ev.span, ev.text)
        return ev

    def _size_as_number(self, ev: Ev, values: list[Value], span: Span) -> Ev:
        """A size in arithmetic with a float tensor or scalar (``x / N``, ``s * K``), as
        the number ``float(N)``, which Python's arithmetic would make of it too."""
        v = ev.value
        if not isinstance(v, DimValue):
            return ev
        if any(
            t.type.kind == "int" if isinstance(t.type, ScalarType)
            else isinstance(t.type, (TensorType, TileType)) and not t.type.dtype.is_float
            for t in values
        ):  # fmt: skip
            raise SemanticError(
                f"a size in arithmetic with integers: write float({ev.text}) to compute in "
                "floats, or pass the size as an int parameter",
                ev.span,
            )
        return Ev(self._dim_as_float(v, ev.span, ev.text), ev.span, ev.text)

    def _dim_as_float(self, v: DimValue, span: Span, text: str) -> Const | Value:
        check_size_as_number(v.dim, text, span)
        if v.dim.constant is not None:
            return Const(float(v.dim.constant))
        return self._runtime(span).emit(
            "dim_to_float", (), (ScalarType("float"),), (("dim", v.dim),), (), span
        )[0]

    def _dim_arith(self, node: ast.BinOp, left: Ev, right: Ev) -> Any:
        if any(is_number(ev.value) and isinstance(ev.value.value, float) for ev in (left, right)):
            # D ** 0.5, D * 0.5: a size with a float is a float, as Python's int is
            floats = [
                (
                    Ev(self._dim_as_float(ev.value, ev.span, ev.text), ev.span, ev.source)
                    if isinstance(ev.value, DimValue)
                    else ev
                )
                for ev in (left, right)
            ]
            if all(isinstance(ev.value, Const) for ev in floats):
                return Const(_fold(node, floats[0].value.value, floats[1].value.value))
            return self._scalar_arith(node, *floats)
        dims = []
        for ev in (left, right):
            v = ev.value
            if isinstance(v, DimValue):
                dims.append(v.dim)
            elif isinstance(v.value, int) and not isinstance(v.value, bool):
                dims.append(Dim.const(v.value))
            else:
                raise SemanticError(f"sizes combine with integers, not {describe(v)}", ev.span)
        if node.op == "//" and all(d.constant is not None for d in dims):
            return DimValue(Dim.const(int(dims[0].constant // dims[1].constant)))
        # N // 2 of a symbolic size is N/2: where N is odd, what uses it is refused at the
        # call (a slice or a shape checks that its bounds are whole), never floored.
        op = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}.get(
            "/" if node.op == "//" else node.op
        )
        if op is None:
            raise SemanticError(f"'{node.op}' is not defined on sizes", node.span)
        try:
            return DimValue(op(dims[0], dims[1]))
        except (ValueError, ZeroDivisionError) as exc:
            raise SemanticError(str(exc), node.span) from None

    def _scalar_arith(self, node: ast.BinOp, left: Ev, right: Ev) -> Value:
        operands = []
        kinds = []
        attrs: tuple = ()
        for name, ev in (("a", left), ("b", right)):
            v = ev.value
            if isinstance(v, Value) and isinstance(v.type, ScalarType) and v.type.kind != "bool":
                operands.append(v)
                kinds.append(v.type.kind)
            elif is_number(v):
                attrs += ((name, v.value),)
                kinds.append("float" if isinstance(v.value, float) else "int")
            else:
                raise SemanticError(f"'{node.op}' is not defined on {describe(v)}", ev.span)
        kind = "float" if "float" in kinds or node.op == "/" else "int"
        if kind == "int" and node.op in ("//", "%"):
            raise SemanticError(
                f"'{node.op}' of int parameters is not computed in a kernel: compute it "
                "where the function is called and pass the result as a parameter",
                node.span,
            )
        if node.op == "/" and "float" not in kinds:  # n / m of ints divides as floats do
            operands = [self._widened(v, node.span) for v in operands]
        return self._runtime(node.span).emit(
            _ARITH[node.op], tuple(operands), (ScalarType(kind),), attrs, (), node.span
        )[0]

    def _mask_binary(self, node: ast.BinOp, left: Ev, right: Ev) -> Any:
        """``a & b``, ``a | b`` and ``a ^ b``: of masks, numpy's spellings of ``and``,
        ``or`` and xor; of compile-time ints and bools, Python's."""
        raw = [ev.value.value if isinstance(ev.value, Const) else None for ev in (left, right)]
        if all(isinstance(r, int) for r in raw):
            return Const(_MASK_OPERATORS[node.op](*raw))
        for ev in (left, right):
            if not is_mask(ev.value):
                raise SemanticError(
                    f"'{node.op}' combines masks (comparisons of tensors), not "
                    f"{describe(ev.value)}; Tessera has no bitwise operations on tensors",
                    ev.span,
                    (
                        Note(
                            f"'{node.op}' binds tighter than a comparison, as in Python: "
                            f"write (x > 0.0) {node.op} (x < 1.0)"
                        ),
                    ),
                )
        kind = {"&": LOGICAL["and"], "|": LOGICAL["or"], "^": "logical_xor"}[node.op]
        return self.call_op(GRAPH_OPS[kind], [left, right], [], node.span, node.op)

    def _widened(self, v: Value, span: Span) -> Value:
        """``float(v)`` of an int scalar ``v``: ``v * 1.0``, which C widens as Python does
        (an op of its own would need every backend to print it)."""
        if v.type != ScalarType("int"):
            return v
        return self._runtime(span).emit(
            "mul", (v,), (ScalarType("float"),), (("b", 1.0),), (), span
        )[0]

    def _logic(self, node: ast.BoolOp | ast.Compare) -> Any:
        parts = node.values if isinstance(node, ast.BoolOp) else (node.left, *node.comparators)
        values = [self.eval(p) for p in parts]
        if any(isinstance(ev.value, Poison) for ev in values):
            return POISON
        if any(
            isinstance(ev.value, Value) and isinstance(ev.value.type, (TensorType, TileType))
            for ev in values
        ):
            return self._elementwise_compare(node, values)
        for ev in values:
            if not isinstance(ev.value, Const):
                raise SemanticError(
                    f"'{node.op if isinstance(node, ast.BoolOp) else node.ops[0]}' needs values "
                    f"known at compile time, not {describe(ev.value)}",
                    ev.span,
                )
        raw = [ev.value.value for ev in values]
        if isinstance(node, ast.BoolOp):
            result = all(raw) if node.op == "and" else any(raw)
            return Const(result)
        compare = {"<": operator.lt, ">": operator.gt, "==": operator.eq, ">=": operator.ge,
                   "<=": operator.le, "!=": operator.ne, "is": operator.is_,
                   "is not": operator.is_not, "in": lambda a, b: a in b,
                   "not in": lambda a, b: a not in b}  # fmt: skip
        try:
            return Const(
                all(compare[op](a, b) for op, a, b in zip(node.ops, raw, raw[1:], strict=False))
            )
        except TypeError:
            raise SemanticError("these values cannot be compared", node.span) from None

    def _elementwise_compare(self, node: ast.BoolOp | ast.Compare, values: list[Ev]) -> Any:
        """A comparison of tensors or tiles, or ``and``/``or`` of masks: a mask,
        elementwise. One comparison at a time: a chain is two, joined with ``and``."""
        if isinstance(node, ast.BoolOp):
            result = values[0]
            for ev in values[1:]:
                combined = self.call_op(
                    GRAPH_OPS[LOGICAL[node.op]], [result, ev], [], node.span, node.op
                )
                result = Ev(combined, node.span, node)
            return result.value
        if len(node.ops) > 1:
            raise SemanticError(
                "a chain of comparisons of tensors is not supported: compare one pair at a "
                "time, and join them with 'and' (0.0 < x and x < 1.0)",
                node.span,
            )
        kind = COMPARISONS.get(node.ops[0])
        if kind is None:
            raise SemanticError(f"'{node.ops[0]}' does not compare tensors", node.span)
        tensors = [ev.value for ev in values if isinstance(ev.value, Value)]
        operands = [self._size_as_number(ev, tensors, node.span) for ev in values]
        return self.call_op(GRAPH_OPS[kind], operands, [], node.span, node.ops[0])

    def _attribute(self, node: ast.Attribute) -> Any:
        if isinstance(node.value, ast.Name) and node.value.id in _MODULES:
            self._no_module(node.value.id, node.attr, node.span)
        base = self.eval(node.value)
        v = base.value
        attr = node.attr
        if isinstance(v, Poison):
            return POISON
        if isinstance(v, Namespace):
            return self._namespace_attr(v, attr, node.span)
        if isinstance(v, Value):
            return self._value_attr(base, attr, node.span)
        if isinstance(v, StateValue):
            if attr not in v.type.fields:
                hint = "" if attr != "master" else " (it is declared without @fp32_master)"
                raise SemanticError(
                    f"{v.type} has no attribute '{attr}'{hint}; it has "
                    f"{', '.join(v.type.fields)}",
                    node.span,
                )
            return v.field(attr)
        if isinstance(v, ScheduleValue):
            if attr not in SCHEDULE_METHODS:
                raise SemanticError(
                    f"a Schedule has no method '{attr}'{did_you_mean(attr, SCHEDULE_METHODS)}",
                    node.span,
                )
            return OpRef(f"schedule.{attr}", v)
        if isinstance(v, TileContext):
            if attr not in TILE_DIMS:
                raise SemanticError(
                    f"tile.context() has no '{attr}'{did_you_mean(attr, TILE_DIMS)}; "
                    f"it has {', '.join(TILE_DIMS)}",
                    node.span,
                )
            return DimValue(Dim.sym(f"T.{attr}"))
        if isinstance(v, OpRef) and attr == "with_schedule" and v.receiver is None:
            return OpRef("with_schedule", v)
        if isinstance(v, DTypeRef) and attr in ("bits",):
            return Const(v.dtype.bits)
        raise SemanticError(f"{describe(v)} has no attribute '{attr}'", node.span)

    def _no_module(self, module: str, attr: str, span: Span) -> None:
        """``math.inf`` or ``np.exp`` where no parameter or global has the module's name:
        say what the ``.tsr`` spelling is, instead of "unknown name 'np'"."""
        try:
            self.lookup(module, span)
            return  # the user's own name
        except SemanticError:
            pass
        if attr in CONSTANTS:
            instead = f"write {attr}"
        elif attr in GRAPH_OPS and GRAPH_OPS[attr].level != "tile":
            instead = f"{attr} is a builtin, write {attr}(...)"
        else:
            ops = {n for n, s in GRAPH_OPS.items() if s.level != "tile"}
            instead = f"the ops Tessera has are builtins (docs/ops.md){did_you_mean(attr, ops)}"
        raise SemanticError(f"'{module}' is no module in a .tsr file: {instead}", span)

    def _namespace_attr(self, ns: Namespace, attr: str, span: Span) -> Any:
        if ns.name == "tessera" and attr in ("ops", "tile", "stdlib"):
            return Namespace(attr)
        if ns.name == "tile":
            name = f"tile.{attr}"
            if name == "tile.context":
                return OpRef(name)
            if name in GRAPH_OPS:
                return OpRef(name)
            tile_ops = [n.split(".", 1)[1] for n in GRAPH_OPS if n.startswith("tile.")] + [
                "context"
            ]
            raise SemanticError(
                f"tile has no operation '{attr}'{did_you_mean(attr, tile_ops)}", span
            )
        if ns.name in ("ops", "tessera", "stdlib", "tessera.stdlib"):
            if attr in GRAPH_OPS and GRAPH_OPS[attr].level != "tile":
                return OpRef(attr)
            if attr in STDLIB:
                return OpRef(f"stdlib.{attr}")
            graph = [n for n, s in GRAPH_OPS.items() if s.level != "tile"]
            raise SemanticError(
                f"{ns.name} has no operation '{attr}'{did_you_mean(attr, graph)}", span
            )
        if attr in GRAPH_OPS and GRAPH_OPS[attr].level != "tile":  # np.exp, torch.tanh
            raise SemanticError(
                f"'{ns.name}' has no attribute '{attr}': a .tsr file does not run "
                f"{ns.name}; write {attr}(...), the graph operation",
                span,
            )
        raise SemanticError(f"'{ns.name}' has no attribute '{attr}'", span)

    def _value_attr(self, base: Ev, attr: str, span: Span) -> Any:
        v: Value = base.value
        t = v.type
        attr = _NAME_ALIASES.get(attr, attr)
        if isinstance(t, (TensorType, TileType)):
            if attr == "shape":
                return ShapeValue(t.dims)
            if attr == "dtype":
                return DTypeRef(t.dtype)
            if attr == "ndim":
                return Const(t.rank)
            if attr == "T":
                spec = GRAPH_OPS["tile.transpose" if isinstance(t, TileType) else "transpose"]
                return self.call_op(spec, [base], [], span, f"{base.text}.T")
            if attr == "mT" and isinstance(t, TensorType):  # PyTorch's batched transpose
                if t.rank < 2:
                    raise SemanticError(
                        f"{base.text}.mT swaps the last two dims; {base.text} has rank {t.rank}",
                        span,
                    )
                order = (*range(t.rank - 2), t.rank - 1, t.rank - 2)
                axes = Ev(Const(order), span, "axes")
                return self.call_op(
                    GRAPH_OPS["transpose"], [base, axes], [], span, f"{base.text}.mT"
                )
            if attr in ("to", "astype"):  # x.to(bf16) (PyTorch, Triton), x.astype(bf16) (NumPy)
                return OpRef("tile.cast" if isinstance(t, TileType) else "cast", base)
            if attr in _TORCH_METHODS and isinstance(t, TensorType):
                return OpRef(f"torch.{attr}", base)
            if attr in ("reshape", "view") and isinstance(t, TensorType):  # x.view(B*S, C)
                return OpRef("reshape", base)
            if attr in _TENSOR_METHODS and isinstance(t, TensorType):
                return OpRef(attr, base)
            if attr in _AXIS_METHODS and isinstance(t, TensorType):  # read by _reordered
                return OpRef(_AXIS_METHODS[attr], base)
            prefix = "tile." if isinstance(t, TileType) else ""
            methods = [m for m in _METHODS if prefix + m in GRAPH_OPS]
            if attr in methods:
                return OpRef(prefix + attr, base)
            what = "tile" if prefix else "tensor"
            tensor_only = ("reshape", "view", *_AXIS_METHODS, *_TENSOR_METHODS)
            known = ("shape", "dtype", "T", "mT", "to", "astype", *methods,
                     *(() if prefix else tensor_only))  # fmt: skip
            hint = f"; write {_METHOD_HINTS[attr]}" if attr in _METHOD_HINTS and not prefix else ""
            raise SemanticError(
                f"a {what} has no attribute '{attr}'{hint or did_you_mean(attr, known)}", span
            )
        if isinstance(t, KVCacheType):
            if attr in ("K", "V", "lengths"):
                if t.dims is None or t.dtype is None:
                    raise SemanticError(
                        f"{base.text}.{attr} needs the cache's shape: declare it as "
                        'KVCache["B", "H", "S_max", "D_h", bf16]',
                        span,
                        self.declaration_note(base),
                    )
                # the lengths as i32 (the positions a row holds, where rotary angles or a
                # mask are read), from the cache's int64 array by a launch of their own
                read = (
                    TensorType((t.dims[0],), I32)
                    if attr == "lengths"
                    else TensorType(t.dims, t.dtype)
                )
                return self._runtime(span).emit(
                    f"kvcache.{attr.lower()}", (v,), (read,), (), (), span
                )[0]
            if attr == "append":
                return OpRef("kvcache.append", v)
            known = ("K", "V", "lengths", "append")
            raise SemanticError(
                f"a KVCache has no attribute '{attr}'{did_you_mean(attr, known)}", span
            )
        raise SemanticError(f"{describe(v)} has no attribute '{attr}'", span)

    def _subscript(self, node: ast.Subscript) -> Any:
        base = self.eval(node.value)
        v = base.value
        if isinstance(v, Poison):
            return POISON
        if (
            isinstance(v, ShapeValue)
            and len(node.index) == 1
            and isinstance(node.index[0], ast.Slice)
        ):
            return ShapeValue(v.dims[self._shape_slice(node.index[0])])
        if isinstance(v, (ShapeValue, Const)) and len(node.index) == 1:
            index = self.eval(node.index[0]) if not isinstance(node.index[0], ast.Slice) else None
            items = v.dims if isinstance(v, ShapeValue) else v.value
            if index is None or not is_int(index.value) or not isinstance(items, (tuple, list)):
                raise SemanticError("index with one integer", node.span)
            i = index.value.value
            if not -len(items) <= i < len(items):
                raise SemanticError(
                    f"index {i} is out of range for {len(items)} items", node.index[0].span
                )
            item = items[i]
            return DimValue(item) if isinstance(item, Dim) else Const(item)
        if isinstance(v, Value) and isinstance(v.type, (TensorType, TileType)):
            return self._indexed(node, v)
        raise SemanticError(f"{describe(v)} cannot be indexed", node.span)

    def _shape_slice(self, item: ast.Slice) -> slice:
        """``x.shape[1:]``, ``x.shape[:-1]``: a slice of a shape, as Python slices a
        tuple, with integer bounds and step known at compile time."""
        bounds = []
        for part in (item.lower, item.upper, item.step):
            if part is None:
                bounds.append(None)
                continue
            value = self.eval(part).value
            if not is_int(value):
                raise SemanticError("a shape is sliced by integers", part.span)
            bounds.append(value.value)
        if bounds[2] == 0:
            raise SemanticError("a slice step cannot be zero", item.span)
        return slice(*bounds)

    def _indexed(self, node: ast.Subscript, v: Value) -> Value:
        """``x[...]`` of a tensor or tile: ``None`` is a new axis of one element, ``:``
        keeps an axis, ``...`` the axes no other item names, ``a:b`` keeps part of a
        tensor's axis (``_sliced``), and an integer one element of it, without the axis:
        ``x[:, -1]`` is ``x[:, -1:]`` reshaped."""
        rank = v.type.rank
        gathered = self._gathered(node, v)
        if gathered is not None:
            return gathered
        if sum(isinstance(item, ast.EllipsisLit) for item in node.index) > 1:
            raise SemanticError("an index has at most one '...'", node.span)
        named = [i for i in node.index if not isinstance(i, (ast.NoneLit, ast.EllipsisLit))]
        if len(named) > rank:
            raise SemanticError(f"too many indices for a rank-{rank} value", node.span)
        items: list[ast.Expr | None] = []  # None: the whole axis
        for item in node.index:
            if isinstance(item, ast.EllipsisLit):
                items += [None] * (rank - len(named))
            elif isinstance(item, ast.Slice) and item.lower is item.upper is item.step is None:
                items.append(None)
            else:
                items.append(item)
        bounds: dict[int, tuple[Dim, Dim, Span]] = {}
        steps: dict[int, tuple[int, Span]] = {}
        shape: list[int | None] = []  # the result's axes: the source's, or None for a new one
        axis = 0
        for item in items:
            if isinstance(item, ast.NoneLit):
                shape.append(None)
                continue
            if item is not None:
                if isinstance(v.type, TileType):
                    raise SemanticError(
                        "only ':' and None (a new axis of one element) index a tile; "
                        "tile.split cuts one into parts",
                        item.span,
                    )
                if isinstance(item, ast.Slice) and item.step is not None:
                    steps[axis] = (self._slice_step(item.step), item.span)
                bounds[axis] = self._slice_bounds(v.type.dims[axis], item)
            if item is None or isinstance(item, ast.Slice):  # an integer drops the axis
                shape.append(axis)
            axis += 1
        shape += range(axis, rank)  # the axes after the last item are whole
        plain = {a: bound for a, bound in bounds.items() if a not in steps}
        if plain:
            v = self._sliced(v, plain, node.span)
        for stepped, (step, span) in steps.items():
            start, stop, _ = bounds[stepped]
            v = self._stepped(v, stepped, step, start, stop, span)
        if shape == list(range(rank)):
            return v
        dims = tuple(Dim.const(1) if a is None else v.type.dims[a] for a in shape)
        if dims == v.type.dims:  # x[:, None, -1] of [N, D] is x[:, -1:]
            return v
        if not bounds and len(shape) - shape.count(None) == rank:  # new axes only
            kind = "expand_dims"
            attrs = (("axes", tuple(i for i, a in enumerate(shape) if a is None)),)
        else:
            kind, attrs = "reshape", (("shape", dims),)
        result = v.type.with_(dims=dims)
        if isinstance(result, TensorType):
            result = TensorType(result.dims, result.dtype)
        return self._runtime(node.span).emit(kind, (v,), (result,), attrs, (), node.span)[0]

    def _gathered(self, node: ast.Subscript, v: Value) -> Value | None:
        """``w[ids]`` (``w[ids, :]``) of a tensor by an integer tensor: numpy's indexing by an
        integer array on the first axis, ``take(w, ids, axis=0)`` (an embedding's rows).
        None where the first item is not an integer tensor, or other items are not ``:``."""
        first, rest = node.index[0], node.index[1:]
        if isinstance(first, (ast.Slice, ast.NoneLit, ast.EllipsisLit)) or isinstance(
            v.type, TileType
        ):
            return None
        whole = all(isinstance(i, ast.Slice) and i.lower is i.upper is i.step is None for i in rest)
        ids = self.eval(first)
        is_index = isinstance(ids.value, Value) and isinstance(ids.value.type, TensorType)
        if not is_index or ids.value.type.dtype.kind != "int":
            return None
        if not whole:
            raise SemanticError(
                "indexing by an integer tensor takes whole rows: w[ids] or w[ids, :] "
                "(take(w, ids, axis=k) for another axis)",
                node.span,
            )
        base = Ev(v, node.value.span, node.value)
        keywords = [("axis", Ev(Const(0), node.span, "0"), node.span)]
        return self.call_op(GRAPH_OPS["take"], [base, ids], keywords, node.span, print_expr(node))

    def _sliced(self, x: Value, bounds: dict[int, tuple[Dim, Dim, Span]], span: Span) -> Value:
        """``x[..., a:b]``, ``x[:, :T]``: elements ``[a, b)`` along each sliced axis. A view:
        the kernels that read it read each row where it lies, as they read
        ``split_qkv``'s parts."""
        if x.type.rank == 1:  # a vector as one row
            row = self._reshaped(x, (Dim.const(1), x.type.dims[0]), span)
            part = self._sliced(row, {1: bounds[0]}, span)
            return self._reshaped(part, (part.type.dims[1],), span)
        dims, starts = list(x.type.dims), [Dim.const(0)] * x.type.rank
        for axis, (start, stop, _) in bounds.items():
            starts[axis], dims[axis] = start, stop - start
        view = self._runtime(span).producer(x)
        if (
            view is not None
            and view.kind == "slice"
            and view.attr("perm") == tuple(range(len(dims)))
        ):
            # a slice of a slice is one slice of the first's source: x[:, 2:9][:, ::2]
            x = view.operands[0]
            starts = [a + b for a, b in zip(view.attr("starts"), starts, strict=True)]
        result = TensorType(tuple(dims), x.type.dtype)
        attrs = (("perm", tuple(range(x.type.rank))), ("starts", tuple(starts)))
        return self._runtime(span).emit("slice", (x,), (result,), attrs, (), span)[0]

    def _slice_step(self, expr: ast.Expr) -> int:
        """The step of ``a:b:k``: a positive integer known at compile time."""
        step = self.eval(expr).value
        if not is_int(step):
            raise SemanticError(f"a slice step is an integer, not {describe(step)}", expr.span)
        if step.value <= 0:
            raise SemanticError(
                (
                    "a slice step is positive: a negative one (reversing an axis) is not supported"
                    if step.value
                    else "a slice step cannot be zero"
                ),
                expr.span,
            )
        return step.value

    def _stepped(self, x: Value, axis: int, step: int, start: Dim, stop: Dim, span: Span) -> Value:
        """``x[..., start:stop:step]`` along ``axis``: numpy's ``ceil((stop - start) /
        step)`` elements, read as the column ``c`` of a window of whole groups of ``step``
        (``[count, step]``) that starts ``c`` elements before ``start``, where the axis has
        room for one (``x[:, 1::2]`` of an even ``D`` is column 1 of ``[D/2, 2]``);
        otherwise as the whole groups and the last element apart, joined (``concat``).
        A symbolic count must come out whole: a guard checks it at the call."""
        if step == 1:
            return self._sliced(x, {axis: (start, stop, span)}, span)
        dims = x.type.dims
        length = stop - start
        offset = sum((c for m, c in length.terms if not m), Fraction(0))
        short = int(-offset % step) if offset.denominator == 1 else 0  # the last group's gap
        count = (length + short) / step
        if not count.is_integral:
            shown = f"the slice {start}:{stop}:{step} of a dim of {dims[axis]}"
            self._runtime(span).guard(
                "divisible", *count.fraction(), f"{shown} takes whole steps", span
            )
        slack = dims[axis] - stop
        lowest = short - int(slack.constant) if slack.constant is not None else short
        highest = min(step - 1, int(start.constant) if start.constant is not None else 0)
        column = max(lowest, 0)
        if column > highest:  # no room: the whole groups, then the last element
            whole = start + (count - 1) * step
            last = self._sliced(x, {axis: (whole, whole + 1, span)}, span)
            if whole == start:
                return last
            head = self._stepped(x, axis, step, start, whole, span)
            parts = Ev(Const((head, last)), span, "the whole steps and the last element")
            where = [("axis", Ev(Const(axis), span, str(axis)), span)]
            return self.call_op(GRAPH_OPS["concat"], [parts], where, span, "a strided slice")
        first = start - column
        window = self._sliced(x, {axis: (first, first + count * step, span)}, span)
        groups = (*dims[:axis], count, Dim.const(step), *dims[axis + 1 :])
        picked = self._sliced(
            self._reshaped(window, groups, span),
            {axis + 1: (Dim.const(column), Dim.const(column + 1), span)},
            span,
        )
        return self._reshaped(picked, (*dims[:axis], count, *dims[axis + 1 :]), span)

    def _reshaped(self, x: Value, dims: tuple[Dim, ...], span: Span) -> Value:
        result = TensorType(tuple(dims), x.type.dtype)
        attrs = (("shape", result.dims),)
        return self._runtime(span).emit("reshape", (x,), (result,), attrs, (), span)[0]

    def _slice_bounds(self, size: Dim, item: ast.Expr) -> tuple[Dim, Dim, Span]:
        """Where ``item`` (a slice, as NumPy's, or an integer: one element) takes an axis of
        ``size`` elements from and to, with the guards that keep it whole, non-empty and
        inside the axis where the sizes are symbolic."""
        if isinstance(item, ast.Slice):
            start = Dim.const(0) if item.lower is None else self._bound(size, item.lower)
            stop = size if item.upper is None else self._bound(size, item.upper)
            shown = f"the slice {start}:{stop} of a dim of {size}"
        else:
            start = self._bound(size, item)
            stop = start + Dim.const(1)
            shown = f"the index {start} of a dim of {size}"
        for bound in (start, stop):
            if not bound.is_integral:  # "C/2": whole where C is a multiple of 2
                self._runtime(item.span).guard(
                    "divisible", *bound.fraction(), f"{shown}: {bound} is whole", item.span
                )
        for low, high, problem in (
            (Dim.const(0), start, "starts before it"),
            (start + Dim.const(1), stop, "is empty"),
            (stop, size, "ends past it"),
        ):
            gap = high - low
            if gap.constant is not None and gap.constant < 0:
                raise SemanticError(f"{shown} {problem}", item.span)
            if gap.constant is None and any(c < 0 for _, c in gap.terms):  # sizes are >= 0
                number = Dim.const(sum((c for m, c in gap.terms if not m), Fraction(0)))
                if len((gap - number).terms) == 1:  # C - 24 >= 0 reads C >= 24
                    low, high = -number, gap - number
                self._runtime(item.span).guard("at_most", low, high, shown, item.span)
        return start, stop, item.span

    def _bound(self, size: Dim, expr: ast.Expr) -> Dim:
        """An index or a slice bound: an integer (from the end if negative) or a size."""
        ev = self.eval(expr)
        if isinstance(ev.value, DimValue):  # -C counts from the end, as -1 does
            dim = ev.value.dim
            return size + dim if dim.terms and all(c < 0 for _, c in dim.terms) else dim
        if is_int(ev.value):
            i = ev.value.value
            return size + Dim.const(i) if i < 0 else Dim.const(i)
        if isinstance(ev.value, Const) and isinstance(ev.value.value, str):  # "C/2", as dims
            return self._size_text(ev.value.value, ev.span)
        gather = ""
        if isinstance(ev.value, Value) and isinstance(ev.value.type, TensorType):
            gather = " (a gather by a tensor's values, x[i, labels[i]], is "
            gather += "take_along_axis(x, labels, axis=-1); rows by integer ids, w[ids], "
            gather += "are take(w, ids, axis=0))"
        raise SemanticError(
            f"an index or a slice bound is an integer or a size, not {describe(ev.value)}" + gather,
            ev.span,
        )

    def _size_text(self, text: str, span: Span) -> Dim:
        """A size written as an annotation writes a dim (``"C/2"``): of the function's
        sizes and the ``-D`` symbols."""
        try:
            dim = parse_dim(text).substitute(self.function.defines)
        except DimSyntaxError as exc:
            raise SemanticError(f'bad dim "{text}": {exc.message}', span) from None
        unknown = sorted(dim.symbols() - set(self.function.dims))
        if unknown:
            raise SemanticError(
                f'"{text}" names {", ".join(unknown)}, which no parameter of '
                f"'{self.function.node.name}' has as a size",
                span,
            )
        return dim

    # -- calls -------------------------------------------------------------------

    def _call(self, node: ast.Call) -> Any:
        callee = self.eval(node.func)
        method = isinstance(callee.value, OpRef) and isinstance(callee.value.receiver, Ev)
        if method and callee.value.name in _AXIS_METHODS.values():
            return self._reordered(node, callee)
        one_dim = len(node.args) == 1 and not isinstance(
            node.args[0], (ast.TupleExpr, ast.ListExpr, ast.Name)
        )
        if (
            method
            and (
                (callee.value.name == "reshape" and (len(node.args) > 1 or one_dim))
                or (callee.value.name == "expand" and len(node.args) > 1)
            )
        ) or (_sizes_one_by_one(callee.value, node.args) and not method):
            # x.reshape(S, H, D), as in PyTorch, is x.reshape((S, H, D)); x.reshape("N")
            # is x.reshape(("N",)); x.expand(4, -1) is x.expand((4, -1)); ones(T, T) is
            # ones((T, T))
            dims = ast.TupleExpr(tuple(node.args), span=node.args[0].span.to(node.args[-1].span))
            node = dataclasses.replace(node, args=(dims,))
        args = [self.operand(a) for a in node.args]
        keywords = [(k.name, self.operand(k.value), k.span) for k in node.keywords]
        if isinstance(callee.value, Poison) or any(
            isinstance(e.value, Poison) for e in [*args, *(k[1] for k in keywords)]
        ):
            return POISON
        ref = callee.value
        state = next((a for a in [*args, *(k[1] for k in keywords)]
                      if isinstance(a.value, StateValue)), None)  # fmt: skip
        if state is not None and isinstance(ref, (FunctionRef, GradRef, CheckpointRef)):
            raise SemanticError(
                f"{callee.text}(): passing an OptimizerState to another function is not "
                "supported yet; pass its tensors (state.m, state.v, state.master)",
                state.span,
            )
        if isinstance(ref, FunctionRef):
            return self.function.call_function(ref.node, args, keywords, node.span)
        if isinstance(ref, GradRef):
            return gradient_of(self.function, ref, args, keywords, node.span)
        if isinstance(ref, OpRef) and ref.name in ("grad", "value_and_grad"):
            return grad_ref(ref.name, args, keywords, node.span)
        if isinstance(ref, CheckpointRef):
            return checkpointed(self.function, ref, args, keywords, node.span)
        if isinstance(ref, OpRef) and ref.name == "checkpoint":
            return checkpoint_ref(args, keywords, node.span)
        if not isinstance(ref, OpRef):
            raise SemanticError(f"{callee.text} is {describe(ref)}, not a function", node.func.span)
        name = ref.name
        if name == "with_schedule":
            schedule = args[0].value if len(args) == 1 and not keywords else None
            if not isinstance(schedule, ScheduleValue):
                raise SemanticError(f"{callee.text} takes one Schedule", node.span)
            return OpRef(ref.receiver.name, schedule)
        if name.startswith("schedule.") or name == "Schedule":
            return self._schedule(node, ref)
        if name.startswith("stdlib."):
            target = STDLIB[name.split(".", 1)[1]]
            if target is None:
                raise SemanticError(
                    f"{callee.text} is in the standard library but not yet available as an "
                    "operation in graph functions",
                    node.span,
                )
            name = target
        if name == "tile.context":
            if args or keywords:
                raise SemanticError("tile.context() takes no arguments", node.span)
            if self.function is None or self.function.kind != "tile":
                raise SemanticError("tile.context() can only be called in a tile kernel", node.span)
            return TileContext()
        if name in ("float", "int"):
            return self._convert(name, node, args, keywords)
        if name == "len":
            return self._length(node, args, keywords)
        if name in ("dict",):
            if args:
                raise SemanticError("dict() takes keyword arguments only here", node.span)
            bad = next((k for k in keywords if not isinstance(k[1].value, Const)), None)
            if bad is not None:
                raise SemanticError(
                    f"dict values must be constants, not {describe(bad[1].value)}", bad[1].span
                )
            return Const({k: e.value.value for k, e, _ in keywords})
        if name in ("range", "device", "prefetch"):
            raise SemanticError(
                f"{name}() can only be used in a "
                f"'{'for' if name == 'range' else 'with'}' statement",
                node.span,
            )
        if name == "kvcache.append":
            return self._append(node, ref.receiver, args, keywords)
        if name.startswith("torch."):
            return self._torch_method(name.split(".", 1)[1], ref.receiver, node, args, keywords)
        if name in SPLITS:
            operands = [ref.receiver, *args] if isinstance(ref.receiver, Ev) else args
            return split_parts(self, name, operands, keywords, node.span, callee.text)
        if isinstance(ref.receiver, Ev):  # x.to(dtype), x.sum(axis=0): x is the operand
            if name in ("cast", "tile.cast", "reshape") and len(args) + len(keywords) != 1:
                usage = (
                    f'the new dims: {callee.text}("S", "C")'
                    if name == "reshape"
                    else f"one argument, the dtype: {callee.text}(bf16)"
                )
                raise SemanticError(f"{callee.text} takes {usage}", node.span)
            slots = [p.name for p in GRAPH_OPS[name].params if not p.keyword_only][1:]
            if len(args) > len(slots):  # counted without the receiver, as Python does
                raise SemanticError(
                    f"{callee.text} takes {len(slots)} positional argument"
                    f"{'s' if len(slots) != 1 else ''} ({', '.join(slots) or 'none'}), "
                    f"{len(args)} given",
                    args[len(slots)].span,
                )
            args = [ref.receiver, *args]
        spec = GRAPH_OPS[name]
        if state is not None:
            if name != "fused_adam":
                raise SemanticError(
                    f"{callee.text} takes tensors; an OptimizerState is updated by fused_adam, "
                    "and its tensors are state.m, state.v (and state.master)",
                    state.span,
                )
            self.function.check_level(spec, node.span, callee.text)
            updated = adam_on_state(self, spec, args, keywords, node.span, callee.text)
            self.function.donated[id(state.value)] = (state.value, node.span)
            return updated
        result = self.call_op(spec, args, keywords, node.span, callee.text)
        if isinstance(ref.receiver, ScheduleValue) and isinstance(result, Value):
            self.function.attach(result, ("schedule", ref.receiver.spec))
        return result

    def _reordered(self, node: ast.Call, callee: Ev) -> Any:
        """``x.permute(...)`` and ``x.transpose(...)`` as ``transpose(x, axes)``. PyTorch's
        ``permute`` and NumPy's ``transpose`` take the whole permutation, as a tuple or
        one axis per argument; two axes given to ``transpose`` are PyTorch's swap of
        those axes (NumPy's reading of two is the same swap on a matrix, or an error)."""
        x: Ev = callee.value.receiver
        method = callee.text.rsplit(".", 1)[-1]
        if node.keywords:
            raise SemanticError(f"{callee.text}() takes the axes only", node.keywords[0].span)
        args = [self.eval(a) for a in node.args]
        if any(isinstance(a.value, Poison) for a in args):
            return POISON
        raw = [a.value.value if isinstance(a.value, Const) else None for a in args]
        axes = tuple(raw[0]) if len(raw) == 1 and isinstance(raw[0], (tuple, list)) else raw
        rank = x.value.type.rank
        if any(not isinstance(a, int) or isinstance(a, bool) for a in axes) or not axes:
            raise SemanticError(
                f"{callee.text}() takes axes known at compile time, such as "
                f"{callee.text}({', '.join(str(i) for i in reversed(range(max(rank, 2))))})",
                node.span,
            )
        if method == "transpose" and len(args) == 2:  # PyTorch's swap of two axes
            order = list(range(rank))
            a, b = (i % rank if -rank <= i < rank else i for i in axes)
            if not (0 <= a < rank and 0 <= b < rank):
                raise SemanticError(
                    f"{callee.text}(): axes out of range for rank {rank}", node.span
                )
            order[a], order[b] = order[b], order[a]
            axes = tuple(order)
        permutation = Ev(Const(tuple(axes)), node.span, "axes")
        return self.call_op(GRAPH_OPS["transpose"], [x, permutation], [], node.span, callee.text)

    def call_op(self, spec: OpSpec, args: list[Ev], keywords: list, span: Span, shown: str) -> Any:
        if self.function is None:
            number = folded(spec.name, args[0].value) if len(args) == 1 and not keywords else None
            if isinstance(number, str):
                raise SemanticError(number, span)
            if number is not None:  # SCALE = rsqrt(64.0)
                return number
            raise SemanticError(
                f"{shown} computes a run-time value; top-level values must be known at "
                "compile time",
                span,
            )
        self.function.check_level(spec, span, shown)
        if spec.name == "flash_attention" and any(_is_cache(e.value) for e in args):
            return self._attend(args, keywords, span, shown)
        bound = bind(spec, args, keywords, span, shown)
        if any(isinstance(e.value, Poison) for e in bound.values()):
            return POISON
        if spec.name not in _READ_MASKS:
            mask = next((e for e in bound.values() if is_mask(e.value)), None)
            if mask is not None:
                tile = "tile." if spec.name.startswith("tile.") else ""  # a tile kernel's
                raise SemanticError(
                    f"{shown}: {mask.text} is a mask (a comparison), which only {tile}where() "
                    f"and {tile}cast() read: {tile}where({mask.text}, a, b) picks a or b, and "
                    f"{tile}cast({mask.text}, f32) makes it 1.0 and 0.0",
                    mask.span,
                )
        return spec.rule(OpCall(spec, bound, span, self.function, shown))

    def _convert(self, name: str, node: ast.Call, args: list[Ev], keywords: list) -> Any:
        if len(args) != 1 or keywords:
            raise SemanticError(f"{name}() takes one argument", node.span)
        v = args[0].value
        if name == "float" and isinstance(v, Const) and isinstance(v.value, str):
            try:  # Python's float("-inf"), float("nan"), float("1e-5")
                return Const(float(v.value))
            except ValueError:
                raise SemanticError(f"float({v.value!r}) is not a number", node.span) from None
        if is_number(v):
            try:
                return Const(float(v.value) if name == "float" else int(v.value))
            except (OverflowError, ValueError):
                shown = str(v.value) if len(str(v.value)) <= 20 else str(v.value)[:17] + "..."
                raise SemanticError(f"{name}({shown}) is not a finite number", node.span) from None
        if isinstance(v, DimValue):
            return v if name == "int" else self._dim_as_float(v, node.span, print_expr(node))
        if name == "float" and isinstance(v, Value) and v.type == ScalarType("int"):
            return self._widened(v, node.span)
        raise SemanticError(
            f"{name}() takes a number, a size{' or an int' if name == 'float' else ''}, "
            f"not {describe(v)}",
            args[0].span,
        )

    def _length(self, node: ast.Call, args: list[Ev], keywords: list) -> Any:
        """``len(x)``: a tensor's first size, as Python's ``len`` of an array is; the
        number of items of a shape, tuple or list."""
        if len(args) != 1 or keywords:
            raise SemanticError("len() takes one argument", node.span)
        v = args[0].value
        if isinstance(v, Value) and isinstance(v.type, TensorType) and v.type.rank:
            return DimValue(v.type.dims[0])
        if isinstance(v, ShapeValue):
            return Const(len(v.dims))
        if isinstance(v, (tuple, list)) or (
            isinstance(v, Const) and isinstance(v.value, (tuple, list, str))
        ):
            return Const(len(v.value if isinstance(v, Const) else v))
        raise SemanticError(f"len() of {describe(v)}", args[0].span)

    def _torch_method(
        self, name: str, x: Ev, node: ast.Call, args: list[Ev], keywords: list
    ) -> Any:
        """PyTorch's tensor methods that are another op here: ``x.float()`` is
        ``x.to(f32)``, ``x.t()`` a matrix's transpose, ``x.matmul(w)`` ``x @ w``,
        ``x.size(i)`` ``x.shape[i]``, ``x.masked_fill(m, v)`` ``where(m, v, x)``,
        ``x.type_as(y)`` ``cast_like(x, y)``,
        ``x.contiguous()`` and ``x.clone()`` ``x`` (a graph value is laid out whole and
        never changed in place), and ``x.chunk(2, dim=-1)`` and ``x.split(64, dim=-1)``
        the parts of ``splits.py``."""
        shown = f"{x.text if x.text.isidentifier() else f'({x.text})'}.{name}"
        if name in ("chunk", "split"):
            kind = "chunk" if name == "chunk" else "split.method"
            return split_parts(self, kind, [x, *args], keywords, node.span, shown)
        if name == "size" and not keywords and len(args) <= 1:
            dims = x.value.type.dims
            if not args:
                return ShapeValue(dims)
            axis = args[0].value
            if not is_int(axis) or not -len(dims) <= axis.value < len(dims):
                raise SemanticError(
                    f"{shown}() takes an axis of a rank-{len(dims)} tensor", args[0].span
                )
            return DimValue(dims[axis.value])
        if name == "masked_fill" and len(args) == 2 and not keywords:
            return self.call_op(GRAPH_OPS["where"], [args[0], args[1], x], [], node.span, shown)
        wanted = {"matmul": 1, "mm": 1, "size": 1, "masked_fill": 2, "type_as": 1}.get(name, 0)
        if len(args) != wanted or keywords:
            what = {0: "no arguments", 2: "a mask and a value"}.get(wanted, "one argument")
            raise SemanticError(f"{shown}() takes {what}", node.span)
        if name in ("contiguous", "clone"):
            return x.value
        if name in ("matmul", "mm"):
            return self.call_op(GRAPH_OPS["matmul"], [x, args[0]], [], node.span, shown)
        if name == "type_as":
            return self.call_op(GRAPH_OPS["cast_like"], [x, args[0]], [], node.span, shown)
        if name == "t":
            if x.value.type.rank > 2:
                raise SemanticError(
                    f"{shown}() transposes a matrix (PyTorch's rule); {x.text} has rank "
                    f"{x.value.type.rank}: write x.transpose(-2, -1) or x.mT",
                    node.span,
                )
            return self.call_op(GRAPH_OPS["transpose"], [x], [], node.span, shown)
        dtype = Ev(DTypeRef(DTYPES[_TORCH_METHODS[name]]), node.span, _TORCH_METHODS[name])
        return self.call_op(GRAPH_OPS["cast"], [x, dtype], [], node.span, shown)

    def _attend(self, args: list[Ev], keywords: list, span: Span, shown: str) -> Any:
        """``flash_attention(q, cache, causal=..., scale=...)``: attention of ``q`` over
        the keys and values the cache holds (``graph.kvattend``)."""
        if len(args) != 2 or not _is_cache(args[1].value):
            raise SemanticError(
                f"{shown} over a KVCache takes the queries and the cache: {shown}(q, cache, "
                "causal=True)",
                span,
            )
        given = {name: ev for name, ev, _ in keywords}
        for name, _, where in keywords:
            if name not in ("causal", "scale", "dropout"):
                raise SemanticError(f"{shown} has no parameter '{name}'", where)
        causal = given.get("causal")
        if causal is not None and not (isinstance(causal.value, Const)
                                       and isinstance(causal.value.value, bool)):  # fmt: skip
            raise SemanticError(f"{shown}: causal must be True or False", causal.span)
        dropout = given.get("dropout")
        if dropout is not None and not (is_number(dropout.value) and dropout.value.value == 0):
            raise SemanticError(
                f"{shown} over a KVCache attends without dropout: a decoding step has none",
                dropout.span,
            )
        (q, cache), scale = args, given.get("scale")
        if isinstance(q.value, Poison):
            return POISON
        if scale is not None and not is_number(scale.value):
            raise SemanticError(f"{shown}: scale over a KVCache must be a number", scale.span)
        check_attend(q.value.type if isinstance(q.value, Value) else None, cache.value.type,
                     (q.span, cache.span), q.text)  # fmt: skip
        number = (
            float(scale.value.value) if scale is not None
            else default_scale(cache.value.type.dims[3], span)
        )  # fmt: skip
        call = AttendCall(q.value.type, cache.value.type,
                          bool(causal.value.value) if causal else False, number)  # fmt: skip
        emitter = self._runtime(span)
        param, appended = cache_param((op for b in emitter.blocks for op in b), cache.value)
        for guard in length_guards(call, param.name, appended, span):
            if all((g.tensor, g.left, g.right) != (guard.tensor, guard.left, guard.right)
                   for g in emitter.guards):  # fmt: skip
                emitter.guards.append(guard)
        read = (cache.value,)
        (k,) = emitter.emit("kvcache.k", read, (call.split_type(),), (), (), span)
        (v,) = emitter.emit("kvcache.v", read, (call.split_type(),), (), (), span)
        (seen,) = emitter.emit("kvcache.visible", read, (call.seen_type(),), call.attrs(), (),
                               span)  # fmt: skip
        values = [q, Ev(k, cache.span, "k"), Ev(v, cache.span, "v"), Ev(seen, span, "seen")]
        return self.function.call_library(library_module(call), values, span)

    def _append(self, node: ast.Call, cache: Value, args: list[Ev], keywords: list) -> Value:
        spec = OpSpec("append", (), lambda c: None, "graph")
        self.function.check_level(spec, node.span, "KVCache.append")
        if len(args) != 2 or keywords:
            raise SemanticError("KVCache.append takes two tensors, k and v", node.span)
        for ev in args:
            if not isinstance(ev.value, Value) or not isinstance(ev.value.type, TensorType):
                raise SemanticError(
                    f"KVCache.append: {ev.text} must be a tensor, not {describe(ev.value)}", ev.span
                )
        check_append(cache.type, [(e.text, e.value.type, e.span) for e in args])
        emitter = self._runtime(node.span)
        operands = (cache, args[0].value, args[1].value)
        (written,) = emitter.emit(
            "kvcache.append", operands, (cache.type,), (), ("state",), node.span
        )
        # its arrays now hold the appended positions: the cache it was is not read again
        self.function.donated[id(cache)] = (cache, node.span)
        # the lengths grow in a launch of their own, after every program of the append
        # has read them (``tile.kvcache``)
        n = args[0].value.type.dims[2]
        (grown,) = emitter.emit(
            "kvcache.advance", (written,), (cache.type,), (("n", n),), ("state",), node.span
        )
        window, s_max = rolling_window(cache.type), cache.type.dims[2]
        if window is not None:  # the ring's slots are the cache's first W, each written once
            emitter.guard("at_most", Dim.const(window), s_max,
                          "KVCache.append: the rolling window fits S_max", node.span)  # fmt: skip
            emitter.guard("at_most", n, Dim.const(window),
                          "KVCache.append: one append adds at most the window's positions",
                          node.span)  # fmt: skip
        else:
            param, appended = cache_param((op for b in emitter.blocks for op in b), grown)
            guard = room_guard(param, appended, node.span)
            if all((g.tensor, g.right) != (guard.tensor, guard.right) for g in emitter.guards):
                emitter.guards.append(guard)
        return grown

    def _schedule(self, node: ast.Call, ref: OpRef) -> ScheduleValue:
        """``Schedule(...)`` or a method of a schedule: a new, checked schedule value."""
        if ref.name == "Schedule":
            for keyword in node.keywords:
                if keyword.name not in SCHEDULE_ARGS:
                    raise SemanticError(
                        f"Schedule has no parameter '{keyword.name}'"
                        f"{did_you_mean(keyword.name, SCHEDULE_ARGS)}",
                        keyword.span,
                    )
        args = [self._schedule_arg(a) for a in node.args]
        keywords = {k.name: self._schedule_arg(k.value) for k in node.keywords}
        base = ref.receiver.spec if isinstance(ref.receiver, ScheduleValue) else ScheduleSpec()
        method = ref.name.removeprefix("schedule.")
        try:
            return ScheduleValue(apply_method(base, method, args, keywords))
        except ValueError as exc:
            raise SemanticError(str(exc), node.span) from None

    def _schedule_arg(self, node: ast.Expr) -> Any:
        value = self.eval(node).value
        if isinstance(value, DimValue) and value.dim.constant is not None:
            return value.dim.constant
        if not isinstance(value, Const):
            raise SemanticError(
                f"schedule arguments are constants, not {describe(value)}", node.span
            )
        return value.value

    # -- emission ----------------------------------------------------------------

    def _runtime(self, span: Span) -> Any:
        """The function analyser that emits IR; top-level values have none."""
        if self.function is None:
            raise SemanticError("top-level values must be known at compile time", span)
        return self.function

    def declaration_note(self, ev: Ev) -> tuple[Note, ...]:
        return self.function.declaration_note(ev) if self.function is not None else ()


#: Integer powers beyond this are almost surely a mistake, and slow to compute.
_MAX_EXPONENT = 1024


def _fold(node: ast.BinOp, a: float, b: float) -> float:
    """Compile-time arithmetic on two numbers, with errors a user can act on."""
    if node.op == "@":
        raise SemanticError("'@' multiplies matrices, not numbers", node.span)
    if node.op == "**" and isinstance(a, int) and isinstance(b, int) and abs(b) > _MAX_EXPONENT:
        raise SemanticError(f"the exponent {b} is too large for a compile-time number", node.span)
    try:
        result = _FOLD[node.op](a, b)
    except ZeroDivisionError:
        raise SemanticError("division by zero", node.span) from None
    except OverflowError:
        raise SemanticError("the result is too large for a number", node.span) from None
    if isinstance(result, complex):
        raise SemanticError("the result is not a real number", node.span)
    return result


class TileContext:
    """The value of ``tile.context()``; its attributes are the tile sizes."""


def is_number(v: Any) -> bool:
    value = getattr(v, "value", None)
    return isinstance(v, Const) and isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(v: Any) -> bool:
    return isinstance(v, Const) and isinstance(v.value, int) and not isinstance(v.value, bool)


def _refuse_run_time_size(node: ast.BinOp, left: Ev, right: Ev) -> None:
    """``E // k`` with ``k`` an int the function computes (``k = heads * 2``): a size no
    shape can have, since only an int parameter gives a size its value at the call; the
    error says how to give it."""
    size, other = (left, right) if isinstance(left.value, DimValue) else (right, left)
    v = other.value
    if isinstance(v, Value) and isinstance(v.type, ScalarType) and v.type.kind == "int":
        raise SemanticError(
            f"{print_expr(node)}: '{other.text}' is an int the function computes, which no "
            f"shape can have as a size; pass it as an int parameter (an int parameter is the "
            f"size of its name), give it at compile time (a top-level constant, HEADS = 4), "
            f"or write float({size.text}) to compute in floats",
            node.span,
        )


def _is_cache(value: Any) -> bool:
    return isinstance(value, Value) and isinstance(value.type, KVCacheType)
