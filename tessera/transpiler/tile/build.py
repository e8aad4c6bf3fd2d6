"""The tile stage: every launch of the Schedule IR becomes a Tile IR kernel.

A user's tile kernel is lowered as written; a fused graph group instantiates
the standard-library kernel of its anchor op, or the file's tile kernel that
its ``tile_call`` calls. Launches that run no tile
program (host-side work, collectives) are listed as runtime calls. A group
that no library kernel implements yet is an error at its op, which names
the stage that still shows it (``--emit sched``).
"""

from __future__ import annotations

import dataclasses

from ..frontend.diagnostics import Diagnostics
from ..frontend.source import Span
from ..graph.dims import Dim
from ..graph.fusion import CACHE_VIEWS, kernel_order, op_class
from ..graph.graph_ops import DRAWN, ELEMENTWISE_MATH, retyping_view, rows_permuted
from ..graph.ir import Function, GraphModule, Group, Op, Value, new_value, result_names
from ..graph.kvcache import cache_param, flat_names
from ..graph.printer import value_names
from ..graph.types import KVCacheType, ScalarType, TensorType, in_memory, result_types
from ..options import Options
from ..schedule.hardware import hardware_for
from ..schedule.ir import HostProgram, Launch, ScheduleModule, param_name
from ..schedule.lower import TEMPLATES, template_of
from .instantiate import (
    TEMPLATE_PARAMS,
    instantiate,
    kept_axis_dropped,
    merged_rows,
    view_of,
)
from .ir import TileKernel, TileModule, TileProgram
from .kvcache import cache_kernel
from .lower import KernelInput, View, lower_tile_function
from .passes import SharedMemoryOverflow, run_tile_passes
from .shape_key import as_twin, find_twins

__all__ = ["tile_module", "ANCHORS", "RUNTIME"]

#: Graph ops that a library kernel implements (``template_of`` says which kernel).
ANCHORS = frozenset(op for op, kernel in TEMPLATES.items() if kernel in TEMPLATE_PARAMS)
#: Elementwise ops that a kernel computes where it loads an operand (a prologue).
_CHAIN = ELEMENTWISE_MATH | DRAWN
_SCALAR_CHAIN = _CHAIN | {"dim_to_float"}
#: A launch that the runtime carries out, not a kernel: its name, what it is, its line.
_Runtime = tuple[str, str, Span | None]
RUNTIME = {
    "host": "host-side work: a scalar computed for an op that is not elementwise (an "
    "elementwise op computes the scalars it reads; pass this one as a parameter)",
    "collective": "a collective of the runtime",
}


def tile_module(
    graph: GraphModule, sched: ScheduleModule, options: Options, diags: Diagnostics,
    until: str | None = None,
) -> TileModule:  # fmt: skip
    """The Tile IR of every launch, after the tile passes (up to ``until``, for tests
    and tools that look at one pass at work)."""
    hw = hardware_for(sched.target, sched.arch)
    lowered: list[tuple[Function, HostProgram, list[TileKernel], list[_Runtime]]] = []
    for function, host in zip(graph.functions, sched.programs, strict=True):
        kernels: list[TileKernel] = []
        runtime: list[_Runtime] = []
        for launch in host.launches:
            group = function.groups[launch.group]
            if group.kind in RUNTIME:
                first = function.body.ops[group.ops[0]]
                runtime.append((launch.name, RUNTIME[group.kind], first.span))
                continue
            if launch.split_k > 1:
                diags.warning(
                    f"{function.name}: the schedule splits K {launch.split_k} ways, which the "
                    "tile stage does not implement yet; the kernel runs K in one slice",
                    function.span,
                )
            kernel = _lower_launch(function, host, group, launch, diags, hw.target != "cpu")
            if kernel is not None:
                kernels.append(kernel)
        lowered.append((function, host, kernels, runtime))
    # The passes run once for each content: a kernel whose twin has run them takes its
    # twin's result, under its own name.
    twins = find_twins([k for _, _, kernels, _ in lowered for k in kernels])
    done: dict[str, TileKernel] = {}
    programs = []
    for function, host, kernels, runtime in lowered:
        finished = []
        for kernel in kernels:
            twin = twins.get(kernel.name)
            try:
                if twin in done:
                    finished.append(as_twin(done[twin], kernel))
                else:
                    finished.append(run_tile_passes(kernel, hw, until))
                done[kernel.name] = finished[-1]
            except SharedMemoryOverflow as exc:
                diags.error(str(exc), exc.span or function.span)
        programs.append(TileProgram(host, tuple(finished), tuple(runtime)))
    return TileModule(sched.name, sched.target, sched.arch, tuple(programs))


