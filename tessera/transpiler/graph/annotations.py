"""Parameter and return annotations to types.

``Tensor["B", "S", 64, bf16 @accum(f32)]``: dims first (strings hold symbols
or expressions, integers are fixed sizes, bare names are symbols), then the
dtype with its policies. Each policy is checked against the dtype it is on.
"""

from __future__ import annotations

import dataclasses
import functools

from ..frontend import ast
from ..frontend.diagnostics import Diagnostics, Note, did_you_mean
from ..frontend.printer import print_expr
from ..frontend.source import SourceFile, Span
from .dims import Dim, DimSyntaxError, parse_dim
from .dtypes import ALIASES, DTYPES, DType, Policies, lookup_dtype, saturation_error
from .not_yet import NOT_YET, not_yet
from .opcall import SemanticError
from .types import (
    KVCacheType,
    OptimizerStateType,
    ScalarType,
    TensorType,
    TupleType,
    ValueType,
)

__all__ = [
    "resolve_type",
    "resolve_result",
    "type_expr",
    "typed_for_caller",
    "unimplemented_policies",
    "TENSOR_TYPES",
    "TYPE_NAMES",
]

#: Names that declare a tensor. KTile is the seeds' name for a tile kernel's tensor argument.
TENSOR_TYPES = ("Tensor", "KTile")
SCALAR_TYPES = ("int", "float", "bool")
#: The policies of each state type (after its brackets).
STATE_POLICIES = {
    "KVCache": ("rolling_window", "device", "paged", "checkpointable"),
    "OptimizerState": ("fp32_master", "device", "paged", "checkpointable"),
}
NUMERIC_POLICIES = ("accum", "stochastic_round", "loss_scale", "saturate")
TYPE_NAMES = (*TENSOR_TYPES, *STATE_POLICIES, "Tile", *SCALAR_TYPES)


def resolve_result(node: ast.TypeExpr, defines: dict[str, int]) -> ValueType | TupleType:
    """The type a result annotation declares: one type, or ``tuple[A, B, ...]`` (written
    ``(A, B, ...)`` too) for a function that returns several values."""
    if node.name != "tuple":
        return resolve_type(node, defines)
    items = node.args or ()
    if node.policies or len(items) < 2 or not all(isinstance(a, ast.TypeExpr) for a in items):
        raise SemanticError(
            "a tuple result lists the type of each returned value, two or more: "
            'tuple[Tensor["N", f32], Tensor["N", f32]]',
            node.span,
        )
    return TupleType(tuple(resolve_type(a, defines) for a in items))


def resolve_type(node: ast.TypeExpr, defines: dict[str, int]) -> ValueType:
    """The type an annotation declares; raises ``SemanticError`` at the bad part."""
    if node.name == "tuple":
        raise SemanticError(
            "tuple[...] is a function's result type only: a parameter takes one tensor or "
            "scalar",
            node.span,
        )
    if node.name in SCALAR_TYPES:
        _no_args(node)
        return ScalarType(node.name)
    if node.name in TENSOR_TYPES:
        # @shard(...) places the tensor on a mesh (graph/mesh.py); it is no numerics policy
        misplaced = [p for p in node.policies if p.name != "shard"]
        if misplaced:
            policy = misplaced[0]
            args = ", ".join(print_expr(a) for a in policy.args)
            text = f"@{policy.name}" + (f"({args})" if args else "")
            raise SemanticError(
                f"numerics policies belong on the dtype: write {node.name}[..., bf16 {text}]",
                policy.span,
            )
        dims, dtype, policies = _tensor_args(node, defines)
        return TensorType(dims, dtype, policies)
    if node.name == "KVCache":
        return _kvcache(node, defines)
    if node.name == "OptimizerState":
        return _optimizer_state(node)
    if node.name == "Tile":
        raise SemanticError(
            "'Tile' parameters (tile helper functions) are not supported yet; "
            "take a Tensor and call tile.load in a tile kernel",
            node.span,
        )
    if lookup_dtype(node.name) is not None:
        raise SemanticError(
            f"'{node.name}' is a dtype, not a type: write Tensor[..., {node.name}] for a "
            f"tensor, or {'float' if lookup_dtype(node.name).is_float else 'int'} for a scalar",
            node.span,
        )
    raise SemanticError(
        f"unknown type '{node.name}'{did_you_mean(node.name, TYPE_NAMES)}", node.span
    )


