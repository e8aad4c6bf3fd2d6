"""A function's own gradient rule (``@custom_vjp``, ``@custom_jvp``) and ``checkpoint``.

``@custom_vjp(F_bwd)`` on a graph function ``F`` says how to differentiate it: ``F_bwd``
takes ``F``'s positional parameters, one cotangent per result of ``F``, and ``F``'s
keyword-only parameters, and returns the cotangent of each floating-point tensor
parameter of ``F``. ``@custom_jvp(F_tangent)`` gives the tangents of ``F``'s results
from ``F``'s parameters and one tangent per floating-point tensor parameter; reverse mode
transposes it (it is linear in the tangents). The rule's signature is checked against
``F``'s where ``F`` is defined.

Each call of such an ``F`` (and ``F``'s own body, for ``F_vjp``) becomes a ``Region`` of
the backward pass, which runs the rule in place of the rules of ``F``'s ops. So does
each ``checkpoint(G)(...)``, whose rule runs ``G``'s body again and differentiates that
copy: the backward pass reads ``G``'s inputs, not the values inside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...frozen import frozen
from ..frontend import ast
from ..frontend.diagnostics import Note, did_you_mean
from .annotations import resolve_result, resolve_type
from .autodiff import CONSTANT_OPS, Cotangent, Region, adjoints, differentiable, filled
from .dims import Dim
from .ir import Op, Value
from .opcall import SemanticError
from .types import ScalarType, TensorType, dims_text, result_types
from .values import POISON, Ev, FunctionRef, Poison

if TYPE_CHECKING:
    from .sema import _FunctionAnalyzer

__all__ = ["CUSTOM_RULES", "CheckpointRef", "checkpoint_ref", "checkpointed", "custom_region",
           "custom_rule"]  # fmt: skip

#: The decorators that give a function's gradient rule.
CUSTOM_RULES = ("custom_vjp", "custom_jvp")


@frozen
class CustomRule:
    """``F``'s rule: ``"custom_vjp"`` or ``"custom_jvp"``, and the function that is it."""

    kind: str
    node: ast.FunctionDef


@frozen
class CheckpointRef:
    """``checkpoint(G)``: calling it runs ``G``, whose inner values the backward pass
    computes again instead of keeping."""

    node: ast.FunctionDef


def custom_rule(owner: Any, node: ast.FunctionDef) -> CustomRule | None:
    """``node``'s rule, checked against its signature, or None if it has none. A wrong
    rule raises ``SemanticError`` the first time it is asked for (where ``node`` is
    defined, or called first), and gives None after that."""
    checked = owner.custom_rules
    if node.name not in checked:
        try:
            checked[node.name] = _checked(owner, node)
        except SemanticError as exc:
            checked[node.name] = exc
            raise
    found = checked[node.name]
    return None if isinstance(found, SemanticError) else found


def _checked(owner: Any, node: ast.FunctionDef) -> CustomRule | None:
    decorators = [d for d in node.decorators if d.name in CUSTOM_RULES]
    if not decorators:
        return None
    decorator = decorators[0]
    if len(decorators) > 1:
        raise SemanticError(
            f"'{node.name}' has two gradient rules: give @custom_vjp or @custom_jvp, not both",
            decorators[1].span,
        )
    spelling = f"@{decorator.name}({node.name}_rule)"
    args = decorator.args or ()
    if len(args) != 1 or decorator.keywords or not isinstance(args[0], ast.Name):
        raise SemanticError(
            f"@{decorator.name} takes the function that is the rule, by name: {spelling}",
            decorator.span,
        )
    rule = owner.function_defs.get(args[0].id)
    if rule is None or rule is node:
        known = [n for n in owner.function_defs if n != node.name]
        raise SemanticError(
            f"@{decorator.name}: '{args[0].id}' is not another function of this file"
            f"{did_you_mean(args[0].id, known)}",
            args[0].span,
        )
    _Signature(owner, node, rule, decorator).check()
    return CustomRule(decorator.name, rule)


