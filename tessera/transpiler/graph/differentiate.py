"""Where a ``.tsr`` file asks for gradients: ``@autodiff`` and ``grad``.

``@autodiff`` on a graph function ``F`` adds the function ``F_vjp``: ``F``'s parameters,
then one cotangent per result (``grad_out``, or ``grad_out0``, ``grad_out1``, ...), and
the cotangent of each differentiated parameter as its result. Its body is ``F``'s
forward ops followed by their backward ops (``autodiff.backward``), one dataflow that
fusion groups into kernels like any other.

``grad(F)`` and ``value_and_grad(F)`` in a graph function run ``F``'s body in place, as
a call does, followed by its backward ops, so that a training step (loss, gradients,
update) is one compiled function.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..frontend import ast
from ..frontend.diagnostics import Diagnostics, did_you_mean
from .annotations import resolve_result
from .autodiff import REMAT_POLICIES, Builder, backward, differentiable, filled
from .custom_rules import custom_region
from .ir import Block, Function, Op, Param, Value, new_value
from .loss_scale import loss_scale, scaled
from .opcall import SemanticError
from .types import TensorType, TupleType, result_types
from .values import POISON, Const, Ev, FunctionRef, GradRef, Poison, describe

if TYPE_CHECKING:
    from .sema import _FunctionAnalyzer

__all__ = ["differentiated", "forward_mode", "gradient_of", "grad_ref", "wrt_names"]


def wrt_names(node: ast.FunctionDef) -> tuple[tuple[str, ...] | None, Any]:
    """The names ``@autodiff(wrt=(...))`` gives, or None for every parameter, and the
    span to report a wrong one at."""
    for decorator in node.decorators:
        if decorator.name != "autodiff":
            continue
        for keyword in decorator.keywords:
            if keyword.name == "wrt":
                return _names(keyword.value), keyword.value.span
        return None, decorator.span
    return None, node.span


def _names(expr: ast.Expr) -> tuple[str, ...]:
    items = expr.elts if isinstance(expr, (ast.TupleExpr, ast.ListExpr)) else (expr,)
    names = []
    for item in items:
        if not isinstance(item, ast.StrLit):
            raise SemanticError(
                'wrt= names parameters as strings: wrt=("w", "b")', getattr(item, "span", None)
            )
        names.append(item.value)
    return tuple(names)


def _picked(
    name: str, params: list[tuple[str, Any]], wanted: tuple[str, ...] | None, span: Any
) -> list[Value]:
    """The parameters to differentiate: those ``wanted`` names, each checked, or every
    floating-point tensor parameter."""
    by_name = dict(params)
    if wanted is None:
        picked = [v for _, v in params if isinstance(v, Value) and differentiable(v)]
        if not picked:
            raise SemanticError(
                f"'{name}' has no floating-point tensor parameter to differentiate", span
            )
        return picked
    picked = []
    for want in wanted:
        value = by_name.get(want)
        if value is None:
            raise SemanticError(
                f"wrt= names '{want}', which is not a parameter of '{name}'"
                f"{did_you_mean(want, by_name)}; its parameters: {', '.join(by_name)}",
                span,
            )
        if not (isinstance(value, Value) and differentiable(value)):
            raise SemanticError(
                f"wrt= names '{want}', which is {describe(value)}: only floating-point "
                f"tensors have gradients; leave '{want}' out of wrt=",
                span,
            )
        if value in picked:
            raise SemanticError(f"wrt= names '{want}' twice", span)
        picked.append(value)
    return picked


def differentiated(
    analyzer: _FunctionAnalyzer, forward: Function, mode: str = "vjp"
) -> Function | None:
    """``F_vjp`` (or, with ``mode="jvp"``, ``F_jvp``) of the function ``analyzer``
    analyses again (``forward`` is ``F``), or None after reporting why there is none."""
    diags = analyzer.diags
    try:
        return _derived(analyzer, forward, mode)
    except SemanticError as exc:
        diags.error(exc.message, exc.span, exc.notes)
        return None
    finally:
        analyzer.diags = diags  # not the scratch diagnostics of the second analysis


def forward_mode(node: ast.FunctionDef) -> bool:
    """Whether ``@autodiff(jvp=True)`` asks for ``F_jvp`` too."""
    keyword = _keyword(node, "jvp")
    if keyword is not None and not isinstance(keyword.value, ast.BoolLit):
        raise SemanticError("@autodiff: jvp= is True or False", keyword.value.span)
    return keyword is not None and keyword.value.value


def _keyword(node: ast.FunctionDef, name: str) -> ast.Keyword | None:
    for decorator in node.decorators:
        for keyword in decorator.keywords if decorator.name == "autodiff" else ():
            if keyword.name == name:
                return keyword
    return None


def _remat_policy(value: Any, span: Any) -> str:
    """A ``remat=`` policy, checked: one of ``REMAT_POLICIES``."""
    if value not in REMAT_POLICIES:
        raise SemanticError(
            f"remat= is one of {', '.join(map(repr, REMAT_POLICIES))}, not {value!r}", span
        )
    return value


def _remat(node: ast.FunctionDef) -> str:
    keyword = _keyword(node, "remat")
    if keyword is None:
        return "everything"
    value = keyword.value.value if isinstance(keyword.value, ast.StrLit) else None
    return _remat_policy(value, keyword.value.span)


def _derived(analyzer: _FunctionAnalyzer, forward: Function, mode: str) -> Function | None:
    node = analyzer.node
    wanted, span = wrt_names(node)
    if forward.kind == "declaration":
        raise SemanticError(f"@autodiff: '{node.name}' has no body to differentiate", span)
    if forward.kind != "graph":
        raise SemanticError(
            f"@autodiff differentiates graph functions; '{node.name}' is a "
            f"{forward.kind} function (a tile kernel's loops and stores have no gradient "
            "rule): write it with graph ops (matmul, softmax, ...) to differentiate it",
            span,
        )
    name = f"{node.name}_{mode}"
    if analyzer.owner.function_defs.get(name) is not None:
        raise SemanticError(
            f"@autodiff adds the function '{name}', which this file defines already: rename "
            "one of them",
            span,
        )
    declared = result_types(forward.result_type)
    if not declared:
        raise SemanticError(f"@autodiff: '{node.name}' declares no result to differentiate", span)
    for i, t in enumerate(declared):
        if not (isinstance(t, TensorType) and t.dtype.is_float):
            which = "its result" if len(declared) == 1 else f"its result {i}"
            raise SemanticError(
                f"@autodiff: {which} is {t}, which has no gradient: only floating-point "
                "tensors do; return a float tensor (cast(..., f32)), or drop @autodiff",
                node.returns.span,
            )
    remat = _remat(node)
    real = analyzer.diags
    analyzer.diags = Diagnostics()  # F's own analysis reported its warnings already
    params = analyzer._params()
    body = tuple(s for s in node.body if not _docstring(s, node.body))
    analyzer._block(body, top=True)
    if analyzer.diags.error_count or not analyzer.returned:
        return None
    analyzer.diags = real
    analyzer.stack = (name,)  # the rule may call F: it runs in F_vjp, not in F
    bound = {p.value.name: Ev(p.value, p.value.span, p.value.name) for p in params}
    custom_region(analyzer, node, bound, analyzer.returned, 0, span)
    wrt = _picked(node.name, [(p.value.name, p.value) for p in params], wanted, span)
    taken = [p.value.name for p in params]
    if mode == "vjp":
        names = (
            ["grad_out"] if len(declared) == 1 else [f"grad_out{i}" for i in range(len(declared))]
        )
        added = _fresh(names, declared, taken, node.returns.span)
        forward = list(analyzer.blocks[0])
        k = loss_scale(declared, node.returns)
        b = Builder(analyzer, span)
        seeds = scaled(b, added, k)
        results = backward(
            analyzer, forward, analyzer.returned, seeds, wrt, span, analyzer.regions, remat
        )
        results = scaled(b, results, k, "div")
        _mark_backward(analyzer.blocks[0], len(forward))
        types = tuple(v.type for v in wrt)
    else:
        added = _fresh([f"tangent_{v.name}" for v in wrt], [v.type for v in wrt], taken, span)
        results = [*analyzer.returned, *_tangents(analyzer, wrt, added, span)]
        types = tuple(v.type for v in results)
    positional = tuple(p for p in params if not p.keyword_only)
    keyword_only = tuple(p for p in params if p.keyword_only)
    return Function(
        name, "graph", (*positional, *(Param(v) for v in added), *keyword_only),
        types[0] if len(types) == 1 else TupleType(types),
        Block((), _needed(analyzer.blocks[0], results), tuple(results)),
        tuple(analyzer.guards), ("autodiff",), span=node.span,
    )  # fmt: skip


def _fresh(names: list[str], types: Any, taken: list[str], span: Any) -> list[Value]:
    """New parameters of ``types``, named ``names`` unless a parameter has the name."""
    values = []
    for name, t in zip(names, types, strict=True):
        while name in taken:
            name += "_"
        values.append(new_value(TensorType(t.dims, t.dtype), name, span))
    return values


def _tangents(
    analyzer: _FunctionAnalyzer, wrt: list[Value], tangents: list[Value], span: Any
) -> list[Value]:
    """The tangents of the results, ``J t``, as the transpose of the backward pass: the
    backward ops are linear in the results' cotangents ``u``, so differentiating them
    with respect to ``u`` along ``t`` gives ``J t`` (with ``u = 0``, where they are
    taken, since they are linear)."""
    outputs = analyzer.returned
    start = len(analyzer.blocks[0])
    dummies = [filled(analyzer, out, 0.0, span) for out in outputs]
    forward_ops = list(analyzer.blocks[0][:start])
    grads = backward(analyzer, forward_ops, outputs, dummies, wrt, span, analyzer.regions)
    backward_ops = list(analyzer.blocks[0][start:])
    return backward(analyzer, backward_ops, grads, tangents, dummies, span, analyzer.regions)


def _mark_backward(ops: list[Op], start: int) -> None:
    """Mark the ops from ``start`` on as the backward pass's, for the memory plan (which
    says what the backward reads of the forward's values)."""
    ops[start:] = [replace(op, backward=True) for op in ops[start:]]