def unimplemented_policies(node: ast.TypeExpr) -> list[tuple[str, Span]]:
    """A warning, at its policy, for each policy of a resolved type that does nothing
    yet (``not_yet``): the dtype's numerics policies, a cache's state policies; in each
    type of a tuple result."""
    if node.name == "tuple":
        return [w for a in node.args or () if isinstance(a, ast.TypeExpr)
                for w in unimplemented_policies(a)]  # fmt: skip
    dtype = node.args[-1] if node.args else None
    policies = (*node.policies, *(dtype.policies if isinstance(dtype, ast.TypeExpr) else ()))
    found = []
    for policy in policies:
        args = f"({', '.join(map(print_expr, policy.args))})" if policy.name == "accum" else ""
        feature = f"@{policy.name}{args}"
        if feature in NOT_YET:
            found.append((not_yet(feature), policy.span))
    return found


def _no_args(node: ast.TypeExpr) -> None:
    if node.args is not None or node.policies:
        raise SemanticError(f"'{node.name}' takes no arguments or policies", node.span)


_INDICES = (
    "integer tensors are i32, i8 or i4, and indices and labels are i32 (pass numpy int32 "
    "arrays, x.astype(np.int32), or torch.int32 tensors, t.int())"
)
_DOUBLES = "tensors are at most f32 (pass numpy float32 arrays, or torch.float32 tensors)"
#: numpy's and PyTorch's dtypes that no tensor here has, and what to use instead.
_UNSUPPORTED_DTYPES = {
    **dict.fromkeys(("i64", "int64", "long", "i16", "int16", "u8", "uint8", "short"), _INDICES),
    **dict.fromkeys(("f64", "float64", "double", "fp64"), _DOUBLES),
}


def _tensor_args(
    node: ast.TypeExpr, defines: dict[str, int]
) -> tuple[tuple[Dim, ...], DType, Policies]:
    args = node.args or ()
    last = args[-1] if args else None
    if not isinstance(last, ast.TypeExpr) or lookup_dtype(last.name) is None:
        where = last.span if last is not None else node.span
        hint = ""
        if isinstance(last, ast.TypeExpr) and last.args is None:
            if last.name in _UNSUPPORTED_DTYPES:
                raise SemanticError(
                    f"{last.name} is not a dtype here: {_UNSUPPORTED_DTYPES[last.name]}", where
                )
            hint = did_you_mean(last.name, (*DTYPES, *ALIASES))
            if hint:
                raise SemanticError(f"unknown dtype '{last.name}'{hint}", where)
        raise SemanticError(
            f"{node.name}[...] needs a dtype as its last argument, "
            f'as in {node.name}["N", f32]{hint}',
            where,
        )
    if last.args is not None:
        raise SemanticError(f"the dtype '{last.name}' takes no [...]", last.span)
    dtype = lookup_dtype(last.name)
    assert dtype is not None
    dims = tuple(_dim(arg, defines) for arg in args[:-1])
    if dtype.name == "i4":
        _packed(node, dims)
    return dims, dtype, _policies(last, dtype)


def _packed(node: ast.TypeExpr, dims: tuple[Dim, ...]) -> None:
    """An i4 tensor holds two elements in each byte of its last dim, so that dim must
    exist and, where it is known, be even (a symbolic one is checked at the call)."""
    if not dims:
        raise SemanticError("an i4 tensor packs its last dim two to a byte: it needs one",
                            node.span)  # fmt: skip
    last = dims[-1]
    if last.constant is not None and last.constant % 2:
        raise SemanticError(
            f"an i4 tensor packs its last dim two to a byte: it must be even, not {last}",
            node.args[-2].span,
        )


def _dim(arg: ast.TypeExpr | ast.StrLit | ast.IntLit, defines: dict[str, int]) -> Dim:
    """The dim, its ``-D`` symbols replaced by their values; each of its coefficients
    is a 64-bit integer in the generated code, so one that does not fit (``"4*N"`` with
    ``-D N=4611686018427387904``) is an error here."""
    dim = _resolved_dim(arg, defines)
    if any(max(abs(c.numerator), c.denominator) > ast.INT64_MAX for _, c in dim.terms):
        raise SemanticError(
            f"this dim is {dim}, more than a 64-bit size holds (at most {ast.INT64_MAX})",
            arg.span,
        )
    return dim


