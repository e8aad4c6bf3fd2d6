"""The schedule stage: each fused kernel of the Graph IR gets a launch.

A kernel takes its function's explicit schedule when it has one (a point,
checked against the hardware, or a space, from which the best-scoring
feasible candidate is picked), and the heuristic's choice otherwise. An
explicit schedule the hardware cannot run is an error at its decorator.
"""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Any

from ...frozen import frozen
from ..frontend.diagnostics import Diagnostics, Note
from ..frontend.source import Span
from ..graph.dims import Dim
from ..graph.fusion import kernel_order
from ..graph.graph_ops import DRAWN, ELEMENTWISE_MATH, rows_permuted
from ..graph.ir import Block, Function, GraphModule, Group, Guard, Op, Value, walk
from ..graph.kvcache import cache_param, rolling_window
from ..graph.printer import value_names
from ..graph.schedule_spec import ScheduleSpec
from ..graph.types import KVCacheType, TensorType, TileType, result_types
from ..options import Options
from .hardware import Hardware, hardware_for
from .heuristics import default_knobs, loop_tiles, score, walking_rows
from .ir import CacheSlot, GridDim, HostProgram, Launch, ScheduleModule
from .memory import Interval, plan_buffers
from .problem import Problem
from .resources import resources
from .tuned import CacheWarning, TunedRecord, TunedSchedules, TuningKey, bucket_of, space_of
from .verify import verify_schedule

__all__ = [
    "schedule_module", "tuning_points", "TuningPoint", "SCHEDULED_KINDS", "TEMPLATES",
    "template_of",
]  # fmt: skip

#: Kernel kinds that an explicit schedule applies to: the ones with output tiles.
SCHEDULED_KINDS = ("gemm", "attention", "tile", "tile_call")
#: Attention's kernels whose programs own blocks of keys, not of queries.
_OWN_KEYS = frozenset({"attention_dkdv"})
#: Kernels that are not launched on the device.
_NOT_LAUNCHED = ("host", "collective")
#: The kernel each graph op instantiates, by its op's kind; the ones with a library
#: kernel in tessera/stdlib/ are the tile stage's anchors.
TEMPLATES = {
    "softmax": "softmax", "softmax_safe": "softmax", "log_softmax": "log_softmax",
    "logsumexp_safe": "logsumexp",
    "layernorm": "layernorm", "layernorm_safe": "layernorm", "rmsnorm": "rmsnorm",
    "rmsnorm_safe": "rmsnorm", "sum": "row_sum", "max": "row_max", "mean": "row_mean",
    "matmul": "gemm", "flash_attention": "flash_attention", "transpose": "transpose",
    "kvcache.append": "kvcache_append", "kvcache.advance": "kvcache_advance",
    "kvcache.visible": "kvcache_visible", "kvcache.lengths": "kvcache_lengths",
    "all_reduce": "all_reduce",
    "rotary_embedding": "rotary_embedding", "take_along_axis": "take_along_axis",
    "put_along_axis": "put_along_axis", "scatter_add": "scatter_add", "pad": "pad",
    "attention_stats": "attention_stats", "attention_dq": "attention_dq",
    "attention_dkdv": "attention_dkdv", "softmax_grad": "softmax_grad",
    "log_softmax_grad": "log_softmax_grad", "layernorm_grad": "layernorm_grad",
    "rmsnorm_grad": "rmsnorm_grad", "norm_param_grad": "norm_param_grad",
}  # fmt: skip


def template_of(op: Op) -> str | None:
    """The kernel ``op`` instantiates: its kind's, except that a matmul reading its
    ``b`` transposed (``trans_b``, from ``a @ b.T``) takes ``b``'s rows as its columns,
    a transpose that keeps the last axis is a view, which instantiates nothing, and a
    call of the file's tile kernel instantiates that kernel."""
    if op.kind == "tile_call":
        return str(op.attr("kernel"))
    if op.kind == "matmul" and op.attr("trans_b"):
        return "gemm_nt"
    if rows_permuted(op):
        return None
    return TEMPLATES.get(op.kind)


def schedule_module(
    graph: GraphModule, options: Options, diags: Diagnostics, fingerprints: dict[str, str]
) -> ScheduleModule:
    """The schedule of every function; ``fingerprints`` (``frontend.fingerprint``) key the
    tuned schedules of ``options.schedule_cache``."""
    hw = _hardware(options)
    programs = tuple(
        _Scheduler(f, hw, diags, options.schedule_cache, fingerprints.get(f.name, "")).run()
        for f in graph.functions
    )
    module = ScheduleModule(graph.name, hw.target, hw.arch, programs)
    diags.check()  # a kernel that no schedule fits is the program's error, said at its line
    verify_schedule(module, {f.name: len(f.groups) for f in graph.functions}, hw)
    return module


