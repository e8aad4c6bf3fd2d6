"""Semantic analysis: the AST of a ``.tsr`` file to Graph IR.

Names are resolved, annotations become types, and every call is checked by
its operation's rule (``graph_ops``, ``tile_ops``) as it is turned into SSA.
Mistakes are reported in the user's terms at the user's line; after an error
the statement's names are bound to ``POISON`` so that one mistake gives one
message, and analysis goes on with the next statement.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import PurePath
from typing import Any

from ..frontend import ast
from ..frontend.diagnostics import Diagnostic, Diagnostics, Note, Severity, did_you_mean
from ..frontend.printer import print_expr
from ..frontend.source import Span
from ..options import Options
from . import loss_scale, optim, optstate, quant  # noqa: F401  (they register graph ops)
from .annotations import (
    resolve_result,
    resolve_type,
    typed_for_caller,
    unimplemented_policies,
)
from .autodiff import Region
from .custom_rules import CUSTOM_RULES, custom_region, custom_rule
from .differentiate import differentiated, forward_mode
from .dims import Dim
from .dtypes import accumulator
from .evaluate import STDLIB, Evaluator, is_int, is_number
from .graph_ops import GRAPH_OPS
from .ir import (
    RESULT,
    Block,
    Function,
    GraphModule,
    Guard,
    Op,
    Param,
    StateSlot,
    TileCallee,
    Value,
    new_value,
    result_names,
    walk,
)
from .mesh import Localizer, Mesh, ShardSpec, find_mesh, shard_policy, shard_spec
from .not_yet import NOT_YET, not_yet
from .opcall import OpCall, OpSpec, SemanticError, bind
from .schedule_spec import SPACE_KEYS, ScheduleSpec
from .tile_ops import range_extent
from .tile_sizes import head_dim_values
from .types import (
    BlockType,
    OptimizerStateType,
    ScalarType,
    TensorType,
    TileType,
    TupleType,
    ValueType,
    dims_text,
    in_memory,
    result_types,
)
from .values import (
    POISON,
    Const,
    DimValue,
    Ev,
    FunctionRef,
    Namespace,
    OpRef,
    Poison,
    ScheduleValue,
    ShapeValue,
    describe,
)

__all__ = ["analyze", "KERNEL_DECORATORS"]

#: What a loop in a graph function may run over.
_NOT_UNROLLED = (
    "a loop in a graph function runs over range(...) or a tuple of values, known at compile "
    "time, and is unrolled; a loop over blocks belongs in a tile kernel"
)
#: The most iterations a graph function's loop unrolls to: beyond, the program would be
#: better written as one tensor operation than as that many copies of its body.
_MOST_UNROLLED = 256

#: Decorators a function may carry, and the keywords each accepts (None: no call).
KERNEL_DECORATORS: dict[str, tuple[str, ...] | None] = {
    "kernel": None,
    "tessera.kernel": None,
    "jit": None,
    "autodiff": ("wrt", "jvp", "remat"),
    "custom_vjp": (),
    "custom_jvp": (),
    "kernel.auto": None,
    "kernel.schedule": ("schedule",),
    "kernel.autotune": ("space", "metric", "budget_ms", "cache"),
    "verify.numerics": ("stable", "bounded"),
}


def analyze(
    module: ast.Module, options: Options, diags: Diagnostics, given: frozenset[str] = frozenset()
) -> GraphModule:
    """The Graph IR of ``module``. ``given`` are sizes its caller passes in: a library
    kernel instantiated for a group is given every size of the function it runs in, so
    that a size it names only inside an expression (``C/16``) is no error."""
    return _ModuleAnalyzer(module, options, diags, given).run()


class _ModuleAnalyzer:
    def __init__(
        self, module: ast.Module, options: Options, diags: Diagnostics, given: frozenset[str]
    ) -> None:
        self.module = module
        self.options = options
        self.diags = diags
        self.given = given
        self.globals: dict[str, Any] = {}
        self.global_spans: dict[str, Span] = {}
        #: the file's functions, which a graph function may call (``_Inlined``)
        self.function_defs: dict[str, ast.FunctionDef] = {}
        #: each function's @custom_vjp or @custom_jvp rule once checked, or the error
        self.custom_rules: dict[str, Any] = {}
        for stmt in module.body:
            if isinstance(stmt, ast.FunctionDef):
                self.function_defs.setdefault(stmt.name, stmt)

    def run(self) -> GraphModule:
        functions: list[Function] = []
        constants: list[tuple[str, str]] = []
        seen: dict[str, ast.FunctionDef] = {}
        top = Evaluator(self, None)
        for stmt in self.module.body:
            try:
                if isinstance(stmt, ast.ImportFrom):
                    self._import_from(stmt)
                elif isinstance(stmt, ast.Import):
                    self._bind(
                        stmt.asname or stmt.module.split(".")[0], Namespace(stmt.module), stmt.span
                    )
                elif isinstance(stmt, ast.Assign) and isinstance(stmt.target, ast.Name):
                    self._bind(stmt.target.id, POISON, stmt.span)  # until it evaluates
                    value = top.eval(stmt.value).value
                    if isinstance(value, Value):
                        raise SemanticError(
                            "top-level values must be known at compile time", stmt.value.span
                        )
                    self._bind(stmt.target.id, value, stmt.span)
                    if isinstance(value, ScheduleValue):
                        constants.append((stmt.target.id, value.text))
                elif isinstance(stmt, ast.FunctionDef):
                    if stmt.name in seen:
                        raise SemanticError(
                            f"function '{stmt.name}' is defined twice",
                            stmt.span,
                            (Note("first defined here", seen[stmt.name].span),),
                        )
                    seen[stmt.name] = stmt
                    if self.options.kernel not in (None, stmt.name):
                        continue
                    errors = self.diags.error_count
                    function = _FunctionAnalyzer(self, stmt).run()
                    if function is not None:
                        functions.append(function)
                        clean = self.diags.error_count == errors
                        if clean and "autodiff" in (d.name for d in stmt.decorators):
                            if function.states:
                                raise SemanticError(
                                    f"@autodiff of '{stmt.name}', which takes an "
                                    "OptimizerState: differentiate the loss, and update the "
                                    "state in the step that calls grad(loss)",
                                    stmt.span,
                                )
                            modes = ("vjp", "jvp") if forward_mode(stmt) else ("vjp",)
                            for mode in modes:
                                made = differentiated(_FunctionAnalyzer(self, stmt), function, mode)
                                functions.extend(() if made is None else (made,))
                else:
                    raise SemanticError(
                        "only imports, assignments and function definitions may appear at the "
                        "top level of a .tsr file",
                        stmt.span,
                    )
            except SemanticError as exc:
                self.diags.error(exc.message, exc.span, exc.notes)
        # The file's name, not the folder it was found in: every stage and output that
        # names it is the same from any checkout or working directory.
        name = PurePath(self.module.span.file).name
        return GraphModule(name, tuple(functions), tuple(constants))

    def _bind(self, name: str, value: Any, span: Span) -> None:
        self.globals[name] = value
        self.global_spans[name] = span

    def _import_from(self, stmt: ast.ImportFrom) -> None:
        if stmt.module != "tessera.stdlib":
            raise SemanticError(
                f"cannot import from '{stmt.module}': a .tsr file imports only from "
                "tessera.stdlib",
                stmt.span,
            )
        for alias in stmt.names:
            if alias.name not in STDLIB:
                raise SemanticError(
                    f"tessera.stdlib has no '{alias.name}'{did_you_mean(alias.name, STDLIB)}",
                    alias.span,
                )
            self._bind(alias.asname or alias.name, OpRef(f"stdlib.{alias.name}"), alias.span)


def _assigned_names(body: tuple[ast.Stmt, ...]) -> list[str]:
    """Names a block (re)binds, in order of first binding, nested blocks included."""
    names: list[str] = []

    def add(target: ast.Expr) -> None:
        if isinstance(target, ast.Name) and target.id not in names:
            names.append(target.id)
        elif isinstance(target, ast.TupleExpr):
            for element in target.elts:
                add(element)

    for stmt in _statements(body):
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.For)):
            add(stmt.target)
        elif isinstance(stmt, ast.ExprStmt) and isinstance(stmt.value, ast.Call):
            func = stmt.value.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and f"{func.value.id}.{func.attr}" in GRAPH_OPS
                and GRAPH_OPS[f"{func.value.id}.{func.attr}"].in_place
                and stmt.value.args
            ):
                add(stmt.value.args[0])
    return names


def _tuning_option(spec: ScheduleSpec, name: str, value: Any, span: Span) -> ScheduleSpec:
    """``metric=``, ``budget_ms=`` or ``cache=`` of ``@kernel.autotune``, checked."""
    if name == "metric":
        if value != "latency_ms":
            raise SemanticError(f'autotune metric {value!r}: the one metric is "latency_ms"', span)
        return spec
    if name == "budget_ms":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise SemanticError(f"autotune budget_ms is a positive number, not {value!r}", span)
        return replace(spec, budget_ms=float(value))
    if not isinstance(value, str) or not value:
        raise SemanticError(f"autotune cache is a file path, not {value!r}", span)
    return replace(spec, cache=value)


def _statements(body: tuple[ast.Stmt, ...]) -> Iterator[ast.Stmt]:
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            yield from _statements(stmt.body)
            yield from _statements(stmt.orelse)
        elif isinstance(stmt, (ast.For, ast.With)):
            yield from _statements(stmt.body)


def _calls_tile_context(body: tuple[ast.Stmt, ...]) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "context"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "tile"
        for stmt in body
        for node, _ in ast.walk(stmt)
    )


class _FunctionAnalyzer:
    """One function: its parameters, its statements in order, its return."""

    def __init__(self, owner: _ModuleAnalyzer, node: ast.FunctionDef) -> None:
        self.owner = owner
        self.node = node
        self.diags = owner.diags
        self.defines = dict(owner.options.defines)
        self.env: dict[str, Any] = {}
        self.blocks: list[list[Op]] = [[]]
        self.guards: list[Guard] = []
        #: the calls that the backward pass differentiates by a rule of their own
        self.regions: list[Region] = []
        self.with_attrs: list[str] = []
        #: the function's mesh, and the blocks of it that enclose the statement at hand
        self.mesh: Mesh | None = None
        self.mesh_depth = 0
        self.localizer: Localizer | None = None
        self.shards: list[ShardSpec | None] = []
        self.return_span: Span | None = None
        self.param_spans: dict[int, tuple[str, Span]] = {}
        #: the sizes the parameters' types name (``N`` of ``Tensor["N", f32]``), which the
        #: body may read by name, as it may ``x.shape[0]``
        self.dims: dict[str, Dim] = {}
        self.kind = "tile" if _calls_tile_context(node.body) else "graph"
        #: sizes given from outside (``analyze``'s ``given``; a called tile kernel's, the
        #: caller's sizes that its re-typed parameters name)
        self.given = owner.given
        self.evaluator = Evaluator(owner, self)
        self.returned: tuple[Value, ...] | None = None
        self.schedule: ScheduleSpec | None = None
        self.schedule_span: Span | None = None
        #: the functions whose bodies are running here: this one, and those it calls
        self.stack: tuple[str, ...] = (node.name,)
        #: reductions without ``axis=`` that reduced every axis, with the dims the old
        #: default (the last axis) gave, for the error at a result declared so
        self.every_axis: list[tuple[tuple[Dim, ...], Span]] = []
        #: the OptimizerState parameters and results, as the function's ``states`` keeps
        #: them; and the states an update consumed and the caches an append wrote in
        #: place, by id, with the update's or the append's span
        self.states: list[StateSlot] = []
        self.donated: dict[int, tuple[Any, Span]] = {}

    # -- calls of the file's other functions -----------------------------------------

    def function_named(self, name: str, span: Span) -> FunctionRef | None:
        """The file's function ``name``, where the name means it: a function's own name
        inside it is the library op of that name, if any (``def softmax(x): return
        softmax(x * 2.0)``), and otherwise a recursion, which no kernel can run."""
        node = self.owner.function_defs.get(name)
        if node is None:
            return None
        if name in self.stack:
            if name in GRAPH_OPS and GRAPH_OPS[name].level != "any":
                return None
            through = f" through {', '.join(self.stack[1:])}" if len(self.stack) > 1 else ""
            raise SemanticError(
                f"'{name}' calls itself{through}: a call runs the function's body in place, "
                "so it cannot recurse",
                span,
            )
        return FunctionRef(node)

    def call_function(
        self, node: ast.FunctionDef, args: list[Ev], keywords: list, span: Span
    ) -> Value | Poison:
        """A call of another function of the file: a graph function's body runs here, on
        these values; a tile kernel is one op that launches it (``_TileCall``)."""
        if self.kind == "tile":
            what = "another tile kernel" if _calls_tile_context(node.body) else "a graph function"
            raise SemanticError(
                f"{node.name}() is {what}, called from a tile kernel: a tile kernel's body is "
                "one program of its launch and calls no function; write the tile operations "
                "here, or call both from a graph function, each a launch of its own",
                span,
            )
        if _calls_tile_context(node.body):
            return _TileCall(self, node, span).call(args, keywords)
        return _Inlined(self, node, span).call(args, keywords)

    def call_library(self, module: ast.Module, args: list[Ev], span: Span) -> Value | Poison:
        """Run the library graph function ``attend`` of ``module`` (``graph.kvattend``)
        on ``args``, here, as a call of a function of the file; its ops and guards take
        ``span``, the call that it implements, so that every message points there."""
        ops, guards = len(self.blocks[-1]), len(self.guards)
        result = _LibraryCall(self, module, span).call(args, [])
        block = self.blocks[-1]
        block[ops:] = [replace(op, span=span) for op in block[ops:]]
        self.guards[guards:] = [replace(g, span=span) for g in self.guards[guards:]]
        return result

    # -- the Emitter protocol for op rules -----------------------------------------

    def emit(
        self,
        kind: str,
        operands: tuple,
        result_types: tuple,
        attrs: tuple,
        effects: tuple,
        span: Span,
    ) -> tuple[Value, ...]:
        results = tuple(new_value(t, None, span) for t in result_types)
        if self.with_attrs:
            attrs = (*attrs, ("with", ", ".join(self.with_attrs)))
        self.blocks[-1].append(
            Op(kind, tuple(operands), results, tuple(attrs), tuple(effects), span=span)
        )
        return results

    def producer(self, value: Value) -> Op | None:
        """The op of the current block that computed ``value``, if one did."""
        return next((op for op in reversed(self.blocks[-1]) if value in op.results), None)

    def guard(self, kind: str, left: Dim, right: Dim, reason: str, span: Span) -> None:
        if left.constant is not None and right.constant is None and kind != "divisible":
            # a failed check names the size first: N = 33 breaks N == 1, C = 20 breaks C >= 24
            left, right = right, left
            kind = {"at_most": "at_least", "at_least": "at_most"}.get(kind, kind)
        guard = Guard(kind, left, right, reason, span)
        if all((g.kind, g.left, g.right) != (kind, left, right) for g in self.guards):
            self.guards.append(guard)

    def index_guard(self, indices: Value, bound: Dim, reason: str, span: Span) -> bool:
        """Check at run time that the values of ``indices`` lie in ``[0, bound)``, where
        ``indices`` is a parameter; False where it is an intermediate, which no entry
        sees (the kernel clamps such an index instead)."""
        if indices.id not in self.param_spans:
            return False
        name = self.param_spans[indices.id][0]
        guard = Guard("indices", Dim.const(0), bound, reason, span, tensor=name)
        if all((g.kind, g.tensor, g.right) != ("indices", name, bound) for g in self.guards):
            self.guards.append(guard)
        return True

    def attach(self, result: Value, attr: tuple[str, Any]) -> None:
        """Add an attribute to the op that produced ``result``."""
        ops = self.blocks[-1]
        for i in range(len(ops) - 1, -1, -1):
            if result in ops[i].results:
                ops[i] = replace(ops[i], attrs=(*ops[i].attrs, attr))
                return

    def warning(self, message: str, span: Span) -> None:
        self.diags.warning(message, span)

    def reduced_every_axis(self, old: tuple[Dim, ...], span: Span) -> None:
        self.every_axis.append((old, span))

    def declaration_note(self, ev: Ev) -> tuple[Note, ...]:
        v = ev.value
        if isinstance(v, Value) and v.id in self.param_spans:
            name, span = self.param_spans[v.id]
            return (Note(f"'{name}' is declared here", span),)
        return ()

    def check_level(self, spec: OpSpec, span: Span, shown: str) -> None:
        if spec.level == "tile" and self.kind != "tile":
            raise SemanticError(
                f"{shown} is a tile operation: it can only be used in a tile kernel, "
                "a function that calls tile.context()",
                span,
            )
        if spec.level == "graph" and self.kind == "tile":
            raise SemanticError(
                f"{shown} works on whole tensors and cannot be used in a tile kernel; "
                "use the tile operations (tile.dot, tile.softmax_online, ...)",
                span,
            )

    # -- the function --------------------------------------------------------------

    def run(self) -> Function | None:
        node = self.node
        decorators = self._decorators()
        self._find_mesh()
        params = self._params()
        result_type = None
        if node.returns is not None:
            try:
                result_type = resolve_result(node.returns, self.defines)
                self._warn_unimplemented(node.returns)
                result_type = self._local_result(node.returns, result_type)
                result_type = _flat_result(self._bound_result(result_type, node.returns))
            except SemanticError as exc:
                self.diags.error(exc.message, exc.span, exc.notes)
                result_type = None
        for t in result_type if isinstance(result_type, tuple) else (result_type,):
            self._packed_guard(t, "the result", node.returns.span if node.returns else node.span)
        body = tuple(s for s in node.body if not _is_docstring(s, node.body))
        if all(isinstance(s, ast.Pass) or _is_ellipsis(s) for s in body):
            kind = "declaration"
            self.kind = "declaration"
        else:
            kind = self.kind
            self._block(body, top=True)
            if self.returned is None and result_type is not None:
                self.diags.error(
                    f"'{node.name}' declares a result but never returns one", node.span,
                    (Note("the result type is declared here", node.returns.span),),
                )  # fmt: skip
            if self.returned and result_type is None and kind == "tile":
                self.diags.error(
                    f"'{node.name}' returns a tile but declares no result type: a tile does "
                    "not say the dims of the tensor it is stored into; declare them, as in "
                    "'-> Tensor[\"N\", f32]'",
                    node.span,
                )
        self._check_result_names(params, declared=result_type is not None)
        body = Block((), tuple(self.blocks[0]), self.returned or ())
        if kind == "tile":
            body = head_dim_values(body, self.diags.error)
        function = Function(
            node.name, kind, params, result_type, body,
            tuple(self.guards), decorators, span=node.span,
            schedule=self.schedule, schedule_span=self.schedule_span,
            mesh=self.mesh, shards=tuple(self.shards) if self.mesh else (),
            return_span=self.return_span, states=tuple(self.states),
        )  # fmt: skip
        return function

    # -- the mesh ------------------------------------------------------------------

    def _find_mesh(self) -> None:
        """The mesh the function runs on, and how its parameters split sizes."""
        try:
            self.mesh = find_mesh(self.node.body, lambda e: self.evaluator.eval(e).value)
        except SemanticError as exc:
            self.diags.error(exc.message, exc.span, exc.notes)
        if self.mesh is None:
            return
        sharded, taken = [], set(self.defines)
        for p in self.node.params:
            policy = shard_policy(p.annotation)
            try:
                t = resolve_type(p.annotation, self.defines) if p.annotation else None
                if isinstance(t, TensorType):
                    taken |= {s for d in t.dims for s in d.symbols()}
                    if policy is not None:
                        sharded.append((t, shard_spec(policy, t.rank, self.mesh)))
            except SemanticError:
                pass  # reported with the parameter
        self.localizer = Localizer(self.mesh, sharded, taken)
        self.dims.update(self.localizer.sizes)

    def _local(self, node: ast.TypeExpr, t: Any, what: str, record: bool = True) -> Any:
        """``t`` as one device of the mesh holds it (the type as declared without one)."""
        policy = shard_policy(node)
        if policy is not None and not isinstance(t, TensorType):
            raise SemanticError(f"@shard splits a tensor, not {t}", policy.span)
        spec = shard_spec(policy, t.rank, self.mesh) if policy is not None else None
        if self.localizer is None:
            return t
        if record:
            self.shards.append(spec)
        return self.localizer.local(t, spec, what, node.span) if isinstance(t, TensorType) else t

    def _local_result(self, node: ast.TypeExpr, t: Any, record: bool = True) -> Any:
        if isinstance(t, TupleType):
            items = [a for a in node.args or () if isinstance(a, ast.TypeExpr)]
            return TupleType(tuple(self._local(a, i, "the result", record)
                                   for a, i in zip(items, t.items, strict=True)))  # fmt: skip
        return self._local(node, t, "the result", record)

    def mesh_scope(self) -> Mesh | None:
        """The mesh whose block encloses the op at hand, if one does."""
        return self.mesh if self.mesh_depth else None

    def _warn_unimplemented(self, annotation: ast.TypeExpr) -> None:
        for message, span in unimplemented_policies(annotation):
            self.diags.warning(message, span)

    def _decorators(self) -> tuple[str, ...]:
        texts = []
        for decorator in self.node.decorators:
            try:
                texts.append(self._decorator(decorator))
            except SemanticError as exc:
                self.diags.error(exc.message, exc.span, exc.notes)
        return tuple(texts)

    def _decorator(self, decorator: ast.Decorator) -> str:
        name = decorator.name
        if name not in KERNEL_DECORATORS:
            raise SemanticError(
                f"unknown decorator '@{name}'{did_you_mean(name, KERNEL_DECORATORS)}",
                decorator.span,
                (Note("decorators: " + ", ".join("@" + d for d in KERNEL_DECORATORS)),),
            )
        accepted = KERNEL_DECORATORS[name]
        if "@" + name in NOT_YET:
            self.diags.warning(not_yet("@" + name), decorator.span)
        if name in CUSTOM_RULES:
            rule = custom_rule(self.owner, self.node)
            return f"{name}({rule.node.name})" if rule is not None else name
        if decorator.args is None:
            if accepted is not None and name not in ("kernel.autotune", "autodiff"):
                raise SemanticError(f"@{name} needs arguments", decorator.span)
            return name
        if accepted is None:
            raise SemanticError(f"@{name} takes no arguments", decorator.span)
        parts = []
        tuning = ScheduleSpec(autotune=True)
        top = Evaluator(self.owner, None)
        if name == "kernel.schedule":
            if len(decorator.args) != 1 or decorator.keywords:
                raise SemanticError(
                    "@kernel.schedule takes one schedule: @kernel.schedule(base)", decorator.span
                )
            value = top.eval(decorator.args[0]).value
            if isinstance(value, Poison):
                return name  # the schedule's own error is already reported
            if not isinstance(value, ScheduleValue):
                raise SemanticError(
                    f"@kernel.schedule takes a Schedule, not {describe(value)}",
                    decorator.args[0].span,
                )
            self._set_schedule(value.spec, decorator.span)
            return f"kernel.schedule({value.text})"
        if decorator.args:
            raise SemanticError(
                f"@{name} takes keyword arguments: {', '.join(accepted)}", decorator.args[0].span
            )
        for keyword in decorator.keywords:
            if keyword.name not in accepted:
                raise SemanticError(
                    f"@{name} has no parameter '{keyword.name}'"
                    f"{did_you_mean(keyword.name, accepted)}",
                    keyword.span,
                )
            value = top.eval(keyword.value).value
            if isinstance(value, Poison):
                continue
            if name == "kernel.autotune" and keyword.name == "space":
                space = self._space(value, keyword.value.span)
                tuning = replace(space, budget_ms=tuning.budget_ms, cache=tuning.cache)
                parts.append(f"space={tuning}")
            elif isinstance(value, Const):
                if name == "kernel.autotune":
                    tuning = _tuning_option(tuning, keyword.name, value.value, keyword.value.span)
                parts.append(f"{keyword.name}={print_expr(keyword.value)}")
            else:
                raise SemanticError(
                    f"@{name}: '{keyword.name}' must be a constant", keyword.value.span
                )
        if name == "kernel.autotune":
            self._set_schedule(tuning, decorator.span)
        return f"{name}({', '.join(parts)})"

    def _set_schedule(self, spec: ScheduleSpec, span: Span) -> None:
        if self.schedule is not None:
            raise SemanticError(
                "a kernel has one schedule: give @kernel.schedule or @kernel.autotune, not both",
                span,
                (Note("the first schedule is given here", self.schedule_span),),
            )
        self.schedule, self.schedule_span = spec, span

    @staticmethod
    def _space(value: Any, span: Span) -> ScheduleSpec:
        """``space=dict(BM=[64, 128], ...)`` or a Schedule, as a schedule spec."""
        if isinstance(value, ScheduleValue):
            return replace(value.spec, autotune=True)
        if not isinstance(value, Const) or not isinstance(value.value, dict):
            raise SemanticError(
                "space is a dict of candidate lists, dict(BM=[64, 128], warps=[4, 8]), "
                "or a Schedule",
                span,
            )
        spec = ScheduleSpec(autotune=True)
        for key, candidates in value.value.items():
            if key not in SPACE_KEYS:
                raise SemanticError(
                    f"the autotune space has no knob '{key}'{did_you_mean(key, SPACE_KEYS)}; "
                    f"knobs: {', '.join(SPACE_KEYS)}",
                    span,
                )
            values = tuple(candidates) if isinstance(candidates, (list, tuple)) else (candidates,)
            try:
                spec = spec.set(SPACE_KEYS[key], values)
            except ValueError as exc:
                raise SemanticError(f"autotune space: {exc}", span) from None
        return spec

    def _params(self) -> tuple[Param, ...]:
        params: list[Param] = []
        bare: set[str] = set(self.defines) | self.given
        #: the OptimizerState parameters, flattened once every parameter's type is known
        states: list[tuple[int, ast.Param, OptimizerStateType]] = []
        for p in self.node.params:
            if p.annotation is None:
                self.diags.error(
                    f"parameter '{p.name}' needs a type, such as {p.name}: Tensor[\"N\", f32]",
                    p.span,
                )
                self.env[p.name] = POISON
                continue
            try:
                t = resolve_type(p.annotation, self.defines)
                self._warn_unimplemented(p.annotation)
                if isinstance(t, OptimizerStateType):
                    states.append((len(params), p, t))
                    continue
                t = self._local(p.annotation, t, f"'{p.name}'")
                default = None if p.default is None else self._default(p, t)
            except SemanticError as exc:
                self.diags.error(exc.message, exc.span, exc.notes)
                self.env[p.name] = POISON
                continue
            value = new_value(t, p.name, p.span)
            self.env[p.name] = value
            self.param_spans[value.id] = (p.name, p.span)
            params.append(Param(value, p.keyword_only, default))
            if isinstance(t, ScalarType) and t.kind == "int":
                bare.add(p.name)
            for dim in getattr(t, "dims", None) or ():
                if dim.symbol is not None:
                    bare.add(dim.symbol)
                    self.dims.setdefault(dim.symbol, dim)
        shift = 0  # the tensors of the states before, inserted already
        for index, p, t in states:
            tensors = self._state_param(p, t, params)
            params[index + shift : index + shift] = tensors
            shift += len(tensors)
        # An int parameter may give a size its value; any other parameter's name is its own.
        others = {p.value.name for p in params if p.value.type != ScalarType("int")}
        for param in params:
            self._check_param_dims(param.value, bare, others)
        return tuple(params)

    def _state_param(self, p: ast.Param, t: OptimizerStateType, params: list[Param]) -> list[Param]:
        """An ``OptimizerState`` parameter's tensors, as parameters of the Graph IR; the
        name is bound to the state (``graph.optstate``)."""
        try:
            if self.localizer is not None:
                raise SemanticError(
                    "an OptimizerState parameter on a mesh is not supported yet", p.span
                )
            types = {q.value.name: q.value.type for q in params}
            t = optstate.bind(t, p.annotation, types, self.node.name)
            twin = next((s.name for s in self.states if s.param == t.param), None)
            if twin is not None:
                raise SemanticError(
                    f"'{twin}' is the state of '{t.param}' already: a parameter has one "
                    "OptimizerState, which a returned state is written into",
                    p.span,
                )
            names = optstate.flat_names(p.name, t)
            taken = [n for n in names if n in {q.name for q in self.node.params}]
            if taken:
                raise SemanticError(
                    f"the state '{p.name}' passes its tensors as {', '.join(names)}, and a "
                    f"parameter is named '{taken[0]}': rename one",
                    p.span,
                )
        except SemanticError as exc:
            self.diags.error(exc.message, exc.span, exc.notes)
            self.env[p.name] = POISON
            return []
        values = tuple(new_value(t.field_type(), name, p.span) for name in names)
        for value in values:
            self.param_spans[value.id] = (value.name, p.span)
        self.env[p.name] = optstate.StateValue(t, values)
        self.states.append(optstate.slot(t, p.name))
        return [Param(value, p.keyword_only) for value in values]

    def _bound_result(self, declared: Any, node: ast.TypeExpr) -> Any:
        """The declared result with each ``OptimizerState`` bound to its parameter."""
        if isinstance(declared, TupleType):
            items = [a for a in node.args or () if isinstance(a, ast.TypeExpr)]
            pairs = zip(declared.items, items, strict=True)
            return TupleType(tuple(self._bound_result(t, a) for t, a in pairs))
        if not isinstance(declared, OptimizerStateType):
            return declared
        types = {}
        for q in self.node.params:
            value = self.env.get(q.name)
            if isinstance(value, (Value, optstate.StateValue)):
                types[q.name] = value.type
        return optstate.bind(declared, node, types, self.node.name)

    def _default(self, p: ast.Param, t: ValueType) -> bool | int | float:
        """The parameter's default, checked to be a constant of its type."""
        if not isinstance(t, ScalarType):
            raise SemanticError(
                f"only int, float and bool parameters may have defaults; '{p.name}' is {t}",
                p.default.span,
            )
        value = self.evaluator.eval(p.default).value
        ok = isinstance(value, Const) and (
            (t.kind == "bool" and isinstance(value.value, bool))
            or (t.kind == "int" and is_int(value))
            or (t.kind == "float" and is_number(value))
        )
        if not ok:
            raise SemanticError(
                f"the default of '{p.name}' must be a constant {t.kind}", p.default.span
            )
        return float(value.value) if t.kind == "float" else value.value

    def _check_param_dims(self, value: Value, bare: set[str], others: set[str]) -> None:
        name, span = self.param_spans[value.id]
        for dim in getattr(value.type, "dims", None) or ():
            unknown = sorted(dim.symbols() - bare)
            taken = sorted(dim.symbols() & others)
            if taken:
                self.diags.error(
                    f"the size '{taken[0]}' of '{name}' has the name of the parameter "
                    f"'{taken[0]}': sizes and parameters share one namespace, so rename one",
                    span,
                )
            elif unknown:
                self.diags.error(
                    f"the size '{unknown[0]}' of '{name}' cannot be known when the kernel runs: "
                    f'it appears only inside "{dim}"; declare it alone in some parameter, '
                    f"add an int parameter '{unknown[0]}', or fix it with -D {unknown[0]}=...",
                    span,
                )
            elif not dim.is_integral:
                numerator, denominator = dim.fraction()
                self.guard(
                    "divisible", numerator, denominator, f"'{name}' has a dim \"{dim}\"", span
                )
        self._packed_guard(value.type, f"'{name}'", span)

    def _packed_guard(self, t: object, shown: str, span: Span) -> None:
        """An i4 tensor's last dim is even (two elements to a byte): a constant one is
        checked at its annotation; a symbolic one, here, at the call."""
        if getattr(t, "dtype", None) is None or t.dtype.name != "i4" or not t.dims:
            return
        last = t.dims[-1]
        if last.constant is None:
            self.guard("divisible", last, Dim.const(2),
                       f"{shown} is i4, two to a byte: its last dim is even", span)  # fmt: skip

    # -- statements ----------------------------------------------------------------

    def _block(self, body: tuple[ast.Stmt, ...], top: bool = False) -> None:
        for stmt in body:
            if self.returned is not None and top:
                self.diags.error("code after 'return' is never run", stmt.span)
                return
            try:
                self._stmt(stmt, top)
            except SemanticError as exc:
                self.diags.error(exc.message, exc.span, exc.notes)
                for name in _assigned_names((stmt,)):
                    self.env[name] = POISON
                if isinstance(stmt, ast.Return):
                    self.returned = ()  # reported; "never returns" would be an echo

    def _stmt(self, stmt: ast.Stmt, top: bool) -> None:
        if isinstance(stmt, ast.Assign):
            self._assign(stmt.target, self.evaluator.eval(stmt.value))
        elif isinstance(stmt, ast.AugAssign):
            binop = ast.BinOp(stmt.op, stmt.target, stmt.value, span=stmt.span)
            self._assign(stmt.target, self.evaluator.eval(binop))
        elif isinstance(stmt, ast.ExprStmt):
            self._expr_stmt(stmt)
        elif isinstance(stmt, ast.Return):
            self._return(stmt, top)
        elif isinstance(stmt, ast.Pass):
            pass
        elif isinstance(stmt, ast.If):
            self._if(stmt)
        elif isinstance(stmt, ast.For):
            self._for(stmt)
        elif isinstance(stmt, ast.With):
            self._with(stmt)
        elif isinstance(stmt, ast.FunctionDef):
            raise SemanticError("functions cannot be defined inside functions", stmt.span)
        else:
            raise SemanticError("imports belong at the top of the file", stmt.span)

    def _assign(self, target: ast.Expr, ev: Ev) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = self._named(ev.value, target.id)
            return
        if isinstance(target, ast.TupleExpr):
            values = ev.value
            if isinstance(values, Poison):  # every name, nested ones too: no error after
                for element in target.elts:
                    self._assign(element, ev)
                return
            if isinstance(values, ShapeValue):  # B, S, E = x.shape: one size each
                values = tuple(DimValue(d) for d in values.dims)
            if not isinstance(values, tuple):
                raise SemanticError(
                    f"cannot unpack {describe(values)} into {len(target.elts)} names", ev.span
                )
            if len(values) != len(target.elts):
                raise SemanticError(
                    f"{ev.text} gives {len(values)} values, but {len(target.elts)} names "
                    "receive them",
                    target.span,
                )
            for element, value in zip(target.elts, values, strict=True):
                self._assign(element, Ev(value, ev.span, ev.source))
            return
        scatter = ""
        if isinstance(target, ast.Subscript) and self.kind == "tile":
            scatter = " (a scatter into a tile's rows is tile.scatter(x, index, values), "
            scatter += "or tile.scatter_add: each gives a new tile)"
        elif isinstance(target, ast.Subscript):
            scatter = " (a scatter, x[i, labels[i]] = v, is put_along_axis(x, labels, v, axis=-1), "
            scatter += "and += is scatter_add(x, labels, v, axis=-1): each gives a new tensor)"
        raise SemanticError(
            "only names can be assigned; tensors and tiles are values, not storage" + scatter,
            target.span,
        )

    def _named(self, value: Any, name: str) -> Any:
        """Give the value just computed a source name, for the printed IR."""
        if not isinstance(value, Value) or value.name is not None:
            return value
        ops = self.blocks[-1]
        for i in range(len(ops) - 1, -1, -1):
            op = ops[i]
            if value in op.results:
                renamed = Value(value.type, name, value.span, value.id)
                results = tuple(renamed if r is value else r for r in op.results)
                ops[i] = Op(
                    op.kind, op.operands, results, op.attrs, op.effects, op.regions, op.span
                )
                return renamed
        return value

    def _expr_stmt(self, stmt: ast.ExprStmt) -> None:
        if _is_ellipsis(stmt) or isinstance(stmt.value, ast.StrLit):
            return
        call = stmt.value
        ev = self.evaluator.eval(call)
        if isinstance(call, ast.Call) and isinstance(ev.value, Value):
            spec = GRAPH_OPS.get(print_expr(call.func))
            if (
                spec is not None
                and spec.in_place
                and call.args
                and isinstance(call.args[0], ast.Name)
            ):
                self.env[call.args[0].id] = self._named(ev.value, call.args[0].id)
                return
            op = self._producer(ev.value)
            if op is not None and not op.effects:
                self.diags.warning(f"the result of '{op.kind}' is not used", stmt.span)

    def _producer(self, value: Value) -> Op | None:
        return next((op for op in reversed(self.blocks[-1]) if value in op.results), None)

    def _return(self, stmt: ast.Return, top: bool) -> None:
        if not top:
            raise SemanticError(
                "'return' inside 'if', 'for' or 'with' is not supported: a kernel returns "
                "once, at the end of its body",
                stmt.span,
            )
        if stmt.value is None:
            declared = self._declared_result()
            if declared is not None:
                raise SemanticError(
                    f"'return' gives no value, but the declared result is {declared}",
                    stmt.span,
                    (Note("the result type is declared here", self.node.returns.span),),
                )
            self.returned = ()
            return
        ev = self.evaluator.eval(stmt.value)
        values = ev.value if isinstance(ev.value, tuple) else (ev.value,)
        if any(isinstance(v, Poison) for v in values):
            self.returned = ()
            return
        values = self._flat_states(values, ev)
        for v in values:
            if not isinstance(v, Value):
                raise SemanticError(f"a kernel returns tensors, not {describe(v)}", stmt.value.span)
        declared = _flat_result(self._declared_result())
        if declared is not None:
            wanted = result_types(declared)
            if len(values) != len(wanted):
                count = "one" if len(wanted) == 1 else str(len(wanted))
                raise SemanticError(
                    f"returns {len(values)} value{'s' if len(values) != 1 else ''}, but the "
                    f"declared result is {count} ({declared})",
                    stmt.value.span,
                    (Note("the result type is declared here", self.node.returns.span),),
                )  # fmt: skip
            values = tuple(
                self._match_result(v, t, ev) for v, t in zip(values, wanted, strict=True)
            )
            if self.kind == "tile" and len(values) > 1:
                _same_programs(values, wanted, stmt.value.span)
        self.returned = tuple(values)
        self.return_span = stmt.value.span

    def _flat_states(self, values: tuple[Any, ...], ev: Ev) -> tuple[Any, ...]:
        """The returned values with each ``OptimizerState`` as its tensors, checked
        against the declared result; each returned state is recorded as a slot."""
        declared = self._declared_result()
        wanted = result_types(declared) if declared is not None else ()
        returns = self.node.returns
        note = (Note("the result type is declared here", returns.span),) if returns else ()
        flat: list[Any] = []
        for i, v in enumerate(values):
            want = wanted[i] if len(wanted) == len(values) else None
            if isinstance(v, optstate.StateValue):
                if want is not None and (
                    not isinstance(want, OptimizerStateType)
                    or (want.param, want.fp32_master) != (v.type.param, v.type.fp32_master)
                ):
                    raise SemanticError(
                        f"returns {v.type}, but the declared result is {want}", ev.span, note
                    )
                self.states.append(optstate.slot(v.type, result=len(flat)))
                flat.extend(v.values)
            elif isinstance(want, OptimizerStateType):
                raise SemanticError(
                    f"returns {describe(v)}, but the declared result is {want}", ev.span, note
                )
            else:
                flat.append(v)
        return tuple(flat)

    def _declared_result(self) -> ValueType | TupleType | None:
        if self.node.returns is None:
            return None
        try:
            declared = resolve_result(self.node.returns, self.defines)
            declared = self._local_result(self.node.returns, declared, record=False)
            return self._bound_result(declared, self.node.returns)
        except SemanticError:
            return None  # already reported

    def _check_result_names(self, params: tuple[Param, ...], declared: bool) -> None:
        """No parameter takes the name a result is passed under, or ``out``, which a call
        passes them as (``out=``, ``out=(a, b)``): not even in a function without a
        result, whose parameter the runtimes would take for one."""
        taken = {RESULT, *result_names(len(self.returned or ()))}
        hint = "" if declared else ", and declare a result with '-> Tensor[...]'"
        for p in params:
            if p.value.name in taken:
                self.diags.error(
                    f"a parameter of '{self.node.name}' cannot be named '{p.value.name}': that "
                    f"is the name a result is passed under (a call's {RESULT}=); rename the "
                    f"parameter{hint}",
                    self.param_spans[p.value.id][1],
                )

    def _check_old_default(self, got: TensorType, declared: TensorType, ev: Ev) -> None:
        """A declared result of the shape that a reduction without ``axis=`` gave when it
        reduced the last axis only: the program relied on that default."""
        if got.dims == declared.dims:
            return
        span = next((span for old, span in self.every_axis if old == declared.dims), None)
        if span is not None:
            raise SemanticError(
                f"returns {dims_text(got.dims)}, but the declared result is "
                f"{dims_text(declared.dims)}, which a reduction without axis= gave when it "
                "reduced only the last axis: it now reduces every axis, as numpy and PyTorch "
                "do; write axis=-1 to reduce the last one",
                ev.span,
                (Note("the reduction without axis= is here", span),
                 Note("the result type is declared here", self.node.returns.span)),
            )  # fmt: skip

    def _match_result(self, value: Value, declared: ValueType, ev: Ev) -> Value:
        note = (Note("the result type is declared here", self.node.returns.span),)
        got = value.type
        if not isinstance(declared, TensorType) or not isinstance(got, (TensorType, TileType)):
            if got != declared:
                raise SemanticError(
                    f"returns {got}, but the declared result is {declared}", ev.span, note
                )
            return value
        if isinstance(got, TileType):
            if got.rank > declared.rank:
                raise SemanticError(
                    f"returns a rank-{got.rank} tile into a rank-{declared.rank} result",
                    ev.span,
                    note,
                )
        else:
            self._check_old_default(got, declared, ev)
            if got.rank != declared.rank:
                raise SemanticError(
                    f"returns {dims_text(got.dims)}, but the declared result is "
                    f"{dims_text(declared.dims)}", ev.span, note,
                )  # fmt: skip
            for have, want in zip(got.dims, declared.dims, strict=True):
                if have == want or self.localizer is not None:
                    # on a mesh, the distribution pass gathers or splits the value to
                    # the result's layout, then checks the dims (graph/distribute.py)
                    continue
                if (have.constant is not None and want.constant is not None) or (
                    have.constant is None and want.constant is None
                ):
                    raise SemanticError(
                        f"returns {dims_text(got.dims)}, but the declared result is "
                        f"{dims_text(declared.dims)}", ev.span, note,
                    )  # fmt: skip
                self.guard("equal", have, want, "result shape", ev.span)
        if got.dtype == declared.dtype:
            return value
        if got.dtype == accumulator(declared.dtype, declared.policies):
            cast = "tile.cast" if isinstance(got, TileType) else "cast"
            result = (
                got.with_(dtype=declared.dtype)
                if isinstance(got, TileType)
                else TensorType(got.dims, declared.dtype)
            )
            return self.emit(cast, (value,), (result,), (("dtype", declared.dtype),), (), ev.span)[
                0
            ]
        raise SemanticError(
            f"returns {got.dtype}, but the declared result is {declared.dtype}; "
            f"convert it with cast(..., {declared.dtype})",
            ev.span, note,
        )  # fmt: skip

    def _with(self, stmt: ast.With) -> None:
        texts = []
        for item in stmt.items:
            call = item.context
            name = print_expr(call.func) if isinstance(call, ast.Call) else None
            if name not in ("device", "prefetch", "mesh"):
                raise SemanticError(
                    "a 'with' item is device(...), prefetch(...) or mesh(...)",
                    item.context.span,
                )
            if item.target is not None:
                raise SemanticError(
                    f"{name}(...) gives no value to bind with 'as'", item.target.span
                )
            if name == "mesh":
                if len(stmt.items) != 1:
                    raise SemanticError("a 'with mesh(...)' block names nothing else", call.span)
                self.mesh_depth += 1
                try:
                    self._block(stmt.body)
                finally:
                    self.mesh_depth -= 1
                return
            args = [*call.args, *(k.value for k in call.keywords)]
            if name == "device":
                if len(args) != 1 or not _is_device(args[0]):
                    raise SemanticError("device() takes one device: gpu, cpu or gpu[i]", call.span)
                args = []
            for arg in args:
                value = self.evaluator.eval(arg).value
                if isinstance(value, Poison):
                    return
            self.diags.warning(not_yet(f"with {name}(...)"), call.span)
            texts.append(print_expr(call))
        self.with_attrs.extend(texts)
        try:
            self._block(stmt.body)
        finally:
            del self.with_attrs[-len(texts) :]

    def _unrolled(self, stmt: ast.For) -> None:
        """``for i in range(LAYERS):`` or ``for w in (w1, w2):`` in a graph function (or a
        tile kernel): the body once per number or value, as a Python trace would run it
        (JAX's ``jit`` unrolls such a loop too). A graph function is a dataflow: a loop
        whose count only the call would know has no such unrolling, and is refused."""
        call = stmt.iter
        callee = print_expr(call.func) if isinstance(call, ast.Call) else ""
        if callee == "range":
            items = self._range(call)
        elif not callee.startswith("tile."):
            items = self._items(stmt.iter)
        else:
            raise SemanticError(_NOT_UNROLLED, call.span)
        if items is None:
            return
        if len(items) > _MOST_UNROLLED:
            raise SemanticError(
                f"a loop in a graph function is unrolled, and {len(items)} iterations are "
                f"more than {_MOST_UNROLLED}: write the repeated work as one tensor operation",
                stmt.iter.span,
            )
        if not isinstance(stmt.target, ast.Name):
            raise SemanticError("a loop binds one name", stmt.target.span)
        for item in items:
            self.env[stmt.target.id] = Const(item) if isinstance(item, int) else item
            self._block(stmt.body)

    def _range(self, call: ast.Call) -> range | None:
        """The numbers of ``range(...)``; None where an argument had an error."""
        if call.keywords or not 1 <= len(call.args) <= 3:
            raise SemanticError("range takes one to three integers", call.span)
        bounds = []
        for arg in call.args:
            v = self.evaluator.eval(arg).value
            if isinstance(v, Poison):
                return None
            if isinstance(v, DimValue) and v.dim.constant is not None:
                v = Const(v.dim.constant)
            if not is_int(v):
                raise SemanticError(
                    f"a loop in a graph function is unrolled, so its range needs integers "
                    f"known at compile time, not {describe(v)}",
                    arg.span,
                )
            bounds.append(v.value)
        if len(bounds) == 3 and bounds[2] == 0:
            raise SemanticError("range's step cannot be zero", call.args[2].span)
        return range(*bounds)

    def _items(self, iterable: ast.Expr) -> list | None:
        """The items of a tuple or list a loop runs over: tensors (``(w1, w2)``), numbers,
        sizes; None where it had an error."""
        v = self.evaluator.eval(iterable).value
        if isinstance(v, Poison):
            return None
        if isinstance(v, Const) and isinstance(v.value, (tuple, list)):
            v = v.value
        if not isinstance(v, (tuple, list)):
            raise SemanticError(_NOT_UNROLLED, iterable.span)
        return [
            (
                item
                if isinstance(item, Value)
                else DimValue(item) if isinstance(item, Dim) else Const(item)
            )
            for item in v
        ]

    def _if(self, stmt: ast.If) -> None:
        test = self.evaluator.eval(stmt.test)
        v = test.value
        if isinstance(v, Poison):
            return
        if isinstance(v, Const):
            self._block(stmt.body if v.value else stmt.orelse)
            return
        if self.kind != "tile" or not (isinstance(v, Value) and v.type == ScalarType("bool")):
            where = (
                "in a tile kernel, on a bool parameter"
                if self.kind == "tile"
                else "in tile kernels"
            )
            raise SemanticError(
                f"'if' needs a condition known at compile time; branching on {describe(v)} "
                f"is only possible {where}",
                stmt.test.span,
            )
        before = dict(self.env)
        branches = []
        for body in (stmt.body, stmt.orelse):
            self.env = dict(before)
            self.blocks.append([])
            self._block(body)
            branches.append((self.blocks.pop(), self.env))
        self.env = before
        assigned = _assigned_names(stmt.body + stmt.orelse)
        for name in assigned:
            chosen = [env.get(name, before.get(name)) for _, env in branches]
            if chosen[0] != chosen[1] and not all(isinstance(c, Value) for c in chosen):
                number = next(c for c in chosen if not isinstance(c, Value))
                raise SemanticError(
                    f"'{name}' is {describe(number)} known at compile time on one branch of "
                    f"this 'if', which tests {describe(v)} only known when the kernel runs: "
                    "numbers are folded where they are used, so the branches cannot choose "
                    f"between them; give '{name}' a value computed at run time on both "
                    "branches (from a float parameter, or a tile such as tile.full(...))",
                    stmt.span,
                )
        names = [n for n in assigned if all(isinstance(env.get(n), Value) for _, env in branches)]
        for name in names:
            a, b = (env[name].type for _, env in branches)
            if a != b:
                raise SemanticError(
                    f"'{name}' has type {a} on one branch and {b} on the other", stmt.span
                )
        blocks = tuple(Block((), tuple(ops), tuple(env[n] for n in names)) for ops, env in branches)
        results = self.emit(
            "if", (v,), tuple(branches[0][1][n].type for n in names), (), (), stmt.span
        )
        op = self.blocks[-1].pop()
        self.blocks[-1].append(
            Op("if", op.operands, op.results, op.attrs, op.effects, blocks, op.span)
        )
        for name, result in zip(names, results, strict=True):
            self.env[name] = self._named(result, name)

    def _for(self, stmt: ast.For) -> None:
        call = stmt.iter
        if self.kind != "tile" or (isinstance(call, ast.Call) and print_expr(call.func) == "range"):
            self._unrolled(stmt)
            return
        if not isinstance(stmt.target, ast.Name):
            raise SemanticError("a tile loop binds one name", stmt.target.span)
        if not (isinstance(call, ast.Call) and print_expr(call.func) == "tile.range_n"):
            raise SemanticError(
                "a tile loop iterates over tile.range_n(extent, block), or over range(...) "
                "of numbers known at compile time, which is unrolled",
                stmt.iter.span,
            )
        spec = GRAPH_OPS["tile.range_n"]
        args = [self.evaluator.eval(a) for a in call.args]
        keywords = [(k.name, self.evaluator.eval(k.value), k.span) for k in call.keywords]
        if any(isinstance(e.value, Poison) for e in [*args, *(k[1] for k in keywords)]):
            return
        bound = bind(spec, args, keywords, call.span, "tile.range_n")
        extent, block, prefetch = range_extent(OpCall(spec, bound, call.span, self, "tile.range_n"))
        if block.constant is not None and block.spelled is None:
            # a literal step is a size of the kernel's, as a tile's is (``Dim.spelled``)
            block = Dim.named(block.constant, Dim.sym(f"{stmt.target.id}.block"))
        before = dict(self.env)
        carried = [n for n in _assigned_names(stmt.body) if isinstance(before.get(n), Value)]
        index = new_value(BlockType(block, extent), stmt.target.id, stmt.target.span)
        args_in = [new_value(before[n].type, n, before[n].span) for n in carried]
        self.env[stmt.target.id] = index
        for name, arg in zip(carried, args_in, strict=True):
            self.env[name] = arg
        self.blocks.append([])
        self._block(stmt.body)
        ops = self.blocks.pop()
        yields = []
        for name in carried:
            value = self.env[name]
            if isinstance(value, Value) and value.type != before[name].type:
                raise SemanticError(
                    f"'{name}' changes type in the loop: {before[name].type} before it, "
                    f"{value.type} after one iteration",
                    stmt.span,
                )
            yields.append(value if isinstance(value, Value) else before[name])
        self.env = before
        attrs: tuple = (("extent", extent), ("block", block))
        if prefetch is not None:
            attrs += (("prefetch", prefetch),)
        region = Block((index, *args_in), tuple(ops), tuple(yields))
        results = self.emit(
            "tile.for",
            tuple(before[n] for n in carried),
            tuple(before[n].type for n in carried),
            attrs,
            (),
            stmt.span,
        )
        op = self.blocks[-1].pop()
        self.blocks[-1].append(
            Op(op.kind, op.operands, op.results, op.attrs, op.effects, (region,), op.span)
        )
        for name, result in zip(carried, results, strict=True):
            self.env[name] = self._named(result, name)


