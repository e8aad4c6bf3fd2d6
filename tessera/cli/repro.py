"""Repro packs: what a bug report about the compiler attaches.

A pack holds the ``.tsr`` file as it was read, the options of the run
(``options.json``), the printed IR of every stage that ran (``ir/``; the last one is
where the compile stopped), the error with its traceback (``error.txt``), the versions
of Tessera, Python, Lark and Jinja2 (``versions.json``), a script that replays the run
(``replay.sh``), and the schedule cache the run used. ``tesserac pack-repro`` makes
one on demand; on an internal compiler error ``tesserac`` writes one by itself
(``offer_pack``) and prints its path. The pack is built by compiling the file again,
stage by stage, so that the stages that ran can be shown; the same file and options
give the same bytes (``tessera.packs``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import tempfile
import traceback
from pathlib import Path

from .. import __version__
from ..frozen import frozen
from ..packs import PackError, manifest, write_pack
from ..transpiler import pipeline
from ..transpiler.frontend.diagnostics import CompileError
from ..transpiler.frontend.source import SourceReadError, decode_source
from ..transpiler.options import Options, OptionsError
from ..transpiler.pipeline import STAGES, InternalCompilerError, StageNotImplemented, compile
from .common import add_compile_options, add_pack_output

__all__ = ["Invocation", "repro_files", "offer_pack", "pack_repro_main"]

#: The file name suffix of each stage's printed IR in a pack.
_IR_SUFFIX = {"ast": ".tsr", "meta": ".json", "ptx": ".ptx", "cubin": ".cubin"}


@frozen
class Invocation:
    """A run of ``tesserac`` on one file: what a pack records and replays."""

    file: str
    target: str
    arch: str
    defines: tuple[tuple[str, int], ...] = ()
    kernel: str | None = None
    debug: bool = False
    emit: str = "target"
    schedule_cache: str | None = None

    @classmethod
    def of(
        cls, file: str, options: Options, emit: str = "target", schedule_cache: str | None = None
    ) -> Invocation:
        """The run that compiles ``file`` with ``options`` (whose target is set)."""
        assert options.target is not None and options.resolved_arch is not None
        return cls(file, options.target, options.resolved_arch, options.defines,
                   options.kernel, options.debug, emit, schedule_cache)  # fmt: skip

    def flags(self, source: str, cache: str | None) -> list[str]:
        """The command line of ``tesserac`` that repeats the run on ``source``."""
        flags = ["tesserac", source, "--target", self.target, "--arch", self.arch]
        flags += [f"-D{name}={value}" for name, value in self.defines]
        flags += ["--kernel", self.kernel] if self.kernel else []
        flags += ["--schedule-cache", cache] if cache else []
        return flags + (["--debug"] if self.debug else []) + ["--emit", self.emit]


def repro_files(run: Invocation, error: BaseException | None = None) -> dict[str, bytes]:
    """The files of the pack for ``run``. ``error`` is the failure the run met, where
    it met one; without it, ``error.txt`` says what compiling the file again gave.
    ``OSError`` where the source file cannot be read."""
    raw = Path(run.file).read_bytes()
    name = Path(run.file).name
    files = {f"source/{name}": raw}
    cache = None
    if run.schedule_cache is not None and Path(run.schedule_cache).is_file():
        cache = "schedules.json"
        files[cache] = Path(run.schedule_cache).read_bytes()
    stages, failure, stage = _stages(run, name, raw, cache and run.schedule_cache)
    for done, shown in stages.items():
        data = shown if isinstance(shown, bytes) else shown.encode()
        files[f"ir/{done}{_IR_SUFFIX.get(done, '.txt')}"] = data
    cause = error if error is not None else failure
    if cause is not None:
        files["error.txt"] = _describe(cause).encode()
    command = shlex.join(run.flags(f"source/{name}", cache))
    options = {
        "file": name,
        "target": run.target,
        "arch": run.arch,
        "defines": dict(run.defines),
        "kernel": run.kernel,
        "debug": run.debug,
        "emit": run.emit,
        "schedule_cache": cache,
        "stages_run": list(stages),
        "stopped_at": stage,
        "command": command,
    }
    files["options.json"] = _json(options)
    files["versions.json"] = _json(_versions())
    files["replay.sh"] = (
        "#!/bin/sh\n# Repeats the compile this pack records, from the pack's directory.\n"
        f'cd "$(dirname "$0")" && exec {command}\n'
    ).encode()
    return files


def _stages(
    run: Invocation, name: str, raw: bytes, cache: str | None
) -> tuple[dict[str, str | bytes], BaseException | None, str | None]:
    """Compile ``raw`` stage by stage up to what the run asked for (and the metadata,
    which writing target code reads): the printed IR of each stage that ran, the
    failure that stopped it, and the stage it stopped at (None: all ran)."""
    last = max(STAGES.index(run.emit), STAGES.index("meta"))
    wanted = [s.name for s in pipeline.PIPELINE if STAGES.index(s.name) <= last
              and (not s.on_request or s.name == run.emit)]  # fmt: skip
    shown: dict[str, str | bytes] = {}
    try:
        text = decode_source(name, raw).text
        program = compile(text, name, target=run.target, arch=run.arch,
                          defines=dict(run.defines), kernel=run.kernel, until="ast",
                          schedule_cache=cache, debug=run.debug)  # fmt: skip
    except (SourceReadError, CompileError, OptionsError, InternalCompilerError) as exc:
        return shown, exc, "ast"
    for stage in wanted:
        try:
            shown[stage] = program.inspect_ir(stage)
        except Exception as exc:  # what stopped it is what the pack records
            return shown, exc, stage
    return shown, None, None


def _describe(error: BaseException) -> str:
    """The error as a bug report quotes it: the message, and for an internal error the
    traceback of its cause."""
    cause = getattr(error, "cause", None) or error
    text = f"{type(error).__name__}: {error}\n"
    if isinstance(error, CompileError | SourceReadError | OptionsError | StageNotImplemented):
        return text
    return text + "\n" + "".join(traceback.format_exception(cause))


def _versions() -> dict[str, str]:
    """The versions a compile depends on."""
    versions = {"tessera": __version__, "python": platform.python_version()}
    for package in ("lark", "jinja2", "numpy"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    versions["platform"] = f"{platform.system()} {platform.machine()}"
    return versions


def _json(value: object) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def offer_pack(run: Invocation, error: BaseException) -> None:
    """After an internal compiler error: write the run's pack as a ``.tar.gz`` in
    ``TESSERA_REPRO_DIR`` (default: the temporary directory), named by its content's
    hash, and say where; ``TESSERA_REPRO=0`` leaves it out. A pack that cannot be made
    is said too, and the run's exit status stays 3."""
    if os.environ.get("TESSERA_REPRO") == "0":
        return
    try:
        files = repro_files(run, error)
        digest = hashlib.sha256(manifest(files))
        folder = Path(os.environ.get("TESSERA_REPRO_DIR") or tempfile.gettempdir())
        path = folder / f"tesserac-repro-{digest.hexdigest()[:12]}.tar.gz"
        write_pack(path, files)
    except (OSError, PackError) as exc:
        print(f"tesserac: no repro pack: {exc}", file=sys.stderr)
        return
    print(f"tesserac: a repro pack for the report: {path}", file=sys.stderr)


