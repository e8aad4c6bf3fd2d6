"""TMA copies on sm_90a: tensor maps, one mbarrier per pipeline stage, and the copies.

The Tile IR marks a pipelined loop's copies on sm_90a ``async = tma``. Where every such
copy of a kernel fits TMA (``tma_stages``), each becomes one ``cp.async.bulk.tensor``
per 128-byte panel of its ``sw128`` buffer, issued by thread 0: the instruction writes
the panel in the 128-byte swizzle that ``wgmma`` reads, and fills the box's elements
past the tensor's edges with zeros, which is the edge masking. The host encodes one
tensor map per tensor and box (``TensorMap``, in the metadata) and passes it as a
``__grid_constant__`` parameter.

Each stage has an mbarrier past the planned buffers. A ``commit`` is thread 0's arrival
on the stage's barrier, announcing the bytes its copies bring; the ``wait`` at the top of
an iteration waits for the phase of its stage's barrier that this iteration's copies
complete (the ``n``-th use of a stage waits for parity ``n % 2``). The barrier after the
wait, as before, orders the reads of every thread after it and the next copies into a
slot after every read of it.

TMA needs the tensor's address and its rows to start on 16 bytes, which is the condition
of the 16-byte chunk copies (``chunks_aligned``); where a call's tensor misses it, the
same copy runs element by element, synchronously, and announces no bytes. A kernel
whose copies do not all fit (another layout, a tile that is not the tensor's last two
axes, more than one pipelined loop) keeps ``cp.async`` for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.ir import Op, Value, walk
from ..tile.ir import Access, SharedType, Slot, TileKernel
from .simt_layout import parenthesized, sw128_panel

__all__ = ["TensorMap", "TmaCopies", "tma_stages"]

#: TMA's limits: a box has at most 256 elements along each axis, a tensor five axes.
_MAX_BOX, _MAX_RANK = 256, 5
#: Bytes of one mbarrier.
_BARRIER_BYTES = 8


@dataclass(frozen=True)
class TensorMap:
    """A tensor map the host encodes for a kernel parameter: the tensor it describes (a
    parameter or buffer of the function, by its metadata name), its dtype and dims
    (outermost first, as the metadata writes dims), and the box one copy moves
    (innermost first, as the driver takes it), always in the 128-byte swizzle."""

    name: str
    tensor: str
    dtype: str
    dims: tuple[str, ...]
    box: tuple[int, ...]

    def meta(self) -> dict[str, object]:
        return {"name": self.name, "tensor": self.tensor, "dtype": self.dtype,
                "dims": list(self.dims), "box": list(self.box), "swizzle": "128B"}  # fmt: skip


def tma_stages(kernel: TileKernel) -> int | None:
    """The stages of the kernel's one pipelined loop, if all its copies fit TMA."""
    copies = [op for op in walk(kernel.body) if op.kind == "copy" and op.attr("async") == "tma"]
    loops = [op for op in walk(kernel.body) if op.kind == "for"
             and any(inner.kind == "wait" for inner in op.regions[0].ops)]  # fmt: skip
    if not copies or len(loops) != 1 or loops[0] not in kernel.body.ops:
        return None
    layouts = {s.buffer: s.layout for s in kernel.smem}
    stages = {op.operands[1].type.stages for op in copies}
    if len(stages) != 1 or not all(_fits(op, layouts) for op in copies):
        return None
    return stages.pop()


def _fits(copy: Op, layouts: dict[str, str]) -> bool:
    buf = copy.operands[1]
    t: SharedType = buf.type
    at: Access = copy.attr("at")
    tile_axes = [not a.index for a in at.axes]
    return (
        layouts.get(buf.name or "smem") == "sw128"
        and len(t.dims) == 2
        and all(d.constant is not None and d.constant <= _MAX_BOX for d in t.dims)
        and len(at.axes) <= _MAX_RANK
        and tile_axes == [False] * (len(at.axes) - 2) + [True, True]
    )


