"""Shared-memory planning: where each buffer lives, and in what layout.

Each ``alloc`` gets an offset (128-byte aligned, as TMA and vector copies
want) and a layout against bank conflicts: the schedule's XOR swizzle where
it chose one (no extra bytes; what ``ldmatrix`` reads best), otherwise rows
padded by 16 bytes when a row is a multiple of 128 bytes, so that consecutive
rows start in different banks. In a kernel whose products run on ``wgmma``, a
16-bit buffer of whole 128-byte rows (or an fp8 one, where a ``wgmma`` reads fp8) takes
the 128-byte swizzle instead
(``sw128``, 1024-byte aligned): the layout that ``wgmma`` reads through a
matrix descriptor and that TMA writes, so the instruction reads its operands
where the copies put them. Buffers whose lifetimes do
not overlap share space: the query tile of attention, read once before the
loop, gives its bytes to nothing later, but two GEMM operands live together.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ..graph.ir import Block, Op
from ..schedule.hardware import Hardware
from .ir import SharedType, SmemSlot, TileKernel

__all__ = ["plan_smem", "arena_alignment", "ALIGN", "SW128_ALIGN"]

ALIGN = 128
#: The 128-byte swizzle repeats every 8 rows of 128 bytes; wgmma reads it from a base
#: aligned to the repeat.
SW128_ALIGN = 1024
_BANK_ROW = 128  # bytes: 32 banks of 4 bytes


def arena_alignment(kernels: Iterable[TileKernel]) -> int:
    """The alignment of a shared-memory arena that these kernels' buffers are planned
    in: the swizzle's repeat where a buffer is swizzled, else 16 bytes."""
    layouts = {s.layout for k in kernels for s in k.smem}
    return SW128_ALIGN if "sw128" in layouts else 16


def plan_smem(kernel: TileKernel, hw: Hardware) -> TileKernel:
    allocs = [op for op in kernel.body.ops if op.kind == "alloc"]
    if not allocs:
        return kernel
    spans = _lifetimes(kernel.body)
    wgmma = kernel.wgmma_dtypes
    placed: list[tuple[SmemSlot, int, int]] = []
    for alloc in allocs:
        buf = alloc.result
        t: SharedType = buf.type
        layout, size = _layout(t, kernel, hw, wgmma)
        align = SW128_ALIGN if layout == "sw128" else ALIGN
        first, last = spans.get(buf.id, (0, 0))
        offset = 0
        for other, o_first, o_last in sorted(placed, key=lambda p: p[0].offset):
            overlaps = not (last < o_first or o_last < first)
            if overlaps and offset < other.offset + other.bytes and other.offset < offset + size:
                offset = _aligned(other.offset + other.bytes, align)
        placed.append((SmemSlot(buf.name or "smem", offset, size, layout), first, last))
    return replace(kernel, smem=tuple(p[0] for p in placed))


def _layout(
    t: SharedType, kernel: TileKernel, hw: Hardware, wgmma: frozenset[str]
) -> tuple[str, int]:
    rows, cols = (
        (d.constant or 1 for d in t.dims[-2:]) if len(t.dims) > 1 else (1, t.dims[0].constant or 1)
    )
    row_bytes = cols * t.dtype.bits // 8
    swizzled = t.dtype.bits == 16 or t.dtype.name in wgmma
    if wgmma and swizzled and row_bytes % _BANK_ROW == 0 and rows % 8 == 0:
        return "sw128", t.bytes
    if hw.kind == "gpu" and kernel.swizzle == "xor" and row_bytes % 16 == 0:
        return "xor", t.bytes
    if hw.kind == "gpu" and row_bytes % _BANK_ROW == 0:
        pad = 16 * 8 // t.dtype.bits
        return f"padded +{pad}", t.stages * rows * (cols + pad) * t.dtype.bits // 8
    return "row-major", t.bytes


def _aligned(offset: int, align: int) -> int:
    return -(-offset // align) * align


def _lifetimes(body: Block) -> dict[int, tuple[int, int]]:
    """First and last top-level position where each buffer is used (a use inside a
    loop counts for the whole loop)."""
    spans: dict[int, tuple[int, int]] = {}
    for index, op in enumerate(body.ops):
        for v in _uses(op):
            first, _ = spans.get(v, (index, index))
            spans[v] = (first, index)
    return spans


def _uses(op: Op) -> set[int]:
    found = {v.id for v in op.operands}
    for region in op.regions:
        for inner in region.ops:
            found |= _uses(inner)
    return found
