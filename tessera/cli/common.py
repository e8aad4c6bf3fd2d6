"""What the subcommands that compile a file share: its options, and how a failure exits."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..transpiler.frontend.diagnostics import CompileError
from ..transpiler.options import DEFAULT_TARGET, TARGETS, OptionsError
from ..transpiler.pipeline import InternalCompilerError, StageNotImplemented

__all__ = ["add_compile_options", "add_pack_output", "run_reported", "report", "REPORTED"]


def add_compile_options(parser: argparse.ArgumentParser) -> None:
    """The options that say what to compile: the file, target, arch, sizes, kernel."""
    parser.add_argument("file", metavar="FILE.tsr")
    parser.add_argument("--target", choices=list(TARGETS), default=DEFAULT_TARGET,
                        help=f"the backend (default: {DEFAULT_TARGET})")  # fmt: skip
    parser.add_argument("--arch", metavar="ARCH", help="the architecture (default: the first)")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="SYM=VALUE",
                        help="fix a symbolic dim to a constant (repeatable)")  # fmt: skip
    parser.add_argument("--kernel", metavar="NAME", help="only the function NAME")


def add_pack_output(parser: argparse.ArgumentParser, metavar: str, what: str) -> None:
    """``-o``, for a command that writes a pack (``tessera.packs``): a directory, or an
    archive where the name says so."""
    parser.add_argument(
        "-o", dest="output", required=True, metavar=metavar,
        help=f"{what}: a directory, or an archive if it ends in .tar.gz",
    )  # fmt: skip


#: The failures a compile reports, each with its exit status (``report``).
REPORTED = (CompileError, OptionsError, StageNotImplemented, InternalCompilerError)


def report(parser: argparse.ArgumentParser, exc: Exception) -> int:
    """Print a failure of ``REPORTED`` and give the exit status ``tesserac`` gives it: 1
    for errors in the program, 2 for a usage error or a stage that does not exist yet, 3
    for an internal compiler error."""
    if isinstance(exc, OptionsError):
        parser.error(str(exc))
    if isinstance(exc, InternalCompilerError):
        from .main import _internal_error

        return _internal_error(exc, exc.cause)
    if isinstance(exc, StageNotImplemented):
        print(f"tesserac: error: {exc}", file=sys.stderr)
        return 2
    print(exc, file=sys.stderr)
    return 1


def run_reported(parser: argparse.ArgumentParser, work: Callable[[], int]) -> int:
    """``work``'s exit status, or the one ``report`` gives its failure."""
    try:
        return work()
    except REPORTED as exc:
        return report(parser, exc)
