"""``tesserac tune`` and ``tesserac cache``: tune schedules, and look after cache files.

``tesserac tune FILE.tsr -D M=2048 ... --cache PATH`` measures the candidates
of every tunable launch of the file at those sizes and merges one record per
launch into PATH. ``tesserac cache show PATH`` lists a cache's records and
``tesserac cache merge A.json B.json --into C.json`` combines caches.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator

from ..transpiler.frontend.diagnostics import CompileError
from ..transpiler.options import TARGETS, OptionsError
from ..transpiler.schedule.tuned import TunedRecord
from ..tune import TuneError, cachefile, tune_file
from ..tune.search import DEFAULT_BUDGET_MS, MAX_CANDIDATES
from .progress import ProgressBar

__all__ = ["tune_main", "cache_main"]

_TUNE_EPILOG = f"""\
Every gemm, attention and tile kernel is tuned, except one with a fixed
@kernel.schedule: over its @kernel.autotune space when it has one, else over
the target's default space. Give every symbolic size with -D; the record applies
to sizes in the same power-of-two bucket. Without --budget-ms, the budget is the
decorator's budget_ms, else {DEFAULT_BUDGET_MS:.0f} ms per launch: time spent
running kernels; compiling the candidates comes on top.

examples:
  tesserac tune gemm.tsr -D M=2048 -D N=2048 -D K=2048 --cache schedules.json
  tesserac gemm.tsr --schedule-cache schedules.json -o gemm.cpp
"""


def tune_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tesserac tune",
        description="Measure schedules for a .tsr file's kernels and record the fastest.",
        epilog=_TUNE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", metavar="FILE.tsr")
    parser.add_argument("--target", choices=list(TARGETS), default="cpu",
                        help="the backend to tune for (default: cpu)")  # fmt: skip
    parser.add_argument("--arch", metavar="ARCH", help="the architecture (default: the first)")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="SYM=VALUE",
                        help="the size to tune at, e.g. -D M=2048 (repeatable)")  # fmt: skip
    parser.add_argument("--cache", metavar="PATH", help="merge the records into this file")
    parser.add_argument("--budget-ms", type=float, metavar="N",
                        help="measuring time per launch in milliseconds")  # fmt: skip
    parser.add_argument("--kernel", metavar="NAME", help="tune only the function NAME")
    parser.add_argument(
        "--max-candidates", type=int, default=MAX_CANDIDATES, metavar="N",
        help=f"measure at most N per launch (default {MAX_CANDIDATES})",
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also log each pruned candidate and why")  # fmt: skip
    args = parser.parse_args(argv)
    if args.budget_ms is not None and args.budget_ms <= 0:
        parser.error("--budget-ms must be positive")
    bar = ProgressBar()
    with _logging(bar, logging.INFO if args.verbose else logging.WARNING), _warnings(bar):
        try:
            records = tune_file(
                args.file, target=args.target, arch=args.arch, defines=args.defines,
                cache=args.cache, budget_ms=args.budget_ms, kernel=args.kernel,
                max_candidates=args.max_candidates, progress=bar,
            )  # fmt: skip
        except CompileError as exc:
            bar.close()
            print(exc, file=sys.stderr)
            return 1
        except (OptionsError, TuneError) as exc:
            bar.close()
            parser.error(str(exc))
        except OSError as exc:  # the cache cannot be written, the C++ compiler is missing
            bar.close()
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"tesserac: error: {where}{exc.strerror or exc}", file=sys.stderr)
            return 1
    bar.close()
    for record in records:
        print(_summary(record))
    return 0


def cache_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tesserac cache", description="Look at and combine schedule cache files."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("show", help="list the records of a cache file")
    show.add_argument("path", metavar="PATH")
    merge = commands.add_parser("merge", help="merge caches into one (the faster record wins)")
    merge.add_argument("sources", nargs="+", metavar="SOURCE")
    merge.add_argument("--into", required=True, metavar="PATH",
                       help="the cache file to merge into (created if missing)")  # fmt: skip
    args = parser.parse_args(argv)
    with _warnings(None):
        if args.command == "show":
            records = cachefile.read(args.path)
            for record in records:
                print(_summary(record))
            if not records:
                print(f"{args.path}: no records")
            return 0
        records = cachefile.merge(*(cachefile.read(path) for path in args.sources))
        try:
            total = cachefile.update(args.into, records)
        except OSError as exc:
            why = exc.strerror or exc
            print(f"tesserac: error: cannot write '{args.into}': {why}", file=sys.stderr)
            return 1
    print(f"{args.into}: {len(total)} records")
    return 0


def _summary(record: TunedRecord) -> str:
    key = record.key
    sizes = " ".join(f"{name}={value}" for name, value in record.sizes)
    config = " ".join(f"{k}={v}" for k, v in record.config)
    line = f"{key.function}/{key.launch} [{sizes}] {config}: {record.ms:.3f} ms"
    if record.baseline_ms is None:
        return line
    if not 0 < record.ms < float("inf"):  # rounded to 0, or no timing: no ratio
        return line + f" (untuned {record.baseline_ms:.3f} ms)"
    return line + f" (untuned {record.baseline_ms:.3f} ms, {record.baseline_ms / record.ms:.2f}x)"


class _BarHandler(logging.Handler):
    """Log lines on standard error, above the progress bar."""

    def __init__(self, bar: ProgressBar) -> None:
        super().__init__()
        self.bar = bar

    def emit(self, record: logging.LogRecord) -> None:
        self.bar.close()
        print(f"tesserac tune: {record.getMessage()}", file=sys.stderr)


@contextlib.contextmanager
def _logging(bar: ProgressBar, level: int) -> Iterator[None]:
    logger = logging.getLogger("tessera.tune")
    handler = _BarHandler(bar)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


@contextlib.contextmanager
def _warnings(bar: ProgressBar | None) -> Iterator[None]:
    """Cache warnings as one ``tesserac: warning:`` line each, as they happen."""

    def show(message: Warning | str, *_: object, **__: object) -> None:
        if bar is not None:
            bar.close()
        print(f"tesserac: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("always", cachefile.CacheWarning)
        warnings.showwarning = show
        yield
