"""The Schedule IR verifier, run at the end of the schedule stage.

What every schedule must satisfy: one launch per fused kernel, in order;
launched kernels have a grid; a heuristic schedule always fits its hardware
(an explicit one that does not is the user's error, reported earlier); and
no two buffers share a slot while both are alive.
"""

from __future__ import annotations

from .hardware import Hardware
from .ir import HostProgram, ScheduleModule

__all__ = ["verify_schedule", "ScheduleVerifyError"]


class ScheduleVerifyError(AssertionError):
    pass


def verify_schedule(module: ScheduleModule, groups: dict[str, int], hw: Hardware) -> None:
    """``groups`` maps each function to its number of fused kernels."""
    for program in module.programs:
        _verify(program, groups.get(program.function, 0), hw)


def _verify(p: HostProgram, group_count: int, hw: Hardware) -> None:
    def fail(message: str) -> ScheduleVerifyError:
        return ScheduleVerifyError(f"host program '{p.function}': {message}")

    if [k.group for k in p.launches] != list(range(group_count)):
        raise fail("launches do not match the fused kernels one to one, in order")
    for k in p.launches:
        launched = k.kind not in ("host", "collective")
        if launched and not k.grid:
            raise fail(f"launch {k.name} has no grid")
        if k.source == "heuristic" and hw.kind == "gpu" and k.smem_bytes > hw.smem_bytes:
            raise fail(f"the heuristic gave launch {k.name} more shared memory than {hw.arch} has")
    for i, a in enumerate(p.buffers):
        for b in p.buffers[i + 1 :]:
            if a.slot == b.slot and not (a.last < b.first or b.last < a.first):
                raise fail(
                    f"buffers {a.name} and {b.name} share slot {a.slot} while both are alive"
                )
            if a.slot == b.slot and a.bytes != b.bytes:
                raise fail(f"slot {a.slot} holds buffers of different sizes")