#: The tile sizes whose blocks belong to the programs: a result's dim tiled by one is
#: split among them (``T.m`` its rows, ``T.n`` its columns in a gemm-like grid).
_PROGRAM_TILES = frozenset({"T.m", "T.n"})


def _same_programs(values: tuple[Value, ...], declared: tuple[Any, ...], span: Span) -> None:
    """A tile kernel that returns several tiles writes them all from the same programs,
    gridded by the first: each program stores its block of every result. So the tiles
    agree in the axes that ``T.m`` or ``T.n`` tile, and the results agree in the dims
    the grid walks (their batch dims and the dims those tiles split); a whole dim
    (``C``, ``T.d``, a number) may differ: a row kernel returns its rows ``[T.m, C]``
    and a statistic of each, ``[T.m, 2]``, or ``[T.m]`` (a tile may leave out trailing
    axes that one program covers whole; not one that the programs split, which every
    program along it would store over the same elements). An error at the ``return``
    otherwise."""
    first, first_out = values[0].type, declared[0]
    for i, (v, out) in enumerate(zip(values[1:], declared[1:], strict=True), start=1):
        if not isinstance(v.type, TileType) or not isinstance(first, TileType):
            raise SemanticError(
                f"a tile kernel returns tiles: value {i + 1} of the return is {describe(v)}",
                span,
            )
        dropped = first.dims[v.type.rank :]
        if (
            v.type.rank > first.rank
            or any(d.symbol in _PROGRAM_TILES for d in dropped)
            or any(
                a != b and _PROGRAM_TILES & {a.symbol, b.symbol}
                for a, b in zip(v.type.dims, first.dims[: v.type.rank], strict=True)
            )
        ):
            raise SemanticError(
                "the tiles a tile kernel returns are stored by the same programs, so they "
                "agree in the axes T.m and T.n tile, and leave out only trailing axes that "
                f"one program covers whole: the first is {dims_text(first.dims)}, value "
                f"{i + 1} {dims_text(v.type.dims)}",
                span,
            )
        lead = first_out.rank - first.rank
        walked = [a for a in range(first_out.rank)
                  if a < lead or first.dims[a - lead].symbol in _PROGRAM_TILES]  # fmt: skip
        if out.rank != first_out.rank - len(dropped) or any(
            out.dims[a] != first_out.dims[a] for a in walked
        ):
            raise SemanticError(
                f"the results of a tile kernel are stored by the same programs, which the "
                f"first result grids: result {i + 1} is {dims_text(out.dims)}, the first "
                f"{dims_text(first_out.dims)}, and their tiles are {dims_text(first.dims)}; "
                "they must agree in the dims the programs walk (all but a whole dim a tile "
                "spans)",
                span,
            )


