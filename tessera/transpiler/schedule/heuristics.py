"""Default schedules: a documented heuristic per target, kernel kind and dtype.

The candidates are the tile shapes that work well for each machine's matrix
instruction and memory: 128x128 output tiles with 3-stage ``cp.async``
pipelines on sm_80, 4-stage TMA pipelines on sm_90a, 2-stage LDS staging on
CDNA, register-blocked macro-tiles on CPUs. When the sizes are known (``-D``),
the candidate with the best estimated throughput is chosen: operand reuse
(larger tiles load less per output) times the useful fraction of the launch
(wave quantization: the last wave of programs on a GPU half empty; padding:
tiles past a ragged edge). Otherwise reuse alone decides: the largest tile.
"""

from __future__ import annotations

from .hardware import GRID_COLUMNS, Hardware
from .problem import Problem
from .resources import resources

__all__ = ["default_knobs", "candidates", "score", "loop_tiles", "walking_rows"]

Knobs = dict[str, object]

# (block_m, block_n, block_k in bytes of one element row, warps, stages) per target family.
_GEMM = {
    "sm_80": [(128, 128, 64, 4, 3), (128, 64, 64, 4, 3), (64, 128, 64, 4, 3), (64, 64, 64, 4, 3)],
    # sm_90a: two computing warpgroups of m64n256 wgmma each. 128 x 256 is 1.4x as fast as
    # 128 x 128 at bf16 8192 on an H200 (1.72 ms against 2.36 a product), as its tiles
    # load a third less per output; 3 stages instead of 4 took 2.07 ms (bench/README.md).
    "sm_90a": [
        (128, 256, 128, 8, 4),
        (128, 128, 128, 8, 4),
        (128, 64, 128, 4, 4),
        (64, 128, 128, 4, 4),
        (64, 64, 128, 4, 4),
    ],
    "hip": [(128, 128, 64, 4, 2), (128, 64, 64, 4, 2), (64, 64, 64, 4, 2)],
    "opencl": [(64, 64, 64, 4, 1), (32, 32, 64, 4, 1)],
    # CPUs: a 256 x 256 f32 accumulator and a 256 x 256 tile of B fit a 1 MiB L2 (an f32
    # A is read in place), and 256 rows divide into the micro-kernel's 6- or 8-row
    # blocks with little remainder (SGEMM 2048 on 2 cores: 82.4-83.2 ms against
    # 82.9-84.8 ms for 128 x 256; 512 to 4096 all 1-2% faster). 512 x 256 copies half as
    # much of B and was 1.7% faster at 2048, but it halves the programs when M is 257 to
    # 512, and sizes are rarely known here: a 512 x 256 product would use one core of two.
    "cpu": [(256, 256, 1024, 1, 1)],
}
# A product whose operand the kernel dequantizes in registers (an i8 or i4 weight widened
# and scaled where its mma fragments read it: w4a16, the library's gemm_dequant kernels)
# holds the loaded integers, scales and addresses beside its accumulators. With the
# tables' tiles, 20 of 88 such compilations (44 kernels: i8 and i4; bf16, f16 and f32
# activations; zero points or not; groups of 32 to 128 rows or a scale per column; each
# for both archs) spilled, up to 232 bytes on sm_90a; 128 x 64 on 4 warps spilled in
# none, with 3 stages on sm_80 and 2 on sm_90a (nvcc 13.0; 3 on sm_90a, or 2 on sm_80,
# left a 4-byte spill in one to three of them).
_DEQUANTIZED_GEMM = {
    "sm_80": [(128, 64, 64, 4, 3), (64, 64, 64, 4, 3)],
    "sm_90a": [(128, 64, 128, 4, 2), (64, 64, 128, 4, 2)],
}
# A product that keeps two accumulators (gemm_i8's exact parts, high and low) holds
# twice the registers of one: 128 x 128 spilled 168 bytes on 8 warps on sm_80 (2184 on
# 4), 128 x 64 on 4 warps 112; 128 x 64 on 8 warps spilled on neither arch (nvcc 13).
_HELD_GEMM = {
    "sm_80": [(128, 64, 64, 8, 3), (64, 64, 64, 4, 3)],
    "sm_90a": [(128, 64, 128, 8, 3), (64, 64, 128, 4, 3)],
}
# (block_m queries, block_n keys, warps, stages) per family, for head dims up to 64 and 128.
_ATTENTION = {
    "sm_80": {64: (128, 64, 4, 2), 128: (128, 32, 8, 2), 256: (64, 32, 4, 2)},
    "sm_90a": {64: (128, 128, 8, 2), 128: (128, 128, 8, 2), 256: (128, 64, 8, 2)},
    "hip": {64: (128, 64, 4, 2), 128: (64, 64, 2, 2), 256: (64, 32, 4, 2)},
    "opencl": {64: (32, 32, 4, 1), 128: (32, 32, 4, 1), 256: (16, 16, 4, 1)},
    # CPUs: 128 queries x 256 keys per program, the autotuner's pick at S1024 and S2048
    # (4-5% faster than 64 x 128, bench/tune.py); with D=128 the working set is 448 KiB.
    "cpu": {64: (128, 256, 1, 1), 128: (128, 256, 1, 1), 256: (32, 64, 1, 1)},
}


