"""The compiler driver: an ordered list of named stages.

Each stage turns the previous stage's IR into its own and has a printer, so
``tesserac --emit STAGE``, ``Program.inspect_ir(STAGE)`` and the golden files
all show the same text. The driver runs every implemented stage eagerly, so
``compile()`` reports all errors at once; a stage that does not exist yet
raises ``StageNotImplemented`` instead of pretending. The last stages (PTX and
cubin, which NVRTC builds) run only when asked for.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..frozen import frozen
from .frontend import ast
from .frontend.diagnostics import CompileError, Diagnostic, Diagnostics, Severity
from .frontend.fingerprint import fingerprints
from .frontend.kept_parse import parse_kept
from .frontend.printer import print_module
from .frontend.source import SourceFile, SourceReadError, Span, read_source
from .graph.distribute import distribute
from .graph.ir import GraphModule, walk
from .graph.numerics import verify_numerics
from .graph.passes import run_graph_passes
from .graph.printer import print_graph
from .graph.sema import analyze
from .graph.stochastic import stochastic_results
from .options import Options, OptionsError
from .process_settings import few_collections, recursion_headroom
from .schedule.ir import ScheduleModule
from .schedule.lower import schedule_module
from .schedule.printer import print_schedule
from .schedule.tuned import TunedSchedules
from .tile.build import RUNTIME, tile_module
from .tile.ir import TileModule
from .tile.printer import print_tile

if TYPE_CHECKING:  # a backend is imported when a program is compiled for it
    from .target.cpu import CpuModule
    from .target.nvrtc import CudaBinary
    from .target.simt_module import SimtModule

__all__ = [
    "STAGES",
    "Program",
    "StageNotImplemented",
    "InternalCompilerError",
    "compile",
    "compile_file",
    "print_meta",
]

#: Every stage of the design, in order; ``PIPELINE`` holds those that exist.
STAGES = ("ast", "graph", "sched", "tile", "target", "meta", "ptx", "cubin")


class StageNotImplemented(NotImplementedError):
    """The stage is part of the design but not built yet (for this target)."""

    def __init__(self, stage: str, detail: str | None = None) -> None:
        if detail is None:
            done = ", ".join(s.name for s in PIPELINE)
            detail = f"the '{stage}' stage is not implemented yet (available: {done})"
        super().__init__(detail)
        self.stage = stage


class InternalCompilerError(Exception):
    """A stage failed in a way that is the compiler's fault, not the program's."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        super().__init__(
            f"internal compiler error in stage '{stage}': {type(cause).__name__}: {cause}"
        )
        self.stage = stage
        self.cause = cause


@frozen
class Stage:
    name: str
    #: (the earlier stages' IR by name, input file, options, diagnostics) -> this stage's IR
    run: Callable[[Mapping[str, Any], SourceFile, Options, Diagnostics], Any]
    show: Callable[[Any], str | bytes]
    #: Stages from the schedule on depend on the target; without one they do not run.
    needs_target: bool = False
    #: A stage that needs a tool outside Python (NVRTC) runs only when asked for, so
    #: that compiling never depends on the tool.
    on_request: bool = False


def _ast_stage(
    _: Mapping[str, Any], source: SourceFile, options: Options, diags: Diagnostics
) -> ast.Module:
    module = parse_kept(source, diags)
    diags.check()
    assert module is not None
    if options.kernel is not None:
        names = [f.name for f in module.functions()]
        if options.kernel not in names:
            defined = ", ".join(names) if names else "no functions"
            raise OptionsError(
                f"no kernel named '{options.kernel}' in {source.name} (it defines: {defined})"
            )
    return module


def _graph_stage(
    irs: Mapping[str, Any], _: SourceFile, options: Options, diags: Diagnostics
) -> GraphModule:
    graph = analyze(irs["ast"], options, diags)
    diags.check()
    verify_numerics(irs["ast"], graph, diags)
    graph = distribute(graph, diags)
    graph = stochastic_results(graph, diags)
    diags.check()
    return run_graph_passes(graph)


