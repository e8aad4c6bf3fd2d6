"""Benchmark: a compiled all-reduce on MPI against the same call made from mpi4py.

Run it as ``python bench/dist.py``: it starts itself under ``mpirun -n 2`` (two local
processes, the mesh ``{"dp": 2}``). For each size from 1 to 256 MB of f32 it times
``lib.all_reduce_sum(x, out=result)`` (a Tessera function that is one ``all_reduce``,
called once its module is warm: the module's C call checks the arguments, meets the
other process in one small all-reduce over the sizes, then runs the entry's
``MPI_Allreduce``) and, in the same run, its parts and its peers:

- ``full checks``: the same call with its input by name, which takes the runtime's
  checks in Python and the meeting from mpi4py (``tessera.runtime.mpi.agree``), as
  every call did before the C calls took mesh functions;
- ``entry alone``: the generated entry through ctypes, its addresses prepared: the
  ``MPI_Allreduce`` without any check or meeting;
- ``mpi4py``: ``COMM_WORLD.Allreduce`` of the same array into a preallocated one;
- ``mpi4py with meeting``: mpi4py making the two calls a Tessera call makes (the
  small all-reduce of the meeting, then the all-reduce).

Each is the median of ``--runs`` calls after two warm-ups (16 and 4 times as many at 1
and 4 MB: a call costs little there, and the machine's noise is large against it), the
five taking turns (each round starting one call later), with a barrier before each; a
time is the slower process's; the quartiles of Tessera's and mpi4py's calls show how
noisy the machine was. The figures are each peer's time over Tessera's (1.0: as fast;
the goal is at least 0.95 against mpi4py's single call). The tensor-parallel MLP of
``tests/mpi/meshes.py``'s kind, at ``[256, 1024] @ [1024, 4096] @ [4096, 1024]``, is
timed against one process doing all the work. The machine's load average before and
after the run is recorded with the results, in ``bench/results/dist.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SIZES_MB = (1, 4, 16, 64, 256)

SOURCE = """
@kernel
def all_reduce_sum(x: Tensor["N", f32]) -> Tensor["N", f32]:
    with mesh(axes={"dp": 2}):
        y = all_reduce(x, axis="dp")
    return y

@kernel
def mlp_tp(x: Tensor["B", "D", f32], w1: Tensor["D", "F", f32] @shard(None, "tp"),
           w2: Tensor["F", "D", f32] @shard("tp", None)) -> Tensor["B", "D", f32]:
    with mesh(axes={"tp": 2}):
        y = gelu(x @ w1) @ w2
    return y
"""

ONE = """
@kernel
def mlp(x: Tensor["B", "D", f32], w1: Tensor["D", "F", f32],
        w2: Tensor["F", "D", f32]) -> Tensor["B", "D", f32]:
    return gelu(x @ w1) @ w2
"""


def timed(calls: list, comm, runs: int) -> list[list[float]]:
    """The seconds of each of ``calls`` in ``runs`` rounds after two, sorted, the calls
    taking turns within a round, each round starting one call later (so that a busy
    moment of the machine, going first, or following a given call falls on all alike;
    a call made twice in a row finds its arrays in the cache, worth a fifth at 1 MB),
    every rank in step: each time is the slowest rank's."""
    from mpi4py import MPI

    times: list[list[float]] = [[] for _ in calls]
    turns = list(zip(calls, times, strict=True))
    for i in range(runs + 2):
        first = i % len(turns)
        for call, kept in turns[first:] + turns[:first]:
            comm.Barrier()
            start = time.perf_counter()
            call()
            elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            if i >= 2:
                kept.append(elapsed)
    return [sorted(kept) for kept in times]


def quartiles(sorted_times: list[float]) -> list[float]:
    """The first and third quartiles of sorted times, rounded to the microsecond."""
    first, _, third = statistics.quantiles(sorted_times, n=4)
    return [round(first, 6), round(third, 6)]


def meeting_then_all_reduce(comm: Any, x: Any, out: Any) -> None:
    """What a Tessera call sends, made from mpi4py: the small all-reduce in which the
    processes agree on their shards' sizes (``tessera.runtime.mpi.agree``: a flag and
    each size and its negation), then the all-reduce itself."""
    import numpy as np
    from mpi4py import MPI

    sizes = np.array([0, x.size, -x.size], np.int64)
    comm.Allreduce(sizes, np.empty_like(sizes), op=MPI.MAX)
    comm.Allreduce(x, out)


