"""Benchmark: does autotuning beat the heuristic schedule on this CPU?

For SGEMM at 1024 and 2048 and attention (f32, B1 H8 D64) at S1024 and S2048,
``tessera.tune`` searches the default CPU space into a fresh cache; then the
untuned build and the tuned build (``schedule_cache=``), both at the tuned sizes as
the tuner measured them, run interleaved, median of several runs after warm-up, as
in ``bench/cpu.py``. The ratio is untuned over
tuned time: above 1, tuning helped. Results go to ``bench/results/tune.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
from cpu import SOURCE, timed

import tessera
from tessera.files import write_file
from tessera.tune import tune
from tessera.tune.toolchain import toolchain

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "tune.json"

#: (case, function, sizes, arguments' shapes)
CASES = [
    (f"sgemm {n}", "sgemm", {"M": n, "N": n, "K": n}, [(n, n), (n, n)]) for n in (1024, 2048)
] + [
    (f"attention S{s}", "attention", {"B": 1, "H": 8, "S": s, "D": 64}, [(1, 8, s, 64)] * 3)
    for s in (1024, 2048)
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--budget-ms", type=float, default=3000.0)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "schedules.json"
        os.environ["TESSERA_CACHE_DIR"] = str(Path(tmp) / "build")  # tuning time from cold
        for case, function, sizes, shapes in CASES:
            started = time.perf_counter()
            (record,) = tune(SOURCE, "bench.tsr", defines=sizes, cache=cache, kernel=function,
                             budget_ms=args.budget_ms)  # fmt: skip
            tuning_s = time.perf_counter() - started
            # built at the tuned sizes, as the tuner measured them
            untuned = tessera.compile(SOURCE, "bench.tsr", target="cpu", kernel=function,
                                      defines=sizes)  # fmt: skip
            tuned = tessera.compile(SOURCE, "bench.tsr", target="cpu", kernel=function,
                                    defines=sizes, schedule_cache=cache)  # fmt: skip
            inputs = [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]
            out = np.empty(shapes[-1] if function == "attention" else (shapes[0][0],) * 2,
                           np.float32)  # fmt: skip
            calls = {name: partial(getattr(program.load(), function), *inputs, out=out)
                     for name, program in (("untuned", untuned), ("tuned", tuned))}  # fmt: skip
            t = timed(calls, args.runs)
            rows.append({
                "case": case, "seconds": t, "speedup": round(t["untuned"] / t["tuned"], 3),
                "tuned": dict(record.config), "untuned": _tiles(untuned),
                "candidates_measured": record.measured, "tuning_seconds": round(tuning_s, 1),
                "tuner_ms": {"best": round(record.ms, 3),
                             "untuned": round(record.baseline_ms or 0.0, 3)},
            })  # fmt: skip
            print(f"{case:16s} untuned {t['untuned'] * 1e3:8.2f} ms  tuned {t['tuned'] * 1e3:8.2f}"
                  f" ms  x{rows[-1]['speedup']:.3f}  {dict(record.config)}")  # fmt: skip
    document = {
        "machine": {"toolchain": toolchain("cpu"), "cores": len(os.sched_getaffinity(0)),
                    "python": platform.python_version(), "numpy": np.__version__},
        "method": f"median of {args.runs} interleaved runs after warm-up; tuning budget "
                  f"{args.budget_ms:.0f} ms per kernel",
        "results": rows,
    }  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_file(RESULTS, json.dumps(document, indent=2) + "\n")


def _tiles(program: tessera.Program) -> dict[str, int]:
    """The untuned schedule's tiles that the space searches, named as in a record."""
    launch = program.ir("sched").programs[0].launches[0]
    names = {"BM": "block_m", "BN": "block_n", "BK": "block_k"}
    return {names[name]: size for name, size in launch.tiles if name in names}


if __name__ == "__main__":
    main()
