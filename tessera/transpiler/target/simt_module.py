"""The SIMT backends (OpenCL C, HIP, CUDA, SYCL): the Tile IR as one self-contained file,
and its metadata.

Each kernel runs one program per work-group (thread block), with the program ids as
the group's position in an up-to-3-D range. The host side (which kernels to launch
in which order, with which arguments and intermediates) is data in the metadata,
which the runtimes follow (a SYCL file carries it as host functions too:
``sycl_launcher.py``); the parts of the tile-primitives header the file uses are
inlined, so it builds alone. Everything that differs between the targets is the
``Dialect``; the templates and the emitter are shared.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...frozen import frozen
from ..check.bounds import FAULT, FAULT_BYTES, Sites
from ..check.sentinels import sentinel_lines
from ..graph.dims import Dim
from ..graph.ir import GraphModule, walk
from ..schedule.hardware import Hardware, hardware_for
from ..tile.ir import TileKernel, TileModule, TileProgram
from ..tile.smem import arena_alignment
from .cexpr import c_dim, names_used, param_name
from .cuda_nccl import nccl_host_code, nccl_meta
from .entry import kernel_sizes, mesh_meta, signature_meta, updated
from .header import C_SYMBOL, needed
from .naming import C_LIBRARY, GPU_BUILTINS, OPENCL_BUILTINS, Namer
from .render import environment
from .simt_dialect import Dialect
from .simt_kernel import NotLowered, SimtKernel, emit_simt_kernel
from .simt_layout import FRAGMENT_SHAPES
from .simt_tiles import WGMMA_FORMS
from .sycl_launcher import (
    LAUNCHER_NAMES,
    Launcher,
    debug_host_code,
    launcher,
    launcher_view,
    submit_function,
)
from .wrap import wrap_lines

__all__ = ["SimtModule", "emit_simt", "BUILD_OPTIONS"]

#: Build options each dialect's files are written for: ``clBuildProgram``'s for OpenCL,
#: hipcc's for HIP (with ``--offload-arch`` added for the arch), and NVRTC's and nvcc's
#: for CUDA (with the arch's ``-arch``/``-gencode`` added; see ``_build_options``).
BUILD_OPTIONS = {
    "opencl": ("-cl-std=CL1.2",),
    "hip": ("-O3", "-std=c++17"),
    "cuda": ("-std=c++17",),
    "sycl": ("-fsycl", "-std=c++17"),
}


#: Axes of a launch grid: OpenCL's NDRange and CUDA's and HIP's grids have three.
_AXES = 3


@frozen
class SimtModule:
    source: str
    meta: dict[str, Any]


class _KernelView:
    """A kernel's source as the template lays it out."""

    def __init__(
        self, kernel: TileKernel, simt: SimtKernel, d: Dialect, name: str,
        updates: dict[str, str],
    ) -> None:  # fmt: skip
        """``updates``: the results of the function that start as the input they update
        (``entry.updated``), which the kernel reads and writes through one pointer."""
        self.name = name
        pairs = zip(kernel.params, simt.params, strict=True)
        held = [f"{c.name} ({updates[p.name]})" for p, c in pairs if p.name in updates]
        self.updates = f"updated in place: {', '.join(held)}" if held else ""
        self.simt = simt
        self.threads = simt.threads
        self.bounds = f"{simt.threads}, 1" if simt.one_block else str(simt.threads)
        self.wgmma = simt.wgmma
        self.prologue = simt.prologue
        self.body = simt.body
        self.origin = kernel.origin
        self.dims = kernel_sizes(kernel)
        # a tensor whose data no statement reads (pad's ``like``, which gives only a row
        # length) keeps its place, unnamed
        body_names, prologue_names = names_used(simt.body), names_used(simt.prologue)
        read = body_names | prologue_names
        self.params = self._params(simt, d, read, {})
        #: Parameters that OpenCL C names although no statement reads them.
        self.unread = [
            p.name for p in simt.params if p.name not in read and not d.unnamed_parameters
        ]
        if d.launched_locals:  # SYCL: the work-item, and the shared arrays of the launch
            self.params.append("const sycl::nd_item<3>& it")
            self.params += [f"{ctype}* {name}" for ctype, name, _, _ in simt.locals]
        #: SYCL: the function that submits the kernel (``sycl_launcher``), and its lines.
        self.submit = ""
        self.submit_lines: list[str] = []
        self.tensor_maps = simt.tensor_maps
        self.tma_ranks = simt.tma_ranks
        self.smem_bytes = simt.smem_bytes
        self.static_smem_bytes = simt.static_smem_bytes
        self.grid = [f"{pid} < {_extent_text(extent, simt.blocks.get(pid, block))}"
                     for pid, extent, block in simt.grid]  # fmt: skip
        self.launch_grid = _launch_grid(simt.grid)
        reverse = _longest_last(kernel, simt)
        self.pids = [
            f"const {d.index_type} {pid} = {index};"
            + ("  // the last rows first: they run the most blocks" if reverse and i == 0 else "")
            for i, (pid, index) in enumerate(_program_ids(simt.grid, d, simt.sizes, reverse))
            if pid in body_names and not kernel.persistent  # each tile's own
        ]
        self.persistent = kernel.persistent
        # A size that only the grid's extent needs is still a parameter, so that every
        # launch passes the function's sizes alike. The comments quote the .tsr source,
        # whose sizes are no uses (``reshape("B", "S", C)``).
        used = read | names_used(self.pids)
        self.unused = [s for s in simt.sizes.values() if s not in used]

    def _params(
        self, simt: SimtKernel, d: Dialect, read: frozenset[str] | None, names: dict[str, str]
    ) -> list[str]:
        """The declarations of the kernel's tensors, scalars, sizes, tensor maps and
        fault record: a tensor outside ``read`` unnamed where the dialect allows it.
        Where ``read`` is None, those of a host function that passes them on: every
        one named (by ``names``, where it renames it), its pointers plain."""
        pointer = "{const}{type}* {name}" if read is None else d.pointer
        params = [
            _param_decl(p, d, read is None or p.name in read or not d.unnamed_parameters,
                        pointer, names.get(p.name, p.name))
            for p in simt.params
        ]  # fmt: skip
        sizes = (simt.sizes[dim] for dim in self.dims)
        params += [f"const {d.index_type} {names.get(s, s)}" for s in sizes]
        params += [f"const __grid_constant__ tsr_tensor_map {m.name}" for m in simt.tensor_maps]
        if simt.checked:  # a debug build's fault record
            params.append(pointer.format(const="", type=d.index_type, name=names.get(FAULT, FAULT)))
        return params

    def with_submit(self, name: str, d: Dialect) -> None:
        """Gives the kernel its submit function ``name`` (SYCL), whose parameters are the
        kernel's, renamed where the function's own names (``queue``, ``cgh``) have them."""
        simt = self.simt
        namer = Namer(LAUNCHER_NAMES | C_LIBRARY | GPU_BUILTINS | {self.name}
                      | {local for _, local, _, _ in simt.locals})  # fmt: skip
        passed = [p.name for p in simt.params] + [simt.sizes[dim] for dim in self.dims]
        passed += [FAULT] if simt.checked else []
        names = {n: namer.fresh(n, "arg") for n in passed}
        sizes = {dim: names.get(printed, printed) for dim, printed in simt.sizes.items()}
        self.submit = name
        self.submit_lines = submit_function(
            name, self.name, self._params(simt, d, None, names), list(names.values()), simt,
            self.launch_grid, sizes,
        )  # fmt: skip


