"""What a schedule costs on a machine, and whether the machine has it."""

from __future__ import annotations

from ...frozen import frozen
from ..graph.dtypes import I8_EXACT_ROWS
from .hardware import GRID_COLUMNS, KIB, Hardware, covers, instruction
from .problem import Problem

__all__ = ["Resources", "resources"]


@frozen
class Resources:
    threads: int
    smem_bytes: int
    #: f32 accumulators each thread holds.
    accumulators: int
    #: Why the schedule cannot run, in words; empty when it can.
    problems: tuple[str, ...]


def _kib(n: int) -> str:
    return f"{n // KIB} KiB" if n % KIB == 0 else f"{n / KIB:.1f} KiB"


def resources(problem: Problem, knobs: dict[str, object], hw: Hardware) -> Resources:
    warps = int(knobs.get("warps", 1))
    threads = warps * hw.lanes if hw.kind == "gpu" else 1
    bm = int(knobs.get("block_m", 1))
    bn = int(knobs.get("block_n", 1))
    bk = int(knobs.get("block_k", 1))
    bd = int(knobs.get("block_d", 1))
    stages = int(knobs.get("stages", 1)) if hw.async_copy else 1
    size = problem.bytes
    kind = problem.works_like
    if kind == "gemm":
        smem = stages * (bm * bk + bk * bn) * size
        accumulators = problem.held * bm * bn // threads
    elif kind == "attention":
        smem = (bm * bd + stages * 2 * bn * bd) * size
        # Scores of FMA loops (a dtype the arch's matrix cores do not take), and of tf32
        # on CUDA, sit in a Grid, whose row maxima and sums are combined across the
        # threads of a row through GRID_COLUMNS floats per row.
        # So are those of a head dim the instruction's tiles do not cover (16 under
        # MFMA's 32 columns): every product of the kernel then runs as an FMA loop.
        shapes = {cols: instruction(hw, problem.dtype.name, cols)[:2] for cols in (bn, bd)}
        grid = hw.kind == "gpu" and (
            shapes[bn][0] == "fma"
            or (hw.target == "cuda" and size == 4)
            or not all(covers(shape, bm, cols) for cols, (_, shape) in shapes.items())
        )
        if hw.kind == "gpu" and (hw.target != "cuda" or grid):
            # Without 16-bit mma fragments, the probabilities reach their product with
            # the values through shared memory: a bm x bn tile, rows padded by 4 bytes,
            # in the values' dtype for the matrix cores and in f32 for FMA loops and tf32.
            p_size = 4 if grid else size
            smem += bm * (bn + 4 // p_size) * p_size
        if grid:
            smem += bm * min(GRID_COLUMNS, threads) * 4
        if problem.held > 1:
            # the other tiles held through the loop, and on GPUs the f32 probabilities
            # staged for their products (transposed, or by k)
            smem += (problem.held - 1) * bm * bd * size
            smem += bm * (bn + 1) * 4 if hw.kind == "gpu" else 0
        accumulators = (bm * bd + bm * bn) // threads
    else:
        smem = 0
        accumulators = 0
    problems: list[str] = []
    where = f"{hw.arch}" if hw.target != "cpu" else f"the {hw.arch} CPU target"
    if kind == "gemm" and problem.dtype.name == "i8" and bk > I8_EXACT_ROWS:
        # a block's dot of i8s is exact only below 2^24 (docs/numerics.md), which
        # gemm_i8's split of each block into two exact parts relies on
        problems.append(
            f"a K block of {bk} rows of i8 operands sums up to 2^14 * {bk}, past 2^24, "
            f"which an f32 holds exactly; at most {I8_EXACT_ROWS}"
        )
    if hw.kind == "gpu":
        if threads > hw.max_threads:
            problems.append(
                f"{warps} warps are {threads} threads; {where} allows {hw.max_threads} per program"
            )
        if smem > hw.smem_bytes:
            problems.append(
                f"block ({bm}, {bn}) needs {_kib(smem)} of shared memory; "
                f"{where} allows {_kib(hw.smem_bytes)}"
            )
        if accumulators > hw.regs_per_thread:
            problems.append(
                f"block ({bm}, {bn}) with {warps} warps keeps {accumulators} accumulators in "
                f"each thread; {where} has {hw.regs_per_thread} registers per thread"
            )
        if kind in ("gemm", "attention") and not covers((hw.mma_m, hw.mma_n), bm, bn):
            problems.append(
                f"block ({bm}, {bn}) is not a multiple of the {hw.mma} tile "
                f"({hw.mma_m} x {hw.mma_n}) on {where}"
            )
    elif smem > hw.smem_bytes:
        problems.append(
            f"block ({bm}, {bn}) keeps {_kib(smem)} of panels; {where} plans for "
            f"{_kib(hw.smem_bytes)} of cache per program"
        )
    return Resources(threads, smem, accumulators, tuple(problems))
