"""The lowering inspector: one self-contained HTML page over a program's stages.

``tesserac inspect FILE.tsr --target cuda -o report.html`` writes a page that shows
the source beside every stage (graph, sched, tile, target), each as its printer
writes it; a click on a source line highlights what the line became in each stage
(``lines.py``). Below, each kernel's schedule, resources, register estimate, its
place on the arch's roofline and the findings of ``tesserac check``. The page is one
file with its styles, script and data inside: it loads nothing and needs no server.
All text reaches the page as JSON data that the script puts into text nodes, so no
source text becomes markup.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from .. import __version__
from ..transpiler.check.checks import check_module
from ..transpiler.pipeline import Program
from .lines import graph_map, launch_lines, sched_map, target_map, tile_map

__all__ = ["inspector_page", "page_data"]

STAGES = ("graph", "sched", "tile", "target")


def page_data(program: Program) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data."""
    file = program.input.name
    graph, sched, tile = program.ir("graph"), program.ir("sched"), program.ir("tile")
    meta = program.ir("meta")
    texts = {stage: str(program.inspect_ir(stage)) for stage in STAGES}
    launches = launch_lines(graph, sched, file)
    entries = {k.name: f"{p.host.function}/{k.launch}" for p in tile.programs for k in p.kernels}
    maps = {
        "graph": graph_map(texts["graph"]),
        "sched": sched_map(texts["sched"], launches),
        "tile": tile_map(texts["tile"], tile, launches),
        "target": target_map(texts["target"], file.rsplit("/", 1)[-1], entries, launches),
    }
    findings = check_module(tile)
    analysis = {entry["kernel"]: entry for entry in meta.get("analysis", [])}
    kernels = []
    for host in tile.programs:
        for kernel in host.kernels:
            entry = analysis.get(kernel.name, {})
            kernels.append({
                "name": kernel.name,
                "function": host.host.function,
                "lines": launches.get(f"{host.host.function}/{kernel.launch}", []),
                "template": kernel.template,
                "schedule": {
                    "tiles": dict(kernel.tiles), "warps": kernel.warps, "stages": kernel.stages,
                    "vector": kernel.vector, "swizzle": kernel.swizzle,
                    "grid": [str(axis) for axis in kernel.grid],
                },
                "resources": {
                    "threads": kernel.threads + kernel.producer,
                    "shared_bytes": kernel.smem_bytes,
                    "registers_estimate": entry.get("registers_estimate"),
                    "smem": [[s.buffer, s.bytes, s.layout] for s in kernel.smem],
                },
                "roofline": entry.get("roofline"),
                "findings": [
                    {**f.as_json(), "text": f.diagnostic().render()}
                    for f in findings if f.kernel == kernel.name
                ],
            })  # fmt: skip
    return {
        "title": f"{file}: {tile.target} {tile.arch}",
        "version": __version__,
        "source": program.input.text.splitlines(),
        "stages": [{"name": s, "lines": texts[s].splitlines(), "map": maps[s]} for s in STAGES],
        "kernels": kernels,
    }


def inspector_page(program: Program) -> str:
    """The page for a compiled program."""
    template = resources.files("tessera").joinpath("templates/inspector/page.html").read_text()
    data = json.dumps(page_data(program), sort_keys=True)
    # No "<" at all inside the <script> element: neither "</script>" nor "<!--" can end or
    # change it. "<" appears only inside JSON strings, where \u003c is the same text.
    data = data.replace("<", "\\u003c")
    return template.replace("/*DATA*/{}", data)
