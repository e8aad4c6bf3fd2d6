"""``tesserac inspect``: the lowering inspector page of a ``.tsr`` file.

``tesserac inspect FILE.tsr --target cuda -o report.html`` writes one self-contained
HTML page (``tessera.inspector``). Exit status as for ``tesserac``.
"""

from __future__ import annotations

import argparse
import sys

from ..files import write_file
from ..transpiler.pipeline import compile_file
from .common import add_compile_options, run_reported

__all__ = ["inspect_main"]


def inspect_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tesserac inspect",
        description="Write an HTML page showing a .tsr file's source beside each stage it "
        "lowers through, with each kernel's schedule, resources, roofline and check findings.",
    )
    add_compile_options(parser)
    parser.add_argument("-o", dest="output", metavar="PAGE.html", required=True,
                        help="the page to write")  # fmt: skip
    args = parser.parse_args(argv)

    def inspect() -> int:
        from ..inspector import inspector_page

        program = compile_file(args.file, target=args.target, arch=args.arch,
                               defines=args.defines, kernel=args.kernel)  # fmt: skip
        page = inspector_page(program)
        try:
            write_file(args.output, page)
        except OSError as exc:
            print(f"tesserac: error: cannot write '{args.output}': {exc.strerror or exc}",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0

    return run_reported(parser, inspect)
