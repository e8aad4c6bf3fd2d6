"""The text form of the Tile IR (``--emit tile``, ``inspect_ir("tile")``).

Each kernel shows its grid, tile sizes and threads, its parameters, the
shared-memory plan, and its body in the Graph IR's op syntax. Accesses print
as ``[pid_m*128 +: 128 < M, kb*32 +: 32 < K]``: offset, size, and the bound
checked when the axis is masked.
"""

from __future__ import annotations

from ..graph.printer import OpPrinter, name_values
from .ir import TileKernel, TileModule

__all__ = ["print_tile"]


def print_tile(module: TileModule) -> str:
    lines = [f"// tile IR of {module.name} for {module.target} {module.arch}"]
    for program in module.programs:
        host = program.host
        launched = {k.launch: k.name for k in program.kernels}
        lines += ["", f"host @{host.function} {{"]
        for launch in host.launches:
            if launch.name in launched:
                lines.append(f"  launch {launch.name} @{launched[launch.name]}")
        for launch, why, _ in program.runtime:
            lines.append(f"  runtime {launch}  // {why}")
        lines.append("}")
        for kernel in program.kernels:
            lines += ["", *print_kernel(kernel)]
    return "\n".join(lines) + "\n"


def print_kernel(kernel: TileKernel) -> list[str]:
    printer = OpPrinter(name_values(list(kernel.params), kernel.body))
    template = "" if kernel.template == "tile_kernel" else f", {kernel.template} from the library"
    if kernel.kind in ("tile_call", "state"):
        template = f", {kernel.made_from}"
    out = [f"kernel @{kernel.name} ({kernel.kind}{template}) {{"]
    persistent = "  persistent: one program per multiprocessor" if kernel.persistent else ""
    out.append("  grid [" + ", ".join(str(a) for a in kernel.grid) + "]" + persistent)
    tiles = " ".join(f"{name}={size}" for name, size in kernel.tiles)
    producer = f" + {kernel.producer} producer" if kernel.producer else ""
    out.append(
        f"  tiles {tiles}  threads {kernel.threads}{producer}  warps {kernel.warps}"
        f"  stages {kernel.stages}  vector {kernel.vector}"
    )
    for param in kernel.params:
        out.append(f"  param {printer.name(param)} : {param.type}")
    for slot in kernel.smem:
        out.append(
            f"  smem {slot.buffer}  offset {slot.offset}  bytes {slot.bytes}  layout {slot.layout}"
        )
    if kernel.smem:
        out.append(f"  smem total {kernel.smem_bytes} bytes")
    out.append("")
    for op in kernel.body.ops:
        out += printer.op(op, 1)
    return [*out, "}"]
