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

from ..graph.dims import Dim
from ..graph.ir import Op, Value
from ..tile.ir import Mma, SharedType, Slot
from .simt_layout import (
    Element,
    Flat,
    Form,
    Fragments,
    Grid,
    NotLowered,
    Rows,
    grid_for,
    smem_index,
)

__all__ = ["TileOps"]

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


class TileOps:
    """The ops of distributed tiles; mixed into the SIMT emitter, whose state they use."""

    forms: dict[int, Form]
    uses: dict[int, int]
    #: The planned layout of each shared buffer, by value id.
    layouts: dict[int, str]
    #: Reads of shared memory as the stored bits, unconverted, by value id.
    bits: dict[int, Element]

    # -- shared memory ---------------------------------------------------------------------

    def op_alloc(self, op: Op) -> None:
        buf = op.result
        t: SharedType = buf.type
        plan = next(s for s in self.kernel.smem if s.buffer == (buf.name or "smem"))
        total = max(s.offset + s.bytes for s in self.kernel.smem)
        self.declare("smem", self.d.local_bytes("tsr_smem", total))
        name = self.namer.fresh(buf.name, "smem")
        storage = self.d.storage[t.dtype.name]
        self.declare(name, self.d.local_view(storage, name, "tsr_smem", plan.offset))
        self.forms[buf.id] = Form("shared", tuple(t.dims), name)
        self.layouts[buf.id] = plan.layout

    def smem_element(self, buf: Value, slot: Slot) -> Element:
        t: SharedType = buf.type
        layout = self.layouts[buf.id]
        if t.stages == 1 or slot.index.constant is not None:
            at = str((slot.index.constant or 0) % t.stages)
        else:
            at = f"({self.c(slot.index)}) % {t.stages}"

        def element(index: tuple[str, ...]) -> str:
            i, j = index if len(index) == 2 else ("0", index[0])
            return smem_index(layout, t.dims, t.dtype.bits, at, i, j)

        return element

    def op_copy(self, op: Op) -> None:
        tensor, buf = op.operands
        when = op.attr("when")
        if when is not None:
            self.open(f"if ({self.c(when.start)} < {self.c(when.extent)})")
        at = op.attr("at")
        place = self.smem_element(buf, op.attr("slot"))
        dtype, src, dst = buf.type.dtype.name, self.forms[tensor.id].name, self.forms[buf.id].name
        index = self.walk(Flat(tuple(buf.type.dims)))
        offset, condition = self.address(tensor, at, index)
        self.line(self.d.copy(dtype, dst, place(index), src, offset, condition))
        self.close_walk()
        if when is not None:
            self.close()

    def op_commit(self, op: Op) -> None:
        """Copies are synchronous here: a copy ahead is done when it is issued, before the
        ``wait`` and the barrier that the Tile IR puts before its reads."""

    def op_wait(self, op: Op) -> None:
        """See ``op_commit``."""

    def op_read(self, op: Op) -> None:
        buf = op.operands[0]
        place = self.smem_element(buf, op.attr("slot"))
        name, dtype = self.forms[buf.id].name, buf.type.dtype.name
        self.lazy(op.result, lambda index: self.d.read(dtype, name, place(index)))
        self.bits[op.result.id] = lambda index: f"{name}[{place(index)}]"

    def op_barrier(self, op: Op) -> None:
        self.line(self.d.barrier)

    def op_transpose(self, op: Op) -> None:
        x = self.forms[op.operands[0].id]
        if x.kind != "lazy":
            raise NotLowered(f"a transpose of a {x.kind} value")
        element = x.element
        assert element is not None
        self.lazy(op.result, lambda index: element(index[::-1]), op.operands[0])
        bits = self.bits.get(op.operands[0].id)
        if bits is not None:
            self.bits[op.result.id] = lambda index: bits(index[::-1])

    # -- products --------------------------------------------------------------------------

    def product_dist(self, op: Op, dims: tuple[Dim, ...]) -> Grid | Fragments:
        """Where a product's result lives: the matrix instruction's fragments, or the Grid
        of the FMA loop."""
        mma: Mma = op.attr("mma")
        if mma.inst in _MFMA:
            rows, cols = (d.constant for d in dims)
            assert rows is not None and cols is not None
            return Fragments(rows, cols, *mma.warps)
        if mma.inst != "fma":
            raise NotLowered(f"the matrix instruction {mma.inst}")
        return grid_for(dims, self.kernel.threads)

    def op_dot(self, op: Op) -> None:
        a, b = op.operands
        name = self.namer.fresh(op.result.name, "dot")
        dist = self.product_dist(op, tuple(op.result.type.dims))
        self.line(f"float {name}[{dist.slots}];")
        self.line(f"for (int t = 0; t < {dist.slots}; ++t) {name}[t] = 0.0f;")
        self.product(op, self.operand(a, op), self.operand(b, op), a.type.dims[1], name, dist)
        self.forms[op.result.id] = Form("owned", tuple(op.result.type.dims), name, dist=dist)

    def op_mma(self, op: Op) -> None:
        a, b, acc = op.operands
        form = self.accumulator(op, acc, op.result)
        a_k, b_k = self.operand(a, op), self.operand(b, op)
        self.product(op, a_k, b_k, a.type.dims[1], form.name, form.dist)
        self.forms[op.result.id] = form

    def accumulator(self, op: Op, acc: Value, result: Value) -> Form:
        """Where a product accumulates: in ``acc``'s own array when nothing else reads it
        (a loop's accumulator), else in a copy."""
        form = self.forms[acc.id]
        dist = self.product_dist(op, tuple(result.type.dims))
        if form.kind == "owned" and form.dist == dist and self.uses.get(acc.id) == 1:
            return form
        return self.materialize(acc, dist, self.namer.fresh(result.name, "v"))

    def operand(self, x: Value, op: Op | None = None) -> Element:
        """An operand of ``op``'s product, readable at any index by any thread: a float,
        or for a matrix instruction an element of its fragment type, taken from the
        stored bits where shared memory holds the instruction's dtype."""
        form = self.forms[x.id]
        if form.kind != "lazy" or form.dist is not None:
            raise NotLowered("a product of a value held in registers")
        element = form.element
        assert element is not None
        mma = op.attr("mma") if op is not None else None
        if mma is None or mma.inst not in _MFMA:
            return element
        _, _, dtype, from_float, from_bits = _MFMA[mma.inst]
        bits = self.bits.get(x.id)
        if bits is not None and x.type.dtype.name == dtype:
            return lambda index: from_bits.format(x=bits(index))
        return lambda index: from_float.format(x=element(index))

    def product(
        self, op: Op, a: Element, b: Element, depth: Dim, acc: str, dist: Grid | Fragments
    ) -> None:
        """``acc += a @ b``; the reduction stops at the live corner, since the operands
        are zero past it."""
        live = op.attr("live")
        bound = f"kk < {self.c(depth)}"
        if live is not None and live.k is not None:
            bound += f" && kk < {self.c(live.k)}"
        if isinstance(dist, Fragments):
            self.mfma_product(op.attr("mma").inst, a, b, bound, acc, dist)
            return
        rm, rn = dist.rm, dist.rn
        self.place_in_grid()
        self.open(f"for (int kk = 0; {bound}; ++kk)")
        self.line(f"float a_k[{rm}], b_k[{rn}];")
        row, col = f"ty + r * {dist.ty}", f"tx + c * {dist.tx}"
        self.line(f"for (int r = 0; r < {rm}; ++r) a_k[r] = {a((row, 'kk'))};")
        self.line(f"for (int c = 0; c < {rn}; ++c) b_k[c] = {b(('kk', col))};")
        self.open(f"for (int r = 0; r < {rm}; ++r)")
        slot = f"{acc}[r * {rn} + c]"
        self.line(f"for (int c = 0; c < {rn}; ++c) {slot} = {self.d.fma}(a_k[r], b_k[c], {slot});")
        self.close()
        self.close()

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
        row = f"wave / {dist.wn} * {dist.rows // dist.wm} + fm * 32 + lane % 32"
        col = f"wave % {dist.wn} * {dist.cols // dist.wn} + fn * 32 + lane % 32"
        k = "kk + lane / 32" if per_lane == 1 else f"kk + lane / 32 * {per_lane} + q"
        self.open(f"for (int kk = 0; {bound}; kk += {step})")
        self.unroll()
        self.open(f"for (int fm = 0; fm < {dist.fm}; ++fm)")
        self.fragment("a_frag", vector, per_lane, a((row, k)))
        self.unroll()
        self.open(f"for (int fn = 0; fn < {dist.fn}; ++fn)")
        self.fragment("b_frag", vector, per_lane, b((k, col)))
        slots = f"{acc}[(fm * {dist.fn} + fn) * 16 + reg]"
        self.line("tsr_floatx16 frag_acc;")
        self.line(f"for (int reg = 0; reg < 16; ++reg) frag_acc[reg] = {slots};")
        self.line(f"frag_acc = __builtin_amdgcn_{inst}(a_frag, b_frag, frag_acc, 0, 0, 0);")
        self.line(f"for (int reg = 0; reg < 16; ++reg) {slots} = frag_acc[reg];")
        self.close()
        self.close()
        self.close()

    def fragment(self, name: str, vector: str, per_lane: int, value: str) -> None:
        if per_lane == 1:
            self.line(f"const {vector} {name} = {value};")
            return
        self.line(f"{vector} {name};")
        self.line(f"for (int q = 0; q < {per_lane}; ++q) {name}[q] = {value};")

    def stage(self, name: str, grid: Grid, value: str) -> Element:
        """A Grid tile's elements through a shared staging buffer (rows padded by one
        float against bank conflicts), so that any thread can read any element."""
        stride = grid.cols + 1
        self.declare(name, self.d.local("float", name, grid.rows * stride))
        self.line(self.d.barrier)
        self.walk(grid)
        self.line(f"{name}[i * {stride} + j] = {value};")
        self.close_walk()
        self.line(self.d.barrier)
        return lambda index: f"{name}[({index[0]}) * {stride} + {index[1]}]"

    # -- online softmax --------------------------------------------------------------------

    def row_combine(self, name: str, rows: Rows, combine: str) -> None:
        """Every thread's ``name[r]`` becomes the combination over the threads of its row."""
        threads, tx = self.kernel.threads, self.kernel.threads // rows.ty
        self.declare(f"rows{rows.slots}",
                     self.d.local("float", "tsr_rows", rows.slots * threads))  # fmt: skip
        self.line(f"for (int r = 0; r < {rows.slots}; ++r) tsr_rows[r * {threads} + lid] = "
                  f"{name}[r];")  # fmt: skip
        self.line(self.d.barrier)
        self.open(f"for (int r = 0; r < {rows.slots}; ++r)")
        row = f"tsr_rows[r * {threads} + ty * {tx}"
        self.line(f"float part = {row}];")
        other = combine.format(a="part", b=f"{row} + peer]")
        self.line(f"for (int peer = 1; peer < {tx}; ++peer) part = {other};")
        self.line(f"{name}[r] = part;")
        self.close()
        self.line(self.d.barrier)

    def row_reduce(self, name: str, tile: str, grid: Grid, combine: str, init: str) -> None:
        self.line(f"float {name}[{grid.rm}];")
        self.open(f"for (int r = 0; r < {grid.rm}; ++r)")
        self.line(f"float part = {init};")
        other = combine.format(a="part", b=f"{tile}[r * {grid.rn} + c]")
        self.line(f"for (int c = 0; c < {grid.rn}; ++c) part = {other};")
        self.line(f"{name}[r] = part;")
        self.close()
        self.row_combine(name, Rows(grid.rows, grid.ty), combine)

    def op_softmax_online(self, op: Op) -> None:
        """``p = exp(s - max)`` per row, with the row max and the row sum of ``p``; a row
        with nothing unmasked (max -inf) subtracts 0, so its ``p`` is 0, not NaN."""
        (s,) = op.operands
        if isinstance(self.forms[s.id].dist, Fragments):
            raise NotLowered("online softmax of matrix-instruction fragments")
        p_val, m_val, l_val = op.results
        grid = grid_for(tuple(s.type.dims), self.kernel.threads)
        rows = Rows(grid.rows, grid.ty)
        p, m, l_ = (self.namer.fresh(v.name, "v") for v in op.results)
        self.forms[p_val.id] = self.materialize(s, grid, p)
        self.row_reduce(m, p, grid, f"{self.d.fmax}({{a}}, {{b}})", self.d.literal(float("-inf")))
        finite = f"({m}[r] == {self.d.literal(float('-inf'))} ? 0.0f : {m}[r])"
        self.walk(grid)
        self.line(f"{p}[t] = {self.d.unary['exp']}({p}[t] - {finite});")
        self.close_walk()
        self.row_reduce(l_, p, grid, "{a} + {b}", "0.0f")
        for value, name in ((m_val, m), (l_val, l_)):
            self.forms[value.id] = Form("owned", tuple(value.type.dims), name, dist=rows)

    def op_softmax_accumulate(self, op: Op) -> None:
        """Rescale the running sums to the new row max, then add ``p @ v``; ``p`` is
        rounded to ``v``'s dtype first, as the tensor-core paths do."""
        acc, m, l_, p, v, m_c, l_c = op.operands
        acc_out, m_out, l_out = op.results
        grid = grid_for(tuple(acc_out.type.dims), self.kernel.threads)
        p_grid = grid_for(tuple(p.type.dims), self.kernel.threads)
        rows = Rows(grid.rows, grid.ty)
        for x, dist in ((p, p_grid), (m_c, rows), (l_c, rows)):
            if self.forms[x.id].kind != "owned" or self.forms[x.id].dist != dist:
                raise NotLowered("online softmax of values computed elsewhere")
        acc_form = self.accumulator(op, acc, acc_out)
        m_form, l_form = (self.row_state(x, out, rows) for x, out in ((m, m_out), (l_, l_out)))
        inf = self.d.literal(float("-inf"))
        names = {x: self.forms[x.id].name for x in (m_c, l_c)}
        alpha, beta = self.namer.fresh("alpha"), self.namer.fresh("beta")
        self.line(f"float {alpha}[{rows.slots}], {beta}[{rows.slots}];")
        self.open(f"for (int r = 0; r < {rows.slots}; ++r)")
        exp = self.d.unary["exp"]
        self.line(f"const float m_new = {self.d.fmax}({m_form.name}[r], {names[m_c]}[r]);")
        self.line(f"const float m_fin = m_new == {inf} ? 0.0f : m_new;")
        self.line(f"{alpha}[r] = {exp}({m_form.name}[r] - m_fin);")
        self.line(f"{beta}[r] = {exp}({names[m_c]}[r] - m_fin);")
        self.line(
            f"{l_form.name}[r] = {l_form.name}[r] * {alpha}[r] + {names[l_c]}[r] * {beta}[r];"
        )
        self.line(f"{m_form.name}[r] = m_new;")
        self.close()
        self.walk(grid)
        self.line(f"{acc_form.name}[t] *= {alpha}[r];")
        self.close_walk()
        scaled = self.d.round(v.type.dtype.name, f"{self.forms[p.id].name}[t] * {beta}[r]")
        staged = self.stage(self.namer.fresh(f"{p.name or 'p'}_stage"), p_grid, scaled)
        self.product(op, staged, self.operand(v), p.type.dims[1], acc_form.name, grid)
        self.forms[acc_out.id] = acc_form
        self.forms[m_out.id], self.forms[l_out.id] = m_form, l_form

    def row_state(self, x: Value, result: Value, rows: Rows) -> Form:
        """A running row vector updated in place when nothing else reads it."""
        form = self.forms[x.id]
        if form.kind == "owned" and form.dist == rows and self.uses.get(x.id) == 1:
            return form
        return self.materialize(x, rows, self.namer.fresh(result.name, "v"))
