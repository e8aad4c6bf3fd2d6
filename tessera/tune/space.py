"""The candidates of one launch: the function's space, or a default one per target.

A kernel with ``@kernel.autotune(space=...)`` (or a schedule with lists) is
tuned over that space; any other gemm, attention or tile kernel over the
default space of its kind below. Knobs a space leaves out keep the value the
compiler would pick. A candidate the hardware cannot run is pruned before
anything is compiled, and the reason is kept for the log; so is a tile
larger than one of its alternatives that already covers the problem, which
would only add padding.
"""

from __future__ import annotations

import itertools
from typing import Any

from ..frozen import frozen
from ..transpiler.schedule.lower import TuningPoint
from ..transpiler.schedule.resources import resources
from ..transpiler.schedule.tuned import DEFAULT_SPACES, space_of

__all__ = ["Space", "DEFAULT_SPACES", "space_for"]

#: The problem size each tile knob covers.
_COVERS = {"block_m": "m", "block_n": "n", "block_k": "k"}


@frozen
class Space:
    #: The knobs searched; the others keep the heuristic's values.
    knobs: tuple[str, ...]
    #: Values of those knobs that the machine can run, in space order.
    candidates: tuple[dict[str, Any], ...]
    #: Values left out, each with the reason.
    pruned: tuple[tuple[dict[str, Any], str], ...]


def space_for(point: TuningPoint) -> Space:
    choices = _choices(point)
    names = tuple(choices)
    candidates: list[dict[str, Any]] = []
    pruned: list[tuple[dict[str, Any], str]] = []
    for values in itertools.product(*choices.values()):
        config = dict(zip(names, values, strict=True))
        why = _unfit(point, {**point.default, **config}, choices)
        if why is None:
            candidates.append(config)
        else:
            pruned.append((config, why))
    return Space(names, tuple(candidates), tuple(pruned))


def _choices(point: TuningPoint) -> dict[str, tuple[Any, ...]]:
    return space_of(point.space, point.hw.kind, point.problem.works_like)


def _unfit(
    point: TuningPoint, knobs: dict[str, Any], choices: dict[str, tuple[Any, ...]]
) -> str | None:
    problems = resources(point.problem, knobs, point.hw).problems
    if problems:
        return problems[0]
    for knob, dim_name in _COVERS.items():
        dim = getattr(point.problem, dim_name)
        size = dim.constant if dim is not None else None
        covering = [v for v in choices.get(knob, ()) if size is not None and v >= size]
        if covering and int(knobs[knob]) > min(covering):
            return (
                f"{knob} {knobs[knob]} only pads what {knob} {min(covering)} covers "
                f"({dim_name} = {size})"
            )
    return None
