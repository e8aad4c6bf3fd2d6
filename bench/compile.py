"""Benchmark: how long ``tesserac`` and ``import tessera`` take, as a user sees them.

Each example is compiled end to end (``tesserac FILE -o FILE.cu`` in a new process,
warm caches: the parser tables, compiled templates and library trees kept between
runs, in a cache folder of the benchmark's own), the median of ``--runs`` processes
after one warm-up. The peer, timed in the same run the same way, is a Python process
that only imports ``json``: the floor any Python command pays. ``import tessera`` is
timed the same way. Goals: each example under 0.3 s, the import under 0.15 s. A file
compiled again loads its kept parse (``docs/cli.md``); ``decode.tsr, edited`` is
decode's run as after an edit, its parse not kept, so parsed again.

Two ways Python can find Tessera's modules are timed, since they differ by a third:

- ``bytecode``: with the bytecode Python keeps of each module (an installed package,
  or a checkout where Python may write ``__pycache__``; here kept under a temporary
  ``PYTHONPYCACHEPREFIX``, so the tree is left alone);
- ``source``: with ``PYTHONDONTWRITEBYTECODE=1`` and no bytecode anywhere, so every
  process compiles each module it imports from its text (an editable install in an
  environment that sets that variable, as the development machine does).

``--before PATH`` times a second checkout (another branch's worktree) the same way,
interleaved with this one, each run of one beside a run of the other, so that a
change's effect is measured under the same load. Results, with the 1-minute load
average before and after, go to ``bench/results/compile.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tessera import __version__

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def environment(mode: str, tree: Path, scratch: Path) -> dict[str, str]:
    """The environment that loads the checkout ``tree`` in ``mode`` (see the module's
    documentation), with Tessera's cache folder and Python's bytecode under
    ``scratch``, which belongs to this tree and mode alone."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env |= {"PYTHONPATH": str(tree), "TESSERA_CACHE_DIR": str(scratch / "cache")}
    if mode == "bytecode":
        return env | {"PYTHONPYCACHEPREFIX": str(scratch / "bytecode")}
    return env | {"PYTHONDONTWRITEBYTECODE": "1"}


def medians(
    commands: dict[str, tuple[list[str], dict[str, str]]],
    runs: int,
    cwd: Path,
    fresh: str | None = None,
) -> dict[str, tuple[float, float]]:
    """The median wall time and CPU time (user + system) of each command over ``runs``
    processes after one warm-up, run in ``cwd`` (a folder with no ``tessera`` in it:
    ``python -c`` and ``-m`` look in the current folder before ``PYTHONPATH``), the
    commands taking turns so that a change in load falls on all of them alike. On a
    shared machine the CPU time is the steadier: other work stretches the wall time of
    a run, hardly its own CPU time. With ``fresh``, that folder of each command's cache
    is removed before each run (``parsed``: the command parses its file as after an
    edit)."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for turn in range(runs + 1):
        for name, (command, env) in commands.items():
            if fresh is not None:
                shutil.rmtree(Path(env["TESSERA_CACHE_DIR"]) / fresh, ignore_errors=True)
            used = _children_cpu()
            start = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=cwd, env=env)
            if turn:
                times[name].append((time.perf_counter() - start, _children_cpu() - used))
    return {
        name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
        for name, t in times.items()
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--runs", type=int, default=10)
    cli.add_argument("--before", type=Path, help="another checkout to time beside this one")
    cli.add_argument("--before-label", help="what --before holds, for the results (its commit)")
    cli.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "compile.json")
    args = cli.parse_args()
    trees = {"after": ROOT} | ({"before": args.before.resolve()} if args.before else {})

    load_before = os.getloadavg()[0]
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for mode in ("bytecode", "source"):
            envs = {side: environment(mode, tree, scratch / side / mode)
                    for side, tree in trees.items()}  # fmt: skip
            cases = {"python -c 'import json'": ["-c", "import json"],
                     "import tessera": ["-c", "import tessera"]}  # fmt: skip
            for example in sorted((ROOT / "examples").glob("*.tsr")):
                out = str(scratch / f"{example.stem}.cu")
                cases[f"tesserac {example.name}"] = ["-m", "tessera", str(example), "-o", out]
            # decode's first run after an edit: its parse not kept (``docs/cli.md``)
            cases["tesserac decode.tsr, edited"] = cases["tesserac decode.tsr"]
            rows: dict[str, dict[str, float]] = {}
            for name, argv in cases.items():
                fresh = "parsed" if "edited" in name else None
                timed = medians({side: ([PYTHON, *argv], env) for side, env in envs.items()},
                                args.runs, scratch, fresh)  # fmt: skip
                rows[name] = {"seconds": round(timed["after"][0], 4),
                              "cpu_seconds": round(timed["after"][1], 4)}  # fmt: skip
                if "before" in timed:
                    rows[name] |= {"before_seconds": round(timed["before"][0], 4),
                                   "before_cpu_seconds": round(timed["before"][1], 4)}  # fmt: skip
            floor = rows["python -c 'import json'"]["seconds"]
            for name, row in rows.items():
                row["ratio_to_python"] = round(row["seconds"] / floor, 2)
                was = ""
                if args.before:
                    was = (f"  before {row['before_seconds'] * 1e3:6.1f} ms"
                           f" (cpu {row['before_cpu_seconds'] * 1e3:6.1f})")  # fmt: skip
                print(f"{mode:8} {name:34} {row['seconds'] * 1e3:7.1f} ms"
                      f" (cpu {row['cpu_seconds'] * 1e3:6.1f})"
                      f"  {row['ratio_to_python']:5.1f}x python{was}", flush=True)  # fmt: skip
            results[mode] = rows
    report = {
        "tessera": __version__,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "runs": args.runs,
        "before": (args.before_label or str(args.before)) if args.before else None,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
