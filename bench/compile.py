"""Benchmark: how long ``tesserac`` and ``import tessera`` take, as a user sees them.

Each example is compiled end to end (``tesserac FILE -o FILE.cu`` in a new process,
warm caches: the parser tables and compiled templates kept between runs), the median
of ``--runs`` processes after one warm-up. The peer, timed in the same run the same
way, is a Python process that only imports ``json``: the floor any Python command
pays. ``import tessera`` is timed the same way. Results go to
``bench/results/compile.json``. Goals: each example under 0.3 s, the import under
0.15 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tessera import __version__

ROOT = Path(__file__).resolve().parent.parent
TESSERAC = [sys.executable, "-m", "tessera"]


def seconds(command: list[str], runs: int) -> float:
    """The median wall time of ``command`` over ``runs`` processes, after one warm-up."""
    times = []
    for _ in range(runs + 1):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--runs", type=int, default=10)
    cli.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "compile.json")
    args = cli.parse_args()

    floor = seconds([sys.executable, "-c", "import json"], args.runs)
    importing = seconds([sys.executable, "-c", "import tessera"], args.runs)
    results = {
        "python -c 'import json'": {"seconds": round(floor, 4)},
        "import tessera": {"seconds": round(importing, 4)},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for example in sorted((ROOT / "examples").glob("*.tsr")):
            out = os.path.join(tmp, f"{example.stem}.cu")
            results[f"tesserac {example.name}"] = {
                "seconds": round(seconds([*TESSERAC, str(example), "-o", out], args.runs), 4)
            }
    for name, row in results.items():
        row["ratio_to_python"] = round(row["seconds"] / floor, 2)
        print(f"{name:34} {row['seconds'] * 1e3:7.1f} ms  {row['ratio_to_python']:5.1f}x python")
    report = {
        "tessera": __version__,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "runs": args.runs,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
