"""Schedule IR data: one host program per graph function, one launch per kernel.

A ``Launch`` says how one fused kernel of the Graph IR runs: the standard
library template it instantiates, its tile sizes, warps, pipeline stages and
vector width, the grid of programs, and the resources that implies. A
``HostProgram`` orders the launches, checks the guards, and places every
intermediate tensor in a memory slot; slots are reused when lifetimes do not
overlap.
"""

from __future__ import annotations

import re
from dataclasses import field

from ...frozen import frozen
from ..frontend.source import Span
from ..graph.dims import Dim
from ..graph.ir import RESULT, Guard, StateSlot
from ..graph.types import TensorType, ValueType

__all__ = ["GridDim", "Launch", "Buffer", "CacheSlot", "HostProgram", "ScheduleModule"]


@frozen
class GridDim:
    """One grid axis: ``extent`` split into blocks of ``block`` (1: one program each)."""

    extent: Dim
    block: int = 1

    def __str__(self) -> str:
        if self.block == 1:
            return str(self.extent)
        if self.extent.constant is not None:
            return str(-(-self.extent.constant // self.block))
        return f"ceil({self.extent}/{self.block})"


@frozen
class Launch:
    name: str
    #: The Graph IR group's kind: gemm, attention, reduction, elementwise, layout, ...
    kind: str
    group: int
    #: The standard-library kernel this launch instantiates, and the fused epilogue ops.
    template: str
    epilogue: tuple[str, ...]
    #: Tile sizes by name, e.g. (("BM", 128), ("BN", 128), ("BK", 32)).
    tiles: tuple[tuple[str, int], ...]
    warps: int
    stages: int
    vector: int
    swizzle: str
    split_k: int
    grid: tuple[GridDim, ...]
    threads: int
    smem_bytes: int
    #: The matrix instruction, or None for kernels without a dot.
    mma: str | None
    #: How the schedule was chosen: "explicit", "space" or "heuristic".
    source: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    #: The fused ops that compute the template's first operand where it is loaded.
    prologue: tuple[str, ...] = ()
    #: One program per multiprocessor, each looping over output tiles in a grouped order
    #: (a specialized GEMM on sm_90a; ``docs/cuda-backend.md``), instead of one per tile.
    persistent: bool = False

    def tile(self, name: str) -> int | None:
        return dict(self.tiles).get(name)


def param_name(printed: str) -> str:
    """The name a kernel takes a Graph IR value by: its source name (``h`` for ``%h``,
    ``h_1`` for a later definition ``%h.1``, which the printer never gives a name that
    another value has), ``t3`` for an unnamed ``%3``, and ``out_value`` for a value
    named ``out`` (or ``out0``, ...): those are the names the entry passes its results
    by (``graph.ir.result_names``), which an intermediate of that name took before."""
    name = printed.removeprefix("%").replace(".", "_")
    if name[:1].isdigit():
        return f"t{name}"
    return f"{name}_value" if re.fullmatch(rf"{RESULT}\d*", name) else name


@frozen
class Buffer:
    """An intermediate tensor that one launch writes and later ones read."""

    name: str
    type: TensorType
    bytes: Dim
    slot: int
    first: int
    last: int

    @property
    def param(self) -> str:
        """The name the launches that write and read it take it by."""
        return param_name(self.name)


@frozen
class CacheSlot:
    """A ``KVCache`` parameter, which the entry takes as its three tensors
    (``graph.kvcache.flat_names``): its name, ``S_max`` and rolling window (None
    without one), and the positions among the function's results where it is returned
    (an append writes in place, so a returned cache is always a parameter's)."""

    name: str
    s_max: Dim
    window: int | None
    returned: tuple[int, ...] = ()


@frozen
class HostProgram:
    function: str
    kind: str
    inputs: tuple[str, ...]
    #: The returned values, in order (none for a function that updates its arguments).
    results: tuple[str, ...]
    launches: tuple[Launch, ...]
    buffers: tuple[Buffer, ...] = ()
    guards: tuple[Guard, ...] = ()
    span: Span | None = field(default=None, compare=False, repr=False)
    #: The defaults of scalar inputs, by input name.
    defaults: tuple[tuple[str, bool | int | float], ...] = ()
    #: The inputs declared after a bare ``*``: a caller passes them by name.
    keyword_only: tuple[str, ...] = ()
    #: The inputs' declared types, in order, then the results': a kernel may read an input
    #: or write a result with other dims (a reshape), but the entry takes them as
    #: declared.
    types: tuple[ValueType, ...] = field(default=(), compare=False, repr=False)
    #: The buffers a backward pass reads of the forward's values, by name; None for a
    #: function without a backward pass.
    saved: tuple[str, ...] | None = None
    #: The ``OptimizerState`` parameters and results among the inputs and results
    #: (``graph.ir.StateSlot``): a runtime takes and returns a state object for them.
    states: tuple[StateSlot, ...] = ()
    #: The results that the kernels may write into the memory of an input, as (result,
    #: input) by name: a returned ``OptimizerState``'s tensors into the donated state's
    #: (``lower._Scheduler._donated``).
    donated: tuple[tuple[str, str], ...] = ()
    #: The ``KVCache`` parameters: a runtime takes a ``tessera.KVCache`` for each and
    #: returns it where the function returns it.
    caches: tuple[CacheSlot, ...] = ()


@frozen
class ScheduleModule:
    name: str
    target: str
    arch: str
    programs: tuple[HostProgram, ...]