@frozen
class TuningPoint:
    """A launch the autotuner can tune: where its records go, and what it may try."""

    key: TuningKey
    problem: Problem
    hw: Hardware
    #: The schedule the compiler picks without a record (the heuristic's, or the best-scored
    #: candidate of the function's space), and that space if there is one.
    default: dict[str, Any]
    space: ScheduleSpec | None
    span: Span | None


def tuning_points(
    graph: GraphModule, options: Options, fingerprints: dict[str, str], toolchain: str
) -> list[TuningPoint]:
    """Every launch whose schedule a tuned record may choose, in program order. A launch
    with an explicit point (``@kernel.schedule``) is the author's choice and is left out."""
    hw = _hardware(options)
    points = []
    for f in graph.functions:
        scheduler = _Scheduler(f, hw, Diagnostics(), None, fingerprints.get(f.name, ""))
        for group in f.groups:
            point = scheduler.tuning_point(group, toolchain)
            if point is not None:
                points.append(point)
    return points


def _hardware(options: Options) -> Hardware:
    assert options.target is not None, "the pipeline runs this stage only with a target"
    arch = options.resolved_arch
    assert arch is not None
    return hardware_for(options.target, arch)


class _Scheduler:
    def __init__(
        self,
        function: Function,
        hw: Hardware,
        diags: Diagnostics,
        tuned: TunedSchedules | None,
        fingerprint: str,
    ) -> None:
        self.function = function
        self.hw = hw
        self.diags = diags
        self.tuned = tuned
        self.fingerprint = fingerprint
        self.names = value_names(function)
        self.readers = _readers(function.body)
        self.guards: list[Guard] = list(function.guards)
        #: Where the schedule being applied was written, and the function it was written
        #: for (a called tile kernel's own), for its diagnostics.
        self.span: Span | None = function.schedule_span
        self.scheduled = function.name

    def run(self) -> HostProgram:
        f = self.function
        inputs = tuple(self.names[p.value.id] for p in f.params)
        defaults = tuple((self.names[p.value.id], p.default) for p in f.params
                         if p.default is not None)  # fmt: skip
        keyword_only = tuple(self.names[p.value.id] for p in f.params if p.keyword_only)
        # a returned cache is a parameter's arrays, written in place: no result of the entry
        results = tuple(self.names[v.id] for v in f.body.yields
                        if not isinstance(v.type, KVCacheType))  # fmt: skip
        declared = result_types(f.result_type) or tuple(v.type for v in f.body.yields)
        types = tuple(p.value.type for p in f.params) + tuple(
            t for t in declared if isinstance(t, TensorType)
        )
        if f.kind == "declaration":
            return HostProgram(
                f.name, f.kind, inputs, results, (), span=f.span, defaults=defaults,
                keyword_only=keyword_only, types=types, states=f.states,
                caches=self._caches(),
            )  # fmt: skip
        launches = []
        writer: dict[int, int] = {}
        for index, group in enumerate(f.groups):
            launch = self._launch(index, group)
            launches.append(launch)
            for op in self._ops(group):
                for value in op.results:
                    writer[value.id] = index
        buffers = self._buffers(writer)
        return HostProgram(
            f.name, f.kind, inputs, results, tuple(launches),
            buffers, tuple(self.guards), span=f.span, defaults=defaults,
            keyword_only=keyword_only, types=types, saved=self._saved(buffers),
            states=f.states, donated=self._donated(writer), caches=self._caches(),
        )  # fmt: skip

    def _caches(self) -> tuple[CacheSlot, ...]:
        """The function's ``KVCache`` parameters, and where each is returned."""
        f = self.function
        returned = [cache_param(f.body.ops, v)[0].id if isinstance(v.type, KVCacheType) else None
                    for v in f.body.yields]  # fmt: skip
        return tuple(
            CacheSlot(p.value.name, p.value.type.dims[2], rolling_window(p.value.type),
                      tuple(i for i, r in enumerate(returned) if r == p.value.id))
            for p in f.params
            if isinstance(p.value.type, KVCacheType) and p.value.type.dims is not None
        )  # fmt: skip

    def _guard(self, guard: Guard) -> None:
        if all(
            (g.kind, g.left, g.right) != (guard.kind, guard.left, guard.right) for g in self.guards
        ):
            self.guards.append(guard)

    def _ops(self, group: Group) -> list[Op]:
        return [self.function.body.ops[i] for i in group.ops]

    # -- one launch --------------------------------------------------------------

    def _launch(self, index: int, group: Group) -> Launch:
        ops = self._ops(group)
        reads, writes = self._boundary(group)
        anchor = next((op for op in ops if template_of(op)), ops[0])
        template = "tile_kernel" if group.kind == "tile" else template_of(anchor) or group.kind
        prologue, epilogue = _around(group.kind, kernel_order(ops), anchor)
        if group.kind in _NOT_LAUNCHED:
            return Launch(
                group.name, group.kind, index, template, epilogue, (), 0, 0, 0, "none", 1, (),
                0, 0, None, "host" if group.kind == "host" else "runtime", reads, writes,
            )  # fmt: skip
        errors = self.diags.error_count
        problem = self._problem(group, ops, anchor)
        knobs, source = self._knobs(group, problem, anchor)
        program = self._tile_program(group, anchor)
        if problem.d is not None and problem.d.constant is None and "block_d" in knobs:
            self._guard(Guard(
                "at_most", problem.d, Dim.const(int(knobs["block_d"])),
                f"{group.name}: the head dim fits the schedule's head-dim tile", anchor.span,
            ))  # fmt: skip
        # A loop in T.k (or T.n, T.d) blocks without a product still needs its step; no
        # other use of an unsized tile gets one (``_check_sized``).
        used = _tile_dims(program) if program is not None else frozenset()
        steps = {k: v for k, v in loop_tiles(problem, self.hw).items()
                 if program is not None and _KNOB_SYMBOL[k] in _loop_steps(program)}  # fmt: skip
        if steps and problem.works_like == "reduction" and source == "heuristic":
            knobs = walking_rows(knobs, self.hw)
        tiles = _tiles("tile" if program is not None else problem.works_like,
                       {**steps, **knobs}, used)  # fmt: skip
        if program is not None and self.diags.error_count == errors:  # one error a kernel
            self._check_sized(program, tiles)
        cost = resources(problem, knobs, self.hw)
        if source == "heuristic" and self.hw.kind == "gpu" and cost.smem_bytes > self.hw.smem_bytes:
            # none of the heuristic's blocks fits (attention's backward at a head dim
            # known only at run time, whose tile is then the widest): not a compiler bug
            what = f"'{program.name}'" if program is not None else template
            self.diags.error(
                f"{what} fits the {self.hw.smem_bytes:,} bytes of shared memory a block has on "
                f"{self.hw.arch} at none of the blocks the schedule tries ({cost.smem_bytes:,} "
                "at the first): give the head dim as a number (-D D=64), or compile for "
                "another arch",
                anchor.span,
            )
        dot = group.kind in ("gemm", "attention") or (
            program is not None and any(op.kind == "tile.dot" for op in walk(program.body))
        )
        return Launch(
            group.name, group.kind, index, template, epilogue, tiles, int(knobs["warps"]),
            int(knobs["stages"]), int(knobs["vector"]), str(knobs["swizzle"]),
            int(knobs.get("split_k", 1)), _grid(problem, knobs), cost.threads, cost.smem_bytes,
            self.hw.mma if dot else None, source, reads, writes, prologue,
            persistent=bool(knobs.get("persistent", False)),
        )  # fmt: skip

    def _tile_program(self, group: Group, anchor: Op) -> Function | None:
        """The tile kernel that a launch runs as written: the function itself, or the
        file's kernel that a ``tile_call`` calls; None for a group of graph ops."""
        if group.kind == "tile":
            return self.function
        if group.kind == "tile_call":
            return anchor.attr("kernel").function
        return None

    def _spec(self, anchor: Op) -> ScheduleSpec | None:
        """The schedule written for a kernel: its op's own (``op.with_schedule(s)``), a
        called tile kernel's (``@kernel.schedule`` on it), else its function's."""
        if anchor.kind == "tile_call":
            callee = anchor.attr("kernel").function
            self.span, self.scheduled = callee.schedule_span, callee.name
            return callee.schedule
        self.scheduled = self.function.name
        own = anchor.attr("schedule")
        self.span = anchor.span if own is not None else self.function.schedule_span
        return own if own is not None else self.function.schedule

    def tuning_point(self, group: Group, toolchain: str) -> TuningPoint | None:
        if group.kind not in SCHEDULED_KINDS:
            return None
        ops = self._ops(group)
        anchor = next((op for op in ops if template_of(op)), ops[0])
        spec = self._spec(anchor)
        if spec is not None and spec.is_point:
            return None
        problem = self._problem(group, ops, anchor)
        untuned, _ = self._knobs(group, problem, anchor)
        return TuningPoint(self._key(group, problem, toolchain), problem, self.hw, untuned, spec,
                           self.span or self.function.span)  # fmt: skip

    def _key(self, group: Group, problem: Problem, toolchain: str) -> TuningKey:
        f = self.function
        types = [p.value.type for p in f.params]
        dtypes = ",".join(str(t.dtype) for t in types if isinstance(t, TensorType))
        outs = [t for t in result_types(f.result_type) if isinstance(t, TensorType)]
        if outs:
            dtypes += "->" + ",".join(str(t.dtype) for t in outs)
        return TuningKey(f.name, group.name, self.fingerprint, self.hw.target, self.hw.arch,
                         toolchain, dtypes, bucket_of(problem))  # fmt: skip

    def _tuned_knobs(
        self, group: Group, problem: Problem, spec: ScheduleSpec | None, default: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The configuration of a record for this launch, when there is one that still
        fits the machine and the function's space; a record that does not is dropped with
        a ``CacheWarning`` naming it (the file's types and ranges were checked on reading)."""
        if self.tuned is None:
            return None
        record = self.tuned.lookup(self._key(group, problem, self.tuned.toolchain))
        if record is None:
            return None
        knobs = {**default, **dict(record.config)}
        why = self._unfit(record, problem, spec, knobs)
        if why is not None:
            warnings.warn(f"schedule cache record {record.key}: {why}; not used", CacheWarning,
                          stacklevel=2)  # fmt: skip
            return None
        return knobs

    def _unfit(
        self,
        record: TunedRecord,
        problem: Problem,
        spec: ScheduleSpec | None,
        knobs: dict[str, Any],
    ) -> str | None:
        """Why a record cannot schedule this launch: its configuration is not a point of the
        space the tuner searches (the space was narrowed since, or the record was edited:
        the tuner only ever records points it built and checked against the untuned
        schedule), or the machine cannot run it."""
        space = space_of(spec, self.hw.kind, problem.works_like)
        config = dict(record.config)
        if set(config) != set(space) or any(config[k] not in space[k] for k in space):
            shown = " ".join(f"{k}={v}" for k, v in record.config) or "no knobs"
            searched = " ".join(f"{k}={list(v)}" for k, v in space.items()) or "no knobs"
            return f"{shown} is not a point of the space tuned over ({searched})"
        problems = resources(problem, knobs, self.hw).problems
        return problems[0] if problems else None

    def _knobs(self, group: Group, problem: Problem, anchor: Op) -> tuple[dict[str, Any], str]:
        """The kernel's schedule: an explicit point as written, else a tuned record's,
        else the best of its space, else the heuristic's."""
        default = default_knobs(problem, self.hw)
        spec = self._spec(anchor)
        if group.kind not in SCHEDULED_KINDS:
            return default, "heuristic"
        if spec is None or not spec.is_point:
            tuned = self._tuned_knobs(group, problem, spec, default)
            if tuned is not None:
                return tuned, "tuned"
        if spec is None or not spec.choices:
            return default, "heuristic"
        if spec.is_point:
            knobs = {**default, **{k: v[0] for k, v in spec.choices}}
            for reason in resources(problem, knobs, self.hw).problems:
                self._once(
                    self.diags.error, f"schedule for '{self.scheduled}' cannot run: {reason}",
                    Note(f"schedule: {spec}"),
                )  # fmt: skip
            return knobs, "explicit"
        picked = self._pick(spec, default, problem)
        return (picked, "space") if picked is not None else (default, "heuristic")

    def _once(self, say: Any, message: str, note: Note) -> None:
        """Say ``message`` at the schedule being applied, unless it was said there: a
        tile kernel's schedule serves the calls of it too, whose problems are the same."""
        if all((d.message, d.span) != (message, self.span) for d in self.diags.items):
            say(message, self.span, (note,))

    def _pick(
        self, spec: ScheduleSpec, default: dict[str, Any], problem: Problem
    ) -> dict[str, Any] | None:
        """The best-scoring candidate of a space that fits; among equals (sizes unknown,
        say) the one nearest the heuristic's own choice. None when nothing fits: a space
        is a tuning hint, so the kernel then gets the heuristic schedule, with a warning."""
        names = [k for k, _ in spec.choices]
        feasible = []
        reasons: list[str] = []
        for values in itertools.product(*(v for _, v in spec.choices)):
            knobs = {**default, **dict(zip(names, values, strict=True))}
            problems = resources(problem, knobs, self.hw).problems
            if problems:
                reasons.append(problems[0])
            else:
                feasible.append(knobs)
        if not feasible:
            self._once(
                self.diags.warning,
                f"no schedule in the space of '{self.scheduled}' fits {self.hw.arch} "
                f"({reasons[0]}); using the default schedule for {self.hw.arch}",
                Note(f"space: {spec}"),
            )
            return None
        return max(feasible, key=lambda k: (score(problem, k, self.hw), -_distance(k, default)))

    def _problem(self, group: Group, ops: list[Op], anchor: Op) -> Problem:
        kind = group.kind
        if kind == "gemm":
            a = anchor.operands[0]
            out = anchor.result.type
            return Problem(kind, a.type.dtype, out.dims[-2], out.dims[-1], a.type.dims[-1],
                           batch=out.dims[:-2])  # fmt: skip
        if kind == "attention":
            q, k = anchor.operands[:2]
            held = 1 if anchor.kind == "flash_attention" else 2
            # programs own blocks of the rows of the result: the queries, or the keys
            # for the kernel of their gradients, which loops over the queries
            rows, loop = q.type.dims[-2], k.type.dims[-2]
            if anchor.kind in _OWN_KEYS:
                rows, loop = loop, rows
            return Problem(kind, q.type.dtype, rows, loop, d=q.type.dims[-1],
                           batch=q.type.dims[:-2], held=held)  # fmt: skip
        if kind == "reduction":
            x = anchor.operands[0]
            axis = anchor.attr("axis", x.type.rank - 1) % x.type.rank
            dims = x.type.dims
            if axis == x.type.rank - 1 and x.type.rank > 2:
                # Row blocks of the last two axes, one grid axis per leading one, as the
                # tile stage lays out a kernel's programs over a result of rank > 2.
                return Problem(kind, x.type.dtype, dims[-2], dims[-1], batch=dims[:-2])
            rows = _product(d for i, d in enumerate(dims) if i != axis)
            return Problem(kind, x.type.dtype, rows, dims[axis])
        if kind in ("tile", "tile_call"):
            program = self._tile_program(group, anchor)
            assert program is not None
            return self._tile_problem(program)
        if kind == "columns":  # blocks of the columns, each walking every row
            x = anchor.operands[0]
            return Problem(kind, x.type.dtype, x.type.dims[-1], x.type.dims[-2])
        out = _written(ops).type
        if template_of(anchor) == "transpose":
            return Problem("layout", out.dtype, out.dims[-2], out.dims[-1], batch=out.dims[:-2])
        if kind == "elementwise" and out.rank >= 2:
            # The library kernel takes row blocks, as a norm does, so that an operand
            # broadcast along the rows (a bias) is loaded as the rows' columns.
            return Problem("reduction", out.dtype, out.dims[-2], out.dims[-1],
                           batch=out.dims[:-2])  # fmt: skip
        return Problem(kind, out.dtype, _product(out.dims))

    def _tile_problem(self, f: Function) -> Problem:
        """A tile kernel's sizes, from its result (the first, which grids the others:
        sema checked that they agree), or what it stores, and its loop."""
        ops = list(walk(f.body))
        stores = [op.operands[0].type for op in ops if op.kind == "tile.store"]
        loads = [op.operands[0].type for op in ops if op.kind == "tile.load"]
        out = next((t for t in result_types(f.result_type) if isinstance(t, TensorType)), None)
        dims = (out or (stores or loads)[0]).dims
        # The loaded blocks of matrices are staged: the widest dtype sizes them (a weight
        # widened in the loop takes more shared memory than the activations beside it).
        blocks = [t for t in loads if t.rank >= 2] or loads
        dtype = max((t.dtype for t in blocks), key=lambda d: d.bits) if blocks else out.dtype
        loop = next((op.attr("extent") for op in ops if op.kind == "tile.for"), None)
        tiles = _tile_dims(f)
        head = _head_dim(ops) if "T.d" in tiles else None
        # tiles of T.d columns held through a loop over blocks: attention's queries; in
        # its backward pass, which multiplies probabilities itself (staged, as two held
        # tiles count), its queries and their gradient, or keys and values
        held = sum(op.kind == "tile.load" and op.attr("cols") == "program" for op in f.body.ops)
        online = any(op.kind == "tile.softmax_online" for op in ops)
        # the forward pass holds its queries and accumulates the values; a kernel that
        # only reduces the online softmax (a logsumexp of the scores) holds them as its
        # backward kernels do, so that its blocks of keys are as narrow as theirs
        accumulated = any(op.kind == "tile.softmax_accumulate" for op in ops)
        if online or (head and held and loop is not None):
            return Problem("tile", dtype, dims[-2], loop, d=head, batch=dims[:-2],
                           shape="attention", held=1 if accumulated else max(held, 2))  # fmt: skip
        if any(op.kind == "tile.dot" for op in ops) and len(dims) < 2:
            self.diags.error(
                f"'{f.name}' computes a tile.dot but its result is {len(dims)}-D: the programs "
                "cover the result's axes, so none would cover the product's columns; return "
                "the [rows, cols] product and reduce it in another kernel",
                f.span,
            )
            return Problem("tile", dtype, dims[0], shape="elementwise")
        if any(op.kind == "tile.dot" for op in ops):
            # one accumulator a result (gemm_i8's two exact parts)
            outputs = sum(isinstance(t, TensorType) for t in result_types(f.result_type))
            return Problem("tile", dtype, dims[-2], dims[-1], loop, d=head, batch=dims[:-2],
                           shape="gemm", dequantized=_dequantizes(ops),
                           held=max(1, outputs))  # fmt: skip
        if len(dims) >= 2 and "T.n" in tiles and loop is not None:
            # Blocks of T.m columns that walk every row, T.n at a time, without a product
            # (norm_param_grad's column sums): the result's rows are the columns.
            return Problem("tile", dtype, dims[-2], loop, shape="columns")
        if len(dims) >= 2 and "T.n" in tiles:
            # Blocks of T.m rows and T.n columns without a product: a transposing copy
            # (it loads its block with rows=T.n, cols=T.m).
            return Problem("tile", dtype, dims[-2], dims[-1], batch=dims[:-2], shape="layout")
        rows = next((t for t in loads if len(t.dims) >= 2), None)
        returned = f.body.yields[0].type if f.body.yields else None
        one_a_row = len(dims) == 1 or (isinstance(returned, TileType) and returned.rank == 1)
        if rows is not None and one_a_row:
            # rows of a matrix, one value each; a leading dim of the result is a grid axis
            # (a [B, S] result of [B, S, C] rows), as the tile stage lays the programs out
            return Problem("tile", dtype, dims[-1], rows.dims[-1], batch=dims[:-1],
                           shape="reduction")  # fmt: skip
        if len(dims) == 1:
            return Problem("tile", dtype, dims[0], shape="elementwise")
        return Problem("tile", dtype, dims[-2], dims[-1], batch=dims[:-2], shape="reduction")

    def _check_sized(self, program: Function, tiles: tuple[tuple[str, int], ...]) -> None:
        """Every tile size a tile kernel uses has a value in its schedule. The schedule
        sizes them by the kernel's shape (``_SIZED_AS``); another use, such as
        ``cols=T.n`` in a kernel that returns one value per row, left the size without
        a value in the generated code (which did not build), and given one, each program
        would read the first block of its axis only, of a width that the target picks."""
        sized = {name for name, _ in tiles}
        for op in walk(program.body):
            missing = sorted(_tile_symbols(op) - sized)
            if missing:
                self.diags.error(
                    f"{missing[0]} has no size in '{program.name}': the schedule sizes "
                    f"it only as {_SIZED_AS[missing[0]]}; here each program would cover a "
                    "block of its axis of no known width. Load the whole axis instead "
                    "(cols= left out)",
                    op.span,
                )
                return

    def _boundary(self, group: Group) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Values the group reads from outside and values it writes for others. An
        anchor of several results (a tile kernel's ``return a, b``, a norm's ``dx`` and
        row statistics) writes each, read or not: its kernel stores every result it
        returns."""
        ops = self._ops(group)
        nested = [inner for op in ops for inner in walk(Block((), (op,)))]
        inside = {v.id for op in nested for v in op.results}
        inside |= {a.id for op in nested for region in op.regions for a in region.args}
        reads: dict[str, None] = {}  # in order of first read
        for op in nested:
            for v in op.operands:
                if v.id not in inside and not isinstance(v.type, TileType):
                    reads[self.names[v.id]] = None
        members = set(group.ops)
        writes = tuple(
            self.names[v.id]
            for op in ops
            for v in op.results
            if not self.readers.get(v.id, set()) <= members or self._unread(group, op, v)
        )
        if group.kind == "tile" and self.function.body.yields:
            writes = (self.names[self.function.body.yields[0].id],)
        return tuple(reads), writes

    def _unread(self, group: Group, op: Op, v: Value) -> bool:
        """Whether ``v`` is a result that no op reads of an anchor of several results,
        which its kernel stores all the same (an elementwise kernel stores only what is
        read: ``fused_adam``'s results)."""
        return group.kind != "elementwise" and len(op.results) > 1 and not self.readers.get(v.id)

    def _buffers(self, writer: dict[int, int]) -> tuple:
        """Intermediates: written by one launch, read by a later one, not the result;
        or read by none (an unread result of a kernel of several), live at its launch
        alone."""
        last: dict[int, int] = {}
        for index, group in enumerate(self.function.groups):
            for op in self._ops(group):
                for v in op.operands:
                    if v.id in writer and writer[v.id] != index:
                        last[v.id] = max(last.get(v.id, index), index)
                last.update((v.id, index) for v in op.results if self._unread(group, op, v))
        returned = {v.id for v in self.function.body.yields}
        values = {v.id: v for op in self.function.body.ops for v in op.results}
        intervals = [
            Interval(self.names[i], values[i].type, writer[i], end)
            for i, end in last.items()
            if i not in returned and isinstance(values[i].type, TensorType)
        ]
        return plan_buffers(intervals)

    def _donated(self, writer: dict[int, int]) -> tuple[tuple[str, str], ...]:
        """The tensors of each returned ``OptimizerState`` that the kernels may write
        into the memory of the donated state's (``m`` into ``state_m``), by name: those
        of a state all of whose tensors may (``_writes_over``). The CPU kernel reads
        the donated tensor and writes the result, which the runtime passes over it; a
        SIMT kernel (CUDA, HIP, OpenCL, SYCL), whose pointers are ``restrict``, takes
        the two as one parameter that it reads and writes (``tile.build``). The others
        are computed apart, and the runtime copies them into the state."""
        f = self.function
        params = {p.value.name: p.value for p in f.params}
        donated: list[tuple[str, str]] = []
        for slot in f.states:
            if slot.result is None:
                continue
            given = next(s for s in f.states if s.result is None and s.param == slot.param)
            fields = ("master", "m", "v")[3 - slot.count :]
            new = f.body.yields[slot.result : slot.result + slot.count]
            pairs = [(v, params.get(f"{given.name}_{field}"))
                     for v, field in zip(new, fields, strict=True)]  # fmt: skip
            if all(old is not None and self._writes_over(v, old, writer) for v, old in pairs):
                donated += [(self.names[v.id], self.names[old.id]) for v, old in pairs]
        return tuple(donated)

    def _writes_over(self, new: Value, old: Value, writer: dict[int, int]) -> bool:
        """Whether the launch that writes ``new`` may write it over the input ``old``:
        no later launch reads ``old``, and the launch is an elementwise kernel in which
        every op that reads ``old``, or a value computed from it, is one that ``new`` is
        computed from. Each element of ``old`` is then read before the program that
        computes it stores ``new`` there, even where the CPU emitter computes an op
        within the loop of the op that reads it."""
        at = writer.get(new.id)
        if at is None or new.type != old.type:
            return False
        groups = self.function.groups
        if any(
            v.id == old.id for g in groups[at + 1 :] for op in self._ops(g) for v in op.operands
        ):
            return False
        ops = self._ops(groups[at])
        if groups[at].kind != "elementwise":
            return False
        producer = {r.id: op for op in ops for r in op.results}
        made = producer.get(new.id)
        if made is None:
            return False
        ancestors: set[int] = set()
        todo = [made]
        while todo:
            op = todo.pop()
            if id(op) not in ancestors:
                ancestors.add(id(op))
                todo += [producer[v.id] for v in op.operands if v.id in producer]
        readers: dict[int, list[Op]] = {}
        for op in ops:
            for v in op.operands:
                readers.setdefault(v.id, []).append(op)
        seen: set[int] = set()
        todo = list(readers.get(old.id, []))
        while todo:
            op = todo.pop()
            if id(op) in seen:
                continue
            seen.add(id(op))
            if id(op) not in ancestors or op.kind not in ELEMENTWISE_MATH | DRAWN:
                return False
            if op is not made:
                todo += [r for v in op.results for r in readers.get(v.id, [])]
        return True

    def _saved(self, buffers: tuple) -> tuple[str, ...] | None:
        """The buffers written before the backward pass's first launch and read from it
        on: what a backward pass keeps of the forward's values (``remat=`` and
        ``checkpoint`` choose it). That launch may compute forward ops too (elementwise
        ones, fused with the backward's): the forward values it writes for later
        launches are kept as well. None for a function without a backward pass."""
        groups = self.function.groups
        start = next((index for index, group in enumerate(groups)
                      if any(op.backward for op in self._ops(group))), None)  # fmt: skip
        if start is None:
            return None
        forward = {self.names[r.id] for op in self._ops(groups[start]) if not op.backward
                   for r in op.results}  # fmt: skip
        return tuple(
            b.name
            for b in buffers
            if b.first < start <= b.last or (b.first == start < b.last and b.name in forward)
        )


def _readers(body: Block) -> dict[int, set[int]]:
    """The indices of the ops of ``body`` that read each value, with -1 for its yields."""
    readers: dict[int, set[int]] = {}
    for i, op in enumerate(body.ops):
        for v in op.operands:
            readers.setdefault(v.id, set()).add(i)
    for v in body.yields:
        readers.setdefault(v.id, set()).add(-1)
    return readers


def _around(kind: str, ops: list[Op], anchor: Op) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The kinds of the fused ops before the template's op (computed where it loads its
    operand) and after it (applied to its result). A group of elementwise ops alone is
    all prologue: the ``elementwise`` kernel only loads what they compute."""
    if kind == "tile":
        return (), ()
    if kind == "elementwise" and template_of(anchor) is None:
        return tuple(op.kind for op in ops), ()
    at = ops.index(anchor)
    return tuple(op.kind for op in ops[:at]), tuple(op.kind for op in ops[at + 1 :])


def _written(ops: list[Op]) -> Value:
    """The value a group's kernel writes: its last op's result, but the operand of a
    reshape of a value the kernel computes, which it writes as computed (the reshape is
    a view of that memory), and what a store stores."""
    last = ops[-1]
    computed = {r.id for op in ops for r in op.results}
    if last.kind == "reshape" and last.operands[0].id in computed:
        return last.operands[0]
    return last.results[0] if last.results else last.operands[0]


def _distance(knobs: dict[str, Any], default: dict[str, Any]) -> float:
    """How far a candidate is from the heuristic's choice, in factors of two per knob."""
    total = 0.0
    for name, value in knobs.items():
        other = default.get(name)
        if isinstance(value, bool):  # a switch (``persistent``): one step when it differs
            total += value != other
        elif isinstance(value, int) and isinstance(other, int) and value > 0 and other > 0:
            total += abs(math.log2(value / other))
    return total


#: What gives each tile size a value in a tile kernel's schedule.
_SIZED_AS = {
    "T.m": "the result's row blocks",
    "T.n": "the column blocks of a [rows, cols] result, or the key blocks of attention",
    "T.k": "the step of the loop that a tile.dot accumulates over",
    "T.d": "the head dim of attention or of a tile.dot's operands",
}


#: The tile size each loop knob gives a value to.
_KNOB_SYMBOL = {"block_n": "T.n", "block_k": "T.k", "block_d": "T.d"}


def _loop_steps(program: Function) -> frozenset[str]:
    """The tile sizes a tile kernel's ``tile.range_n`` loops step by."""
    return frozenset(s for op in walk(program.body) if op.kind == "tile.for"
                     for s in op.attr("block").symbols() if s.startswith("T."))  # fmt: skip


def _dequantizes(ops: list[Op]) -> bool:
    """Whether a tile kernel widens an integer tile that it loads into floats and scales
    them before a product: a weight dequantized in the main loop (``w4a16``, the
    library's ``gemm_dequant``), which the product then reads from registers.
    (``w8a16`` only widens its weight, and scales the accumulator after the loop.)"""
    loaded = {op.result.id for op in ops if op.kind == "tile.load"}
    derived = {
        op.result.id for op in ops
        if op.kind == "tile.cast" and op.operands[0].id in loaded
        and not op.operands[0].type.dtype.is_float and op.result.type.dtype.is_float
    }  # fmt: skip
    grown = True
    while grown:  # through the ops after the widening (an ``if``'s, by what it yields)
        before = len(derived)
        for op in ops:
            reads = {v.id for v in op.operands} | {v.id for r in op.regions for v in r.yields}
            if op.kind != "tile.dot" and reads & derived:
                derived |= {r.id for r in op.results}
        grown = len(derived) > before
    return any(op.kind == "mul" and derived & {v.id for v in op.operands} for op in ops)


def _tile_dims(program: Function) -> frozenset[str]:
    """The tile sizes (``T.m``, ...) a tile kernel's types and loops mention."""
    return frozenset(s for op in walk(program.body) for s in _tile_symbols(op))


def _tile_symbols(op: Op) -> set[str]:
    """The tile sizes (``T.m``, ...) that an op's result types and attributes mention."""
    dims = [d for v in op.results for d in getattr(v.type, "dims", ()) or ()]
    dims += [attr for _, attr in op.attrs if isinstance(attr, Dim)]
    return {s for d in dims for s in d.symbols() if s.startswith("T.")}


def _product(dims: Any) -> Dim:
    total = Dim.const(1)
    for dim in dims:
        total = total * dim
    return total


def _tiles(kind: str, knobs: dict[str, Any], used: frozenset[str]) -> tuple[tuple[str, int], ...]:
    if kind == "gemm":
        return (("BM", knobs["block_m"]), ("BN", knobs["block_n"]), ("BK", knobs["block_k"]))
    if kind == "attention":
        return (("BM", knobs["block_m"]), ("BN", knobs["block_n"]), ("BD", knobs["block_d"]))
    if kind == "tile":
        names = (("T.m", "block_m"), ("T.n", "block_n"), ("T.k", "block_k"), ("T.d", "block_d"))
        return tuple((name, knobs[knob]) for name, knob in names if knob in knobs and name in used)
    if kind in ("layout", "columns"):
        return (("BM", knobs["block_m"]), ("BN", knobs["block_n"]))
    if kind == "reduction":
        return (("rows", knobs["block_m"]),)
    return (("elements", knobs["block_m"]),)


def _grid(problem: Problem, knobs: dict[str, Any]) -> tuple[GridDim, ...]:
    """Programs per axis: output column blocks and row blocks for gemm-like kernels
    (then split-K slices), row blocks otherwise; one axis per batch dim."""
    batch = tuple(GridDim(d) for d in problem.batch)
    rows = GridDim(problem.m, int(knobs["block_m"]))
    if problem.works_like not in ("gemm", "layout"):
        return (rows, *batch)
    split = int(knobs.get("split_k", 1))
    splits = (GridDim(Dim.const(split)),) if split > 1 else ()
    return (GridDim(problem.n, int(knobs["block_n"])), rows, *batch, *splits)


def _head_dim(ops: list[Op]) -> Dim | None:
    """The dim that a tile kernel's ``T.d`` tiles span whole: the last dim of the tensors
    it loads ``cols=T.d`` of (attention's q, k and v), not its result's (``attention_stats``
    returns two values per row: a T.d tile sized for a width of 2 would be 16 columns,
    and the rest of each head never read). The widest where several differ."""
    spanned = [
        op.operands[0].type.dims[-1]
        for op in ops
        if op.kind == "tile.load" and op.results[0].type.dims[-1:] == (Dim.sym("T.d"),)
    ]
    if not spanned:
        return None
    known = [d for d in spanned if d.constant is not None]
    symbolic = [d for d in spanned if d.constant is None]
    return symbolic[0] if symbolic else max(known, key=lambda d: d.constant)