def _launch_grid(grid: tuple[tuple[str, Dim, int], ...]) -> list[tuple[Dim, int]]:
    """The launch's (extent, block) per hardware axis. A GPU grid has three axes; the
    batch axes past the third (a matmul over ``[B, H, S, D]`` has four) are folded
    into the third, which then runs their product of programs."""
    axes = [(extent, block) for _, extent, block in grid]
    if len(axes) <= _AXES:
        return axes
    assert all(block == 1 for _, block in axes[_AXES - 1 :]), "only batch axes fold"
    folded = Dim.const(1)
    for extent, _ in axes[_AXES - 1 :]:
        folded = folded * extent
    return [*axes[: _AXES - 1], (folded, 1)]


def _longest_last(kernel: TileKernel, simt: SimtKernel) -> bool:
    """Whether the programs along the first grid axis do more work the later they come:
    a loop that stops at the program's own rows (causal attention's, over keys) runs
    one block more for each. Such programs start last-first, so that the long ones run
    in the first waves and the short ones fill the last, instead of the longest
    starting last and running alone at the end (causal bf16 attention at head dim 128
    on an H200: 0.994 against 0.983 ms at S 4096, 13.16 against 12.99 at S 16384)."""
    if not simt.grid:
        return False
    first = simt.grid[0][0]
    return any(
        op.kind == "for" and op.attr("stop") is not None and first in op.attr("stop").symbols()
        for op in walk(kernel.body)
    )