class TmaCopies:
    """The TMA forms of ``copy``, ``commit`` and ``wait``; mixed into the SIMT emitter."""

    #: The pipeline's stages when the kernel's copies go through TMA, else None.
    tma: int | None
    #: Where the stages' barriers start in the shared-memory arena.
    barrier_offset: int
    #: The tensor maps the kernel takes, by (tensor id, box).
    tensor_maps: dict[tuple[int, tuple[int, ...]], TensorMap]
    #: The bytes each copy since the last commit brings, as C expressions, and its stage.
    tma_group: list[str]
    tma_slot: str
    #: The ranks of the tensors copied, for the header's copy functions.
    tma_ranks: set[int]

    def barriers_bytes(self) -> int:
        return _BARRIER_BYTES * (self.tma or 0)

    def init_barriers(self) -> None:
        """The stages' barriers, initialized once before the first copy."""
        if "tsr_landed" in self.prologue:
            return
        self.declare(
            "tsr_landed",
            "unsigned long long* const tsr_landed = (unsigned long long*)"
            f"(tsr_smem + {self.barrier_offset});  // one mbarrier per stage",
        )
        self.line("// one arrival per stage: thread 0's, announcing the bytes its copies bring")
        self.open("if (lid == 0)")
        for stage in range(self.tma or 0):
            self.line(f"tsr_mbarrier_init(tsr_landed + {stage}, 1);")
        self.line("tsr_fence_mbarrier_init();")
        self.close()
        self.line(self.d.barrier)

    def copy_tma(self, op: Op, aligned: str, when: str | None) -> None:
        """Thread 0 copies each 128-byte panel of the tile with one TMA instruction where
        the tensor allows; elsewhere every thread copies elements."""
        tensor, buf = op.operands
        at: Access = op.attr("at")
        rows, cols = (d.constant for d in buf.type.dims)
        assert rows is not None and cols is not None
        panel = sw128_panel(buf.type.dtype.bits)
        rank = len(at.axes)
        self.tma_ranks.add(rank)
        tmap = self.tensor_map(tensor, (panel, rows) + (1,) * (rank - 2))
        self.tma_slot = slot = self.stage_index(op.attr("slot"))
        dst = self.forms[buf.id].name
        base, first = (dst, int(slot) * rows * cols) if slot.isdigit() else (
            f"{dst} + {parenthesized(slot)} * {rows * cols}", 0)  # fmt: skip
        row, col = (self.c(a.offset) for a in at.axes[-2:])
        index = [self.c(a.offset) for a in reversed(at.axes[:-2])]
        self.open(f"if ({aligned})")
        self.open("if (lid == 0)")
        for p in range(cols // panel):
            offset = first + p * rows * panel
            start = f"{base} + {offset}" if offset else base
            x = col if p == 0 else str(p * panel) if col == "0" else f"{col} + {p * panel}"
            coords = ", ".join([x, row, *index])
            self.line(
                f"tsr_tma_load_{rank}d({start}, &{tmap.name}, tsr_landed + {slot}, {coords});"
            )
        self.close()
        self.close()
        self.otherwise()
        # Rolled, as the chunk copies' loop is: unrolled, its addresses stay live across
        # the loop the copy runs ahead in.
        self.line("#pragma unroll 1")
        self.copy_elements(op)
        self.close()
        live = aligned if when is None else f"{when} && {aligned}"
        self.tma_group.append(f"{live} ? {rows * cols * buf.type.dtype.bits // 8} : 0")

    def commit_tma(self) -> None:
        """Thread 0 arrives on the stage's barrier with the bytes of the group's copies."""
        announced = " + ".join(f"({term})" for term in self.tma_group) or "0"
        self.line(f"if (lid == 0) tsr_mbarrier_arrive_expect_tx(tsr_landed + {self.tma_slot}, "
                  f"{announced});")  # fmt: skip
        self.tma_group.clear()

    def wait_tma(self, op: Op) -> None:
        """Wait for the phase of the stage's barrier that the iteration's copies complete."""
        slot: Slot = op.attr("slot")
        parity = f"{parenthesized(self.c(slot.index))} / {slot.stages} % 2"
        self.line(f"tsr_mbarrier_wait(tsr_landed + {self.stage_index(slot)}, {parity});")

    def stage_index(self, slot: Slot) -> str:
        if slot.index.constant is not None:
            return str(slot.index.constant % slot.stages)
        return f"({self.c(slot.index)}) % {slot.stages}"

    def tensor_map(self, tensor: Value, box: tuple[int, ...]) -> TensorMap:
        key = (tensor.id, box)
        if key not in self.tensor_maps:
            name = self.namer.fresh(f"{self.forms[tensor.id].name}_map", "map")
            self.tensor_maps[key] = TensorMap(
                name, tensor.name or "", tensor.type.dtype.name,
                tuple(str(d) for d in tensor.type.dims), box,
            )  # fmt: skip
        return self.tensor_maps[key]