def _flat_result(declared: Any) -> Any:
    """A declared result with each ``OptimizerState`` as its tensors: what the Graph IR
    returns."""
    items = result_types(declared)
    if not any(isinstance(t, OptimizerStateType) for t in items):
        return declared
    flat = []
    for t in items:
        flat.extend([t.field_type()] * len(t.fields) if isinstance(t, OptimizerStateType) else [t])
    return TupleType(tuple(flat))


def _is_device(node: ast.Expr) -> bool:
    if isinstance(node, ast.Subscript):
        return (
            _is_device(node.value)
            and len(node.index) == 1
            and isinstance(node.index[0], ast.IntLit)
        )
    return isinstance(node, ast.Name) and node.id in ("gpu", "cpu")


def _is_docstring(stmt: ast.Stmt, body: tuple[ast.Stmt, ...]) -> bool:
    return stmt is body[0] and isinstance(stmt, ast.ExprStmt) and isinstance(stmt.value, ast.StrLit)


def _is_ellipsis(stmt: ast.Stmt) -> bool:
    return isinstance(stmt, ast.ExprStmt) and isinstance(stmt.value, ast.EllipsisLit)


class _Inlined(_FunctionAnalyzer):
    """Another graph function of the file, called from ``caller``: its body runs on the
    caller's values and its ops join the caller's, so that fusion sees one dataflow. Its
    sizes are the caller's dims (``"C"`` of its ``Tensor["R", "C", f32]`` stands for
    whatever the argument's last dim is), its guards become the caller's, and an error
    in it points at its line, with a note at the call."""

    def __init__(self, caller: _FunctionAnalyzer, node: ast.FunctionDef, span: Span) -> None:
        super().__init__(caller.owner, node)
        self.blocks, self.guards, self.regions = caller.blocks, caller.guards, caller.regions
        # a cache it appends to, or a state it updates, is the caller's too
        self.donated = caller.donated
        self.caller = caller
        self.with_attrs, self.param_spans = caller.with_attrs, caller.param_spans
        self.stack = (*caller.stack, node.name)
        self.diags = _CalledFrom(caller.diags, Note(f"in this call of {node.name}()", span))
        self.span = span

    def call(self, args: list[Ev], keywords: list) -> Value | Poison:
        if self.node.returns is None:
            raise SemanticError(
                f"{self.node.name}() returns nothing: a call takes the result of a function "
                "that declares one",
                self.span,
            )
        bound = self._bind(args, keywords)
        for name, ev in bound.items():
            self.env[name] = ev.value
        if any(isinstance(ev.value, Poison) for ev in bound.values()):
            return POISON
        self._sizes(bound)
        errors = self.diags.error_count
        start = len(self.blocks[-1])
        self._block(tuple(s for s in self.node.body if not _is_docstring(s, self.node.body)), True)
        if self.diags.error_count > errors or not self.returned:
            return POISON
        custom_region(self.caller, self.node, bound, self.returned, start, self.span)
        return self.returned if len(self.returned) > 1 else self.returned[0]

    def _bind(self, args: list[Ev], keywords: list) -> dict[str, Ev]:
        """The arguments by parameter, as Python binds them; defaults filled in."""
        name = self.node.name
        params = self.node.params
        positional = [p.name for p in params if not p.keyword_only]
        if len(args) > len(positional):
            raise SemanticError(
                f"{name}() takes {len(positional)} positional arguments, {len(args)} given",
                args[len(positional)].span,
            )
        bound = dict(zip(positional, args, strict=False))
        for keyword, ev, span in keywords:
            if keyword not in {p.name for p in params}:
                raise SemanticError(f"{name}() has no parameter '{keyword}'", span)
            if keyword in bound:
                raise SemanticError(f"{name}() got '{keyword}' twice", span)
            bound[keyword] = ev
        for p in params:
            if p.name not in bound:
                if p.default is None:
                    raise SemanticError(f"{name}() is missing '{p.name}'", self.span)
                bound[p.name] = self.evaluator.eval(p.default)
        return bound

    def _sizes(self, bound: dict[str, Ev]) -> None:
        """Give the function's sizes the dims of the arguments, and check each argument
        against its parameter's type: a size alone in a dim first (``"C"``), then the
        dims made of sizes (``"C/4"``), which must agree, here or at run time."""
        declared = {}
        for p in self.node.params:
            if p.annotation is None:
                raise SemanticError(f"{self.node.name}() has a parameter without a type", self.span)
            t = resolve_type(p.annotation, self.defines)
            ev = bound[p.name]
            given = ev.value.type if isinstance(ev.value, Value) else None
            where = f"{self.node.name}(): '{p.name}'"
            if isinstance(t, ScalarType):
                self._scalar(p.name, t, ev, where)
                continue
            if not isinstance(t, TensorType) or not isinstance(given, TensorType):
                raise SemanticError(f"{where} is {t}, given {describe(ev.value)}", ev.span)
            if given.rank != t.rank or given.dtype != t.dtype:
                raise SemanticError(f"{where} is {_shown(t)}, given {_shown(given)}", ev.span)
            declared[p.name] = (t, given, ev)
            for want, have in zip(t.dims, given.dims, strict=True):
                if want.symbol is not None:
                    self.dims.setdefault(want.symbol, have)
        self.defines.update(self.dims)
        for name, (t, given, ev) in declared.items():
            for want, have in zip(t.dims, given.dims, strict=True):
                want = want.substitute(self.defines)
                if want == have:
                    continue
                if want.constant is not None and have.constant is not None:
                    raise SemanticError(
                        f"{self.node.name}(): '{name}' is {_shown(t)}, given {_shown(given)}",
                        ev.span,
                    )
                self.guard("equal", have, want, f"{self.node.name}(): '{name}' shape", ev.span)

    def _scalar(self, name: str, t: ScalarType, ev: Ev, where: str) -> None:
        """A scalar argument: a number, or a scalar value, of the parameter's kind; an
        int that names a size gives it its value."""
        v = ev.value
        if isinstance(v, DimValue) and t.kind == "int":
            self.dims[name] = v.dim
            return
        if isinstance(v, Const):
            ok = {"int": is_int(v), "float": is_number(v), "bool": isinstance(v.value, bool)}
            if not ok[t.kind]:
                raise SemanticError(f"{where} is {t.kind}, given {describe(v)}", ev.span)
            if t.kind == "int":
                self.dims[name] = Dim.const(v.value)
            return
        if not isinstance(v, Value) or v.type != t:
            raise SemanticError(f"{where} is {t.kind}, given {describe(v)}", ev.span)
        if t.kind == "int" and v.name is not None:
            self.dims[name] = Dim.sym(v.name)  # the caller's int parameter, a size there