def _resolved_dim(arg: ast.TypeExpr | ast.StrLit | ast.IntLit, defines: dict[str, int]) -> Dim:
    if isinstance(arg, ast.IntLit):
        if arg.value <= 0:
            raise SemanticError(f"a dim must be positive, not {arg.value}", arg.span)
        return Dim.const(arg.value)
    if isinstance(arg, ast.StrLit):
        try:
            dim = parse_dim(arg.value).substitute(defines)
        except DimSyntaxError as exc:
            raise SemanticError(
                f'bad dim "{arg.value}": {exc.message}', _inside(arg, exc.offset)
            ) from None
        if dim.constant is not None and dim.constant <= 0:
            raise SemanticError(
                f'a dim must be positive: "{arg.value}" is {dim.constant}', arg.span
            )
        return dim
    if lookup_dtype(arg.name) is not None:
        raise SemanticError(f"the dtype '{arg.name}' must be the last argument", arg.span)
    if arg.args is not None or arg.policies:
        raise SemanticError(f"'{arg.name}[...]' is not a dim", arg.span)
    return Dim.sym(arg.name).substitute(defines)


def _inside(literal: ast.StrLit, offset: int) -> Span:
    """The span of one character inside a string literal (after its opening quote)."""
    span = literal.span
    column = span.column + 1 + offset
    if span.end_line != span.line or column >= span.end_column:
        return span
    return Span(span.source, span.line, column, span.line, column + 1)


def _policies(node: ast.TypeExpr, dtype: DType) -> Policies:
    seen: dict[str, ast.Policy] = {}
    accum = None
    stochastic = False
    seed: int | str = 0
    loss_scale = None
    saturate = False
    for policy in node.policies:
        if policy.name in seen:
            raise SemanticError(
                f"@{policy.name} is given twice",
                policy.span,
                (Note("first given here", seen[policy.name].span),),
            )
        seen[policy.name] = policy
        if policy.name == "accum":
            accum = _accum(policy, dtype)
        elif policy.name == "stochastic_round":
            seed = _seed(policy)
            if not dtype.is_float or dtype.bits > 16:
                raise SemanticError(
                    f"@stochastic_round applies to bf16, f16 and fp8 values, not {dtype}: "
                    f"{dtype} results are already rounded to nearest",
                    policy.span,
                )
            stochastic = True
        elif policy.name == "loss_scale":
            loss_scale = _loss_scale(policy, dtype)
        elif policy.name == "saturate":
            _flag(policy)
            why = saturation_error(dtype)
            if why is not None:
                raise SemanticError(why, policy.span)
            saturate = True
        else:
            raise SemanticError(
                f"unknown numerics policy '@{policy.name}'"
                f"{did_you_mean(policy.name, NUMERIC_POLICIES)}",
                policy.span,
                (Note("numerics policies: @accum(f32|bf16|f16), @stochastic_round, "
                      "@loss_scale(k), @saturate"),),
            )  # fmt: skip
    span = seen["stochastic_round"].span if stochastic else None
    return Policies(accum, stochastic, seed, span, loss_scale, saturate)


def _seed(policy: ast.Policy) -> int | str:
    """The key of ``@stochastic_round(seed=...)``: a number, or the name of an ``int``
    parameter (a step counter), which semantic analysis checks; 0 when none is given."""
    args = [*policy.args, *(k.value for k in policy.keywords if k.name == "seed")]
    if not policy.args and not policy.keywords:
        return 0
    if len(args) == 1 and len(policy.args) + len(policy.keywords) == 1:
        arg = args[0]
        if isinstance(arg, ast.IntLit):
            return arg.value
        if isinstance(arg, ast.Name):
            return arg.id
    raise SemanticError(
        "@stochastic_round takes one seed, a number or an int parameter: "
        "@stochastic_round(seed=step)",
        policy.span,
    )


def _flag(policy: ast.Policy) -> None:
    if policy.args or policy.keywords:
        raise SemanticError(f"@{policy.name} takes no arguments", policy.span)


def _accum(policy: ast.Policy, dtype: DType) -> DType:
    arg = policy.args[0] if len(policy.args) == 1 and not policy.keywords else None
    target = lookup_dtype(arg.id) if isinstance(arg, ast.Name) else None
    if target is None or target.name not in ("f32", "bf16", "f16"):
        raise SemanticError("@accum takes one dtype, f32, bf16 or f16: @accum(f32)", policy.span)
    if not dtype.is_float:
        raise SemanticError(
            f"@accum applies to floating-point dtypes; {dtype} always accumulates in i32",
            policy.span,
        )
    if target.mantissa < dtype.mantissa:
        raise SemanticError(
            f"@accum({target}) on {dtype} would accumulate in less precision than the "
            f"inputs have; use @accum(f32)",
            policy.span,
        )
    if target.bits == 16 and dtype != target and dtype.bits != 8:
        raise SemanticError(
            f"@accum({target}) applies to {target} and fp8 values, not {dtype}: " "use @accum(f32)",
            policy.span,
        )
    return target