def _lower_launch(
    function: Function, host: HostProgram, group: Group, launch: Launch, diags: Diagnostics,
    one_pointer: bool,
) -> TileKernel | None:  # fmt: skip
    """The Tile IR kernel of one launch. With ``one_pointer`` (the SIMT targets), a
    result written over a donated input (``host.donated``) and that input are one
    parameter, the result's: its pointers are ``restrict``, so the two may not be two
    pointers to one array. The kernel reads the input's values from the result's memory,
    which holds them when it starts (the donated array itself, or the runtime's copy)."""
    name = function.name if len(host.launches) == 1 else f"{function.name}_{launch.name}"
    if group.kind == "tile":
        declared = [t for t in result_types(function.result_type) if isinstance(t, TensorType)]
        outputs = tuple(
            new_value(t, n) for t, n in zip(declared, result_names(len(declared)), strict=True)
        )
        own = tuple(p.value for p in function.params)
        given = KernelInput(
            name, function.name, own + outputs, {v.id: v for v in own},
            outputs[0] if outputs else None, beside=outputs[1:],
        )  # fmt: skip
        return lower_tile_function(function, launch, given)
    names = {name: value for value, name in _named_values(function)}
    yields = [v for v in function.body.yields if not isinstance(v.type, KVCacheType)]
    # A kernel takes a result by the name the entry passes it under (``out``, or ``out0``,
    # ``out1``, ...), an intermediate by the name every launch takes it by; a returned
    # cache is no result (its arrays are a parameter's, written in place).
    results = {v.id: out for v, out in zip(yields, result_names(len(yields)), strict=True)}
    rename: dict[int, Value] = {}
    # the cache views first: the last parameter is the kernel's output
    ops = _cache_views(function, kernel_order([function.body.ops[i] for i in group.ops]), rename)
    for printed in (*launch.reads, *launch.writes):
        if printed in names and not isinstance(names[printed].type, KVCacheType):
            v = names[printed]
            rename[v.id] = new_value(in_memory(v.type), results.get(v.id, param_name(printed)))
    for result, given in host.donated if one_pointer else ():
        new, old = names[result], names[given]
        if new.id in rename and old.id in rename:
            rename[old.id] = rename[new.id]
    if group.kind == "state":
        (op,) = (function.body.ops[i] for i in group.ops)  # fusion adds nothing to it
        return cache_kernel(function, op, launch, name, rename)
    split = next(
        (op for op in ops if op.kind == "split_qkv" and op.result.type.dims[-3].constant is None),
        None,
    )
    if split is not None:
        diags.error(
            "split_qkv needs a number of heads (heads=12): the kernels that read q, k and v "
            "run a grid over the heads, and a launch takes sizes, not int parameters",
            split.span,
        )
        return None
    ops = _views_as_params(ops, rename)
    for op in ops:
        if op.kind == "tile_call":
            _arguments_retyped(op, rename)
    anchor = next(
        (op for op in ops if (op.kind in ANCHORS or op.kind == "tile_call") and template_of(op)),
        None,
    )
    views = _in_place(anchor, ops, rename)
    ops = [op for op in ops if not _viewed(op, views)]
    params = tuple({v.id: v for v in rename.values()}.values())
    problem = _unsupported(anchor, ops)
    if problem is not None:
        diags.error(problem, (anchor or ops[0]).span)
        return None
    template = (template_of(anchor) if anchor is not None else None) or "elementwise"
    # the values it writes beside its result: an elementwise kernel stores them where
    # it computes them (fusion lets no other kernel write several, but the results of
    # an anchor that has several, which its kernel returns)
    written = [names[w] for w in launch.writes if w in names]
    beside = {v.id: rename[v.id] for v in written[:-1]} if anchor is None else {}
    assert anchor is None or len(written) == len(anchor.results), f"{name}: {launch.writes}"
    fn, given = instantiate(
        ops, anchor, template, params, rename, views, name, function.name, group.kind, beside
    )
    if anchor is not None and anchor.attr("keepdims"):
        # The kept axis has one element: the kernel stores the result as without it,
        # into the same parameter.
        out = given.output
        given = dataclasses.replace(
            given, output=dataclasses.replace(out, type=kept_axis_dropped(out.type))
        )
    return lower_tile_function(fn, launch, given)


