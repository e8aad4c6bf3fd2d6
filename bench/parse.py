"""Benchmark: parse and AST build of a 300-line .tsr file.

The input is every example and seed snippet of the repository, repeated until
it reaches 300 lines. The peer is CPython's own parser (``ast.parse``, written
in C) on the same text, which is valid Python syntax; both are timed in the
same process, interleaved, median of many runs after warm-up. The result goes
to ``bench/results/parse.json``. Goal: under 50 ms for the Tessera side.
"""

from __future__ import annotations

import argparse
import ast as pyast
import json
import platform
import statistics
import time
from pathlib import Path

import lark

from tessera import __version__
from tessera.files import write_file
from tessera.transpiler.frontend import parser as tsr_parser
from tessera.transpiler.frontend.diagnostics import Diagnostics
from tessera.transpiler.frontend.source import SourceFile

ROOT = Path(__file__).resolve().parent.parent
LINES = 300


def build_input() -> str:
    files = sorted((ROOT / "examples").glob("*.tsr")) + sorted(
        (ROOT / "tests" / "seeds").glob("*.tsr")
    )
    chunks: list[str] = []
    while sum(c.count("\n") for c in chunks) < LINES:
        for path in files:
            chunks.append(path.read_text(encoding="utf-8").rstrip("\n") + "\n\n\n")
            if sum(c.count("\n") for c in chunks) >= LINES:
                break
    return "".join(chunks)


def parse_tessera(text: str) -> None:
    diags = Diagnostics()
    module = tsr_parser.parse(SourceFile("bench.tsr", text), diags)
    assert module is not None and not diags.items


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--runs", type=int, default=50)
    cli.add_argument("--warmup", type=int, default=5)
    cli.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "parse.json")
    args = cli.parse_args()

    text = build_input()
    load_ms = timed(tsr_parser._parser)  # grammar analysis and LALR tables, once per process
    for _ in range(args.warmup):
        parse_tessera(text)
        pyast.parse(text)
    ours: list[float] = []
    peer: list[float] = []
    for _ in range(args.runs):
        ours.append(timed(parse_tessera, text))
        peer.append(timed(pyast.parse, text))
    result = {
        "benchmark": "parse + AST build",
        "input_lines": text.count("\n"),
        "input_bytes": len(text.encode()),
        "runs": args.runs,
        "tessera_ms_median": round(statistics.median(ours), 3),
        "tessera_ms_min": round(min(ours), 3),
        "cpython_ast_parse_ms_median": round(statistics.median(peer), 3),
        "ratio_tessera_over_cpython": round(statistics.median(ours) / statistics.median(peer), 1),
        "grammar_load_ms": round(load_ms, 1),
        "goal_ms": 50,
        "tessera": __version__,
        "lark": lark.__version__,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_file(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
