"""One Tile IR kernel as C++: the body of a program instance, line by line.

A tile is a row-major float array in a per-thread scratch area; low-precision
values are rounded to their dtype whenever one is produced. Every op becomes a
call into the tile-primitives header or a short loop nest; an op whose operand
dies with it, in the same block, writes in place (the accumulator of an
``mma`` stays where it is for the whole K loop). Each statement carries a
comment with the ``.tsr`` line it comes from.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ...frozen import frozen
from ..check.bounds import Sites
from ..graph.dims import Dim
from ..graph.dtypes import DType
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
from ..graph.types import ScalarType, TensorType, TileType
from ..tile.ir import STORES, Access, Live, TileKernel
from ..tile.rewrite import use_counts
from .cexpr import (
    MAX_INLINED_OPS,
    c_dim,
    c_factor,
    c_float,
    integer_variant,
    kv_slot,
    kv_visible,
    param_name,
    saturated,
    words,
)
from .cpu_dequant import Dequantized, dequantized_operands
from .debug_checks import bounds_lines
from .naming import Namer, symbol_names
from .render import SourceLines
from .temporaries import Temporaries
from .tile_constants import tile_constants

__all__ = ["CParam", "CKernel", "emit_kernel", "KERNEL_FUNCTIONS", "C_TYPES", "ROUND"]

C_TYPES = {
    "f32": "float", "tf32": "float", "bf16": "tsr::bf16", "f16": "tsr::f16",
    "fp8_e4m3": "tsr::e4m3", "fp8_e5m2": "tsr::e5m2", "i32": "std::int32_t", "i8": "std::int8_t",
    "i4": "tsr::i4", "i64": "std::int64_t",
    "bool": "float",  # a mask between kernels: 1.0 and 0.0
}  # fmt: skip
#: How a value of each dtype is rounded when it is produced (f32 needs nothing).
ROUND = {"bf16": "tsr::round_bf16", "f16": "tsr::round_f16", "tf32": "tsr::round_tf32",
         "fp8_e4m3": "tsr::round_e4m3", "fp8_e5m2": "tsr::round_e5m2",
         "i32": "tsr::round_i32", "i8": "tsr::round_i8", "i4": "tsr::round_i4"}  # fmt: skip
_SCALAR_TYPES = {"float": "float", "int": "tsr::i64", "bool": "bool", "index": "tsr::i64"}
_UNARY = {
    "exp": "tsr::exp", "log": "std::log", "sqrt": "std::sqrt", "rsqrt": "tsr::rsqrt",
    "tanh": "tsr::tanh", "sigmoid": "tsr::sigmoid", "gelu": "tsr::gelu", "silu": "tsr::silu",
    "relu": "tsr::relu", "abs": "std::fabs", "round": "std::nearbyint", "sin": "std::sin",
    "cos": "std::cos", "neg": "-",
    **{name: f"std::{name}" for name in C_MATH},
}  # fmt: skip
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
#: The comparisons, as C++ operators: a bool, which a tile of floats holds as 1.0 or 0.0.
_COMPARED = {kind: symbol for symbol, kind in COMPARISONS.items()}
_OPERATORS = {**_BINARY, **_COMPARED}
#: ``and``, ``or`` and ``not`` of masks, as C++ operators: their operands are bools
#: (comparisons) or masks held as floats, which C++ takes as true where not 0.0.
_LOGICAL = {"logical_and": "&&", "logical_or": "||", "logical_not": "!"}
#: Binary ops that are calls, not operators.
_CALLED = {"pow": "std::pow", "maximum": "tsr::max_of", "minimum": "tsr::min_of",
           "floordiv": "tsr::floordiv", "mod": "tsr::mod"}  # fmt: skip
#: An element of a tile in generated code: ``name[index]``.
_ELEMENT = re.compile(r"\b([A-Za-z_]\w*)\[([^\[\]]*)\]")


@frozen
class CParam:
    """A kernel parameter: a tensor pointer, a scalar, or a size."""

    name: str
    c_type: str
    kind: str  # "tensor", "scalar" or "dim"
    written: bool = False
    #: The Tile IR's name (the caller's), where ``name`` had to change for C++.
    source: str = ""

    @property
    def decl(self) -> str:
        return self.declared(True)

    def declared(self, named: bool) -> str:
        """The declaration, the name in a comment where the function does not read it."""
        name = param_name(self.name, named)
        if self.kind == "tensor":
            return f"{'' if self.written else 'const '}{self.c_type}* {name}"
        return f"const {self.c_type} {name}"


@frozen
class CKernel:
    name: str
    source: str
    params: tuple[CParam, ...]
    #: The printed name of each size symbol (a keyword or a name of the generated
    #: code's own takes a suffix).
    sizes: dict[str, str]
    #: Program ids, their extents (C expressions) and the names the launch gives the
    #: extents, outermost first.
    grid: tuple[tuple[str, str, str], ...]
    #: Floats of scratch one program needs (a C expression) and the pointers into it.
    scratch: str
    storage: tuple[str, ...]
    body: tuple[str, ...]
    #: The declarations of the tile sizes it names (``tile_constants.py``), in the
    #: program and in the launch (the grid's extents count its programs in tiles).
    constants: tuple[str, ...] = ()
    launch_constants: tuple[str, ...] = ()
    #: The launch's flag that runs the programs on the team of threads.
    team: str = "threaded"


#: The functions of a kernel, by the suffix they add to its name.
KERNEL_FUNCTIONS = ("_program", "_launch")


def emit_kernel(
    kernel: TileKernel, dims: tuple[str, ...], name: str, sites: Sites | None = None
) -> CKernel:
    """The kernel's C++, its functions named after ``name`` (``name_program``,
    ``name_launch``), which the file has given it; with ``sites`` (a debug build), each
    global access checked against its tensor's bounds first."""
    return _Emitter(kernel, dims, name, sites).run()


_LINE_FLOATS = 16  # floats in a 64-byte cache line, as tsr::kLineFloats