def _cache_views(function: Function, ops: list[Op], rename: dict[int, Value]) -> list[Op]:
    """``ops`` without the cache views (``kvcache.k``, ``kvcache.v``): each is the
    kernel's parameter that the entry passes the cache's array as (``cache_k``), with
    the dims the view reads it with (the arrays are contiguous)."""
    kept = []
    for op in ops:
        if op.kind not in CACHE_VIEWS:
            kept.append(op)
            continue
        cache, _ = cache_param(function.body.ops, op.operands[0])
        k_name, v_name, _ = flat_names(cache.name)
        array = new_value(in_memory(op.result.type), k_name if op.kind == "kvcache.k" else v_name)
        if op is ops[-1]:  # the kernel's result (``return cache.K``): a copy of the array
            rename[array.id] = array
            dtype = (("dtype", op.result.type.dtype),)
            kept.append(Op("cast", (array,), op.results, dtype, span=op.span))
        else:
            rename[op.result.id] = array
    return kept


def _views_as_params(ops: list[Op], rename: dict[int, Value]) -> list[Op]:
    """A tensor in memory that the group reads only through a view is its kernel's
    parameter with the dims the view reads it with; the tensor is contiguous, so the
    same memory serves.

    - Through a reshape, the parameter has the reshape's dims and is the reshaped
      tensor: the reshape is no op of the kernel, unless the kernel writes its result,
      which is then a copy (``return reshape(x)``). A reshape of the kernel's own
      result, which it writes, makes the output parameter the result as computed.
    - Through a transpose that keeps the last axis, the axes after the one that becomes
      the rows are one (``[S, H, D]`` is read as ``[S, H*D]``): the op's load then takes
      a block of columns (``instantiate.rows_permuted_load``)."""
    readers: dict[int, list[Op]] = {}
    for op in ops:
        for v in op.operands:
            readers.setdefault(v.id, []).append(op)

    kept = []
    for op in ops:
        source = op.operands[0] if retyping_view(op) else None
        if op.kind == "reshape" and source.id not in rename and op is ops[-1]:
            _retyped(rename, op.result, source.type)  # the group's result, written as computed
            continue
        if source is None or source.id not in rename or readers[source.id] != [op]:
            kept.append(op)
        elif op.kind == "transpose":
            _retyped(rename, source, merged_rows(source.type, op.attr("perm")))
            kept.append(op)
        elif op.result.id in rename:
            _retyped(rename, source, op.result.type)
            kept.append(op)
        else:
            rename[op.result.id] = _retyped(rename, source, op.result.type)
    return kept


def _arguments_retyped(call: Op, rename: dict[int, Value]) -> None:
    """The tensors a ``tile_call`` reads, as kernel parameters of the types its kernel
    declares them with: in the caller's sizes, where those that a guard checks agree
    are one (the kernel's ``C`` of both ``x`` and ``b``, though ``b`` is ``[E]`` where
    it is passed)."""
    kernel = call.attr("kernel").function
    declared = {p.value.name: p.value.type for p in kernel.params}
    for name, value in zip(call.attr("params"), call.operands, strict=True):
        if isinstance(value.type, TensorType) and value.id in rename:
            _retyped(rename, value, declared[name])


def _retyped(rename: dict[int, Value], value: Value, t: TensorType) -> Value:
    """The kernel parameter that ``value`` maps to, given type ``t`` in every mapping
    (as a kernel reads it: a mask through a view is still the floats kept in memory)."""
    old = rename[value.id]
    new = new_value(in_memory(t), old.name)
    rename.update((k, new) for k, v in list(rename.items()) if v is old)
    return new