def _sched_stage(
    irs: Mapping[str, Any], _: SourceFile, options: Options, diags: Diagnostics
) -> ScheduleModule:
    _check_dtypes(irs["graph"], options.target, diags)
    diags.check()
    # the fingerprints key a schedule cache's records: printed only where one is given
    known = fingerprints(irs["ast"]) if options.schedule_cache is not None else {}
    module = schedule_module(irs["graph"], options, diags, known)
    diags.check()
    return module


def _check_dtypes(graph: GraphModule, target: str, diags: Diagnostics) -> None:
    """Refuse, at its first use, each dtype that ``target`` cannot hold in memory: the
    first stage that depends on the target is where its dtypes are known."""
    if target == "cpu":
        from .target.cpu_kernel import C_TYPES as stored
    else:
        from .target.simt_dialect import DIALECTS

        stored = DIALECTS[target].storage
    seen: set[str] = set()

    def check(value_type: Any, span: Span | None) -> None:
        dtype = getattr(value_type, "dtype", None)
        if dtype is None or dtype.kind == "bool" or dtype.name in stored or dtype.name in seen:
            return
        seen.add(dtype.name)
        diags.error(f"{dtype.name} tensors are not supported on the {target} target yet", span)

    for function in graph.functions:
        for param in function.params:
            check(param.value.type, param.value.span)
        for op in walk(function.body):
            for result in op.results:
                check(result.type, op.span)
        check(function.result_type, function.span)


def _tile_stage(
    irs: Mapping[str, Any], _: SourceFile, options: Options, diags: Diagnostics
) -> TileModule:
    module = tile_module(irs["graph"], irs["sched"], options, diags)
    diags.check()
    return module


def _target_stage(
    irs: Mapping[str, Any], source: SourceFile, options: Options, diags: Diagnostics
) -> CpuModule | SimtModule:
    """The source for the target, stamped with its provenance."""
    from .target.provenance import provenance, stamp

    return stamp(_emit(irs, options, diags), provenance(source.text, irs["sched"]))


def _emit(irs: Mapping[str, Any], options: Options, diags: Diagnostics) -> CpuModule | SimtModule:
    for program in irs["tile"].programs:
        for launch, why, span in program.runtime:
            if why == RUNTIME["collective"] and options.target in ("cpu", "cuda"):
                limit = _collective_limit(irs, program, launch, options)
                if limit is not None:
                    diags.error(f"'{program.host.function}': {limit}", span)
                continue
            diags.error(
                f"'{program.host.function}': launch {launch} is {why}, which the "
                f"{options.target} backend cannot run yet",
                span or program.host.span,
            )
    diags.check()
    if options.target == "cpu":
        from .target.cpu import emit_cpu

        return emit_cpu(irs["tile"], graph=irs["graph"], debug=options.debug)
    from .target.simt_dialect import DIALECTS
    from .target.simt_kernel import NotLowered
    from .target.simt_module import emit_simt

    try:
        return emit_simt(irs["tile"], DIALECTS[options.target], irs["graph"], options.debug)
    except NotLowered as exc:
        raise StageNotImplemented("target", str(exc)) from None


def _collective_limit(
    irs: Mapping[str, Any], program: Any, launch: str, options: Options
) -> str | None:
    """Why the target cannot run the collective of ``launch``, or None: the CPU entry
    runs every one on MPI (target/cpu_mpi.py), the CUDA file's host code those that NCCL
    can (target/cuda_nccl.py)."""
    if options.target == "cpu":
        return None
    from .target.cuda_nccl import nccl_limit

    function = next(f for f in irs["graph"].functions if f.name == program.host.function)
    group = next(la.group for la in program.host.launches if la.name == launch)
    op = function.body.ops[function.groups[group].ops[0]]
    return nccl_limit(op)


def _meta_stage(
    irs: Mapping[str, Any], source: SourceFile, options: Options, diags: Diagnostics
) -> dict[str, Any]:
    """The target's metadata, with each kernel's register estimate and roofline hint, and
    in a debug build what each launch's sentinel checks."""
    from .check.analysis import kernel_analysis

    meta = {**irs["target"].meta, "analysis": kernel_analysis(irs["tile"], options)}
    if options.debug:
        from .check.sentinels import with_sentinels

        meta = with_sentinels(meta, irs["graph"], irs["sched"], irs["tile"], source.name)
    return meta


