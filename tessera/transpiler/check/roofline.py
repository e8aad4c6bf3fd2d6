"""Roofline hints: a kernel's FLOPs and bytes from its Tile IR, and what bounds it.

Each op costs what its tiles say: a product ``2 m n k`` FLOPs, an elementwise op or a
reduction one per element, online softmax five per score (max, subtract, exp, sum,
rescale); a ``load``, ``store`` or ``copy`` requests its tile's bytes from global
memory (``requested_bytes``: what the programs ask of the caches). The roofline's
``bytes`` are the tensors' own, each read or written once (twice, one both read and
written over): what DRAM must move at least, where caches keep every reuse. A loop
multiplies its body by its trip count (``extent / step``: a causal loop counted
whole), a branch costs its first region (the condition holding), and the kernel is
that times its programs (each grid axis's ``extent / block``). Tiles are counted
whole, so ragged edges count as full tiles.

The totals are expressions in the program's sizes (``2*M*N*K``); the arithmetic
intensity and the bound are evaluated where ``-D`` fixed the sizes and at
``SIZE`` for each size it did not, and compared with the ridge point of the arch's
peak table: above it the kernel is compute-bound, below it memory-bound. Products on
a matrix unit meet its 16-bit peak, everything else the f32 vector peak.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from ...frozen import frozen
from ..graph.dims import Dim
from ..graph.ir import Block, Op, walk
from ..graph.types import TensorType, TileType
from ..tile.ir import STORES, Mma, SharedType, TileKernel

__all__ = ["PEAKS", "SIZE", "Peak", "Cost", "kernel_cost", "roofline"]

#: What a size the program leaves symbolic is taken to be.
SIZE = 1024


@frozen
class Peak:
    """An arch's dense peaks: matrix-unit 16-bit and vector f32 TFLOP/s, memory GB/s.
    The vendors' data sheets for the part named; a program sees less."""

    part: str
    matrix_tflops: float
    vector_tflops: float
    bandwidth_gbs: float


PEAKS: dict[str, Peak] = {
    "sm_80": Peak("A100 SXM 80 GB", 312.0, 19.5, 2039.0),
    "sm_90a": Peak("H100 SXM", 989.0, 67.0, 3350.0),
    "gfx90a": Peak("MI250X, one GCD", 191.5, 23.9, 1638.0),
    "gfx942": Peak("MI300X", 1307.0, 163.4, 5300.0),
}

#: FLOPs per element of an op's first result, for ops that are not one per element.
_PER_ELEMENT = {"softmax_online": 5, "gelu": 8, "silu": 4, "sigmoid": 4, "tanh": 4, "pow": 2}
_FREE = frozenset({
    "alloc", "commit", "wait", "wait_mma", "barrier", "release", "yield", "full", "const",
    "iota", "expand_dims", "transpose", "dim_to_float", "read", "split", "concat", "gather",
    "mask_edge", "mask_causal", "cast",
})  # fmt: skip


@frozen
class Cost:
    flops: Dim
    #: The tensors' bytes (each once, or twice where read and written), and the bytes
    #: the programs' accesses request.
    bytes: Dim
    requested: Dim
    #: Whether a product runs on a matrix unit (the peak it can reach).
    matrix: bool


def kernel_cost(kernel: TileKernel) -> Cost:
    """The FLOPs and global-memory bytes of one launch of ``kernel``."""
    flops, bytes_, matrix = _block(kernel.body)
    programs = Dim.const(1)
    for axis in kernel.grid:
        programs = programs * axis.extent / axis.block
    stored = {op.operands[0].id for op in walk(kernel.body) if op.kind in STORES}
    read = {v.id for op in walk(kernel.body) if op.kind not in STORES for v in op.operands}
    tensors = Dim.const(0)
    for param in kernel.params:
        if isinstance(param.type, TensorType):
            # a tensor read and written over (an optimizer state updated in place)
            # moves twice: in, and back out
            times = 2 if param.id in stored and param.id in read else 1
            tensors = tensors + _elements(param.type) * param.type.dtype.bits / 8 * times
    return Cost(flops * programs, tensors, bytes_ * programs, matrix)


