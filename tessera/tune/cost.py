"""An analytic cost model: which candidates are worth measuring first.

It does not have to be right about times, only about order, well enough that
the fastest candidate is among those the search measures. For each candidate
it estimates, in cycles of one core or SM:

- compute: the padded flops of one program over the machine's flops per
  cycle, lowered for tiles that do not divide into the micro-kernel (CPU) or
  leave registers to spare (GPU), and for short steps whose loop overhead is
  not amortized;
- memory: the operand bytes one program reads, which shrink as its tile grows
  (operand reuse), at a cache bandwidth, raised when a program's working set
  spills out of the cache share the hardware table plans for (cache
  blocking);
- waves: programs run ``units`` at a time, so a last wave that is half empty
  costs as much as a full one (wave quantization; occupancy on GPUs is the
  programs an SM holds at once, from shared memory and registers).

A program costs the larger of compute and memory; the launch, its waves.
"""

from __future__ import annotations

import os
from typing import Any

from ..transpiler.schedule.hardware import Hardware
from ..transpiler.schedule.problem import Problem
from ..transpiler.schedule.resources import resources

__all__ = ["estimate_cycles"]

#: The CPU micro-kernel's register block (rows x vectors) and its cache bandwidth in bytes
#: per cycle; a GPU SM's f32 FMA rate per cycle and its shared-memory bandwidth.
_CPU_BLOCK_ROWS = 8
_CPU_BYTES_PER_CYCLE = 32
_GPU_FLOPS_PER_CYCLE = 1024
_GPU_BYTES_PER_CYCLE = 128


def estimate_cycles(problem: Problem, knobs: dict[str, Any], hw: Hardware) -> float:
    """Estimated cycles of the launch with this schedule; lower is better."""
    sizes = _sizes(problem)
    if sizes is None:
        return 0.0  # sizes unknown: nothing to tell candidates apart
    m, n, k, d, batch = sizes
    bm = int(knobs.get("block_m", 1))
    bn = int(knobs.get("block_n", 1))
    bk = int(knobs.get("block_k", 1))
    size = problem.bytes
    gpu = hw.kind == "gpu"
    lanes = hw.lanes
    flops_per_cycle = _GPU_FLOPS_PER_CYCLE if gpu else 4 * lanes  # two FMA pipes on CPUs
    bandwidth = _GPU_BYTES_PER_CYCLE if gpu else _CPU_BYTES_PER_CYCLE
    if problem.works_like == "attention":
        programs = _ceil(m, bm) * batch
        flops = 4 * bm * n * d
        operand_bytes = 2 * n * d * size  # every program streams all keys and values
        working_set = (bm * d + 2 * bn * d + bm * bn) * 4
        step = bn
    elif problem.works_like == "gemm":
        programs = _ceil(m, bm) * _ceil(n, bn) * batch
        flops = 2 * bm * bn * k
        operand_bytes = (bm + bn) * k * size
        working_set = (bm * bk + bk * bn) * size + bm * bn * 4
        step = bk
    else:
        return 0.0
    efficiency = step / (step + 16)  # per-step overhead: loop, softmax rescale, C reload
    if not gpu:
        efficiency *= _fraction(bm, _CPU_BLOCK_ROWS) * _fraction(bn, 2 * lanes)
    compute = flops / (flops_per_cycle * efficiency)
    share = max(1, hw.smem_bytes)
    spill = 1.0 if working_set <= share else working_set / share
    memory = operand_bytes * spill / bandwidth
    units = _units(hw)
    if gpu:
        smem = max(1, resources(problem, knobs, hw).smem_bytes)
        units *= max(1, min(4, hw.smem_bytes // smem))
    waves = _ceil(programs, units)
    return waves * max(compute, memory)


def _sizes(problem: Problem) -> tuple[int, int, int, int, int] | None:
    def value(dim: Any, default: int) -> int | None:
        return default if dim is None else dim.constant

    batch = 1
    for dim in problem.batch:
        if dim.constant is None:
            return None
        batch *= dim.constant
    sizes = (value(problem.m, 1), value(problem.n, 1), value(problem.k, 1),
             value(problem.d, 1), batch)  # fmt: skip
    return None if None in sizes else sizes  # type: ignore[return-value]


def _units(hw: Hardware) -> int:
    """Programs that run at once: the machine's SMs, or the cores the tuner runs on."""
    if hw.kind == "cpu":
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, hw.units)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _fraction(block: int, unit: int) -> float:
    """The useful share of a block made of ``unit``-sized register blocks."""
    return block / (_ceil(block, unit) * unit)
