"""The text form of the Schedule IR (``--emit sched``)."""

from __future__ import annotations

from ..graph.dims import Dim
from .hardware import KIB
from .ir import HostProgram, Launch, ScheduleModule

__all__ = ["print_schedule"]


def print_schedule(module: ScheduleModule) -> str:
    lines = [f"// schedule IR of {module.name} for {module.target} {module.arch}"]
    for program in module.programs:
        lines += ["", *_program(program)]
    return "\n".join(lines) + "\n"


def _program(p: HostProgram) -> list[str]:
    lines = [f"host @{p.function} ({p.kind}) {{"]
    if p.kind == "declaration":
        return [*lines, "  // declaration only: nothing to launch", "}"]
    lines.append(f"  inputs {', '.join(p.inputs)}")
    for guard in p.guards:
        lines.append(f"  guard {guard}  // {guard.reason}")
    for b in p.buffers:
        lines.append(
            f"  buffer {b.name} : {b.type}  bytes {b.bytes}  slot {b.slot}  "
            f"live k{b.first}..k{b.last}"
        )
    if p.saved is not None:
        lines.append(_saved(p))
    for launch in p.launches:
        lines += _launch(launch)
    if p.results:
        lines.append(f"  return {', '.join(p.results)}")
    if p.donated:
        pairs = ", ".join(f"{result} into {given}" for result, given in p.donated)
        lines.append(f"  in place {pairs}")
    return [*lines, "}"]


def _saved(p: HostProgram) -> str:
    """What the backward pass keeps of the forward's values, and its size."""
    sizes = {b.name: b.bytes for b in p.buffers}
    total = Dim.const(0)
    for name in p.saved:
        total = total + sizes[name]
    return f"  saved for the backward {', '.join(p.saved) or '-'}  bytes {total}"


def _launch(k: Launch) -> list[str]:
    head = f"  launch {k.name} {k.kind}  schedule {k.source}"
    template = f"    template {k.template}"
    if k.prologue:
        template += f"  prologue [{', '.join(k.prologue)}]"
    if k.epilogue:
        template += f"  epilogue [{', '.join(k.epilogue)}]"
    io = f"    reads {', '.join(k.reads) or '-'}  writes {', '.join(k.writes) or '-'}"
    if not k.grid:
        return [head, template, io]
    tiles = " ".join(f"{name}={value}" for name, value in k.tiles)
    knobs = f"    tiles {tiles}  warps {k.warps}  stages {k.stages}  vector {k.vector}"
    knobs += f"  swizzle {k.swizzle}" + (f"  split_k {k.split_k}" if k.split_k > 1 else "")
    knobs += "  persistent" if k.persistent else ""
    grid = f"    grid [{', '.join(str(g) for g in k.grid)}]  threads {k.threads}"
    if k.smem_bytes:
        smem = f"{k.smem_bytes // KIB} KiB" if k.smem_bytes % KIB == 0 else f"{k.smem_bytes} B"
        grid += f"  smem {smem}"
    if k.mma is not None:
        grid += f"  mma {k.mma}"
    return [head, template, knobs, grid, io]
