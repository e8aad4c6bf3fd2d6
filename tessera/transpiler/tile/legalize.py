"""Legalization: how each dot runs on the target, decided once, as data.

Every ``dot`` (and the ``p @ v`` inside ``softmax_accumulate``) gets an
``Mma``: the instruction for its operand dtype on this arch (``mma.sync``
on sm_80, ``wgmma`` on sm_90a, MFMA on CDNA, FMA on OpenCL, a SIMD
micro-kernel on CPUs), the instruction's shape and how the warps split the
output tile. ``acc + dot(a, b)`` where the dot has no other use becomes one
``mma a, b, acc``, so the accumulator stays in the instruction's registers.
"""

from __future__ import annotations

from dataclasses import replace

from ..graph.ir import Op, Value, walk
from ..graph.types import TileType
from ..schedule.hardware import Hardware, covers, instruction
from .ir import Mma, TileKernel
from .rewrite import producers, rewrite, use_counts

__all__ = ["legalize", "instruction"]

#: The wgmma forms that take both operands K-major (``a`` as ``[m, k]``, ``b`` stored as
#: ``[n, k]``: ``a @ b.T``), from shared memory, in whole 128-byte rows of the swizzle,
#: one warpgroup to each 64 rows of the result; and what runs a product that is not so
#: (sm_80's way: the fp8 fragments widened to f16, which holds every fp8 value).
_K_MAJOR_ONLY = {
    "wgmma.fp8_e4m3": ("mma.sync.f16", (16, 8, 16)),
    "wgmma.fp8_e5m2": ("mma.sync.f16", (16, 8, 16)),
}
#: The widest wgmma, and the bytes of a row of its operands' swizzle.
_WGMMA_N, _SWIZZLE_ROW = 256, 128


