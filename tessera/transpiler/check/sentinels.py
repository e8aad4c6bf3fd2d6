"""NaN/Inf sentinels of a debug build: what each launch writes, for the runtime to check.

In a debug build (``debug=True``, ``tesserac --debug``) each launch of the metadata
carries a ``sentinel``: the ``.tsr`` line of its kernel and the float tensors it writes
(its results and the intermediates later launches read), by the names its arguments
have. After the launch, the runtime reads them back and raises at the first NaN or
infinity, naming the kernel and the line, so that the first kernel to produce one is
found, not the last to pass it on.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from ..graph.ir import GraphModule, Value, walk
from ..schedule.ir import ScheduleModule
from ..tile.ir import TileKernel, TileModule
from .origins import launch_lines

__all__ = ["with_sentinels", "sentinel_lines", "written_floats"]


def sentinel_lines(graph: GraphModule, module: TileModule) -> dict[str, str]:
    """Per kernel (by its Tile IR name): the ``.tsr`` line its sentinel names, the first
    of the user's source that its launch runs."""
    hosts = tuple(program.host for program in module.programs)
    file = next((h.span.file for h in hosts if h.span is not None), module.name)
    line = _first_line(graph, ScheduleModule(module.name, module.target, module.arch, hosts), file)
    return {k.name: line(k) for program in module.programs for k in program.kernels}


def written_floats(kernel: TileKernel) -> list[Value]:
    """The float tensors among ``kernel``'s parameters that it stores to."""
    stored = {op.operands[0].id for op in walk(kernel.body) if op.kind == "store"}
    return [p for p in kernel.params if p.id in stored and p.type.dtype.is_float]


def with_sentinels(
    meta: dict[str, Any], graph: GraphModule, sched: ScheduleModule, module: TileModule, file: str
) -> dict[str, Any]:
    """``meta`` with a ``sentinel`` in each launch of a kernel that writes a float tensor,
    at the first line of ``file`` (the user's source) that the launch runs."""
    kernels = {k.name: k for program in module.programs for k in program.kernels}
    line = _first_line(graph, sched, file)
    meta = copy.deepcopy(meta)
    meta["debug"] = True
    for function in meta["functions"]:
        for launch in function.get("launches", ()):
            kernel = kernels.get(launch["kernel"])
            if kernel is not None:
                writes = _writes(kernel, launch["args"])
                if writes:
                    launch["sentinel"] = {"line": line(kernel), "writes": writes}
    # The CPU's entries check after their launches themselves: each check by number.
    for check in meta.get("sentinels", ()):
        check["line"] = line(kernels[check["kernel"]])
    return meta


def _first_line(
    graph: GraphModule, sched: ScheduleModule, file: str
) -> Callable[[TileKernel], str]:
    """The line of ``file`` a kernel's sentinel names: the first its launch runs."""
    origins = launch_lines(graph, sched, file)
    name = file.rsplit("/", 1)[-1]

    def line(kernel: TileKernel) -> str:
        lines = origins.get(f"{kernel.function}/{kernel.launch}")
        return f"{name}:{lines[0]}" if lines else _line(kernel)

    return line


def _writes(kernel: TileKernel, args: list[str]) -> list[dict[str, str]]:
    written = {p.id for p in written_floats(kernel)}
    return [
        {"name": name, "dtype": param.type.dtype.name}
        for param, name in zip(kernel.params, args, strict=False)
        if param.id in written
    ]


def _line(kernel: TileKernel) -> str:
    span = kernel.span
    return f"{span.file.rsplit('/', 1)[-1]}:{span.line}" if span is not None else kernel.function