def _whole_lines(size: str, value: str) -> str:
    """A buffer's size in floats (``size``, whose value is ``value`` where a number)
    rounded up to whole cache lines, so that the next buffer in the scratch area starts
    on a line as the first does: ``size`` itself where it is whole lines already, the
    rounded number where it is a number that is not."""
    if not value.isdigit():
        return f"tsr::whole_lines({size})"
    lines = -(-int(value) // _LINE_FLOATS) * _LINE_FLOATS
    return size if lines == int(value) else str(lines)


def _inside(axes: Any, corner: tuple[Dim | None, Dim | None]) -> bool:
    """Whether a window's tile axes hold exactly a live corner (rows, columns; None: the
    whole axis, which the window must then not mask): the part inside the tensor."""
    return all(
        (bound is None and not axis.masked) or bound == axis.extent - axis.offset
        for axis, bound in zip(axes, corner, strict=True)
    )


def _shape(t: Any) -> tuple[Dim, ...]:
    return tuple(getattr(t, "dims", ()))


class _Emitter:
    def __init__(
        self, kernel: TileKernel, dims: tuple[str, ...], name: str, sites: Sites | None
    ) -> None:
        self.kernel = kernel
        self.sites = sites
        self.stem = name
        self.dims = dims
        pids = tuple(a.name for a in kernel.grid)
        # The program and launch functions are called by these names where the
        # kernel's parameters are in scope.
        functions = frozenset(name + suffix for suffix in KERNEL_FUNCTIONS)
        self.symbols = symbol_names((*dims, *pids), functions)
        self.constants = tile_constants(kernel, frozenset(self.symbols.values()) | functions)
        self.namer = Namer(frozenset(self.symbols.values()) | functions | self.constants.names)
        #: What each value should be called, the source leaving it unnamed or not.
        self.temps = Temporaries(kernel.body, kernel.params)
        self.names: dict[int, str] = {}
        self.roots: dict[int, str] = {}
        self.private: set[str] = set()
        #: Tiles that are an input tensor's own memory: read-only.
        self.views: set[str] = set()
        self.storage: list[tuple[str, Any]] = []
        #: The storage that holds exact i32s (``join_i32``'s results), not floats.
        self.integers: set[str] = set()
        self.uses = use_counts(kernel.body)
        #: The tile each ``expand_dims`` result views, by the result's id.
        self.viewed: dict[int, Value] = {}
        #: Elementwise results computed inside their one consumer's loop, by value id.
        self.inlined: dict[int, str] = {}
        #: How many ops each inlined expression holds, by value id.
        self.inlined_ops: dict[int, int] = {}
        self.users: dict[int, Op] = {}
        self.defs: dict[int, Op] = {}
        #: Masks folded into the online softmax that reads them, as per-row column limits
        #: (C expressions in ``i``), by the id of the masked value.
        self.limits: dict[int, tuple[str, ...]] = {}
        #: Staged copies skipped for a read of the tensor in place: the tile's address
        #: and the tensor's row stride, by buffer id; then the stride by tile value id.
        self.in_place: dict[int, tuple[str, str]] = {}
        self.strides: dict[int, str] = {}
        #: The last reader of each value in the whole kernel, loops included, and the
        #: staged copy into each buffer.
        self.readers = {v.id: op for op in walk(kernel.body) for v in op.operands}
        self.copies = {op.operands[1].id: op for op in walk(kernel.body) if op.kind == "copy"}
        #: Online softmax ops emitted with their accumulate, by the id of their ``p``.
        self.deferred: dict[int, Op] = {}
        #: Products' right operands that are an i4 weight dequantized in the product
        #: (``tsr::mma_i4``), by value id; and the results of the ops it takes over.
        self.dequantized: dict[int, Dequantized] = {}
        #: The staged copies of the operands of bf16 and int8 products that the product
        #: reads from the tensor itself (``tsr::mma_bf16``, ``tsr::mma_i8``), by the
        #: operand's id; and their buffers, which are never allocated.
        self.narrow_operands = _narrow_operands(kernel.body, self.uses, self.copies)
        self.narrow_buffers = {c.operands[1].id for c in self.narrow_operands.values()}
        self.folded: set[int] = set()
        self.lines: list[str] = []
        self.depth = 1
        self.local: list[set[int]] = []
        #: Printed names of the symbols in sizes and offsets; loops add their counters.
        self.counters: dict[str, str] = dict(self.symbols)
        self.sources = SourceLines()

    # -- naming and storage -------------------------------------------------------

    def name(self, v: Value) -> str:
        return self.names[v.id]

    def define(self, v: Value, fallback: str = "t") -> str:
        self.names[v.id] = self.namer.fresh(self.temps.wanted(v), fallback)
        self.local[-1].add(v.id)
        return self.names[v.id]

    def shape(self, t: Any) -> tuple[Dim, ...]:
        """The dims of a tile as the code prints them: the schedule's tiles by name."""
        return self.constants.shape(t)

    def numel(self, t: Any, named: bool = True) -> str:
        """How many floats a tile or buffer holds: ``BM*BN``, or a number where not
        ``named`` (to compare sizes)."""
        if not named:
            return self.c(math.prod(_shape(t), start=Dim.const(getattr(t, "stages", 1))))
        return self.constants.count(t, self.factor)

    def allocate(self, v: Value) -> str:
        """Private storage for a tile value, declared at the top of the program."""
        name = self.define(v)
        self.storage.append((name, v.type))
        self.roots[v.id] = name
        self.private.add(name)
        return name

    def alias(self, v: Value, of: Value, offset: str | None = None) -> str:
        name = self.define(v)
        source = self.name(of) if offset is None else f"{self.name(of)} + {offset}"
        root = self.roots.get(of.id, self.name(of))
        self.line(f"{'const ' if root in self.views else ''}float* const {name} = {source};")
        self.roots[v.id] = root
        return name

    def result_in_place(self, op: Op, candidates: tuple[int, ...]) -> str:
        """The op's (first) result, written over an operand that dies here when one can
        be, else in its own storage."""
        for i in candidates:
            name = self.over(op.results[0], op.operands[i])
            if name is not None:
                return name
        return self.allocate(op.results[0])

    def over(self, result: Value, operand: Value) -> str | None:
        """``result`` in ``operand``'s storage, when the operand is a private tile of the
        same size, defined in this block, with no use after this one."""
        if not self._dies_here(operand) or self.numel(operand.type, False) != self.numel(
            result.type, False
        ):
            return None
        if result.name is None or result.name == operand.name:
            # the source's variable updated in place (``acc += ...``), or a temporary:
            # the operand's name, not a second name for the same storage
            self.names[result.id] = self.name(operand)
            self.local[-1].add(result.id)
            self.roots[result.id] = self.roots[operand.id]
            return self.name(result)
        name = self.define(result)
        self.roots[result.id] = self.roots[operand.id]
        self.line(f"float* const {name} = {self.name(operand)};")
        return name

    def _dies_here(self, v: Value) -> bool:
        """Whether ``v`` is a private tile of this block with no use after this one. An
        alias (``l[:, None]`` of ``l``) dies only with the value it views: writing over
        it would change that value, which a later op may still read."""
        viewed = self.viewed.get(v.id)
        return (
            self.roots.get(v.id) in self.private
            and self.uses.get(v.id) == 1
            and v.id in self.local[-1]
            and (viewed is None or self._dies_here(viewed))
        )

    def c(self, dim: Dim) -> str:
        return c_dim(dim, self.counters, self.constants.strides)

    def factor(self, dim: Dim) -> str:
        """``c``, parenthesized where the dim is a sum (``C - 8``), to multiply by."""
        return c_factor(dim, self.counters, self.constants.strides)

    # -- output ------------------------------------------------------------------------

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def source_comment(self, op: Op) -> None:
        comment = self.sources.comment(op.span)
        if comment is not None:
            self.line(comment)

    def run(self) -> CKernel:
        params = []
        written = {op.operands[0].id for op in walk(self.kernel.body) if op.kind in STORES}
        for p in self.kernel.params:
            name = self.namer.fresh(p.name, "arg")
            self.names[p.id] = name
            if isinstance(p.type, TensorType):
                tensor = C_TYPES[p.type.dtype.name]
                params.append(CParam(name, tensor, "tensor", p.id in written, p.name))
            else:
                params.append(CParam(name, _SCALAR_TYPES[p.type.kind], "scalar", source=p.name))
        self.block(self.kernel.body)
        # The launch names each extent, next to the sizes and the program ids.
        grid = tuple((self.symbols[a.name], self._extent(a.name, a.extent, a.block),
                      self.namer.fresh(f"{self.symbols[a.name]}_count"))
                     for a in self.kernel.grid)  # fmt: skip
        # Each buffer starts where the one before it ends, so that a size is written once.
        offsets = []
        total, start = "0", "area"
        for name, t in self.storage:
            if name in self.integers:  # an i32 takes a float's bytes
                offsets.append(f"std::int32_t* const {name} = "
                               f"reinterpret_cast<std::int32_t*>({start});")  # fmt: skip
            else:
                offsets.append(f"float* const {name} = {start};")
            size = _whole_lines(self.numel(t), self.numel(t, named=False))
            total = size if total == "0" else f"{total} + {size}"
            start = f"{name} + {size}"
            if name in self.integers:
                start = f"reinterpret_cast<float*>({start})"
        code = re.sub(r"//.*", "", "\n".join((total, *offsets, *self.lines)))
        form = "constexpr tsr::i64 {name} = {value};"
        return CKernel(
            self.stem, self.kernel.function, tuple(params),
            {d: self.symbols[d] for d in self.dims}, grid, total, tuple(offsets),
            tuple(self.lines), tuple(self.constants.declarations(words(code), form)),
            tuple(self.constants.declarations(words("\n".join(e for _, e, _ in grid)),
                                              form)),
            self.namer.fresh("threaded"),
        )  # fmt: skip

    def _extent(self, pid: str, extent: Dim, block: int) -> str:
        """How many programs run along program id ``pid``: ``extent`` in blocks, named
        as the program names the tile the id steps by where the block is that tile."""
        if block == 1:
            return self.c(extent)
        stride = self.constants.strides.get(pid)
        size = stride[1] if stride is not None and stride[0] == block else block
        return f"tsr::ceil_div({self.c(extent)}, {size})"

    def block(self, block: Block) -> list[str]:
        self.local.append({a.id for a in block.args})
        self.users.update({v.id: op for op in block.ops for v in op.operands})
        self.defs.update({r.id: op for op in block.ops for r in op.results})
        dequantized = dequantized_operands(block.ops, self.uses)
        self.dequantized.update(dequantized)
        self.folded.update(i for d in dequantized.values() for i in d.folded)
        for op in block.ops:
            self.source_comment(op)
            if op.results and op.results[0].id in self.folded:
                if op.kind == "load":
                    self.check_bounds(op)
                continue
            handler = getattr(self, "op_" + op.kind, None)
            if handler is not None:
                handler(op)
            elif _is_elementwise(op):
                self.elementwise(op)
            else:
                raise NotImplementedError(f"the CPU backend has no rule for '{op.kind}'")
        self.local.pop()
        return [self.name(v) for v in block.yields]

    # -- scalars -------------------------------------------------------------------------

    def scalar(self, op: Op, expr: str) -> None:
        t = op.result.type
        name = self.define(op.result, "s")
        self.line(f"const {_SCALAR_TYPES[t.kind]} {name} = {expr};")

    def op_const(self, op: Op) -> None:
        value = op.attr("value")
        if isinstance(value, bool):
            expr = "true" if value else "false"
        elif isinstance(value, int):
            expr = str(value)
        else:
            expr = c_float(value)
        self.scalar(op, expr)

    def op_dim_to_float(self, op: Op) -> None:
        self.scalar(op, f"static_cast<float>({self.c(op.attr('dim'))})")

    def op_kv_slot(self, op: Op) -> None:
        """The slot of a cache's ring that this program's row goes to: the row's length
        plus the row, modulo the ring, in ``[0, ring)`` whatever the length holds."""
        name = self.namer.fresh(op.result.name or "slot")
        self.counters[op.result.name] = name
        self.line(f"const tsr::i64 {name} = {kv_slot(op, self.name(op.operands[0]), self.c)};")

    def op_kv_visible(self, op: Op) -> None:
        seen, lengths = (self.name(v) for v in op.operands)
        self.line(kv_visible(op, seen, lengths, "tsr::i64", self.c))

    def op_kv_advance(self, op: Op) -> None:
        lengths, row = self.name(op.operands[0]), self.c(Dim.sym(op.attr("pid")))
        self.line(f"{lengths}[{row}] += {self.c(op.attr('n'))};")

    def op_kv_lengths(self, op: Op) -> None:
        out, lengths = (self.name(v) for v in op.operands)
        row = self.c(Dim.sym(op.attr("pid")))
        self.line(f"{out}[{row}] = static_cast<std::int32_t>({lengths}[{row}]);")

    # -- elementwise ----------------------------------------------------------------------

    def _index(self, v: Value, out: tuple[Dim, ...]) -> str:
        """The index of ``v``'s element at the loop position ``(i, j)``, broadcasting."""
        dims = self.shape(v.type)
        loop = ["i", "j"][2 - len(out) :] if len(out) <= 2 else None
        assert loop is not None, "tiles have at most two dims"
        aligned = [None] * (len(out) - len(dims)) + list(dims)
        terms = []
        stride = "1"
        for k in range(len(out) - 1, -1, -1):
            d = aligned[k]
            if d is None:
                continue
            if d != Dim.const(1) or out[k] == Dim.const(1):
                terms.append(loop[k] if stride == "1" else f"{loop[k]} * {stride}")
            stride = self.factor(d) if stride == "1" else f"{stride} * {self.factor(d)}"
        return " + ".join(reversed(terms)) or "0"

    def _loops(self, out: tuple[Dim, ...], body: str) -> None:
        """A loop nest over ``out`` around one statement. Elements the inner loop does
        not move along (``m[i]`` of a row-broadcast) are read once per row, before it:
        the vectorizer cannot prove them unchanged by the stores in the loop."""
        names = ["i", "j"][2 - len(out) :]
        hoisted: list[str] = []
        if len(out) == 2:
            found: dict[str, str] = {}

            def hoist(match: re.Match[str]) -> str:
                if re.search(r"\bj\b", match.group(2)):
                    return match.group(0)
                return found.setdefault(match.group(0), f"row_{len(found)}")

            body = _ELEMENT.sub(hoist, body)
            hoisted = [f"const float {name} = {element};" for element, name in found.items()]
        for depth, (name, d) in enumerate(zip(names, out, strict=True)):
            if depth == len(out) - 1:
                for line in hoisted:
                    self.line(line)
                self.line("#pragma omp simd")
            self.line(f"for (tsr::i64 {name} = 0; {name} < {self.c(d)}; ++{name}) {{")
            self.depth += 1
        self.line(body)
        for _ in out:
            self.depth -= 1
            self.line("}")

    def _arg(self, x: Any, out: tuple[Dim, ...]) -> str:
        """An operand of an elementwise op at the loop position: a constant, a scalar,
        a tile element, or the expression of a value computed in this loop."""
        if not isinstance(x, Value):
            return c_float(x) if isinstance(x, float) else str(x)
        if isinstance(x.type, ScalarType):
            return self.name(x)
        if x.id in self.inlined:
            return f"({self.inlined[x.id]})"
        return f"{self.name(x)}[{self._index(x, out)}]"

    def _below_row_maximum(self, x: Value) -> bool:
        """Whether ``x`` is rows less their own maxima (``rows - tile.max(rows, axis=1)[:,
        None]``, the library softmax's exp argument): never positive, which the shorter
        exp takes (a fifth off softmax's time at 4096 x 4096)."""
        sub = self.defs.get(x.id)
        if sub is None or sub.kind != "sub":
            return False
        rows, top = binary_operands(sub)
        expand = self.defs.get(top.id) if isinstance(top, Value) else None
        if expand is None or expand.kind != "expand_dims" or expand.attr("axes") != (1,):
            return False
        reduce = self.defs.get(expand.operands[0].id)
        return (
            reduce is not None
            and reduce.kind == "max"
            and reduce.attr("axis") == 1
            and isinstance(rows, Value)
            and reduce.operands[0].id == rows.id
        )

    def _position(self, at: Access, out: tuple[Dim, ...]) -> str:
        """The row-major position in the tensor ``at`` covers of the element at the loop
        position ``(i, j)`` of a tile of shape ``out``."""
        loops = iter(["i", "j"][2 - len(out) :])
        place = ""
        for axis in at.axes:
            offset = self.c(axis.offset)
            if not axis.index:
                loop = next(loops)
                pos = loop if axis.offset == Dim.const(0) else f"{offset} + {loop}"
            else:
                pos = offset
            place = pos if not place else f"({place}) * {self.factor(axis.extent)} + {pos}"
        return place

    def _row_invariant(self, x: Any, out: tuple[Dim, ...]) -> bool:
        """Whether ``x`` is a value that the inner loop over ``out`` does not move
        along: a scalar, or a row-broadcast tile element."""
        if not isinstance(x, Value) or x.id in self.inlined:
            return False
        return isinstance(x.type, ScalarType) or (
            len(out) == 2 and re.search(r"\bj\b", self._index(x, out)) is None
        )

    def _fusable(self, op: Op) -> bool:
        """Whether ``op``'s result can be computed inside its one consumer's loop: the
        consumer, in this block, is elementwise or a reduction and walks a tile of the
        same shape, so both loops visit the same (i, j). Scores that online softmax reads
        are stored: its row loops then read contiguous floats."""
        result = op.results[0]
        user = self.users.get(result.id)
        if self.uses.get(result.id) != 1 or user is None or self._held(op) > MAX_INLINED_OPS:
            return False
        if user.results and user.results[0].id in self.folded:
            return False  # a dequantization's scales, which the product reads stored
        if _is_elementwise(user) or (user.kind == "mask_edge" and not self._absorbed(user)):
            return _shape(user.results[0].type) == _shape(result.type)
        return user.kind in ("max", "sum") and len(_shape(result.type)) == 2

    def _held(self, op: Op) -> int:
        """How many ops the expression of ``op`` would hold, inlined."""
        inner = (self.inlined_ops.get(v.id, 0) for v in op.operands if isinstance(v, Value))
        return 1 + max(inner, default=0)

    def _inline(self, op: Op, expr: str) -> None:
        """Compute ``op`` inside its consumer's loop, as ``expr``."""
        self.inlined[op.result.id] = expr
        self.inlined_ops[op.result.id] = self._held(op)
        self.names[op.result.id] = self.namer.fresh(op.result.name)

    def elementwise(self, op: Op) -> None:
        out_type = op.result.type
        out = self.shape(out_type)
        if op.kind in _LOGICAL:
            parts = [f"({self._arg(x, out)})" for x in op.operands]
            expr = f"!{parts[0]}" if len(parts) == 1 else f" {_LOGICAL[op.kind]} ".join(parts)
        elif op.kind in _OPERATORS or op.kind in _CALLED:
            a, b = (self._arg(x, out) for x in binary_operands(op))
            expr = (
                f"{_CALLED[op.kind]}{integer_variant(op)}({a}, {b})"
                if op.kind in _CALLED
                else f"{a} {_OPERATORS[op.kind]} {b}"
            )
            if op.kind == "div" and self._row_invariant(binary_operands(op)[1], out):
                expr = f"{a} * (1.0f / {b})"  # one division per row, not per element
        elif op.kind == "where":
            cond, a, b = (self._arg(x, out) for x in named_operands(op, ("cond", "a", "b")))
            expr = f"tsr::select({cond}, {a}, {b})"
        elif op.kind == "dropout":
            x, p, seed = (self._arg(v, out) for v in dropout_operands(op))
            expr = f"tsr::dropout({x}, {seed}, {self._position(op.attr('at'), out)}, {p})"
        elif op.kind == "index_along":
            place = self._position(op.attr("at"), out)
            stride, size = (self.c(op.attr(a)) for a in ("stride", "size"))
            expr = f"static_cast<float>(({place}) / ({stride}) % ({size}))"
        elif op.kind == "stochastic_cast":
            x, seed = (self._arg(v, out) for v in stochastic_operands(op))
            mantissa, emin = STOCHASTIC_FORMATS[out_type.dtype.name]
            place = self._position(op.attr("at"), out)
            expr = f"tsr::stochastic_round({x}, {mantissa}, {emin}, {seed}, {place})"
        elif op.kind == "join_i32":
            self._join(op, out)
            return
        else:
            x = self._arg(op.operands[0], out)
            function = _UNARY.get(op.kind)
            if op.kind == "exp" and self._below_row_maximum(op.operands[0]):
                function = "tsr::exp_nonpositive"
            expr = x if op.kind == "cast" else f"-{x}" if op.kind == "neg" else f"{function}({x})"
        if isinstance(out_type, ScalarType):
            self.scalar(op, expr)
            return
        if self._fusable(op):
            self._inline(op, _rounded(expr, out_type.dtype, bool(op.attr("saturate"))))
            return
        candidates = tuple(
            i for i, v in enumerate(op.operands) if _shape(v.type) == _shape(out_type)
        )
        name = self.result_in_place(op, candidates)
        self._loops(
            out,
            f"{name}[{self._index(op.result, out)}] = "
            f"{_rounded(expr, out_type.dtype, bool(op.attr('saturate')))};",
        )

    def _join(self, op: Op, out: tuple[Dim, ...]) -> None:
        """``high * radix + low`` in i32 arithmetic: an exact std::int32_t, which a float
        context converts to f32 once (as ``cast(..., f32)`` rounds), and which is kept,
        where it is not computed inside its one consumer's loop, in storage of i32s."""
        high, low = (self._arg(x, out) for x in op.operands)
        expr = f"tsr::join_i32({high}, {low}, {op.attr('radix')})"
        if self._fusable(op):
            self._inline(op, expr)
            return
        name = self.allocate(op.result)
        self.integers.add(name)
        self._loops(out, f"{name}[{self._index(op.result, out)}] = {expr};")

    # -- tiles --------------------------------------------------------------------------

    def op_full(self, op: Op) -> None:
        name = self.allocate(op.result)
        value = op.attr("value")
        corner = self._accumulator_corner(op) if value == 0 else None
        if corner is not None:
            rows, cols = (self.c(d) for d in self.shape(op.result.type))
            live = [size if bound is None else f"tsr::live({size}, {self.c(bound)})"
                    for size, bound in zip((rows, cols), corner, strict=True)]  # fmt: skip
            self.line(f"tsr::zero_corner({name}, {cols}, {live[0]}, {live[1]});")
            return
        self.line(f"std::fill_n({name}, {self.numel(op.result.type)}, {c_float(value)});")

    def _accumulator_corner(self, op: Op) -> tuple[Dim | None, Dim | None] | None:
        """The live corner (rows, columns; None: all) of a zero tile that is a product's
        accumulator, when nothing reads it elsewhere: its one reader is a loop that
        carries it into an ``mma`` whose result it yields, and the loop's result goes to
        a store whose window is that corner. The product reads and writes the corner
        only, so only the corner needs its zeros."""
        value = op.result
        loop = self.readers.get(value.id)
        if self.uses.get(value.id) != 1 or loop is None or loop.kind != "for":
            return None
        i = next(j for j, v in enumerate(loop.operands) if v is value)
        body = loop.regions[0]
        arg = body.args[1 + i]
        product = self.readers.get(arg.id)
        if (
            self.uses.get(arg.id) != 1
            or product is None
            or product.kind != "mma"
            or product.operands[2] is not arg
            or self.uses.get(product.result.id) != 1
            or body.yields[i] is not product.result
        ):
            return None
        live: Live | None = product.attr("live")
        corner = (live.m, live.n) if live else (None, None)
        counter = body.args[0].name
        if all(b is None for b in corner) or any(
            b is not None and counter in b.symbols() for b in corner
        ):
            return None
        store = self.readers.get(loop.results[i].id)
        if (
            self.uses.get(loop.results[i].id) != 1
            or store is None
            or store.kind != "store"
            or store.operands[1] is not loop.results[i]
        ):
            return None
        return corner if _inside(store.attr("at").tile_axes, corner) else None

    def op_iota(self, op: Op) -> None:
        user = self.users.get(op.result.id)
        if self.uses.get(op.result.id) == 1 and user is not None and self._absorbed(user):
            return  # the mask's column limit uses the offset
        name = self.allocate(op.result)
        size = self.c(self.shape(op.result.type)[0])
        offset = self.c(op.attr("offset"))
        self.line(
            f"for (tsr::i64 i = 0; i < {size}; ++i) {name}[i] = static_cast<float>({offset} + i);"
        )

    def op_expand_dims(self, op: Op) -> None:
        """A view with new axes of one element: the same storage, under its name (the
        index of each element is the broadcast's)."""
        x = op.operands[0]
        self.names[op.result.id] = self.name(x)
        self.roots[op.result.id] = self.roots.get(x.id, self.name(x))
        self.local[-1].add(op.result.id)
        self.viewed[op.result.id] = x

    def op_transpose(self, op: Op) -> None:
        x = op.operands[0]
        rows, cols = (self.c(d) for d in self.shape(x.type))
        name = self.allocate(op.result)
        if x.id not in self.strides:
            self.line(f"tsr::transpose({name}, {self.name(x)}, {rows}, {cols});")
            return
        # a tensor read in place: only the corner its product reads, the product's n and k
        m, n = self._live_corner(x)
        live = (size if bound is None else f"tsr::live({size}, {self.c(bound)})"
                for size, bound in ((rows, m), (cols, n)))  # fmt: skip
        args = ", ".join((name, self.name(x), rows, self.strides[x.id], *live))
        self.line(f"tsr::transpose({args});")

    def op_broadcast(self, op: Op) -> None:
        out = self.shape(op.result.type)
        x = op.operands[0]
        name = self.allocate(op.result)
        self._loops(
            out, f"{name}[{self._index(op.result, out)}] = {self.name(x)}[{self._index(x, out)}];"
        )

    def _reduce(self, op: Op, combine: str, init: str, reduction: str) -> None:
        """A row or column reduction; OpenMP's ``simd reduction`` lets it vectorize
        (reassociating the sum, as every parallel reduction does)."""
        x = op.operands[0]
        rows, cols = (self.c(d) for d in self.shape(x.type))
        axis = op.attr("axis")
        name = self.allocate(op.result)
        outer, inner = ("i", "j") if axis == 1 else ("j", "i")
        outer_n, inner_n = (rows, cols) if axis == 1 else (cols, rows)
        self.line(f"for (tsr::i64 {outer} = 0; {outer} < {outer_n}; ++{outer}) {{")
        self.depth += 1
        self.line(f"float r = {init};")
        self.line(f"#pragma omp simd reduction({reduction} : r)")
        element = self._arg(x, self.shape(x.type))
        self.line(f"for (tsr::i64 {inner} = 0; {inner} < {inner_n}; ++{inner}) "
                  f"r = {combine.format(x=element)};")  # fmt: skip
        self.line(f"{name}[{outer}] = {_rounded('r', op.result.type.dtype)};")
        self.depth -= 1
        self.line("}")

    def op_max(self, op: Op) -> None:
        self._reduce(op, "tsr::larger(r, {x})", c_float(float("-inf")), "max")

    def op_sum(self, op: Op) -> None:
        self._reduce(op, "r + {x}", "0.0f", "+")

    def op_gather(self, op: Op) -> None:
        """``out[i, j] = x[i, index[i, j]]``, the index clamped into the row: an index the
        entry did not check (one computed in the function) reads inside the row."""
        x, index = op.operands
        out = self.shape(op.result.type)
        cols = self.factor(self.shape(x.type)[1])
        name = self.allocate(op.result)
        column = f"tsr::clamp_index({self._arg(index, out)}, {cols})"
        self._loops(
            out, f"{name}[{self._index(op.result, out)}] = {self.name(x)}[i * {cols} + {column}];"
        )

    def op_scatter(self, op: Op) -> None:
        self._scatter(op, "{v}")

    def op_scatter_add(self, op: Op) -> None:
        self._scatter(op, "{out} + {v}")

    def _scatter(self, op: Op, combine: str) -> None:
        """``x`` copied, then each row's values written (or added) in ``j`` order where
        the row's indices say, each clamped into the row: a repeated index takes the
        last value (or sums in order), and no write is out of bounds."""
        x, index, values = op.operands
        out, by = self.shape(op.result.type), self.shape(index.type)
        cols = self.factor(out[1])
        name = self.allocate(op.result)
        self._loops(out, f"{name}[{self._index(op.result, out)}] = {self._arg(x, out)};")
        self.line(f"for (tsr::i64 i = 0; i < {self.c(out[0])}; ++i) {{")
        self.line(f"  for (tsr::i64 j = 0; j < {self.c(by[1])}; ++j) {{")
        column = self.namer.fresh("column")
        self.line(
            f"    const tsr::i64 {column} = tsr::clamp_index({self._arg(index, by)}, {cols});"
        )
        slot = f"{name}[i * {cols} + {column}]"
        value = combine.format(out=slot, v=self._arg(values, by))
        self.line(f"    {slot} = {_rounded(value, op.result.type.dtype)};")
        self.line("  }")
        self.line("}")

    def op_split(self, op: Op) -> None:
        x = op.operands[0]
        axis = op.attr("axis")
        cols = self.factor(self.shape(x.type)[1])
        for index, part in enumerate(op.results):
            name = self.allocate(part)
            prows, pcols = (self.factor(d) for d in self.shape(part.type))
            src = (f"{self.name(x)}[i * {cols} + {index} * {pcols} + j]" if axis == 1
                   else f"{self.name(x)}[({index} * {prows} + i) * {cols} + j]")  # fmt: skip
            self._loops(self.shape(part.type), f"{name}[i * {pcols} + j] = {src};")

    def op_concat(self, op: Op) -> None:
        axis = op.attr("axis")
        name = self.allocate(op.result)
        cols = self.factor(self.shape(op.result.type)[1])
        start = Dim.const(0)
        for part in op.operands:
            pcols = self.factor(self.shape(part.type)[1])
            dst = (f"{name}[i * {cols} + {self.c(start)} + j]" if axis == 1
                   else f"{name}[({self.c(start)} + i) * {cols} + j]")  # fmt: skip
            self._loops(self.shape(part.type), f"{dst} = {self.name(part)}[i * {pcols} + j];")
            start = start + _shape(part.type)[axis]

    def _absorbed(self, op: Op) -> bool:
        """Whether a mask is folded into the online softmax that reads it (directly or
        through other such masks) as a limit on each row's live columns: a ragged edge
        along the columns, or a causal mask between a row and a column iota."""
        if op.kind == "mask_edge":
            s = op.operands[0]
            along_rows = op.attr("axis") == 1 == len(_shape(s.type)) - 1
            foldable = along_rows and op.attr("fill") == float("-inf")
        elif op.kind == "mask_causal":
            foldable = all(
                self.defs.get(x.id) is not None and self.defs[x.id].kind == "iota"
                for x in op.operands[1:]
            )
        else:
            return False
        user = self.users.get(op.result.id)
        return (
            foldable
            and self.uses.get(op.result.id) == 1
            and user is not None
            and (user.kind == "softmax_online" or self._absorbed(user))
        )

    def _fold(self, op: Op, limit: str) -> None:
        """A mask absorbed by online softmax: its result is its operand, with a limit."""
        s = op.operands[0]
        self.names[op.result.id] = self.name(s)
        self.roots[op.result.id] = self.roots.get(s.id, self.name(s))
        self.local[-1].add(op.result.id)
        self.limits[op.result.id] = (*self.limits.get(s.id, ()), limit)

    def op_mask_causal(self, op: Op) -> None:
        s, rows, cols = op.operands
        if self._absorbed(op):
            # row i keeps columns j with c0 + j <= r0 + i
            r0, c0 = (self.c(self.defs[x.id].attr("offset")) for x in (rows, cols))
            self._fold(op, f"{r0} + i + 1 - ({c0})")
            return
        n = self.factor(self.shape(s.type)[1])
        name = self.result_in_place(op, (0,))
        masked = f"{self.name(cols)}[j] > {self.name(rows)}[i]"
        value = f"{masked} ? {c_float(float('-inf'))} : {self.name(s)}[i * {n} + j]"
        self._loops(self.shape(s.type), f"{name}[i * {n} + j] = {value};")

    def op_mask_edge(self, op: Op) -> None:
        x = op.operands[0]
        if self._absorbed(op):
            self._fold(op, f"{self.c(op.attr('extent'))} - ({self.c(op.attr('offset'))})")
            return
        out = self.shape(x.type)
        loop = ["i", "j"][2 - len(out) :][op.attr("axis")]
        bound = f"{self.c(op.attr('offset'))} + {loop} >= {self.c(op.attr('extent'))}"
        expr = f"tsr::select({bound}, {c_float(op.attr('fill'))}, {self._arg(x, out)})"
        if self._fusable(op):
            self._inline(op, expr)
            return
        name = self.result_in_place(op, (0,))
        self._loops(out, f"{name}[{self._index(x, out)}] = {expr};")

    # -- memory ------------------------------------------------------------------------

    def _window(
        self, tensor: Value, at: Access, written: bool = False
    ) -> tuple[str, str, str, str, str, str]:
        """(base pointer, ld, r0, c0, rmax, cmax) of an access to a row-major tensor; an
        i4 tensor's base is a view that counts elements (``tsr::i4_span`` where it is
        ``written``)."""
        dims = tensor.type.dims
        base = self.name(tensor)
        index = [(a, d) for a, d in zip(at.axes, dims, strict=True) if a.index]
        offset = "0"
        if index:
            flat = Dim.const(0)
            for a, d in index:
                flat = flat * d + a.offset
            rest = Dim.const(1)
            for d in dims[len(index) :]:
                rest = rest * d
            offset = f"({self.c(flat)}) * ({self.c(rest)})"
        if tensor.type.dtype.name == "i4":  # two to a byte: the view counts elements
            base = f"tsr::{'i4_span' if written else 'i4_view'}{{{base}, {offset}}}"
        elif index:
            base = f"{base} + {offset}"
        tile = at.tile_axes
        if not tile:  # every axis indexed: one element (``lengths[b]`` of a batch's rows)
            return base, "1", "0", "0", "1", "1"
        if len(tile) == 1:
            (a,) = tile
            return base, "0", "0", self.c(a.offset), "1", self.c(a.extent)
        r, c = tile
        return (
            base,
            self.factor(dims[-1]),  # the row stride; a view's columns may end before the row does
            self.c(r.offset),
            self.c(c.offset),
            self.c(r.extent),
            self.c(c.extent),
        )

    def _tile_dims(self, t: Any) -> tuple[str, str]:
        dims = self.shape(t)
        if len(dims) < 2:
            return "1", self.c(dims[0]) if dims else "1"
        return self.c(dims[-2]), self.c(dims[-1])

    def check_bounds(self, op: Op) -> None:
        """In a debug build, the checks of ``op``'s access: a failed one records itself
        (``tsr::out_of_bounds``) and ends the program."""
        if self.sites is None:
            return

        def fail(site: int, first: str, size: str, extent: str) -> str:
            return f"return tsr::out_of_bounds({site}, {first}, {size}, {extent});"

        for text in bounds_lines(self.sites, self.kernel, op, self.c, fail):
            self.line(text)

    def op_load(self, op: Op) -> None:
        self.check_bounds(op)
        if self._whole_rows(op):
            self._row_view(op)
            return
        name = self.allocate(op.result)
        base, ld, r0, c0, rmax, cmax = self._window(op.operands[0], op.attr("at"))
        rows, cols = self._tile_dims(op.result.type)
        self.line(
            f"tsr::load_tile({name}, {rows}, {cols}, {base}, {ld}, {r0}, {c0}, {rmax}, {cmax});"
        )

    @staticmethod
    def _whole_rows(op: Op) -> bool:
        """Whether a load reads whole rows of an f32 tensor into an f32 tile (not the first
        columns of each, as ``x[:, :64]`` does): then the tile can be the tensor's own
        memory, with no copy, where its rows exist."""
        at: Access = op.attr("at")
        tile = at.tile_axes
        return (
            op.operands[0].type.dtype.name == "f32"
            and op.result.type.dtype.name == "f32"
            and len(tile) == 2
            and tile[1].offset == Dim.const(0)
            and tile[1].size == tile[1].extent == op.operands[0].type.dims[-1]
            and not tile[1].masked
        )

    def _row_view(self, op: Op) -> None:
        base, ld, r0, _, rmax, _ = self._window(op.operands[0], op.attr("at"))
        rows, _ = self._tile_dims(op.result.type)
        name = self.define(op.result)
        self.roots[op.result.id] = name
        self.views.add(name)
        if not op.attr("at").tile_axes[0].masked:
            self.line(f"const float* const {name} = {base} + ({r0}) * {ld};")
            return
        edge = self.namer.fresh(f"{name}_edge")
        self.storage.append((edge, op.result.type))
        self.line(f"const float* const {name} = tsr::row_tile({edge}, {rows}, {ld}, {base}, "
                  f"{r0}, {rmax});")  # fmt: skip

    def op_store(self, op: Op) -> None:
        self.check_bounds(op)
        tensor, tile = op.operands
        base, ld, r0, c0, rmax, cmax = self._window(tensor, op.attr("at"), written=True)
        rows, cols = self._tile_dims(tile.type)
        store = "store_i32_tile" if self.name(tile) in self.integers else "store_tile"
        self.line(f"tsr::{store}({base}, {ld}, {r0}, {c0}, {rmax}, {cmax}, {self.name(tile)}, "
                  f"{rows}, {cols});")  # fmt: skip

    def op_alloc(self, op: Op) -> None:
        if op.result.id in self.narrow_buffers:
            return  # the product reads the tensor
        copy = self.copies.get(op.result.id)
        if copy is not None and self._in_place(copy):
            return  # read in place: no buffer
        self.allocate(op.result)

    def _slot(self, op: Op, buf: Value) -> str:
        slot = op.attr("slot")
        if slot.stages == 1:
            return "0"
        return f"(({self.c(slot.index)}) % {slot.stages}) * {buf.type.slot_elements}"

    def _live_corner(self, tile: Value) -> tuple[Dim | None, Dim | None] | None:
        """The rows and columns of ``tile`` (None: all of them) that its one reader looks
        at, when that reader reads only a product's live corner: the left operand of a
        product, the keys of attention through their transpose, or its values. None for
        any other reader."""
        user = self.readers.get(tile.id)
        if user is None or self.uses.get(tile.id) != 1:
            return None
        if user.kind in ("dot", "mma") and user.operands[0] is tile:
            live = user.attr("live")
            return (live.m, live.k) if live else (None, None)
        if user.kind == "transpose" and self.uses.get(user.result.id) == 1:
            product = self.readers.get(user.result.id)
            if product is not None and product.kind == "dot" and product.operands[1] is user.result:
                live: Live | None = product.attr("live")
                return (live.n, live.k) if live else (None, None)
        if user.kind == "softmax_accumulate" and user.operands[4] is tile:
            live = user.attr("live")
            return (live.k, live.n) if live else (None, None)
        return None

    def _in_place(self, op: Op) -> bool:
        """Whether a staged copy can be skipped and its tile read from the tensor itself:
        f32 to f32 in one stage, read once, by a reader that looks only at a live corner
        the tensor holds, so nothing out of bounds is touched. A K or V block of
        attention is then never copied."""
        tensor, buf = op.operands
        tile = op.attr("at").tile_axes
        read = self.readers.get(buf.id)
        if (
            tensor.type.dtype.name != "f32"
            or buf.type.dtype.name != "f32"
            or buf.type.stages != 1
            or len(tile) != 2
            or read is None
            or read.kind != "read"
            or self.uses.get(buf.id) != 2  # this copy and the read
        ):
            return False
        corner = self._live_corner(read.result)
        return corner is not None and _inside(tile, corner)

    def op_copy(self, op: Op) -> None:
        self.check_bounds(op)
        tensor, buf = op.operands
        if buf.id in self.narrow_buffers:
            return  # the product reads the tensor
        base, ld, r0, c0, rmax, cmax = self._window(tensor, op.attr("at"))
        if self._in_place(op):
            corner = f"{base} + ({r0}) * {ld}" + ("" if c0 == "0" else f" + {c0}")
            self.in_place[buf.id] = (corner, ld)
            return
        rows, cols = self._tile_dims(buf.type)
        dst = (
            self.name(buf)
            if self._slot(op, buf) == "0"
            else f"{self.name(buf)} + {self._slot(op, buf)}"
        )
        load = "load_corner" if self._padding_unread(op) else "load_tile"
        self.line(f"tsr::{load}({dst}, {rows}, {cols}, {base}, {ld}, {r0}, {c0}, {rmax}, {cmax});")

    def _padding_unread(self, op: Op) -> bool:
        """Whether a copy's tile is read only where the tensor holds it: read once, as an
        operand of a product, on a live corner that is the copy's window inside the
        tensor. Its padding is then never read, and need not be zeros."""
        buf = op.operands[1]
        tile = op.attr("at").tile_axes
        read = self.readers.get(buf.id)
        if len(tile) != 2 or read is None or read.kind != "read" or self.uses.get(buf.id) != 2:
            return False
        product = self.readers.get(read.result.id)
        if self.uses.get(read.result.id) != 1 or product is None:
            return False
        if product.kind not in ("dot", "mma") or not any(
            read.result is v for v in product.operands[:2]
        ):
            return False
        live: Live | None = product.attr("live")
        m, n, k = (live.m, live.n, live.k) if live else (None, None, None)
        corner = (m, k) if product.operands[0] is read.result else (k, n)
        return _inside(tile, corner)

    def op_read(self, op: Op) -> None:
        if op.result.id in self.narrow_operands:
            return  # the product reads the tensor
        buf = op.operands[0]
        if buf.id in self.in_place:
            address, ld = self.in_place[buf.id]
            name = self.define(op.result)
            self.roots[op.result.id] = name
            self.views.add(name)
            self.strides[op.result.id] = ld
            self.line(f"const float* const {name} = {address};")
            return
        slot = self._slot(op, buf)
        self.alias(op.result, buf, None if slot == "0" else slot)

    # -- dot and online softmax ------------------------------------------------------------

    def _mnk(self, a: Value, b: Value) -> tuple[str, str, str]:
        m, k = (self.c(d) for d in self.shape(a.type))
        return m, self.c(self.shape(b.type)[1]), k

    def _live(self, op: Op, sizes: tuple[str, str, str]) -> tuple[str, ...]:
        """The dot's live extents after its tile sizes, when any is narrower."""
        live: Live | None = op.attr("live")
        bounds = (live.m, live.n, live.k) if live else (None, None, None)
        if all(b is None for b in bounds):
            return ()
        return tuple(
            size if bound is None else f"tsr::live({size}, {self.c(bound)})"
            for bound, size in zip(bounds, sizes, strict=True)
        )

    def _product(self, op: Op) -> tuple[str, ...]:
        """A product's tile sizes and live extents; when an operand is read in place, the
        sizes of the output, the live extents and the row strides of both operands."""
        a, b = op.operands[:2]
        sizes = self._mnk(a, b)
        live = self._live(op, sizes)
        if a.id not in self.strides and b.id not in self.strides:
            return (*sizes, *live)
        m, n, k = sizes
        return (m, n, *(live or sizes), self.strides.get(a.id, k), self.strides.get(b.id, n))

    def op_dot(self, op: Op) -> None:
        a, b = op.operands
        name = self.allocate(op.result)
        if a.id in self.narrow_operands:
            self._narrow_product(op, name, None)
            return
        accum = op.attr("accum")
        if accum is not None:  # from zero: acc is the result itself
            args = ", ".join((name, self.name(a), self.name(b), name, *self._product(op)))
            self.line(f"tsr::mma_rounded<{ROUND[accum.name]}, true>({args});")
            return
        args = ", ".join((name, self.name(a), self.name(b), *self._product(op)))
        self.line(f"tsr::dot({args});")

    def op_mma(self, op: Op) -> None:
        a, b, acc = op.operands
        name = self.result_in_place(op, (2,))
        if b.id in self.dequantized:
            self._dequantized_product(op, name, self.name(acc))
            return
        if a.id in self.narrow_operands:
            self._narrow_product(op, name, self.name(acc))
            return
        args = (name, self.name(a), self.name(b), self.name(acc), *self._product(op))
        accum = op.attr("accum")
        function = "tsr::mma" if accum is None else f"tsr::mma_rounded<{ROUND[accum.name]}>"
        self.line(f"{function}({', '.join(args)});")

    def _dequantized_product(self, op: Op, out: str, acc: str) -> None:
        """An ``mma`` whose right operand is an i4 weight dequantized as it is read (less
        its zero points, where the kernel subtracts some)."""
        a, b = op.operands[:2]
        chain = self.dequantized[b.id]
        window = self._window(chain.load.operands[0], chain.load.attr("at"))
        sizes = self._mnk(a, b)
        m, n, k = self._live(op, sizes) or sizes
        rounding = ROUND.get(chain.rounding or "")
        round_b = (
            f"[](float x) {{ return {rounding}(x); }}" if rounding else "[](float x) { return x; }"
        )
        zero = self.name(chain.zero) if chain.zero is not None else "nullptr"
        args = (out, self.name(a), *window, self.name(chain.scale), zero, round_b, acc,
                *sizes[:2], m, n, k, self.strides.get(a.id, sizes[2]))  # fmt: skip
        self.line(f"tsr::mma_i4({', '.join(args)});")

    def _narrow_product(self, op: Op, out: str, acc: str | None) -> None:
        """A product of two bf16 or two i8 tensors' windows, read where they lie (``acc``
        None: a dot, from zero)."""
        a, b = op.operands[:2]
        windows = []
        for v in (a, b):
            copy = self.narrow_operands[v.id]
            windows += self._window(copy.operands[0], copy.attr("at"))
        sizes = self._mnk(a, b)
        live = self._live(op, sizes) or sizes
        function = "tsr::mma_i8" if a.type.dtype.name == "i8" else "tsr::mma_bf16"
        function += "<true>" if acc is None else ""
        args = (out, *windows, acc or out, *sizes[:2], *live)
        self.line(f"{function}({', '.join(args)});")

    def _limit(self, s: Value) -> str:
        """A lambda giving how many leading columns of row i of scores ``s`` are live."""
        limits = self.limits.get(s.id, ())
        if not limits:
            return f"[](tsr::i64) {{ return tsr::i64({self.c(self.shape(s.type)[1])}); }}"
        body = limits[0] if len(limits) == 1 else f"std::min<tsr::i64>({', '.join(limits)})"
        param = "tsr::i64 i" if re.search(r"\bi\b", body) else "tsr::i64"
        return f"[&]({param}) {{ return {body}; }}"

    def op_softmax_online(self, op: Op) -> None:
        """Emitted with the ``softmax_accumulate`` that is its results' only reader,
        as one pass (``tsr::attend``); alone otherwise."""
        user = self.users.get(op.results[0].id)
        if (
            user is not None
            and user.kind == "softmax_accumulate"
            and all(self.uses.get(r.id) == 1 and self.users.get(r.id) is user for r in op.results)
        ):
            self.deferred[user.operands[3].id] = op
            return
        s = op.operands[0]
        p, m_c, l_c = (self.allocate(r) for r in op.results)
        rows, cols = (self.c(d) for d in self.shape(s.type))
        args = f"{p}, {m_c}, {l_c}, {self.name(s)}, {rows}, {cols}, {self._limit(s)}"
        self.line(f"tsr::softmax_online({args});")

    def op_softmax_accumulate(self, op: Op) -> None:
        acc, m, l_, p, v, m_c, l_c = op.operands
        outs = [
            self.over(result, operand) or self.allocate(result)
            for result, operand in zip(op.results, (acc, m, l_), strict=True)
        ]
        rows, n = (self.c(d) for d in self.shape(p.type))
        d = self.c(self.shape(v.type)[1])
        # p @ v: rows x keys times keys x d, so the live (m, n, k) are (rows, d, keys)
        m_live, d_live, n_live = self._live(op, (rows, d, n)) or (rows, d, n)
        rounding = ROUND.get(v.type.dtype.name)
        round_p = (
            f"[](float x) {{ return {rounding}(x); }}" if rounding else "[](float x) { return x; }"
        )
        state = [*outs, *(self.name(x) for x in (acc, m, l_))]
        online = self.deferred.pop(p.id, None)
        s = online.operands[0] if online is not None else None
        if s is not None and self._dies_here(s):
            scratch = self.name(s)  # p is written over the scores it comes from
        else:
            scratch = self.namer.fresh(*((p.name, "p") if online else ("p_scaled",)))
            self.storage.append((scratch, p.type))
            self.private.add(scratch)
        sizes = f"{rows}, {n}, {d}, {m_live}, {n_live}, {d_live}, {scratch}"
        values = f"{self.name(v)}, {self.strides.get(v.id, d)}"
        if s is not None:
            self.line(f"tsr::attend({', '.join(state)}, {self.name(s)}, {values}, {sizes}, "
                      f"{self._limit(s)}, {round_p});")  # fmt: skip
            return
        args = ", ".join([*state, self.name(p), values, *(self.name(x) for x in (m_c, l_c))])
        self.line(f"tsr::softmax_accumulate({args}, {sizes}, {round_p});")

    # -- control flow -----------------------------------------------------------------------

    def _copy(self, dst: str, src: Value, t: Any) -> None:
        if self.roots.get(src.id, self.name(src)) != dst:
            self.line(f"std::copy_n({self.name(src)}, {self.numel(t)}, {dst});")

    def op_for(self, op: Op) -> None:
        body = op.regions[0]
        counter = self.namer.fresh(body.args[0].name, "i")
        self.names[body.args[0].id] = counter
        self.counters[body.args[0].name] = counter
        for arg, init in zip(body.args[1:], op.operands, strict=True):
            self._carried(arg, init)
        extent = self.c(op.attr("extent"))
        if op.attr("stop") is not None:  # causal attention: no block past the last row
            extent = f"std::min<tsr::i64>({extent}, {self.c(op.attr('stop'))})"
        step = self.constants.step(body.args[0].name) or self.c(op.attr("step"))
        trips = f"tsr::ceil_div({extent}, {step})"
        first = "0"
        if op.attr("start") is not None:  # causal attention's keys: no block before the first
            first = f"{self.factor(op.attr('start'))} / {step}"
        self.line(f"for (tsr::i64 {counter} = {first}; {counter} < {trips}; ++{counter}) {{")
        self.depth += 1
        self.block(body)
        for arg, value in zip(body.args[1:], body.yields, strict=True):
            self._assign(arg, value)
        self.depth -= 1
        self.line("}")
        for result, arg in zip(op.results, body.args[1:], strict=True):
            self.names[result.id] = self.name(arg)
            self.roots[result.id] = self.roots.get(arg.id, self.name(arg))
            self.local[-1].add(result.id)

    def _carried(self, arg: Value, init: Value) -> None:
        """A loop-carried value: its own storage, holding ``init`` at entry; ``init``'s
        storage itself when the loop is its last use (an accumulator's zeros)."""
        if isinstance(arg.type, ScalarType):
            name = self.namer.fresh(arg.name, "s")
            self.names[arg.id] = name
            self.line(f"{_SCALAR_TYPES[arg.type.kind]} {name} = {self.name(init)};")
            return
        if self._dies_here(init) and self.numel(init.type, False) == self.numel(arg.type, False):
            self.names[arg.id] = self.name(init)
            self.roots[arg.id] = self.roots[init.id]
            return
        self.local.append(set())  # the argument belongs to the loop body, not here
        name = self.allocate(arg)
        self.local.pop()
        self.line(f"std::copy_n({self.name(init)}, {self.numel(arg.type)}, {name});")

    def _assign(self, target: Value, value: Value) -> None:
        if isinstance(target.type, ScalarType):
            self.line(f"{self.name(target)} = {self.name(value)};")
        else:
            self._copy(self.roots.get(target.id, self.name(target)), value, target.type)

    def op_if(self, op: Op) -> None:
        results = []
        for r in op.results:
            if isinstance(r.type, TileType):
                results.append(self.allocate(r))
            else:
                results.append(self.define(r, "s"))
                self.line(f"{_SCALAR_TYPES[r.type.kind]} {results[-1]};")
        self.line(f"if ({self.name(op.operands[0])}) {{")
        for i, region in enumerate(op.regions):
            if i:
                self.line("} else {")
            self.depth += 1
            self.block(region)
            for r, v in zip(op.results, region.yields, strict=True):
                self._assign(r, v)
            self.depth -= 1
        self.line("}")


def _narrow_operands(body: Block, uses: dict[int, int], copies: dict[int, Op]) -> dict[int, Op]:
    """The operands of the products whose two operands are each read from a single-stage
    staged copy of a tensor, with no other reader, and are both bf16 (a product
    accumulated in f32: ``tsr::mma_bf16``, ``vdpbf16ps`` where the CPU has it) or both i8
    (an i32 tile, held as floats: a dot, or one added to an i32 or f32 accumulator, as an
    int8 GEMM's K loop does: ``tsr::mma_i8``, ``vpdpbusd``): the product reads the
    tensors instead. The copy of each, by the operand's id."""
    defs = {r.id: op for op in walk(body) for r in op.results}

    def staged(v: Value) -> Op | None:
        read = defs.get(v.id)
        if read is None or read.kind != "read" or uses.get(v.id) != 1:
            return None
        buf = read.operands[0]
        copy = copies.get(buf.id)
        if copy is None or uses.get(buf.id) != 2 or buf.type.stages != 1:
            return None
        at: Access = copy.attr("at")
        same = copy.operands[0].type.dtype == buf.type.dtype
        return copy if same and len(at.tile_axes) == 2 else None

    products = {
        ("dot", "bf16", "f32"),
        ("mma", "bf16", "f32"),
        ("dot", "i8", "i32"),
        ("mma", "i8", "i32"),
        ("mma", "i8", "f32"),
    }
    found = {}
    for op in walk(body):
        if op.kind not in ("dot", "mma") or op.attr("accum") is not None:
            continue
        a, b = (staged(v) for v in op.operands[:2])
        if a is None or b is None:
            continue
        dtypes = {c.operands[0].type.dtype.name for c in (a, b)}
        if len(dtypes) == 1 and (op.kind, *dtypes, op.results[0].type.dtype.name) in products:
            found.update({op.operands[0].id: a, op.operands[1].id: b})
    return found


def _is_elementwise(op: Op) -> bool:
    return bool(op.results) and (
        op.kind in _BINARY
        or op.kind in _CALLED
        or op.kind in _UNARY
        or op.kind in _COMPARED
        or op.kind in _LOGICAL
        or op.kind in ("cast", "where", "join_i32", *DRAWN)
    )


def _rounded(expr: str, dtype: DType, saturate: bool = False) -> str:
    if saturate:
        expr = saturated(expr, dtype, "tsr::")
    rounding = ROUND.get(dtype.name)
    return f"{rounding}({expr})" if rounding else expr
