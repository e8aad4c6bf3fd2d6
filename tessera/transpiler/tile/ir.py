"""Tile IR: one explicit program per kernel launch.

The Tile IR says everything a backend needs and nothing it must guess: tile
sizes are numbers, the program ids (``pid_m``, ``pid_n``, ``pid_b0``) and
loop counters are named, every global access states its offsets and which of
its axes need a mask, shared memory is allocated with an offset and a layout,
copies say whether they are asynchronous and into which pipeline stage, and
barriers stand where they are needed. Operations reuse the Graph IR's ``Op``,
``Value`` and ``Block``; the memory operations are new kinds:

``alloc``            a shared-memory buffer (``shared<[stages, rows, cols], dtype>``)
``load``             global tensor -> register tile, at an ``Access``
``store``            register tile -> global tensor, at an ``Access``
``copy``             global -> shared (``async`` on targets with cp.async or TMA)
``commit``/``wait``  close a group of async copies / wait until ``pending`` remain
``wait_mma``         wait until ``pending`` batches of an asynchronous product remain
``read``             shared -> register tile (one stage of a buffer)
``barrier``          all threads of the program
``release``          free a pipeline stage for a producer warpgroup's next copies into it
``mma``              ``acc + a @ b`` on the instruction legalization chose
``mask_edge``        set a tile's elements past a ragged edge to a fill value
``kv_slot``          the slot a cache append writes a row into (``tile.kvcache``)
``kv_advance``       a cache's length grows by the positions appended
``kv_visible``       the keys of its split a query row sees, from a cache's length
``kv_lengths``       a cache's lengths as i32, a batch row's per program
``for`` / ``if``     structured control flow, as in the Graph IR
"""

from __future__ import annotations

import math
from dataclasses import field

from ...frozen import frozen
from ..frontend.source import Span
from ..graph.dims import Dim
from ..graph.dtypes import DType
from ..graph.ir import Block, Value, walk
from ..graph.types import dims_text
from ..schedule.ir import HostProgram

__all__ = [
    "Axis",
    "Access",
    "SharedType",
    "Slot",
    "When",
    "GridAxis",
    "Mma",
    "Live",
    "SmemSlot",
    "TileKernel",
    "TileProgram",
    "TileModule",
    "STORES",
]

#: The ops that write the tensor that is their first operand.
STORES = ("store", "kv_advance", "kv_visible", "kv_lengths")


@frozen
class Axis:
    """How an access covers one axis of a tensor: ``size`` elements from ``offset``.

    ``extent`` is the tensor's size along the axis; ``masked`` says whether the
    access must check ``offset + i < extent`` (the edge-masking pass decides).
    An index axis (a batch dim) has size 1 and is never masked.
    """

    offset: Dim
    size: Dim
    extent: Dim
    masked: bool = False
    index: bool = False
    #: The tensor's size along an axis of several merged (``Access.rows_permuted``: the
    #: heads of ``[T, 4*64]``), which the access ends before, where it is spelled by name
    #: (``4*D``, ``Dim.spelled``) for a backend to stride by; None otherwise.
    whole: Dim | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        if self.index:
            return str(self.offset)
        if self.offset == Dim.const(0) and self.size == self.extent:
            return ":"
        mask = f" < {self.extent}" if self.masked else ""
        return f"{self.offset} +: {self.size}{mask}"


@frozen
class Access:
    """Where a load, store or copy touches a global tensor: one ``Axis`` per dim."""

    axes: tuple[Axis, ...]

    @property
    def tile_axes(self) -> tuple[Axis, ...]:
        """The axes that become tile dims (the batch dims are indices)."""
        return tuple(a for a in self.axes if not a.index)

    def rows_permuted(self, perm: tuple[int, ...]) -> Access:
        """This access to ``transpose(x, perm)`` (a permutation that keeps the last axis)
        as an access to ``x`` with the axes after ``perm[-2]``, the one that becomes the
        rows, merged into one: each axis of ``x`` up to the rows is read as the axis it
        moves to, and the index axes that come from after the rows pick a block of the
        merged columns, which ends where that block does (a head's ``D`` columns of
        ``[S, H*D]``), so that a tile wider than the block is masked there."""
        moved_to = {axis: at for at, axis in enumerate(perm)}
        place = [self.axes[moved_to[axis]] for axis in range(len(perm))]
        rows = perm[-2]
        offset = Dim.const(0)
        for axis in place[rows + 1 : -1]:
            offset = offset * axis.extent + axis.offset
        last = place[-1]
        base = offset * last.extent
        whole = math.prod((axis.extent for axis in place[rows + 1 :]), start=Dim.const(1))
        columns = Axis(base + last.offset, last.size, base + last.extent,
                       whole=whole if whole.spelled is not None else None)  # fmt: skip
        return Access((*place[: rows + 1], columns))

    def __str__(self) -> str:
        return "[" + ", ".join(str(a) for a in self.axes) + "]"


