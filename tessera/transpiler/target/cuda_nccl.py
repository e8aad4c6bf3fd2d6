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

from ..graph.dims import Dim
from ..graph.ir import Function, GraphModule, Op
from ..schedule.ir import Launch
from ..tile.ir import TileModule
from .cexpr import c_dim
from .naming import symbol_names

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
                found.append((f, launch, f.body.ops[f.groups[launch.group].ops[0]]))
    return found


def _count(dims: tuple[Dim, ...], names: dict[str, str]) -> str:
    return f"static_cast<size_t>({c_dim(math.prod(dims, start=Dim.const(1)), names)})"


def _function(f: Function, launch: Launch, op: Op) -> list[str]:
    x, y = op.operands[0].type, op.result.type
    symbols = sorted({s for d in (*x.dims, *y.dims) for s in d.symbols()})
    names = symbol_names(tuple(symbols), frozenset({"x", "y", "comm", "stream", "n", "peer"}))
    t = _C_TYPES.get(x.dtype.name, "unsigned char")
    params = [f"const {t}* x", f"{t}* y", *(f"const long long {names[s]}" for s in symbols),
              "ncclComm_t comm", "cudaStream_t stream"]  # fmt: skip
    dtype = _TYPES.get(x.dtype.name, "ncclUint8")
    axes = op.attr("axis").replace(",", ", ")
    symbol = f"tessera_{f.name}_{launch.name}"
    head = [f"// {f.name} {launch.name}: {op.kind} over {axes}",
            f"extern \"C\" ncclResult_t {symbol}({', '.join(params)}) {{"]  # fmt: skip
    if op.kind == "all_reduce":
        body = [f"  return ncclAllReduce(x, y, {_count(x.dims, names)}, {dtype}, "
                f"{_OPS[op.attr('op')]}, comm, stream);"]  # fmt: skip
    elif op.kind == "all_gather":
        body = [f"  return ncclAllGather(x, y, {_count(x.dims, names)}, {dtype}, comm, stream);"]
    elif op.kind == "reduce_scatter":
        body = [f"  return ncclReduceScatter(x, y, {_count(y.dims, names)}, {dtype}, "
                f"{_OPS[op.attr('op')]}, comm, stream);"]  # fmt: skip
    else:  # all_to_all along dim 0: block i of x to device i, block j of y from device j
        block = _count(x.dims, names)
        body = [
            "  int n = 0;",
            "  ncclResult_t status = ncclCommCount(comm, &n);",
            "  if (status != ncclSuccess) return status;",
            f"  const size_t block = {block} / static_cast<size_t>(n);",
            "  ncclGroupStart();",
            "  for (int peer = 0; peer < n; ++peer) {",
            f"    ncclSend(x + peer * block, block, {dtype}, peer, comm, stream);",
            f"    ncclRecv(y + peer * block, block, {dtype}, peer, comm, stream);",
            "  }",
            "  return ncclGroupEnd();",
        ]
    return [*head, *body, "}"]


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
    return "\n".join([*lines, "#endif  // !__CUDACC_RTC__", ""])


def nccl_meta(module: TileModule, graph: GraphModule) -> dict[str, list[dict[str, Any]]]:
    """Each mesh function's collectives: their host function, and how many kernel
    launches run before each."""
    out: dict[str, list[dict[str, Any]]] = {}
    for f, launch, op in _collectives(module, graph):
        program = next(p for p in module.programs if p.host.function == f.name)
        index = [la.name for la in program.host.launches].index(launch.name)
        kernels = {k.launch for k in program.kernels}
        after = sum(1 for la in program.host.launches[:index] if la.name in kernels)
        out.setdefault(f.name, []).append({
            "symbol": f"tessera_{f.name}_{launch.name}", "kind": op.kind,
            "axis": op.attr("axis").split(","), "after": after,
            "reads": list(launch.reads), "writes": list(launch.writes),
        })  # fmt: skip
    return out