class _LibraryCall(_Inlined):
    """A graph function of a library module (``graph.kvattend``), called as a function
    of the file is (``_Inlined``); the names it calls are the module's functions, never
    the file's."""

    def __init__(self, caller: _FunctionAnalyzer, module: ast.Module, span: Span) -> None:
        self.library = {f.name: f for f in module.body if isinstance(f, ast.FunctionDef)}
        super().__init__(caller, self.library["attend"], span)

    def function_named(self, name: str, span: Span) -> FunctionRef | None:
        node = self.library.get(name)
        return FunctionRef(node) if node is not None and node is not self.node else None


class _TileCall(_Inlined):
    """A tile kernel of the file, called from a graph function: one ``tile_call`` op,
    launched as a kernel of its own, as a library op launches a library kernel. Its
    arguments bind and check as a graph function's do (sizes from the arguments' dims,
    guards where they are symbolic); the kernel is analysed again with the arguments'
    types (``TileCallee``), and its scalar parameters take the scalar arguments: run-time
    values are the op's operands after the tensors, numbers its attributes."""

    def call(self, args: list[Ev], keywords: list) -> Value | tuple[Value, ...] | Poison:
        name = self.node.name
        if self.node.returns is None:
            raise SemanticError(
                f"{name}() is a tile kernel that returns nothing: called from a graph "
                "function it would store into its arguments, and a graph function never "
                "changes a value in place; return the tile, declare the result "
                "('-> Tensor[...]'), and use the value the call gives",
                self.span,
            )
        bound = self._bind(args, keywords)
        if any(isinstance(ev.value, Poison) for ev in bound.values()):
            return POISON
        self._sizes(bound)
        results = self._results()
        operands: list[Value] = []
        names: list[str] = []
        constants: list[tuple[str, Any]] = []
        typed: dict[str, TensorType] = {}
        for p in self.node.params:
            value = bound[p.name].value
            if isinstance(value, Value) and isinstance(value.type, TensorType):
                # the declared dims in the caller's sizes: two arguments that a guard
                # checks agree (``C`` of both ``x`` and ``b``) have one size in the kernel
                declared = resolve_type(p.annotation, self.defines)
                typed[p.name] = in_memory(replace(value.type, dims=declared.dims))
                twice = next((q for q, v in zip(names, operands, strict=True) if v is value), None)
                if twice is not None and typed[twice] != typed[p.name]:
                    raise SemanticError(
                        f"{name}(): one tensor is passed as '{twice}' and as '{p.name}', "
                        "which the kernel declares with other dims; pass a copy as one",
                        bound[p.name].span,
                    )
            if isinstance(value, Value):
                operands.append(value)
                names.append(p.name)
            elif isinstance(value, Const):
                kind = resolve_type(p.annotation, self.defines).kind
                constants.append((p.name, float(value.value) if kind == "float" else value.value))
            else:
                raise SemanticError(
                    f"{name}(): '{p.name}' is a size here; a tile kernel's int parameter takes "
                    "a number or an int parameter of the caller",
                    bound[p.name].span,
                )
        function = self._typed(typed, results)
        store = next((op for op in walk(function.body) if op.kind == "tile.store"), None)
        if store is not None:
            raise SemanticError(
                f"{name}() stores into its argument '{store.operands[0].name}': called from a "
                "graph function it would change a graph value in place; return what it "
                "computes instead (several tiles, 'return a, b', declared as "
                "'-> tuple[Tensor[...], Tensor[...]]')",
                self.span,
                (Note("the store", store.span),),
            )
        for guard in function.guards:
            self.guard(guard.kind, guard.left, guard.right, guard.reason, guard.span)
        attrs = (
            ("kernel", TileCallee(name, function)), ("params", tuple(names)),
            ("constants", tuple(constants)),
        )  # fmt: skip
        start = len(self.blocks[-1])
        values = self.emit("tile_call", tuple(operands), results, attrs, (), self.span)
        custom_region(self.caller, self.node, bound, values, start, self.span)
        return values[0] if len(values) == 1 else values

    def _results(self) -> tuple[TensorType, ...]:
        """The kernel's declared results (one, or the tensors of a tuple) with their
        sizes the caller's dims."""
        declared = resolve_result(self.node.returns, dict(self.owner.options.defines))
        span = self.node.returns.span
        results = []
        for t in result_types(declared):
            if not isinstance(t, TensorType):
                raise SemanticError(
                    f"{self.node.name}() returns {declared}: a tile kernel called from a "
                    "graph function returns tensors",
                    span,
                )
            unknown = sorted(s for d in t.dims for s in d.symbols() if s not in self.dims)
            if unknown:
                raise SemanticError(
                    f"{self.node.name}(): the size '{unknown[0]}' of its result is no "
                    "argument's size, so the call cannot say it",
                    self.span,
                    (Note("the result is declared here", span),),
                )
            dims = tuple(d.substitute(self.dims) for d in t.dims)
            results.append(in_memory(TensorType(dims, t.dtype, t.policies)))
        return tuple(results)

    def _typed(self, typed: dict[str, TensorType], results: tuple[TensorType, ...]) -> Function:
        """The kernel analysed with its tensor parameters and result of these types. An
        error in it is the call's, with a note at the kernel's line: an error of the
        kernel as written (said where it is defined too, unless ``--kernel`` leaves it
        out), or one that only these types give."""
        sizes = frozenset(
            s for t in (*typed.values(), *results) for d in t.dims for s in d.symbols()
        )
        # the kernel's own names for the sizes that the call fixes (``FixedSizes``)
        defines = dict(self.owner.options.defines)
        declared = {p.name: resolve_type(p.annotation, defines) for p in self.node.params
                    if p.name in typed and p.annotation is not None}  # fmt: skip
        declared_results = result_types(resolve_result(self.node.returns, defines))
        node, fixed = typed_for_caller(self.node, declared, declared_results, typed, results, sizes)
        function, error = _analysed(self.owner, node, sizes, fixed)
        if error is None:
            assert function is not None
            return function
        _, own = _analysed(self.owner, self.node, self.owner.given)
        why = "has an error" if own is not None else "does not accept these arguments"
        first = own or error
        raise SemanticError(
            f"{self.node.name}() {why}: {first.message}",
            self.span,
            (Note("the kernel's line", first.span), *first.notes),
        )