class _Signature:
    """A rule's parameters and result against the ones ``F``'s give it. A size may have
    another name in the rule (``"M"`` for ``F``'s ``"R"``), the same one throughout."""

    def __init__(
        self, owner: Any, node: ast.FunctionDef, rule: ast.FunctionDef, decorator: ast.Decorator
    ) -> None:
        self.defines = dict(owner.options.defines)
        self.node, self.rule, self.kind = node, rule, decorator.name
        self.note = Note(f"the rule of '{node.name}' is given here", decorator.span)
        self.thing = "cotangent" if self.kind == "custom_vjp" else "tangent"
        self.sizes: dict[str, Dim] = {}

    def check(self) -> None:
        node, rule = self.node, self.rule
        if node.returns is None or rule.returns is None:
            missing = node if node.returns is None else rule
            raise SemanticError(f"@{self.kind}: '{missing.name}' declares no result", missing.span)
        params = [(p, self._type(p)) for p in node.params]
        results = result_types(resolve_result(node.returns, self.defines))
        positional = [(p.name, t, p.span) for p, t in params if not p.keyword_only]
        floats = [(f"the {self.thing} of '{p.name}'", t, p.span) for p, t in params
                  if isinstance(t, TensorType) and t.dtype.is_float]  # fmt: skip
        outs = [(self._result(i, len(results)), t, node.returns.span)
                for i, t in enumerate(results)]  # fmt: skip
        added, gives = (outs, floats) if self.kind == "custom_vjp" else (floats, outs)
        keyword_only = [(p.name, t, p.span) for p, t in params if p.keyword_only]
        self._params(positional + added, keyword_only)
        self._results(gives)

    def _result(self, i: int, count: int) -> str:
        return f"the {self.thing} of the result" + ("" if count == 1 else f" {i}")

    def _type(self, p: ast.Param) -> Any:
        if p.annotation is None:
            return None  # reported with the parameter
        return resolve_type(p.annotation, self.defines)

    def _params(self, positional: list, keyword_only: list) -> None:
        rule = self.rule
        have = [p for p in rule.params if not p.keyword_only]
        wanted = ", ".join(name for name, _, _ in positional)
        if len(have) != len(positional):
            raise SemanticError(
                f"@{self.kind}: the rule '{rule.name}' takes {len(have)} positional "
                f"parameters; '{self.node.name}' gives it {len(positional)}: {wanted}",
                rule.span, (self.note,),
            )  # fmt: skip
        for p, (name, want, span) in zip(have, positional, strict=True):
            self._same(want, self._type(p), p.span, f"parameter '{p.name}' ({name})", span)
        have_kw = {p.name: p for p in rule.params if p.keyword_only}
        if set(have_kw) != {name for name, _, _ in keyword_only}:
            names = ", ".join(n for n, _, _ in keyword_only) or "none"
            raise SemanticError(
                f"@{self.kind}: the rule '{rule.name}' takes '{self.node.name}''s keyword-only "
                f"parameters, by the same names: {names}",
                rule.span, (self.note,),
            )  # fmt: skip
        for name, want, span in keyword_only:
            p = have_kw[name]
            self._same(want, self._type(p), p.span, f"parameter '{name}'", span)

    def _results(self, gives: list) -> None:
        rule = self.rule
        have = result_types(resolve_result(rule.returns, self.defines))
        if len(have) != len(gives):
            wanted = ", ".join(what for what, _, _ in gives)
            raise SemanticError(
                f"@{self.kind}: the rule '{rule.name}' returns {len(have)} values; it gives "
                f"{len(gives)}: {wanted}",
                rule.returns.span, (self.note,),
            )  # fmt: skip
        for t, (what, want, span) in zip(have, gives, strict=True):
            self._same(want, t, rule.returns.span, f"its result for {what}", span)

    def _same(self, want: Any, have: Any, at: Any, what: str, declared: Any) -> None:
        if want is None or have is None or self._matches(want, have):
            return
        raise SemanticError(
            f"@{self.kind}: the rule '{self.rule.name}''s {what} is {_shown(have)}; "
            f"'{self.node.name}' gives {_shown(want)}",
            at, (Note(f"'{self.node.name}' declares it here", declared), self.note),
        )  # fmt: skip

    def _matches(self, want: Any, have: Any) -> bool:
        if isinstance(want, ScalarType) or isinstance(have, ScalarType):
            return want == have
        if not (isinstance(want, TensorType) and isinstance(have, TensorType)):
            return want == have
        if want.rank != have.rank or want.dtype != have.dtype:
            return False
        for w, h in zip(want.dims, have.dims, strict=True):
            if h.symbol is not None:
                self.sizes.setdefault(h.symbol, w)
            if h.substitute(self.sizes) != w:
                return False
        return True


def _shown(t: Any) -> str:
    return f"{dims_text(t.dims)} {t.dtype}" if isinstance(t, TensorType) else str(t)


# ------------------------------------------------------------------ regions


