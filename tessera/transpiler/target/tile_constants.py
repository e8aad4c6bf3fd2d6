"""The schedule's tile sizes as named constants of a generated kernel.

A kernel's offsets step by its tile sizes (``128*pid_m``, ``32*kb``). The Tile IR
says which program ids and loop counters step by which tile (``TileKernel.strides``),
so a backend prints those terms with the tile's name, ``BM*pid_m`` and ``BK*kb``, and
declares ``constexpr int BM = 128;`` at the top of the kernel. A tile's extents are
named too where the Tile IR's types say which tile a dim is (``TileType.tiles``):
``acc[i * BN + j]``, ``for (i = 0; i < BM; ++i)``. Only those terms are named: a number
that happens to equal a tile size (a head dim of 128) stays a number.

A SIMT kernel names its count of threads the same way, ``THREADS`` (``CONSUMERS`` and
``PRODUCERS`` where a producer warpgroup issues the copies beside the threads that
compute), for the strides of the loops its threads share and the sizes of their scratch:
``j += THREADS``. The launch attributes before the body keep the number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import field
from functools import cached_property
from typing import Any

from ...frozen import frozen
from ..graph.dims import Dim
from ..tile.ir import TileKernel
from .naming import Namer

__all__ = ["TileConstants", "tile_constants"]

#: The C name of each tile size, by the name a tile kernel's context gives it.
C_NAMES = {"T.m": "BM", "T.n": "BN", "T.k": "BK", "T.d": "BD"}
_ORDER = {name: i for i, name in enumerate(C_NAMES.values())}


@frozen
class TileConstants:
    """The named tile sizes of one kernel."""

    #: Each stepping symbol (a program id or loop counter, as the Tile IR names it):
    #: the size it steps by and that size's C name.
    strides: dict[str, tuple[int, str]]
    #: Each tile of the schedule (``T.m``): its size and its C name.
    extents: dict[str, tuple[int, str]]
    #: The threads of a program that share its loops (``kernel.threads``), and those of
    #: its producer warpgroup: each count and its C name.
    threads: tuple[int, str]
    producers: tuple[int, str]
    #: Each size that the kernel's constants are spelled in (``TileKernel.sizes``): its
    #: value and C name; none where the backend prints those constants as numbers.
    spelled: dict[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(name for _, name in self._values())

    @cached_property
    def spelled_names(self) -> dict[str, str]:
        """The C name of each size that constants are spelled in, for ``c_dim`` (kept:
        a kernel prints thousands of dims)."""
        return {size: name for size, (_, name) in self.spelled.items()}

    def _values(self) -> tuple[tuple[int, str], ...]:
        return (*self.strides.values(), *self.extents.values(), self.threads, self.producers,
                *self.spelled.values())  # fmt: skip

    def shape(self, t: Any) -> tuple[Dim, ...]:
        """The dims of a tile or shared type, for printing: a dim that the type says is
        a tile of the schedule is that tile's name (a symbol, so that products print
        ``BM*BN``), any other dim its own."""
        dims: tuple[Dim, ...] = tuple(getattr(t, "dims", ()))
        tiles = getattr(t, "tiles", None) or (None,) * len(dims)
        return tuple(
            (
                Dim.sym(self.extents[tile][1])
                if tile in self.extents and d.constant == self.extents[tile][0]
                else d
            )
            for d, tile in zip(dims, tiles, strict=True)
        )

    def step(self, symbol: str) -> str | None:
        """The C name of the size ``symbol`` steps by, if it steps by a tile size."""
        stride = self.strides.get(symbol)
        return None if stride is None else stride[1]

    def count(self, t: Any, print_dim: Callable[[Dim], str], slot: bool = False) -> str:
        """How many elements a tile or buffer (every stage of it, or one where ``slot``)
        holds, as the code prints it: the number its constant dims make, then its tiles'
        names and its run-time sizes (``print_dim`` prints them), in the type's order
        (``2*BM*BK``)."""
        dims = self.shape(t)
        printed = [print_dim(d) for d in dims]
        number = math.prod((d.constant for d, p in zip(dims, printed, strict=True)
                            if d.constant is not None and p.isdigit()), start=1)  # fmt: skip
        number *= 1 if slot else getattr(t, "stages", 1)
        factors = [p for d, p in zip(dims, printed, strict=True)
                   if d.constant is None or not p.isdigit()]  # fmt: skip
        return "*".join(([str(number)] if number != 1 or not factors else []) + factors)

    def declarations(
        self, used: frozenset[str], form: str, written: dict[str, str] | None = None
    ) -> list[str]:
        """The declarations, in ``form`` (``constexpr int {name} = {value};``), of the
        constants among the words ``used`` (``cexpr.words`` of the code), rows before
        columns before depth; ``written`` gives the expression a value is declared as,
        by name, where it is not the number (``THREADS = 4*TSR_WARP_SIZE``)."""
        values: dict[str, int | str] = {name: value for value, name in self._values()}
        values.update(written or {})
        return [
            form.format(name=name, value=values[name])
            for name in sorted(values, key=lambda n: (_ORDER.get(n[:2], len(_ORDER)), n))
            if name in used
        ]


def tile_constants(
    kernel: TileKernel, taken: frozenset[str], spelled: bool = False
) -> TileConstants:
    """The constants of ``kernel``, each named after its tile (``BM``) unless a name in
    ``taken`` (a size, a program id, a name the generated code declares) has it. With
    ``spelled``, the sizes its constants are spelled in are constants too: a library
    kernel's ``K``, and a loop's literal step, named as a tile's after its counter
    (``BK`` for ``kb``); without, a loop steps by a number."""
    sizes = dict(kernel.tiles)
    fixed = dict(kernel.sizes) if spelled else {}
    # a literal step's size is the loop's (``kb.block``), named after its counter
    steps = {tile: symbol for symbol, tile in kernel.strides
             if tile in fixed and not tile.isidentifier()}  # fmt: skip
    namer = Namer(taken)
    names: dict[str, str] = {}
    for tile in (*(tile for _, tile in kernel.strides), *sizes, *fixed):
        if tile in names or (tile not in sizes and tile not in fixed):
            continue
        if tile in steps:
            names[tile] = namer.fresh(f"B{steps[tile][0].upper()}")
        else:
            names[tile] = namer.fresh(C_NAMES.get(tile, tile.replace("T.", "B").upper()))
    known = {**sizes, **fixed}
    strides = {symbol: (known[tile], names[tile]) for symbol, tile in kernel.strides
               if tile in known}  # fmt: skip
    extents = {tile: (sizes[tile], names[tile]) for tile in sizes}
    threads = namer.fresh("CONSUMERS" if kernel.producer else "THREADS")
    producers = namer.fresh("PRODUCERS")
    named = {size: (value, names[size]) for size, value in fixed.items()}
    return TileConstants(strides, extents, (kernel.threads, threads), (kernel.producer, producers),
                         named)  # fmt: skip