def _program_ids(
    grid: tuple[tuple[str, Dim, int], ...], d: Dialect, sizes: dict[str, str], reverse: bool
) -> list[tuple[str, str]]:
    """Each program id's C expression: the group's position along its axis (counted
    from the end along the first axis when ``reverse``), or, for the batch axes folded
    into the last one, its digit of that position (the innermost batch axis varies
    fastest, as in memory)."""
    ids = [(pid, d.program_index[axis]) for axis, (pid, _, _) in enumerate(grid[: _AXES - 1])]
    if reverse and ids:
        ids[0] = (ids[0][0], f"{d.program_count[0]} - 1 - {d.program_index[0]}")
    folded = grid[_AXES - 1 :]
    position = d.program_index[_AXES - 1]
    for i, (pid, extent, _) in enumerate(folded):
        inner = Dim.const(1)
        for _, later, _ in folded[i + 1 :]:
            inner = inner * later
        index = position if inner == Dim.const(1) else f"{position} / {_operand(inner, sizes)}"
        if i > 0:
            index = f"{index if index == position else f'({index})'} % {_operand(extent, sizes)}"
        ids.append((pid, index))
    return ids


def _operand(dim: Dim, sizes: dict[str, str]) -> str:
    text = c_dim(dim, sizes)
    return text if text.isidentifier() or text.isdigit() else f"({text})"


def _param_decl(p: Any, d: Dialect, named: bool, pointer: str, name: str) -> str:
    """``p``'s declaration under ``name``; a tensor's in the form ``pointer``."""
    name = param_name(name, named)
    if p.kind == "tensor":
        const = "" if p.written else "const "
        return pointer.format(const=const, type=d.storage[p.dtype], name=name)
    return f"const {d.scalar_types[p.dtype]} {name}"


def _extent_text(extent: Any, block: int | str) -> str:
    """A grid axis's extent in programs, each of ``block`` (a tile's name where the
    kernel declares it, ``ceil(N/BN)``)."""
    return str(extent) if block == 1 else f"ceil({extent}/{block})"


