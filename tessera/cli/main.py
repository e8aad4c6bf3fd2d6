"""``tesserac``: the command-line compiler.

Exit status: 0 success, 1 the program has errors (diagnostics on standard
error), 2 usage error or a stage that does not exist yet, 3 internal
compiler error. A user's mistake never produces a Python traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
import warnings
from pathlib import Path

from .. import __version__
from ..files import write_file
from ..transpiler.options import (
    DEFAULT_TARGET,
    SUFFIXES,
    TARGETS,
    Options,
    OptionsError,
    target_for_output,
)
from ..transpiler.pipeline import STAGES, compile_file, print_meta
from ..transpiler.schedule.tuned import CacheWarning
from .common import REPORTED, report

__all__ = ["main", "build_parser"]

#: The subcommands: (module of ``tessera.cli``, function), imported when used, since
#: the tuner brings numpy and the runtimes with it.
#: Each --format and the stage whose output it formats.
FORMATS = {"json": "meta", "yaml": "meta", "clang-format": "target"}

_COMMANDS = {
    "tune": ("tune", "tune_main"),
    "cache": ("tune", "cache_main"),
    "check": ("check", "check_main"),
    "inspect": ("inspect", "inspect_main"),
    "pack-repro": ("repro", "pack_repro_main"),
    "bundle": ("bundle", "bundle_main"),
}

_EPILOG = f"""\
The target follows from the output suffix ({', '.join(f'{s} {t}' for s, t in SUFFIXES.items())})
unless --target says otherwise; with neither it is {DEFAULT_TARGET} ({TARGETS[DEFAULT_TARGET][0]}).
Without -o the result goes to standard output.

stages (--emit):
  ast     the parsed program, printed back as canonical .tsr
  graph   typed Graph IR with shapes, dtypes, policies, effects and fusion groups
  sched   Schedule IR: tiles, warps, stages, grid, memory plan
  tile    Tile IR: memory spaces, staged copies, mma, barriers
  target  the generated source (the default)
  meta    kernel metadata as JSON: parameters, launch spec, buffers, each kernel's
          roofline hint and register estimate (with --resources, also each kernel's
          registers, shared memory and spills, from NVRTC)
  ptx     the CUDA file compiled to PTX by NVRTC (cuda only)
  cubin   the CUDA file compiled to a cubin by NVRTC (cuda only; binary, so -o FILE)

commands:
  tesserac tune FILE.tsr ...   measure schedules and record the fastest in a cache file
  tesserac cache show|merge    look at and combine schedule cache files
  tesserac check FILE.tsr ...  find data races and bank conflicts in the kernels
  tesserac inspect FILE.tsr -o PAGE.html   the stages side by side, as an HTML page
  tesserac pack-repro FILE.tsr ... -o PACK  a repro pack of a compile, for a bug report
  tesserac bundle FILE.tsr --arch sm_80,sm_90a -o NAME.tsrpkg   an ahead-of-time bundle

examples:
  tesserac attention.tsr -o attention.cu
  tesserac attention.tsr -o attention.cu --python-loader attention.py
  tesserac attention.tsr --target cpu -D S=1024 -o attention.cpp
  tesserac attention.tsr --emit ast