def _needed(ops: list[Op], results: list[Value]) -> tuple[Op, ...]:
    """``ops`` without those whose results neither the backward ops nor ``results``
    read: the forward results themselves, and a dropout's mask, which the backward
    draws again. An op with any other effect stays."""
    live = {v.id for v in results}
    kept = []
    for op in reversed(ops):
        if set(op.effects) <= {"rng"} and not any(r.id in live for r in op.results):
            continue
        kept.append(op)
        live.update(v.id for v in op.operands)
    return tuple(reversed(kept))


def _docstring(stmt: ast.Stmt, body: tuple[ast.Stmt, ...]) -> bool:
    return stmt is body[0] and isinstance(stmt, ast.ExprStmt) and isinstance(stmt.value, ast.StrLit)


# ------------------------------------------------------------ grad(F) in a body


def grad_ref(name: str, args: list[Ev], keywords: list, span: Any) -> GradRef:
    """``grad(F, wrt=(...))`` or ``value_and_grad(F, ...)``: the function to call."""
    if len(args) != 1 or not isinstance(args[0].value, FunctionRef):
        raise SemanticError(
            f'{name}() takes one function of this file: {name}(loss, wrt=("w",))', span
        )
    node = args[0].value.node
    wanted, remat = None, "everything"
    for keyword, ev, key_span in keywords:
        value = ev.value.value if isinstance(ev.value, Const) else None
        if keyword == "remat":
            remat = _remat_policy(value, ev.span)
            continue
        if keyword != "wrt":
            raise SemanticError(
                f"{name}() has no parameter '{keyword}'; it takes wrt= and remat=", key_span
            )
        if isinstance(value, str):
            value = (value,)
        if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
            raise SemanticError('wrt= names parameters as strings: wrt=("w", "b")', ev.span)
        known = [p.name for p in node.params]
        for want in value:
            if want not in known:
                raise SemanticError(
                    f"wrt= names '{want}', which is not a parameter of '{node.name}'"
                    f"{did_you_mean(want, known)}; its parameters: {', '.join(known)}",
                    ev.span,
                )
        wanted = tuple(value)
    return GradRef(node, wanted, name == "value_and_grad", remat)