def emit_simt(
    module: TileModule, d: Dialect, graph: GraphModule | None = None, debug: bool = False
) -> SimtModule:
    """The module in dialect ``d``. Raises ``NotLowered``, naming the function and where
    it is defined, when a kernel uses an operation the emitter does not lower yet. A
    ``debug`` build checks each global and shared access's bounds."""
    sites = Sites() if debug else None
    views: dict[str, _KernelView] = {}
    hw = hardware_for(module.target, module.arch)
    lanes = hw.lanes
    # Kernels are extern "C": their names share one namespace with the C library's, with
    # what the dialect declares in every kernel's scope, and with OpenCL's built-ins.
    namer = Namer(C_LIBRARY | GPU_BUILTINS | OPENCL_BUILTINS)
    # A SYCL file's host functions are named after the graph functions, and come first.
    hosts = {p.host.function: namer.fresh(p.host.function)
             for p in module.programs if p.kernels and d.launched_locals}  # fmt: skip
    # A dynamic arena (CUDA's) is one symbol in the whole file, declared alike in all
    # its kernels; a static one is each kernel's own.
    every = [k for p in module.programs for k in p.kernels]
    file_align = arena_alignment(every)
    # A kernel whose content an earlier one has (its twin: a function's launches lowered
    # again in a function that calls it) is emitted once: its code is the other's. Not
    # in a debug build, where each access of each kernel has its own site.
    emitted: dict[str, SimtKernel] = {}
    for program in module.programs:
        for kernel in program.kernels:
            try:
                dims = kernel_sizes(kernel)
                align = file_align if d.dynamic_arena else arena_alignment([kernel])
                if kernel.twin in emitted and sites is None:
                    simt = replace(emitted[kernel.twin], name=kernel.name)
                else:
                    simt = emit_simt_kernel(kernel, d, dims, lanes, align, sites)
                emitted[kernel.name] = simt
                clash = hosts and kernel.name == program.host.function
                wanted = f"{kernel.name}_{kernel.launch}" if clash else kernel.name
                views[kernel.name] = _KernelView(
                    kernel, simt, d, namer.fresh(wanted), updated(program)
                )
                if d.launched_locals:
                    views[kernel.name].with_submit(namer.fresh(f"{wanted}_submit"), d)
                _check_shared_memory(simt, hw)
            except NotLowered as exc:
                where = f"{program.host.span}: " if program.host.span is not None else ""
                raise NotLowered(
                    f"{where}'{program.host.function}': the {d.name} backend does not lower "
                    f"this {kernel.kind} kernel ({kernel.name}) yet: it uses {exc}"
                ) from None
    env = environment("simt")
    wgmma = sorted({form for view in views.values() for form in view.wgmma})
    tma_ranks = sorted({rank for view in views.values() for rank in view.tma_ranks})
    primitives = env.get_template("tessera_tile.j2").render(
        d=d,
        wgmma=wgmma,
        forms=WGMMA_FORMS,
        tma_ranks=tma_ranks,
        lanes=lanes,
        mma=FRAGMENT_SHAPES.get(d.name),
    )
    primitives = primitives.strip()
    template = env.get_template("module.j2")
    lines = sentinel_lines(graph, module) if debug and graph is not None and hosts else None
    launchers = [launcher_view(f) for f in _launchers(module, views, d, hosts, namer, lines)]
    host_debug = debug_host_code(sites.table) if sites is not None and launchers else ""
    context = dict(d=d, source=module.name, arch=module.arch, kernels=list(views.values()),
                   launchers=launchers, host_debug=host_debug)  # fmt: skip
    code = template.render(header="", **context)
    source = template.render(header=needed(primitives, code, C_SYMBOL).strip(), **context)
    if d.wrapped:
        source = wrap_lines(source)
    meta = _meta(module, views, d)
    if sites is not None:
        meta["bounds"] = sites.table
    if d.name == "cuda" and graph is not None:
        nccl = nccl_host_code(module, graph)
        source += "\n" + nccl if nccl else ""
        collectives = nccl_meta(module, graph)
        for f in meta["functions"]:
            f.update({"collectives": collectives[f["name"]]} if f["name"] in collectives else {})
            f.update(mesh_meta(next(g for g in graph.functions if g.name == f["name"])))
    return SimtModule(source, meta)


