"""Register-pressure estimate: the 32-bit registers a thread of a kernel needs.

The Tile IR says which tiles a program holds in registers and how long each lives, so
the estimate is the most words of live owned tiles (a product's, a reduction's, a loop's
carried values) one thread holds at any op, on top of a base for addresses, sizes,
indices and loop counters that depends on the kind of kernel (``_base``). An owned tile
lives until the last use of the lazy values computed from it (attention's scores until
the softmax that reads them scaled and masked), and an op that makes a new array (the
probabilities) holds it beside the operands it reads; only an accumulator is updated in
place. A tile of constant size is spread over the program's threads (a 128x128 f32
accumulator over 256 threads is 64 words each); a row vector lives in the threads of
its rows: the 16 threads of a row of the ``Grid`` (``GRID_COLUMNS``), or, beside a
matrix instruction's fragments, 2 rows of every 16 of the warp's; a tile with a
symbolic dim is walked a vector at a time and holds one vector. A row reduction over a
symbolic dim (a row kernel's statistics: layernorm's mean and scale) is a walk of each
row by the whole program whose total every thread gets back, so every thread holds the
statistic of every row; such a walk keeps the loads of an unrolled iteration of each
tensor it reads in flight (``layernorm_grad``'s passes over x and g, ``add_rms``'s over
x, the residual and the weight). A choice between lazy values (an ``if`` on
``with_weight``) is lazy too: what it reads lives until the chosen value's last use. A
loop's carried tiles stay in their registers after it, until their last use; a loop
that updates them elementwise (``norm_param_grad``'s sums) loads the thread's elements
of each tile the update reads ahead of the math. The store of a product's result (a
GEMM's epilogue) holds, beside the tile, each of the thread's rows' 64-bit address and
bound, and each column's bound where the columns are masked.

An operand that a matrix instruction reads from shared memory costs the registers of
one k step, as the generated code reads it: ``mma.sync`` a strip of ``a`` (4 registers
per 16 rows of the warp's tile) and ``b``'s fragments for all the warp's columns (2 per
8, loaded ahead of the unrolled walk over them); ``wgmma`` nothing for an operand it
reads through a descriptor, and for an ``a`` in registers its fragments of every step
of the tile, which the batch reads while it runs (an operand that is not a read of a
128-byte-swizzled buffer in the instruction's dtype, such as w8a16's widened weights,
runs on ``mma.sync``); the FMA loop a column of its ``Grid`` block of ``a`` and a row of
``b``. An operand computed from registers (attention's ``ds`` in its backward pass) is
made into an array and staged through shared memory, and each of its elements loads the
tensors of its chain (a row's logsumexp) into a register of its own. An owned operand
that only a matrix instruction of a narrower dtype reads (online softmax's
probabilities, for a bf16 product) is held packed, two 16-bit elements a register. The
compiler caps what a thread may hold at what ``__launch_bounds__`` leaves it, and so
does the estimate; a warp-specialized kernel (a producer warpgroup that hands registers
to the consumers with ``setmaxnreg``) is given that whole share, which ptxas reports.

It is a model, checked against ptxas on the examples and the library
(``bench/registers.py``, ``tests/test_nvrtc.py``), for the inspector and ``--emit
meta`` to show where a schedule presses on registers: not a count.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..graph.dtypes import lookup_dtype
from ..graph.ir import Block, Op, Value, walk
from ..graph.rewrite import block_uses
from ..graph.types import TensorType, TileType
from ..schedule.hardware import GRID_COLUMNS, Hardware
from ..tile.ir import Mma, TileKernel
from ..tile.rewrite import producers

__all__ = ["estimate_registers"]

#: Ops whose results a thread holds in registers. The others (loads, elementwise math,
#: casts, masks) are lazy: the code computes each element where it is used, from the
#: registers of the owned values and from memory.
_OWNED = frozenset({"mma", "dot", "softmax_online", "softmax_accumulate", "sum", "max", "min",
                    "mean", "argmax", "argmin", "cumsum"})  # fmt: skip

#: Owned ops that reduce a tile along an axis.
_REDUCTIONS = frozenset({"sum", "max", "min", "mean", "argmax", "argmin"})

#: Owned ops whose result is their accumulator operand, updated in place.
_IN_PLACE = frozenset({"mma", "softmax_accumulate"})

#: Registers a kernel spends on pointers, sizes, indices and loop counters; on sm_90a a
#: kernel with a loop (a pipelined one: barriers, tensor maps, wgmma descriptors) keeps
#: more.
_BASE = 32
_LOOP_BASE = {"sm_90a": 40}
#: What a kernel that walks its rows with the whole program (a reduction over a dim of
#: symbolic size) spends besides its row statistics and its walks' extra loads: its
#: index arithmetic, its tensors' addresses and one tensor's loads in flight (on
#: ``row_sum`` ptxas's live peak is 29 registers, 4 of them the row sums; it reports
#: 31, a few above, for aligned 64-bit pairs).
_ROW_BASE = 28
#: The elements of a row that one iteration of a walk over it reads: NVVM unrolls the
#: walk's loop 4 times (``row_sum``'s PTX: 4 loads of x an iteration).
_WALK_UNROLL = 4
#: What an elementwise kernel over 1-D tiles spends besides its tensors' addresses and
#: loaded vectors: the thread's index, its program's 64-bit offset and the 64-bit
#: counter and bound of its walk over the elements (on ``train_step_k5``, a copy of one
#: tensor into another, ptxas's live peak is 16 registers, 4 of them the two addresses;
#: it reports 22: ptxas's count is a few above its live peak, for aligned 64-bit pairs).
_FLAT_INDEX = 12
#: Of ``_FLAT_INDEX``, the walk's 64-bit counter and bound, which a kernel that walks no
#: elements does not spend (the KV cache's advance: one length a program).
_WALK_COUNTER = 4
#: What the 64-bit arithmetic of a cache's visible keys adds (``kv_visible``: the row's
#: length, its causal offset and window, the split's start and the clamp; ptxas counts
#: 20 registers on sm_80, 22 on sm_90a, for ``examples/decode.tsr``'s ``step_k9``).
_VISIBLE = 8
_REGISTER_FILE = 65536
#: Warps in a wgmma warpgroup.
_WARPGROUP = 4


def estimate_registers(kernel: TileKernel, hw: Hardware) -> int:
    """The estimated registers per thread of ``kernel`` (0 on CPUs)."""
    if hw.kind != "gpu":
        return 0
    if kernel.producer:
        # A warp-specialized kernel moves registers between its warpgroups with
        # setmaxnreg (the producer gives some back, the consumers take them), which
        # redistributes what the block was given at launch: ptxas must allocate every
        # thread the launch bounds' whole share, and reports it.
        return _cap(kernel, hw)
    model = _Pressure(kernel)
    for op in walk(kernel.body):
        model.note_fragments(op)
    words = model.block(kernel.body, 0)
    base = _ROW_BASE if model.walked and _base(kernel, hw) == _BASE else _base(kernel, hw)
    return min(base + words, _cap(kernel, hw))


def _base(kernel: TileKernel, hw: Hardware) -> int:
    """What the kernel spends besides its tiles (ptxas on the examples: 30 to 32 for a
    2-D kernel or a row reduction, about 8 more for a loop on sm_90a; an elementwise
    kernel over 1-D tiles its index arithmetic, its tensors' addresses and the vectors
    it loads)."""
    ops = list(walk(kernel.body))
    if any(op.kind == "for" for op in ops):
        return _LOOP_BASE.get(hw.arch, _BASE)
    flat = all(
        len(r.type.dims) == 1 for op in ops for r in op.results if isinstance(r.type, TileType)
    )
    if not flat:
        return _BASE
    # Each tensor's 64-bit address, and each vector the thread loads for the value it
    # stores (a 16-byte load fills ``vector`` registers at once; a one-element tensor, a
    # scalar, one): of a kernel that stores several, the most that one of them reads.
    tensors = sum(isinstance(p.type, TensorType) for p in kernel.params)
    stored = {op.operands[1].id for op in ops if op.kind == "store"}
    loads = [_loads_of(v, stored, kernel.body) for v in stored] or [
        [op.results[0].type for op in ops if op.kind == "load"]
    ]
    vectors = max(sum(_vector_words(t, kernel.vector) for t in each) for each in loads)
    walks = any(isinstance(r.type, TileType) for op in ops for r in op.results)
    visible = _VISIBLE if any(op.kind == "kv_visible" for op in ops) else 0
    return _FLAT_INDEX - (0 if walks else _WALK_COUNTER) + 2 * tensors + vectors + visible


def _vector_words(t: TileType, vector: int) -> int:
    """The registers one vector load of a tile of ``t`` fills: ``vector`` elements, of
    16-bit floats two to a register; one element of a tile of one."""
    if t.dims[0].constant == 1:
        return 1
    return max(1, vector * min(t.dtype.bits, 32) // 32)


def _loads_of(value: int, stored: set[int], body: Block) -> list[TileType]:
    """The tiles loaded for the value ``value`` (an id): the loads its computation reads,
    but not those of another value the kernel stores (in ``stored``), which the code
    computes once into registers where it stores it (``simt_kernel``'s stores)."""
    defs = producers(body)
    found: list[TileType] = []
    seen: set[int] = set()
    todo = [value]
    while todo:
        v = todo.pop()
        op = defs.get(v)
        if op is None or v in seen or (v != value and v in stored):
            continue
        seen.add(v)
        if op.kind == "load":
            found.append(op.results[0].type)
        todo += [w.id for w in op.operands if isinstance(w, Value)]
    return found


def _cap(kernel: TileKernel, hw: Hardware) -> int:
    """What the launch bounds leave a thread: a producer warpgroup's kernel runs one
    block per multiprocessor, each thread with its share of the register file."""
    if not kernel.producer:
        return hw.regs_per_thread
    share = _REGISTER_FILE // (kernel.threads + kernel.producer) // 8 * 8
    return min(hw.regs_per_thread, share)


class _Pressure:
    def __init__(self, kernel: TileKernel) -> None:
        self.kernel = kernel
        self.fragments: dict[int, int] = {}
        self.defs = producers(kernel.body)
        self.users: dict[int, list[Op]] = {}
        for op in walk(kernel.body):
            for value in op.operands:
                self.users.setdefault(value.id, []).append(op)
        self.owned = {r.id for op in walk(kernel.body) if op.kind in _OWNED for r in op.results}
        # A reduction over a dim of symbolic size is a walk of each row by the whole
        # program (thread t reads elements t, t + threads, ...), whose partials are summed
        # through shared memory and handed back to every thread: each thread holds the
        # statistic of every row of the tile, not the share of a Grid row's threads.
        self.walked = {op.results[0].id for op in walk(kernel.body) if _walked(op)}
        # The rows of a matrix instruction's result, and how many of them a thread
        # holds: an m16n8 fragment gives lane l rows l / 4 and l / 4 + 8 of each 16, so
        # a warp's rows over 8 (a wgmma warpgroup's 64 rows are its warps' 16 apiece).
        # A row vector of such a product (online softmax's max and sum) lives in the
        # threads of its rows, as many registers as the thread has rows.
        self.fragment_rows: dict[int, int] = {}
        self.layouts: dict[tuple[int, int], tuple[int, int]] = {}
        for op in walk(kernel.body):
            mma = op.attr("mma")
            if not isinstance(mma, Mma) or not op.results:
                continue
            rows, cols = (d.constant for d in op.results[0].type.dims[-2:])
            if rows is None:
                continue
            if _nvidia(mma.inst):
                warp_rows = mma.warp_tile[0] // (_WARPGROUP if mma.inst.startswith("wgmma") else 1)
                share = max(1, warp_rows // 8)
                self.fragment_rows[rows] = max(self.fragment_rows.get(rows, 0), share)
                # and of each 8 columns lane l holds 2 (l % 4) and the next
                self.layouts[rows, cols] = share, mma.warp_tile[1] // 8
            elif mma.inst == "fma":  # a Grid: GRID_COLUMNS threads a row
                tx = min(GRID_COLUMNS, kernel.threads)
                self.layouts[rows, cols] = -(-rows * tx // kernel.threads), -(-(cols or 0) // tx)

    def words(self, value: Value) -> int:
        """The registers one thread spends on ``value``."""
        if value.id in self.fragments:
            return self.fragments[value.id]
        t = value.type
        if not isinstance(t, TileType):
            return 0
        dims = [d.constant for d in t.dims]
        per_word = max(1, 32 // max(t.dtype.bits, 1))
        if any(d is None for d in dims):
            return 4  # walked a vector at a time
        if value.id in self.walked:  # every row's statistic, in every thread
            return -(-dims[0] // per_word)
        if len(dims) == 1 or dims[1:] == [1]:  # a row vector, [R] or [R, 1]
            if dims[0] in self.fragment_rows:
                return self.fragment_rows[dims[0]]
            # in a Grid, in each of the GRID_COLUMNS threads of its row
            return -(-dims[0] * GRID_COLUMNS // (self.kernel.threads * per_word))
        count = 1
        for d in dims:
            count *= d
        return -(-count // (self.kernel.threads * per_word))

    def block(self, block: Block, outside: int, loop: bool = False) -> int:
        last: dict[int, int] = {}
        for index, op in enumerate(block.ops):
            for used in _uses(op):
                last[used] = index
        for value in block.yields:
            last[value.id] = len(block.ops)
        # A lazy value is computed where it is used, from its operands: the owned tiles
        # it reads stay live until its last use (a product's scores until the softmax
        # that reads them scaled and masked has made its probabilities).
        # So is a choice between lazy values (an ``if`` on a flag, such as ``with_weight``,
        # whose branches only compute elementwise): the code computes the chosen one where
        # it is used.
        for index in range(len(block.ops) - 1, -1, -1):
            op = block.ops[index]
            if op.kind in _OWNED or (op.regions and not _lazy_choice(op)):
                continue
            end = max((last.get(r.id, -1) for r in op.results), default=-1)
            for used in _uses(op):
                last[used] = max(last.get(used, -1), end)
        live: dict[int, int] = {a.id: self.words(a) for a in block.args if a.id in last}
        worst = outside + sum(live.values())
        for index, op in enumerate(block.ops):
            carried = {v.id for v in op.operands} if op.kind == "for" else set()
            for region in op.regions:
                across = sum(w for v, w in live.items() if v not in carried)
                worst = max(worst, self.block(region, outside + across, op.kind == "for"))
            made = {}
            for result in op.results:
                owned = op.kind in _OWNED or result.id in self.fragments
                # a loop's carried tiles stay in their registers after it
                owned = owned or (op.kind == "for" and isinstance(result.type, TileType))
                if owned and result.id in last:
                    made[result.id] = self.words(result)
            if self.walked:
                worst = max(worst, outside + sum(live.values()) + self.in_flight(op))
            if op.kind == "store":
                worst = max(worst, outside + sum(live.values()) + self.store_words(op))
            # An accumulator is updated in place; other results are new arrays, written
            # while the operands that die here are still read.
            if op.kind not in _IN_PLACE:
                worst = max(worst, outside + sum(live.values()) + sum(made.values()))
            for value in [v for v in live if last.get(v, -1) <= index]:
                del live[value]
            live.update(made)
            worst = max(worst, outside + sum(live.values()))
        if loop:
            worst = max(worst, outside + sum(live.values()) + self.carried_reads(block))
        return worst

    def carried_reads(self, body: Block) -> int:
        """A loop that updates its carried values elementwise (``norm_param_grad``'s
        sums over row blocks) loads the thread's elements of every tile the update reads
        (from memory or shared memory) ahead of the math: their words, beside the
        carried values. A product's or a softmax's carried values are owned, and their
        operands are costed as fragments."""
        reads: dict[int, int] = {}
        for value in body.yields:
            if value.id in self.owned or value.id in {a.id for a in body.args}:
                continue
            for read in self.computed_from(value, shared=True)[1]:
                reads[read.id] = self.words(read)
        return sum(reads.values())

    def in_flight(self, op: Op) -> int:
        """The loads a walk over the rows (a reduction's, or the store's of the result)
        keeps in flight beyond the base's: the walk is unrolled (``_WALK_UNROLL``) and the
        loads of an iteration are issued ahead of its math, a register for each element
        of each tensor the walked expression reads (``layernorm_grad``'s ``sum(gw *
        xhat)`` and its result read rows of x and g); the base holds one tensor's (a row
        sum's). A vector broadcast over the rows (the weight, a bias) is read at every
        element too, and counts the same: ``layernorm``'s store walk reads x, the weight
        and the bias (ptxas: 48 registers on sm_80, 40 on sm_90a), ``rms``'s x and the
        weight (32 and 40), ``add_rms``'s x, the residual and the weight (48 on both)."""
        if op.results and op.results[0].id in self.walked:
            walked = op.operands[0]
        elif op.kind == "store" and _symbolic(op.operands[1]):
            walked = op.operands[1]
        else:
            return 0
        _, loads = self.computed_from(walked)
        return max(0, len(loads) - 1) * _WALK_UNROLL

    def store_words(self, op: Op) -> int:
        """What the store of a product's result (a GEMM's epilogue) spends beside the
        registers live there: the 64-bit address of each of the thread's rows and the
        bound of each row (and of each column, where the store masks the columns),
        which ptxas computes ahead of the stores. Each element is computed from the
        tile, which is live there, as it is stored."""
        value = op.operands[1]
        t = value.type
        if not isinstance(t, TileType) or len(t.dims) != 2 or _symbolic(value):
            return 0
        layout = self.layouts.get((t.dims[0].constant, t.dims[1].constant))
        if layout is None or not self.computed_from(value)[0]:
            return 0
        thread_rows, thread_cols = layout
        masked = op.attr("at").tile_axes[-1].masked
        return 3 * thread_rows + (thread_cols if masked else 0)

    def note_fragments(self, op: Op) -> None:
        """Operands a matrix instruction reads from shared memory cost the fragments of
        one k step, not the tile."""
        mma = op.attr("mma")
        if not isinstance(mma, Mma) or mma.operands != "shared":
            return
        # The product's operands: a @ b, or p @ v of online softmax's accumulation.
        operands = op.operands[3:5] if op.kind == "softmax_accumulate" else op.operands[:2]
        steps = self.fragment_words(op, mma, operands)
        for operand, strip in zip(operands, steps, strict=True):
            if operand.id in self.owned:  # held in registers already (probabilities)
                self.pack(operand, mma)
                continue
            owned, loads = self.computed_from(operand)
            if owned:
                # computed from registers (attention's ds = p * (dp - delta) in its
                # backward pass): the thread's elements are made into an array, staged
                # through shared memory for the product; each element reads the tensors
                # of its chain where it is computed (a row's logsumexp, once per element
                # of the row), and ptxas issues those loads ahead, one register apiece.
                held = self.words(operand)
                self.fragments[operand.id] = held * (1 + len(loads))
            else:
                self.fragments.setdefault(operand.id, strip)

    def pack(self, operand: Value, mma: Mma) -> None:
        """An owned operand that only matrix instructions of a narrower dtype read
        (online softmax's probabilities, for a bf16 product) is held as the
        instruction's fragments, two 16-bit elements a register: the code packs it
        before the product's walk over the other operand."""
        dtype = lookup_dtype(mma.inst.rpartition(".")[2])
        if dtype is None or dtype.bits >= 32 or not _nvidia(mma.inst):
            return
        if all(op.attr("mma") is not None for op in self.users.get(operand.id, [])):
            self.fragments[operand.id] = -(-self.words(operand) * dtype.bits // 32)

    def fragment_words(self, op: Op, mma: Mma, operands: Sequence[Value]) -> tuple[int, int]:
        """The registers of one k step of each operand, as the instruction reads them."""
        rows, cols = mma.warp_tile
        if mma.inst == "fma":  # a column of a's Grid block and a row of b's
            out_rows, out_cols = (d.constant or 0 for d in op.results[0].type.dims[-2:])
            tx = min(GRID_COLUMNS, self.kernel.threads)
            return out_rows // max(1, self.kernel.threads // tx), out_cols // tx
        if not _nvidia(mma.inst):
            return 0, 0  # MFMA: no register report here to check a model against
        if mma.inst.startswith("wgmma") and self.in_swizzle(operands[1], mma):
            if self.in_swizzle(operands[0], mma):
                return 0, 0  # both through descriptors
            # a in registers: its fragments of every k16 step of the tile are loaded
            # before the batch of wgmma, which reads them while it runs (4 per step)
            depth = operands[0].type.dims[-1].constant or 0
            return depth // 16 * 4, 0
        if mma.inst.startswith("wgmma"):
            rows //= _WARPGROUP  # run on mma.sync: each warp its 16 rows
        # mma.sync: a strip of a (4 registers per 16 rows) and, ahead of the unrolled
        # walk over the warp's columns, b's fragment of each 8 columns (2 registers)
        return rows // 16 * 4, cols // 8 * 2

    def in_swizzle(self, value: Value, mma: Mma) -> bool:
        """Whether ``wgmma`` reads ``value`` through a descriptor: a read of a buffer in
        the 128-byte swizzle, in the instruction's dtype (a cast of one, w8a16's
        widened weights, runs on mma.sync)."""
        op = self.defs.get(value.id)
        if op is not None and op.kind == "transpose":
            op = self.defs.get(op.operands[0].id)
        if op is None or op.kind != "read":
            return False
        layouts = {slot.buffer: slot.layout for slot in self.kernel.smem}
        dtype = mma.inst.rpartition(".")[2]
        return layouts.get(op.operands[0].name) == "sw128" and value.type.dtype.name == dtype

    def computed_from(self, value: Value, shared: bool = False) -> tuple[bool, list[Value]]:
        """Whether the lazy ``value`` reads an owned tile, and the tensor loads it reads
        (each through its chain of elementwise ops; with ``shared``, its reads of shared
        buffers too)."""
        owned, loads, seen, todo = False, [], set(), [value]
        while todo:
            v = todo.pop()
            if v.id in seen:
                continue
            seen.add(v.id)
            if v.id in self.owned:
                owned = True
                continue
            op = self.defs.get(v.id)
            if op is None or (op.kind == "read" and not shared):
                continue
            if op.kind in ("load", "read"):
                loads.append(v)
                continue
            todo.extend(op.operands)
            for region in op.regions:
                todo.extend(region.yields)
        return owned, loads


def _nvidia(inst: str) -> bool:
    """Whether ``inst`` is an NVIDIA matrix instruction, whose fragment layout (m16n8)
    the estimate follows."""
    return inst.startswith(("mma.sync", "wgmma"))


def _walked(op: Op) -> bool:
    """Whether ``op`` reduces a tile along a dim of symbolic size (a row of ``C``
    elements), which the program walks with all its threads."""
    if op.kind not in _REDUCTIONS or not op.operands or not op.results:
        return False
    t, r, axis = op.operands[0].type, op.results[0].type, op.attr("axis")
    if not isinstance(t, TileType) or not isinstance(r, TileType) or not isinstance(axis, int):
        return False
    return t.dims[axis].constant is None and len(r.dims) >= 1 and r.dims[0].constant is not None


def _lazy_choice(op: Op) -> bool:
    """Whether ``op`` is an ``if`` whose branches hold nothing in registers."""
    return op.kind == "if" and all(
        inner.kind not in _OWNED and not inner.regions
        for region in op.regions
        for inner in region.ops
    )


def _symbolic(value: Value) -> bool:
    """Whether ``value`` is a tile with a dim of symbolic size."""
    t = value.type
    return isinstance(t, TileType) and any(d.constant is None for d in t.dims)


def _uses(op: Op) -> set[int]:
    return {v.id for v in op.operands}.union(*map(block_uses, op.regions))
