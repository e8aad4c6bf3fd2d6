"""The CUDA backend's collectives: host functions that run them on NCCL.

A CUDA file of a mesh function ends with one ``extern "C"`` host function per
collective, named ``tessera_<function>_<launch>``, that enqueues the collective on a
stream with a communicator of the devices of its mesh axes; a host program runs them
between the kernel launches, in the order the metadata's ``collectives`` give (each
after the launches its ``after`` counts). The section is host code, which nvcc builds
and NVRTC skips (``__CUDACC_RTC__``), so the file still loads through CuPy's
``RawModule``; it includes ``<nccl.h>`` from the ``nvidia-nccl-cu13`` wheel or a system
NCCL.

NCCL exchanges contiguous blocks: a gather, scatter or exchange runs along dim 0 only
(``nccl_limit`` says why another is refused).
"""

from __future__ import annotations

import math
from typing import Any

from ..graph.collectives import collective_of
from ..graph.dims import Dim
from ..graph.ir import Function, GraphModule, Op
from ..graph.printer import value_names
from ..schedule.ir import Launch
from ..tile.ir import TileModule
from .cexpr import c_dim
from .naming import symbol_names
from .wrap import wrap_lines

__all__ = ["nccl_host_code", "nccl_limit", "nccl_meta"]

#: NCCL's type and the C type of each dtype; others are one byte (i8, fp8): ncclUint8
_TYPES = {"f32": "ncclFloat32", "tf32": "ncclFloat32", "i32": "ncclInt32", "f16": "ncclFloat16",
          "bf16": "ncclBfloat16"}  # fmt: skip
_C_TYPES = {"f32": "float", "tf32": "float", "i32": "int", "f16": "__half",
            "bf16": "__nv_bfloat16"}  # fmt: skip
_OPS = {"sum": "ncclSum", "max": "ncclMax", "min": "ncclMin", "mean": "ncclAvg"}


def nccl_limit(op: Op) -> str | None:
    """Why NCCL cannot run ``op`` as the CUDA backend lowers it, or None."""
    dims = {"all_gather": ("dim",), "reduce_scatter": ("dim",),
            "all_to_all": ("split_dim", "concat_dim")}.get(op.kind, ())  # fmt: skip
    moved = [name for name in dims if op.attr(name) != 0]
    if moved:
        return (
            f"{op.kind} with {moved[0]}={op.attr(moved[0])}: on NCCL it runs along dim 0 only; "
            "transpose the dim to the front first"
        )
    return None


def _collectives(module: TileModule, graph: GraphModule) -> list[tuple[Function, Launch, Op]]:
    functions = {f.name: f for f in graph.functions}
    found = []
    for program in module.programs:
        f = functions.get(program.host.function)
        if f is None or f.mesh is None:
            continue
        for launch in program.host.launches:
            if launch.kind == "collective":
                found.append((f, launch, collective_of(f, launch.group)[0]))
    return found


def _count(dims: tuple[Dim, ...], names: dict[str, str]) -> str:
    return f"static_cast<size_t>({c_dim(math.prod(dims, start=Dim.const(1)), names)})"


def _call(op: Op, x: str, y: str, dims: tuple, names: dict[str, str]) -> list[str]:
    """The NCCL calls that move one tensor from ``x`` into ``y``, each run while
    ``status`` is still ncclSuccess."""
    dtype = _TYPES.get(op.operands[0].type.dtype.name, "ncclUint8")
    count = _count(dims, names)
    if op.kind == "all_reduce":
        call = f"ncclAllReduce({x}, {y}, {count}, {dtype}, {_OPS[op.attr('op')]}, comm, stream)"
    elif op.kind == "all_gather":
        call = f"ncclAllGather({x}, {y}, {count}, {dtype}, comm, stream)"
    elif op.kind == "reduce_scatter":
        call = (f"ncclReduceScatter({x}, {y}, {count}, {dtype}, {_OPS[op.attr('op')]}, comm, "
                "stream)")  # fmt: skip
    else:  # all_to_all along dim 0: block i of x to device i, block j of y from device j
        return [
            f"const size_t block = {count} / static_cast<size_t>(n);",
            "for (int peer = 0; peer < n && status == ncclSuccess; ++peer) {",
            f"  status = ncclSend({x} + peer * block, block, {dtype}, peer, comm, stream);",
            f"  if (status == ncclSuccess) status = ncclRecv({y} + peer * block, block, "
            f"{dtype}, peer, comm, stream);",
            "}",
        ]
    return [f"if (status == ncclSuccess) status = {call};"]


