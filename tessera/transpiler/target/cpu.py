"""The CPU backend: the Tile IR as one self-contained C++17 file, and its metadata.

Per kernel, a ``_program`` function runs one program instance and a ``_launch``
function runs the grid on OpenMP threads. Per function of the ``.tsr`` file, an
``extern "C"`` entry ``tessera_<name>`` takes the tensors (row-major and
contiguous), then every size symbol as ``int64_t`` in order of first
appearance; it allocates the intermediates (one buffer per memory-plan slot)
and runs the launches in order. The parts of the tile-primitives header the
file uses are inlined (``header.py``), so it builds with no include path.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...frozen import frozen
from ..check.bounds import Sites
from ..graph.dims import Dim
from ..graph.ir import Function, GraphModule, result_names, walk
from ..graph.types import TensorType
from ..tile.ir import TileKernel, TileModule, TileProgram
from .cexpr import c_dim, names_used, param_name
from .cpu_kernel import C_TYPES, KERNEL_FUNCTIONS, CKernel, emit_kernel
from .cpu_mpi import Collectives
from .entry import entry_params, kernel_sizes, mesh_meta, signature_meta, symbols, written
from .header import needed
from .naming import Namer, symbol_names
from .render import environment, header
from .wrap import wrap_lines

__all__ = ["emit_cpu", "CpuModule", "DEFAULT_FLAGS"]

#: -fno-math-errno, -fno-trapping-math: generated code never reads errno or the FP
#: exception flags, and without them GCC keeps sqrt a call and selects unvectorized.
#: -ffp-contract=fast: fused multiply-adds, as GPUs use (strict -std=c++17 turns them off).
DEFAULT_FLAGS = (
    "-std=c++17",
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fno-math-errno",
    "-ffp-contract=fast",
    "-fno-trapping-math",
    "-shared",
    "-fPIC",
)


@frozen
class CpuModule:
    source: str
    #: What the runtime needs: entries, parameters, sizes, guards, build flags.
    meta: dict[str, Any]


class _KernelView:
    """A kernel's C++ as the template lays it out."""

    def __init__(
        self, kernel: TileKernel, name: str, sites: Sites | None, twin: CKernel | None = None
    ) -> None:
        """``twin``: the code of the kernel's twin (``TileKernel.twin``), which is this
        kernel's under its own name."""
        dims = kernel_sizes(kernel)
        self.c: CKernel = (
            emit_kernel(kernel, dims, name, sites)
            if twin is None
            else replace(twin, name=name, source=kernel.function)
        )
        # The names the code reads, outside its source comments: a size named in a quoted
        # line of .tsr ("B" in reshape("B", "T", 256)) is not a use.
        body_names = names_used((*self.c.body, *self.c.storage, self.c.scratch))
        grid_names = body_names | names_used(extent for _, extent, _ in self.c.grid)
        self.name = self.c.name
        self.source = kernel.origin
        self.grid = self.c.grid
        self.body = self.c.body
        self.storage = self.c.storage
        self.constants = self.c.constants
        self.launch_constants = self.c.launch_constants
        self.scratch = self.c.scratch
        #: Whether the programs run on the team of threads: a cache's append copies a few
        #: rows, less work than waking the team (on a loaded machine, a time slice).
        self.parallel = kernel.kind != "state"
        self.team = self.c.team
        sizes = self.c.sizes
        used_dims = [sizes[d] for d in dims if sizes[d] in body_names]
        launch_dims = [d for d in dims if sizes[d] in grid_names]
        pids = [pid for pid, _, _ in self.c.grid if pid in body_names]
        tensors = [p.decl for p in self.c.params]
        # a tensor whose data the program never reads (pad's ``like``) is unnamed there
        read = [p.declared(p.name in body_names) for p in self.c.params]
        self.program_params = [*read, *(f"const tsr::i64 {d}" for d in (*used_dims, *pids))]
        self.program_args = [p.name for p in self.c.params] + used_dims + pids
        self.launch_params = [*tensors, *(f"const tsr::i64 {sizes[d]}" for d in launch_dims)]
        #: The launch's arguments as its caller names them: parameters by their Tile IR
        #: names, then the sizes by theirs.
        self.launch_args = [p.source for p in self.c.params] + launch_dims


