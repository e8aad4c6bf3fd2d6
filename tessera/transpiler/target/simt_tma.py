"""TMA copies on sm_90a: tensor maps, one mbarrier per pipeline stage, and the copies.

The Tile IR marks a pipelined loop's copies on sm_90a ``async = tma``. Where every such
copy of a kernel fits TMA (``tile/tma.py``), each becomes one ``cp.async.bulk.tensor``
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

A kernel with a producer warpgroup (``tile/specialize.py``) is emitted as two roles
(``specialized``): the producer issues every group of copies, after waiting on a second
barrier per stage for the computing warpgroups to free it, and all its threads arrive
on the first; the computing threads run the rest, and free a stage once the batch that
read it has been waited for. There is then no barrier at the top of the loop.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ...frozen import frozen
from ..graph.ir import Block, Op, Value
from ..tile.ir import Access, Slot
from .simt_layout import WARPGROUP, parenthesized, product, sw128_panel

__all__ = ["TensorMap", "TmaCopies"]

#: Bytes of one mbarrier.
_BARRIER_BYTES = 8
#: Registers per thread of a specialized kernel's roles (setmaxnreg, in steps of 8):
#: the producer needs few, and gives them to the computing warpgroups' accumulators.
_PRODUCER_REGISTERS, _COMPUTE_REGISTERS = 40, 232


#: What only the whole block may run: the producer has left by then.
_BLOCK_WIDE = re.compile(r"\b(__syncthreads|tsr_group_\w+)\(")


def _groups(ops: tuple[Op, ...]) -> list[list[Op]]:
    """The copies before a loop, as the groups their commits close."""
    groups: list[list[Op]] = [[]]
    for op in ops:
        if op.kind in ("copy", "commit"):
            groups[-1].append(op)
            if op.kind == "commit":
                groups.append([])
    return [g for g in groups if any(op.kind == "copy" for op in g)]


@frozen
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
        """The stages' barriers: one each, two with a producer warpgroup."""
        return _BARRIER_BYTES * (self.tma or 0) * (2 if self.kernel.producer else 1)

    def init_barriers(self) -> None:
        """The stages' barriers, initialized once before the first copy."""
        if "tsr_landed" in self.prologue:
            return
        stages, producer = self.tma or 0, self.kernel.producer
        self.declare(
            "tsr_landed",
            "unsigned long long* const tsr_landed = (unsigned long long*)"
            f"(tsr_smem + {self.barrier_offset});  // per stage: its copies have landed",
        )
        if producer:
            self.declare(
                "tsr_free",
                f"unsigned long long* const tsr_free = tsr_landed + {stages};"
                "  // per stage: the computing warpgroups are done with it",
            )
            self.line(f"// a stage's copies land once its {producer} producer threads have "
                      "arrived and the bytes")  # fmt: skip
            self.line("// thread 0 announced are in; it is free once every computing warpgroup "
                      "has arrived")  # fmt: skip
        else:
            self.line("// one arrival per stage: thread 0's, announcing the bytes its copies bring")
        self.open("if (lid == 0)")
        for stage in range(stages):
            arrivals = self.constants.producers[1] if producer else 1
            self.line(f"tsr_mbarrier_init(tsr_landed + {stage}, {arrivals});")
            if producer:
                computing = self.kernel.threads // (WARPGROUP * self.lanes)
                self.line(f"tsr_mbarrier_init(tsr_free + {stage}, {computing});")
        self.line("tsr_fence_mbarrier_init();")
        self.close()
        self.line(self.d.barrier)

    def specialized(self, body: Block) -> None:
        """A kernel with a producer warpgroup (``tile/specialize.py``), after the
        computing threads: it issues every stage's copies, the prologue's and then the
        loop's, each group once the computing warpgroups have freed its stage. The
        computing threads run everything else, the loop without its copies."""
        loop = next(op for op in body.ops if op.kind == "for")
        at = body.ops.index(loop)
        moves = ("alloc", "copy", "commit")
        self.block(replace(body, ops=tuple(op for op in body.ops if op.kind == "alloc")))
        self.init_barriers()
        threads = self.constants.threads[1]
        self.line(f"// warpgroup {self.kernel.threads // 128}: the producer, which only copies")
        self.open(f"if (lid >= {threads})")
        self.line(f"tsr_setmaxnreg_dec<{_PRODUCER_REGISTERS}>();")
        self.line(f"const int ptid = lid - {threads};")
        self.role, self.team = "producer", ("ptid", self.constants.producers[1])
        self.open_tiles(loop)
        # In a persistent kernel a tile's first stages may still hold the last tile's.
        for group in _groups(body.ops[:at]):
            self.producer_group(group, ahead=self.kernel.persistent)
        self.open(self.loop_header(loop))
        self.producer_group([op for op in loop.regions[0].ops if op.kind in moves], ahead=True)
        self.close()
        self.close_tiles()
        self.close()
        self.otherwise()
        self.line(f"tsr_setmaxnreg_inc<{_COMPUTE_REGISTERS}>();")
        self.role, self.team = "consumer", ("lid", threads)
        rest = [op for op in body.ops[:at] if op.kind not in moves] + list(body.ops[at:])
        start = len(self.lines)
        self.open_tiles(loop)
        self.block(replace(body, ops=tuple(rest)))
        self.close_tiles()
        blocking = [line for line in self.lines[start:] if _BLOCK_WIDE.search(line)]
        assert not blocking, f"a specialized kernel's computing threads wait for all: {blocking}"
        self.close()
        self.role = None

    def producer_group(self, ops: list[Op], ahead: bool = False) -> None:
        """One stage's copies and their commit, for an iteration that runs; a copy ahead
        in the loop first waits for the computing warpgroups to free the stage it fills
        (its previous use, ``stages`` iterations before)."""
        first = next(op for op in ops if op.kind == "copy" and op.attr("async"))
        # Copies before the loop that do not run ahead (attention's query tile) join the
        # first stage's group: its barrier covers them.
        self.tma_slot = self.stage_index(first.attr("slot"))
        live = self.runs(first)
        if live is not None:
            self.open(f"if ({live})")
        if ahead:
            slot: Slot = first.attr("slot")
            index, stages = parenthesized(self.c(self.pipelined(slot).index)), slot.stages
            self.line(f"if ({index} >= {stages}) tsr_mbarrier_wait(tsr_free + "
                      f"{self.stage_index(slot)}, ({index} / {stages} + 1) % 2);")  # fmt: skip
        self.block(replace(self.kernel.body, ops=tuple(ops)))
        if live is not None:
            self.close()

    def op_release(self, op: Op) -> None:
        """A computing warpgroup is done with a stage: one arrival per warpgroup (a
        ``lag`` of 1 frees the stage the iteration before read, none before the first)."""
        slot: Slot = op.attr("slot")
        guard = f"{self.c(self.pipelined(slot).index)} >= 0 && " if op.attr("lag") else ""
        lanes = self.named("WARP_SIZE", self.lanes)
        warpgroup = self.named("WARPGROUP", WARPGROUP * self.lanes, f"{WARPGROUP}*{lanes}")
        self.line(f"if ({guard}lid % {warpgroup} == 0) tsr_mbarrier_arrive(tsr_free + "
                  f"{self.stage_index(slot)});")  # fmt: skip

    def copy_tma(self, op: Op, aligned: str, when: str | None) -> None:
        """Thread 0 copies each 128-byte panel of the tile with one TMA instruction where
        the tensor allows; elsewhere every thread copies elements."""
        tensor, buf = op.operands
        at: Access = op.attr("at")
        rows, cols = (d.constant for d in buf.type.dims)
        assert rows is not None and cols is not None
        width, panel = sw128_panel(buf.type.dtype.bits), self.panel(buf.type.dtype.bits)
        rank = len(at.axes)
        self.tma_ranks.add(rank)
        tmap = self.tensor_map(tensor, (width, rows) + (1,) * (rank - 2))
        slot = self.stage_index(op.attr("slot"))
        if op.attr("async"):
            self.tma_slot = slot
        dst = self.forms[buf.id].name
        # The stage's start, in elements of the tile's named extents (BM*BK).
        stage = self.constants.count(buf.type, self.factor, slot=True)
        base = {"0": dst, "1": f"{dst} + {stage}"}.get(
            slot, f"{dst} + {parenthesized(slot)} * {stage}")  # fmt: skip
        # Offsets along the tile's axes count whole tiles by name (``BK``), as the
        # element copies' do.
        units = self.axis_units(at, buf.type)[-2:]
        row, col = (self.c(a.offset, u) for a, u in zip(at.axes[-2:], units, strict=True))
        index = [self.c(a.offset) for a in reversed(at.axes[:-2])]
        rows_panel = product((rows, self.smem_extents(buf.type)[0]), (width, panel))
        tid = self.team[0]
        self.open(f"if ({aligned})")
        self.open(f"if ({tid} == 0)")
        for p in range(cols // width):
            start = base if p == 0 else f"{base} + {_times(p, rows_panel)}"
            x = _times(p, panel)
            x = col if p == 0 else x if col == "0" else f"{col} + {x}"
            coords = ", ".join([x, row, *index])
            bar = f"tsr_landed + {self.tma_slot}"
            self.line(f"tsr_tma_load_{rank}d({start}, &{tmap.name}, {bar}, {coords});")
        self.close()
        self.close()
        self.otherwise()
        # Rolled, as the chunk copies' loop is: unrolled, its addresses stay live across
        # the loop the copy runs ahead in.
        self.line("#pragma unroll 1")
        self.copy_elements(op)
        if self.role == "producer":  # the computing threads read them through wgmma
            self.line("tsr_fence_async_shared();")
        self.close()
        live = aligned if when is None else f"{when} && {aligned}"
        bytes_ = self.stage_bytes(dst, stage, buf.type.dtype.bits)
        self.tma_group.append(f"{live} ? {bytes_} : 0")

    def stage_bytes(self, buffer: str, stage: str, bits: int) -> str:
        """The name of the bytes one stage of a shared buffer holds (``A_TILE_BYTES``),
        which the kernel declares after its tile sizes, from them (``BM*BK*2``): the
        count a stage's copies announce to its barrier."""
        if buffer not in self.stage_bytes_names:
            name = self.namer.fresh(f"{buffer.removesuffix('_smem').upper()}_BYTES")
            if bits == 8:
                size = stage
            elif bits % 8:  # a packed element: its bits, then the bytes they fill
                size = f"{stage}*{bits}/8"
            else:
                size = f"{stage}*{bits // 8}"
            self.stage_bytes_names[buffer] = (name, size)
        return self.stage_bytes_names[buffer][0]

    def commit_tma(self) -> None:
        """Thread 0 arrives on the stage's barrier with the bytes of the group's copies;
        in a producer warpgroup, every thread arrives (after its element copies, where a
        tensor needs them), thread 0 with the bytes."""
        announced = " + ".join(f"({term})" for term in self.tma_group) or "0"
        slot = self.tma_slot
        if self.role == "producer":
            bytes_ = f"ptid == 0 ? {announced} : 0"
            self.line(f"tsr_mbarrier_arrive_expect_tx(tsr_landed + {slot}, {bytes_});")
        else:
            self.line(f"if (lid == 0) tsr_mbarrier_arrive_expect_tx(tsr_landed + {slot}, "
                      f"{announced});")  # fmt: skip
        self.tma_group.clear()

    def wait_tma(self, op: Op) -> None:
        """Wait for the phase of the stage's barrier that the iteration's copies complete."""
        slot: Slot = op.attr("slot")
        self.released = slot
        parity = f"{parenthesized(self.c(self.pipelined(slot).index))} / {slot.stages} % 2"
        self.line(f"tsr_mbarrier_wait(tsr_landed + {self.stage_index(slot)}, {parity});")

    def tensor_map(self, tensor: Value, box: tuple[int, ...]) -> TensorMap:
        key = (tensor.id, box)
        if key not in self.tensor_maps:
            name = self.namer.fresh(f"{self.forms[tensor.id].name}_map", "map")
            self.tensor_maps[key] = TensorMap(
                name, tensor.name or "", tensor.type.dtype.name,
                tuple(str(d) for d in tensor.type.dims), box,
            )  # fmt: skip
        return self.tensor_maps[key]


def _times(count: int, size: str) -> str:
    """``count`` of ``size`` (a number or a product of names), as C: ``2*BK*PANEL``."""
    if size.isdigit():
        return str(count * int(size))
    return size if count == 1 else f"{count}*{size}"
