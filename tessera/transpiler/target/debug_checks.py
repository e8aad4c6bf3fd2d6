"""The code of a debug build's bounds checks (``check/bounds.py``), for every backend.

Each check is one ``if`` before the access, on the program's offsets: the condition is
the same C expression on every target; what a failed check does is the backend's
(``fail``): record the first failure for the runtime and stop the program.
"""

from __future__ import annotations

from collections.abc import Callable

from ..check.bounds import Sites, axis_checks
from ..graph.dims import Dim
from ..graph.ir import Op
from ..tile.ir import TileKernel

__all__ = ["bounds_lines"]

#: What a failed check runs: from its number, first index, size and extent (C
#: expressions), one statement.
Fail = Callable[[int, str, str, str], str]


def bounds_lines(
    sites: Sites, kernel: TileKernel, op: Op, c: Callable[[Dim], str], fail: Fail
) -> list[str]:
    """One line per axis of ``op``'s access that can fall outside its tensor."""
    tensor = op.operands[0]
    lines = []
    for check in axis_checks(op.attr("at")):
        site = sites.add(kernel, op, tensor, check)
        first, size, extent = c(check.first), c(check.size), c(check.extent)
        past = (
            f"{c(check.first + check.size)} > {extent}" if check.whole else f"{first} >= {extent}"
        )
        lines.append(f"if ({past}) {fail(site, first, size, extent)}")
    return lines
