"""Accuracy of the register-pressure estimate: the kernels of each example and of each
standard-library file, estimated from the Tile IR (``--emit meta``'s ``analysis``) and
counted by ptxas (NVRTC's report), on sm_80 and sm_90a. One NVRTC build per file and
arch. Results go to ``bench/results/registers.json``: per kernel both numbers and the
relative error, and per arch (all kernels, the examples' and the library's) the mean and
median absolute error, the largest, and how many kernels are within 15%. Both counts are
deterministic (no timing): the machine's load does not change them.

With ``--holdout`` it also checks that the model's constants generalize: it refits them
(``_BASE``, sm_90a's loop base, ``_ROW_BASE``, ``_WALK_UNROLL``, ``_FLAT_INDEX``) by
coordinate descent on the examples alone and then on the library alone, minimizing the
mean absolute error, and reports both halves under each fit beside the constants as
they are (``holdout`` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tessera
import tessera.transpiler.check.registers as model
from tessera.transpiler.schedule.hardware import Hardware, hardware_for
from tessera.transpiler.target.nvrtc import build
from tessera.transpiler.tile.ir import TileKernel

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ("sm_80", "sm_90a")
SOURCES = sorted((ROOT / "examples").glob("*.tsr")) + sorted(
    (ROOT / "tessera" / "stdlib").glob("*.tsr")
)
#: The values each constant is refitted over with ``--holdout``.
GRID = {
    "_BASE": range(24, 41, 2),
    "_LOOP_BASE": range(32, 49, 2),
    "_ROW_BASE": range(20, 37, 2),
    "_WALK_UNROLL": range(0, 9),
    "_FLAT_INDEX": range(6, 19, 2),
}


@dataclass
class Case:
    arch: str
    source: str
    kernel: TileKernel
    hw: Hardware
    ptxas: int

    @property
    def half(self) -> str:
        return "examples" if self.source.startswith("examples/") else "library"

    def error(self) -> float:
        estimate = model.estimate_registers(self.kernel, self.hw)
        return (estimate - self.ptxas) / self.ptxas


def cases() -> list[Case]:
    """Every kernel on both archs with ptxas's count; the estimates of ``--emit meta``
    are checked to be the model's."""
    found = []
    for arch in ARCHS:
        hw = hardware_for("cuda", arch)
        for path in SOURCES:
            program = tessera.compile_file(path, target="cuda", arch=arch)
            meta = program.ir("meta")
            counted = build(program.source, arch, meta["build"]["options"]).resources
            estimates = {e["kernel"]: e["registers_estimate"] for e in meta["analysis"]}
            source = str(path.relative_to(ROOT))
            for tile in program.ir("tile").programs:
                for kernel in tile.kernels:
                    case = Case(arch, source, kernel, hw, counted[kernel.name].registers)
                    assert model.estimate_registers(kernel, hw) == estimates[kernel.name]
                    found.append(case)
    return found


def summary(errors: list[float]) -> dict:
    errors = [abs(e) for e in errors]
    return {
        "kernels": len(errors),
        "mean_abs_error": round(statistics.mean(errors), 3),
        "median_abs_error": round(statistics.median(errors), 3),
        "max_abs_error": round(max(errors), 3),
        "within_15_percent": sum(e <= 0.15 for e in errors),
    }


def halves(found: list[Case]) -> dict:
    """Each arch's summary, of all kernels and of the examples' and the library's."""
    result = {}
    for arch in ARCHS:
        mine = [c for c in found if c.arch == arch]
        result[arch] = summary([c.error() for c in mine])
        for half in ("examples", "library"):
            result[arch][half] = summary([c.error() for c in mine if c.half == half])
    return result


def _setter(name: str) -> Callable[[int], None]:
    if name == "_LOOP_BASE":
        return lambda v: setattr(model, "_LOOP_BASE", {"sm_90a": v})
    return lambda v: setattr(model, name, v)


def _value(name: str) -> int:
    return model._LOOP_BASE["sm_90a"] if name == "_LOOP_BASE" else getattr(model, name)


def holdout(found: list[Case]) -> dict:
    """Refit the constants on one half, three rounds of coordinate descent, and report
    both halves beside the constants as they are (whose errors are the summary's): a
    model that generalizes does about as well on the half it was not fitted on."""
    current = {name: _value(name) for name in GRID}
    result: dict = {"constants": current}
    for fit_on in ("examples", "library"):
        fitted = [c for c in found if c.half == fit_on]
        for _ in range(3):
            for name, values in GRID.items():
                setter = _setter(name)

                def cost(
                    value: int, setter: Callable[[int], None] = setter, fitted: list = fitted
                ) -> float:
                    setter(value)
                    return statistics.mean(abs(c.error()) for c in fitted)

                setter(min(values, key=cost))
        result[f"fit_on_{fit_on}"] = {
            "constants": {name: _value(name) for name in GRID},
            "errors": halves(found),
        }
        for name, value in current.items():
            _setter(name)(value)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--holdout", action="store_true", help="refit the constants per half")
    args = parser.parse_args()
    found = cases()
    note = ("ptxas's counts (NVRTC, sm_80 and sm_90a) and the estimates are deterministic: "
            "the shared machine's load does not change them")  # fmt: skip
    results: dict = {"note": note, "kernels": [], "summary": halves(found)}
    for c in found:
        row = {"arch": c.arch, "source": c.source, "kernel": c.kernel.name}
        estimate = model.estimate_registers(c.kernel, c.hw)
        row.update(estimate=estimate, ptxas=c.ptxas, error=round(c.error(), 3))
        results["kernels"].append(row)
    if args.holdout:
        results["holdout"] = holdout(found)
    out = ROOT / "bench" / "results" / "registers.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "kernels"}, indent=1))


if __name__ == "__main__":
    main()