def _loss_scale(policy: ast.Policy, dtype: DType) -> float:
    arg = policy.args[0] if len(policy.args) == 1 and not policy.keywords else None
    value: float | None = None
    if isinstance(arg, ast.FloatLit) or (isinstance(arg, ast.IntLit) and arg.value < 2**1000):
        value = float(arg.value)
    if value is None or not value > 0:
        raise SemanticError("@loss_scale takes one positive number: @loss_scale(1024)", policy.span)
    if not dtype.is_float:
        raise SemanticError(
            f"@loss_scale applies to floating-point dtypes, not {dtype}", policy.span
        )
    return value


def _state_policies(node: ast.TypeExpr) -> tuple[str, ...]:
    """A state type's policies as text (``@rolling_window(8)``), each checked to be one of
    its type's: ``@fp32_master`` on a cache, or a misspelled one, is an error at it."""
    known = STATE_POLICIES[node.name]
    policies = []
    for policy in node.policies:
        if policy.name not in known:
            other = next((n for n, p in STATE_POLICIES.items() if policy.name in p), None)
            hint = f": it is a policy of {other}" if other else did_you_mean(policy.name, known)
            raise SemanticError(f"unknown {node.name} policy '@{policy.name}'{hint}", policy.span)
        text = "@" + policy.name
        if policy.args:
            if policy.name == "fp32_master":
                raise SemanticError("@fp32_master takes no arguments", policy.span)
            text += "(" + ", ".join(_arg_text(a) for a in policy.args) + ")"
        policies.append(text)
    return tuple(policies)


def _optimizer_state(node: ast.TypeExpr) -> OptimizerStateType:
    """``OptimizerState[w] @fp32_master``: the state of the parameter ``w``, bound to its
    type by the function's analysis (``graph.optstate.bind``)."""
    policies = _state_policies(node)
    args = node.args or ()
    named = len(args) == 1 and (
        isinstance(args[0], ast.StrLit)
        or (isinstance(args[0], ast.TypeExpr) and args[0].args is None and not args[0].policies)
    )
    if not named:
        raise SemanticError(
            "OptimizerState takes the name of the parameter it belongs to: "
            "OptimizerState[w] @fp32_master",
            args[1].span if len(args) > 1 else node.span,
        )
    arg = args[0]
    param = arg.value if isinstance(arg, ast.StrLit) else arg.name
    return OptimizerStateType(param, "@fp32_master" in policies, policies)


def _kvcache(node: ast.TypeExpr, defines: dict[str, int]) -> KVCacheType:
    policies = _state_policies(node)
    if node.args is None:
        return KVCacheType(None, None, policies)
    dims, dtype, _ = _tensor_args(node, defines)
    if len(dims) != 4:
        raise SemanticError(
            f'KVCache takes four dims and a dtype, KVCache["B", "H", "S_max", "D_h", bf16]; '
            f"got {len(dims)} dims",
            node.span,
        )
    return KVCacheType(dims, dtype, policies)


def _arg_text(arg: ast.Expr) -> str:
    if isinstance(arg, ast.Name):
        return arg.id
    if isinstance(arg, (ast.IntLit, ast.FloatLit)):
        return str(arg.value)
    if isinstance(arg, ast.StrLit):
        return f'"{arg.value}"'
    raise SemanticError("policy arguments are names or numbers", arg.span)


#: The largest size that generated code declares as a named constant (a C ``int``).
_INT_MAX = 2**31 - 1


class FixedSizes:
    """The sizes that a kernel declares alone in a dim (``K`` of ``Tensor["M", "K"]``)
    and its caller gives as one number everywhere (``Tensor["T", 256]``): the kernel,
    typed for the caller, keeps their names. Its parameters are typed with the name where
    the number stands (``respelled``), and ``defines`` gives each name its number spelled
    as the name (``Dim.spelled``), so that the analysed kernel's dims are the numbers, to
    every pass, and generated code can print ``K`` for 256 where a dim is that size."""

    def __init__(self, pairs: list[tuple[ValueType, ValueType]], taken: frozenset[str]) -> None:
        """``pairs`` are each parameter's (or result's) declared type and the type the
        caller gives it; ``taken`` are the caller's sizes, whose names none may have."""
        values: dict[str, set[int | None]] = {}
        for declared, given in pairs:
            for want, have in _aligned(declared, given):
                if want.symbol is not None:
                    values.setdefault(want.symbol, set()).add(have.constant)
        self.values = {
            name: value
            for name, (value,) in ((n, tuple(v)) for n, v in values.items() if len(v) == 1)
            if value is not None and 1 < value <= _INT_MAX
            and name not in taken and not name.startswith("T.")
        }  # fmt: skip

    def respelled(self, declared: ValueType, given: TensorType) -> TensorType:
        """``given`` with the fixed sizes' names where ``declared`` has them: a size
        alone (``K``), or a dim made of them only (``D/2``) that is the given number."""
        aligned = _aligned(declared, given)
        if not aligned:
            return given
        spelled = [
            want if want.symbols() and want.symbols() <= self.values.keys()
            and want.substitute(self.values) == have else have
            for want, have in aligned
        ]  # fmt: skip
        return given.with_(dims=(*given.dims[: given.rank - len(spelled)], *spelled))

    @property
    def defines(self) -> dict[str, Dim]:
        return {name: Dim.named(value, Dim.sym(name)) for name, value in self.values.items()}


