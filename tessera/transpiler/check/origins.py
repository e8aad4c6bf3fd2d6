"""Where each launch comes from in the user's source: the lines of its fused ops.

A kernel that the standard library instantiates carries the library file's spans; what
the user wrote is the call (``matmul(...)``, ``ops.flash_attention(...)``): the ops of
the launch's fusion group in the Graph IR. The inspector highlights by these lines, and
a debug build's sentinel names the first.
"""

from __future__ import annotations

from ..graph.ir import GraphModule
from ..schedule.ir import ScheduleModule

__all__ = ["launch_lines"]


def launch_lines(graph: GraphModule, sched: ScheduleModule, file: str) -> dict[str, list[int]]:
    """Per ``function/launch``: the user's lines of the ops fused into it."""
    functions = {f.name: f for f in graph.functions}
    found: dict[str, list[int]] = {}
    for host in sched.programs:
        function = functions.get(host.function)
        for launch in host.launches:
            lines: set[int] = set()
            if function is not None and launch.group < len(function.groups):
                for index in function.groups[launch.group].ops:
                    span = function.body.ops[index].span
                    if span is not None and span.file == file:
                        lines.add(span.line)
            if not lines and host.span is not None and host.span.file == file:
                lines.add(host.span.line)
            found[f"{host.function}/{launch.name}"] = sorted(lines)
    return found
