"""The Tile IR verifier, run after the tile passes (and after each with ``TESSERA_CHECKS=1``).

It checks what every backend relies on: values are defined before use, in
scope; every access has one axis per tensor dim and covers the tile it moves;
register tiles and shared buffers have constant sizes except where a tile
spans a whole run-time dim; an axis that can run past a ragged edge is masked
once the edge-masking pass has run; shared memory fits the hardware and no
two live buffers overlap. A failure is a compiler bug, reported as an
internal error naming the pass.
"""

from __future__ import annotations

from ..graph.ir import Block, Op, Value
from ..graph.types import TensorType, TileType
from ..schedule.hardware import Hardware
from .ir import Access, SharedType, TileKernel
from .masks import needs_mask

__all__ = ["verify_kernel", "TileVerifyError"]

#: Ops that move data between a global tensor and the program.
ACCESS_OPS = ("load", "store", "copy")


class TileVerifyError(AssertionError):
    pass


def verify_kernel(kernel: TileKernel, hw: Hardware, after: str, masks_final: bool = True) -> None:
    """Check ``kernel``; ``masks_final`` once the edge-masking pass has run."""

    def fail(message: str) -> TileVerifyError:
        return TileVerifyError(f"kernel '{kernel.name}' after {after}: {message}")

    defined: set[int] = {p.id for p in kernel.params}

    def check_block(block: Block, visible: set[int]) -> None:
        visible = visible | {a.id for a in block.args}
        for op in block.ops:
            for v in op.operands:
                if v.id not in visible:
                    raise fail(f"{op.kind} uses {v.name or v.id} before it is defined")
            if op.kind in ACCESS_OPS:
                check_access(op.kind, op.operands[0], op.attr("at"), op)
            for region in op.regions:
                check_block(region, visible)
            for r in op.results:
                if r.id in defined:
                    raise fail(f"{r.name or r.id} is defined twice")
                defined.add(r.id)
                visible.add(r.id)
                if isinstance(r.type, SharedType) and any(d.constant is None for d in r.type.dims):
                    raise fail(f"shared buffer {r.name} has a run-time size: {r.type}")
        for v in block.yields:
            if v.id not in visible:
                raise fail(f"yields {v.name or v.id}, which is not defined")

    def check_access(kind: str, tensor: Value, at: Access, op: Op) -> None:
        if not isinstance(tensor.type, TensorType) or not isinstance(at, Access):
            raise fail(f"{kind} needs a global tensor and an access")
        if len(at.axes) != tensor.type.rank:
            raise fail(f"{kind} of {tensor.name} has {len(at.axes)} axes for {tensor.type}")
        moved = op.results[0].type if kind == "load" else op.operands[1].type
        sizes = tuple(a.size for a in at.tile_axes)
        if isinstance(moved, TileType) and moved.dims != sizes:
            raise fail(f"{kind} of {tensor.name} moves {moved} through {at}")
        if isinstance(moved, SharedType) and moved.dims != sizes:
            raise fail(f"{kind} of {tensor.name} fills {moved} through {at}")
        for axis in at.axes:
            if masks_final and needs_mask(axis) and not axis.masked:
                raise fail(f"{kind} of {tensor.name} can run past {axis.extent} unmasked: {at}")

    check_block(kernel.body, set(defined))
    if kernel.smem_bytes > hw.smem_bytes:
        raise fail(f"shared memory {kernel.smem_bytes} bytes exceeds {hw.smem_bytes}")
    slots = sorted(kernel.smem, key=lambda s: s.offset)
    names = [s.buffer for s in slots]
    if len(set(names)) != len(names):
        raise fail(f"a buffer has two places in the shared-memory plan: {names}")
