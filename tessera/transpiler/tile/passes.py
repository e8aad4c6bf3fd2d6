"""The tile passes, in order, each a named unit (the verifier runs after the last, and
with ``checks.ENABLED`` after each).

``legalize``       dot (+ add) -> mma on the target's instruction, as data
``causal-bound``   key loops of causal attention stop at the last query row
``edge-mask``      which access axes need a mask; fills before reductions
``stage``          dot operands through shared memory; async, multi-stage
                   pipelines where the target can copy ahead
``defer-reads``    reads of operands an instruction takes from shared memory
                   move down to the instruction
``barriers``       barriers where threads hand shared memory to each other
``plan-smem``      offsets, padding or swizzle, reuse across lifetimes
``specialize``     a producer warpgroup for the copies of a GEMM's loop (sm_90a)
"""

from __future__ import annotations

from collections.abc import Callable

from ... import checks
from ...frozen import frozen
from ..graph.ir import walk
from ..schedule.hardware import Hardware
from .barriers import insert_barriers
from .causal import bound_causal_loops
from .defer_reads import defer_reads
from .edge_mask import mask_edges
from .ir import TileKernel
from .legalize import legalize
from .smem import plan_smem
from .specialize import specialize_warps
from .stage import stage_operands
from .verify import verify_kernel

__all__ = ["TILE_PASSES", "run_tile_passes", "TilePass", "SharedMemoryOverflow"]


@frozen
class TilePass:
    name: str
    run: Callable[[TileKernel, Hardware], TileKernel]


TILE_PASSES: tuple[TilePass, ...] = (
    TilePass("legalize", legalize),
    TilePass("causal-bound", bound_causal_loops),
    TilePass("edge-mask", mask_edges),
    TilePass("stage", stage_operands),
    TilePass("defer-reads", defer_reads),
    TilePass("barriers", insert_barriers),
    TilePass("plan-smem", plan_smem),
    TilePass("specialize", specialize_warps),
)


class SharedMemoryOverflow(Exception):
    """The kernel's buffers, as planned, need more shared memory than a block has: the
    program's choice (a constant block in ``tile.range_n``), reported at its line."""

    def __init__(self, kernel: TileKernel, hw: Hardware) -> None:
        loops = [op for op in walk(kernel.body) if op.kind == "for"]
        super().__init__(
            f"'{kernel.function}' stages {kernel.smem_bytes:,} bytes of shared memory, more "
            f"than the {hw.smem_bytes:,} a block has on {hw.arch}: a smaller block in "
            "tile.range_n, or a schedule with smaller tiles, fits"
        )
        self.span = loops[0].span if loops and loops[0].span else kernel.span


def run_tile_passes(kernel: TileKernel, hw: Hardware, until: str | None = None) -> TileKernel:
    """Run the passes in order (up to and including ``until``; ``"lowering"`` runs
    none), verifying the result, and with ``checks.ENABLED`` what each pass gives."""
    if checks.ENABLED or until == "lowering":
        verify_kernel(kernel, hw, "lowering", masks_final=False)
    if until == "lowering":
        return kernel
    masked = False
    for tile_pass in TILE_PASSES:
        kernel = tile_pass.run(kernel, hw)
        masked = masked or tile_pass.name == "edge-mask"
        if tile_pass.name == "plan-smem" and kernel.smem_bytes > hw.smem_bytes:
            raise SharedMemoryOverflow(kernel, hw)
        last = tile_pass.name == until or tile_pass is TILE_PASSES[-1]
        if checks.ENABLED or last:
            verify_kernel(kernel, hw, tile_pass.name, masks_final=masked)
        if last:
            break
    return kernel