class _FunctionView:
    def __init__(
        self,
        program: TileProgram,
        views: dict[str, _KernelView],
        symbol: str,
        function: Function | None = None,
        sentinels: list[dict[str, str]] | None = None,
    ) -> None:
        host = program.host
        self.name = host.function
        self.symbol = symbol
        params = entry_params(program)
        self.dims = symbols([t for _, t in params])
        buffers = {b.param: b for b in host.buffers}
        slots: dict[int, Dim] = {}
        for b in host.buffers:
            size = slots.get(b.slot)
            slots[b.slot] = b.bytes if size is None else _larger(size, b.bytes)
        # The entry's own names for its sizes, and for the tensors and buffers it passes
        # on: the caller's, unless C++ or the names this function uses (slots, launches)
        # take them.
        reserved = {f"slot{s}" for s in slots} | {
            f"{views[k.name].name}_launch" for k in program.kernels
        }
        sizes = symbol_names(self.dims, frozenset(reserved))
        namer = Namer(frozenset(reserved) | frozenset(sizes.values()))
        c_name = {name: namer.fresh(name, "arg") for name, _ in params}
        c_name |= {name: namer.fresh(f"{name}_buffer") for name in buffers}
        c_name |= sizes
        decls = []
        results = result_names(len(host.results))
        read = {p.name for kernel in program.kernels for p in kernel.params}
        named = dict(zip(host.results, results, strict=True))
        read |= {
            named.get(n, n.removeprefix("%"))
            for launch in host.launches
            if launch.kind == "collective"
            for n in (*launch.reads, *launch.writes)
        }
        read |= set(results)  # fmt: skip
        body: list[str] = []
        for slot, size in sorted(slots.items()):
            body.append(
                f"unsigned char* const slot{slot} = tsr::buffer({slot}, {c_dim(size, sizes)});"
            )
        for name, b in buffers.items():
            body.append(
                f"{C_TYPES[b.type.dtype.name]}* const {c_name[name]} = "
                f"reinterpret_cast<{C_TYPES[b.type.dtype.name]}*>(slot{b.slot});"
            )
        kernels = {k.launch: k for k in program.kernels}
        collectives = (
            Collectives(function, host.results, namer, c_name, sizes) if function else None
        )
        for launch in host.launches:
            if launch.kind == "collective" and collectives is not None:
                body.extend(collectives.call(launch))
                continue
            if launch.name not in kernels:
                continue
            view = views[kernels[launch.name].name]
            args = [c_name.get(a, a) for a in view.launch_args]
            body.append(f"{view.name}_launch({', '.join(args)});")
            if sentinels is not None:
                body += _sentinels(kernels[launch.name], c_name, sizes, sentinels)
        if collectives is not None and collectives.groups:
            body[:0] = collectives.setup()
        self.collective = collectives is not None and bool(collectives.groups)
        used = names_used(body)
        size_params = {sizes[d] for d in self.dims}
        for name, t in params:
            # an input that no kernel reads (a gradient that does not need it, a scalar
            # not used yet) keeps its place in the entry, unnamed
            # (an int that is a size, "n_head", is read by the launches and buffers too)
            size = c_name[name] in used and c_name[name] not in size_params
            arg = param_name(c_name[name], name in read or size)
            if isinstance(t, TensorType):
                const = "" if name in results or written(program, name) else "const "
                decls.append(f"{const}{C_TYPES[t.dtype.name]}* {arg}")
            else:
                decls.append(f"const {_scalar(t)} {arg}")
        self.params = decls + [f"const tsr::i64 {sizes[d]}" for d in self.dims]
        body += [f"static_cast<void>({d});" for d in sizes.values() if d not in used]
        self.body = body
        self.summary = ", ".join(f"{k.launch} -> {k.name}" for k in program.kernels)