def print_meta(meta: Mapping[str, Any]) -> str:
    """The metadata as ``--emit meta`` prints it (and ``--resources`` with its report)."""
    return json.dumps(meta, indent=2) + "\n"


def _binary_stage(
    irs: Mapping[str, Any], _: SourceFile, options: Options, diags: Diagnostics
) -> CudaBinary:
    """The CUDA file built with NVRTC; the ``ptx`` and ``cubin`` stages show its parts."""
    if options.target != "cuda":
        raise StageNotImplemented(
            "ptx", f"PTX and cubin dumps are for the cuda target, not {options.target}"
        )
    from .target.nvrtc import NvrtcUnavailable, build

    try:
        meta = irs["meta"]
        return build(irs["target"].source, meta["arch"], meta["build"]["options"])
    except NvrtcUnavailable as exc:
        raise StageNotImplemented("ptx", str(exc)) from None


PIPELINE: tuple[Stage, ...] = (
    Stage("ast", _ast_stage, print_module),
    Stage("graph", _graph_stage, print_graph),
    Stage("sched", _sched_stage, print_schedule, needs_target=True),
    Stage("tile", _tile_stage, print_tile, needs_target=True),
    Stage("target", _target_stage, lambda m: m.source, needs_target=True),
    Stage("meta", _meta_stage, print_meta, needs_target=True),
    Stage("ptx", _binary_stage, lambda b: b.ptx, needs_target=True, on_request=True),
    Stage(
        "cubin", lambda irs, *_: irs["ptx"], lambda b: b.cubin, needs_target=True, on_request=True
    ),
)


class Program:
    """A compiled ``.tsr`` file: every implemented stage's IR, ready to inspect."""

    def __init__(self, source: SourceFile, options: Options, until: str | None = None) -> None:
        """Run every stage, or those up to ``until``; later ones run when asked for,
        so that ``--emit sched`` works for a kernel the tile stage cannot lower yet."""
        self.input = source
        self.options = options
        self._ir: dict[str, Any] = {}
        self._missing: StageNotImplemented | None = None
        self._diags = Diagnostics()
        self._run(until)

    def _run(self, until: str | None) -> None:
        with recursion_headroom(), few_collections():
            self._stages(until)

    def _stages(self, until: str | None) -> None:
        names = [s.name for s in PIPELINE]
        asked = names.index(until) if until in names else -1
        for index, stage in enumerate(PIPELINE):
            if stage.needs_target and self.options.target is None:
                break
            if stage.on_request and index > asked:
                break
            if stage.name not in self._ir:
                try:
                    self._ir[stage.name] = stage.run(
                        self._ir, self.input, self.options, self._diags
                    )
                except StageNotImplemented as exc:
                    self._missing = exc
                    break
                except (CompileError, OptionsError):
                    raise
                except Exception as exc:
                    raise InternalCompilerError(stage.name, exc) from exc
            if stage.name == until:
                break
        self.diagnostics = self._diags.items

    def ir(self, stage: str) -> Any:
        """The IR object of a stage, for tools and tests that start from it."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage '{stage}'; stages are: {', '.join(STAGES)}")
        if stage not in self._ir and any(s.name == stage for s in PIPELINE):
            self._run(stage)
        if stage not in self._ir and self._missing is not None:
            raise self._missing
        if stage not in self._ir:
            if any(s.name == stage for s in PIPELINE):
                raise OptionsError(
                    f"the '{stage}' stage depends on the target: give --target (cuda, hip, "
                    "cpu, opencl, sycl) or an output file ending in .cu, .hip, .cpp, .cl or "
                    ".sycl.cpp"
                )
            raise StageNotImplemented(stage)
        return self._ir[stage]

    def inspect_ir(self, stage: str) -> str | bytes:
        """The printed form of a stage, exactly as ``tesserac --emit STAGE`` writes it:
        text, except the cubin's bytes."""
        ir = self.ir(stage)
        show = next(s.show for s in PIPELINE if s.name == stage)
        try:
            with recursion_headroom():
                return show(ir)
        except Exception as exc:
            raise InternalCompilerError(stage, exc) from exc

    def __getattr__(self, name: str) -> Any:
        """``prog.f(x)`` for a function of the file: a compiled program is not yet built
        and loaded, which is what Python's own message would leave the user to find."""
        parsed = self.__dict__.get("_ir", {}).get("ast")
        if parsed is not None and any(f.name == name for f in parsed.functions()):
            raise AttributeError(
                f"'{name}' is a function of this program, which is compiled but not loaded: "
                f"call it on what load() returns, prog.load().{name}(...)"
            )
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    @property
    def source(self) -> str:
        """The generated target source, exactly what ``tesserac -o`` writes."""
        return str(self.inspect_ir("target"))

    def load(self) -> Any:
        """Build and load the generated code: an object with one callable per function,
        named as in the ``.tsr`` file (see ``tessera.runtime.cpu``)."""
        source = self.source  # raises for a kernel the backend does not lower yet
        if self.options.target == "cuda":
            from ..runtime.cuda import load as load_cuda

            return load_cuda(source, self.ir("meta"))
        if self.options.target == "opencl":
            from ..runtime.opencl import load as load_opencl

            return load_opencl(source, self.ir("meta"))
        if self.options.target == "sycl":
            raise RuntimeError(
                "Tessera does not build SYCL files: compile the .sycl.cpp with a SYCL 2020 "
                "compiler (icpx -fsycl, acpp) and call its host functions"
            )
        if self.options.target == "hip":
            from ..runtime.hip import load as load_hip

            return load_hip(source, self.ir("meta"))
        from ..runtime.cpu import load

        return load(source, self.ir("meta"))