def _analysed(
    owner: _ModuleAnalyzer, node: ast.FunctionDef, given: frozenset[str],
    fixed: dict[str, Dim] | None = None,
) -> tuple[Function | None, Diagnostic | None]:  # fmt: skip
    """``node`` analysed as a function of the module, with the sizes ``given`` known
    from outside, and those of ``fixed`` fixed to their dims, and its first error, if
    any, which is not reported."""
    analyzer = _FunctionAnalyzer(owner, node)
    analyzer.given = given
    analyzer.defines.update(fixed or {})
    analyzer.diags = Diagnostics()
    function = analyzer.run()
    errors = [d for d in analyzer.diags.items if d.severity is Severity.ERROR]
    return function, errors[0] if errors else None


def _shown(t: TensorType) -> str:
    return f"{dims_text(t.dims)} {t.dtype}"


class _CalledFrom:
    """The caller's diagnostics, with a note at the call on each error in the called
    function's body. An error that the function's own analysis reported already, at
    the same place, is not said twice."""

    def __init__(self, diags: Any, note: Note) -> None:
        self._diags = diags
        self._note = note

    @property
    def error_count(self) -> int:
        return self._diags.error_count

    @property
    def items(self) -> tuple[Any, ...]:
        return self._diags.items

    def error(self, message: str, span: Span | None = None, notes: tuple[Note, ...] = ()) -> None:
        if any(d.message == message and d.span == span for d in self._diags.items):
            self._diags.error(f"{message} (as reported above)", self._note.span)
            return
        self._diags.error(message, span, (*notes, self._note))

    def warning(self, message: str, span: Span | None = None) -> None:
        if not any(d.message == message and d.span == span for d in self._diags.items):
            self._diags.warning(message, span)
