"""Benchmark: compile time against program length, which must grow linearly.

The input is one function of ``n`` straight-line statements (``y5 = y4 * 1.0001 +
5.0``), one elementwise chain, for n from 1,000 to 16,000; each is compiled to target
source (every stage: parse, analysis, fusion, schedule, tile, emission) several times,
and the fastest run counts (the least disturbed by other work on the machine). The peer
is linear growth itself: ``per_1k_statements_s`` should stay flat, and ``growth``, the
time per statement at the largest size over that at the smallest, near 1. The result
goes to ``bench/results/compile_scaling.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import tessera
from tessera import __version__

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1000, 2000, 4000, 8000, 16000)


def program(statements: int) -> str:
    lines = ["@kernel", 'def f(x: Tensor["N", f32]) -> Tensor["N", f32]:', "    y0 = x"]
    lines += [f"    y{i} = y{i - 1} * 1.0001 + {i % 7}.0" for i in range(1, statements + 1)]
    lines.append(f"    return y{statements}")
    return "\n".join(lines) + "\n"


def compile_seconds(text: str, target: str, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        assert tessera.compile(text, filename="scaling.tsr", target=target).source
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--runs", type=int, default=3)
    cli.add_argument("--target", default="cpu")
    cli.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    cli.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "compile_scaling.json"
    )
    args = cli.parse_args()

    compile_seconds(program(10), args.target, 1)  # grammar tables, imports: once a process
    rows = []
    for n in args.sizes:
        seconds = compile_seconds(program(n), args.target, args.runs)
        rows.append({"statements": n, "seconds": round(seconds, 3),
                     "per_1k_statements_s": round(seconds / n * 1000, 3)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    first, last = rows[0], rows[-1]
    result = {
        "benchmark": "compile time against program length",
        "target": args.target,
        "runs": args.runs,
        "sizes": rows,
        "growth": round(last["per_1k_statements_s"] / first["per_1k_statements_s"], 2),
        "tessera": __version__,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
