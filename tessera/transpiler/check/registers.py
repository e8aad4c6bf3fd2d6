"""Register-pressure estimate: the 32-bit registers a thread of a kernel needs.

The Tile IR says which tiles a program holds in registers and how long each lives, so
the estimate is the most words of live owned tiles (a product's, a reduction's, a loop's
carried values) one thread holds at any op, on top of a base for addresses, sizes,
indices and loop counters that depends on the kind of kernel (``_base``). An owned tile
lives until the last use of the lazy values computed from it (attention's scores until
the softmax that reads them scaled and masked), and an op that makes a new array (the
probabilities) holds it beside the operands it reads; only an accumulator is updated in
place. A tile of
constant size is spread over the program's threads (a 128x128 f32 accumulator over 256
threads is 64 words each); a per-row vector is repeated across the 16 threads of a row
of the ``Grid`` (``GRID_COLUMNS``); a tile with a symbolic dim is walked a vector at a
time and holds one vector. An operand that a matrix instruction reads from shared memory
costs the fragments of one k step: ``mma.sync`` keeps a strip of ``a`` (4 registers
per 16 rows of the warp's tile) and one ``b`` fragment, the FMA loop a column of its
``Grid`` block of ``a`` and a row of ``b``, ``wgmma`` none. The compiler
caps what a thread may hold at what ``__launch_bounds__`` leaves it (a 384-thread
block that must fit once per multiprocessor: 168), and so does the estimate.

It is a model, checked against ptxas on the examples (``bench/registers.py``,
``tests/test_nvrtc.py``), for the inspector and ``--emit meta`` to show where a
schedule presses on registers: not a count.
"""

from __future__ import annotations

from ..graph.ir import Block, Op, Value, walk
from ..graph.rewrite import block_uses
from ..graph.types import TileType
from ..schedule.hardware import GRID_COLUMNS, Hardware
from ..tile.ir import Mma, TileKernel

__all__ = ["estimate_registers"]

#: Ops whose results a thread holds in registers. The others (loads, elementwise math,
#: casts, masks) are lazy: the code computes each element where it is used, from the
#: registers of the owned values and from memory.
_OWNED = frozenset({"mma", "dot", "softmax_online", "softmax_accumulate", "sum", "max", "min",
                    "mean", "argmax", "argmin", "cumsum"})  # fmt: skip

#: Owned ops whose result is their accumulator operand, updated in place.
_IN_PLACE = frozenset({"mma", "softmax_accumulate"})

#: Registers a kernel spends on pointers, sizes, indices and loop counters; on sm_90a a
#: kernel with a loop (a pipelined one: barriers, tensor maps, wgmma descriptors) keeps
#: more; one without loops that walks only 1-D tiles needs one index and its tensors'
#: addresses.
_BASE = 32
_LOOP_BASE = {"sm_90a": 40}
_FLAT_BASE = 24
_REGISTER_FILE = 65536


def estimate_registers(kernel: TileKernel, hw: Hardware) -> int:
    """The estimated registers per thread of ``kernel`` (0 on CPUs)."""
    if hw.kind != "gpu":
        return 0
    model = _Pressure(kernel)
    for op in walk(kernel.body):
        model.note_fragments(op)
    words = model.block(kernel.body, 0)
    return min(_base(kernel, hw) + words, _cap(kernel, hw))


def _base(kernel: TileKernel, hw: Hardware) -> int:
    """What the kernel spends besides its tiles (ptxas on the examples: 18 to 24
    registers for a 1-D elementwise kernel, 30 to 32 for a 2-D one or a row reduction,
    about 8 more for a loop on sm_90a)."""
    ops = list(walk(kernel.body))
    if any(op.kind == "for" for op in ops):
        return _LOOP_BASE.get(hw.arch, _BASE)
    flat = all(
        len(r.type.dims) == 1 for op in ops for r in op.results if isinstance(r.type, TileType)
    )
    return _FLAT_BASE if flat else _BASE


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
        self.takers: dict[int, Op] = {}
        self.fragments: dict[int, int] = {}
        self.owned = {r.id for op in walk(kernel.body) if op.kind in _OWNED for r in op.results}

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
        count = 1
        for d in dims:
            count *= d
        if len(dims) == 1:
            count *= GRID_COLUMNS  # a row vector in each thread of its row
        return -(-count // (self.kernel.threads * per_word))

    def block(self, block: Block, outside: int) -> int:
        last: dict[int, int] = {}
        for index, op in enumerate(block.ops):
            for used in _uses(op):
                last[used] = index
        for value in block.yields:
            last[value.id] = len(block.ops)
        # A lazy value is computed where it is used, from its operands: the owned tiles
        # it reads stay live until its last use (a product's scores until the softmax
        # that reads them scaled and masked has made its probabilities).
        for index in range(len(block.ops) - 1, -1, -1):
            op = block.ops[index]
            if op.kind in _OWNED or op.regions:
                continue
            end = max((last.get(r.id, -1) for r in op.results), default=-1)
            for value in op.operands:
                last[value.id] = max(last.get(value.id, -1), end)
        live: dict[int, int] = {a.id: self.words(a) for a in block.args if a.id in last}
        worst = outside + sum(live.values())
        for index, op in enumerate(block.ops):
            carried = {v.id for v in op.operands} if op.kind == "for" else set()
            for region in op.regions:
                across = sum(w for v, w in live.items() if v not in carried)
                worst = max(worst, self.block(region, outside + across))
            made = {}
            for result in op.results:
                owned = op.kind in _OWNED or result.id in self.fragments
                if owned and result.id in last:
                    made[result.id] = self.words(result)
            # An accumulator is updated in place; other results are new arrays, written
            # while the operands that die here are still read.
            if op.kind not in _IN_PLACE:
                worst = max(worst, outside + sum(live.values()) + sum(made.values()))
            for value in [v for v in live if last.get(v, -1) <= index]:
                del live[value]
            live.update(made)
            worst = max(worst, outside + sum(live.values()))
        return worst

    def note_fragments(self, op: Op) -> None:
        """Operands a matrix instruction reads from shared memory cost the fragments of
        one k step, not the tile."""
        mma = op.attr("mma")
        if not isinstance(mma, Mma) or mma.operands != "shared":
            return
        if mma.inst.startswith("mma.sync"):
            strip = mma.warp_tile[0] // 16 * 4 + 2
        elif mma.inst == "fma":  # a column of a's block and a row of b's, per k step
            rows, cols = (d.constant or 0 for d in op.results[0].type.dims[-2:])
            tx = min(GRID_COLUMNS, self.kernel.threads)
            strip = rows // max(1, self.kernel.threads // tx) + cols // tx
        else:
            strip = 0
        # The product's operands: a @ b, or p @ v of online softmax's accumulation.
        operands = op.operands[3:5] if op.kind == "softmax_accumulate" else op.operands[:2]
        for operand in operands:
            if operand.id not in self.owned:  # held in registers already (probabilities)
                self.fragments.setdefault(operand.id, strip // 2)


def _uses(op: Op) -> set[int]:
    return {v.id for v in op.operands}.union(*map(block_uses, op.regions))
