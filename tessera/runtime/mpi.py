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

import functools
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..frozen import frozen

__all__ = ["Process", "process", "world", "agree", "disagree"]


#: What MPI launchers tell each process its local rank by: Open MPI's, MPICH's (Hydra)
_LOCAL_RANK = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


@frozen
class Process:
    """This process's place in the world, as torchrun's variables name it: ``rank`` and
    ``world_size`` (MPI's), and ``local_rank``, its rank among the processes of its
    machine (the GPU a process of a CUDA mesh would take), as the MPI launcher gives it
    (None where it gives none)."""

    rank: int
    world_size: int
    local_rank: int | None


@functools.cache
def process() -> Process:
    """This process's rank, the world's size and its local rank, from MPI and its
    launcher, without communicating. Where torchrun's ``RANK``, ``WORLD_SIZE`` or
    ``LOCAL_RANK`` are set (by a launcher, or by hand), they must agree, else a
    RuntimeError says how to start the processes: torchrun starts processes that each
    see an MPI world of one."""
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    local = next((int(os.environ[v]) for v in _LOCAL_RANK if v in os.environ), None)
    here = Process(rank, size, 0 if size == 1 else local)
    for variable, value in (("WORLD_SIZE", here.world_size), ("RANK", here.rank),
                            ("LOCAL_RANK", here.local_rank)):  # fmt: skip
        given = os.environ.get(variable)
        if given is not None and value is not None and given.strip() != str(value):
            count = given if variable == "WORLD_SIZE" else "N"
            raise RuntimeError(
                f"{variable}={given}, but MPI gives this process {value}: a mesh runs on "
                "MPI's processes, which torchrun does not start; start them with mpirun -n "
                f"{count} python -m mpi4py your_script.py"
            )
    return here


def world(name: str, mesh: Mapping[str, Any]) -> Any:
    """MPI's world communicator, checked against the mesh of the function ``name``."""
    devices = math.prod(n for _, n in mesh["axes"])
    axes = ", ".join(f"{a}={n}" for a, n in mesh["axes"])
    try:
        from mpi4py import MPI
    except ImportError:
        raise RuntimeError(
            f"{name}() runs on a mesh ({axes}) and needs mpi4py: pip install mpi4py, then "
            f"mpirun -n {devices} python -m mpi4py your_script.py"
        ) from None
    size = process().world_size
    if size != devices:
        raise RuntimeError(
            f"{name}() runs on a mesh of {devices} devices ({axes}), but {size} MPI "
            f"process{'es' if size != 1 else ''} run: start it with mpirun -n {devices}"
        )
    return MPI.COMM_WORLD


@functools.cache
def _buffers(length: int) -> tuple[Any, Any]:
    """The message of ``agree`` and its reduction, made once for each length: a call
    of a mesh function should cost its collectives, not its checks."""
    import numpy as np

    return np.zeros(length, np.int64), np.zeros(length, np.int64)


def agree(
    name: str, mesh: Mapping[str, Any], names: Sequence[str], sizes: Mapping[str, int] | None,
    failure: str | None = None,
) -> None:  # fmt: skip
    """Every process's call meets here before the first collective: a ValueError on every
    process unless all of them accepted their arguments (``failure`` says why this one
    did not) and give the same ``sizes`` (their shards'), so that no process is left
    waiting in a collective that another never reaches.

    One all-reduce (max, of int64) over the world of the failure flag, each size and its
    negation (the largest and the smallest); only where something is wrong (on every
    process alike) are the details gathered, for the message (``disagree``). A warm
    module's C call of the function makes the same all-reduce in C
    (``tessera.runtime.cpu_ext``), so the two paths meet each other."""
    from mpi4py import MPI

    comm = world(name, mesh)
    values = [sizes[k] for k in names] if sizes else [0] * len(names)
    n = len(values)
    mine, extremes = _buffers(1 + 2 * n)
    mine[:] = [int(failure is not None), *values, *(-v for v in values)]
    comm.Allreduce([mine, MPI.INT64_T], [extremes, MPI.INT64_T], op=MPI.MAX)
    top = extremes.tolist()
    if not top[0] and all(top[1 + i] == -top[1 + n + i] for i in range(n)):
        return
    disagree(name, names, values, failure)


def disagree(name: str, names: Sequence[str], values: Sequence[int], failure: str | None) -> None:
    """After a meeting that found a process refusing its arguments or shards that
    differ, on every process: gather each one's ``failure`` and ``values`` (its sizes of
    ``names``) and raise the ValueError that says which process and why."""
    from mpi4py import MPI

    every = MPI.COMM_WORLD.allgather((failure, list(values)))
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
