"""Lower a tile kernel of the Graph IR, with its launch, to the Tile IR.

The schedule fixes the tile sizes, so ``T.m`` becomes a number; the grid
names its program ids; every ``tile.load`` and ``tile.store`` becomes an
``Access`` whose offsets are expressions of the program ids and loop
counters; ``tile.for`` counts blocks; an ``if`` on a parameter bound to a
constant (``causal=True`` from a graph op) keeps only the branch taken. The
result is stored at the program's own block, after the fused group's
epilogue. Accesses come out unmasked; the edge-masking pass decides which
axes need a mask.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ...frozen import frozen
from ..frontend.diagnostics import CompileError, Diagnostic, Severity
from ..graph.dims import Dim
from ..graph.ir import Block, Function, Op, Value, new_value, walk
from ..graph.types import ScalarType, TensorType, TileType, TupleType
from ..schedule.ir import Launch
from .ir import Access, Axis, GridAxis, TileKernel
from .rewrite import use_counts

__all__ = ["KernelInput", "Prologue", "View", "lower_tile_function", "TILE_NAMES"]

#: The schedule's tile names, as a tile kernel's context calls them.
TILE_NAMES = {
    "BM": "T.m", "BN": "T.n", "BK": "T.k", "BD": "T.d", "rows": "T.m", "elements": "T.m",
}  # fmt: skip
INDEX = ScalarType("index")
_ONE = Dim.const(1)
#: The program id whose block a tile size is, when the size is written as such.
_ROLE_OF = {"T.m": "pid_m", "T.n": "pid_n"}
#: The program ids that step over a result's rows and columns.
_BLOCKS = frozenset(_ROLE_OF.values())


@frozen
class Prologue:
    """A kernel operand that no tensor holds: the group's ops compute it where the
    kernel loads it. ``tensor`` has its type (for the place a load covers); ``build``
    computes the loaded tile there from the tensors the ops read."""

    tensor: Value
    build: Callable[[_Lowering, Value | None, Access], Value]


@frozen
class View:
    """A kernel operand read where it lies, through a transpose that keeps the last axis
    (attention's heads split from ``[S, H*D]``, or from ``split_qkv``'s ``[S, 3*H*D]``).
    ``tensor`` has the operand's type (for the place a load covers), ``source`` is the
    parameter that the transpose by ``perm`` permutes, with the axes after the rows
    merged (``instantiate.merged_rows``)."""

    tensor: Value
    source: Value
    perm: tuple[int, ...]
    #: where the view starts along each axis of ``source`` as ``Access.rows_permuted``
    #: reads it (``split_qkv``'s k and v lie after q; a slice starts where it says)
    starts: tuple[Dim, ...]

    def access(self, out: Access) -> Access:
        """Where an access ``out`` to the operand lies in ``source``: each axis moved to
        where the view starts along it, and ending where the view does."""
        axes = out.rows_permuted(self.perm).axes
        return Access(
            tuple(
                (
                    a
                    if s == Dim.const(0)
                    else dataclasses.replace(a, offset=a.offset + s, extent=a.extent + s)
                )
                for a, s in zip(axes, self.starts, strict=True)
            )
        )


@frozen
class KernelInput:
    """What a tile function is lowered with.

    ``bind`` maps each parameter of the tile function (by value id) to the
    kernel parameter it reads, to a constant for scalars fixed by a graph op,
    to a ``Prologue`` that computes the operand where it is loaded, or to a ``View``
    that reads it where it lies;
    ``output`` is where the returned tile goes; ``epilogue`` builds the fused
    ops between the returned tile and the store. A kernel that returns several tiles
    stores the first into ``output`` and each of the others into its parameter of
    ``beside``, in order, at the same program's block (sema checked that the tiles
    agree), with no epilogue.
    """

    name: str
    function: str
    params: tuple[Value, ...]
    bind: dict[int, Any]
    output: Value | View | None
    epilogue: Callable[[_Lowering, Value, Access], Value] | None = None
    template: str = "tile_kernel"
    kind: str = "tile"
    beside: tuple[Value, ...] = ()


def lower_tile_function(function: Function, launch: Launch, given: KernelInput) -> TileKernel:
    lowering = _Lowering(function, launch, given)
    body = lowering.run()
    return TileKernel(
        given.name, given.function, launch.name, given.kind, given.template, given.params,
        lowering.grid, lowering.tiles, launch.threads, launch.warps, launch.stages,
        launch.vector, launch.swizzle, body, span=function.span, persistent=launch.persistent,
        strides=(*lowering.pid_strides(), *lowering.counter_strides),
        sizes=_spelled_sizes(function),
    )  # fmt: skip


class _Lowering:
    def __init__(self, function: Function, launch: Launch, given: KernelInput) -> None:
        self.function = function
        self.launch = launch
        self.given = given
        self.sizes = {TILE_NAMES.get(name, name): size for name, size in launch.tiles}
        self.tiles = tuple(sorted(self.sizes.items()))
        self.values: dict[int, Value] = {}
        self.ops: list[Op] = []
        # Offsets and extents write sizes, program ids and loop counters alike as
        # symbols: ids and counters take names that no size of the kernel has.
        self.taken = {s for p in given.params if isinstance(p.type, TensorType)
                      for d in p.type.dims for s in d.symbols()}  # fmt: skip
        stored = given.output.tensor if isinstance(given.output, View) else given.output
        out = stored.type if stored is not None else _stored_type(function)
        # The output's leading dims that the tile does not span (a row sum's tile spans
        # one of [B, S]; a gemm's two of [B, M, N]) are batch axes of the grid.
        spanned = _tile_rank(function)
        self.batch = tuple(out.dims[:-spanned]) if out.rank > spanned else ()
        #: Each program id's name, by its role (``pid_m``, ``pid_n``, ``pid_b0``...).
        self.pid_names: dict[str, str] = {}
        self.grid = self._grid(out)
        #: The loop counters that step by a tile size, with its name.
        self.counter_strides: list[tuple[str, str]] = []

    # -- grid ------------------------------------------------------------------------

    def _grid(self, out: TensorType) -> tuple[GridAxis, ...]:
        """The launch's grid with names: ``pid_n`` (column blocks, gemm-like kernels
        only), ``pid_m`` (row blocks), ``pid_b0``... (batch indices), as the schedule
        ordered them. A split-K axis is dropped: the tile stage runs K in one slice
        (the caller warns)."""
        axes = self.launch.grid[:-1] if self.launch.split_k > 1 else self.launch.grid
        batch = [f"pid_b{i}" for i in range(len(self.batch))]
        names = ["pid_m", *batch]
        if len(axes) == len(names) + 1:
            names = ["pid_n", *names]
        assert len(axes) == len(names), f"grid {axes} for output {out}"
        self.pid_names = {role: self.unique(role) for role in names}
        return tuple(GridAxis(self.pid_names[n], a.extent, a.block)
                     for n, a in zip(names, axes, strict=True))  # fmt: skip

    def pid_strides(self) -> tuple[tuple[str, str], ...]:
        """The program ids whose block is the tile size of their role (``pid_m`` steps
        by ``T.m``): the schedule's row and column blocks are those tiles."""
        return tuple(
            (self.pid_names[role], tile)
            for tile, role in _ROLE_OF.items()
            if role in self.pid_names
            and self.sizes.get(tile) == self._pid_block(self.pid_names[role])
        )

    def unique(self, name: str) -> str:
        """``name``, or ``name`` with underscores appended where a size or an earlier
        id or counter has it; taken from then on."""
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name

    # -- values and types -----------------------------------------------------------

    def dim(self, dim: Dim) -> Dim:
        return dim.substitute(self.sizes)

    def type(self, t: Any) -> Any:
        if isinstance(t, TileType):
            tiles = tuple(d.symbol if d.symbol in self.sizes else None for d in t.dims)
            return TileType(tuple(self.dim(d) for d in t.dims), t.dtype, tiles)
        return t

    def value(self, old: Value) -> Value:
        return self.values[old.id]

    def emit(
        self, kind: str, operands: tuple[Value, ...], types: tuple[Any, ...],
        attrs: tuple = (), effects: tuple[str, ...] = (), regions: tuple = (),
        span: Any = None, names: tuple[str | None, ...] | None = None,
    ) -> tuple[Value, ...]:  # fmt: skip
        names = names or (None,) * len(types)
        results = tuple(new_value(t, n) for t, n in zip(types, names, strict=True))
        self.ops.append(Op(kind, operands, results, attrs, effects, regions, span))
        return results

    def float_of(self, dim: Dim) -> Value:
        """A run-time size as a float scalar."""
        (size,) = self.emit("dim_to_float", (), (ScalarType("float"),), (("dim", dim),))
        return size

    def rsqrt_of(self, dim: Dim) -> Value:
        """``1/sqrt(dim)`` as a scalar, for a scale that depends on a run-time size."""
        (scale,) = self.emit("rsqrt", (self.float_of(dim),), (ScalarType("float"),),
                             names=("scale",))  # fmt: skip
        return scale

    # -- the walk --------------------------------------------------------------------

    def run(self) -> Block:
        for param in self.function.params:
            bound = self.given.bind[param.value.id]
            if isinstance(bound, (Prologue, View)):  # computed, or read, where it is loaded
                continue
            if isinstance(bound, Value):
                self.values[param.value.id] = bound
            elif callable(bound):
                self.values[param.value.id] = bound(self)
            else:
                kind = param.value.type
                (self.values[param.value.id],) = self.emit(
                    "const", (), (kind,), (("value", bound),), names=(param.value.name,)
                )
        self.block(self.function.body.ops)
        if self.function.body.yields and self.given.output is not None:
            for returned in self.function.body.yields:
                self._check_blocks(returned.type)
            result = self.value(self.function.body.yields[0])
            output = self.given.output
            view = output if isinstance(output, View) else None
            access = self.access(view.tensor if view else output, result.type.dims, None)
            if self.given.epilogue is not None:
                result = self.given.epilogue(self, result, access)
            if view is not None:
                output, access = view.source, view.access(access)
            self.emit("store", (output, result), (), (("at", access),), ("write",))
            beside = zip(self.function.body.yields[1:], self.given.beside, strict=True)
            for result, (old, out) in enumerate(beside, 1):
                tile = self.value(old)
                at = self.access(out, tile.type.dims, None, result)
                self.emit("store", (out, tile), (), (("at", at),), ("write",))
        body = Block((), tuple(self.ops))
        uses = use_counts(body)
        # a keyword bound to a constant that only an inlined branch read is not needed
        kept = tuple(op for op in body.ops if op.kind != "const" or uses.get(op.result.id))
        return Block((), kept)

    def block(self, ops: tuple[Op, ...]) -> None:
        for op in ops:
            handler = getattr(self, "op_" + op.kind.replace(".", "_"), None)
            if handler is not None:
                handler(op)
            else:
                self.generic(op)

    def generic(self, op: Op) -> None:
        kind = op.kind.removeprefix("tile.")
        attrs = tuple((k, self.dim(v) if isinstance(v, Dim) else v) for k, v in op.attrs)
        results = self.emit(
            kind, tuple(self.value(v) for v in op.operands),
            tuple(self.type(r.type) for r in op.results), attrs, op.effects, (), op.span,
            tuple(r.name for r in op.results),
        )  # fmt: skip
        for old, new in zip(op.results, results, strict=True):
            self.values[old.id] = new

    def region(self, block: Block, args: tuple[Value, ...]) -> Block:
        saved = self.ops
        self.ops = []
        for old, new in zip(block.args, args, strict=True):
            self.values[old.id] = new
        self.block(block.ops)
        body = Block(args, tuple(self.ops), tuple(self.value(v) for v in block.yields))
        self.ops = saved
        return body

    # -- memory -----------------------------------------------------------------------

    def access(
        self, tensor: Value, tile_dims: tuple[Dim, ...], op: Op | None, result: int = 0
    ) -> Access:
        """The place a load or store covers, from its ``rows``/``cols`` modes (or, for
        the function's ``result``-th returned tile, the program's own block)."""
        dims = _spelled_like(tensor.type.dims, self._declared(op, result))
        modes = dict(op.attrs) if op is not None else {}
        blocks = list(op.operands[2 if op.kind == "tile.store" else 1 :]) if op else []
        tiled = dims[-len(tile_dims) :]
        names = ("rows", "cols") if len(tile_dims) == 2 else (next(iter(modes), "rows"),)
        # The sizes as written (``T.n``), which say whose block a program-sized one is.
        written = tile_dims
        if op is not None:
            written = (op.result if op.kind == "tile.load" else op.operands[1]).type.dims
        # a batch dim of one element is broadcast: every program reads its element 0
        axes = [Axis(Dim.const(0) if d == _ONE else Dim.sym(p), _ONE, d, index=True)
                for p, d in zip(self._batch_pids(len(dims) - len(tile_dims)),
                                dims[: len(dims) - len(tile_dims)], strict=True)]  # fmt: skip
        for name, extent, size, spelled in zip(names, tiled, tile_dims, written, strict=True):
            mode = modes.get(name, "program")
            if mode == "block":
                counter = self.value(blocks.pop(0))
                axes.append(Axis(Dim.sym(counter.name) * size, size, extent))
            elif mode == "all":
                axes.append(Axis(Dim.const(0), self.dim(extent), extent))
            else:
                offset = self._program_offset(name, size, spelled)
                if op is None:
                    self._check_owned(name, spelled, size, extent, offset)
                axes.append(Axis(offset, size, extent))
        return Access(tuple(axes))

    def _check_blocks(self, returned: Any) -> None:
        """A returned tile's rows are the program's row block (``T.m``) and its columns
        its column block (``T.n``): ``tile.transpose`` of a block loaded with
        ``rows=T.m, cols=T.n`` holds the program's column block in its rows, and would
        be stored at the row block (wrong values wherever the two differ). That is an
        error at the return, which says how to load the block that transposes into
        place."""
        if not isinstance(returned, TileType) or len(self.pid_names.keys() & _BLOCKS) < 2:
            return
        spelled = [d.symbol for d in returned.dims[-2:]]
        own = ("T.m", "T.n")[-len(spelled) :]
        crossed = [(s, o) for s, o in zip(spelled, own, strict=True) if s in _ROLE_OF and s != o]
        if not crossed:
            return
        raise self._at_return(
            f"the returned tile is [{', '.join(str(d) for d in returned.dims)}], but a "
            f"program stores its block of the result, [{', '.join(own)}]: its "
            f"{crossed[0][0]} block where the result's {crossed[0][1]} block goes. To "
            "write a transposed block, load the block it transposes from with "
            "rows=T.n, cols=T.m"
        )

    def _check_owned(self, axis: str, spelled: Dim, size: Dim, extent: Dim, offset: Dim) -> None:
        """A returned tile is stored at the program's own block: along an axis that the
        grid steps over, a tile of another size than the step would be stored by every
        program at the same place (``tile.concat((a, b), axis=0)`` of two row blocks),
        unless one program covers the whole axis. That is an error at the return."""
        if offset != Dim.const(0):
            return
        role = self._role(axis, spelled)
        pid = self.pid_names.get(role)
        if pid is None:
            return
        block = self._pid_block(pid)
        if extent.constant is not None and extent.constant <= block:
            return
        what = "rows" if axis == "rows" else "columns"
        step = "T.m" if role == "pid_m" else "T.n"
        raise self._at_return(
            f"the returned tile has {size} {what}, but each program of the grid owns a "
            f"block of {block} {what} of the result ({step}): every program would store "
            f"its tile over the same {what}. Return a tile of {step} {what} (a block of "
            "each program's own), or write the result with tile.store at offsets the "
            "program computes"
        )

    def _at_return(self, message: str) -> CompileError:
        """An error of the kernel's ``return``, the user's line that the tile stage
        cannot lower as written."""
        span = self.function.return_span or self.function.span
        return CompileError((Diagnostic(Severity.ERROR, message, span),))

    def _declared(self, op: Op | None, result: int) -> tuple[Dim, ...]:
        """The dims of the tensor that ``op`` (a load or store, or None: the store of the
        ``result``-th returned tile) reads or writes, as the function declares it, whose
        constants may be spelled in its sizes where the kernel parameter's are numbers."""
        if op is not None:
            return getattr(op.operands[0].type, "dims", ())
        declared = self.function.result_type
        declared = declared.items[result] if isinstance(declared, TupleType) else declared
        return getattr(declared, "dims", ())

    def _batch_pids(self, count: int) -> list[str]:
        """Leading tensor dims line up, from the right, with the grid's batch axes."""
        names = [self.pid_names[f"pid_b{i}"] for i in range(len(self.batch))]
        assert count <= len(names), "a tensor with more leading dims than the output"
        return names[len(names) - count :]

    def _program_offset(self, axis: str, size: Dim, spelled: Dim) -> Dim:
        """A program-sized block: the program's row block, its column block (gemm-like
        grids), or the single block of a dim the tile spans (the head dim). ``T.m`` and
        ``T.n`` name their block wherever they stand, so ``rows=T.n`` of a ``[N, K]``
        operand is the program's column block; other sizes go by the axis."""
        pid = self.pid_names.get(self._role(axis, spelled))
        if pid is not None and size.constant == self._pid_block(pid):
            return Dim.sym(pid) * size
        return Dim.const(0)

    @staticmethod
    def _role(axis: str, spelled: Dim) -> str:
        """The program id whose block a tile's ``axis`` is (see ``_program_offset``)."""
        return _ROLE_OF.get(spelled.symbol or "", "pid_m" if axis == "rows" else "pid_n")

    def _pid_block(self, pid: str) -> int:
        return next(a.block for a in self.grid if a.name == pid)

    def op_tile_load(self, op: Op) -> None:
        t = self.type(op.result.type)
        computed = self.given.bind.get(op.operands[0].id)
        if isinstance(computed, Prologue):
            access = self.access(computed.tensor, t.dims, op)
            self.values[op.result.id] = computed.build(self, None, access)
            return
        if isinstance(computed, View):
            src, access = computed.source, computed.access(self.access(computed.tensor, t.dims, op))
        else:
            src = self.value(op.operands[0])
            access = self.access(src, t.dims, op)
        (self.values[op.result.id],) = self.emit(
            "load", (src,), (t,), (("at", access),), (), (), op.span, (op.result.name,)
        )

    def op_tile_store(self, op: Op) -> None:
        dst, tile = self.value(op.operands[0]), self.value(op.operands[1])
        access = self.access(dst, tile.type.dims, op)
        self.emit("store", (dst, tile), (), (("at", access),), ("write",), (), op.span)

    # -- control flow -----------------------------------------------------------------

    def op_tile_for(self, op: Op) -> None:
        block_arg = op.regions[0].args[0]
        counter = new_value(INDEX, self.unique(block_arg.name or "i"))
        carried = tuple(new_value(self.type(a.type), a.name) for a in op.regions[0].args[1:])
        body = self.region(op.regions[0], (counter, *carried))
        block = op.attr("block")
        step = self.dim(block)
        if block.symbol in self.sizes:
            self.counter_strides.append((counter.name, block.symbol))
        elif block.spelled is not None and block.spelled.symbol is not None:
            self.counter_strides.append((counter.name, block.spelled.symbol))
        attrs = (("extent", op.attr("extent")), ("step", step), ("prefetch", op.attr("prefetch")))
        results = self.emit(
            "for", tuple(self.value(v) for v in op.operands),
            tuple(self.type(r.type) for r in op.results), attrs, (), (body,), op.span,
            tuple(r.name for r in op.results),
        )  # fmt: skip
        for old, new in zip(op.results, results, strict=True):
            self.values[old.id] = new

    def op_if(self, op: Op) -> None:
        cond = self.given.bind.get(op.operands[0].id, self.values.get(op.operands[0].id))
        if isinstance(cond, bool):
            taken = op.regions[0 if cond else 1]
            self.block(taken.ops)
            for old, new in zip(op.results, taken.yields, strict=True):
                self.values[old.id] = self.value(new)
            return
        regions = tuple(self.region(r, ()) for r in op.regions)
        results = self.emit(
            "if", (self.value(op.operands[0]),), tuple(self.type(r.type) for r in op.results),
            (), (), regions, op.span, tuple(r.name for r in op.results),
        )  # fmt: skip
        for old, new in zip(op.results, results, strict=True):
            self.values[old.id] = new

    # -- indices ---------------------------------------------------------------------

    def op_tile_row_index(self, op: Op) -> None:
        t = self.type(op.result.type)
        offset = self._program_offset("rows", t.dims[0], op.result.type.dims[0])
        (self.values[op.result.id],) = self.emit(
            "iota", (), (t,), (("offset", offset),), (), (), op.span
        )

    def op_tile_col_index(self, op: Op) -> None:
        t = self.type(op.result.type)
        offset = Dim.const(0)  # a whole row's columns
        if op.operands:  # a block of tile.range_n's
            offset = Dim.sym(self.value(op.operands[0]).name) * t.dims[0]
        (self.values[op.result.id],) = self.emit(
            "iota", (), (t,), (("offset", offset),), (), (), op.span
        )

    def op_tile_cast(self, op: Op) -> None:
        x = self.value(op.operands[0])
        if x.type.dtype == op.attr("dtype"):
            self.values[op.result.id] = self._named(x, op.result.name)
        else:
            self.generic(op)

    def _named(self, value: Value, name: str | None) -> Value:
        """``value``, taking ``name`` if it has none (a cast that folds away leaves its
        name to the value it would have converted)."""
        last = self.ops[-1] if self.ops else None
        if value.name is not None or name is None or last is None or last.results != (value,):
            return value
        named = dataclasses.replace(value, name=name)
        self.ops[-1] = dataclasses.replace(last, results=(named,))
        for key, bound in list(self.values.items()):
            if bound is value:
                self.values[key] = named
        return named