def custom_region(
    analyzer: _FunctionAnalyzer,
    node: ast.FunctionDef,
    bound: dict[str, Ev],
    outputs: tuple[Value, ...],
    start: int,
    span: Any,
) -> None:
    """Make the ops from ``start`` on (``node``'s body, run on the arguments ``bound``)
    a region that ``node``'s rule differentiates, if it has one."""
    rule = custom_rule(analyzer.owner, node)
    if rule is None:
        return
    values = [bound[p.name].value for p in node.params]
    inputs = tuple(v for v in values if isinstance(v, Value) and differentiable(v))
    positional = [bound[p.name] for p in node.params if not p.keyword_only]
    keywords = [(p.name, bound[p.name], span) for p in node.params if p.keyword_only]

    def called(added: list[Value]) -> tuple[list[Value], list[Op]]:
        """The rule's results on ``added`` after ``F``'s arguments, and its ops, which
        must be linear in ``added``."""
        first = len(analyzer.blocks[-1])
        given = [_ev(v, span) for v in added]
        results = analyzer.call_function(rule.node, [*positional, *given], keywords, span)
        ops = analyzer.blocks[-1][first:]
        _linear(ops, added, rule)
        return _listed(results, span), ops

    def by_vjp(gs: list[Cotangent]) -> list[Cotangent]:
        given = [g if g is not None else filled(analyzer, o, 0.0, span)
                 for g, o in zip(gs, outputs, strict=True)]  # fmt: skip
        return called(given)[0]

    def by_jvp(gs: list[Cotangent]) -> list[Cotangent]:
        tangents = [filled(analyzer, v, 0.0, span) for v in inputs]
        results, ops = called(tangents)
        return adjoints(analyzer, ops, results, gs, tangents, span, analyzer.regions)

    _record(analyzer, start, inputs, outputs, by_vjp if rule.kind == "custom_vjp" else by_jvp)


#: Ops linear in each operand that carries a cotangent or tangent, and those linear in
#: one such operand (a product by a value that carries none; a quotient by one).
_LINEAR = frozenset({
    "add", "sub", "neg", "sum", "mean", "reshape", "transpose", "expand_dims", "cast",
    "where", "all_reduce", "take_along_axis", "scatter_add", "put_along_axis", "dropout",
    "slice", "split_qkv", "pad",
})  # fmt: skip
_LINEAR_IN_ONE = {"mul": (0, 1), "matmul": (0, 1), "div": (0,), "rotary_embedding": (0,)}


def _linear(ops: list[Op], added: list[Value], rule: CustomRule) -> None:
    """Check that a rule is linear in the cotangents (tangents) ``added``, as a VJP (JVP)
    is: reverse mode transposes a JVP rule, forward mode a VJP rule, and a rule that is
    not linear would give a wrong derivative without a word."""
    active = {v.id for v in added}
    thing = "cotangents" if rule.kind == "custom_vjp" else "tangents"
    for op in ops:
        hot = tuple(i for i, v in enumerate(op.operands) if v.id in active)
        if not hot or op.kind in CONSTANT_OPS:
            continue
        one = len(hot) == 1 and hot[0] in _LINEAR_IN_ONE.get(op.kind, ())
        if op.kind not in _LINEAR and not one:
            raise SemanticError(
                f"@{rule.kind}: the rule '{rule.node.name}' is not linear in its {thing}: "
                f"{op.kind} of a value computed from them; a rule multiplies them by "
                "values computed from the other parameters and adds them",
                op.span,
            )
        active.update(r.id for r in op.results)


def _record(
    analyzer: _FunctionAnalyzer, start: int, inputs: tuple, outputs: tuple, rule: Any
) -> None:
    values = frozenset(r.id for op in analyzer.blocks[-1][start:] for r in op.results)
    analyzer.regions.append(Region(values, inputs, outputs, rule))


def _ev(value: Value, span: Any) -> Ev:
    return Ev(value, span, value.name or "the gradient")


def _listed(result: Any, span: Any) -> list[Any]:
    if isinstance(result, Poison):
        raise SemanticError("cannot differentiate this call: its rule has errors", span)
    return list(result) if isinstance(result, tuple) else [result]


def checkpoint_ref(args: list[Ev], keywords: list, span: Any) -> CheckpointRef:
    """``checkpoint(G)``: the function whose values are computed again."""
    if len(args) != 1 or keywords or not isinstance(args[0].value, FunctionRef):
        raise SemanticError(
            "checkpoint() takes one function of this file: checkpoint(block)(x, w)", span
        )
    return CheckpointRef(args[0].value.node)


def checkpointed(
    analyzer: _FunctionAnalyzer, ref: CheckpointRef, args: list[Ev], keywords: list, span: Any
) -> Any:
    """A call of ``checkpoint(G)``: ``G``'s body here, as a region whose backward runs
    ``G``'s body again and differentiates that."""
    start = len(analyzer.blocks[-1])
    result = analyzer.call_function(ref.node, args, keywords, span)
    if isinstance(result, Poison):
        return POISON
    outputs = tuple(_listed(result, span))
    inputs = tuple(dict.fromkeys(
        e.value for e in [*args, *(k[1] for k in keywords)]
        if isinstance(e.value, Value) and differentiable(e.value)
    ))  # fmt: skip

    def again(gs: list[Cotangent]) -> list[Cotangent]:
        first = len(analyzer.blocks[-1])
        results = analyzer.call_function(ref.node, args, keywords, span)
        ops = analyzer.blocks[-1][first:]
        return adjoints(
            analyzer, ops, _listed(results, span), gs, list(inputs), span, analyzer.regions
        )

    _record(analyzer, start, inputs, outputs, again)
    return result
