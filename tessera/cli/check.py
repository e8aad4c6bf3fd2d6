"""``tesserac check``: the static checks of the Tile IR, as diagnostics.

``tesserac check FILE.tsr --target cuda --arch sm_80`` compiles the file to the Tile
IR for that target and prints each finding of the race checker and the bank-conflict
linter as a warning at its ``.tsr`` line. Exit status: 0 no findings, 1 findings or
errors in the program, 2 usage error, 3 internal compiler error.
"""

from __future__ import annotations

import argparse
import sys

from ..transpiler.check.checks import THRESHOLD, check_module
from ..transpiler.pipeline import compile_file
from .common import add_compile_options, run_reported

__all__ = ["check_main"]


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

    def check() -> int:
        program = compile_file(args.file, target=args.target, arch=args.arch,
                               defines=args.defines, kernel=args.kernel, until="tile")  # fmt: skip
        findings = check_module(program.ir("tile"), args.bank_threshold)
        for finding in findings:
            print(finding.diagnostic().render(), file=sys.stderr)
        print(f"tesserac check: {len(findings)} finding(s)", file=sys.stderr)
        return 1 if findings else 0

    return run_reported(parser, check)