@frozen
class Slot:
    """Which stage of a multi-stage buffer an iteration uses: ``index % stages``."""

    index: Dim
    stages: int = 1

    def __str__(self) -> str:
        if self.index.constant is not None:
            return str(self.index.constant % self.stages)
        return f"({self.index}) % {self.stages}"


@frozen
class When:
    """A copy that runs only while ``start < extent`` (pipelined loads past the loop)
    and, in a loop that stops early (causal attention's), while the iteration it copies
    for runs: ``stop[0] < stop[1]``. A copy past either would never be waited for."""

    start: Dim
    extent: Dim
    stop: tuple[Dim, Dim] | None = None

    def __str__(self) -> str:
        text = f"{self.start} < {self.extent}"
        return text if self.stop is None else f"{text} && {self.stop[0]} < {self.stop[1]}"


@frozen
class SharedType:
    """A shared-memory buffer with one ``[rows, cols]`` slot per pipeline stage."""

    dims: tuple[Dim, ...]
    dtype: DType
    stages: int = 1
    #: The schedule's tile each dim is, as ``TileType.tiles`` says.
    tiles: tuple[str | None, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def slot_elements(self) -> int:
        count = 1
        for dim in self.dims:
            assert dim.constant is not None, "shared buffers have constant sizes"
            count *= dim.constant
        return count

    @property
    def bytes(self) -> int:
        return self.stages * self.slot_elements * self.dtype.bits // 8

    def __str__(self) -> str:
        stages = f"{self.stages} x " if self.stages > 1 else ""
        return f"shared<{stages}{dims_text(self.dims)}, {self.dtype}>"


@frozen
class GridAxis:
    """One axis of the launch grid: program id ``name`` runs over ``ceil(extent/block)``."""

    name: str
    extent: Dim
    block: int = 1

    def __str__(self) -> str:
        if self.block == 1:
            return f"{self.name} < {self.extent}"
        if self.extent.constant is not None:
            return f"{self.name} < {-(-self.extent.constant // self.block)}"
        return f"{self.name} < ceil({self.extent}/{self.block})"


@frozen
class Mma:
    """How a dot runs on the target: the instruction, its shape, and the warp layout.

    ``warps`` is (rows, cols) of warps over the output tile, each warp owning
    ``warp_tile``; on CPUs the "warp" is the one thread and ``shape`` the
    register-blocked micro-kernel.
    """

    inst: str
    shape: tuple[int, int, int]
    warps: tuple[int, int]
    warp_tile: tuple[int, int]
    #: Where the product reads its operands as it runs: "shared" on GPUs (the ``read``
    #: of a staged operand happens at the product), "registers" on CPUs (at the ``read``).
    operands: str = "registers"
    #: How many of its batches an asynchronous product (``wgmma``) leaves running when
    #: the program goes on: 1 in a pipelined loop that accumulates and reads nothing
    #: else of the product, so the next iteration's copies and barrier overlap it. A
    #: ``wait_mma`` after the loop waits for the last one.
    in_flight: int = 0

    def __str__(self) -> str:
        m, n, k = self.shape
        wm, wn = self.warps
        tm, tn = self.warp_tile
        flight = f"  in flight {self.in_flight}" if self.in_flight else ""
        return (f"{self.inst} m{m}n{n}k{k}  warps {wm}x{wn} of {tm}x{tn}  operands "
                f"{self.operands}{flight}")  # fmt: skip


@frozen
class Live:
    """The corner of a product ``[M, K] x [K, N]`` that can be non-zero.

    Past a ragged edge the operands of a dot hold zero padding, so rows of ``a`` past
    ``m``, columns of ``b`` past ``n`` and the reduction past ``k`` add nothing: a
    backend may skip them (the result there is the accumulator, or zero). Each bound is
    a run-time expression, clamped to the tile; None means the whole tile. A head dim
    of 64 under a 128-wide tile does half the work this way. ``softmax_accumulate``'s
    ``m`` also stops at rows of ``p`` padded with anything: its padded rows are
    anything, so a backend may leave their state as it was.
    """

    m: Dim | None
    n: Dim | None
    k: Dim | None

    def __str__(self) -> str:
        bounds = zip("mnk", (self.m, self.n, self.k), strict=True)
        parts = [f"{name} < {d}" for name, d in bounds if d is not None]
        return ", ".join(parts) or "all"


@frozen
class SmemSlot:
    """The shared-memory plan's place for one buffer."""

    buffer: str
    offset: int
    bytes: int
    #: "row-major", "padded +N" (elements added per row), "xor" (swizzled) or "sw128"
    #: (wgmma's and TMA's 128-byte swizzle).
    layout: str


@frozen
class TileKernel:
    name: str
    function: str
    #: The launch (``k0``) this kernel implements and its Graph IR group kind.
    launch: str
    kind: str
    #: The standard-library kernel it instantiates ("tile_kernel" for a user's), or for
    #: a ``tile_call`` launch the file's tile kernel that it calls.
    template: str
    #: Every tensor and scalar the kernel reads or writes, in signature order.
    params: tuple[Value, ...]
    grid: tuple[GridAxis, ...]
    tiles: tuple[tuple[str, int], ...]
    threads: int
    warps: int
    stages: int
    vector: int
    #: The schedule's shared-memory layout choice: "xor" or "none".
    swizzle: str
    body: Block
    #: Filled by the shared-memory planning pass.
    smem: tuple[SmemSlot, ...] = ()
    #: Threads of a producer warpgroup beside ``threads``, which only issues the copies
    #: of the pipelined loop (warp specialization); 0 where every thread computes.
    producer: int = 0
    #: One program per multiprocessor looping over the output tiles (the schedule's
    #: ``persistent``); kept only where the kernel is specialized (``specialize.py``).
    persistent: bool = False
    #: The program ids and loop counters that step by one of ``tiles`` (``pid_m`` by
    #: ``T.m``, ``kb`` by ``T.k``), so that a backend can print ``BM*pid_m`` where an
    #: offset is ``128*pid_m``: which number is a tile size is known here, not from its
    #: value, which another size may share.
    strides: tuple[tuple[str, str], ...] = ()
    #: The sizes that constants of the kernel are spelled in (``Dim.spelled``), each with
    #: its value: a library kernel's sizes that its caller fixes (gemm's ``K`` of 256),
    #: and the literal steps of ``tile.range_n`` loops, which ``strides`` may step by. A
    #: backend may declare them and print a constant spelled in them as its spelling.
    sizes: tuple[tuple[str, int], ...] = ()
    span: Span | None = field(default=None, compare=False, repr=False)
    #: The name of an earlier kernel of the module whose content is this one's
    #: (``shape_key.py``): a function's launches lowered again in a function that calls
    #: it. Its code, estimates and hints are that kernel's, under its own name.
    twin: str | None = field(default=None, compare=False, repr=False)

    @property
    def made_from(self) -> str:
        """What the kernel instantiates, as comments and printers say it: a library
        kernel, the file's own tile kernel that a graph function calls, or the cache's
        append or advance, which the compiler builds itself (``tile.kvcache``)."""
        if self.kind == "tile_call":
            return f"the tile kernel {self.template}"
        if self.kind == "state":
            return f"the KV cache's {self.template.removeprefix('kvcache_')}"
        return f"the library's {self.template}"

    @property
    def smem_bytes(self) -> int:
        return max((s.offset + s.bytes for s in self.smem), default=0)

    @property
    def origin(self) -> str:
        """Where the kernel's code comes from, as the generated source's comment says."""
        if self.template == "tile_kernel":
            return f"tile kernel {self.function}"
        return f"launch {self.launch} of {self.function}: {self.made_from}"

    @property
    def uses_wgmma(self) -> bool:
        """Whether a product runs on ``wgmma``, which reads shared memory through the
        async proxy and in its own layout."""
        return bool(self.wgmma_dtypes)

    @property
    def wgmma_dtypes(self) -> frozenset[str]:
        """The operand dtypes of the products that run on ``wgmma``."""
        return frozenset(
            op.attr("mma").inst.removeprefix("wgmma.")
            for op in walk(self.body)
            if isinstance(op.attr("mma"), Mma) and op.attr("mma").inst.startswith("wgmma")
        )


@frozen
class TileProgram:
    """A graph function's host program and the tile kernels of its launches.

    Launches that run no tile program (a collective, host-side work) have no
    kernel; ``runtime`` names them with the reason and where their first op was written.
    """

    host: HostProgram
    kernels: tuple[TileKernel, ...]
    runtime: tuple[tuple[str, str, Span | None], ...] = ()


@frozen
class TileModule:
    name: str
    target: str
    arch: str
    programs: tuple[TileProgram, ...]
