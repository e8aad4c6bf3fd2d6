"""The schedule's tile sizes as named constants of a generated kernel.

A kernel's offsets step by its tile sizes (``128*pid_m``, ``32*kb``). The Tile IR
says which program ids and loop counters step by which tile (``TileKernel.strides``),
so a backend prints those terms with the tile's name, ``BM*pid_m`` and ``BK*kb``, and
declares ``constexpr int BM = 128;`` at the top of the kernel. Only those terms are
named: a number that happens to equal a tile size (a head dim of 128, a count of
threads) stays a number.
"""

from __future__ import annotations

import re

from ...frozen import frozen
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

    @property
    def names(self) -> frozenset[str]:
        return frozenset(name for _, name in self.strides.values())

    def step(self, symbol: str) -> str | None:
        """The C name of the size ``symbol`` steps by, if it steps by a tile size."""
        stride = self.strides.get(symbol)
        return None if stride is None else stride[1]

    def declarations(self, code: str, form: str) -> list[str]:
        """The declarations, in ``form`` (``constexpr int {name} = {value};``), of the
        constants that ``code`` uses, rows before columns before depth."""
        values = {name: value for value, name in self.strides.values()}
        return [
            form.format(name=name, value=values[name])
            for name in sorted(values, key=lambda n: (_ORDER.get(n[:2], len(_ORDER)), n))
            if re.search(rf"\b{name}\b", code)
        ]


def tile_constants(kernel: TileKernel, taken: frozenset[str]) -> TileConstants:
    """The constants of ``kernel``, each named after its tile (``BM``) unless a name in
    ``taken`` (a size, a program id, a name the generated code declares) has it."""
    sizes = dict(kernel.tiles)
    namer = Namer(taken)
    names: dict[str, str] = {}
    strides = {}
    for symbol, tile in kernel.strides:
        if tile not in names:
            names[tile] = namer.fresh(C_NAMES.get(tile, tile.replace("T.", "B").upper()))
        strides[symbol] = (sizes[tile], names[tile])
    return TileConstants(strides)
