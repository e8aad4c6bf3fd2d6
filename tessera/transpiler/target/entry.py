"""A graph function's entry as every backend exposes it: parameters, sizes, guards.

An entry takes the function's tensors and scalars in ``.tsr`` order, then its
results (``out``, or ``out0``, ``out1``, ... for several), then every size symbol
in order of first appearance in the tensors' dims. The metadata (``--emit meta``)
describes it the same way for every target, so that one argument checker serves
all runtimes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..graph.ir import Function, Guard, StateSlot, result_names, walk
from ..graph.kvcache import flat_names
from ..graph.types import KVCacheType, ScalarType, TensorType
from ..schedule.ir import HostProgram
from ..tile.ir import STORES, TileKernel, TileProgram
from ..tile.kvcache import flat_types

__all__ = [
    "signature_items", "symbols", "kernel_sizes", "entry_params", "written", "updated",
    "signature_meta", "mesh_meta",
]  # fmt: skip


def symbols(types: list[Any]) -> tuple[str, ...]:
    """Size symbols in order of first appearance in the tensors' dims."""
    found: dict[str, None] = {}
    for t in types:
        for dim in getattr(t, "dims", ()):
            for monomial, _ in dim.terms:
                for name, _ in monomial:
                    found.setdefault(name, None)
    return tuple(found)


#: The ops that name a size outside their tensors' dims, and the attribute that holds it.
_SIZE_ATTRS = {"dim_to_float": ("dim",), "kv_advance": ("n",),
               "kv_visible": ("rows", "chunk", "programs", "stacked")}  # fmt: skip


def kernel_sizes(kernel: TileKernel) -> tuple[str, ...]:
    """The size symbols a kernel takes: those of its tensors' dims, then those that only
    a size read as a float names (``float(R - 1)`` in a kernel over ``[1, C]``: the
    divisor of a variance over the rows), a cache's advance adds (its appended ``n``) or
    its visible keys read (the query rows, the split's keys)."""
    found = dict.fromkeys(symbols([p.type for p in kernel.params]))
    for op in walk(kernel.body):
        for attr in _SIZE_ATTRS.get(op.kind, ()):
            found.update(dict.fromkeys(sorted(op.attr(attr).symbols())))
    return tuple(found)


def entry_params(program: TileProgram) -> list[tuple[str, Any]]:
    """The entry's parameters by name and type: the function's inputs, then its results."""
    by_name: dict[str, Any] = {}
    for kernel in program.kernels:
        for p in kernel.params:
            by_name.setdefault(p.name, p.type)
    names = [n.removeprefix("%") for n in program.host.inputs]
    if program.host.kind != "declaration":
        names += result_names(len(program.host.results))
    declared = dict(zip(names, program.host.types, strict=False))
    # a KVCache is its three tensors, in its place (``tile.kvcache``)
    for name, t in list(declared.items()):
        if isinstance(t, KVCacheType) and t.dims is not None:
            at = names.index(name)
            names[at : at + 1] = flat_names(name)
            declared.update(zip(flat_names(name), flat_types(t), strict=True))
    # every declared parameter keeps its place, read or not (a gradient may not need an
    # input, a scalar may be unused while a model is written): callers pass what the
    # ``.tsr`` signature says
    kept = [
        n for n in names if n in by_name or isinstance(declared.get(n), (TensorType, ScalarType))
    ]
    return [(n, declared.get(n, by_name.get(n))) for n in kept]


def written(program: TileProgram, name: str) -> bool:
    """Whether a kernel of the program stores into the parameter ``name``."""
    return any(
        op.kind in STORES and op.operands[0].name == name
        for kernel in program.kernels
        for op in walk(kernel.body)
    )


def updated(program: TileProgram) -> dict[str, str]:
    """The results whose kernel reads the input they are written over, by name, with
    that input's: a SIMT kernel takes a donated state's tensor and its result as one
    parameter, the result's (``tile.build``), so the result must hold the input's values
    when the launches start: the caller passes the input's array as the result, or the
    launcher copies it there first."""
    donated = dict(program.host.donated)
    results = result_names(len(program.host.results))
    pairs = zip(results, program.host.results, strict=True)
    given = {out: donated[r].removeprefix("%") for out, r in pairs if r in donated}
    return {out: name for out, name in given.items() if _read(program, out)}