def roofline(kernel: TileKernel, arch: str, defines: Mapping[str, int]) -> dict[str, Any]:
    """The kernel's roofline hint, as ``--emit meta`` and the inspector show it."""
    cost = kernel_cost(kernel)
    sizes = {s: defines.get(s, SIZE) for s in cost.flops.symbols() | cost.bytes.symbols()}
    flops, moved = float(cost.flops.value(sizes)), float(cost.bytes.value(sizes))
    hint: dict[str, Any] = {
        "flops": str(cost.flops),
        "bytes": str(cost.bytes),
        "requested_bytes": str(cost.requested),
        "at": dict(sorted(sizes.items())),
        "intensity": round(flops / moved, 2) if moved else None,
    }
    peak = PEAKS.get(arch)
    if peak is None or not moved:
        hint["bound"] = None
        return hint
    tflops = peak.matrix_tflops if cost.matrix else peak.vector_tflops
    ridge = tflops * 1e12 / (peak.bandwidth_gbs * 1e9)
    attainable = min(tflops, flops / moved * peak.bandwidth_gbs / 1e3)
    hint.update(
        peak=peak.part,
        peak_tflops=tflops,
        bandwidth_gbs=peak.bandwidth_gbs,
        ridge=round(ridge, 2),
        bound="compute" if flops / moved >= ridge else "memory",
        attainable_tflops=round(attainable, 2),
    )
    return hint


def _block(block: Block) -> tuple[Dim, Dim, bool]:
    flops, bytes_, matrix = Dim.const(0), Dim.const(0), False
    for op in block.ops:
        f, b, m = _op(op)
        flops, bytes_, matrix = flops + f, bytes_ + b, matrix or m
    return flops, bytes_, matrix


def _op(op: Op) -> tuple[Dim, Dim, bool]:
    zero = Dim.const(0)
    if op.kind == "for":
        f, b, m = _block(op.regions[0])
        trips = op.attr("extent") / op.attr("step")
        return f * trips, b * trips, m
    if op.regions:
        return _block(op.regions[0])
    if op.kind in ("load", "store"):
        tile = op.results[0].type if op.kind == "load" else op.operands[-1].type
        if not isinstance(tile, TileType):
            return zero, zero, False
        return zero, _elements(tile) * tile.dtype.bits / 8, False
    if op.kind == "copy":
        buf: SharedType = op.operands[1].type
        return zero, Dim.const(Fraction(buf.slot_elements * buf.dtype.bits, 8)), False
    mma = op.attr("mma")
    if isinstance(mma, Mma):
        flops = _product(op)
        if op.kind == "softmax_accumulate":  # rescale the accumulator too
            flops = flops + _elements(op.results[0].type) * 2
        return flops, zero, mma.inst not in ("fma", "simd.fma")
    if op.kind in _FREE or not op.results or not isinstance(op.results[0].type, TileType):
        return zero, zero, False
    tile = op.operands[0].type if op.kind in ("sum", "max", "min", "mean") else op.results[0].type
    if not isinstance(tile, TileType):
        return zero, zero, False
    return _elements(tile) * _PER_ELEMENT.get(op.kind, 1), zero, False


def _product(op: Op) -> Dim:
    """``2 m n k`` of a product: ``acc + a @ b`` or ``softmax_accumulate``'s ``P @ V``."""
    if op.kind == "softmax_accumulate":
        p, v = op.operands[3].type, op.operands[4].type
        m, k, n = p.dims[-2], p.dims[-1], v.dims[-1]
    else:
        a, out = op.operands[0].type, op.results[0].type
        m, k, n = a.dims[-2], a.dims[-1], out.dims[-1]
    return m * n * k * 2


def _elements(tile: TileType | TensorType) -> Dim:
    count = Dim.const(1)
    for d in tile.dims:
        count = count * d
    return count