def rank_main(runs: int, out: Path) -> None:
    import numpy as np
    from mpi4py import MPI

    import tessera
    from tessera.runtime.cpu import WARM_CALLS

    load_before = os.getloadavg()[0]
    comm = MPI.COMM_WORLD
    program = tessera.compile(SOURCE, "dist.tsr", target="cpu")
    if comm.Get_rank() == 0:
        program.load()
    comm.Barrier()
    lib = program.load()
    small = np.ones(16, np.float32)
    for _ in range(WARM_CALLS):  # the module's C calls are built at the last of these
        lib.all_reduce_sum(x=small)
    f = lib.all_reduce_sum
    rng = np.random.default_rng(comm.Get_rank())
    rows = {}
    for mb in SIZES_MB:
        x = rng.standard_normal(mb * 2**20 // 4).astype(np.float32)
        result, full, alone, peer = (np.empty_like(x) for _ in range(4))
        spread = timed(
            [
                functools.partial(f, x, out=result),
                functools.partial(f, x=x, out=full),
                functools.partial(f._entry, x.ctypes.data, alone.ctypes.data, x.size),
                functools.partial(comm.Allreduce, x, peer),
                functools.partial(meeting_then_all_reduce, comm, x, peer),
            ],
            comm,
            runs * max(1, 16 // mb),
        )
        ours, checked, entry, theirs, met = (statistics.median(t) for t in spread)
        assert f._fast(x, out=result) is result  # the timed call took the C call
        for got in (result, full, alone):
            assert np.array_equal(got, peer)
        rows[f"all_reduce {mb} MB"] = {
            "tessera_s": round(ours, 6), "full_checks_s": round(checked, 6),
            "entry_alone_s": round(entry, 6), "mpi4py_s": round(theirs, 6),
            "mpi4py_with_meeting_s": round(met, 6),
            "ratio_mpi4py_over_tessera": round(theirs / ours, 3),
            "ratio_mpi4py_with_meeting_over_tessera": round(met / ours, 3),
            "ratio_mpi4py_over_full_checks": round(theirs / checked, 3),
            "ratio_entry_alone_over_tessera": round(entry / ours, 3),
            # how noisy the machine was: the middle half of the calls, in seconds
            "tessera_quartiles_s": quartiles(spread[0]),
            "mpi4py_quartiles_s": quartiles(spread[3]),
        }  # fmt: skip
    B, D, F = 256, 1024, 4096
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((B, D), (D, F), (F, D)))
    x, w1, w2 = (comm.bcast(a) for a in (x, w1, w2))
    half = F // 2
    r = comm.Get_rank()
    w1s = np.ascontiguousarray(w1[:, r * half : (r + 1) * half])
    w2s = np.ascontiguousarray(w2[r * half : (r + 1) * half])
    tp = statistics.median(timed([lambda: lib.mlp_tp(x, w1s, w2s)], comm, runs)[0])
    if r == 0:
        one = tessera.compile(ONE, "one.tsr", target="cpu").load()
        solo = [0.0]
        for i in range(runs + 2):
            start = time.perf_counter()
            one.mlp(x, w1, w2)
            if i >= 2:
                solo.append(time.perf_counter() - start)
        alone = statistics.median(solo[1:])
        rows["tensor-parallel MLP [256,1024]x[1024,4096]x[4096,1024]"] = {
            "two_processes_s": round(tp, 5), "one_process_s": round(alone, 5),
            "speedup": round(alone / tp, 3),
        }  # fmt: skip
        from cpu import machine  # bench/cpu.py, after the timings: it imports torch

        report = {
            "machine": machine(load_before),
            "runs": runs,
            "runs_at_1_and_4_mb": [runs * 16, runs * 4],
            "processes": 2,
            "results": rows,
        }
        out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(report, indent=2))


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--runs", type=int, default=15)
    cli.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "dist.json")
    cli.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = cli.parse_args()
    if args.rank:
        rank_main(args.runs, args.out)
        return
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("bench/dist.py needs mpirun (Debian: apt-get install openmpi-bin)")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [mpirun, "-n", "2", "--oversubscribe", sys.executable, "-m", "mpi4py", __file__,
               "--rank", "--runs", str(args.runs), "--out", str(args.out)]  # fmt: skip
    subprocess.run(command, check=True, env=env)


if __name__ == "__main__":
    main()