def _in_place(anchor: Op | None, ops: list[Op], rename: dict[int, Value]) -> dict[int, View]:
    """The tensors that fusion lets attention or a product access where they lie, by
    value id: the operands read through a row permutation (heads split from ``[S, H*D]``,
    or by ``split_qkv`` from ``[S, 3*H*D]``), loaded from the parameter the permutation
    reads; and the result that attention stores through a row permutation (the heads
    merged back), by the id of the value stored, into the output parameter, whose axes
    after the rows are then one (``merged_rows``)."""
    attention = anchor is not None and op_class(anchor) == "attention"
    if anchor is None or not (attention or anchor.kind == "matmul"):
        return {}
    views = {
        op.result.id: view_of(op, rename)
        for op in ops
        if rows_permuted(op) and op.result in anchor.operands and op.operands[0].id in rename
    }
    last = ops[-1]
    stored = attention and last is not anchor and last.kind == "transpose" and rows_permuted(last)
    if stored and last.operands[0].id not in rename:
        perm = last.attr("perm")
        inverse = tuple(perm.index(axis) for axis in range(len(perm)))
        out = _retyped(rename, last.result, merged_rows(last.result.type, inverse))
        starts = (Dim.const(0),) * (inverse[-2] + 2)
        views[last.operands[0].id] = View(last.operands[0], out, inverse, starts)
    return views


def _viewed(op: Op, views: dict[int, View]) -> bool:
    """Whether ``op`` is a row permutation that the kernel reads, or writes, through
    ``views``: no op of the kernel."""
    return rows_permuted(op) and (op.result.id in views or op.operands[0].id in views)


def _unsupported(anchor: Op | None, ops: list[Op]) -> str | None:
    """Why no library kernel can run this group, or None."""
    if anchor is None:
        if len(ops[-1].results) == 1 and _chain(ops, ops[-1].result):
            return None  # the elementwise kernel's prologue
        kinds = ", ".join(dict.fromkeys(op.kind for op in ops))
        return (
            f"no tile kernel implements a kernel of {kinds} yet; '--emit sched' shows its schedule"
        )
    prologue = ops[: ops.index(anchor)]
    computed = {op.result.id for op in prologue}
    if prologue and (
        not _chain(prologue, anchor.operands[0])
        or any(v.id in computed for v in anchor.operands[1:])
    ):
        kinds = ", ".join(dict.fromkeys(op.kind for op in prologue))
        return f"{anchor.kind} of the result of {kinds} has no tile kernel yet"
    x = anchor.operands[0].type
    if anchor.kind == "matmul" and not x.dtype.is_float:
        return (
            f"a matmul of {x.dtype} operands has no tile kernel yet: the library's gemm "
            "multiplies floats and gemm_i8 int8s; cast the operands to a float dtype, or to "
            "i8 where their values fit"
        )
    if anchor.attr("dropout") is not None:
        return "flash_attention with dropout has no tile kernel yet"
    if anchor.kind == "flash_attention":
        d, dv = (v.type.dims[-1] for v in (anchor.operands[0], anchor.operands[2]))
        if d != dv:
            return (
                f"flash_attention with a value head dim ({dv}) other than the query's ({d}) "
                "has no tile kernel yet: the kernel's head-dim tile serves q, k and v alike"
            )
    if (len(anchor.results) != 1 and ops != [anchor]) or (len(ops) > 1 and ops[-1].results == ()):
        return f"{anchor.kind} with these ops has no tile kernel yet"
    return None


def _chain(ops: list[Op], result: Value) -> bool:
    """Whether ``ops`` are a chain of elementwise ops that a kernel can compute where it
    loads ``result``, which the last one gives: arithmetic, activations and casts,
    every one of the result's shape (their other operands may broadcast), views
    (``s[:, None]``) of values that the chain does not compute, loaded broadcast, and
    the scalars they read (``1 / sqrt(float(D))``), computed by each program."""
    computed = {op.result.id for op in ops}
    return ops[-1].result is result and all(
        (op.kind in _SCALAR_CHAIN and isinstance(op.result.type, ScalarType))
        or (op.kind in _CHAIN and op.result.type.dims == result.type.dims)
        or (
            (op.kind in ("expand_dims", "reshape") or rows_permuted(op))
            and op.operands[0].id not in computed
        )
        for op in ops
    )


def _named_values(function: Function) -> list[tuple[Value, str]]:
    names = value_names(function)
    found: list[tuple[Value, str]] = [(p.value, names[p.value.id]) for p in function.params]
    for op in function.body.ops:
        found += [(v, names[v.id]) for v in op.results]
    return found