exit status: 0 success, 1 errors in the program, 2 usage error, 3 internal compiler error
(with a repro pack written to $TESSERA_REPRO_DIR or the temporary directory)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tesserac",
        description="Compile a Tessera .tsr file to CUDA, HIP, SYCL, C++ (OpenMP/SIMD) or "
        "OpenCL C.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", metavar="FILE.tsr", help="the Tessera source file")
    parser.add_argument("-o", dest="output", metavar="OUT", help="write the result to OUT")
    parser.add_argument(
        "--target",
        choices=list(TARGETS),
        help=f"the backend (default: from the -o suffix, else {DEFAULT_TARGET})",
    )
    arches = "; ".join(f"{t}: {', '.join(a)}" for t, a in TARGETS.items())
    parser.add_argument(
        "--arch", metavar="ARCH", help=f"the architecture, first is default ({arches})"
    )
    parser.add_argument(
        "--emit", choices=STAGES, default="target", metavar="STAGE",
        help=f"print this stage instead of target code ({', '.join(STAGES)})",
    )  # fmt: skip
    parser.add_argument("--kernel", metavar="NAME", help="compile only the kernel NAME")
    parser.add_argument(
        "-D", dest="defines", action="append", default=[], metavar="SYM=VALUE",
        help="fix a symbolic dim to a constant, e.g. -D S=1024 (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--schedule-cache", metavar="PATH",
        help="use the tuned schedules in PATH where they apply (see 'tesserac tune --help')",
    )  # fmt: skip
    parser.add_argument(
        "--python-loader", metavar="PY",
        help="with a CUDA -o file, also write PY: a module that loads it with CuPy and "
        "has one typed function per kernel (needs CuPy, not Tessera)",
    )  # fmt: skip
    parser.add_argument(
        "--no-host", action="store_true",
        help="CUDA and HIP: leave out the host launchers (the C entries that launch each "
        "function's kernels; docs/runtime.md)",
    )  # fmt: skip
    parser.add_argument(
        "--resources", action="store_true",
        help="with --emit meta for CUDA: build with NVRTC and add what ptxas gave each "
        "kernel (registers, shared memory, barriers, stack frame, spills)",
    )  # fmt: skip
    parser.add_argument(
        "--format", choices=FORMATS, metavar="FORMAT",
        help="how the output is written: with --emit meta, json (the default) or yaml (each "
        "kernel's metadata as the system architecture's YAML: tile, fragments, resources, "
        "launch, epilogue; docs/runtime.md); with --emit target, clang-format (the source "
        "through clang-format in Tessera's style, where it is installed; docs/cli.md)",
    )  # fmt: skip
    parser.add_argument(
        "--debug", action="store_true",
        help="a debug build: each global access is checked against its tensor's bounds and "
        "what each launch writes for NaN and infinity, at the user's line",
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"tesserac {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--print-runtime-dir"]:  # tsr.h and its implementations (docs/runtime.md)
        from ..runtime.c_abi import runtime_dir

        print(runtime_dir())
        return 0
    if argv and argv[0] in _COMMANDS:
        module, function = _COMMANDS[argv[0]]
        return getattr(importlib.import_module(f"{__package__}.{module}"), function)(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    target = args.target or (args.output and target_for_output(args.output)) or DEFAULT_TARGET
    try:
        options = Options.create(target, args.arch, args.defines, args.kernel, debug=args.debug)
    except OptionsError as exc:
        parser.error(str(exc))
    loads_cuda = options.target == "cuda" and args.output and args.emit == "target"
    if args.python_loader and not loads_cuda:
        parser.error("--python-loader needs CUDA output written with -o (it loads that file)")
    if args.resources and (options.target != "cuda" or args.emit != "meta"):
        parser.error("--resources goes with --emit meta for the cuda target")
    if args.format is not None and args.emit != FORMATS[args.format]:
        parser.error(f"--format {args.format} goes with --emit {FORMATS[args.format]}")
    if args.format == "yaml" and args.resources:
        parser.error("--format yaml goes without --resources")
    if args.emit == "cubin" and args.output is None and sys.stdout.isatty():
        parser.error("a cubin is binary: write it to a file with -o")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CacheWarning)
            program = compile_file(args.file, **_as_kwargs(options), until=args.emit,
                                   schedule_cache=args.schedule_cache)  # fmt: skip
        for w in caught:
            print(f"tesserac: warning: {w.message}", file=sys.stderr)
        if args.resources:
            from ..transpiler.target.nvrtc import with_resources

            text = print_meta(with_resources(program.ir("meta"), program.ir("cubin")))
        elif args.format == "yaml":
            from ..transpiler.target.kernel_records import kernel_yaml

            text = kernel_yaml(program.ir("tile"), program.ir("meta"))
        else:
            text = program.inspect_ir(args.emit)
    except REPORTED as exc:
        return _with_pack(report(parser, exc), args, options, exc)
    except Exception as exc:  # a bug in the driver itself
        status = _internal_error(f"internal compiler error in the driver: {exc!r}", exc)
        return _with_pack(status, args, options, exc)
    if args.emit == "target" and options.target in ("cuda", "hip") and not args.no_host:
        from ..transpiler.target.simt_host import HostNameClash, host_source

        try:
            text += host_source(program.ir("meta"))
        except HostNameClash as exc:
            print(f"tesserac: error: {args.file}: {exc}", file=sys.stderr)
            return 1
    for warning in program.diagnostics:
        print(warning.render(), file=sys.stderr)
    if args.format == "clang-format":
        text = _formatted(text, options.target)
    if args.output is None:
        if isinstance(text, bytes):
            sys.stdout.buffer.write(text)
        else:
            sys.stdout.write(text)
        return 0
    files = {args.output: text}
    if args.python_loader:
        from ..transpiler.target.cupy_loader import LoaderError, python_loader

        try:
            files[args.python_loader] = python_loader(program.ir("meta"), Path(args.output).name)
        except LoaderError as exc:
            print(f"tesserac: error: {args.file}: --python-loader: {exc}", file=sys.stderr)
            return 1
    for path, content in files.items():
        try:
            write_file(path, content)
        except OSError as exc:
            why = exc.strerror or str(exc)
            print(f"tesserac: error: cannot write '{path}': {why}", file=sys.stderr)
            return 1
    return 0


def _formatted(text: str, target: str) -> str:
    """``text`` through clang-format; as it is, with a warning, where clang-format is
    not installed or fails (the source is correct either way)."""
    from ..transpiler.target.formatting import FormatError, clang_format, formatted

    tool = clang_format()
    if tool is None:
        print("tesserac: warning: --format: clang-format is not installed; the output is "
              "not formatted", file=sys.stderr)  # fmt: skip
        return text
    try:
        return formatted(text, target, tool)
    except FormatError as exc:
        print(f"tesserac: warning: --format: {exc}; the output is not formatted", file=sys.stderr)
        return text


def _as_kwargs(options: Options) -> dict:
    return {
        "target": options.target,
        "arch": options.arch,
        "defines": dict(options.defines),
        "kernel": options.kernel,
        "debug": options.debug,
    }


def _with_pack(status: int, args: argparse.Namespace, options: Options, exc: Exception) -> int:
    """``status``, after writing a repro pack if it is an internal error's."""
    if status == 3:
        from .repro import Invocation, offer_pack

        offer_pack(Invocation.of(args.file, options, args.emit, args.schedule_cache), exc)
    return status


def _internal_error(message: object, cause: BaseException) -> int:
    print(f"tesserac: {message}", file=sys.stderr)
    print("This is a bug in tesserac; please report it with the input file.", file=sys.stderr)
    traceback.print_exception(cause, file=sys.stderr)
    return 3


if __name__ == "__main__":  # ``python -m tessera.cli.main``, as ``python -m tessera``
    sys.exit(main())
