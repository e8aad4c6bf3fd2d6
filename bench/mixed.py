"""Benchmark: Tessera's CPU kernels called in a pipeline with numpy and torch calls.

Users mix Tessera calls with numpy and torch calls, and those libraries keep their own
worker threads spinning for a while after each call (OpenBLAS for about 0.1 s), holding
the cores the next Tessera call wants. Each case times one call right after a prelude:

* ``isolated``: a 200 ms pause, then one untimed call of the same function (``cpu.py``'s
  method: the timed call runs as calls do back to back, on idle cores);
* ``after numpy``: a 200 ms pause, then ``numpy.matmul`` of the case's size;
* ``after torch``: a 200 ms pause, then ``torch.matmul`` of the case's size.

The subjects are SGEMM 512 and 2048 (``numpy.matmul`` is the peer) and softmax over
4096 x 4096 into a preallocated array (bandwidth-bound; the peer is ``numpy.copyto`` of
the same bytes, this machine's copy bandwidth; its preludes are the 2048 products). The
ratio is peer time / Tessera time in the same condition, and ``mixed / isolated`` says
how much of the isolated ratio survives the prelude. Every (condition, subject) pair runs
once per run, interleaved, and the median of the runs is kept; ``--rounds`` repeats the
whole measurement to show its spread on a shared machine. Two last rows time calls back
to back: 1000 SGEMMs of 4 x 4 (one program: the cost of a call) and 50 of 512 x 512
(four programs: the threads wake, or find the next call while they spin).

``--before PATH`` builds the same kernels with another checkout's compiler (another
branch's worktree) and times them as a third subject beside this checkout's, interleaved,
so that a change to the generated code is measured under the same load: on a shared
machine, separate runs differ by more than the change. Results go to
``bench/results/mixed.json`` with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

import tessera
from tessera.files import write_file
from tessera.runtime.cpu import CpuLibrary, load

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "mixed.json"

SOURCE = """\
@kernel
def sgemm(A: Tensor["M", "K", f32], B: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return A @ B

@kernel
def softmax_rows(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return softmax_safe(x, axis=-1)
"""

#: The pause before each prelude: OpenBLAS's threads spin for about 0.1 s after a call.
PAUSE = 0.2


def _after(prelude: Callable[[], object], subject: Callable[[], object]) -> float:
    """Seconds of one call of ``subject`` right after a pause and ``prelude``."""
    time.sleep(PAUSE)
    prelude()
    start = time.perf_counter()
    subject()
    return time.perf_counter() - start


def _repeat(calls: int, fn: Callable[..., object], *args: object) -> None:
    """``calls`` calls of ``fn``: one timed run of a back-to-back case."""
    for _ in range(calls):
        fn(*args)


def built_by(checkout: Path) -> CpuLibrary:
    """The kernels as another checkout's compiler writes them, built and loaded here."""
    script = ("import json, sys, tessera\n"
              f"m = tessera.compile({SOURCE!r}, 'mixed.tsr', target='cpu')\n"
              "json.dump({'source': m.source, 'meta': m.ir('meta')}, sys.stdout)")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=True, cwd=checkout)  # fmt: skip
    module = json.loads(done.stdout)
    return load(module["source"], module["meta"])


def _cases(libs: dict[str, CpuLibrary], rng: np.random.Generator) -> dict[str, dict]:
    """Per case: its subjects (each build of the kernels, and the numpy peer) and its
    preludes."""
    cases: dict[str, dict] = {}
    products = {}
    for n in (512, 2048):
        a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        products[n] = (partial(np.matmul, a, b), partial(torch.matmul, ta, tb))
        cases[f"sgemm {n}"] = {
            "subjects": {
                **{who: partial(lib.sgemm, a, b) for who, lib in libs.items()},
                "numpy": products[n][0],
            },
            "preludes": {"after numpy": products[n][0], "after torch": products[n][1]},
        }
    x = rng.standard_normal((4096, 4096), dtype=np.float32)
    out, copy_dst = np.empty_like(x), np.empty_like(x)
    cases["softmax 4096x4096"] = {
        "subjects": {**{who: partial(lib.softmax_rows, x, out=out) for who, lib in libs.items()},
                     "numpy": partial(np.copyto, copy_dst, x)},
        "preludes": {"after numpy": products[2048][0], "after torch": products[2048][1]},
    }  # fmt: skip
    return cases


def measure(libs: dict[str, CpuLibrary], runs: int) -> list[dict]:
    """One round: per case and condition, the median seconds of each subject."""
    cases = _cases(libs, np.random.default_rng(0))
    samples: dict[tuple[str, str, str], list[float]] = {}
    for subjects in (c["subjects"] for c in cases.values()):
        for fn in subjects.values():
            fn()  # warm-up: pages touched, threads started
    for _ in range(runs):
        for case, spec in cases.items():
            for who, fn in spec["subjects"].items():
                conditions = {"isolated": fn, **spec["preludes"]}
                for condition, prelude in conditions.items():
                    key = (case, condition, who)
                    samples.setdefault(key, []).append(_after(prelude, fn))
    rows = []
    for case, spec in cases.items():
        isolated = None
        for condition in ("isolated", *spec["preludes"]):
            t = {who: statistics.median(samples[(case, condition, who)])
                 for who in spec["subjects"]}  # fmt: skip
            ratios = {who: round(t["numpy"] / t[who], 3) for who in libs}
            isolated = isolated or ratios
            rows.append({"case": case, "condition": condition, "seconds": t,
                         "vs_numpy": ratios["tessera"],
                         **{f"{who}_vs_numpy": ratios[who] for who in libs if who != "tessera"},
                         **({"before_over_tessera": round(t["before"] / t["tessera"], 3)}
                            if "before" in libs else {}),
                         "mixed_over_isolated":
                             round(ratios["tessera"] / isolated["tessera"], 3)})  # fmt: skip
    rng = np.random.default_rng(1)
    for n, calls in ((4, 1000), (512, 50)):
        a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        b2b = {**{who: partial(_repeat, calls, lib.sgemm, a, b) for who, lib in libs.items()},
               "numpy": partial(_repeat, calls, np.matmul, a, b)}  # fmt: skip
        times: dict[str, list[float]] = {who: [] for who in b2b}
        for _ in range(runs):
            for who, fn in b2b.items():
                times[who].append(_after(fn, fn))
        t = {who: statistics.median(v) for who, v in times.items()}
        rows.append({"case": f"sgemm {n}x{n}, {calls} calls back to back",
                     "condition": "isolated", "seconds": t,
                     "us_per_call": {k: round(v / calls * 1e6, 1) for k, v in t.items()},
                     "vs_numpy": round(t["numpy"] / t["tessera"], 3),
                     **{f"{who}_vs_numpy": round(t["numpy"] / t[who], 3)
                        for who in libs if who != "tessera"},
                     **({"before_over_tessera": round(t["before"] / t["tessera"], 3)}
                        if "before" in libs else {})})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--label", default="", help="recorded with the results")
    parser.add_argument("--before", type=Path, help="another checkout to time beside this one")
    parser.add_argument("--before-label", help="what --before holds, for the results")
    args = parser.parse_args()
    libs = {"tessera": tessera.compile(SOURCE, "mixed.tsr", target="cpu").load()}
    if args.before:
        libs["before"] = built_by(args.before.resolve())
    load_before = os.getloadavg()[0]
    rounds = []
    for r in range(args.rounds):
        rows = measure(libs, args.runs)
        rounds.append(rows)
        for row in rows:
            ms = {k: round(v * 1e3, 2) for k, v in row["seconds"].items()}
            print(f"round {r}  {row['case']:<30} {row['condition']:<12} {ms}  "
                  f"vs numpy {row['vs_numpy']} {row.get('before_vs_numpy', '')}")  # fmt: skip
    spread = {}
    for i, row in enumerate(rounds[0]):
        spread[f"{row['case']}, {row['condition']}"] = {
            key: {"each": [rows[i][key] for rows in rounds],
                  "median": statistics.median(rows[i][key] for rows in rounds)}
            for key in ("vs_numpy", "before_vs_numpy", "before_over_tessera")
            if key in row}  # fmt: skip
    result = {
        "benchmark": "mixed",
        "label": args.label,
        "before": args.before_label if args.before else None,
        "machine": {"cores": os.cpu_count(), "numpy": np.__version__,
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                    "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)]},
        "method": f"per round, median of {args.runs} interleaved runs after one warm-up; "
                  f"each timed call follows a {PAUSE * 1e3:.0f} ms pause and its condition's "
                  "prelude; ratios are numpy time / tessera time (above 1: tessera is "
                  "faster); the load average is the 1-minute one before and after",
        "spread": spread,
        "rounds": rounds,
    }  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_file(RESULTS, json.dumps(result, indent=2) + "\n")
    for name, s in spread.items():
        print(f"{name:<45} " + "  ".join(f"{k} {v['each']}" for k, v in s.items()))


if __name__ == "__main__":
    main()
