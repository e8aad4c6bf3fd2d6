"""``tesserac check``: the static checks of the Tile IR, as diagnostics.

``tesserac check FILE.tsr --target cuda --arch sm_80`` compiles the file to the Tile
IR for that target and prints each finding of the race checker and the bank-conflict
linter as a warning at its ``.tsr`` line. Exit status: 0 no findings, 1 findings or
errors in the program, 2 usage error, 3 internal compiler error.
"""

from __future__ import annotations

import argparse
import sys

from ..transpiler.check import THRESHOLD, check_module
from ..transpiler.frontend.diagnostics import CompileError
from ..transpiler.options import DEFAULT_TARGET, TARGETS, OptionsError
from ..transpiler.pipeline import InternalCompilerError, StageNotImplemented, compile_file

__all__ = ["check_main", "add_compile_options"]


def add_compile_options(parser: argparse.ArgumentParser) -> None:
    """The options that say what to compile: the file, target, arch, sizes, kernel."""
    parser.add_argument("file", metavar="FILE.tsr")
    parser.add_argument("--target", choices=list(TARGETS), default=DEFAULT_TARGET,
                        help=f"the backend (default: {DEFAULT_TARGET})")  # fmt: skip
    parser.add_argument("--arch", metavar="ARCH", help="the architecture (default: the first)")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="SYM=VALUE",
                        help="fix a symbolic dim to a constant (repeatable)")  # fmt: skip
    parser.add_argument("--kernel", metavar="NAME", help="only the function NAME")


def check_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tesserac check",
        description="Find data races and shared-memory bank conflicts in a .tsr file's kernels.",
    )
    add_compile_options(parser)
    parser.add_argument(
        "--bank-threshold", type=int, default=THRESHOLD, metavar="N",
        help=f"warn of bank conflicts above N ways (default {THRESHOLD})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.bank_threshold < 1:
        parser.error("--bank-threshold must be at least 1")
    try:
        program = compile_file(args.file, target=args.target, arch=args.arch,
                               defines=args.defines, kernel=args.kernel, until="tile")  # fmt: skip
        findings = check_module(program.ir("tile"), args.bank_threshold)
    except CompileError as exc:
        print(exc, file=sys.stderr)
        return 1
    except OptionsError as exc:
        parser.error(str(exc))
    except StageNotImplemented as exc:
        print(f"tesserac: error: {exc}", file=sys.stderr)
        return 2
    except InternalCompilerError as exc:
        from .main import _internal_error

        return _internal_error(exc, exc.cause)
    for finding in findings:
        print(finding.diagnostic().render(), file=sys.stderr)
    print(f"tesserac check: {len(findings)} finding(s)", file=sys.stderr)
    return 1 if findings else 0