def _spelled_like(dims: tuple[Dim, ...], declared: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """``dims``, each taking the spelling of the declared dim in its place that equals it
    (a library kernel's ``K``, where the caller's tensor has 256)."""
    if len(declared) != len(dims):
        return dims
    return tuple(
        w if w.spelled is not None and w == d else d for d, w in zip(dims, declared, strict=True)
    )


def _spelled_sizes(function: Function) -> tuple[tuple[str, int], ...]:
    """The sizes that the function's constants are spelled in (``Dim.spelled``), with
    their values: each is a parameter's dim (a library kernel's ``K``, fixed by its
    caller) or a loop's literal step, spelled alone there."""
    dims = [d for p in function.params for d in getattr(p.value.type, "dims", ())]
    dims += [op.attr("block") for op in walk(function.body) if op.kind == "tile.for"]
    found = {d.spelled.symbol: d.constant for d in dims
             if d.spelled is not None and d.spelled.symbol is not None}  # fmt: skip
    return tuple(sorted(found.items()))


def _tile_rank(function: Function) -> int:
    """How many of the output's last dims a program's tile spans: the returned tile's
    rank (a row reduction's is 1), else 2 (a kernel that stores instead of returning)."""
    yields = function.body.yields
    if not yields or not isinstance(yields[0].type, TileType):
        return 2
    return len(yields[0].type.dims)


def _stored_type(function: Function) -> TensorType:
    """What a kernel without a result writes: the first tensor it stores into."""
    store = next(op for op in walk(function.body) if op.kind == "tile.store")
    return store.operands[0].type