def _sentinels(
    kernel: TileKernel, c_name: dict[str, str], sizes: dict[str, str], table: list[dict[str, str]]
) -> list[str]:
    """A debug build's NaN/Inf sentinels after a launch: each float tensor the kernel
    writes, checked whole; the first to hold one ends the call. ``table`` numbers them."""
    stored = {op.operands[0].id for op in walk(kernel.body) if op.kind == "store"}
    lines = []
    for p in kernel.params:
        if p.id in stored and p.type.dtype.is_float:
            count = Dim.const(1)
            for d in p.type.dims:
                count = count * d
            table.append({"kernel": kernel.name, "name": p.name, "dtype": p.type.dtype.name})
            pointer = c_name.get(p.name, p.name)
            lines.append(f"if (tsr::non_finite({len(table) - 1}, {pointer}, "
                         f"{c_dim(count, sizes)})) return;")  # fmt: skip
    return lines


def _exchanges(program: TileProgram) -> bool:
    """Whether the program runs a collective (a function may run nothing else)."""
    return any(launch.kind == "collective" for launch in program.host.launches)


def _larger(a: Dim, b: Dim) -> Dim:
    return (
        a if a.constant is not None and b.constant is not None and a.constant >= b.constant else b
    )


def _scalar(t: Any) -> str:
    return {"float": "float", "int": "tsr::i64", "bool": "bool"}[t.kind]


def emit_cpu(
    module: TileModule,
    flags: tuple[str, ...] = DEFAULT_FLAGS,
    graph: GraphModule | None = None,
    debug: bool = False,
) -> CpuModule:
    # The file's functions share one namespace: the entries ``tessera_<function>``,
    # whose names are the file's interface and go first, then each kernel's
    # ``<kernel>_program`` and ``<kernel>_launch``, under a name that takes none of them.
    programs = [p for p in module.programs if p.kernels or _exchanges(p)]
    names = Namer()
    entries = {p.host.function: names.fresh(f"tessera_{p.host.function}") for p in programs}
    # A debug build checks each access's bounds and, after each launch, what it wrote
    # for NaN and infinity; ``tessera_fault`` hands the runtime the first failure.
    sites = Sites() if debug else None
    # A twin's code is the kernel's it is a twin of, but in a debug build, where each
    # access of each kernel has its own site.
    views: dict[str, _KernelView] = {}
    for kernel in (k for p in programs for k in p.kernels):
        twin = views[kernel.twin].c if kernel.twin in views and sites is None else None
        name = names.fresh(kernel.name, suffixes=KERNEL_FUNCTIONS)
        views[kernel.name] = _KernelView(kernel, name, sites, twin)
    fault = names.fresh("tessera_fault") if debug else None
    by_name = {f.name: f for f in graph.functions} if graph is not None else {}
    sentinels: list[dict[str, str]] | None = [] if debug else None
    functions = [
        _FunctionView(p, views, entries[p.host.function], by_name.get(p.host.function), sentinels)
        for p in programs
    ]
    template = environment("cpu").get_template("module.cpp.j2")
    context = dict(source=module.name, arch=module.arch, flags=" ".join(flags),
                   kernels=list(views.values()), functions=functions,
                   entries=[f.symbol for f in functions], fault=fault)  # fmt: skip
    code = template.render(header="", **context)
    text = needed(header("cpu/tessera_tile.hpp"), code)
    mpi = any(f.collective for f in functions)
    if mpi:
        text += "\n\n" + header("cpu/tessera_mpi.hpp").rstrip()
    source = wrap_lines(template.render(header=text, **context))
    meta = _meta(module, functions, flags, by_name, mpi)
    if sites is not None:
        meta |= {"fault": fault, "bounds": sites.table, "sentinels": sentinels}
    return CpuModule(source, meta)


def _meta(
    module: TileModule,
    functions: list[_FunctionView],
    flags: tuple[str, ...],
    graph: dict[str, Function],
    mpi: bool,
) -> dict:
    programs = {p.host.function: p for p in module.programs}
    entries = []
    for f in functions:
        signature = signature_meta(programs[f.name])
        entry = {"name": signature.pop("name"), "symbol": f.symbol, **signature,
                 "kernels": [k.name for k in programs[f.name].kernels]}  # fmt: skip
        entries.append(entry | mesh_meta(graph.get(f.name)))
    # mpicxx is g++ with MPI's include and library paths
    compiler = "mpicxx" if mpi else "g++"
    build = {"compiler": compiler, "flags": list(flags)}
    return {"source": module.name, "target": "cpu", "arch": module.arch, "build": build,
            "functions": entries}  # fmt: skip