def _function(f: Function, launch: Launch, op: Op) -> list[str]:
    """The host function of one collective (several tensors: one NCCL group, which NCCL
    runs as one operation). It runs on ``stream``, a stream of its own, after the
    kernels enqueued on ``compute`` so far (the event ``ready``), and records ``done``
    there: the kernels the host program enqueues next on ``compute`` overlap it, up to
    the first that reads its results, which waits for ``done``."""
    types = [v.type for v in (*op.operands, *op.results)]
    symbols = sorted({s for t in types for d in t.dims for s in d.symbols()})
    taken = {"comm", "compute", "stream", "ready", "done", "n", "peer", "block", "status", "ended"}
    k = len(op.operands)
    pairs = [("x", "y")] if k == 1 else [(f"x{i}", f"y{i}") for i in range(k)]
    names = symbol_names(tuple(symbols), frozenset(taken | {n for p in pairs for n in p}))
    t = _C_TYPES.get(op.operands[0].type.dtype.name, "unsigned char")
    params = [p for x, y in pairs for p in (f"const {t}* {x}", f"{t}* {y}")]
    params += [f"const long long {names[s]}" for s in symbols]
    params += ["ncclComm_t comm", "cudaStream_t compute", "cudaStream_t stream",
               "cudaEvent_t ready", "cudaEvent_t done"]  # fmt: skip
    axes = op.attr("axis").replace(",", ", ")
    what = f" (a bucket of {k} tensors)" if k > 1 else ""
    lines = [f"// {f.name} {launch.name}: {op.kind} over {axes}{what}",
             f"extern \"C\" ncclResult_t tessera_{f.name}_{launch.name}({', '.join(params)}) {{",
             "  // after the kernels enqueued on `compute` so far, on a stream of its own",
             "  if (cudaEventRecord(ready, compute) != cudaSuccess ||",
             "      cudaStreamWaitEvent(stream, ready, 0) != cudaSuccess) {",
             "    return ncclUnhandledCudaError;",
             "  }"]  # fmt: skip
    if op.kind == "all_to_all":
        lines += ["  int n = 0;", "  ncclResult_t status = ncclCommCount(comm, &n);",
                  "  if (status == ncclSuccess) status = ncclGroupStart();"]  # fmt: skip
    else:
        lines += ["  ncclResult_t status = ncclGroupStart();"]
    lines += ["  if (status != ncclSuccess) return status;"]
    dims = "results" if op.kind == "reduce_scatter" else "operands"
    for i, ((x, y), v) in enumerate(zip(pairs, getattr(op, dims), strict=True)):
        calls = _call(op, x, y, v.type.dims, names)
        if i == 0:  # status is ncclSuccess here
            calls[0] = calls[0].removeprefix("if (status == ncclSuccess) ")
        lines += [f"  {line}" for line in calls]
    lines += ["  const ncclResult_t ended = ncclGroupEnd();",
              "  if (status != ncclSuccess) return status;",
              "  if (ended != ncclSuccess) return ended;",
              "  // the kernels that read the results wait for `done` on `compute`",
              "  return cudaEventRecord(done, stream) == cudaSuccess ? ncclSuccess "
              ": ncclUnhandledCudaError;",
              "}"]  # fmt: skip
    return lines


def nccl_host_code(module: TileModule, graph: GraphModule) -> str:
    """The NCCL section of a CUDA file, or "" for a file without collectives."""
    found = _collectives(module, graph)
    if not found:
        return ""
    lines = [
        "// ---- collectives on NCCL: host code, which nvcc builds and NVRTC skips",
        "#if !defined(__CUDACC_RTC__)",
        "#include <cuda_bf16.h>",
        "#include <cuda_fp16.h>",
        "#include <nccl.h>",
    ]
    for f, launch, op in found:
        lines += ["", *_function(f, launch, op)]
    return wrap_lines("\n".join([*lines, "#endif  // !__CUDACC_RTC__", ""]))


def nccl_meta(module: TileModule, graph: GraphModule) -> dict[str, list[dict[str, Any]]]:
    """Each mesh function's collectives: their host function; ``after``, the number of
    kernel launches that run before each; ``wait_before``, the number of kernel launches
    that may run before its results must be complete (the next launch reads them), or
    None where only the function's result takes them; and the tensors it reads and
    writes, one per operand and result."""
    out: dict[str, list[dict[str, Any]]] = {}
    for f, launch, op in _collectives(module, graph):
        program = next(p for p in module.programs if p.host.function == f.name)
        launches = program.host.launches
        index = [la.name for la in launches].index(launch.name)
        kernels = {k.launch for k in program.kernels}
        after = sum(1 for la in launches[:index] if la.name in kernels)
        readers = (i for i in range(index + 1, len(launches)) if launches[i].name in kernels
                   and set(launches[i].reads) & set(launch.writes))  # fmt: skip
        wait = next((sum(1 for la in launches[:i] if la.name in kernels) for i in readers), None)
        names = value_names(f)
        out.setdefault(f.name, []).append({
            "symbol": f"tessera_{f.name}_{launch.name}", "kind": op.kind,
            "axis": op.attr("axis").split(","), "after": after, "wait_before": wait,
            "reads": [names[v.id] for v in collective_of(f, launch.group)[1]],
            "writes": [names[v.id] for v in op.results],
        })  # fmt: skip
    return out
