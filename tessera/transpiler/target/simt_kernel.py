"""One Tile IR kernel as SIMT code: a program instance is a group of threads.

This emitter lowers elementwise and row-reduction kernels (norms, softmax,
optimizer steps); a kernel with staged copies, products or online softmax is
reported as not lowered yet. A value takes one of four forms:

- **scalar**: a private variable, the same in every thread;
- **replicated**: a small private array, the same in every thread: a reduction's
  result (each thread gets the group's total) and elementwise work on it;
- **lazy**: an expression of the element's index, evaluated where it is consumed.
  Loads and elementwise chains are lazy whatever their shape, so a row of a
  symbolic width is never stored: each consumer reads the tensor again;
- **owned**: a private array in the flat distribution (element ``e`` lives in
  thread ``e % THREADS``, slot ``e / THREADS``). A load from a tensor that the
  kernel also stores to takes this form, so that it is read before it is written.

A store walks its tile in the flat distribution; a reduction walks rows, each
thread striding along the row, then combines its partial with the group's
through local memory. Every statement carries the ``.tsr`` line it comes from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..graph.dims import Dim
from ..graph.graph_ops import binary_operands
from ..graph.ir import Block, Op, Value, walk
from ..graph.types import ScalarType, TensorType
from ..tile.ir import Access, TileKernel
from .cexpr import c_dim
from .naming import Namer
from .render import SourceLines
from .simt_dialect import Dialect

__all__ = ["SimtKernel", "SimtParam", "NotLowered", "emit_simt_kernel"]

_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_UNARY = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu", "silu", "relu", "abs",
          "sin", "cos", "neg")  # fmt: skip
_ELEMENTWISE = frozenset({*_BINARY, *_UNARY, "pow", "cast"})
#: Loop variables of the generated code; no value is named after them.
_RESERVED = frozenset({"lid", "e", "t", "i", "j", "r", "program", "tsr_scratch"})


class NotLowered(Exception):
    """The kernel uses an operation this backend does not lower yet."""


@dataclass(frozen=True)
class SimtParam:
    name: str
    #: "tensor", "scalar" or "dim"; for tensors the storage dtype's name.
    kind: str
    dtype: str | None
    written: bool = False


@dataclass(frozen=True)
class SimtKernel:
    name: str
    params: tuple[SimtParam, ...]
    #: Program ids with their extents and blocks, first axis fastest.
    grid: tuple[tuple[str, Dim, int], ...]
    threads: int
    body: tuple[str, ...]
    #: Whether the body combines values across the group (needs local scratch).
    reduces: bool


#: An element of a value at an index: one C expression per axis of the value.
Element = Callable[[tuple[str, ...]], str]


@dataclass(frozen=True)
class _Form:
    kind: str  # "scalar", "replicated", "lazy" or "owned"
    dims: tuple[Dim, ...]
    name: str = ""
    element: Element | None = None


def emit_simt_kernel(kernel: TileKernel, dialect: Dialect, dims: tuple[str, ...]) -> SimtKernel:
    return _Emitter(kernel, dialect, dims).run()


class _Emitter:
    def __init__(self, kernel: TileKernel, dialect: Dialect, dims: tuple[str, ...]) -> None:
        self.kernel = kernel
        self.d = dialect
        self.dims = dims
        pids = tuple(a.name for a in kernel.grid)
        self.namer = Namer(frozenset(dims) | frozenset(pids) | _RESERVED)
        self.forms: dict[int, _Form] = {}
        self.lines: list[str] = []
        self.depth = 1
        self.reduces = False
        self.sources = SourceLines()
        #: While a flat loop runs: the shape it walks (owned values are readable there).
        self.flat: tuple[Dim, ...] | None = None
        self.flat_start = 0
        self.stored = {op.operands[0].id for op in walk(kernel.body) if op.kind == "store"}

    # -- output --------------------------------------------------------------------------

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def open(self, text: str) -> None:
        self.line(text + " {")
        self.depth += 1

    def close(self) -> None:
        self.depth -= 1
        self.line("}")

    def source_comment(self, op: Op) -> None:
        comment = self.sources.comment(op.span)
        if comment is not None:
            self.line(comment)

    def c(self, dim: Dim) -> str:
        return c_dim(dim, {})

    def run(self) -> SimtKernel:
        params = []
        for p in self.kernel.params:
            name = self.namer.fresh(p.name, "arg")
            if isinstance(p.type, TensorType):
                self.forms[p.id] = _Form("tensor", tuple(p.type.dims), name)
                params.append(SimtParam(name, "tensor", p.type.dtype.name, p.id in self.stored))
            else:
                self.forms[p.id] = _Form("scalar", (), name)
                params.append(SimtParam(name, "scalar", p.type.kind))
        self.block(self.kernel.body)
        grid = tuple((a.name, a.extent, a.block) for a in self.kernel.grid)
        return SimtKernel(self.kernel.name, tuple(params), grid, self.kernel.threads,
                          tuple(self.lines), self.reduces)  # fmt: skip

    def block(self, block: Block) -> None:
        for op in block.ops:
            self.source_comment(op)
            handler = getattr(self, "op_" + op.kind, None)
            if handler is not None:
                handler(op)
            elif op.kind in _ELEMENTWISE:
                self.elementwise(op)
            else:
                raise NotLowered(f"'{op.kind}'")

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
            if self.flat != form.dims or own != index:
                raise NotLowered("a value loaded before a store, read in another loop")
            return f"{form.name}[t]"
        return f"{form.name}[{self.flat_index(own, form.dims)}]"

    def flat_index(self, index: tuple[str, ...], dims: tuple[Dim, ...]) -> str:
        """The row-major position of an element; size-1 axes add nothing."""
        out = "0"
        for i, d in zip(index, dims, strict=True):
            if d == Dim.const(1):
                continue
            out = i if out == "0" else f"({out}) * {self.c(d)} + {i}"
        return out

    def split_flat(self, dims: tuple[Dim, ...]) -> tuple[str, ...]:
        """Declare the index of each axis from the flat index ``e``; returns their names."""
        if len(dims) == 1:
            return ("e",)
        if len(dims) != 2:
            raise NotLowered(f"a tile of rank {len(dims)}")
        cols = self.c(dims[1])
        self.line(f"const {self.d.index_type} i = e / {cols};")
        self.line(f"const {self.d.index_type} j = e - i * {cols};")
        return ("i", "j")

    def flat_loop(self, dims: tuple[Dim, ...]) -> tuple[str, ...]:
        """Open a loop over this thread's elements of a tile; the caller closes it."""
        total = Dim.const(1)
        for d in dims:
            total = total * d
        i64 = self.d.index_type
        self.open(f"for ({i64} e = lid, t = 0; e < {self.c(total)}; e += {self.kernel.threads}, "
                  "++t)")  # fmt: skip
        self.flat = dims
        self.flat_start = len(self.lines) - 1
        return self.split_flat(dims)

    def close_flat(self) -> None:
        """Close a flat loop; its slot counter ``t`` goes when no owned value was read."""
        if not any("[t]" in line for line in self.lines[self.flat_start + 1 :]):
            head = self.lines[self.flat_start]
            self.lines[self.flat_start] = head.replace(", t = 0", "").replace(", ++t", "")
        self.flat = None
        self.close()

    # -- scalars and elementwise -------------------------------------------------------

    def scalar(self, op: Op, expr: str) -> None:
        name = self.namer.fresh(op.result.name, "s")  # s, s_1, ...: unnamed scalars
        self.forms[op.result.id] = _Form("scalar", (), name)
        self.line(f"const {self.d.scalar_types[op.result.type.kind]} {name} = {expr};")

    def op_const(self, op: Op) -> None:
        value = op.attr("value")
        expr = str(int(value)) if isinstance(value, (bool, int)) else self.d.literal(value)
        self.scalar(op, expr)

    def op_dim_to_float(self, op: Op) -> None:
        self.scalar(op, f"(float)({self.c(op.attr('dim'))})")

    def expression(self, op: Op, index: tuple[str, ...], out: tuple[Dim, ...]) -> str:
        d = self.d
        if op.kind in _BINARY or op.kind == "pow":
            a, b = (self.at(x, index, out) for x in binary_operands(op))
            if op.kind == "pow":
                exponent = binary_operands(op)[1]
                integer = isinstance(exponent, Value) and exponent.type.kind == "int"
                return f"pown({a}, (int)({b}))" if integer else f"pow({a}, {b})"
            return f"{a} {_BINARY[op.kind]} {b}"
        x = self.at(op.operands[0], index, out)
        if op.kind == "cast":
            return d.round(op.result.type.dtype.name, x)
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
            name = self.namer.fresh(result.name, "v")
            self.forms[result.id] = _Form("replicated", out, name)
            self.line(f"float {name}[{_numel(out)}];")
            self.open(f"for (int e = 0; e < {_numel(out)}; ++e)")
            index = self.split_flat(out)
            self.line(f"{name}[e] = {self.expression(op, index, out)};")
            self.close()
            return
        self.forms[result.id] = _Form(
            "lazy", out, element=lambda idx: self.expression(op, idx, out)
        )

    def op_expand_dims(self, op: Op) -> None:
        x = self.forms[op.operands[0].id]
        out = tuple(op.result.type.dims)
        axes = set(op.attr("axes"))
        if x.kind == "replicated":
            self.forms[op.result.id] = _Form("replicated", out, x.name)
            return
        if x.kind != "lazy":
            raise NotLowered(f"expand_dims of a {x.kind} value")
        element = x.element
        assert element is not None

        def dropped(index: tuple[str, ...]) -> str:
            return element(tuple(i for k, i in enumerate(index) if k not in axes))

        self.forms[op.result.id] = _Form("lazy", out, element=dropped)

    # -- reductions ------------------------------------------------------------------------

    def _reduce(self, op: Op, combine: str, init: str, group: str) -> None:
        x = op.operands[0]
        dims = tuple(x.type.dims)
        if len(dims) != 2 or op.attr("axis") not in (1, -1) or dims[0].constant is None:
            raise NotLowered("a reduction other than along the rows of a tile")
        rows = dims[0].constant
        name = self.namer.fresh(op.result.name, "v")
        self.forms[op.result.id] = _Form("replicated", tuple(op.result.type.dims), name)
        self.reduces = True
        i64 = self.d.index_type
        self.line(f"float {name}[{rows}];")
        self.open(f"for (int i = 0; i < {rows}; ++i)")
        self.line(f"float r = {init};")
        element = self.at(x, ("i", "j"), dims)
        self.line(f"for ({i64} j = lid; j < {self.c(dims[1])}; j += {self.kernel.threads}) "
                  f"r = {combine.format(element=element)};")  # fmt: skip
        self.line(f"{name}[i] = {group}(tsr_scratch, r);")
        self.close()

    def op_sum(self, op: Op) -> None:
        self._reduce(op, "r + {element}", "0.0f", "tsr_group_sum")

    def op_max(self, op: Op) -> None:
        self._reduce(op, "fmax(r, {element})", self.d.literal(float("-inf")), "tsr_group_max")

    # -- memory ----------------------------------------------------------------------------

    def _address(self, tensor: Value, at: Access, index: tuple[str, ...]) -> tuple[str, str]:
        """(element offset, condition) of the access at a tile index."""
        dims = tensor.type.dims
        tile = iter(index)
        offset = ""
        conditions = []
        for axis, d in zip(at.axes, dims, strict=True):
            if axis.index:
                pos = self.c(axis.offset)
            else:
                i = next(tile)
                pos = i if axis.offset == Dim.const(0) else f"{self.c(axis.offset)} + {i}"
                if axis.masked:
                    conditions.append(f"{pos} < {self.c(axis.extent)}")
            offset = pos if not offset else f"({offset}) * {self.c(d)} + {pos}"
        return offset, " && ".join(conditions)

    def op_load(self, op: Op) -> None:
        tensor = op.operands[0]
        at: Access = op.attr("at")
        t = self.forms[tensor.id]
        dtype = tensor.type.dtype.name

        def element(index: tuple[str, ...]) -> str:
            offset, condition = self._address(tensor, at, index)
            value = self.d.read(dtype, t.name, offset)
            return f"{condition} ? {value} : 0.0f" if condition else value

        out = tuple(op.result.type.dims)
        if tensor.id not in self.stored:
            self.forms[op.result.id] = _Form("lazy", out, element=element)
            return
        if not _constant(out):
            raise NotLowered("a load of a symbolic size from a tensor the kernel writes")
        name = self.namer.fresh(op.result.name, "v")
        self.line(f"float {name}[{-(-_numel(out) // self.kernel.threads)}];")
        index = self.flat_loop(out)
        self.line(f"{name}[t] = {element(index)};")
        self.close_flat()
        self.forms[op.result.id] = _Form("owned", out, name)

    def op_store(self, op: Op) -> None:
        tensor, tile = op.operands
        at: Access = op.attr("at")
        out = tuple(tile.type.dims)
        index = self.flat_loop(out)
        offset, condition = self._address(tensor, at, index)
        value = self.at(tile, index, out)
        store = self.d.write(tensor.type.dtype.name, self.forms[tensor.id].name, offset, value)
        self.line(f"if ({condition}) {store}" if condition else store)
        self.close_flat()


def _constant(dims: tuple[Dim, ...]) -> bool:
    return all(d.constant is not None for d in dims)


def _numel(dims: tuple[Dim, ...]) -> int:
    total = 1
    for d in dims:
        assert d.constant is not None
        total *= d.constant
    return total
