"""``tesserac bundle``: compile a file ahead of time for the CPU and CUDA arches, into
one directory that ``tessera.load_bundle`` loads without the compiler
(``tessera.bundle``). Exit status: 0 written, 1 errors in the program or a file that
cannot be written, 2 usage error, 3 internal compiler error."""

from __future__ import annotations

import argparse
import sys

from ..packs import PackError, write_pack
from ..transpiler.options import TARGETS
from .common import add_pack_output, run_reported

__all__ = ["bundle_main"]


def bundle_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tesserac bundle",
        description="Compile a .tsr file for the CPU and CUDA arches into a bundle "
        "(NAME.tsrpkg) that loads without the compiler: sources, metadata, the CPU "
        "shared object, a cubin per arch, the Graph IR and its hash.",
    )
    parser.add_argument("file", metavar="FILE.tsr")
    parser.add_argument(
        "--arch", default="", metavar="ARCHES",
        help=f"CUDA arches, comma-separated ({', '.join(TARGETS['cuda'])}); none: CPU only",
    )  # fmt: skip
    parser.add_argument(
        "--cpu-arch", metavar="ARCH",
        help=f"the CPU arch ({', '.join(TARGETS['cpu'])}; default native)",
    )  # fmt: skip
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="SYM=VALUE",
                        help="fix a symbolic dim to a constant (repeatable)")  # fmt: skip
    parser.add_argument("--schedule-cache", metavar="PATH", help="use the tuned schedules in PATH")
    add_pack_output(parser, "NAME.tsrpkg", "the bundle")
    args = parser.parse_args(argv)
    arches = [a for a in args.arch.split(",") if a]
    unknown = [a for a in arches if a not in TARGETS["cuda"]]
    if unknown or len(set(arches)) != len(arches):
        parser.error(f"--arch takes distinct CUDA arches ({', '.join(TARGETS['cuda'])})")

    def bundle() -> int:
        from ..bundle import bundle_files
        from ..runtime.cpu import BuildError

        try:
            files, warnings = bundle_files(args.file, arches, cpu_arch=args.cpu_arch,
                                           defines=args.defines,
                                           schedule_cache=args.schedule_cache)  # fmt: skip
            write_pack(args.output, files)
        except (BuildError, PackError, OSError) as exc:
            print(f"tesserac: error: {exc}", file=sys.stderr)
            return 1
        for warning in warnings:
            print(f"tesserac bundle: warning: {warning}", file=sys.stderr)
        return 0

    return run_reported(parser, bundle)