def typed_for_caller(
    node: ast.FunctionDef, declared: dict[str, ValueType], declared_results: tuple[ValueType, ...],
    typed: dict[str, TensorType], results: tuple[TensorType, ...], sizes: frozenset[str],
) -> tuple[ast.FunctionDef, dict[str, Dim]]:  # fmt: skip
    """A kernel ``node`` (a library kernel, or a tile kernel of the file that a graph
    function calls) with its tensor parameters typed as ``typed`` gives them and its
    results as ``results``; ``declared`` and ``declared_results`` are their types as the
    kernel declares them, and ``sizes`` the caller's. The sizes that the caller fixes
    keep the kernel's names (``FixedSizes``), whose definitions come back beside it."""
    paired = (
        list(zip(declared_results, results, strict=True))
        if len(declared_results) == len(results)
        else []
    )
    fixed = FixedSizes([*((declared[n], t) for n, t in typed.items()), *paired], sizes)
    if paired:
        results = tuple(fixed.respelled(d, t) for d, t in paired)
    params = tuple(
        dataclasses.replace(p, annotation=type_expr(fixed.respelled(declared[p.name],
                                                                    typed[p.name])))
        if p.name in typed else p
        for p in node.params
    )  # fmt: skip
    retyped = dataclasses.replace(node, params=params, returns=result_expr(results))
    return retyped, fixed.defines


def _aligned(declared: ValueType, given: ValueType) -> list[tuple[Dim, Dim]]:
    """The declared dims of a tensor, each with the given dim in its place: the last
    ones, as a kernel's grid takes leading batch dims it does not declare."""
    if not (isinstance(declared, TensorType) and isinstance(given, TensorType)):
        return []
    if declared.rank > given.rank:
        return []
    return list(zip(declared.dims, given.dims[given.rank - declared.rank :], strict=True))


def type_expr(t: TensorType) -> ast.TypeExpr:
    """The annotation that spells ``t``, as a user would have written it."""
    if str(t.policies):
        return _annotation(_spelled(t))
    span = _span(_spelled(t))
    dims = tuple(ast.StrLit(str(d), span=span) for d in t.dims)
    return ast.TypeExpr("Tensor", (*dims, ast.TypeExpr(t.dtype.name, None, span=span)), span=span)


def result_expr(results: tuple[TensorType, ...]) -> ast.TypeExpr:
    """The result annotation of a function that returns ``results``: the one type, or
    ``tuple[...]`` of several (a library kernel of two results, ``attention_dkdv``)."""
    if len(results) == 1:
        return type_expr(results[0])
    spelling = "tuple[" + ", ".join(_spelled(t) for t in results) + "]"
    return ast.TypeExpr("tuple", tuple(map(type_expr, results)), span=_span(spelling))


def _span(spelling: str) -> Span:
    """A span over the whole of ``spelling``, the text of an annotation the compiler
    writes. A type without policies is built, not parsed: the parser took about a
    millisecond for each, and a file instantiates tens of library kernels."""
    return Span(SourceFile("<type>", spelling), 1, 1, 1, len(spelling) + 1)


def _spelled(t: TensorType) -> str:
    dims = ", ".join(f'"{d}"' for d in t.dims)
    policies = f" {t.policies}" if str(t.policies) else ""
    return f"Tensor[{dims}, {t.dtype}{policies}]"


@functools.cache
def _annotation(spelling: str) -> ast.TypeExpr:
    """The annotation ``spelling``, parsed once a process: a group's operands and result
    often share their type, and the tree is never changed."""
    from ..frontend.parser import parse  # the parser's tables load where one is parsed

    diags = Diagnostics()
    module = parse(SourceFile("<type>", f"def f(x: {spelling}): ...\n"), diags)
    assert module is not None and not diags.items, f"cannot spell {spelling}"
    annotation = module.functions()[0].params[0].annotation
    assert annotation is not None
    return annotation