def _warp_layout(warps: int, rows: int, cols: int, shape: tuple[int, int, int]) -> tuple[int, int]:
    """Split ``warps`` into rows x cols of the output tile, each warp's part as square as
    the instruction allows (fewer fragment loads per mma)."""
    best = (warps, 1)
    best_cost = None
    for wm in (1 << i for i in range(warps.bit_length())):
        if warps % wm:
            continue
        wn = warps // wm
        if rows % wm or cols % wn or rows // wm < shape[0] or cols // wn < shape[1]:
            continue
        cost = abs(rows // wm - cols // wn)
        if best_cost is None or cost < best_cost:
            best, best_cost = (wm, wn), cost
    return best


def _mma(
    kernel: TileKernel, hw: Hardware, dtype: str, out: TileType, whole_rows: bool,
    k_major: bool = False, fma: bool = False,
) -> Mma:  # fmt: skip
    rows, cols = (d.constant or 1 for d in out.dims)
    inst, shape, operands = instruction(hw, dtype, cols)
    if fma and hw.kind != "cpu":
        inst, shape = "fma", (1, 1, 1)
    if hw.kind == "cpu":
        return Mma(inst, shape, (1, 1), (rows, cols), operands)
    if inst in _K_MAJOR_ONLY:
        mma = _mma_of(kernel, inst, shape, rows, cols, True)
        if k_major and mma.warps[1] == 1 and mma.warp_tile[0] == shape[0] and cols <= _WGMMA_N:
            return mma
        inst, shape = _K_MAJOR_ONLY[inst]
    return _mma_of(kernel, inst, shape, rows, cols, whole_rows)


def _mma_of(
    kernel: TileKernel, inst: str, shape: tuple[int, int, int], rows: int, cols: int,
    whole_rows: bool,
) -> Mma:  # fmt: skip
    # wgmma is issued by warpgroups of four warps, each owning 64 rows.
    units = max(kernel.warps // 4 if inst.startswith("wgmma") else kernel.warps, 1)
    if whole_rows and rows % units == 0 and rows // units >= shape[0]:
        wm, wn = units, 1
    else:
        wm, wn = _warp_layout(units, rows, cols, shape)
    if inst != "fma" and not covers(shape, rows, cols, (wm, wn)):
        # the instruction's tiles do not cover the product (a head dim of 16 under
        # MFMA's 32 columns): the FMA loop computes it
        return _mma_of(kernel, "fma", (1, 1, 1), rows, cols, whole_rows)
    return Mma(inst, shape, (wm, wn), (rows // wm, cols // wn), "shared")


def legalize(kernel: TileKernel, hw: Hardware) -> TileKernel:
    """Give every product its ``Mma``. In a kernel with online softmax each warp owns
    whole rows of every product, so that a row's max and sum combine within one warp
    and the running row state meets the accumulator's rows in the same threads."""
    whole_rows = any(op.kind == "softmax_online" for op in walk(kernel.body))
    uses = use_counts(kernel.body)
    defs = producers(kernel.body)
    fused: set[int] = set()
    for op in walk(kernel.body):
        if op.kind == "add" and len(op.operands) == 2 and not op.attrs:
            for acc, other in (op.operands, op.operands[::-1]):
                dot = defs.get(other.id)
                single = dot is not None and dot.kind == "dot" and uses.get(other.id) == 1
                if single and acc.type == op.result.type:
                    fused.add(other.id)
                    break

    def visit(op: Op, fma: bool) -> list[Op]:
        if op.kind == "dot" and op.result.id in fused:
            return []
        if op.kind == "dot":
            k_major = _k_major(*op.operands, defs)
            return [_with_mma(op, kernel, hw, op.operands[0], op.result.type, whole_rows,
                              k_major, fma)]  # fmt: skip
        if op.kind == "add" and any(v.id in fused for v in op.operands):
            dot_value = next(v for v in op.operands if v.id in fused)
            acc = next(v for v in op.operands if v is not dot_value)
            a, b = defs[dot_value.id].operands
            mma = Op("mma", (a, b, acc), op.results, defs[dot_value.id].attrs, (), (), op.span)
            return [_with_mma(mma, kernel, hw, a, op.result.type, whole_rows,
                              _k_major(a, b, defs), fma)]  # fmt: skip
        if op.kind == "softmax_accumulate":
            p, v = op.operands[3], op.operands[4]
            out = TileType((p.type.dims[0], v.type.dims[1]), op.results[0].type.dtype)
            return [_with_mma(op, kernel, hw, v, out, whole_rows, fma=fma)]
        return [op]

    body = rewrite(kernel.body, lambda op: visit(op, False))
    chosen = {op.attr("mma").inst for op in walk(body) if op.attr("mma") is not None}
    # The online softmax's row state meets every product's rows in the same threads: one
    # product that the instruction cannot tile puts them all on the FMA loop, and so does
    # a kernel that combines the row state itself (a logsumexp's running maximum and
    # sum), which only the FMA loop's rows hold as its row vectors do.
    combined = whole_rows and not any(op.kind == "softmax_accumulate" for op in walk(body))
    mixed = whole_rows and "fma" in chosen and len(chosen) > 1
    if mixed or (combined and chosen - {"fma"}):
        body = rewrite(kernel.body, lambda op: visit(op, True))
    return replace(kernel, body=body)


def _with_mma(
    op: Op, kernel: TileKernel, hw: Hardware, operand: Value, out: TileType, whole_rows: bool,
    k_major: bool = False, fma: bool = False,
) -> Op:  # fmt: skip
    # an @accum(bf16|f16) product rounds after each step, in k order: an FMA loop
    fma = fma or (op.attr("accum") is not None and hw.kind != "cpu")
    mma = _mma(kernel, hw, operand.type.dtype.name, out, whole_rows, k_major, fma)
    return replace(op, attrs=(*op.attrs, ("mma", mma)))


def _k_major(a: Value, b: Value, defs: dict[int, Op]) -> bool:
    """Whether a product's operands are both loads along ``k`` in whole rows of the
    swizzle: ``a`` as it is loaded, ``b`` transposed (``a @ b.T``). The stage pass puts
    such loads in shared memory, where wgmma reads them."""
    a_def, b_def = defs.get(a.id), defs.get(b.id)
    if a_def is None or b_def is None or b_def.kind != "transpose":
        return False
    b_load = defs.get(b_def.operands[0].id)
    depth = a.type.dims[1].constant
    return (
        a_def.kind == "load" and b_load is not None and b_load.kind == "load"
        and depth is not None and depth * a.type.dtype.bits // 8 % _SWIZZLE_ROW == 0
    )  # fmt: skip
