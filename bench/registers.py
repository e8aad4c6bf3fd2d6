"""Accuracy of the register-pressure estimate: the kernels of each example and of each
standard-library file, estimated from the Tile IR (``--emit meta``'s ``analysis``) and
counted by ptxas (NVRTC's report), on sm_80 and sm_90a. One NVRTC build per file and
arch. Results go to ``bench/results/registers.json``: per kernel both numbers and the
relative error, and per arch the mean absolute error, the largest, and how many kernels
are within 15%. Both counts are deterministic (no timing): the machine's load does not
change them.
"""

from __future__ import annotations

import json
from pathlib import Path

import tessera
from tessera.transpiler.target.nvrtc import build

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ("sm_80", "sm_90a")
SOURCES = sorted((ROOT / "examples").glob("*.tsr")) + sorted(
    (ROOT / "tessera" / "stdlib").glob("*.tsr")
)


def measure() -> dict:
    note = ("ptxas's counts (NVRTC, sm_80 and sm_90a) and the estimates are deterministic: "
            "the shared machine's load does not change them")  # fmt: skip
    results: dict = {"note": note, "kernels": [], "summary": {}}
    for arch in ARCHS:
        errors = []
        for path in SOURCES:
            program = tessera.compile_file(path, target="cuda", arch=arch)
            meta = program.ir("meta")
            counted = build(program.source, arch, meta["build"]["options"]).resources
            for entry in meta["analysis"]:
                estimate, registers = (
                    entry["registers_estimate"],
                    counted[entry["kernel"]].registers,
                )
                error = (estimate - registers) / registers
                errors.append(abs(error))
                source = str(path.relative_to(ROOT))
                row = {"arch": arch, "source": source, "kernel": entry["kernel"]}
                row.update(estimate=estimate, ptxas=registers, error=round(error, 3))
                results["kernels"].append(row)
        results["summary"][arch] = {
            "kernels": len(errors),
            "mean_abs_error": round(sum(errors) / len(errors), 3),
            "max_abs_error": round(max(errors), 3),
            "within_15_percent": sum(e <= 0.15 for e in errors),
        }
    return results


def main() -> None:
    results = measure()
    out = ROOT / "bench" / "results" / "registers.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