def pack_repro_main(argv: list[str]) -> int:
    """``tesserac pack-repro``: make a repro pack on demand."""
    parser = argparse.ArgumentParser(
        prog="tesserac pack-repro",
        description="Write a repro pack of a compile (the source, the options, the IR of "
        "each stage that ran, the error, the versions) for a bug report.",
    )
    add_compile_options(parser)
    parser.add_argument("--emit", choices=STAGES, default="target", metavar="STAGE",
                        help="the stage the run asked for (default: target)")  # fmt: skip
    parser.add_argument("--schedule-cache", metavar="PATH", help="the run's schedule cache")
    parser.add_argument("--debug", action="store_true", help="the run was a debug build")
    add_pack_output(parser, "PACK", "the pack")
    args = parser.parse_args(argv)
    try:
        options = Options.create(
            args.target, args.arch, args.defines, args.kernel, debug=args.debug
        )
    except OptionsError as exc:
        parser.error(str(exc))
    run = Invocation.of(args.file, options, args.emit, args.schedule_cache)
    try:
        files = repro_files(run)
        write_pack(args.output, files)
    except PackError as exc:
        print(f"tesserac: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"tesserac: error: cannot read '{args.file}': {exc.strerror}", file=sys.stderr)
        return 1
    stopped = json.loads(files["options.json"])["stopped_at"]
    outcome = "every stage ran" if stopped is None else f"the compile stopped at '{stopped}'"
    print(f"tesserac pack-repro: wrote {args.output} ({outcome})", file=sys.stderr)
    return 0
