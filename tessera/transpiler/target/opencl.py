"""The OpenCL backend: the Tile IR as one self-contained OpenCL C file, and its metadata.

Each kernel runs one program per work-group, with the program ids as the
group's position in an up-to-3-D range. The host side (which kernels to launch
in which order, with which arguments and intermediates) is data in the
metadata, which ``tessera.runtime.opencl`` follows; the parts of the
tile-primitives header the file uses are inlined, so it builds alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..graph.types import TensorType
from ..tile.ir import TileKernel, TileModule, TileProgram
from .entry import signature_meta, symbols
from .header import C_SYMBOL, needed
from .render import environment, header
from .simt_dialect import OPENCL
from .simt_kernel import NotLowered, SimtKernel, emit_simt_kernel

__all__ = ["OpenclModule", "emit_opencl"]

#: Options of ``clBuildProgram``: the C dialect the file is written in.
BUILD_OPTIONS = ("-cl-std=CL1.2",)


@dataclass(frozen=True)
class OpenclModule:
    source: str
    meta: dict[str, Any]


class _KernelView:
    """A kernel's OpenCL C as the template lays it out."""

    def __init__(self, kernel: TileKernel, simt: SimtKernel) -> None:
        self.name = simt.name
        self.threads = simt.threads
        self.prologue = simt.prologue
        self.body = simt.body
        self.origin = (
            f"tile kernel {kernel.function}"
            if kernel.template == "tile_kernel"
            else f"launch {kernel.launch} of {kernel.function}: the library's {kernel.template}"
        )
        self.dims = symbols([p.type for p in kernel.params])
        self.params = [_param_decl(p) for p in simt.params]
        self.params += [f"const {OPENCL.index_type} {d}" for d in self.dims]
        self.grid = [f"{pid} < {_extent_text(extent, block)}" for pid, extent, block in simt.grid]
        text = "\n".join(simt.body)
        self.pids = [
            f"const {OPENCL.index_type} {pid} = get_group_id({axis});"
            for axis, (pid, _, _) in enumerate(simt.grid)
            if re.search(rf"\b{pid}\b", text)
        ]


def _param_decl(p: Any) -> str:
    if p.kind == "tensor":
        const = "" if p.written else "const "
        return f"__global {const}{OPENCL.storage[p.dtype]}* restrict {p.name}"
    return f"const {OPENCL.scalar_types[p.dtype]} {p.name}"


def _extent_text(extent: Any, block: int) -> str:
    return str(extent) if block == 1 else f"ceil({extent}/{block})"


def emit_opencl(module: TileModule) -> OpenclModule:
    """The module's OpenCL C. Raises ``NotLowered``, naming the function and where it is
    defined, when a kernel uses an operation this backend does not lower yet."""
    views: dict[str, _KernelView] = {}
    for program in module.programs:
        for kernel in program.kernels:
            try:
                _check_dtypes(kernel)
                dims = symbols([p.type for p in kernel.params])
                views[kernel.name] = _KernelView(kernel, emit_simt_kernel(kernel, OPENCL, dims))
            except NotLowered as exc:
                where = f"{program.host.span}: " if program.host.span is not None else ""
                raise NotLowered(
                    f"{where}'{program.host.function}': the opencl backend does not lower "
                    f"this {kernel.kind} kernel ({kernel.name}) yet: it uses {exc}"
                ) from None
    template = environment("opencl").get_template("module.cl.j2")
    context = dict(source=module.name, arch=module.arch, kernels=list(views.values()))
    code = template.render(header="", **context)
    source = template.render(
        header=needed(header("opencl/tessera_tile.cl"), code, C_SYMBOL).strip(), **context
    )
    return OpenclModule(source, _meta(module, views))


def _check_dtypes(kernel: TileKernel) -> None:
    for p in kernel.params:
        if isinstance(p.type, TensorType) and p.type.dtype.name not in OPENCL.storage:
            raise NotLowered(f"{p.type.dtype.name} tensors")


def _meta(module: TileModule, views: dict[str, _KernelView]) -> dict[str, Any]:
    functions = []
    for program in module.programs:
        if not program.kernels:
            continue
        launches = [_launch(k, views[k.name]) for k in program.kernels]
        functions.append(
            {**signature_meta(program), "buffers": _buffers(program), "launches": launches}
        )
    return {"source": module.name, "target": "opencl", "arch": module.arch,
            "build": {"options": list(BUILD_OPTIONS)}, "functions": functions}  # fmt: skip


def _buffers(program: TileProgram) -> list[dict[str, str]]:
    """Intermediates between launches: one device allocation each, by name and size."""
    return [{"name": b.name.removeprefix("%"), "bytes": str(b.bytes)}
            for b in program.host.buffers]  # fmt: skip


def _launch(kernel: TileKernel, view: _KernelView) -> dict[str, Any]:
    return {
        "kernel": view.name,
        "args": [p.name for p in kernel.params] + list(view.dims),
        "grid": [{"extent": str(a.extent), "block": a.block} for a in kernel.grid],
        "threads": view.threads,
    }