def _read(program: TileProgram, name: str) -> bool:
    """Whether a kernel of the program reads the parameter ``name`` (an op other than a
    store takes it)."""
    for kernel in program.kernels:
        ids = {p.id for p in kernel.params if p.name == name}
        for op in walk(kernel.body):
            if op.kind not in STORES and any(v.id in ids for v in op.operands):
                return True
    return False


def signature_items(inputs: list[Mapping[str, Any]]) -> list[str]:
    """An entry's inputs as its documentation shows them, from their metadata: dtypes,
    dims and defaults as the ``.tsr`` file gives them, and ``*`` before the keyword-only
    ones (``q: bf16[BH, S, D], *, causal: bool``)."""
    items = []
    for p in inputs:
        if p.get("keyword_only") and "*" not in items:
            items.append("*")
        if p["kind"] == "scalar":
            default = f" = {p['default']!r}" if "default" in p else ""
            items.append(f"{p['name']}: {p['type']}{default}")
        else:
            items.append(f"{p['name']}: {p['dtype']}[{', '.join(p['dims'])}]")
    return items


def signature_meta(program: TileProgram) -> dict[str, Any]:
    """The entry's parameters, sizes, result and guards, as the metadata holds them."""
    params = []
    results = result_names(len(program.host.results))
    defaults = {n.removeprefix("%"): v for n, v in program.host.defaults}
    keyword_only = {n.removeprefix("%") for n in program.host.keyword_only}
    updates = updated(program)
    for name, t in entry_params(program):
        if isinstance(t, TensorType):
            io = "out" if name in results else "inout" if written(program, name) else "in"
            params.append({"name": name, "kind": "tensor", "dtype": t.dtype.name,
                           "dims": [str(d) for d in t.dims], "io": io})  # fmt: skip
            if name in updates:
                params[-1]["updates"] = updates[name]
        else:
            params.append({"name": name, "kind": "scalar", "type": t.kind})
            if name in defaults:
                params[-1]["default"] = defaults[name]
        if name in keyword_only:
            params[-1]["keyword_only"] = True
    meta = {
        "name": program.host.function,
        "params": params,
        "dims": list(symbols([t for _, t in entry_params(program)])),
        "results": [p["name"] for p in params if p["name"] in results],
        "guards": [_guard_meta(g) for g in program.host.guards],
    }  # fmt: skip
    if program.host.states:
        meta["states"] = [_state_meta(s, program.host) for s in program.host.states]
    if program.host.caches:
        returned = sum(len(c.returned) for c in program.host.caches)
        meta["returns"] = len(program.host.results) + returned
        meta["caches"] = [
            {"name": c.name, "s_max": str(c.s_max), "window": c.window,
             "returned": list(c.returned)}
            for c in program.host.caches
        ]  # fmt: skip
    return meta


def _state_meta(state: StateSlot, host: HostProgram) -> dict[str, Any]:
    """An ``OptimizerState`` parameter (its name) or result (the index of its first
    tensor among the results), as the metadata holds it: which tensors make it up, and
    for a result that the kernels may write into the arrays of the donated state,
    ``in_place`` (the caller may then pass those arrays as the results' ``out``)."""
    meta = {"param": state.param, "fp32_master": state.fp32_master, "count": state.count}
    if state.result is None:
        meta["name"] = state.name
    else:
        meta["result"] = state.result
        donated = {result for result, _ in host.donated}
        if all(r in donated for r in host.results[state.result : state.result + state.count]):
            meta["in_place"] = True
    return meta


def _guard_meta(g: Guard) -> dict[str, str]:
    """A guard as the metadata holds it; one on a tensor's values names the tensor."""
    meta = {"kind": g.kind, "left": str(g.left), "right": str(g.right), "reason": g.reason}
    if g.kind == "indices":
        meta["tensor"] = g.tensor
    return meta


def mesh_meta(function: Function | None) -> dict[str, Any]:
    """What the runtime checks of a mesh function, on every target: the mesh, and each
    parameter's and the result's shard spec."""
    if function is None or function.mesh is None:
        return {}
    mesh = function.mesh
    return {"mesh": {"axes": [[name, n] for name, n in mesh.axes],
                     "deterministic": mesh.deterministic,
                     "shards": [list(s) if s else None for s in function.shards]}}  # fmt: skip
