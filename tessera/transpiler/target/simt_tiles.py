"""Shared memory, products and online softmax on a SIMT target, as the ops of the emitter.

A staged operand is copied into its shared-memory buffer by every thread of the
program (a flat walk, zero past a masked edge) and read where it is used: a
``read`` is an expression over the buffer, in the layout the planner chose. A
product keeps its accumulator in the Grid distribution; each step of its
reduction loads a column of ``a`` and a row of ``b`` for the thread's register
block, then does ``rm x rn`` FMAs. An operand held in registers (the
probabilities of online softmax) goes through a shared-memory staging buffer
first, since each thread needs rows that other threads hold. Row maxima and sums
of a Grid tile combine the partials of the threads that share a row through a
shared scratch array.
"""

from __future__ import annotations

import math
from dataclasses import field, replace
from typing import Any

from ...frozen import frozen
from ..graph.dims import Dim
from ..graph.dtypes import DTYPES
from ..graph.ir import Op, Value
from ..schedule.hardware import GRID_COLUMNS, covers
from ..tile.ir import Access, Mma, SharedType, Slot
from ..tile.tma import fits_tma
from .simt_layout import (
    CHUNK_BYTES,
    MFMA_32X32,
    MMA_16X8,
    WARPGROUP,
    Distribution,
    Element,
    Flat,
    Form,
    FragmentRows,
    Fragments,
    Grid,
    NotLowered,
    Rows,
    grid_for,
    parenthesized,
    product,
    rows_of,
    smem_index,
    sw128_panel,
)

__all__ = ["TileOps", "SmemView", "Staged", "wgmma_start", "wgmma_leading", "WGMMA_FORMS"]

#: The 32x32 MFMA instructions of CDNA: the reduction step of one instruction, the
#: type of one lane's operand fragment, the dtype it multiplies, and how an element
#: becomes a fragment element: from a float, or from its stored bits in that dtype.
_MFMA = {
    "mfma_f32_32x32x8bf16_1k": (8, "tsr_bf16x4", "bf16", "(short)tsr_float_to_bf16({x})",
                                "(short){x}"),
    "mfma_f32_32x32x8f16": (8, "tsr_halfx4", "f16", "(_Float16)({x})",
                            "__builtin_bit_cast(_Float16, {x})"),
    "mfma_f32_32x32x2f32": (2, "float", "f32", "{x}", "{x}"),
}  # fmt: skip

#: NVIDIA's m16n8k16 products by the dtype they multiply (the Tile IR's ``mma.sync.bf16``
#: and ``wgmma.bf16`` alike): the header's function, and how an element becomes its
#: 16-bit operand from a float (its stored bits are that operand already).
_MMA_SYNC = {
    "bf16": ("tsr_mma_m16n8k16_bf16", "tsr_float_to_bf16({x})"),
    "f16": ("tsr_mma_m16n8k16_f16", "tsr_float_to_f16({x})"),
    "tf32": ("tsr_mma_m16n8k8_tf32", "__float_as_uint({x})"),
}
#: Rows of a ``wgmma`` product per warpgroup, and its step along k for 16-bit operands.
_WGMMA_M, _WGMMA_K = 64, 16
#: The ``wgmma`` forms by operand dtype: the step along k (32 bytes of each operand row),
#: the PTX type, and whether an operand may lie MN-major (the 16-bit types; fp8 operands
#: are K-major only: ``a`` as ``[m, k]``, ``b`` as ``[n, k]``).
WGMMA_FORMS = {
    "bf16": (16, "bf16", True),
    "f16": (16, "f16", True),
    "fp8_e4m3": (32, "e4m3", False),
    "fp8_e5m2": (32, "e5m2", False),
}
#: The widest ``wgmma`` (its n is a multiple of 8 up to this).
_WGMMA_N = 256


def _mma_sync_dtype(inst: str) -> str | None:
    """The dtype of an NVIDIA tensor-core instruction the emitter issues as mma.sync: a
    product planned on ``wgmma`` that cannot run on it runs on ``mma.sync`` too, an fp8
    one widened to f16, which holds every fp8 value."""
    family, _, dtype = inst.rpartition(".")
    if family == "wgmma" and dtype.startswith("fp8_"):
        return "f16"
    return dtype if family in ("mma.sync", "wgmma") and dtype in _MMA_SYNC else None


def _wgmma_dtype(inst: str) -> str | None:
    """The operand dtype of a ``wgmma`` instruction, or None for another instruction."""
    family, _, dtype = inst.rpartition(".")
    return dtype if family == "wgmma" and dtype in WGMMA_FORMS else None


@frozen
class SmemView:
    """A product's operand that is a read of a shared buffer: the buffer (``rows x cols``
    elements of ``bits`` in ``layout``), the slot read, and whether the operand is the
    buffer transposed. ``wgmma`` reads such an operand where it lies."""

    name: str
    rows: int
    cols: int
    bits: int
    dtype: str
    layout: str
    slot: str
    transposed: bool = False
    #: Its rows and columns as the code prints them (``BM``, ``BK``).
    extents: tuple[str, str] | None = None
    #: The ``read`` of the buffer, whose line a debug build's checks of it name.
    read: Op | None = field(default=None, compare=False, repr=False)

    def k_major(self, role: str) -> bool:
        """Whether ``k`` runs along the buffer's rows: operand ``a`` is ``[m, k]`` and
        ``b`` is ``[k, n]``, each stored as it is or transposed."""
        return (role == "a") != self.transposed


