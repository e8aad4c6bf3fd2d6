"""One Tile IR kernel as SIMT code: a program instance is a group of threads.

This module holds the forms values take and the ops on any of them (elementwise
work, row reductions, global loads and stores, loops and branches);
``simt_tiles.py`` adds shared memory, products and online softmax. A value takes
one of four forms:

- **scalar**: a private variable, the same in every thread;
- **replicated**: a small private array, the same in every thread: a reduction's
  result (each thread gets the group's total) and elementwise work on it;
- **lazy**: an expression of the element's index, evaluated where it is consumed.
  Loads and elementwise chains are lazy whatever their shape, so a row of a
  symbolic width is never stored: each consumer reads the tensor again;
- **owned**: a private array in one of the distributions of ``simt_layout.py``:
  the result of a product or of online softmax, a value carried by a loop, or a
  load from a tensor that the kernel also stores to (read before it is written).

A lazy value remembers the distribution of the owned values it reads; a store
walks its tile in that distribution (``Flat`` when there is none). A reduction
walks rows, each thread striding along the row, then combines its partial with
the group's through local memory. Every statement carries the ``.tsr`` line it
comes from.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import field
from typing import Any

from ...frozen import frozen
from ..check.bounds import FAULT, Sites
from ..graph.dims import Dim
from ..graph.graph_ops import (
    C_MATH,
    COMPARISONS,
    DRAWN,
    binary_operands,
    dropout_operands,
    named_operands,
)  # fmt: skip
from ..graph.ir import Block, Op, Value, walk
from ..graph.stochastic import STOCHASTIC_FORMATS, stochastic_operands
from ..graph.types import ScalarType, TensorType
from ..schedule.hardware import GRID_COLUMNS
from ..tile.ir import STORES, Access, Mma, TileKernel
from ..tile.rewrite import producers, use_counts
from ..tile.tma import tma_stages
from .cexpr import (
    MAX_INLINED_OPS,
    c_dim,
    c_factor,
    integer_variant,
    kv_slot,
    kv_visible,
    saturated,
    words,
)
from .debug_checks import bounds_lines
from .index_names import with_named_indices
from .naming import C_LIBRARY, GPU_BUILTINS, Namer, symbol_names
from .render import SourceLines
from .simt_dialect import Dialect
from .simt_layout import (
    CHUNK_BYTES,
    FRAGMENT_SHAPES,
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
    rows_for,
    rows_of,
)
from .simt_persistent import PersistentTiles
from .simt_tiles import SmemView, Staged, TileOps
from .simt_tma import TensorMap, TmaCopies
from .single_iteration import without_single_iterations
from .smem_checks import SharedChecks
from .temporaries import Temporaries
from .tile_constants import tile_constants

__all__ = ["SimtKernel", "SimtParam", "NotLowered", "emit_simt_kernel"]

_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_UNARY = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu", "silu", "relu", "abs",
          "round", "sin", "cos", "neg", *C_MATH)  # fmt: skip
#: Binary ops that are calls of the dialect's math functions, not operators.
_CALLED = ("maximum", "minimum", "floordiv", "mod")
#: The comparisons, as C operators: an int, which a float holds as 1.0 or 0.0.
_COMPARED = {kind: symbol for symbol, kind in COMPARISONS.items()}
_OPERATORS = {**_BINARY, **_COMPARED}
#: ``and``, ``or`` and ``not`` of masks, as C operators; their operands are conditions
#: (comparisons) or masks held as floats, which C takes as true where not 0.0.
_LOGICAL = {"logical_and": "&&", "logical_or": "||", "logical_not": "!"}
#: The ops whose expression is a condition, which ``where`` reads as it is.
_CONDITIONS = frozenset({*_COMPARED, *_LOGICAL})
_ELEMENTWISE = frozenset(
    {*_OPERATORS, *_LOGICAL, *_UNARY, *_CALLED, "pow", "cast", "where", "join_i32", *DRAWN}
)
#: The names of the instructions' and the schedule's numbers (``named``), in the order a
#: kernel declares them: the Grid's threads and the rows of a thread's register block, a
#: warp's part of a product, an MMA's shape, registers and rows per lane, a warpgroup's
#: threads, a ``wgmma``'s rows and step, and the elements of a row of a 128-byte swizzle
#: panel.
NUMBERS = ("TX", "TY", "RM", "WARP_M", "WARP_N", "MMA_K", "WARPGROUP", "WGMMA_M", "WGMMA_K",
           "PANEL")  # fmt: skip
#: The target's numbers, which the tile header declares once per file (``tessera_tile.j2``):
#: a warp's lanes, a copy's chunk, the shape of its matrix instructions' accumulator
#: fragment (``FragmentShape``: its rows and columns, a lane's registers and rows of it).
HEADER_NUMBERS = {
    name: f"TSR_{name}"
    for name in ("WARP_SIZE", "CHUNK_BYTES", "MMA_M", "MMA_N", "MMA_REGS", "LANE_ROWS")
}


def header_numbers(dialect: str, lanes: int) -> dict[str, int]:
    """The values of the target's numbers that the tile header declares for ``dialect``
    (``HEADER_NUMBERS``), on a target of warps of ``lanes``."""
    numbers = {"WARP_SIZE": lanes, "CHUNK_BYTES": CHUNK_BYTES}
    shape = FRAGMENT_SHAPES.get(dialect)
    if shape is not None:
        numbers.update(MMA_M=shape.m, MMA_N=shape.n, MMA_REGS=shape.regs,
                       LANE_ROWS=shape.row_slots)  # fmt: skip
    return numbers


#: Variables of the generated code and names every dialect declares; no value is named
#: after them (nor after the header's and the template's ``tsr_`` names: ``OWN_PREFIX``).
_RESERVED = frozenset({"lid", "e", "t", "i", "j", "r", "c", "kk", "peer", "tx", "ty", "program",
                       "part", "m_new", "m_fin", "a_k", "b_k", "lane", "wave", "frag", "reg",
                       "fm", "fn", "q", "a_frag", "b_frag", "frag_acc", "rs", "bytes", "a_step",
                       "j0", "pair", "half", "it"}) | GPU_BUILTINS | set(NUMBERS)  # fmt: skip


@frozen
class SimtParam:
    name: str
    #: "tensor", "scalar" or "dim"; for tensors the storage dtype's name.
    kind: str
    dtype: str | None
    written: bool = False


@frozen
class SimtKernel:
    name: str
    params: tuple[SimtParam, ...]
    #: The printed name of each size symbol.
    sizes: dict[str, str]
    #: Program ids with their extents and blocks, first axis fastest.
    grid: tuple[tuple[str, Dim, int], ...]
    threads: int
    #: Declarations at the top of the kernel: local memory, the thread's place in a Grid.
    prologue: tuple[str, ...]
    body: tuple[str, ...]
    #: The ``wgmma`` forms it issues, for the header: (dtype, n, "ss" or "rs").
    wgmma: frozenset[tuple[str, int, str]] = frozenset()
    #: Bytes of shared memory its arena needs (the planned buffers, TMA's barriers).
    smem_bytes: int = 0
    #: Bytes of the shared arrays it declares itself (reduction scratch, staged tiles),
    #: which a program needs on top of the arena.
    static_smem_bytes: int = 0
    #: The tensor maps it takes after its sizes, and the ranks its TMA copies move.
    tensor_maps: tuple[TensorMap, ...] = ()
    tma_ranks: frozenset[int] = frozenset()
    #: Whether it is compiled for one block per multiprocessor (``__launch_bounds__(n,
    #: 1)``), which ``setmaxnreg`` needs: a register budget known at entry.
    one_block: bool = False
    #: The shared arrays a launch allocates for it where the dialect's launches do
    #: (``launched_locals``): (element type, name, elements, alignment in bytes).
    locals: tuple[tuple[str, str, int, int], ...] = ()
    #: Whether it checks bounds (a debug build): then it takes the fault record last.
    checked: bool = False
    #: The program ids that step by a tile it declares: that tile's name (``pid_m``:
    #: ``BM``), which its grid's comment counts blocks of.
    blocks: dict[str, str] = field(default_factory=dict)
    #: Of its shared memory (arena and declared), the bytes of buffers that the
    #: schedule's estimate does not count: a concat's pieces staged from registers
    #: (``TileOps.stage_all``).
    unplanned_smem_bytes: int = 0


def emit_simt_kernel(
    kernel: TileKernel,
    dialect: Dialect,
    dims: tuple[str, ...],
    lanes: int,
    arena_align: int,
    sites: Sites | None = None,
) -> SimtKernel:
    """``kernel`` in ``dialect``; ``lanes`` is the target's warp or wavefront width, and
    ``arena_align`` the alignment its shared-memory arena is declared with. With
    ``sites`` (a debug build), each global access is checked against its bounds."""
    return _Emitter(kernel, dialect, dims, lanes, arena_align, sites).run()


class _Emitter(TileOps, TmaCopies, PersistentTiles, SharedChecks):
    def __init__(
        self, kernel: TileKernel, dialect: Dialect, dims: tuple[str, ...], lanes: int,
        arena_align: int, sites: Sites | None = None,
    ) -> None:  # fmt: skip
        self.kernel = kernel
        self.sites = sites
        self.checked = False
        self.shared_sites: dict[tuple[int, int], int] = {}
        self.arena_align = arena_align
        self.d = dialect
        self.dims = dims
        pids = tuple(a.name for a in kernel.grid)
        counters = tuple(op.regions[0].args[0].name for op in walk(kernel.body)
                         if op.kind == "for")  # fmt: skip
        counters += tuple(op.result.name for op in walk(kernel.body) if op.kind == "kv_slot")
        #: Printed names of the symbols in sizes and offsets: sizes, program ids and loop
        #: counters keep theirs unless C or the loops this emitter writes take them.
        self.symbols = symbol_names((*dims, *pids, *counters), _RESERVED)
        self.constants = tile_constants(
            kernel,
            frozenset(self.symbols.values()) | _RESERVED | C_LIBRARY | GPU_BUILTINS,
            spelled=True,
        )
        #: ``c``'s text of each (dim, unit) it has printed.
        self.printed: dict[tuple[Dim | None, ...], str] = {}
        # Nor does a value take the name of a function the code may call (``rsqrt``).
        self.namer = Namer(
            frozenset(self.symbols.values()) | _RESERVED | C_LIBRARY | self.constants.names
        )
        #: The target's and the instructions' numbers the code names (``WARP_SIZE``,
        #: ``TSR_MMA_M``), by name: their values, and how the declaration writes each.
        self.numbers: dict[str, tuple[int, str]] = {}
        #: What each value should be called, the source leaving it unnamed or not.
        self.temps = Temporaries(kernel.body, kernel.params)
        self.forms: dict[int, Form] = {}
        #: How many elementwise ops each lazy value's expression holds, by value id.
        self.chained: dict[int, int] = {}
        self.uses = use_counts(kernel.body)
        self.producers = producers(kernel.body)
        self.lanes = lanes
        self.layouts: dict[int, str] = {}
        self.bits: dict[int, Element] = {}
        self.views: dict[int, SmemView] = {}
        self.wgmma: set[tuple[str, int, str]] = set()
        self.async_reads = kernel.uses_wgmma
        self.in_flight = False
        self.aligned: dict[int, str] = {}
        self.tma = tma_stages(kernel) if dialect.name == "cuda" else None
        planned = max((s.offset + s.bytes for s in kernel.smem), default=0)
        self.barrier_offset = -(-planned // 8) * 8
        self.smem_bytes = self.barrier_offset + self.barriers_bytes() if self.tma else planned
        self.tensor_maps: dict[tuple[int, tuple[int, ...]], TensorMap] = {}
        self.tma_group: list[str] = []
        #: Per shared buffer that TMA fills: the name of one stage's bytes, and its value.
        self.stage_bytes_names: dict[str, tuple[str, str]] = {}
        self.tma_slot = "0"
        self.tma_ranks: set[int] = set()
        #: The threads a Flat walk spreads over: their index and count's name.
        self.team = ("lid", self.constants.threads[1])
        self.role: str | None = None
        #: Per mask (by result id): the block-uniform condition under which it masks
        #: nothing; and the masks being emitted as no-ops (``materialize``).
        self.unmasked: dict[int, str] = {}
        self.elided: set[int] = set()
        self.planned = {s.buffer: s.layout for s in kernel.smem}
        self.lines: list[str] = []
        self.prologue: dict[str, str] = {}
        self.locals: dict[str, tuple[str, str, int, int]] = {}
        self.static_smem_bytes = 0
        self.unplanned_smem_bytes = 0
        self.depth = 1
        self.sources = SourceLines()
        #: While a walk over a distribution runs: that distribution, and where it began.
        self.walking: Distribution | None = None
        #: The index of the element the current walk's thread holds at its own slot.
        self.walk_index: tuple[str, ...] = ()
        self.walk_head = self.walk_start = 0
        self.stored = {op.operands[0].id for op in walk(kernel.body) if op.kind in STORES}
        #: Lazy loads of a tensor the kernel stores to (a tile of symbolic size, which no
        #: registers hold), by the tensor's id: each load's result id and access. The
        #: store over them ends them (``expired``): read after it, they would give the
        #: new elements (``op_store``). The tensors stored to so far.
        self.overwritten: dict[int, list[tuple[int, Access]]] = {}
        self.expired: set[int] = set()
        self.stored_so_far: set[int] = set()
        #: The name of each quotient extent that a mask tests (``extent``).
        self.extents: dict[Dim, str] = {}
        #: While a store's value is printed: the terms of the condition it is stored under,
        #: which a read inside the value need not test again.
        self.implied: frozenset[str] = frozenset()

    # -- output --------------------------------------------------------------------------

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def open(self, text: str) -> None:
        self.line(text + " {")
        self.depth += 1

    def unroll(self) -> None:
        """Ask for the next loop to unroll, in dialects that need asking."""
        if self.d.unroll:
            self.line(self.d.unroll)

    def close(self) -> None:
        self.depth -= 1
        self.line("}")

    def otherwise(self) -> None:
        """Open the else branch of the ``if`` just closed."""
        self.lines[-1] += " else {"
        self.depth += 1

    def declare(self, key: str, text: str) -> None:
        """A declaration at the top of the kernel, once however often it is needed."""
        self.prologue.setdefault(key, text)

    def declare_shared(
        self, ctype: str, name: str, count: int, element_bytes: int, size: str | None = None
    ) -> None:
        """A shared array of ``count`` elements at the top of the kernel, once, its size
        printed as ``size`` (a constant's name) if given; its bytes count toward the
        kernel's static shared memory."""
        if name not in self.prologue and name not in self.locals:
            self.static_smem_bytes += count * element_bytes
        text = self.d.local(ctype, name, size or str(count))
        self.declare_local(name, ctype, count, element_bytes, text)

    def declare_local(self, name: str, ctype: str, count: int, align: int, text: str) -> None:
        """A shared array: ``text`` at the top of the kernel, or, where the dialect's
        launches allocate shared memory, a parameter the launch passes."""
        if self.d.launched_locals:
            self.locals.setdefault(name, (ctype, name, count, align))
        else:
            self.declare(name, text)

    def count(self, t: Any) -> str:
        """How many elements a tile of type ``t`` (or one stage of a shared buffer) holds,
        its tiles by name (``BM*BN``)."""
        return self.constants.count(t, self.factor, slot=True)

    def named(self, name: str, value: int, written: str | None = None) -> str:
        """``value`` by the name a kernel declares it under (``constexpr int MMA_K =
        16;``, once, if the code uses it): a number of the target (its warp's lanes) or of
        an instruction (an MMA's shape) that the code would otherwise repeat. ``written``
        is the declaration's expression where the value follows from other constants
        (``THREADS / TX``)."""
        if name in HEADER_NUMBERS:
            assert value == header_numbers(self.d.name, self.lanes)[name], name
            return HEADER_NUMBERS[name]
        held = self.numbers.setdefault(name, (value, written or str(value)))
        assert name in NUMBERS and held[0] == value, name
        if written and held[1] == str(value):  # what it follows from, once known
            self.numbers[name] = (value, written)
        return name

    def share(self, dist: Distribution | None, t: Any) -> str:
        """The slots of each thread's part of a tile of type ``t`` held in ``dist``: its
        share of the tile, by the tiles' names (``BM*BN / THREADS``), where the threads
        split the tile evenly (a product's accumulator), its rows of a row vector, else
        the number."""
        if isinstance(dist, (Rows, FragmentRows)):
            return self.rows_slots(dist)
        slots = _slots(dist, self.kernel.threads)
        if (
            isinstance(dist, (Grid, Fragments))
            and slots * self.kernel.threads == dist.rows * dist.cols
        ):
            count = self.count(t)
            if not count.isdigit():
                return f"{count} / {self.constants.threads[1]}"
        return str(slots)

    def rows_slots(self, rows: Rows | FragmentRows) -> str:
        """The slots of a row vector: the rows of a thread's Grid register block, or
        those of a lane's fragments."""
        if isinstance(rows, Rows):
            return self.block_rows(rows.rows, rows.ty)
        lane_rows = self.named("LANE_ROWS", rows.shape.row_slots)
        return lane_rows if rows.fm == 1 else f"{rows.fm}*{lane_rows}"

    def block_rows(self, rows: int, ty: int, t: Any = None) -> str:
        """The rows of a thread's register block in a Grid of ``rows`` (of a tile of type
        ``t``, where one is given): ``RM``, declared as the rows' tile over the thread
        rows (``BM / TY``) where the type or the size says which tile they are, the
        number where the kernel's Grids differ in it."""
        held = self.numbers.get("RM")
        if held is not None and held[0] != rows // ty:
            return str(rows // ty)
        tile = self.constants.shape(t)[0] if t is not None else Dim.const(rows)
        if tile.constant is not None:
            unit = self.tile_unit(tile)
            tile = Dim.sym(unit[1]) if unit else tile
        written = f"{self.c(tile)} / {self.grid_threads()[0]}" if tile.constant is None else None
        return self.named("RM", rows // ty, written)

    def c(self, dim: Dim, unit: Dim | None = None) -> str:
        """``dim`` in C; where it is an offset along an axis of tiles of ``unit`` (a
        tile's name, or a size that one tile has), a whole number of them prints as that
        (``BK``, ``BK*kb + 2*BK``, ``BD*pid_b0``). Kept by dim and spelling: a kernel
        prints the same offsets and sizes many times."""
        key = (dim, dim.spelled, unit, unit.spelled if unit is not None else None)
        text = self.printed.get(key)
        if text is None:
            text = c_dim(dim, self.symbols, self.constants.strides, self.tile_unit(unit),
                         self.constants.spelled_names)  # fmt: skip
            self.printed[key] = text
        return text

    def tile_unit(self, size: Dim | None) -> tuple[int, str] | None:
        """The size and name of the schedule's tile ``size`` (a tile's name), of the
        size that ``size`` is spelled as (``D``), or of size ``size``, where one tile
        has it."""
        if size is not None and size.spelled is not None and size.constant:
            text = c_dim(size, spelled=self.constants.spelled_names)
            if re.fullmatch(r"[A-Za-z_]\w*", text):
                return size.constant, text
        if size is not None and size.constant is None:
            tile = {name: value for value, name in self.constants.extents.values()}
            return next(((tile[n], n) for n in (str(size),) if n in tile), None)
        names = {name for value, name in self.constants.extents.values()
                 if size is not None and value == size.constant}  # fmt: skip
        return (size.constant, names.pop()) if size and size.constant and len(names) == 1 else None

    def factor(self, dim: Dim) -> str:
        """``c``, parenthesized where the dim is a sum (``C - 8``), to multiply by."""
        return c_factor(dim, self.symbols, self.constants.strides, self.constants.spelled_names)

    def run(self) -> SimtKernel:
        params = []
        for p in self.kernel.params:
            name = self.namer.fresh(p.name, "arg")
            if isinstance(p.type, TensorType):
                self.forms[p.id] = Form("tensor", tuple(p.type.dims), name)
                params.append(SimtParam(name, "tensor", p.type.dtype.name, p.id in self.stored))
            else:
                self.forms[p.id] = Form("scalar", (), name)
                params.append(SimtParam(name, "scalar", p.type.kind))
        if self.kernel.producer:
            self.specialized(self.kernel.body)
        else:
            self.block(self.kernel.body)
        grid = tuple((self.symbols[a.name], a.extent, a.block) for a in self.kernel.grid)
        threads = self.kernel.threads + self.kernel.producer
        sizes = {d: self.symbols[d] for d in self.dims}
        body = tuple(with_named_indices(without_single_iterations(self.lines),
                                        self.constants.names, self.d.index_type))  # fmt: skip
        derived = [self.d.constant.format(name=name, value=value)
                   for name, value in self.stage_bytes_names.values()]  # fmt: skip
        # the words of the code, not of its comments, scanned once for all the names
        read = words(re.sub(r"//.*", "", "\n".join(body)))
        # a read under a store that tests its bound leaves it out: declared where read
        derived += [f"const {self.d.index_type} {name} = {self.c(dim)};"
                    for dim, name in self.extents.items() if name in read]  # fmt: skip
        prologue = (*derived, *self.prologue.values())
        used = read | words(re.sub(r"//.*", "", "\n".join(prologue)))
        numbers = [self.d.constant.format(name=name, value=self.numbers[name][1])
                   for name in NUMBERS if name in self.numbers and name in used]  # fmt: skip
        used |= words("\n".join(numbers))
        # a program's threads are whole warps: the schedule's count of them
        warps = {name: _warps(count // self.lanes, self.named("WARP_SIZE", self.lanes))
                 for count, name in (self.constants.threads, self.constants.producers)
                 if count and count % self.lanes == 0}  # fmt: skip
        prologue = (*self.constants.declarations(used, self.d.constant, warps), *numbers,
                    *prologue)  # fmt: skip
        declared = words("\n".join(prologue))
        blocks = {self.symbols[a.name]: step for a in self.kernel.grid
                  if (step := self.constants.step(a.name)) is not None
                  and step in declared}  # fmt: skip
        return SimtKernel(self.kernel.name, tuple(params), sizes, grid, threads,
                          prologue, body,
                          frozenset(self.wgmma), self.smem_bytes, self.static_smem_bytes,
                          tuple(self.tensor_maps.values()), frozenset(self.tma_ranks),
                          one_block=bool(self.kernel.producer),
                          locals=tuple(self.locals.values()),
                          checked=self.checked, blocks=blocks,
                          unplanned_smem_bytes=self.unplanned_smem_bytes)  # fmt: skip

    def block(self, block: Block) -> None:
        # An op that writes nothing (a lazy value) leaves its line's comment to the next
        # op that writes code, unless that op's code comes from another line.
        pending = None
        for op in block.ops:
            start, indent = len(self.lines), "  " * self.depth
            comment = self.sources.comment(op.span)
            handler = getattr(self, "op_" + op.kind, None)
            if handler is not None:
                handler(op)
            elif op.kind in _ELEMENTWISE:
                self.elementwise(op)
            else:
                raise NotLowered(f"'{op.kind}'")
            if len(self.lines) == start:
                pending = comment or pending
                continue
            comment = comment or pending
            if comment is not None:
                self.lines.insert(start, indent + comment)
            pending = None

    # -- reading values ------------------------------------------------------------------

    def at(self, x: Any, index: tuple[str, ...], out: tuple[Dim, ...]) -> str:
        """Operand ``x`` at the consumer's index ``index`` over shape ``out``, with
        numpy broadcasting: a size-1 axis of ``x`` reads its one element."""
        if not isinstance(x, Value):
            return self.d.literal(x) if isinstance(x, float) else str(x)
        form = self.forms[x.id]
        if form.kind == "scalar":
            return form.name
        lead = len(out) - len(form.dims)
        own = tuple(
            "0" if d == Dim.const(1) and out[lead + k] != Dim.const(1) else index[lead + k]
            for k, d in enumerate(form.dims)
        )
        if form.kind == "lazy":
            assert form.element is not None
            return f"({form.element(own)})"
        if form.kind == "owned":
            return f"{form.name}[{self.slot(form, own, index)}]"
        return f"{form.name}[{self.flat_index(own, form.dims)}]"

    def slot(self, form: Form, own: tuple[str, ...], index: tuple[str, ...]) -> str:
        """Where this thread holds an owned value's element, inside the walk that reads it:
        the walk's own slot, or the row slot of a row vector read in a walk over its rows."""
        if isinstance(form.dist, (Rows, FragmentRows)) and own[0] == index[0] == "i":
            if self.walking == form.dist:
                return "r"
            if isinstance(self.walking, (Grid, Fragments)) and rows_of(self.walking) == form.dist:
                return self.row_slot(self.walking)
        elif self.walking == form.dist and own == index == self.walk_index:
            return "t"  # not a shifted element (a concat's later piece): another thread's
        raise NotLowered("a value held in registers, read where another thread holds it")

    def row_slot(self, dist: Grid | Fragments) -> str:
        """Inside a walk over ``dist``: the slot of the element's row in its row vectors."""
        if isinstance(dist, Grid):
            return "r"
        if dist.fm == 1:  # one fragment along the rows: frag / fn is 0
            return dist.shape.row_slot
        lane_rows = self.named("LANE_ROWS", dist.shape.row_slots)
        fn = parenthesized(dist.fn_text)
        return f"frag / {fn} * {lane_rows} + {parenthesized(dist.shape.row_slot)}"

    def flat_index(self, index: tuple[str, ...], dims: tuple[Dim, ...]) -> str:
        """The row-major position of an element; size-1 axes add nothing."""
        out = "0"
        for i, d in zip(index, dims, strict=True):
            if d == Dim.const(1):
                continue
            out = i if out == "0" else f"({out}) * {self.factor(d)} + {i}"
        return out

    def split_flat(self, dims: tuple[Dim, ...], t: Any = None) -> tuple[str, ...]:
        """Declare the index of each axis from the flat index ``e`` of a tile of ``dims``
        (of type ``t``, whose tiles are then named); returns their names."""
        if len(dims) == 1:
            return ("e",)
        if len(dims) != 2:
            raise NotLowered(f"a tile of rank {len(dims)}")
        cols = self.factor(dims[1] if t is None else self.constants.shape(t)[1])
        if cols == "1":  # one column: the flat index is the row
            self.line(f"const {self.d.index_type} i = e;")
            return ("i", "0")
        self.line(f"const {self.d.index_type} i = e / {cols};")
        self.line(f"const {self.d.index_type} j = e - i * {cols};")
        return ("i", "j")

    # -- walking a distribution -------------------------------------------------------------

    def place_in_grid(self) -> None:
        """The thread's column ``tx`` and row ``ty`` in the Grid distribution's threads."""
        tx = self.grid_threads()[1]
        self.declare("grid", f"const int tx = lid % {tx}, ty = lid / {tx};")

    def grid_threads(self) -> tuple[str, str]:
        """The rows and columns of the Grid distribution's threads, by name (``TY``,
        ``TX``): a Grid walk steps by them."""
        tx = min(GRID_COLUMNS, self.kernel.threads)
        written = f"{self.constants.threads[1]} / TX"
        return self.named("TY", self.kernel.threads // tx, written), self.named("TX", tx)

    def place_in_wave(self) -> None:
        """The thread's lane, and its warp where the program has more than one."""
        lanes = self.named("WARP_SIZE", self.lanes)
        wave = f", wave = lid / {lanes}" if self.kernel.threads > self.lanes else ""
        self.declare("wave", f"const int lane = lid % {lanes}{wave};")

    def walk(self, dist: Distribution, t: Any = None) -> tuple[str, ...]:
        """Open the loops over this thread's elements of ``dist``, the layout of a value
        of type ``t`` where one is given (its tiles then bound the loops by name);
        ``close_walk`` closes them. Returns the index of the element; its slot is ``t``
        (``r`` in Rows)."""
        self.walk_head = len(self.lines)
        if isinstance(dist, Flat) and _row_walk(dist.dims):
            # Rows of a constant count: a loop over them that unrolls, so that a row's
            # vectors (a norm's mean, a softmax's max) are read at constant slots.
            i64, (tid, threads) = self.d.index_type, self.team
            self.unroll()
            rows = self.constants.shape(t)[0] if t is not None else dist.dims[0]
            self.open(f"for (int i = 0; i < {self.c(rows)}; ++i)")
            self.open(f"for ({i64} j = {tid}; j < {self.c(dist.dims[1])}; j += {threads})")
            index = ("i", "j")
        elif isinstance(dist, Flat):
            total = self.c(math.prod(dist.dims, start=Dim.const(1))) if t is None else self.count(t)
            i64, (tid, threads) = self.d.index_type, self.team
            self.open(f"for ({i64} e = {tid}, t = 0; e < {total}; e += {threads}, ++t)")
            index = self.split_flat(dist.dims, t)
        elif isinstance(dist, Fragments):
            shape = dist.shape
            self.open_fragments(dist, 1)
            self.line(f"const int j = {dist.warp_col}{dist.frag_col}{shape.col};")
            self.line(f"const int t = frag * {self.named('MMA_REGS', shape.regs)} + reg;")
            index = ("i", "j")
        elif isinstance(dist, FragmentRows):
            self.place_in_wave()
            shape = dist.shape
            self.unroll()
            self.open(f"for (int fm = 0; fm < {dist.fm}; ++fm)")
            self.unroll()
            lane_rows = self.named("LANE_ROWS", shape.row_slots)
            self.open(f"for (int rs = 0; rs < {lane_rows}; ++rs)")
            first = f"wave * {self.named('WARP_M', dist.rows // dist.wm)} + " if dist.wm > 1 else ""
            self.line(
                f"const int i = {first}fm * {self.named('MMA_M', shape.m)} + {shape.slot_row};"
            )
            self.line(f"const int r = fm * {lane_rows} + rs;")
            index = ("i",)
        else:
            self.place_in_grid()
            self.open(f"for (int r = 0; r < {self.block_rows(dist.rows, dist.ty, t)}; ++r)")
            ty, tx = self.grid_threads()
            self.line(f"const int i = ty + r * {ty};")
            index = ("i",)
            if isinstance(dist, Grid):
                self.open(f"for (int c = 0; c < {dist.rn}; ++c)")
                self.line(f"const int j = tx + c * {tx};")
                self.line(f"const int t = r * {dist.rn} + c;")
                index = ("i", "j")
        self.walking, self.walk_index = dist, index
        self.walk_start = len(self.lines)
        return index

    def open_fragments(self, dist: Fragments, step: int) -> None:
        """Open the loops over this thread's registers of a fragment tile, ``step`` at a
        time, and declare the row ``i`` of register ``reg``."""
        shape = dist.shape
        self.place_in_wave()
        self.unroll()
        self.open(f"for (int frag = 0; frag < {dist.frags}; ++frag)")
        self.unroll()
        increment = "++reg" if step == 1 else f"reg += {step}"
        self.open(f"for (int reg = 0; reg < {self.named('MMA_REGS', shape.regs)}; {increment})")
        self.line(f"const int i = {dist.warp_row}{dist.frag_row}{shape.row};")

    def close_walk(self) -> None:
        """Close a walk; the slot counter and the indices that nothing used go."""
        dist = self.walking
        body = "\n".join(self.lines[self.walk_start :])
        if isinstance(dist, Flat) and not _row_walk(dist.dims):
            self.flat_head(dist, "[t]" in body, re.search(r"\be\b", body) is not None)
        for k in reversed(range(self.walk_head + 1, self.walk_start)):
            declared = re.match(rf"\s*const (?:int|{self.d.index_type}) (\w+) = ", self.lines[k])
            later = "\n".join(self.lines[k + 1 :])
            if declared and declared[1] in "tijr" and not re.search(rf"\b{declared[1]}\b", later):
                del self.lines[k]
        self.walking = None
        self.close()
        if isinstance(dist, (Grid, Fragments, FragmentRows)) or (
            isinstance(dist, Flat) and _row_walk(dist.dims)
        ):
            self.close()

    def flat_head(self, dist: Flat, slots: bool, indexed: bool = True) -> None:
        """The head of a flat walk, once its body is known: without a slot counter when
        nothing reads one; with a constant trip count when the tile's size is constant,
        so that the loop unrolls and the thread's slots stay in registers, and the
        element's index where the body reads it (a value computed from registers alone,
        which a store then writes, reads none)."""
        head = self.lines[self.walk_head]
        if not slots:
            self.lines[self.walk_head] = head.replace(", t = 0", "").replace(", ++t", "")
            return
        total = 1
        for d in dist.dims:
            if d.constant is None:
                return
            total *= d.constant
        indent = head[: len(head) - len(head.lstrip())]
        threads = self.kernel.threads
        lines = [f"for (int t = 0; t < {-(-total // threads)}; ++t) {{"]
        if indexed or total % threads:
            lines.append(f"  const {self.d.index_type} e = lid + t * {self.team[1]};")
        if total % threads:
            lines.append(f"  if (e >= {total}) break;")
        if self.d.unroll:
            lines.insert(0, self.d.unroll)
        self.lines[self.walk_head : self.walk_head + 1] = [indent + line for line in lines]

    def materialize(self, x: Value, dist: Distribution, name: str) -> Form:
        """``x`` computed into a new private array in ``dist``. Where ``x`` applies masks
        (a ragged edge, causal attention's) that mask nothing on most blocks, the block
        computes it without them when none applies: a branch per block instead of a
        compare and a select per element. In attention every key block but the last
        (and, causal, those on the diagonal) takes the branch without: bf16 at head dim
        128 and S 16384 on an H200 took 20.7 ms instead of 22.4, causal 10.7 instead of
        13.1."""
        self.line(f"float {name}[{self.share(dist, x.type)}];")
        masks = self.masks_in(x)
        if masks:
            self.open(f"if ({' && '.join(masks.values())})")
            self.line("// every mask is a no-op on this block")
            self.elided = set(masks)
            self.fill(x, dist, name)
            self.elided = set()
            self.close()
            self.otherwise()
        self.fill(x, dist, name)
        if masks:
            self.close()
        return Form("owned", tuple(x.type.dims), name, dist=dist)

    def fill(self, x: Value, dist: Distribution, name: str) -> None:
        index = self.walk(dist, x.type)
        slot = "r" if isinstance(dist, (Rows, FragmentRows)) else "t"
        self.line(f"{name}[{slot}] = {_bare(self.at(x, index, tuple(x.type.dims)))};")
        self.close_walk()

    def masks_in(self, x: Value) -> dict[int, str]:
        """The masks that the expression of ``x`` applies and that know when they mask
        nothing, with those conditions."""
        found: dict[int, str] = {}
        stack, seen = [x], set()
        while stack:
            v = stack.pop()
            if not isinstance(v, Value) or v.id in seen or self.forms[v.id].kind != "lazy":
                continue
            seen.add(v.id)
            if v.id in self.unmasked:
                found[v.id] = self.unmasked[v.id]
            producer = self.producers.get(v.id)
            stack.extend(producer.operands if producer is not None else ())
        return found

    def carried(self, dims: tuple[Dim, ...], value: Value) -> Distribution:
        """The distribution of a tile a loop carries, as the loop yields it: a product's
        own (and its row vectors'), else Grid for 2-D tiles and Rows for vectors."""
        producer = self.producers.get(value.id)
        if producer is not None and isinstance(producer.attr("mma"), Mma):
            dist = self.product_dist(producer, tuple(producer.results[0].type.dims))
            return dist if len(dims) == 2 else rows_of(dist)
        if len(dims) == 1:
            product = self.product_under(value)
            if product is not None:  # a running row maximum or sum of a product's rows
                return rows_of(self.product_dist(product, tuple(product.result.type.dims)))
            return rows_for(dims[0], self.kernel.threads)
        return grid_for(dims, self.kernel.threads)

    def product_under(self, value: Value) -> Op | None:
        """The product whose rows a row vector is computed from, through elementwise ops
        and ``softmax_online``, if any."""
        stack, seen = [value], set()
        while stack:
            v = stack.pop()
            producer = self.producers.get(v.id)
            if producer is None or v.id in seen:
                continue
            seen.add(v.id)
            if isinstance(producer.attr("mma"), Mma) and len(producer.result.type.dims) == 2:
                return producer
            stack.extend(producer.operands)
        return None

    # -- scalars and elementwise -------------------------------------------------------

    def scalar(self, op: Op, expr: str) -> None:
        name = self.namer.fresh(self.temps.wanted(op.result), "s")  # s, s_1: nothing known
        self.forms[op.result.id] = Form("scalar", (), name)
        self.line(f"const {self.d.scalar_types[op.result.type.kind]} {name} = {expr};")

    def op_const(self, op: Op) -> None:
        value = op.attr("value")
        expr = str(int(value)) if isinstance(value, (bool, int)) else self.d.literal(value)
        self.scalar(op, expr)

    def op_dim_to_float(self, op: Op) -> None:
        self.scalar(op, f"(float)({self.c(op.attr('dim'))})")

    def op_kv_slot(self, op: Op) -> None:
        """The slot of a cache's ring that this program's row goes to (``kv_slot``)."""
        name = self.symbols[op.result.name]
        expr = kv_slot(op, self.forms[op.operands[0].id].name, self.c)
        self.line(f"const {self.d.index_type} {name} = {expr};")

    def op_kv_visible(self, op: Op) -> None:
        """The keys of its split that this program's query row sees, written by one
        thread (``kv_visible``)."""
        seen, lengths = (self.forms[v.id].name for v in op.operands)
        statement = kv_visible(op, seen, lengths, self.d.index_type, self.c)
        self.line(f"if (lid == 0) {statement}")

    def op_kv_advance(self, op: Op) -> None:
        """A cache's length grows by the positions appended, written by one thread."""
        lengths, row = self.forms[op.operands[0].id].name, self.c(Dim.sym(op.attr("pid")))
        self.line(f"if (lid == 0) {lengths}[{row}] += {self.c(op.attr('n'))};")

    def op_kv_lengths(self, op: Op) -> None:
        """A batch row's length as i32 (``cache.lengths``), written by one thread."""
        out, lengths = (self.forms[v.id].name for v in op.operands)
        row, i32 = self.c(Dim.sym(op.attr("pid"))), self.d.storage["i32"]
        self.line(f"if (lid == 0) {out}[{row}] = ({i32}){lengths}[{row}];")

    def lazy(self, result: Value, element: Element, *operands: Any) -> None:
        """``result`` as an expression of its index, in the distribution of the owned
        values among ``operands``."""
        dist = None
        for v in operands:
            other = self.forms[v.id].dist if isinstance(v, Value) else None
            if other is None or other == dist:
                continue
            if dist is None or (isinstance(other, (Grid, Fragments)) and rows_of(other) == dist):
                dist = other
            elif not (isinstance(dist, (Grid, Fragments)) and rows_of(dist) == other):
                raise NotLowered("values held in registers in two different distributions")
        self.forms[result.id] = Form("lazy", tuple(result.type.dims), element=element, dist=dist)

    def expression(self, op: Op, index: tuple[str, ...], out: tuple[Dim, ...]) -> str:
        """An elementwise op's value at ``index``, rounded to its result's dtype, as every
        op's result is (``docs/numerics.md``); a cast rounds, with saturation, itself."""
        expr = self.math(op, index, out)
        t = op.results[0].type
        dtype = getattr(t, "dtype", None)
        if op.kind in ("cast", "join_i32") or dtype is None or dtype.name in ("f32", "bool"):
            return expr  # (join_i32's is an exact int, which a float context converts once)
        return self.d.round(dtype.name, expr)

    def math(self, op: Op, index: tuple[str, ...], out: tuple[Dim, ...]) -> str:
        """An elementwise op's value at ``index``, computed in f32."""
        d = self.d
        if op.kind in _LOGICAL:
            parts = [f"({_bare(self.at(x, index, out))})" for x in op.operands]
            return f"!{parts[0]}" if len(parts) == 1 else f" {_LOGICAL[op.kind]} ".join(parts)
        if op.kind in _OPERATORS or op.kind in _CALLED or op.kind == "pow":
            a, b = (self.at(x, index, out) for x in binary_operands(op))
            if op.kind == "pow":
                exponent = binary_operands(op)[1]
                integer = isinstance(exponent, Value) and exponent.type == ScalarType("int")
                return d.pown.format(x=a, n=b) if integer else f"{d.unary['pow']}({a}, {b})"
            if op.kind in _CALLED:
                return f"{d.unary[op.kind]}{integer_variant(op)}({a}, {b})"
            return f"{a} {_OPERATORS[op.kind]} {b}"
        if op.kind == "where":
            mask, a, b = named_operands(op, ("cond", "a", "b"))
            cond, a, b = (self.at(x, index, out) for x in (mask, a, b))
            compared = getattr(self.producers.get(mask.id), "kind", None) in _CONDITIONS
            if not (compared and self.forms[mask.id].kind == "lazy"):
                cond = f"{cond} != 0.0f"  # a mask held as a float (OpenCL C tests ints only)
            return f"{cond} ? {a} : {b}"
        if op.kind == "dropout":
            x, p, seed = (self.at(v, index, out) for v in dropout_operands(op))
            at: Access = op.attr("at")
            place, _ = self.position(tuple(a.extent for a in at.axes), at, index)
            return f"tsr_dropout({x}, {seed}, {place}, {p})"
        if op.kind == "join_i32":
            high, low = (self.at(x, index, out) for x in op.operands)
            return f"tsr_join_i32({high}, {low}, {op.attr('radix')})"
        if op.kind == "index_along":
            at = op.attr("at")
            place, _ = self.position(tuple(a.extent for a in at.axes), at, index)
            stride, size = (self.c(op.attr(a)) for a in ("stride", "size"))
            return f"(float)(({place}) / ({stride}) % ({size}))"
        if op.kind == "stochastic_cast":
            x, seed = (self.at(v, index, out) for v in stochastic_operands(op))
            at = op.attr("at")
            place, _ = self.position(tuple(a.extent for a in at.axes), at, index)
            mantissa, emin = STOCHASTIC_FORMATS[op.result.type.dtype.name]
            x = f"tsr_stochastic_round({x}, {mantissa}, {emin}, {seed}, {place})"
            # rounded to the dtype as every op is; clamping after the draw is clamping before
            return saturated(x, op.result.type.dtype, "tsr_") if op.attr("saturate") else x
        x = self.at(op.operands[0], index, out)
        if op.kind == "cast":
            dtype = op.result.type.dtype
            return d.round(dtype.name, saturated(x, dtype, "tsr_") if op.attr("saturate") else x)
        if op.kind == "neg":
            return f"-{x}"
        return f"{d.unary[op.kind]}({x})"

    def elementwise(self, op: Op) -> None:
        result = op.results[0]
        if isinstance(result.type, ScalarType):
            self.scalar(op, self.expression(op, (), ()))
            return
        out = tuple(result.type.dims)
        forms = [self.forms[v.id].kind for v in op.operands]
        if all(k in ("scalar", "replicated") for k in forms) and _constant(out):
            name = self.namer.fresh(self.temps.wanted(result), "v")
            self.forms[result.id] = Form("replicated", out, name)
            count = self.count(result.type)
            self.line(f"float {name}[{count}];")
            self.unroll()
            self.open(f"for (int e = 0; e < {count}; ++e)")
            index = self.split_flat(out, result.type)
            self.line(f"{name}[e] = {self.expression(op, index, out)};")
            self.close()
            return
        self.lazy(result, lambda idx: self.expression(op, idx, out), *op.operands)
        inner = (self.chained.get(v.id, 0) for v in op.operands if isinstance(v, Value))
        self.chained[result.id] = 1 + max(inner, default=0)
        if self.chained[result.id] > MAX_INLINED_OPS and _constant(out):
            # (a tile of run-time size has no registers to hold it: its chain stays whole)
            dist = self.forms[result.id].dist or Flat(out)
            self.forms[result.id] = self.materialize(
                result, dist, self.namer.fresh(self.temps.wanted(result), "v")
            )
            self.chained[result.id] = 0

    def op_full(self, op: Op) -> None:
        value = self.d.literal(float(op.attr("value")))
        self.lazy(op.results[0], lambda idx: value)

    def op_iota(self, op: Op) -> None:
        offset = self.c(op.attr("offset"))
        self.lazy(op.results[0], lambda idx: f"{offset} + {idx[0]}")

    def op_expand_dims(self, op: Op) -> None:
        x = self.forms[op.operands[0].id]
        out = tuple(op.result.type.dims)
        axes = set(op.attr("axes"))
        if x.kind in ("replicated", "owned"):
            self.forms[op.result.id] = Form(x.kind, out, x.name, dist=x.dist)
            return
        element = x.element
        assert element is not None

        def dropped(index: tuple[str, ...]) -> str:
            return element(tuple(i for k, i in enumerate(index) if k not in axes))

        self.lazy(op.results[0], dropped, op.operands[0])

    def op_gather(self, op: Op) -> None:
        """``out[i, j] = x[i, index[i, j]]``, the index clamped into the row, as an
        expression: a row of ``x`` loaded from memory is read where it lies."""
        x, index = op.operands
        out, rows = tuple(op.result.type.dims), tuple(x.type.dims)
        cols = self.c(rows[1])

        def element(idx: tuple[str, ...]) -> str:
            column = f"tsr_clamp_index({_bare(self.at(index, idx, out))}, {cols})"
            return self.at(x, (idx[0], column), rows)

        self.lazy(op.result, element, x, index)

    def op_scatter(self, op: Op) -> None:
        self.scatter(op, "{v}")

    def op_scatter_add(self, op: Op) -> None:
        self.scatter(op, "{out} + {v}")

    def scatter(self, op: Op, combine: str) -> None:
        """``x`` with each row's values written (or added) where its indices say, each
        index clamped into the row, as a lazy value: an element starts as ``x``'s and
        takes, in ``k`` order, every value whose index names its column, so that a
        repeated index takes the last value (or sums in order) with no atomics, the same
        on every run. Each element reads its row's ``K`` indices: a loop written before
        the statement that reads it, inside the walk over the elements of that
        statement (a store's, a fill's); a reduction of a scatter is not lowered."""
        x, index, values = op.operands
        rows, by = tuple(x.type.dims), tuple(index.type.dims)
        dtype, cols, count = op.result.type.dtype.name, self.c(rows[1]), self.c(by[1])

        def element(idx: tuple[str, ...]) -> str:
            if not isinstance(self.walking, (Flat, Grid)):
                raise NotLowered("a scattered tile read outside a walk over its elements")
            name, k = self.namer.fresh("scattered"), self.namer.fresh("k")
            at = (idx[0], k)
            hit = f"tsr_clamp_index({_bare(self.at(index, at, by))}, {cols}) == {idx[1]}"
            value = self.d.round(dtype, combine.format(out=name, v=self.at(values, at, by)))
            self.line(f"float {name} = {_bare(self.at(x, idx, rows))};")
            self.open(f"for ({self.d.index_type} {k} = 0; {k} < {count}; ++{k})")
            self.line(f"if ({hit}) {name} = {value};")
            self.close()
            return name

        self.lazy(op.result, element, x, index, values)

    def op_split(self, op: Op) -> None:
        x = op.operands[0]
        axis = op.attr("axis") % len(x.type.dims)
        for k, part in enumerate(op.results):
            start = self.c(part.type.dims[axis] * Dim.const(k))

            def piece(idx: tuple[str, ...], start: str = start) -> str:
                moved = idx[axis] if start == "0" else f"{start} + {idx[axis]}"
                return self.at(x, (*idx[:axis], moved, *idx[axis + 1 :]), tuple(x.type.dims))

            self.lazy(part, piece, x)

    def op_concat(self, op: Op) -> None:
        """Tiles joined along an axis: each element reads the piece it falls in, at its
        index less the piece's start. A piece held in registers (a product's accumulator)
        has its elements in the threads that computed them, at the piece's own indices,
        which the concat moves or which a walk over the piece's distribution does not
        cover: such pieces go through shared memory first (``stage_all``), and the
        joined tile is then an expression that any thread reads at any index. Row
        vectors side by side (``attention_stats``'s two columns) need not: every holder
        of a row holds all of its columns."""
        axis = op.attr("axis") % len(op.result.type.dims)
        starts, start = [], Dim.const(0)
        for part in op.operands:
            starts.append(start)
            start = start + part.type.dims[axis]
        staged = dict(self.staged_pieces(op.operands, axis))
        last = op.operands[-1]

        def joined(idx: tuple[str, ...]) -> str:
            choice = ""
            for part, begin in zip(op.operands, starts, strict=True):
                at = idx[axis] if begin == Dim.const(0) else f"{idx[axis]} - ({self.c(begin)})"
                moved = (*idx[:axis], at, *idx[axis + 1 :])
                value = (
                    staged[part.id](moved)
                    if part.id in staged
                    else self.at(part, moved, tuple(part.type.dims))
                )
                if part is last:
                    return choice + value
                end = self.c(begin + part.type.dims[axis])
                choice += f"{idx[axis]} < {end} ? {value} : "
            raise AssertionError("concat of no tiles")

        self.lazy(op.result, joined, *(v for v in op.operands if v.id not in staged))

    def staged_pieces(self, pieces: tuple[Value, ...], axis: int) -> list[tuple[int, Element]]:
        """The pieces of a concat along ``axis`` that are held in registers, by value id,
        each read from a shared staging buffer, where one of them must be: a tile (Grid
        or Fragments) joined to anything, or a row vector joined along its rows. None
        where every piece held is a row vector joined along the columns."""
        held = [v for v in pieces if self.forms[v.id].dist is not None]
        if all(isinstance(self.forms[v.id].dist, (Rows, FragmentRows)) and axis > 0 for v in held):
            return []
        if self.role is not None:  # the staging's barriers would wait for the producer too
            raise NotLowered("a concat of tiles held in registers beside a producer warpgroup")
        tiles = []
        for v in held:
            shape = tuple(d.constant for d in v.type.dims)
            if None in shape or len(shape) > 2:
                raise NotLowered("a concat of a tile held in registers of a symbolic size")
            dims = tuple(v.type.dims)
            name = self.namer.fresh(f"{self.temps.wanted(v) or 'piece'}_stage")
            value = functools.partial(self.at, v, out=dims)
            tiles.append(Staged(name, self.forms[v.id].dist, shape, "f32", value))
        elements = self.stage_all(tiles, unplanned=True)
        return [(v.id, element) for v, (element, _) in zip(held, elements, strict=True)]

    def op_mask_causal(self, op: Op) -> None:
        s, rows, cols = op.operands
        out, result = tuple(op.result.type.dims), op.results[0]

        def masked(idx: tuple[str, ...]) -> str:
            if result.id in self.elided:
                return self.at(s, idx, out)
            row = self.at(rows, idx[:1], tuple(rows.type.dims))
            col = self.at(cols, idx[1:], tuple(cols.type.dims))
            return f"{col} > {row} ? {self.d.literal(float('-inf'))} : {self.at(s, idx, out)}"

        self.lazy(result, masked, s)
        first_row, first_col = (self.iota_start(v) for v in (rows, cols))
        if first_row is not None and first_col is not None:
            # no column of the block comes after its first row
            last_col = first_col + cols.type.dims[0] - 1
            self.unmasked[result.id] = f"{self.c(last_col)} <= {self.c(first_row)}"

    def iota_start(self, v: Value) -> Dim | None:
        producer = self.producers.get(v.id)
        return producer.attr("offset") if producer is not None and producer.kind == "iota" else None

    def op_mask_edge(self, op: Op) -> None:
        x = op.operands[0]
        axis, fill = op.attr("axis"), self.d.literal(float(op.attr("fill")))
        offset, extent = self.c(op.attr("offset")), self.c(op.attr("extent"))
        out, result = tuple(op.result.type.dims), op.results[0]

        def masked(idx: tuple[str, ...]) -> str:
            if result.id in self.elided:
                return self.at(x, idx, out)
            return f"{offset} + {idx[axis]} >= {extent} ? {fill} : {self.at(x, idx, out)}"

        self.lazy(result, masked, x)
        end = self.c(op.attr("offset") + x.type.dims[axis])
        self.unmasked[result.id] = f"{end} <= {extent}"  # the block ends inside the tensor

    # -- reductions ------------------------------------------------------------------------

    def _reduce(self, op: Op, combine: str, init: str, group: str) -> None:
        """Along the rows of a tile: ``combine`` joins two partials ``{a}`` and ``{b}``."""
        x = op.operands[0]
        dims = tuple(x.type.dims)
        if len(dims) != 2 or op.attr("axis") not in (1, -1) or dims[0].constant is None:
            raise NotLowered("a reduction other than along the rows of a tile")
        if self.forms[x.id].dist is not None:
            self.reduce_held_rows(op, combine, init)
            return
        if self._transposed_in_shared(x):
            self.forms[x.id] = self.materialize(
                x,
                grid_for(dims, self.kernel.threads),
                self.namer.fresh(self.temps.wanted(x), "held"),
            )
            self.reduce_held_rows(op, combine, init)
            return
        rows = self.c(self.constants.shape(x.type)[0])
        name = self.namer.fresh(self.temps.wanted(op.result), "v")
        self.forms[op.result.id] = Form("replicated", tuple(op.result.type.dims), name)
        threads = self.constants.threads[1]
        self.declare_shared("float", "tsr_scratch", self.kernel.threads, 4, threads)
        i64 = self.d.index_type
        self.line(f"float {name}[{rows}];")
        self.unroll()
        self.open(f"for (int i = 0; i < {rows}; ++i)")
        self.line(f"float r = {init};")
        element = self.at(x, ("i", "j"), dims)
        self.line(f"for ({i64} j = lid; j < {self.c(dims[1])}; j += {threads}) "
                  f"r = {combine.format(a='r', b=element)};")  # fmt: skip
        self.line(f"{name}[i] = {group}({self.d.group_context}tsr_scratch, r);")
        self.close()

    def _transposed_in_shared(self, x: Value) -> bool:
        """Whether ``x`` is the transpose of a tile held in registers (``norm_param_grad``'s
        running sums, reduced after its loop), which any thread reads from shared
        memory: its row reduction takes it into registers of a Grid first, each thread
        its own rows, rather than reducing every row with the whole group and leaving
        each thread all of the results (an array indexed by thread, on the stack)."""
        producer = self.producers.get(x.id)
        if producer is None or producer.kind != "transpose" or self.forms[x.id].kind != "lazy":
            return False
        held = self.forms[producer.operands[0].id]
        dims = tuple(x.type.dims)
        try:
            grid_for(dims, self.kernel.threads)
        except NotLowered:
            return False
        return held.kind == "owned" or held.dist is not None

    def op_sum(self, op: Op) -> None:
        self._reduce(op, "{a} + {b}", "0.0f", "tsr_group_sum")

    def op_max(self, op: Op) -> None:
        combine = f"{self.d.fmax}({{a}}, {{b}})"
        self._reduce(op, combine, self.d.literal(float("-inf")), "tsr_group_max")

    # -- global memory ---------------------------------------------------------------------

    def address(
        self, tensor: Value, at: Access, index: tuple[str, ...], t: Any = None
    ) -> tuple[str, str]:
        """(element offset, condition) of the access at a tile index, of a tile (or
        buffer) of type ``t`` where one is given: its tiles name the offsets. A dim of
        the tensor strides by the access's extent (or a merged axis's whole size) where
        that is the same size spelled as the kernel declares it (``K``, ``4*D``)."""
        dims = tuple(
            next((s for s in (a.extent, a.whole) if s is not None and s.spelled and s == d), d)
            for a, d in zip(at.axes, tensor.type.dims, strict=True)
        )
        return self.position(dims, at, index, t, self.forms[tensor.id].name)

    def position(
        self,
        dims: tuple[Dim, ...],
        at: Access,
        index: tuple[str, ...],
        t: Any = None,
        tensor: str | None = None,
    ) -> tuple[str, str]:
        """(row-major position in a tensor of ``dims``, condition) of the access at a
        tile index; an offset along an axis of a tile of ``t`` (or, without ``t``, of
        the one tile of the axis's size) counts whole tiles by its name. The condition
        tests a quotient extent of ``tensor`` (its C name) by its name (``extent``)."""
        tile = iter(index)
        tiles = iter(self.constants.shape(t) if t is not None else ())
        offset = ""
        conditions = []
        for k, (axis, d) in enumerate(zip(at.axes, dims, strict=True)):
            if axis.index:
                pos = self.c(axis.offset)
            else:
                i = next(tile)
                name = next(tiles, None)
                unit = axis.size if name is None or name.constant is not None else name
                offset_ = self.c(axis.offset, unit)
                if axis.offset == Dim.const(0):
                    pos = i
                else:  # a one-row tile's row is the offset itself
                    pos = offset_ if i == "0" else f"{offset_} + {i}"
                if axis.masked:
                    whole = tensor is not None and axis.extent == d  # the tensor's own dim
                    extent = self.extent(tensor, dims, k) if whole else self.c(axis.extent)
                    conditions.append(f"{pos} < {extent}")
            offset = _row_major(offset, self.factor(d), pos)
        return offset, " && ".join(conditions)

    def extent(self, tensor: str, dims: tuple[Dim, ...], axis: int) -> str:
        """Dim ``axis`` of the tensor named ``tensor``, of ``dims``, as a mask tests it: a
        quotient of sizes by the name the kernel declares it under once (``scale:
        Tensor["K/32", "N"]``'s ``scale_rows``, after the first tensor whose dim it is),
        where each unrolled fragment's mask would otherwise write the division and its
        number again."""
        dim = dims[axis]
        if dim.constant is not None or dim.is_integral:
            return self.c(dim)
        if dim not in self.extents:
            # a tensor's last axes as ``tile.load`` calls them, a vector's length its size
            words = ("size",) if len(dims) == 1 else (*(f"dim{k}" for k in range(len(dims) - 2)),
                                                       "rows", "cols")  # fmt: skip
            self.extents[dim] = self.namer.fresh(f"{tensor}_{words[axis]}")
        return self.extents[dim]

    def global_element(self, tensor: Value, at: Access, t: Any = None) -> Element:
        """A tensor's element at an index of a tile of type ``t`` as a float; zero past a
        masked edge."""
        pointer, dtype = self.forms[tensor.id].name, tensor.type.dtype.name

        def element(index: tuple[str, ...]) -> str:
            offset, condition = self.address(tensor, at, index, t)
            value = self.d.read(dtype, pointer, offset)
            terms = [c for c in condition.split(" && ") if c and c not in self.implied]
            return f"{' && '.join(terms)} ? {value} : 0.0f" if terms else value

        return element

    def guarded(self, x: Value, index: tuple[str, ...], out: tuple[Dim, ...], *under: str) -> str:
        """Operand ``x`` at ``index``, as a store prints it under the conditions ``under``:
        a read of a tensor inside it leaves out the bounds those conditions already test
        (the same terms, as printed), so that ``if (row < R) y[..] = x[..]`` does not read
        ``row < R ? x[..] : 0.0f``."""
        outer = self.implied
        self.implied = outer | {t for c in under for t in c.split(" && ") if t}
        try:
            return self.at(x, index, out)
        finally:
            self.implied = outer

    def check_bounds(self, op: Op) -> None:
        """In a debug build, the checks of ``op``'s access. The offsets are the
        program's, the same in all its threads, so a failed check stops the whole
        program alike: each thread records it (the first claims the record) and returns,
        except in a warp-specialized kernel, whose other warpgroup would wait for it
        forever: that one traps, failing the launch."""
        if self.sites is None:
            return
        stop = "__trap();" if self.kernel.producer else "return;"

        def fail(site: int, first: str, size: str, extent: str) -> str:
            return f"{{ tsr_out_of_bounds({FAULT}, {site}, {first}, {size}, {extent}); {stop} }}"

        for text in bounds_lines(self.sites, self.kernel, op, self.c, fail):
            self.line(text)
            self.checked = True

    def op_load(self, op: Op) -> None:
        self.check_bounds(op)
        tensor = op.operands[0]
        element = self.global_element(tensor, op.attr("at"), op.result.type)
        out = tuple(op.result.type.dims)
        if tensor.id not in self.stored:
            self.lazy(op.results[0], element)
            return
        if not _constant(out):
            if tensor.id in self.stored_so_far:  # other threads' elements, maybe
                raise NotLowered("a load of a symbolic size from a tensor the kernel wrote")
            # read where it is consumed, until the store over the tensor (``op_store``)
            result = op.result.id

            def before_the_store(index: tuple[str, ...]) -> str:
                if result in self.expired:
                    raise NotLowered("a read of a tensor after the kernel stored over it")
                return element(index)

            self.lazy(op.results[0], before_the_store)
            self.overwritten.setdefault(tensor.id, []).append((result, op.attr("at")))
            return
        name = self.namer.fresh(self.temps.wanted(op.result), "v")
        self.line(f"float {name}[{-(-_numel(out) // self.kernel.threads)}];")
        index = self.walk(Flat(out), op.result.type)
        self.line(f"{name}[t] = {element(index)};")
        self.close_walk()
        self.forms[op.result.id] = Form("owned", out, name, dist=Flat(out))

    def op_store(self, op: Op) -> None:
        """Store a tile. A store over a tensor that lazy loads read (an optimizer
        state's moment, updated in place in a tile of symbolic size) writes each element
        in the walk that reads it, so the loads must read the elements it writes; it
        ends them, and the value stored, read again later, is the element just stored
        (by the same thread: the value's walk), not its expression over the old ones."""
        tensor, tile = op.operands
        at: Access = op.attr("at")
        loads = self.overwritten.pop(tensor.id, [])
        if any(read != at for _, read in loads):
            raise NotLowered("a store over elements of a tensor other than those it read")
        self.store(op)
        self.stored_so_far.add(tensor.id)
        self.expired.update(result for result, _ in loads)
        if loads and self.forms[tile.id].kind == "lazy":
            dist = self.forms[tile.id].dist or Flat(tuple(tile.type.dims))
            element = self.global_element(tensor, at, tile.type)
            self.forms[tile.id] = Form("lazy", tuple(tile.type.dims), element=element, dist=dist)

    def store(self, op: Op) -> None:
        self.check_bounds(op)
        tensor, tile = op.operands
        at: Access = op.attr("at")
        out = tuple(tile.type.dims)
        dist = self.forms[tile.id].dist or Flat(out)
        if self.forms[tile.id].kind == "lazy" and self.uses.get(tile.id, 0) > 1 and _constant(out):
            # a value stored and read again (an elementwise kernel's results, the moments
            # of an optimizer step) is computed once into registers, not again from the
            # tensors at each reader
            name = self.namer.fresh(self.temps.wanted(tile), "v")
            self.forms[tile.id] = self.materialize(tile, dist, name)
            self.chained[tile.id] = 0
        if isinstance(dist, (Rows, FragmentRows)):
            self.store_rows(tensor, tile, at, dist)
            return
        if tensor.type.dtype.name == "i4":
            self.store_nibbles(tensor, tile, at, dist)
            return
        replicated = self.reads_replicated(tile) and _constant(out)
        if replicated and _numel(out) <= self.kernel.threads:
            self.store_replicated(tensor, tile, at)
            return
        if (
            isinstance(dist, Fragments)
            and dist.shape.pair_col
            and tensor.type.dtype.name in self.d.pair_writes
            and not at.axes[-1].index
        ):
            self.store_pairs(tensor, tile, at, dist)
            return
        index = self.walk(dist, tile.type)
        offset, condition = self.address(tensor, at, index, tile.type)
        value = self.guarded(tile, index, out, condition)
        store = self.d.write(tensor.type.dtype.name, self.forms[tensor.id].name, offset, value)
        self.line(f"if ({condition}) {store}" if condition else store)
        self.close_walk()

    def store_rows(self, tensor: Value, tile: Value, at: Access, dist: Rows | FragmentRows) -> None:
        """Store a row vector held in registers (attention's row logsumexp, ``[T.m]`` or
        ``[T.m, 1]``), or a few of them side by side (``attention_stats``'s ``[T.m, 2]``,
        a concat): every thread of a row of the grid (or of a fragment's row) holds the
        row's values, and the one at its first column stores them."""
        out = tuple(tile.type.dims)
        width = out[1].constant if len(out) == 2 else 1
        if len(out) > 2 or width is None or width > _ROW_STORE_COLUMNS:
            raise NotLowered("a store of a row vector held in registers, broadcast")
        (row,) = self.walk(dist, tile.type)
        column = "tx" if isinstance(dist, Rows) else f"({dist.shape.col})"
        for j in range(width):
            index = (row, *(str(j),) * (len(out) - 1))
            offset, condition = self.address(tensor, at, index)
            value = self.guarded(tile, index, out, condition)
            pointer = self.forms[tensor.id].name
            store = self.d.write(tensor.type.dtype.name, pointer, offset, value)
            first = " && ".join(c for c in (f"{column} == 0", condition) if c)
            self.line(f"if ({first}) {store}")
        self.close_walk()

    def store_nibbles(self, tensor: Value, tile: Value, at: Access, dist: Distribution) -> None:
        """Store a tile into a packed i4 tensor: the thread at each even element writes
        its byte whole, from its element and the next one, so that no two threads write
        one byte. The next element is computed again where it is an expression; the
        tile's columns start at an even column and are an even number (the tensor's
        last dim is even), so that it lies in the tile."""
        out = tuple(tile.type.dims)
        width = tile.type.dims[-1].constant
        if self.forms[tile.id].kind not in ("lazy", "scalar") or (width and width % 2):
            raise NotLowered("a store into an i4 tensor of values held in registers")
        index = self.walk(dist, tile.type)
        offset, condition = self.address(tensor, at, index)
        lo = self.guarded(tile, index, out, condition)
        hi = self.guarded(tile, (*index[:-1], f"{index[-1]} + 1"), out, condition)
        even = f"(({offset}) & 1) == 0"
        pointer = self.forms[tensor.id].name
        self.line(f"if ({' && '.join(c for c in (condition, even) if c)}) "
                  f"{pointer}[({offset}) >> 1] = tsr_i4_pair({lo}, {hi});")  # fmt: skip
        self.close_walk()

    def reads_replicated(self, x: Value) -> bool:
        """Whether ``x`` is a value that every thread holds whole, or an expression that
        reads one (a concat of row statistics, ``layernorm_grad``'s ``[T.m, 2]``): read
        at an index that differs from thread to thread, such an array goes on the
        stack."""
        form = self.forms[x.id]
        if form.kind == "replicated":
            return True
        producer = self.producers.get(x.id)
        if form.kind != "lazy" or form.dist is not None or producer is None:
            return False
        return any(isinstance(v, Value) and v.id in self.forms and self.reads_replicated(v)
                   for v in producer.operands)  # fmt: skip

    def store_replicated(self, tensor: Value, tile: Value, at: Access) -> None:
        """Store a small tile that every thread holds whole (a row reduction's values):
        thread ``e`` stores element ``e``, in a loop that unrolls, so that the array is
        read at constant indices and stays in registers (a loop from ``lid`` read it at
        a run-time index, which put it on the stack)."""
        out = tuple(tile.type.dims)
        self.unroll()
        self.open(f"for (int e = 0; e < {self.count(tile.type)}; ++e)")
        index = self.split_flat(out, tile.type)
        offset, condition = self.address(tensor, at, index)
        value = self.guarded(tile, index, out, condition)
        store = self.d.write(tensor.type.dtype.name, self.forms[tensor.id].name, offset, value)
        self.line(f"if (e == lid{f' && {condition}' if condition else ''}) {store}")
        self.close()

    def store_pairs(self, tensor: Value, tile: Value, at: Access, dist: Fragments) -> None:
        """Store a fragment tile two neighbouring columns at a time. The tile's columns
        are the tensor's last axis, so the two are neighbours in memory too: where both
        are in bounds and the first's address is aligned to the pair, one access writes
        them; at a ragged edge, or in a tensor whose rows do not keep the alignment, each
        element goes alone."""
        shape, out = dist.shape, tuple(tile.type.dims)
        self.walking, self.walk_index = dist, ("i", "j")
        value = self.at(tile, ("i", "j"), out)
        self.walking = None
        self.open_fragments(dist, 2)
        self.line(f"const int j0 = {dist.warp_col}{dist.frag_col}{shape.pair_col};")
        self.line("float pair[2];")
        self.unroll()
        self.open("for (int half = 0; half < 2; ++half)")
        if re.search(r"\bj\b", value):
            self.line("const int j = j0 + half;")
        if re.search(r"\bt\b", value):
            self.line(f"const int t = frag * {self.named('MMA_REGS', shape.regs)} + reg + half;")
        self.line(f"pair[half] = {value};")
        self.close()
        dtype, pointer = tensor.type.dtype.name, self.forms[tensor.id].name
        elements = [self.address(tensor, at, ("i", j), tile.type) for j in ("j0", "j0 + 1")]
        first, last_in = elements[0][0], elements[1][1]
        whole = " && ".join(c for c in (last_in, f"tsr_pair_aligned(&{pointer}[{first}])") if c)
        self.open(f"if ({whole})")
        self.line(self.d.write_pair(dtype, pointer, first, "pair[0]", "pair[1]"))
        self.close()
        self.otherwise()
        for half, (offset, condition) in enumerate(elements):
            store = self.d.write(dtype, pointer, offset, f"pair[{half}]")
            self.line(f"if ({condition}) {store}" if condition else store)
        self.close()
        self.close()
        self.close()

    # -- control flow ----------------------------------------------------------------------

    def op_for(self, op: Op) -> None:
        body = op.regions[0]
        _, *args = body.args
        arrays = []
        for init, arg, result in zip(op.operands, args, op.results, strict=True):
            name = self.namer.fresh(result.name or arg.name or self.temps.wanted(result), "v")
            if isinstance(arg.type, ScalarType):
                kind = self.d.scalar_types[arg.type.kind]
                self.line(f"{kind} {name} = {self.at(init, (), ())};")
                form = Form("scalar", (), name)
            else:
                dist = self.carried(tuple(arg.type.dims), body.yields[len(arrays)])
                form = self.materialize(init, dist, name)
            self.forms[arg.id] = self.forms[result.id] = form
            arrays.append(form)
        self.open(self.loop_header(op))
        self.block(body)
        self.carry(body.yields, arrays)
        self.close()

    def loop_header(self, op: Op) -> str:
        counter = self.symbols[op.regions[0].args[0].name]
        step = self.constants.step(op.regions[0].args[0].name) or self.c(op.attr("step"))
        end = self.c(op.attr("extent"))
        bound = f"{counter} * {step} < {end}"
        if op.attr("stop") is not None:
            bound += f" && {counter} * {step} < {self.c(op.attr('stop'))}"
        return f"for ({self.d.index_type} {counter} = 0; {bound}; ++{counter})"

    def carry(self, yields: tuple[Value, ...], arrays: list[Form]) -> None:
        """Assign a loop's yields to the arrays it carries, through temporaries when a
        yield is not already in its array (one yield may read another's old value)."""
        moves = []
        types = {}
        for value, array in zip(yields, arrays, strict=True):
            types[array.name] = value.type
            if self.forms[value.id].name == array.name and self.forms[value.id].kind != "lazy":
                continue
            if array.kind == "scalar":
                temp = self.namer.fresh("next")
                kind = self.d.scalar_types[value.type.kind]
                self.line(f"const {kind} {temp} = {self.at(value, (), ())};")
                moves.append((array, Form("scalar", (), temp)))
                continue
            assert array.dist is not None
            moves.append((array, self.materialize(value, array.dist, self.namer.fresh("next"))))
        for array, value in moves:
            if array.kind == "scalar":
                self.line(f"{array.name} = {value.name};")
                continue
            slots = self.share(array.dist, types[array.name])
            self.line(f"for (int t = 0; t < {slots}; ++t) {array.name}[t] = {value.name}[t];")

    def op_if(self, op: Op) -> None:
        """Branches that only compute lazy values become a choice per element; a branch
        with statements is not lowered yet."""
        cond = self.at(op.operands[0], (), ())
        branches = []
        for region in op.regions:
            before = len(self.lines)
            self.block(region)
            if any(not line.strip().startswith("//") for line in self.lines[before:]):
                raise NotLowered("an 'if' whose branches compute more than expressions")
            del self.lines[before:]
            branches.append(region.yields)
        for k, result in enumerate(op.results):
            then, other = branches[0][k], branches[1][k]
            out = tuple(result.type.dims) if not isinstance(result.type, ScalarType) else ()

            def choose(idx: tuple[str, ...], then: Value = then, other: Value = other,
                       out: tuple[Dim, ...] = out) -> str:  # fmt: skip
                return f"{cond} ? {self.at(then, idx, out)} : {self.at(other, idx, out)}"

            if isinstance(result.type, ScalarType):
                self.forms[result.id] = Form("scalar", (), f"({choose(())})")
            else:
                self.lazy(result, choose, then, other)


def _bare(expr: str) -> str:
    """``expr`` without the parentheses around all of it, which an assignment of it
    does not need (each lazy value's expression comes parenthesized)."""
    while expr.startswith("(") and _closing(expr) == len(expr) - 1:
        expr = expr[1:-1]
    return expr


def _closing(expr: str) -> int:
    """Where the parenthesis that opens ``expr`` closes."""
    depth = 0
    for k, ch in enumerate(expr):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return k
    return -1


def _slots(dist: Distribution | None, threads: int) -> int:
    if isinstance(dist, Flat):
        return -(-_numel(dist.dims) // threads)
    assert dist is not None
    return dist.slots


#: The most columns of row vectors held in registers that one store writes, a value at a
#: time from the thread at the row's first column.
_ROW_STORE_COLUMNS = 4


def _row_walk(dims: tuple[Dim, ...]) -> bool:
    """Whether a flat walk goes row by row: a few rows of a symbolic width."""
    return len(dims) == 2 and dims[0].constant is not None and dims[1].constant is None


def _constant(dims: tuple[Dim, ...]) -> bool:
    return all(d.constant is not None for d in dims)


def _numel(dims: tuple[Dim, ...]) -> int:
    total = 1
    for d in dims:
        assert d.constant is not None
        total *= d.constant
    return total


def _warps(count: int, lanes: str) -> str:
    """``count`` warps of ``lanes`` threads, as a declaration of threads writes them."""
    return lanes if count == 1 else f"{count}*{lanes}"


def _row_major(outer: str, size: str, pos: str) -> str:
    """The position ``outer * size + pos`` of an element along one more axis (of
    ``size``), without the terms that add or multiply nothing, as a person writes it."""
    if not outer:
        return pos
    scaled = outer if size == "1" else f"{parenthesized(outer)} * {size}"
    return scaled if pos == "0" else f"{scaled} + {pos}"
