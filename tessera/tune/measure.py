"""Running candidates: random inputs, a correctness check, wall-clock times.

Every candidate runs the same inputs. Before its times count, its output (on
fresh copies of the inputs, into a result poisoned with NaN) is compared with
the first candidate's, the heuristic schedule's: a schedule changes the
order of a reduction, never the answer, so a candidate that disagrees beyond
rounding is a compiler bug and is dropped, loudly.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..frozen import frozen
from ..runtime.cpu import CpuFunction
from ..transpiler.graph.dims import parse_dim
from ..transpiler.graph.dtypes import ENTRY_DTYPES
from ..transpiler.tile.interpret import numpy_dtype

__all__ = ["Inputs", "Runner", "make_inputs"]

#: Largest error allowed against the first candidate, relative to its largest magnitude.
_TOLERANCE = {32: 1e-3, 64: 1e-9}
_LOW_PRECISION_TOLERANCE = 3e-2


@frozen
class Inputs:
    #: Arguments by parameter name, in the function's order.
    args: dict[str, Any]
    #: Each result's shape and dtype; none for a function that updates its arguments.
    results: tuple[tuple[tuple[int, ...], np.dtype], ...]

    def fresh(self) -> list[Any]:
        return [a.copy() if isinstance(a, np.ndarray) else a for a in self.args.values()]


def make_inputs(meta: Mapping[str, Any], seed: int = 0) -> Inputs:
    """Random arguments for a function at the sizes its metadata fixes (``-D``)."""
    rng = np.random.default_rng(seed)
    args: dict[str, Any] = {}
    results = []
    for p in meta["params"]:
        if p["kind"] == "scalar":
            args[p["name"]] = {"bool": False, "int": 1}.get(p["type"], 0.5)
            continue
        shape = tuple(_constant(d, p["name"]) for d in p["dims"])
        dtype = numpy_dtype(ENTRY_DTYPES[p["dtype"]])
        if p["io"] == "out":
            results.append((shape, np.dtype(dtype)))
        else:
            args[p["name"]] = rng.standard_normal(shape).astype(dtype)
    return Inputs(args, tuple(results))


def _constant(text: str, where: str) -> int:
    dim = parse_dim(text)
    if dim.constant is None:
        raise ValueError(f"'{where}' has the symbolic size {text}: give it with -D")
    return dim.constant


@dataclass
class Runner:
    """One candidate's function, its inputs, and the times measured so far (seconds)."""

    function: CpuFunction
    inputs: Inputs
    times: list[float] = field(default_factory=list)

    def output(self) -> list[Any]:
        """The results on fresh inputs, or the updated arguments of an in-place function."""
        args = self.inputs.fresh()
        if not self.inputs.results:
            self.function(*args)
            return [a for a in args if isinstance(a, np.ndarray)]
        outs = [np.full(shape, np.nan, dtype=dtype) for shape, dtype in self.inputs.results]
        self.function(*args, out=_out(outs))
        return outs

    def run(self, reps: int) -> None:
        args = list(self.inputs.args.values())
        out = _out([np.empty(*r) for r in self.inputs.results])
        for _ in range(reps):
            start = time.perf_counter()
            if out is None:
                self.function(*args)
            else:
                self.function(*args, out=out)
            self.times.append(time.perf_counter() - start)

    @property
    def median(self) -> float:
        return float(np.median(self.times)) if self.times else float("inf")


def _out(outs: list[np.ndarray]) -> Any:
    """A call's ``out=``: none, the one result array, or a tuple of several."""
    if len(outs) > 1:
        return tuple(outs)
    return outs[0] if outs else None


def disagreement(output: Any, reference: Any) -> str | None:
    """Why an output differs from the reference beyond rounding, or None."""
    outs = output if isinstance(output, list) else [output]
    refs = reference if isinstance(reference, list) else [reference]
    for out, ref in zip(outs, refs, strict=True):
        a = np.asarray(out, dtype=np.float64)
        b = np.asarray(ref, dtype=np.float64)
        # f16, bf16 and fp8 results round each element to 8 or fewer significant bits
        tolerance = _TOLERANCE.get(out.dtype.itemsize * 8, _LOW_PRECISION_TOLERANCE)
        if not np.array_equal(np.isfinite(a), np.isfinite(b)):
            return "non-finite values where the reference has none"
        scale = max(1.0, float(np.max(np.abs(b[np.isfinite(b)]), initial=0.0)))
        error = float(np.max(np.abs(a - b)[np.isfinite(b)], initial=0.0))
        if error > tolerance * scale:
            return f"largest error {error:.3g} against {tolerance * scale:.3g} allowed"
    return None
