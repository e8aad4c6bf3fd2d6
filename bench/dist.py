"""Benchmark: a compiled all-reduce on MPI against the same call made from mpi4py.

Run it as ``python bench/dist.py``: it starts itself under ``mpirun -n 2`` (two local
processes, the mesh ``{"dp": 2}``). For each size from 1 to 256 MB of f32 it times
``lib.all_reduce(x)`` (a Tessera function that is one ``all_reduce``: the argument
checks, the size check across processes, and the entry's ``MPI_Allreduce``) and, in
the same run, mpi4py's ``COMM_WORLD.Allreduce`` of the same array into a preallocated
one, and mpi4py making the same two calls as a Tessera call (the processes' meeting, a
small all-reduce, then the all-reduce): the median of ``--runs`` calls after two
warm-ups, with a barrier before each. The figures are each peer's time over Tessera's
(1.0: as fast; the goal is at least 0.95 against the single call). The
tensor-parallel MLP of ``tests/mpi/meshes.py``'s kind, at ``[256, 1024] @ [1024, 4096]
@ [4096, 1024]``, is timed against one process doing all the work. Results go to
``bench/results/dist.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
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


def timed(calls: list, comm, runs: int) -> list[float]:
    """The median seconds of each of ``calls`` over ``runs`` rounds after two, the calls
    taking turns within a round, first one and then the other first (so that a busy
    moment of the machine, or going first, falls on both), every rank in step: each
    time is the slowest rank's."""
    from mpi4py import MPI

    times: list[list[float]] = [[] for _ in calls]
    for i in range(runs + 2):
        turns = list(zip(calls, times, strict=True))
        for call, kept in turns if i % 2 else reversed(turns):
            comm.Barrier()
            start = time.perf_counter()
            call()
            elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            if i >= 2:
                kept.append(elapsed)
    return [statistics.median(kept) for kept in times]


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

    comm = MPI.COMM_WORLD
    program = tessera.compile(SOURCE, "dist.tsr", target="cpu")
    if comm.Get_rank() == 0:
        program.load()
    comm.Barrier()
    lib = program.load()
    rng = np.random.default_rng(comm.Get_rank())
    rows = {}
    for mb in SIZES_MB:
        x = rng.standard_normal(mb * 2**20 // 4).astype(np.float32)
        result, peer = np.empty_like(x), np.empty_like(x)
        ours, theirs, met = timed(
            [
                functools.partial(lib.all_reduce_sum, x, out=result),
                functools.partial(comm.Allreduce, x, peer),
                functools.partial(meeting_then_all_reduce, comm, x, peer),
            ],
            comm,
            runs,
        )
        assert np.array_equal(result, peer)
        rows[f"all_reduce {mb} MB"] = {
            "tessera_s": round(ours, 5), "mpi4py_s": round(theirs, 5),
            "mpi4py_with_meeting_s": round(met, 5),
            "ratio_mpi4py_over_tessera": round(theirs / ours, 3),
            "ratio_mpi4py_with_meeting_over_tessera": round(met / ours, 3),
        }  # fmt: skip
    B, D, F = 256, 1024, 4096
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((B, D), (D, F), (F, D)))
    x, w1, w2 = (comm.bcast(a) for a in (x, w1, w2))
    half = F // 2
    r = comm.Get_rank()
    w1s = np.ascontiguousarray(w1[:, r * half : (r + 1) * half])
    w2s = np.ascontiguousarray(w2[r * half : (r + 1) * half])
    (tp,) = timed([lambda: lib.mlp_tp(x, w1s, w2s)], comm, runs)
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
        report = {
            "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "runs": runs,
            "processes": 2,
            "results": rows,
        }
        out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(report, indent=2))


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--runs", type=int, default=10)
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
