"""The processes of a mesh function: one MPI process per device, through mpi4py.

A compiled function with a mesh runs under ``mpirun -n N python -m mpi4py script.py``
(``N`` the mesh's device count); each process passes its shard and gets its shard
back, and the generated entry calls MPI for the collectives. Before that, every call
checks here, on every process alike, that the world has one process per device, that
every process accepted its arguments and that all give the same per-device sizes: a
collective of unequal shards would read past a buffer, and one that some process never
reaches would wait forever.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["world", "agree"]


def world(name: str, mesh: Mapping[str, Any]) -> Any:
    """MPI's world communicator, checked against the mesh of the function ``name``."""
    axes = ", ".join(f"{a}={n}" for a, n in mesh["axes"])
    devices = math.prod(n for _, n in mesh["axes"])
    try:
        from mpi4py import MPI
    except ImportError:
        raise RuntimeError(
            f"{name}() runs on a mesh ({axes}) and needs mpi4py: pip install mpi4py, then "
            f"mpirun -n {devices} python -m mpi4py your_script.py"
        ) from None
    size = MPI.COMM_WORLD.Get_size()
    if size != devices:
        raise RuntimeError(
            f"{name}() runs on a mesh of {devices} devices ({axes}), but {size} MPI "
            f"process{'es' if size != 1 else ''} run: start it with mpirun -n {devices}"
        )
    return MPI.COMM_WORLD


def agree(
    name: str, mesh: Mapping[str, Any], names: Sequence[str], sizes: Mapping[str, int] | None,
    failure: str | None = None,
) -> None:  # fmt: skip
    """Every process's call meets here before the first collective: a ValueError on every
    process unless all of them accepted their arguments (``failure`` says why this one
    did not) and give the same ``sizes`` (their shards'), so that no process is left
    waiting in a collective that another never reaches.

    One all-reduce of the failure flag, each size and its negation (the largest and the
    smallest); only where something is wrong (on every process alike) are the details
    gathered, for the message."""
    import numpy as np
    from mpi4py import MPI

    comm = world(name, mesh)
    values = np.array([sizes[k] for k in names] if sizes else [0] * len(names), np.int64)
    mine = np.concatenate([[int(failure is not None)], values, -values])
    extremes = np.empty_like(mine)
    comm.Allreduce(mine, extremes, op=MPI.MAX)
    n = len(values)
    if not extremes[0] and np.array_equal(extremes[1 : n + 1], -extremes[n + 1 :]):
        return
    every = comm.allgather((failure, values.tolist()))
    failed = [(rank, why) for rank, (why, _) in enumerate(every) if why is not None]
    if failed:
        rank, why = failed[0]
        raise ValueError(f"{name}(): process {rank} refused its arguments: {why}")
    first = next(r for r, (_, theirs) in enumerate(every) if theirs != every[0][1])

    def shown(rank: int) -> str:
        return ", ".join(f"{k}={v}" for k, v in zip(names, every[rank][1], strict=True))

    raise ValueError(
        f"{name}(): the processes' shards differ: process 0 gives {shown(0)}, process "
        f"{first} {shown(first)}; each process passes its own block, all of one shape"
    )
