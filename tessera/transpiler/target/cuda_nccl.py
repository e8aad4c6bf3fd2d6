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


#: The code of each reduction in ``tessera_combine``
_COMBINE = {"sum": 0, "max": 1, "min": 2, "mean": 3}

#: The deterministic reductions' kernel and its launch, once a file that has one.
_COMBINE_KERNEL = """
// The reductions of a deterministic mesh: out[i] = blocks[0][i] + blocks[1][i] + ... in
// rank order (or their max, min or mean), the same bits on every device and every run.
template <class T>
__global__ void tessera_combine(const T* blocks, T* out, size_t count, int n, int op) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    T acc = blocks[i];
    for (int c = 1; c < n; ++c) {
      const T v = blocks[c * count + i];
      acc = op == 1 ? (acc < v ? v : acc) : op == 2 ? (v < acc ? v : acc) : acc + v;
    }
    out[i] = op == 3 ? static_cast<T>(acc / static_cast<T>(n)) : acc;
  }
}

template <class T>
ncclResult_t tessera_combine_on(const T* blocks, T* out, size_t count, int n, int op,
                                cudaStream_t stream) {
  if (count == 0) return ncclSuccess;
  const size_t blocks_needed = (count + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks_needed < 65535 ? blocks_needed : 65535);
  tessera_combine<T><<<grid, 256, 0, stream>>>(blocks, out, count, n, op);
  return cudaGetLastError() == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}"""


def _ordered(f: Function, op: Op) -> bool:
    """Whether ``op`` sums in rank order: a reduction of a deterministic mesh."""
    return f.mesh.deterministic and op.kind in ("all_reduce", "reduce_scatter")


def _scratch(f: Function, op: Op) -> list[Dim]:
    """Where each tensor's blocks lie in the scratch buffer of an ordered reduction (the
    offsets, in elements), and last the buffer's size: every device's block of every
    tensor."""
    n = math.prod(f.mesh.size(a) for a in op.attr("axis").split(","))
    dims = op.results if op.kind == "reduce_scatter" else op.operands
    offsets = [Dim.const(0)]
    for v in dims:
        offsets.append(offsets[-1] + math.prod(v.type.dims, start=Dim.const(1)) * n)
    return offsets


def _ordered_calls(
    op: Op, x: str, y: str, dims: tuple, at: str, names: dict[str, str]
) -> tuple[list[str], list[str]]:
    """The NCCL calls that bring every device's block of one tensor into the scratch
    buffer at ``at``, and the combination in rank order that follows the group."""
    dtype = _TYPES[op.operands[0].type.dtype.name]
    count = _count(dims, names)
    blocks = f"scratch + {at}" if at != "0" else "scratch"
    if op.kind == "all_reduce":
        gather = [f"if (status == ncclSuccess) status = ncclAllGather({x}, {blocks}, {count}, "
                  f"{dtype}, comm, stream);"]  # fmt: skip
    else:  # block i of every device's x to device i
        gather = [
            "for (int peer = 0; peer < n && status == ncclSuccess; ++peer) {",
            f"  status = ncclSend({x} + peer * {count}, {count}, {dtype}, peer, comm, stream);",
            f"  if (status == ncclSuccess) status = ncclRecv({blocks} + peer * {count}, "
            f"{count}, {dtype}, peer, comm, stream);",
            "}",
        ]
    combine = [f"if (status == ncclSuccess) status = tessera_combine_on({blocks}, {y}, "
               f"{count}, n, {_COMBINE[op.attr('op')]}, stream);"]  # fmt: skip
    return gather, combine


def _function(f: Function, launch: Launch, op: Op) -> list[str]:
    """The host function of one collective (several tensors: one NCCL group, which NCCL
    runs as one operation). It runs on ``stream``, a stream of its own, after the
    kernels enqueued on ``compute`` so far (the event ``ready``), and records ``done``
    there: the kernels the host program enqueues next on ``compute`` overlap it, up to
    the first that reads its results, which waits for ``done``."""
    types = [v.type for v in (*op.operands, *op.results)]
    symbols = sorted({s for t in types for d in t.dims for s in d.symbols()})
    taken = {"comm", "compute", "stream", "ready", "done", "n", "peer", "block", "status",
             "ended", "scratch"}  # fmt: skip
    k = len(op.operands)
    pairs = [("x", "y")] if k == 1 else [(f"x{i}", f"y{i}") for i in range(k)]
    names = symbol_names(tuple(symbols), frozenset(taken | {n for p in pairs for n in p}))
    t = _C_TYPES.get(op.operands[0].type.dtype.name, "unsigned char")
    params = [p for x, y in pairs for p in (f"const {t}* {x}", f"{t}* {y}")]
    params += [f"const long long {names[s]}" for s in symbols]
    ordered = _ordered(f, op)
    params += [f"{t}* scratch"] if ordered else []
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
    if op.kind == "all_to_all" or ordered:
        lines += ["  int n = 0;", "  ncclResult_t status = ncclCommCount(comm, &n);",
                  "  if (status == ncclSuccess) status = ncclGroupStart();"]  # fmt: skip
    else:
        lines += ["  ncclResult_t status = ncclGroupStart();"]
    lines += ["  if (status != ncclSuccess) return status;"]
    dims = "results" if op.kind == "reduce_scatter" else "operands"
    combines: list[str] = []
    offsets = _scratch(f, op)
    for i, ((x, y), v) in enumerate(zip(pairs, getattr(op, dims), strict=True)):
        if ordered:
            calls, combine = _ordered_calls(op, x, y, v.type.dims, c_dim(offsets[i], names),
                                            names)  # fmt: skip
            combines += combine
        else:
            calls = _call(op, x, y, v.type.dims, names)
        if i == 0 and not ordered:  # status is ncclSuccess here
            calls[0] = calls[0].removeprefix("if (status == ncclSuccess) ")
        lines += [f"  {line}" for line in calls]
    lines += ["  const ncclResult_t ended = ncclGroupEnd();",
              "  if (status != ncclSuccess) return status;",
              "  if (ended != ncclSuccess) return ended;"]  # fmt: skip
    if combines:
        lines += ["  // every device's blocks, combined in rank order", *(f"  {c}" for c in
                  combines), "  if (status != ncclSuccess) return status;"]  # fmt: skip
    lines += ["  // the kernels that read the results wait for `done` on `compute`",
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
    if any(_ordered(f, op) for f, _, op in found):
        lines += _COMBINE_KERNEL.split("\n")
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
            "scratch": str(_scratch(f, op)[-1]) if _ordered(f, op) else None,
        })  # fmt: skip
    return out