def compile(
    src: str,
    filename: str = "<string>",
    *,
    target: str | None = None,
    arch: str | None = None,
    defines: Mapping[str, int] | Iterable[str] | None = None,
    kernel: str | None = None,
    until: str | None = None,
    schedule_cache: str | Path | TunedSchedules | None = None,
    debug: bool = False,
) -> Program:
    """Compile ``.tsr`` source text. Raises ``CompileError`` with every diagnostic.
    With ``until``, later stages run only when their IR is asked for; with
    ``schedule_cache`` (a file ``tesserac tune`` wrote), launches it has records for
    take the tuned schedule. With ``debug``, the code checks each global access's bounds
    and the runtime what each launch writes for NaN and infinity."""
    schedules = _schedules(schedule_cache, target)
    options = Options.create(target, arch, defines, kernel, schedules, debug)
    return Program(SourceFile(filename, src), options, until)


def compile_file(
    path: str | Path,
    *,
    target: str | None = None,
    arch: str | None = None,
    defines: Mapping[str, int] | Iterable[str] | None = None,
    kernel: str | None = None,
    until: str | None = None,
    schedule_cache: str | Path | TunedSchedules | None = None,
    debug: bool = False,
) -> Program:
    """Compile a ``.tsr`` file, as ``compile`` compiles text. A missing or undecodable
    file is a ``CompileError``."""
    schedules = _schedules(schedule_cache, target)
    options = Options.create(target, arch, defines, kernel, schedules, debug)
    return Program(read_file(path), options, until)


def _schedules(
    cache: str | Path | TunedSchedules | None, target: str | None
) -> TunedSchedules | None:
    """A cache file's records for the toolchain in use; without a target none apply."""
    if cache is None or isinstance(cache, TunedSchedules) or target is None:
        return cache if target is not None else None
    from ..tune.cachefile import schedules_for
    from ..tune.toolchain import toolchain

    return schedules_for(cache, toolchain(target))


def read_file(path: str | Path) -> SourceFile:
    """A ``.tsr`` file, decoded; a missing or undecodable file is a ``CompileError``."""
    try:
        return read_source(path)
    except SourceReadError as exc:
        raise CompileError((Diagnostic(Severity.ERROR, exc.message, exc.span),)) from None
