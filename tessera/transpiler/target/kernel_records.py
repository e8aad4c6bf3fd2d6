"""Each kernel's metadata as the system architecture writes it (seed 003, section 11.2):
its tile, its matrix fragments, its resources, its launch and its fused epilogue.

The records come from the Tile IR (tiles, stages, the ``mma`` ops) and the schedule's
launches (grid, threads, shared memory, epilogue); ``tessera.runtime.kernel_yaml``
writes and reads them as YAML, ``tesserac --emit meta --format yaml`` prints them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...runtime.kernel_yaml import dump
from ..graph.ir import walk
from ..tile.ir import Mma, TileKernel, TileModule

__all__ = ["kernel_records", "kernel_yaml"]


def kernel_records(module: TileModule, meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One record per kernel of ``module``, in launch order; ``meta`` is the target's
    metadata, whose ``analysis`` gives a GPU kernel's estimated registers per thread."""
    registers = {a["kernel"]: a.get("registers_estimate") for a in meta.get("analysis", ())}
    records = []
    for program in module.programs:
        launches = {launch.name: launch for launch in program.host.launches}
        for kernel in program.kernels:
            launch = launches[kernel.launch]
            grid = [_size(str(g)) for g in launch.grid]
            resources = {"smem_per_cta": launch.smem_bytes}
            if registers.get(kernel.name) is not None:
                resources = {"regs_per_thread": registers[kernel.name], **resources}
            records.append({
                "name": kernel.name,
                "function": kernel.function,
                "tile": {**dict(launch.tiles), "stages": launch.stages},
                "fragments": _fragments(kernel),
                "resources": resources,
                "launch": {"grid": grid + [1] * (3 - len(grid)),
                           "block": [kernel.threads, 1, 1]},
                "epilogue": list(launch.epilogue),
            })  # fmt: skip
    return records


def _fragments(kernel: TileKernel) -> dict[str, Any] | None:
    """The kernel's first matrix product: its instruction's shape, and the dtypes of its
    operands and its accumulator; None for a kernel without one."""
    for op in walk(kernel.body):
        mma = op.attr("mma")
        if isinstance(mma, Mma):
            m, n, k = mma.shape
            return {"mma": f"{m}x{n}x{k}", "inst": mma.inst,
                    "dtype_in": op.operands[0].type.dtype.name,
                    "dtype_acc": op.results[0].type.dtype.name}  # fmt: skip
    return None


def _size(text: str) -> int | str:
    """A grid axis: its number of programs, or the expression that gives it."""
    return int(text) if text.isdigit() else text


def kernel_yaml(module: TileModule, meta: Mapping[str, Any]) -> str:
    """The records as YAML documents, after a comment that says what they describe."""
    comment = (f"Kernel metadata of {meta['source']} for {meta['target']} {meta['arch']} "
               f"(tesserac {meta['provenance']['tesserac']})")  # fmt: skip
    return dump(kernel_records(module, meta), comment)
