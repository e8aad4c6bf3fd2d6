"""Which kernels copy through TMA on sm_90a, for the passes and the emitter alike.

The Tile IR marks a pipelined loop's copies on sm_90a ``async = tma``. The CUDA emitter
issues them as TMA copies (``target/simt_tma.py``) where every such copy of the kernel
fits: its buffer is in the 128-byte swizzle (each 128-byte panel is one TMA box), its
masked axes end where the tensor does, its tile is the tensor's last two axes (any
others are batch indices, a box of 1), boxes
stay within TMA's 256 elements an axis and tensors within its five axes, and the kernel
has one pipelined loop, at its top level, so that one barrier per stage serves it.
"""

from __future__ import annotations

from ..graph.ir import Op, walk
from .ir import Access, SharedType, TileKernel

__all__ = ["tma_stages", "pipelined_loop", "fits_tma"]

#: TMA's limits: a box has at most 256 elements along each axis, a tensor five axes.
_MAX_BOX, _MAX_RANK = 256, 5


def pipelined_loop(kernel: TileKernel) -> Op | None:
    """The kernel's one pipelined loop (a loop that waits for copies), if it has one
    and it is at the top level."""
    loops = [op for op in walk(kernel.body) if op.kind == "for"
             and any(inner.kind == "wait" for inner in op.regions[0].ops)]  # fmt: skip
    return loops[0] if len(loops) == 1 and loops[0] in kernel.body.ops else None


def tma_stages(kernel: TileKernel) -> int | None:
    """The stages of the kernel's one pipelined loop, if all its copies fit TMA."""
    copies = [op for op in walk(kernel.body) if op.kind == "copy" and op.attr("async") == "tma"]
    if not copies or pipelined_loop(kernel) is None:
        return None
    layouts = {s.buffer: s.layout for s in kernel.smem}
    stages = {op.operands[1].type.stages for op in copies}
    if len(stages) != 1 or not all(fits_tma(op, layouts) for op in copies):
        return None
    return stages.pop()


def fits_tma(copy: Op, layouts: dict[str, str]) -> bool:
    """Whether TMA can make ``copy``: its buffer's layout (by buffer name) is ``sw128``,
    its tile the tensor's last two axes, within TMA's limits."""
    buf = copy.operands[1]
    t: SharedType = buf.type
    at: Access = copy.attr("at")
    tile_axes = [not a.index for a in at.axes]
    dims = copy.operands[0].type.dims
    return (
        layouts.get(buf.name or "smem") == "sw128"
        and copy.operands[0].type.dtype == t.dtype  # TMA copies bytes as they are
        # TMA fills zeros past the tensor's end only: a view that ends sooner (a head's
        # columns) needs a mask of its own
        and all(not a.masked or a.extent == d for a, d in zip(at.axes, dims, strict=True))
        and len(t.dims) == 2
        and all(d.constant is not None and d.constant <= _MAX_BOX for d in t.dims)
        and len(at.axes) <= _MAX_RANK
        and tile_axes == [False] * (len(at.axes) - 2) + [True, True]
    )