def _family(hw: Hardware) -> str:
    """Whose tile table a target reads: SYCL's products are OpenCL's FMA loops."""
    if hw.target == "sycl":
        return "opencl"
    return hw.arch if hw.target == "cuda" else hw.target


def head_dim_tile(problem: Problem) -> int:
    """The head-dim tile: the head dim rounded up to 16, or 128 when it is symbolic."""
    d = problem.d.constant if problem.d is not None else None
    if d is None:
        return 128
    return max(16, -(-d // 16) * 16)


#: f32 accumulators per thread that mma.sync kernels of f32 operands keep without spilling.
_F32_OPERAND_ACCUMULATORS = 64


def _warps(problem: Problem, hw: Hardware, rows: int, accumulators: int, warps: int) -> int:
    """The warps a tile of ``rows`` rows and ``accumulators`` f32 values takes. On sm_80,
    f32 operands reach mma.sync as fragments converted in registers, which hold twice
    what bf16 ones do: a 128 x 128 SGEMM tile on 4 warps (128 accumulators a thread)
    spilled 72 bytes, on 8 warps (64) none, and so did attention's 128 x 64 block of
    scores with a head dim of 64 (16 bytes). Such tiles take twice the warps until they
    keep at most 64 a thread, up to 8 warps and 16 rows a warp (an mma's rows). So do
    tiles of several accumulators (``gemm_i8``'s two: 128 x 128 on 4 warps spilled 2184
    bytes, on 8 none) of any operands."""
    if hw.target != "cuda" or hw.arch != "sm_80" or (problem.bytes != 4 and problem.held == 1):
        return warps
    most = max(warps, min(8, rows // hw.mma_m))
    while warps < most and accumulators > warps * hw.lanes * _F32_OPERAND_ACCUMULATORS:
        warps *= 2
    return warps


def candidates(problem: Problem, hw: Hardware) -> list[Knobs]:
    """The heuristic's candidate schedules for a problem, best first when sizes are unknown."""
    vector = max(1, hw.vector_bytes // problem.bytes) if hw.kind == "gpu" else hw.lanes
    swizzle = "xor" if hw.kind == "gpu" else "none"
    kind = problem.works_like
    # Persistent GEMMs gained 1.5% (bf16), 13% (f16) and 3% (fp8) at 8192 on an H200
    # (bench/gpu.py, both in one run); they stay a schedule's choice until the simulator
    # tests that assume one program per tile cover both.
    persistent = False
    base: Knobs = {"vector": vector, "swizzle": swizzle, "split_k": 1, "persistent": persistent}
    if kind == "gemm":
        # On GPUs, f32 operands keep tiles at most 128 wide: at 128 x 256 on sm_90a, a
        # fused SiLU epilogue put 512 bytes of a tf32 product's accumulators on the stack.
        table = _GEMM[_family(hw)]
        if problem.dequantized:
            table = _DEQUANTIZED_GEMM.get(_family(hw), table)
        if problem.held > 1:
            table = _HELD_GEMM.get(_family(hw), table)
        shapes = [t for t in table
                  if hw.kind != "gpu" or problem.bytes < 4 or t[1] <= 128]  # fmt: skip
        return [
            {**base, "block_m": m, "block_n": n, "block_k": max(8, k // problem.bytes),
             "block_d": head_dim_tile(problem),
             "warps": _warps(problem, hw, m, m * n * problem.held, w), "stages": s}
            for m, n, k, w, s in shapes
        ]  # fmt: skip
    if kind == "attention":
        d = head_dim_tile(problem)
        table = _ATTENTION[_family(hw)]
        m, n, w, s = table[next(limit for limit in sorted(table) if d <= limit or limit == 256)]
        if hw.kind == "cpu" and problem.held > 1:
            # The backward kernels (which hold two tiles through the loop) take square
            # blocks: causal attention's diagonal blocks, half masked, are then half as
            # large. S1024 D64, one thread's CPU time: causal 36 ms against 40, the
            # full attention 61 against 62.
            n = m
        # The table's entry first, then smaller variants for when it does not fit:
        # fewer stages, then fewer keys per step, then fewer queries per program (and
        # warps in proportion) with each of those key steps (one under the mma's n
        # does not fit).
        keys = [n] + [bn for bn in (n // 2, n // 4) if bn >= 16]
        variants = [(m, n, st, w) for st in range(s, 0, -1)]
        variants += [(m, bn, 1, w) for bn in keys[1:]]
        variants += [(bm, bn, 1, max(1, w * bm // m))
                     for bm in (m // 2, m // 4, m // 8) if bm >= 16 for bn in keys]  # fmt: skip
        return [
            {**base, "block_m": bm, "block_n": bn, "block_d": d,
             "warps": _warps(problem, hw, bm, bm * (d + bn), wv), "stages": st}
            for bm, bn, st, wv in variants
        ]  # fmt: skip
    if kind == "layout":
        # A transposing copy: a square block, whose rows are read and whose columns are
        # written whole lines at a time (64 f32 are four 64-byte lines).
        return [{**base, "block_m": 64, "block_n": 64, "warps": 4 if hw.kind == "gpu" else 1,
                 "stages": 1}]  # fmt: skip
    if kind == "columns":
        # Column sums over every row (norm_param_grad): a program owns block_m columns and
        # walks the rows block_n at a time. CPU: 256 columns are a 1 KiB run of each row
        # (whole lines, prefetched in order); a 16 x 256 block of x and of the cotangent
        # and the two running sums are 64 KiB together (32 rows, 128 KiB, took 9.5 ms of
        # one thread's CPU time at 4096 x 4096 against 8.3). GPUs: 32 columns (one
        # 128-byte line of each f32 row) and 16 rows a step, 4 values of each running
        # sum a thread: a 4096-wide tensor has 128 programs, and 64 columns took 79
        # registers on sm_80 (32: 56) for no more reuse.
        if hw.kind == "gpu":
            return [{**base, "block_m": 32, "block_n": 16, "warps": 4, "stages": 1}]
        return [{**base, "block_m": 256, "block_n": 16, "warps": 1, "stages": 1}]
    if kind == "reduction":
        # CPU: 4 rows of a 4096-wide f32 tensor are 64 KiB, so a program's few tiles stay in L2
        rows = 4
        return [{**base, "block_m": rows, "warps": 4 if hw.kind == "gpu" else 1, "stages": 1}]
    elements = 1024 if hw.kind == "gpu" else 8192
    return [{**base, "block_m": elements, "warps": 8 if hw.kind == "gpu" else 1, "stages": 1}]


def walking_rows(knobs: Knobs, hw: Hardware) -> Knobs:
    """The heuristic's knobs for a row-block tile kernel that walks its rows' columns in
    blocks (``tile.load(x, rows=T.m, cols=kb)`` in a ``tile.range_n`` loop). On a GPU a
    program's threads hold each ``[T.m, step]`` block as ``GRID_COLUMNS`` columns by
    ``threads / GRID_COLUMNS`` rows of threads (8 under four 32-wide warps, 16 under
    four 64-wide wavefronts), a row each, so the row block has at least that many rows.
    The other row kernels keep 4: the library's, which hold whole rows, spill with 8."""
    if hw.kind != "gpu":
        return knobs
    rows = int(knobs["warps"]) * hw.lanes // GRID_COLUMNS
    return {**knobs, "block_m": max(int(knobs["block_m"]), rows)}


def loop_tiles(problem: Problem, hw: Hardware) -> Knobs:
    """Tile sizes for a tile kernel whose shape does not choose them: a row-block kernel
    that walks its columns with ``tile.range_n(..., T.k)``, say. They are the first gemm
    candidate's, whose steps suit the machine's loads for this dtype."""
    gemm = candidates(Problem("gemm", problem.dtype, problem.m, d=problem.d), hw)
    return {k: gemm[0][k] for k in ("block_n", "block_k", "block_d")}


def score(problem: Problem, knobs: Knobs, hw: Hardware) -> float:
    """Estimated relative throughput: useful work (padding at ragged edges, occupancy of
    the last wave) times operand reuse (a BM x BN tile loads BM + BN rows per BM * BN
    outputs, counted relative to 128 x 128). Reuse only when sizes are unknown."""
    tiled = problem.works_like == "gemm"
    bm = int(knobs["block_m"])
    bn = int(knobs.get("block_n", 1)) if tiled else 1
    reuse = (bm * bn / (bm + bn)) / 64 if tiled else 1.0
    m = problem.m.constant
    n = problem.n.constant if problem.n is not None and tiled else 1
    if m is None or n is None:
        return reuse
    tiles_m, tiles_n = -(-m // bm), -(-n // bn)
    padding = (m * n) / (tiles_m * bm * tiles_n * bn)
    batch = 1
    for dim in problem.batch:
        if dim.constant is None:
            return padding * reuse
        batch *= dim.constant
    if hw.units == 0:
        return padding * reuse
    smem = max(1, resources(problem, knobs, hw).smem_bytes)
    per_unit = max(1, min(4, hw.smem_bytes // smem))
    slots = hw.units * per_unit
    programs = tiles_m * tiles_n * batch
    waves = -(-programs // slots)
    return padding * reuse * programs / (waves * slots)


def default_knobs(problem: Problem, hw: Hardware) -> Knobs:
    """The heuristic's choice: the best-scoring candidate that fits; ties go to the first."""
    options = [c for c in candidates(problem, hw) if not resources(problem, c, hw).problems]
    options = options or candidates(problem, hw)
    best = max(options, key=lambda c: score(problem, c, hw))
    return {**best, "split_k": split_k(problem, best, hw)}


def split_k(problem: Problem, knobs: Knobs, hw: Hardware) -> int:
    """Split the reduction of a gemm across programs when its output tiles are too few
    to fill the GPU and its K is long: up to 8 ways, each slice at least 4 K-steps."""
    if problem.kind != "gemm" or hw.kind != "gpu" or hw.units == 0:
        return 1
    sizes = [problem.m.constant, problem.n.constant if problem.n is not None else None,
             problem.k.constant if problem.k is not None else None]  # fmt: skip
    if None in sizes or any(d.constant is None for d in problem.batch):
        return 1
    m, n, k = sizes
    programs = -(-m // int(knobs["block_m"])) * -(-n // int(knobs["block_n"]))
    for dim in problem.batch:
        programs *= dim.constant
    if programs * 2 > hw.units:
        return 1
    limit = min(8, hw.units // programs, k // (4 * int(knobs["block_k"])))
    ways = 1
    while ways * 2 <= limit:
        ways *= 2
    return ways
