"""The processes of a mesh function: one MPI process per device, through mpi4py.

A compiled function with a mesh runs under ``mpirun -n N python -m mpi4py script.py``
(``N`` the mesh's device count); each process passes its shard and gets its shard
back, and the generated entry calls MPI for the collectives. Before that, every call
checks here, on every process alike, that the world has one process per device and
that all processes give the same per-device sizes: a collective of unequal shards
would read past a buffer or wait forever.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["world", "check_sizes"]


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


def check_sizes(name: str, mesh: Mapping[str, Any], sizes: Mapping[str, int]) -> None:
    """A ValueError on every process unless all give the same sizes (their shards').

    One all-reduce of each size and its negation, for the largest and the smallest; only
    where they differ (on every process alike) are the sizes gathered, for the message."""
    import numpy as np
    from mpi4py import MPI

    comm = world(name, mesh)
    names = sorted(sizes)
    values = np.array([sizes[k] for k in names], dtype=np.int64)
    extremes = np.empty(2 * len(values), dtype=np.int64)
    comm.Allreduce(np.concatenate([values, -values]), extremes, op=MPI.MAX)
    if np.array_equal(extremes[: len(values)], -extremes[len(values) :]):
        return
    every = comm.allgather(values.tolist())
    first = next(r for r, theirs in enumerate(every) if theirs != every[0])

    def shown(rank: int) -> str:
        return ", ".join(f"{k}={v}" for k, v in zip(names, every[rank], strict=True))

    raise ValueError(
        f"{name}(): the processes' shards differ: rank 0 gives {shown(0)}, rank {first} "
        f"{shown(first)}; each process passes its own block, all of one shape"
    )