def wgmma_leading(view: SmemView, k_major: bool, panel: str) -> str | None:
    """The leading byte offset of a ``wgmma`` descriptor for an ``sw128`` operand, as
    the code prints it (``BK*PANEL*2``, where ``panel`` is ``PANEL``): an MN-major
    operand's next panel along m or n; a K-major one has none (a k step of 16 stays
    within one 128-byte row), and leaves it to the header's default (None). The stride
    step, eight rows of a panel (1024 bytes), is the same either way round: the
    header's."""
    if k_major:
        return None
    rows = view.extents[0] if view.extents else str(view.rows)
    return product(
        (view.rows, rows), (sw128_panel(view.bits), panel), (view.bits // 8, str(view.bits // 8))
    )


def wgmma_start(view: SmemView, k_major: bool, kk: str, mn0: str, panel: str) -> str:
    """The element offset where a ``wgmma`` step at reduction index ``kk`` starts, for
    the part of the operand from row (column) ``mn0`` of its m (n) axis: the buffer's
    element ``(mn0, kk)`` (K-major) or ``(kk, mn0)`` (MN-major) before the swizzle,
    which ``mn0`` and ``kk``, multiples of 8, leave where it is. ``panel`` is the
    elements of a panel's row as printed (``PANEL``)."""
    width = sw128_panel(view.bits)
    rows, cols = view.extents or (str(view.rows), str(view.cols))
    tile = product((view.rows, rows), (view.cols, cols))
    rows_panel = product((view.rows, rows), (width, panel))
    terms = [] if view.slot == "0" else [f"{parenthesized(view.slot)} * {tile}"]
    if k_major:
        if view.cols > width:
            terms.append(f"{kk} / {panel} * {rows_panel}")
        if mn0 != "0":
            terms.append(f"{parenthesized(mn0)} * {panel}")
        terms.append(f"{kk} % {panel}")
    else:
        if view.cols > width and mn0 != "0":
            terms.append(f"{parenthesized(mn0)} / {panel} * {rows_panel}")
        terms.append(f"{kk} * {panel}")
    return " + ".join(terms)


@frozen
class Staged:
    """A tile held in registers that ``stage_all`` writes to a shared buffer: the
    buffer's name, where the tile lies, its shape (constant), the dtype the buffer stores,
    and the thread's element at an index of the walk over ``dist``."""

    name: str
    dist: Distribution
    shape: tuple[int, ...]
    dtype: str
    value: Element


class TileOps:
    """The ops of distributed tiles; mixed into the SIMT emitter, whose state they use."""

    forms: dict[int, Form]
    uses: dict[int, int]
    #: The planned layout of each shared buffer, by value id.
    layouts: dict[int, str]
    #: Reads of shared memory as the stored bits, unconverted, by value id.
    bits: dict[int, Element]
    #: Reads of shared memory (and their transposes) as operands of a product.
    views: dict[int, SmemView]
    #: The ``wgmma`` functions the kernel calls: (dtype, n, "ss" or "rs").
    wgmma: set[tuple[str, int, str]]
    #: Whether products may read shared memory through ``wgmma``.
    async_reads: bool
    #: Whether a ``wgmma`` product left batches running past its loop's iteration.
    in_flight: bool
    #: The flag that says a tensor's rows are aligned for 16-byte copies, by value id.
    aligned: dict[int, str]
    #: The planned layout of each shared buffer, by buffer name.
    planned: dict[str, str]
    #: In a kernel with a producer warpgroup, the role being emitted: "producer" or
    #: "consumer" (None elsewhere), and the threads a Flat walk spreads over.
    role: str | None
    team: tuple[str, str]
    #: The alignment of the shared-memory arena, in bytes.
    arena_align: int
    #: Bytes of shared memory of the planned arena, and of the staging buffers that no
    #: schedule planned (``stage_all``).
    smem_bytes: int
    unplanned_smem_bytes: int

    # -- shared memory ---------------------------------------------------------------------

    def op_alloc(self, op: Op) -> None:
        buf = op.result
        t: SharedType = buf.type
        plan = next(s for s in self.kernel.smem if s.buffer == (buf.name or "smem"))
        self.declare_arena()
        name = self.namer.fresh(buf.name, "smem")
        storage = self.d.storage[t.dtype.name]
        self.declare(name, self.d.local_view(storage, name, "tsr_smem", plan.offset))
        self.forms[buf.id] = Form("shared", tuple(t.dims), name)
        self.layouts[buf.id] = plan.layout

    def declare_arena(self) -> None:
        """The shared-memory arena of ``smem_bytes``, declared again where a staging
        buffer has grown it since (``stage_all``)."""
        # (16 bytes: aligned for the chunks that copies move)
        align = str(self.arena_align)
        if self.arena_align == CHUNK_BYTES:
            align = self.named("CHUNK_BYTES", CHUNK_BYTES)
        total = self.smem_bytes
        if self.d.launched_locals:
            self.locals["tsr_smem"] = (self.d.byte_type, "tsr_smem", total, self.arena_align)
        else:  # in its place, before the views of its buffers
            self.prologue["tsr_smem"] = self.d.local_bytes("tsr_smem", total, align)

    def slot_index(self, buf: Value, slot: Slot) -> str:
        return self.stage_index(replace(slot, stages=buf.type.stages))

    def stage_index(self, slot: Slot) -> str:
        """The pipeline stage (a buffer's slot, a stage's barrier) an iteration uses."""
        slot = self.pipelined(slot)
        if slot.stages == 1 or slot.index.constant is not None:
            return str((slot.index.constant or 0) % slot.stages)
        return f"({self.c(slot.index)}) % {slot.stages}"

    def smem_element(self, buf: Value, slot: Slot, op: Op | None = None) -> Element:
        """Where an element of a slot lies; ``op`` is the access, which a debug build
        checks."""
        t: SharedType = buf.type
        layout = self.layouts[buf.id]
        at = self.slot_index(buf, slot)
        extents = tuple(d.constant for d in t.dims[-2:])
        name = self.forms[buf.id].name
        named, chunk = self.smem_extents(t), self.chunk_elements(t.dtype.bits)
        panel = self.panel(t.dtype.bits) if layout == "sw128" else None

        def element(index: tuple[str, ...]) -> str:
            index = self.shared_coords(op, name, extents, index)
            i, j = index if len(index) == 2 else ("0", index[0])
            return smem_index(layout, t.dims, t.dtype.bits, at, i, j, named, chunk, panel)

        return element

    def chunk_elements(self, bits: int) -> str:
        """The elements of ``bits`` that a 16-byte chunk holds: ``CHUNK_BYTES`` of 1-byte
        elements, which would repeat the chunk's 16 in every swizzled address, the
        number of wider ones."""
        per = CHUNK_BYTES * 8 // bits
        return self.named("CHUNK_BYTES", CHUNK_BYTES) if per == CHUNK_BYTES else str(per)

    def panel(self, bits: int) -> str:
        """The elements of ``bits`` in a row of a ``sw128`` panel (128 bytes) by the
        name the kernel declares, ``PANEL``; the number where the kernel's panels
        differ in it (buffers of two element sizes)."""
        width = sw128_panel(bits)
        held = self.numbers.get("PANEL")
        return str(width) if held is not None and held[0] != width else self.named("PANEL", width)

    def smem_extents(self, t: SharedType) -> tuple[str, str]:
        """The rows and columns of a slot of a shared buffer of type ``t``, as the code
        prints them: the names of the tiles they are (``BN``, ``BD``)."""
        dims = self.constants.shape(t)
        rows, cols = dims[-2:] if len(dims) > 1 else (Dim.const(1), dims[0])
        return self.c(rows), self.c(cols)

    def op_copy(self, op: Op) -> None:
        """A copy of a tile from global into shared memory, in 16-byte chunks where its
        shape allows. A copy ahead runs asynchronously where the dialect can
        (``async_copy``)."""
        if self.role == "consumer":
            return  # the producer warpgroup copies
        # A producer also moves the copies that do not run ahead through TMA if it can.
        tma = self.tma is not None and (
            op.attr("async") == "tma" or (self.role == "producer" and fits_tma(op, self.planned))
        )
        if tma:
            self.init_barriers()
        # A producer's group of copies is already under the iteration's condition.
        live = None if self.role == "producer" else self.runs(op)
        if live is not None:
            self.open(f"if ({live})")
        self.check_bounds(op)
        aligned = self.chunks_aligned(op)
        if aligned is None:
            self.copy_elements(op)
        elif tma:
            self.copy_tma(op, aligned, live)
        else:
            self.copy_chunks(op, aligned)
        if live is not None:
            self.close()

    def runs(self, copy: Op) -> str | None:
        """The condition under which a copy ahead runs (its ``when``), or None."""
        when = copy.attr("when")
        if when is None:
            return None
        # the start of the tile it copies, along the axis whose offset it is
        at: Access = copy.attr("at")
        units = self.axis_units(at, copy.operands[1].type)
        size = next((u for a, u in zip(at.axes, units, strict=True) if a.offset == when.start),
                    None)  # fmt: skip
        live = f"{self.c(when.start, size)} < {self.c(when.extent)}"
        if when.stop is not None:
            live += f" && {self.c(when.stop[0])} < {self.c(when.stop[1])}"
        return live

    def axis_units(self, at: Access, t: Any) -> list[Dim | None]:
        """The tile that each axis of an access to a tile of type ``t`` steps in: the
        name of the schedule's tile where ``t`` says its dim is one (``BK``, though
        ``BM`` has the same size), else the axis's size; None along an indexed axis."""
        tiles = iter(self.constants.shape(t))
        units: list[Dim | None] = []
        for axis in at.axes:
            if axis.index:
                units.append(None)
                continue
            name = next(tiles, None)
            units.append(axis.size if name is None or name.constant is not None else name)
        return units

    def copy_elements(self, op: Op) -> None:
        tensor, buf = op.operands
        place = self.smem_element(buf, op.attr("slot"), op)
        dtype, src, dst = buf.type.dtype.name, self.forms[tensor.id].name, self.forms[buf.id].name
        index = self.walk(Flat(tuple(buf.type.dims)), buf.type)
        offset, condition = self.address(tensor, op.attr("at"), index, buf.type)
        if tensor.type.dtype != buf.type.dtype:  # unpacked (i4 into bytes) as it is copied
            value = self.d.read(tensor.type.dtype.name, src, offset)
            value = f"{condition} ? {value} : 0.0f" if condition else value
            self.line(self.d.write(dtype, dst, place(index), value))
        else:
            self.line(self.d.copy(dtype, dst, place(index), src, offset, condition))
        self.close_walk()

    def chunks_aligned(self, op: Op) -> str | None:
        """The run-time condition under which a copy can move whole 16-byte chunks, or
        None where its shape rules chunks out: a tile row must be whole chunks, and read
        along the tensor's contiguous last axis, from and up to a chunk's edge (a block of
        a row, as a head's columns, too). Every buffer layout keeps a chunk whole."""
        tensor, buf = op.operands
        at: Access = op.attr("at")
        per = CHUNK_BYTES * 8 // buf.type.dtype.bits
        chunk = self.chunk_elements(buf.type.dtype.bits)
        cols = buf.type.dims[-1].constant
        if at.axes[-1].index or cols is None or cols % per or len(buf.type.dims) > 2:
            return None
        if tensor.type.dtype != buf.type.dtype:
            return None
        if tensor.id not in self.aligned:
            name, row = self.forms[tensor.id].name, tensor.type.dims[-1]
            terms = [f"tsr_aligned16({name})"]
            if not (row / per).is_integral:
                terms.append(f"{self.c(row)} % {chunk} == 0")
            flag = self.aligned[tensor.id] = self.namer.fresh(f"{name}_aligned")
            self.declare(flag, f"const bool {flag} = {' && '.join(terms)};")
        condition = self.aligned[tensor.id]
        start, end = at.axes[-1].offset, at.axes[-1].extent
        if not (start / per).is_integral:
            condition += f" && ({self.c(start)}) % {chunk} == 0"
        width = end - start
        if at.axes[-1].masked and end != tensor.type.dims[-1] and not (width / per).is_integral:
            # a block of the row (a head of [S, H*D]) ends where a chunk may go on into
            # the next block: whole chunks only where it is whole chunks wide too
            condition += f" && ({self.c(width)}) % {chunk} == 0"
        return condition

    def copy_chunks(self, op: Op, aligned: str) -> None:
        """The copy as 16-byte chunks, one per thread in turn. Where the tensor's rows are
        ``aligned`` a chunk moves whole: rows are then whole chunks, so a chunk is live
        or wholly past a ragged edge, where it reads nothing and is zero. Elsewhere the
        thread copies the chunk's elements one by one, each masked on its own. Both ways
        share the loop, so that the compiler keeps one set of addresses."""
        tensor, buf = op.operands
        at: Access = op.attr("at")
        place = self.smem_element(buf, op.attr("slot"), op)
        dtype, src, dst = buf.type.dtype.name, self.forms[tensor.id].name, self.forms[buf.id].name
        per, chunk = CHUNK_BYTES * 8 // buf.type.dtype.bits, self.chunk_elements(
            buf.type.dtype.bits
        )
        rows = len(buf.type.dims) > 1
        cols = self.smem_extents(buf.type)[1]
        # the chunks of a row and of the tile: numbers, or the tiles' names divided
        row_chunks = str(int(cols) // per) if cols.isdigit() else f"({cols} / {chunk})"
        chunks = self.count(buf.type)
        chunks = str(int(chunks) // per) if chunks.isdigit() else f"{chunks} / {chunk}"
        # A loop the compiler keeps rolled, as the element copies' is: unrolled, it keeps
        # every chunk's address live across the loop the copy runs ahead in.
        self.open(f"for (int e = lid; e < {chunks}; e += {self.constants.threads[1]})")
        if rows:
            self.line(f"const int i = e / {row_chunks};")
            self.line(f"const int j = e % {row_chunks} * {chunk};")
        else:
            self.line(f"const int j = e * {chunk};")
        index = ("i", "j") if rows else ("j",)
        offset, live = self.address(tensor, at, index, buf.type)
        chunk_bytes = self.named("CHUNK_BYTES", CHUNK_BYTES)
        source, bytes_ = f"{src} + {offset}", chunk_bytes
        self.open(f"if ({aligned})")
        if live:
            self.line(f"const int bytes = {live} ? {chunk_bytes} : 0;")
            source, bytes_ = f"bytes ? {src} + {parenthesized(offset)} : {src}", "bytes"
        function = "tsr_copy_async16" if op.attr("async") and self.d.async_copy else "tsr_copy16"
        self.line(f"{function}({dst} + {parenthesized(place(index))}, {source}, {bytes_});")
        self.close()
        self.otherwise()
        self.unroll()
        self.open(f"for (int q = 0; q < {chunk}; ++q)")
        element = (*index[:-1], "j + q")
        offset, condition = self.address(tensor, at, element, buf.type)
        self.line(self.d.copy(dtype, dst, place(element), src, offset, condition))
        self.close()
        self.close()
        self.close()

    def op_commit(self, op: Op) -> None:
        """The copies ahead issued so far are one group; synchronous copies need nothing."""
        if self.role == "consumer":
            return
        if self.tma is not None:
            self.commit_tma()
        elif self.d.async_copy:
            self.line("tsr_copy_commit();")

    def op_wait(self, op: Op) -> None:
        """Wait for all but the newest ``pending`` groups: the copies of the iteration about
        to read. The barrier after it makes them visible to every thread."""
        if self.tma is not None:
            self.wait_tma(op)
        elif self.d.async_copy:
            self.line(f"tsr_copy_wait<{op.attr('pending')}>();")

    def op_read(self, op: Op) -> None:
        buf = op.operands[0]
        place = self.smem_element(buf, op.attr("slot"), op)
        name, dtype = self.forms[buf.id].name, buf.type.dtype.name
        self.lazy(op.result, lambda index: self.d.read(dtype, name, place(index)))
        self.bits[op.result.id] = lambda index: f"{name}[{place(index)}]"
        t: SharedType = buf.type
        rows, cols = (d.constant for d in t.dims[-2:]) if len(t.dims) > 1 else (None, None)
        if rows is not None and cols is not None:
            slot = self.slot_index(buf, op.attr("slot"))
            self.views[op.result.id] = SmemView(
                name, rows, cols, t.dtype.bits, dtype, self.layouts[buf.id], slot,
                extents=self.smem_extents(t), read=op,
            )  # fmt: skip

    def op_barrier(self, op: Op) -> None:
        """A barrier; in a kernel whose products read shared memory through ``wgmma``
        (the async proxy), the thread's own stores are fenced into that proxy first, so
        that the instruction sees what the copies wrote."""
        if self.async_reads:
            self.line("tsr_fence_async_shared();")
        self.line(self.d.barrier)

    def op_transpose(self, op: Op) -> None:
        x = self.forms[op.operands[0].id]
        if x.kind == "owned" or (x.kind == "lazy" and x.dist is not None):
            # held in registers (attention's probabilities, in its backward pass): each
            # thread reads elements that others hold, so they go through shared memory
            element, bits = self.through_shared(op.operands[0])
            self.lazy(op.result, lambda index: element(index[::-1]))
            self.bits[op.result.id] = lambda index: bits(index[::-1])
            return
        if x.kind != "lazy":
            raise NotLowered(f"a transpose of a {x.kind} value")
        element = x.element
        assert element is not None
        self.lazy(op.result, lambda index: element(index[::-1]), op.operands[0])
        bits = self.bits.get(op.operands[0].id)
        if bits is not None:
            self.bits[op.result.id] = lambda index: bits(index[::-1])
        view = self.views.get(op.operands[0].id)
        if view is not None:
            self.views[op.result.id] = replace(view, transposed=not view.transposed)

    # -- products --------------------------------------------------------------------------

    def product_dist(self, op: Op, dims: tuple[Dim, ...]) -> Grid | Fragments:
        """Where a product's result lives: the matrix instruction's fragments, or the Grid
        of the FMA loop. A ``wgmma`` warpgroup's accumulator is its four warps' m16n8
        fragments, rows of 16 apiece."""
        mma: Mma = op.attr("mma")
        if mma.inst == "fma":
            return grid_for(dims, self.kernel.threads)
        rows, cols = (d.constant for d in dims)
        assert rows is not None and cols is not None
        wm, wn = mma.warps
        if mma.inst in _MFMA:
            shape = MFMA_32X32
        elif _mma_sync_dtype(mma.inst) is not None:
            shape = MMA_16X8
            wm *= WARPGROUP if mma.inst.startswith("wgmma") else 1
        else:
            raise NotLowered(f"the matrix instruction {mma.inst}")
        if not covers((shape.m, shape.n), rows, cols, (wm, wn)):
            raise NotLowered(f"a {rows}x{cols} product over {wm}x{wn} warps of {mma.inst}")
        names = self.constants.shape(op.results[0].type)[-2:]
        dist = Fragments(rows, cols, wm, wn, shape, (self.c(names[0]), self.c(names[1])))
        for name, value in dist.numbers().items():
            self.named(name, value)
        return dist

    def op_dot(self, op: Op) -> None:
        a, b = op.operands
        name = self.namer.fresh(op.result.name, "dot")
        dist = self.product_dist(op, tuple(op.result.type.dims))
        share = self.share(dist, op.result.type)
        self.line(f"float {name}[{share}];")
        self.line(f"for (int t = 0; t < {share}; ++t) {name}[t] = 0.0f;")
        self.multiply(op, a, b, name, dist)
        self.forms[op.result.id] = Form("owned", tuple(op.result.type.dims), name, dist=dist)

    def op_mma(self, op: Op) -> None:
        a, b, acc = op.operands
        form = self.accumulator(op, acc, op.result)
        assert isinstance(form.dist, (Grid, Fragments))
        self.multiply(op, a, b, form.name, form.dist)
        self.forms[op.result.id] = form

    def multiply(self, op: Op, a: Value, b: Value, acc: str, dist: Grid | Fragments) -> None:
        """``acc += a @ b``: on ``wgmma`` straight from shared memory where both operands
        lie there in its layout, else through the operands' elements."""
        a_view, b_view, depth = self.views.get(a.id), self.views.get(b.id), a.type.dims[1]
        # the reduction's extent as the loops print it: the tile's name (``BK``)
        named = self.constants.shape(a.type)[1]
        if a_view is not None and self.wgmma_ready(op, dist, depth, b_view, a_view):
            assert b_view is not None and isinstance(dist, Fragments)
            self.wgmma_product(op, a_view, b_view, named, acc, dist)
            return
        if not self.wgmma_ready(op, dist, depth, b_view):
            views = (self.loadable(op, a_view), self.loadable(op, b_view))
            self.product(op, self.operand(a, op), self.operand(b, op), named, acc, dist, views)
            return
        assert b_view is not None and isinstance(dist, Fragments) and depth.constant is not None
        # a lies elsewhere: its fragments for every step are loaded first, into registers
        # that no step overwrites while the batch runs.
        frag = self.namer.fresh(f"{a.name or 'a'}_frag")
        self.line(f"unsigned {frag}[{depth.constant // _WGMMA_K}][4];")
        self.unroll()
        mma_k = self.named("MMA_K", _WGMMA_K)
        self.open(f"for (int kk = 0; kk < {self.c(named)}; kk += {mma_k})")
        row, k = f"{dist.warp_row}lane / 4", "kk + lane % 4 * 2"
        self.a_fragment(f"{frag}[kk / {mma_k}]", self.operand(a, op), row, k)
        self.close()
        self.wgmma_product(op, frag, b_view, named, acc, dist)

    def accumulator(self, op: Op, acc: Value, result: Value) -> Form:
        """Where a product accumulates: in ``acc``'s own array when nothing else reads it
        (a loop's accumulator), else in a copy."""
        form = self.forms[acc.id]
        dist = self.product_dist(op, tuple(result.type.dims))
        if form.kind == "owned" and form.dist == dist and self.uses.get(acc.id) == 1:
            return form
        return self.materialize(acc, dist, self.namer.fresh(self.temps.wanted(result), "v"))

    def operand(self, x: Value, op: Op) -> Element:
        """An operand of ``op``'s product, readable at any index by any thread: one held
        in registers goes through shared memory first."""
        form = self.forms[x.id]
        if form.kind != "lazy" or form.dist is not None:
            element, bits = self.through_shared(x)
            return self.fragment_element(op, element, bits, "f32")
        assert form.element is not None
        return self.fragment_element(op, form.element, self.bits.get(x.id), x.type.dtype.name)

    def through_shared(self, x: Value) -> tuple[Element, Element]:
        """A tile held in registers (or computed from such), written to a shared staging
        buffer as f32 so that any thread can read any element: (element, bits)."""
        form = self.forms[x.id]
        name = self.namer.fresh(self.temps.wanted(x), "held")
        if form.kind == "lazy" and form.dist is not None:
            form = self.materialize(x, form.dist, name)
        if form.kind != "owned" or not isinstance(form.dist, (Grid, Fragments)):
            raise NotLowered("a product of a value held in registers")
        return self.stage(f"{name}_stage", form.dist, f"{form.name}[t]", "f32")

    def fragment_element(
        self, op: Op, element: Element, bits: Element | None, dtype: str
    ) -> Element:
        """An operand element as ``op``'s instruction takes it: a float for the FMA loop,
        else an element of the instruction's fragment type, taken from the stored bits
        (``bits``) where they hold the instruction's dtype."""
        inst = op.attr("mma").inst
        if inst == "fma":
            return element
        if inst in _MFMA:
            _, _, want, from_float, from_bits = _MFMA[inst]
        else:
            want = _mma_sync_dtype(inst) or ""
            from_float, from_bits = _MMA_SYNC[want][1], "{x}"
        # tf32's stored bits are an f32's: they go into the register as floats do.
        if bits is not None and dtype == want and want != "tf32":
            return lambda index: from_bits.format(x=bits(index))
        return lambda index: from_float.format(x=element(index))

    def product(
        self, op: Op, a: Element, b: Element, depth: Dim, acc: str, dist: Grid | Fragments,
        views: tuple[SmemView | None, SmemView | None] = (None, None),
    ) -> None:  # fmt: skip
        """``acc += a @ b``; the reduction stops at the live corner, since the operands
        are zero past it. ``views`` are the operands that ``mma.sync`` may load with
        ``ldmatrix``; ``depth`` is the reduction's extent as the loop prints it (``BK``,
        a tile's name, where it is one)."""
        bound = self.reduction_bound(op, depth)
        inst = op.attr("mma").inst
        if isinstance(dist, Fragments) and inst in _MFMA:
            self.mfma_product(inst, a, b, bound, acc, dist)
            return
        if isinstance(dist, Fragments):
            function = _MMA_SYNC[_mma_sync_dtype(inst) or ""][0]
            self.mma_sync_product(function, views[0] or a, views[1] or b, bound, acc, dist)
            return
        rm, rn = self.block_rows(dist.rows, dist.ty, op.results[0].type), dist.rn
        self.place_in_grid()
        self.open(f"for (int kk = 0; {bound}; ++kk)")
        self.line(f"float a_k[{rm}], b_k[{rn}];")
        ty, tx = self.grid_threads()
        row, col = f"ty + r * {ty}", f"tx + c * {tx}"
        self.line(f"for (int r = 0; r < {rm}; ++r) a_k[r] = {a((row, 'kk'))};")
        self.line(f"for (int c = 0; c < {rn}; ++c) b_k[c] = {b(('kk', col))};")
        self.open(f"for (int r = 0; r < {rm}; ++r)")
        slot = f"{acc}[r * {rn} + c]"
        step = f"{self.d.fma}(a_k[r], b_k[c], {slot})"
        accum = op.attr("accum")  # @accum(bf16): the running sum rounded after each step
        step = step if accum is None else self.d.round(accum.name, step)
        self.line(f"for (int c = 0; c < {rn}; ++c) {slot} = {step};")
        self.close()
        self.close()

    def reduction_bound(self, op: Op, depth: Dim) -> str:
        """The condition on ``kk`` under which a product's reduction goes on."""
        live = op.attr("live")
        bound = f"kk < {self.c(depth)}"
        if live is not None and live.k is not None:
            bound += f" && kk < {self.c(live.k)}"
        return bound

    def wgmma_ready(
        self,
        op: Op,
        dist: Grid | Fragments,
        depth: Dim,
        b: SmemView | None,
        a: SmemView | None = None,
    ) -> bool:
        """Whether ``op`` runs on ``wgmma`` with ``b`` (and ``a``, when given) read from
        shared memory: each warpgroup owns 64 whole rows of the result, the reduction
        is whole steps of the instruction, and the operands lie in the 128-byte swizzle
        in the instruction's dtype, K-major where it takes no other (fp8: ``a`` from
        shared memory too)."""
        dtype = _wgmma_dtype(op.attr("mma").inst)
        if dtype is None:
            return False
        step, _, transposable = WGMMA_FORMS[dtype]
        if depth.constant is None or depth.constant % step:
            return False
        if not transposable and (
            a is None or b is None or not a.k_major("a") or not b.k_major("b")
        ):
            return False
        if not isinstance(dist, Fragments) or dist.wn != 1 or dist.fm != 1:
            return False
        if dist.cols % dist.shape.n or dist.cols > _WGMMA_N:
            return False
        views = (b,) if a is None else (a, b)
        return all(v is not None and v.layout == "sw128" and v.dtype == dtype for v in views)

    def descriptor(self, view: SmemView, role: str, kk: str, mn0: str) -> str:
        """A ``wgmma`` matrix descriptor of ``view`` for the step at ``kk``."""
        k_major = view.k_major(role)
        panel = self.panel(view.bits)
        leading = wgmma_leading(view, k_major, panel)
        start = f"{view.name} + {wgmma_start(view, k_major, kk, mn0, panel)}"
        return (
            f"tsr_wgmma_desc({start})" if leading is None else f"tsr_wgmma_desc({start}, {leading})"
        )

    def wgmma_product(
        self,
        op: Op,
        a: SmemView | str,
        b: SmemView,
        depth: Dim,
        acc: str,
        dist: Fragments,
    ) -> None:
        """``acc += a @ b`` on ``wgmma``: each warpgroup's 64 rows by the tile's columns,
        one instruction per step of 16 along the whole tile's ``k`` (``depth``, printed
        as ``product`` prints it). A run-time bound
        (the live corner) would put the instructions on a path that ptxas takes for
        divergent and serializes; the operands are zero past it anyway. ``b`` is read
        from shared memory through a descriptor; ``a`` too when it is a view ("ss"), or
        from registers when it is a name ("rs": ``name[kk / 16]`` holds the lane's four
        packed pairs, as ``mma.sync`` takes them). The accumulator is the warp's m16n8
        fragments along its columns, as the instruction keeps it. The steps are issued
        back to back as one group; the fence before them orders the registers they
        read. The warpgroup then waits until the product's ``in_flight`` groups are
        left running: none, or in a pipelined GEMM loop, this one."""
        dtype = _wgmma_dtype(op.attr("mma").inst) or ""
        step, _, transposable = WGMMA_FORMS[dtype]
        form = "ss" if isinstance(a, SmemView) else "rs"
        n = dist.cols
        self.wgmma.add((dtype, n, form))
        self.place_in_wave()
        rows = f"wave / {WARPGROUP} * {self.named('WGMMA_M', _WGMMA_M)}"
        b_desc = self.descriptor(b, "b", "kk", "0")
        trans_b = int(not b.k_major("b"))
        self.line("tsr_wgmma_fence();")
        self.unroll()
        self.open(f"for (int kk = 0; kk < {self.c(depth)}; kk += {self.named('WGMMA_K', step)})")
        function = f"tsr_wgmma_m{_WGMMA_M}n{n}k{step}_{dtype}_{form}"
        if isinstance(a, SmemView):
            a_desc = self.descriptor(a, "a", "kk", rows)
            trans_a = int(not a.k_major("a"))
            modes = f"<{trans_a}, {trans_b}>" if transposable else ""
            self.line(f"{function}{modes}({acc}, {a_desc}, {b_desc});")
        else:
            mma_k = self.named("MMA_K", _WGMMA_K)
            self.line(f"{function}<{trans_b}>({acc}, {a}[kk / {mma_k}], {b_desc});")
        self.close()
        self.line("tsr_wgmma_commit();")
        in_flight = op.attr("mma").in_flight
        self.line(f"tsr_wgmma_wait<{in_flight}>();")
        self.in_flight = self.in_flight or in_flight > 0

    def op_wait_mma(self, op: Op) -> None:
        """Wait for the batches of an asynchronous product left running (``wgmma``);
        where the product ran on another instruction, none were."""
        if self.in_flight:
            self.line(f"tsr_wgmma_wait<{op.attr('pending')}>();")

    def mfma_product(
        self, inst: str, a: Element, b: Element, bound: str, acc: str, dist: Fragments
    ) -> None:
        """Each wave's fragments, one MFMA per pair of 32-row and 32-column strips and
        ``k`` step. Lane ``l`` feeds row (column) ``l % 32`` of its strip, at reduction
        steps ``per_lane * (l / 32) + q``; the accumulator goes through a 16-wide vector
        for the instruction and back to the thread's slots."""
        step, vector = _MFMA[inst][:2]
        per_lane = step // 2
        self.place_in_wave()
        row = f"{dist.warp_row}fm * TSR_MMA_M + lane % TSR_MMA_M"
        col = f"{dist.warp_col}fn * TSR_MMA_N + lane % TSR_MMA_N"
        k = "kk + lane / TSR_MMA_M" if per_lane == 1 else f"kk + lane / TSR_MMA_M * {per_lane} + q"
        self.open(f"for (int kk = 0; {bound}; kk += {self.named('MMA_K', step)})")
        self.unroll()
        self.open(f"for (int fm = 0; fm < {dist.fm_text}; ++fm)")
        self.fragment("a_frag", vector, per_lane, a((row, k)))
        self.unroll()
        self.open(f"for (int fn = 0; fn < {dist.fn_text}; ++fn)")
        self.fragment("b_frag", vector, per_lane, b((k, col)))
        slots = f"{acc}[(fm * {parenthesized(dist.fn_text)} + fn) * TSR_MMA_REGS + reg]"
        self.line("tsr_floatx16 frag_acc;")
        self.line(f"for (int reg = 0; reg < TSR_MMA_REGS; ++reg) frag_acc[reg] = {slots};")
        self.line(f"frag_acc = __builtin_amdgcn_{inst}(a_frag, b_frag, frag_acc, 0, 0, 0);")
        self.line(f"for (int reg = 0; reg < TSR_MMA_REGS; ++reg) {slots} = frag_acc[reg];")
        self.close()
        self.close()
        self.close()

    def mma_sync_product(
        self, function: str, a: SmemView | Element | str, b: SmemView | Element, bound: str,
        acc: str, dist: Fragments, steps: int = 1,
    ) -> None:  # fmt: skip
        """Each warp's m16n8 fragments, one ``mma.sync`` m16n8k16 per fragment and ``k``
        step. Lane ``l`` holds pairs of neighbouring ``k`` (packed in 32 bits, the lower
        ``k`` in the low half): of ``a`` rows ``l / 4`` and ``l / 4 + 8`` of its strip, of
        ``b`` column ``l / 4``, at ``k`` steps ``2 (l % 4)`` and ``2 (l % 4) + 8``. tf32
        runs m16n8k8, one element a register, at ``k`` steps ``l % 4`` and ``l % 4 + 4``. A
        step loads the warp's ``a`` strips once and streams its ``b`` fragments past
        them: the strips are fewer registers than a warp's ``b`` fragments. An operand
        in shared memory in the instruction's dtype (a ``SmemView``) is loaded with
        ``ldmatrix``, others element by element. ``a`` may be the name of the warp's
        fragments, loaded already: ``a[s]`` is the one strip's ``s``-th step of
        ``steps``. A step's registers are chosen by comparing ``kk``, not indexed by it:
        an array indexed by a variable of a loop that does not unroll (its bound is the
        live corner's) would live in local memory."""
        self.place_in_wave()
        row = f"{dist.warp_row}fm * TSR_MMA_M"
        col = f"{dist.warp_col}fn * TSR_MMA_N"
        tf32 = function == _MMA_SYNC["tf32"][0]
        k = "kk + lane % 4" if tf32 else "kk + lane % 4 * 2"
        assert not isinstance(a, str) or dist.fm == 1, "loaded fragments are one strip's"
        if tf32 and isinstance(a, str):
            raise NotLowered("a tf32 product of probabilities held in registers")
        mma_k = self.named("MMA_K", 8 if tf32 else _WGMMA_K)
        self.open(f"for (int kk = 0; {bound}; kk += {mma_k})")
        if isinstance(a, str):
            choice = f"{a}[0][q]"
            for step in range(1, steps):
                choice = f"kk == {step} * {mma_k} ? {a}[{step}][q] : {choice}"
            self.line("unsigned a_step[4];")
            self.unroll()
            self.line(f"for (int q = 0; q < 4; ++q) a_step[q] = {choice};")
        else:
            self.line(f"unsigned a_frag[{dist.fm_text}][4];")
            self.unroll()
            self.open(f"for (int fm = 0; fm < {dist.fm}; ++fm)")
            if isinstance(a, SmemView):
                self.ldmatrix("a_frag[fm]", a, "a", row)
            elif tf32:
                self.tf32_fragment("a_frag[fm]", a, f"{row} + lane / 4", k)
            else:
                self.a_fragment("a_frag[fm]", a, f"{row} + lane / 4", k)
            self.close()
        self.unroll()
        self.open(f"for (int fn = 0; fn < {dist.fn_text}; ++fn)")
        self.line("unsigned b_frag[2];")
        if isinstance(b, SmemView):
            self.ldmatrix("b_frag", b, "b", col)
        elif tf32:
            for q in range(2):
                kq = f"{k} + 4" if q else k
                self.line(f"b_frag[{q}] = {b((kq, f'{col} + lane / 4'))};")
        else:
            for q in range(2):
                kq = f"{k} + 8" if q else k
                pair = f"{b((kq, f'{col} + lane / 4'))}, {b((f'{kq} + 1', f'{col} + lane / 4'))}"
                self.line(f"b_frag[{q}] = tsr_pack_b16({pair});")
        if isinstance(a, str):
            self.line(f"{function}(&{acc}[fn * TSR_MMA_REGS], a_step, b_frag);")
        else:
            self.unroll()
            slots = f"&{acc}[(fm * {parenthesized(dist.fn_text)} + fn) * TSR_MMA_REGS]"
            self.line(f"for (int fm = 0; fm < {dist.fm_text}; ++fm) "
                      f"{function}({slots}, a_frag[fm], b_frag);")  # fmt: skip
        self.close()
        self.close()

    def loadable(self, op: Op, view: SmemView | None) -> SmemView | None:
        """``view`` if ``mma.sync`` can load the operand with ``ldmatrix``: stored in the
        instruction's 16-bit dtype, rows of whole 16-byte chunks, which every layout keeps
        together and 16-byte aligned."""
        dtype = _mma_sync_dtype(op.attr("mma").inst)
        if view is None or dtype in (None, "tf32") or view.dtype != dtype or view.cols % 8:
            return None  # ldmatrix moves 16-bit elements
        return view

    def ldmatrix(self, frag: str, view: SmemView, role: str, mn0: str) -> None:
        """The lane's registers of an ``a`` (m16k16, four) or ``b`` (k16n8, two) fragment
        at ``m`` or ``n`` from ``mn0`` and reduction step ``kk``, as ``ldmatrix`` loads
        them: one 8x8 matrix per register, in ``a``'s order (rows, then rows + 8, at k,
        then the same at k + 8) or ``b``'s (k, then k + 8). Lane ``8j + r`` points at row
        ``r`` of matrix ``j``. Where ``k`` runs along the buffer's rows, a matrix row is
        one ``m`` or ``n`` and the registers come as ``mma.sync`` takes them; otherwise
        a row is one ``k`` and ``.trans`` delivers them transposed."""
        count, mn_block = (4, "lane / 8 % 2") if role == "a" else (2, None)
        k_block = "lane / 8 / 2" if role == "a" else "lane / 8 % 2"
        mn = f"{mn0} + {mn_block} * 8" if mn_block else mn0
        k = f"kk + {k_block} * 8"
        if view.k_major(role):
            i, j, trans = f"{mn} + lane % 8", k, ""
        else:
            i, j, trans = f"{k} + lane % 8", mn, "_trans"
        dims = (Dim.const(view.rows), Dim.const(view.cols))
        i, j = self.shared_coords(view.read, view.name, (view.rows, view.cols), (i, j))
        chunk = self.chunk_elements(view.bits)
        panel = self.panel(view.bits) if view.layout == "sw128" else None
        place = smem_index(view.layout, dims, view.bits, view.slot, i, j, view.extents, chunk,
                           panel)  # fmt: skip
        self.line(f"tsr_ldmatrix_x{count}{trans}({frag}, {view.name} + {parenthesized(place)});")

    def a_fragment(self, frag: str, a: Element, row: str, k: str) -> None:
        """The lane's four registers of an m16k16 ``a`` operand at rows ``row`` and
        ``row + 8``, ``k`` steps ``k`` and ``k + 8`` (with the next ``k`` of each pair in
        the high half), as ``mma.sync`` and ``wgmma`` take them."""
        for q in range(4):
            rq = f"{row} + 8" if q % 2 else row
            kq = f"{k} + 8" if q // 2 else k
            pair = f"{a((rq, kq))}, {a((rq, f'{kq} + 1'))}"
            self.line(f"{frag}[{q}] = tsr_pack_b16({pair});")

    def tf32_fragment(self, frag: str, a: Element, row: str, k: str) -> None:
        """The lane's four registers of an m16k8 tf32 ``a`` operand: rows ``row`` and
        ``row + 8``, ``k`` steps ``k`` and ``k + 4``, one element each."""
        for q in range(4):
            rq = f"{row} + 8" if q % 2 else row
            kq = f"{k} + 4" if q // 2 else k
            self.line(f"{frag}[{q}] = {a((rq, kq))};")

    def fragment(self, name: str, vector: str, per_lane: int, value: str) -> None:
        if per_lane == 1:
            self.line(f"const {vector} {name} = {value};")
            return
        self.line(f"{vector} {name};")
        self.line(f"for (int q = 0; q < {per_lane}; ++q) {name}[q] = {value};")

    def stage(
        self, name: str, dist: Grid | Fragments, value: str, dtype: str
    ) -> tuple[Element, Element]:
        """A tile's elements through a shared staging buffer, so that any thread can read
        any element: (the element as a float, its stored bits). ``value`` is the
        thread's element at slot ``t`` of ``dist``, stored as ``dtype`` stores it."""
        tile = Staged(name, dist, (dist.rows, dist.cols), dtype, lambda index: value)
        return self.stage_all([tile])[0]

    def stage_all(
        self, tiles: list[Staged], unplanned: bool = False
    ) -> list[tuple[Element, Element]]:
        """Tiles held in registers through shared staging buffers, one each, written
        between one pair of barriers, so that any thread can read any element of them:
        for each, (the element as a float, its stored bits). Of a row vector's tile (a
        Rows or FragmentRows distribution, ``[rows]`` or ``[rows, width]``), each row is
        written by the one thread among its holders at column (lane bits) 0. Rows are
        padded by 4 bytes against bank conflicts.

        ``unplanned``: buffers that the schedule's estimate of shared memory does not
        count (a concat's), which can be large. They are counted apart
        (``unplanned_smem_bytes``), and where the dialect's arena is given at launch
        (CUDA's) they lie in it, after the planned buffers: a static array holds at most
        48 KiB, and a launch asks for an arena beyond that."""
        strides = []
        for tile in tiles:
            cols = tile.shape[1] if len(tile.shape) == 2 else 1
            stride = cols + (1 if tile.dtype == "f32" else 2) if cols > 1 else 1
            storage, count = self.d.storage[tile.dtype], tile.shape[0] * stride
            size = count * (DTYPES[tile.dtype].bits // 8)
            if unplanned and self.d.dynamic_arena:
                offset = -(-self.smem_bytes // CHUNK_BYTES) * CHUNK_BYTES
                self.smem_bytes = offset + size
                self.declare_arena()
                self.declare(tile.name, self.d.local_view(storage, tile.name, "tsr_smem", offset))
            else:
                self.declare_shared(storage, tile.name, count, DTYPES[tile.dtype].bits // 8)
            if unplanned:
                self.unplanned_smem_bytes += size
            strides.append(stride)
        if self.lines[-1].strip() != self.d.barrier:  # (a row reduction's ends in one)
            self.line(self.d.barrier)
        for tile, stride in zip(tiles, strides, strict=True):
            index = self.walk(tile.dist)
            closes = 0
            if isinstance(tile.dist, (Rows, FragmentRows)):
                mask = sum(tile.dist.shape.row_lanes) if isinstance(tile.dist, FragmentRows) else 0
                self.open(f"if ({'tx == 0' if mask == 0 else f'(lane & {mask}) == 0'})")
                closes = 1
                if stride > 1:
                    self.open(f"for (int j = 0; j < {tile.shape[1]}; ++j)")
                    closes = 2
                if len(tile.shape) == 2:
                    index = (index[0], "j" if stride > 1 else "0")
            # (the walk's indices are names: no parentheses)
            at = (
                index[0]
                if stride == 1 or len(index) == 1
                else f"{index[0]} * {stride} + {index[1]}"
            )
            self.line(self.d.write(tile.dtype, tile.name, at, tile.value(index)))
            for _ in range(closes):
                self.close()
            self.close_walk()
        self.line(self.d.barrier)
        return [(lambda index, t=tile, s=stride: self.d.read(t.dtype, t.name, _staged_at(index, s)),
                 lambda index, t=tile, s=stride: f"{t.name}[{_staged_at(index, s)}]")
                for tile, stride in zip(tiles, strides, strict=True)]  # fmt: skip

    # -- online softmax --------------------------------------------------------------------

    def row_combine(self, name: str, rows: Rows, combine: str) -> None:
        """Every thread's ``name[r]`` becomes the combination over the threads of its row."""
        threads, tx = self.kernel.threads, self.kernel.threads // rows.ty
        assert tx == min(GRID_COLUMNS, threads), "every Grid of a kernel has one thread shape"
        count, tx_name = self.constants.threads[1], self.grid_threads()[1]
        slots = self.rows_slots(rows)
        self.declare_shared("float", "tsr_rows", rows.slots * threads, 4, f"{slots}*{count}")
        self.line(f"for (int r = 0; r < {slots}; ++r) tsr_rows[r * {count} + lid] = {name}[r];")
        self.line(self.d.barrier)
        self.open(f"for (int r = 0; r < {slots}; ++r)")
        row = f"tsr_rows[r * {count} + ty * {tx_name}"
        self.line(f"float part = {row}];")
        other = combine.format(a="part", b=f"{row} + peer]")
        self.line(f"for (int peer = 1; peer < {tx_name}; ++peer) part = {other};")
        self.line(f"{name}[r] = part;")
        self.close()
        self.line(self.d.barrier)

    def row_reduce(
        self, name: str, tile: str, dist: Grid | Fragments, combine: str, init: str
    ) -> None:
        """``name``: the rows of owned tile ``tile`` combined, in every thread that holds
        the row: a thread's own elements first, then the threads' partials, through
        shared memory on a Grid, by exchanging registers between the lanes of a row in
        fragments (each row lies in one warp)."""
        rows = rows_of(dist)
        slots = self.rows_slots(rows)
        self.line(f"float {name}[{slots}];")
        if isinstance(dist, Grid):
            self.open(f"for (int r = 0; r < {slots}; ++r)")
            self.line(f"float part = {init};")
            other = combine.format(a="part", b=f"{tile}[r * {dist.rn} + c]")
            self.line(f"for (int c = 0; c < {dist.rn}; ++c) part = {other};")
            self.line(f"{name}[r] = part;")
            self.close()
            self.row_combine(name, Rows(dist.rows, dist.ty), combine)
            return
        self.line(f"for (int r = 0; r < {slots}; ++r) {name}[r] = {init};")
        self.walk(dist)
        slot = f"{name}[{self.row_slot(dist)}]"
        self.line(f"{slot} = {combine.format(a=slot, b=f'{tile}[t]')};")
        self.close_walk()
        self.unroll()
        self.open(f"for (int r = 0; r < {slots}; ++r)")
        for mask in dist.shape.row_lanes:
            other = self.d.shuffle_xor.format(x=f"{name}[r]", mask=mask)
            self.line(f"{name}[r] = {combine.format(a=f'{name}[r]', b=other)};")
        self.close()

    def reduce_held_rows(self, op: Op, combine: str, init: str) -> None:
        """A row reduction of a tile held in registers (a product's accumulator, or
        computed from one: attention_stats's ``rowsum(do * o)``), as the online softmax
        reduces its scores: a row vector in the registers of the threads that hold
        each row."""
        x = op.operands[0]
        form = self.forms[x.id]
        if form.kind == "lazy" and form.dist is not None:
            form = self.materialize(x, form.dist, self.namer.fresh(self.temps.wanted(x), "held"))
        if form.kind != "owned" or not isinstance(form.dist, (Grid, Fragments)):
            raise NotLowered("a reduction of a tile held in registers")
        name = self.namer.fresh(self.temps.wanted(op.result), "v")
        self.row_reduce(name, form.name, form.dist, combine, init)
        dims = tuple(op.result.type.dims)
        self.forms[op.result.id] = Form("owned", dims, name, dist=rows_of(form.dist))

    def exp_online(self, x: str) -> str:
        """``exp(x)`` of the online softmax, as ``2^(x log2(e))``: a multiply and the GPU's
        base-2 exponential, where ``expf`` adds a range reduction of several instructions
        per score. Attention at head dim 128 spent a fifth of its time on them (bf16, S
        16384 on an H200: 28.6 ms with ``expf``, 22.8 ms with this; bench/README.md)."""
        return f"{self.d.exp2}(({x}) * {self.d.literal(math.log2(math.e))})"

    def op_softmax_online(self, op: Op) -> None:
        """``p = exp(s - max)`` per row, with the row max and the row sum of ``p``; a row
        with nothing unmasked (max -inf) subtracts 0, so its ``p`` is 0, not NaN. ``p``
        stays where the product that computed ``s`` left it."""
        (s,) = op.operands
        dist = self.forms[s.id].dist
        if not isinstance(dist, Fragments):
            dist = grid_for(tuple(s.type.dims), self.kernel.threads)
        p_val, m_val, l_val = op.results
        rows = rows_of(dist)
        p, m, l_ = (self.namer.fresh(self.temps.wanted(v), "v") for v in op.results)
        self.forms[p_val.id] = self.materialize(s, dist, p)
        self.row_reduce(m, p, dist, f"{self.d.fmax}({{a}}, {{b}})", self.d.literal(float("-inf")))
        self.walk(dist)
        row = f"{m}[{self.row_slot(dist)}]"
        finite = f"({row} == {self.d.literal(float('-inf'))} ? 0.0f : {row})"
        self.line(f"{p}[t] = {self.exp_online(f'{p}[t] - {finite}')};")
        self.close_walk()
        self.row_reduce(l_, p, dist, "{a} + {b}", "0.0f")
        for value, name in ((m_val, m), (l_val, l_)):
            self.forms[value.id] = Form("owned", tuple(value.type.dims), name, dist=rows)

    def op_softmax_accumulate(self, op: Op) -> None:
        """Rescale the running sums to the new row max, then add ``p @ v``; ``p`` is
        rounded to ``v``'s dtype first, as the tensor-core paths do, and staged through
        shared memory, since each thread needs rows that other threads hold."""
        acc, m, l_, p, v, m_c, l_c = op.operands
        acc_out, m_out, l_out = op.results
        dist = self.product_dist(op, tuple(acc_out.type.dims))
        rows = rows_of(dist)
        p_dist = self.forms[p.id].dist
        if not isinstance(p_dist, (Grid, Fragments)) or rows_of(p_dist) != rows:
            raise NotLowered("online softmax of values computed elsewhere")
        for x in (p, m_c, l_c):
            if self.forms[x.id].kind != "owned" or (x is not p and self.forms[x.id].dist != rows):
                raise NotLowered("online softmax of values computed elsewhere")
        acc_form = self.accumulator(op, acc, acc_out)
        m_form, l_form = (self.row_state(x, out, rows) for x, out in ((m, m_out), (l_, l_out)))
        inf = self.d.literal(float("-inf"))
        names = {x: self.forms[x.id].name for x in (m_c, l_c)}
        alpha, beta = self.namer.fresh("alpha"), self.namer.fresh("beta")
        slots = self.rows_slots(rows)
        self.line(f"float {alpha}[{slots}], {beta}[{slots}];")
        self.unroll()
        self.open(f"for (int r = 0; r < {slots}; ++r)")
        self.line(f"const float m_new = {self.d.fmax}({m_form.name}[r], {names[m_c]}[r]);")
        self.line(f"const float m_fin = m_new == {inf} ? 0.0f : m_new;")
        self.line(f"{alpha}[r] = {self.exp_online(f'{m_form.name}[r] - m_fin')};")
        self.line(f"{beta}[r] = {self.exp_online(f'{names[m_c]}[r] - m_fin')};")
        self.line(
            f"{l_form.name}[r] = {l_form.name}[r] * {alpha}[r] + {names[l_c]}[r] * {beta}[r];"
        )
        self.line(f"{m_form.name}[r] = m_new;")
        self.close()
        self.walk(dist)
        self.line(f"{acc_form.name}[t] *= {alpha}[{self.row_slot(dist)}];")
        self.close_walk()
        if self.p_from_registers(op, p_dist, beta, v, acc_form.name, dist):
            self.forms[acc_out.id] = acc_form
            self.forms[m_out.id], self.forms[l_out.id] = m_form, l_form
            return
        # The FMA loop multiplies floats: p is staged as floats, rounded to v's dtype.
        fma = op.attr("mma").inst == "fma"
        dtype = "f32" if fma else v.type.dtype.name
        scaled = f"{self.forms[p.id].name}[t] * {beta}[{self.row_slot(p_dist)}]"
        value = self.d.round(v.type.dtype.name, scaled) if fma else scaled
        staged, bits = self.stage(self.namer.fresh(f"{p.name or 'p'}_stage"), p_dist, value, dtype)
        a = self.fragment_element(op, staged, bits, dtype)
        views = (None, self.loadable(op, self.views.get(v.id)))
        self.product(
            op, a, self.operand(v, op), self.constants.shape(p.type)[1], acc_form.name, dist, views
        )
        self.forms[acc_out.id] = acc_form
        self.forms[m_out.id], self.forms[l_out.id] = m_form, l_form

    def p_from_registers(
        self, op: Op, p_dist: Grid | Fragments, beta: str, v: Value, acc: str, dist: Fragments
    ) -> bool:
        """``acc += (p * beta) @ v`` with ``p`` straight from the registers the scores'
        product left it in, when it can: a warp's m16n8 accumulator fragments, two along
        the columns, are the m16k16 ``a`` fragment that ``mma.sync`` takes and that
        ``wgmma`` takes from registers, once rounded to ``v``'s dtype and packed in
        pairs. Nothing is staged, and no barrier waits for it."""
        p, inst = op.operands[3], op.attr("mma").inst
        depth, dtype = p.type.dims[1], _mma_sync_dtype(inst)
        if dtype is None or not isinstance(p_dist, Fragments) or not isinstance(dist, Fragments):
            return False
        same_rows = (p_dist.rows, p_dist.wm, p_dist.shape) == (dist.rows, dist.wm, dist.shape)
        if not same_rows or (p_dist.wn, p_dist.fm, dist.wn) != (1, 1, 1):
            return False
        rounded = _MMA_SYNC[dtype][1]
        name, frag = self.forms[p.id].name, self.namer.fresh(f"{p.name or 'p'}_frag")
        self.line(f"unsigned {frag}[{p_dist.cols // _WGMMA_K}][4];")
        self.unroll()
        named = self.constants.shape(p.type)[1]  # p's columns: the product's depth
        mma_k = self.named("MMA_K", _WGMMA_K)
        self.open(f"for (int kk = 0; kk < {self.c(named)}; kk += {mma_k})")
        for q in range(4):
            # Fragment kk / 8 + q / 2, registers 2 (q % 2) and the next, in row slot q % 2.
            slots = [q // 2 * 4 + q % 2 * 2 + one for one in (0, 1)]
            pair = [rounded.format(x=f"{name}[kk / 2{f' + {t}' if t else ''}] * {beta}[{q % 2}]")
                    for t in slots]  # fmt: skip
            self.line(f"{frag}[kk / {mma_k}][{q}] = tsr_pack_b16({pair[0]}, {pair[1]});")
        self.close()
        view = self.views.get(v.id)
        if self.wgmma_ready(op, dist, depth, view):
            assert view is not None
            self.wgmma_product(op, frag, view, named, acc, dist)
        else:
            function = _MMA_SYNC[dtype][0]
            bound = self.reduction_bound(op, named)
            steps = p_dist.cols // _WGMMA_K
            b = self.loadable(op, view) or self.operand(v, op)
            self.mma_sync_product(function, frag, b, bound, acc, dist, steps)
        return True

    def row_state(self, x: Value, result: Value, rows: Rows | FragmentRows) -> Form:
        """A running row vector updated in place when nothing else reads it."""
        form = self.forms[x.id]
        if form.kind == "owned" and form.dist == rows and self.uses.get(x.id) == 1:
            return form
        return self.materialize(x, rows, self.namer.fresh(self.temps.wanted(result), "v"))


def _staged_at(index: tuple[str, ...], stride: int) -> str:
    """Where element ``index`` of a staged tile lies in its buffer, rows ``stride``
    apart (a tile of one column, or a row vector, is one element a row)."""
    if len(index) == 1 or stride == 1:
        return index[0]
    return f"({index[0]}) * {stride} + {index[1]}"