def _launchers(
    module: TileModule,
    views: dict[str, _KernelView],
    d: Dialect,
    hosts: dict[str, str],
    namer: Namer,
    sentinels: dict[str, str] | None = None,
) -> list[Launcher]:
    """The host function of each graph function, where the dialect's files have them;
    ``sentinels`` (a debug build): each kernel's line, for its NaN/Inf sentinel."""
    file_names = frozenset(namer.used)
    return [
        launcher(program, [(views[k.name].name, views[k.name].submit, views[k.name].simt)
                           for k in program.kernels], d, hosts[program.host.function],
                 file_names, sentinels)
        for program in module.programs
        if program.host.function in hosts
    ]  # fmt: skip


def _meta(module: TileModule, views: dict[str, _KernelView], d: Dialect) -> dict[str, Any]:
    functions = []
    for program in module.programs:
        if not program.kernels:
            continue
        launches = [_launch(k, views[k.name], d) for k in program.kernels]
        buffers = _buffers(program)
        if any(views[k.name].simt.checked for k in program.kernels):
            buffers.append({"name": FAULT, "bytes": str(FAULT_BYTES)})
        functions.append({**signature_meta(program), "buffers": buffers, "launches": launches})
    build = {"options": _build_options(d.name, module.arch)}
    return {"source": module.name, "target": d.name, "arch": module.arch, "build": build,
            "functions": functions}  # fmt: skip


def _build_options(target: str, arch: str) -> list[str]:
    """The options a file must be compiled with. A CUDA file for an arch-specific
    target (``sm_90a``: wgmma, setmaxnreg) names its arch: CuPy's ``RawModule`` adds
    the GPU's own ``-arch=sm_90``, and NVRTC builds for ``sm_90a`` when given both. A
    file for a generic arch runs on that GPU and newer, so it leaves the arch to the
    loader."""
    options = list(BUILD_OPTIONS[target])
    if target == "cuda" and arch.endswith("a"):
        options.append(f"-arch={arch}")
    return options


def _buffers(program: TileProgram) -> list[dict[str, str]]:
    """Intermediates between launches: one device allocation each, by name and size."""
    return [{"name": b.param, "bytes": str(b.bytes)}
            for b in program.host.buffers]  # fmt: skip


def _check_shared_memory(simt: SimtKernel, hw: Hardware) -> None:
    """The schedule's estimate of shared memory must cover what the kernel declares:
    a program that asks for more than the arch has fails at launch, far from here."""
    total = simt.smem_bytes + simt.static_smem_bytes
    if hw.kind == "gpu" and total > hw.smem_bytes >= total - simt.unplanned_smem_bytes:
        raise NotLowered(
            f"a concat of tiles held in registers, staged through "
            f"{simt.unplanned_smem_bytes} bytes of shared memory: with the "
            f"{total - simt.unplanned_smem_bytes} bytes it needs besides, more than the "
            f"{hw.smem_bytes} that {hw.arch} allows (a smaller tile would fit)"
        )
    if hw.kind == "gpu" and total > hw.smem_bytes:
        raise AssertionError(
            f"{simt.name} needs {total} bytes of shared memory ({simt.smem_bytes} planned, "
            f"{simt.static_smem_bytes} declared by the kernel); {hw.arch} allows "
            f"{hw.smem_bytes}, and the schedule did not see it"
        )


def _launch(kernel: TileKernel, view: _KernelView, d: Dialect) -> dict[str, Any]:
    maps = [m.name for m in view.tensor_maps]
    launch: dict[str, Any] = {
        "kernel": view.name,
        "args": [p.name for p in kernel.params]
        + list(view.dims)
        + maps
        + ([FAULT] if view.simt.checked else []),
        "grid": [{"extent": str(extent), "block": block} for extent, block in view.launch_grid],
        "threads": view.threads,
    }
    if d.dynamic_arena:
        launch["dynamic_smem"] = view.smem_bytes
        launch["static_smem"] = view.static_smem_bytes
    if view.persistent:
        launch["persistent"] = True
    if view.tensor_maps:
        launch["tensor_maps"] = [m.meta() for m in view.tensor_maps]
    return launch
