"""Which lines of each stage's text a line of the ``.tsr`` source became.

The printers already say where each op came from: the Graph and Tile IR end an op's
line with ``// LINE:COL``, and the generated code puts ``// FILE.tsr:LINE: text``
above the statements of each source line. A kernel instantiated from the standard
library carries the library file's lines, so its lines are the user's call: the ops
of its launch's fusion group (``matmul(...)``, ``ops.flash_attention(...)``). The
Schedule IR prints no spans; a launch's lines map to its group's ops the same way.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from ..transpiler.check.origins import launch_lines
from ..transpiler.tile.ir import TileModule

__all__ = ["LineMap", "launch_lines", "graph_map", "sched_map", "tile_map", "target_map"]

#: Source line -> the 0-based lines of a stage's text it became.
LineMap = dict[int, list[int]]

_OP_SPAN = re.compile(r"//\s*(\d+):\d+\s*$")
_KERNEL = re.compile(r"^kernel @(\w+) ")
_HOST = re.compile(r"^host @(\w+) ")
_LAUNCH = re.compile(r"^\s+launch (k\d+) ")
_MARKER = re.compile(r"^(\s*)// ([^:\s]+\.tsr):(\d+): ")
_ENTRY = re.compile(
    r'^extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(|^void (\w+)\('
)


def _add(found: LineMap, sources: Iterable[int], at: int) -> None:
    for line in sources:
        found[line].append(at)


def graph_map(text: str) -> LineMap:
    found: LineMap = defaultdict(list)
    for at, line in enumerate(text.splitlines()):
        match = _OP_SPAN.search(line)
        if match:
            found[int(match.group(1))].append(at)
    return dict(found)


def sched_map(text: str, launches: dict[str, list[int]]) -> LineMap:
    """A launch's block (its line and the indented lines under it) maps to its ops."""
    found: LineMap = defaultdict(list)
    host, current = "", None
    for at, line in enumerate(text.splitlines()):
        if match := _HOST.match(line):
            host, current = match.group(1), None
        elif match := _LAUNCH.match(line):
            current = launches.get(f"{host}/{match.group(1)}", [])
        elif not line.startswith("    "):
            current = None
        if current is not None:
            _add(found, current, at)
    return dict(found)


def tile_map(text: str, module: TileModule, launches: dict[str, list[int]]) -> LineMap:
    """A user's tile kernel maps each op by its span; a library kernel maps its header
    and every op that has a span to the ops of its launch."""
    kernels = {k.name: (p.host.function, k) for p in module.programs for k in p.kernels}
    found: LineMap = defaultdict(list)
    calls: list[int] | None = None
    for at, line in enumerate(text.splitlines()):
        if match := _KERNEL.match(line):
            function, kernel = kernels[match.group(1)]
            library = kernel.template != "tile_kernel"
            calls = launches.get(f"{function}/{kernel.launch}", []) if library else None
            if calls:
                _add(found, calls, at)
            continue
        match = _OP_SPAN.search(line)
        if match:
            _add(found, calls if calls is not None else [int(match.group(1))], at)
    return dict(found)


def target_map(
    text: str, file: str, kernels: dict[str, str], launches: dict[str, list[int]]
) -> LineMap:
    """Each ``// FILE.tsr:LINE:`` comment and the statements under it, to the next such
    comment or the end of its block; a library file's lines go to the kernel's launch.
    ``kernels`` names each generated kernel's ``function/launch``."""
    found: LineMap = defaultdict(list)
    calls: list[int] = []
    current: list[int] = []
    indent = -1
    for at, line in enumerate(text.splitlines()):
        if match := _ENTRY.match(line):
            calls = launches.get(kernels.get(match.group(1) or match.group(2), ""), [])
            current, indent = [], -1
        if match := _MARKER.match(line):
            indent = len(match.group(1))
            current = [int(match.group(3))] if match.group(2) == file else calls
        elif current and line.strip() and len(line) - len(line.lstrip()) < indent:
            current, indent = [], -1
        if current:
            _add(found, current, at)
    return dict(found)