def gradient_of(
    analyzer: _FunctionAnalyzer, ref: GradRef, args: list[Ev], keywords: list, span: Any
) -> Any:
    """A call of ``grad(F)``: ``F``'s body here, then its backward ops, seeded with 1."""
    node = ref.node
    start = len(analyzer.blocks[-1])
    result = analyzer.call_function(node, args, keywords, span)
    if isinstance(result, Poison):
        return POISON
    one = all(d.constant == 1 for d in getattr(getattr(result, "type", None), "dims", (0,)))
    if not isinstance(result, Value) or not differentiable(result) or not one:
        what = "several results" if isinstance(result, tuple) else str(result.type)
        raise SemanticError(
            f"grad() differentiates a function of one scalar result (a float tensor of one "
            f"element, such as sum(...)); '{node.name}' gives {what}: differentiate a "
            f"sum or mean of it, or use @autodiff and {node.name}_vjp",
            span,
        )
    bound = _bound(node, args, keywords)
    params = [(p.name, bound[p.name].value) for p in node.params if p.name in bound]
    wrt = _picked(node.name, params, ref.wanted, span)
    ops = analyzer.blocks[-1][start:]
    declared = resolve_result(node.returns, analyzer.defines) if node.returns else None
    k = loss_scale(result_types(declared), node.returns)
    seed = filled(analyzer, result, 1.0 if k is None else k, span)
    grads = backward(analyzer, ops, [result], [seed], wrt, span, analyzer.regions, ref.remat)
    grads = scaled(Builder(analyzer, span), grads, k, "div")
    _mark_backward(analyzer.blocks[-1], start + len(ops))
    grads_value = grads[0] if len(grads) == 1 else tuple(grads)
    return (result, grads_value) if ref.with_value else grads_value


def _bound(node: ast.FunctionDef, args: list[Ev], keywords: list) -> dict[str, Ev]:
    """The arguments by parameter name (the call itself checked them)."""
    positional = [p.name for p in node.params if not p.keyword_only]
    bound = dict(zip(positional, args, strict=False))
    bound.update({name: ev for name, ev, _ in keywords})
    return bound
