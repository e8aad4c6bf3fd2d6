"""Benchmark: the CPU backend against numpy (OpenBLAS) and PyTorch, in one process.

Kernels: SGEMM at 512, 1024, 1500 (a ragged size: its last tiles are short), 2048 (4096
with --full) against ``numpy.matmul`` and ``torch.matmul``; softmax, log_softmax,
layernorm and rmsnorm over 4096 x 4096 f32 against torch and against this machine's copy
bandwidth (numpy ``copyto`` of the same bytes); reductions that are not over rows (the
column sums of 4096 x 4096, a sum over axes 0 and 2 of 64 x 256 x 1024) against numpy
and torch; attention f32 B1 H8 S1024 and S2048 D64, causal and not, against torch
``scaled_dot_product_attention``; model code written out, against the same expressions
in torch: elementwise ops that read a value more than once, fused into one kernel (a
GELU over 4096 x 4096, ``y * sigmoid(y)`` after an SGEMM 2048), and Llama's RMSNorm
(which is the library's rmsnorm); and what a call costs beyond its kernel, 1000 calls of
a 4 x 4 SGEMM against numpy's and torch's. Each case is timed interleaved with its
peers, median of several runs after warm-up. Results go to ``bench/results/cpu.json``; a
peer that is not installed is recorded as null.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

import tessera
from tessera.files import write_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "cpu.json"

try:  # the peer for norms and attention; optional
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

SOURCE = """\
@kernel
def sgemm(A: Tensor["M", "K", f32], B: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return A @ B

@kernel
def swish_sgemm(A: Tensor["M", "K", f32], B: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    y = A @ B
    return y * sigmoid(y)

@kernel
def gelu_written_out(x: Tensor["R", "C", f32], b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    y = x + b
    return 0.5 * y * (1.0 + tanh(0.7978845608 * (y + 0.044715 * y * y * y)))

@kernel
def rmsnorm_written_out(x: Tensor["R", "C", f32], w: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return w * (x * rsqrt(mean(x ** 2, axis=-1, keepdims=True) + 1e-6))

@kernel
def softmax_rows(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return softmax_safe(x, axis=-1)

@kernel
def log_softmax_rows(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return log_softmax(x, axis=-1)

@kernel
def layernorm_rows(x: Tensor["R", "C", f32], w: Tensor["C", f32],
                   b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return layernorm(x, w, b, eps=1e-5)

@kernel
def rmsnorm_rows(x: Tensor["R", "C", f32], w: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return rmsnorm(x, w, eps=1e-6)

@kernel
def column_sums(x: Tensor["R", "C", f32]) -> Tensor["C", f32]:
    return sum(x, axis=0)

@kernel
def sum_outer_axes(x: Tensor["A", "B", "C", f32]) -> Tensor["B", f32]:
    return sum(x, axis=(0, 2))

@kernel
def attention(q: Tensor["B", "H", "S", "D", f32], k: Tensor["B", "H", "S", "D", f32],
              v: Tensor["B", "H", "S", "D", f32]) -> Tensor["B", "H", "S", "D", f32]:
    return ops.flash_attention(q, k, v, causal=False)

@kernel
def causal_attention(q: Tensor["B", "H", "S", "D", f32], k: Tensor["B", "H", "S", "D", f32],
                     v: Tensor["B", "H", "S", "D", f32]) -> Tensor["B", "H", "S", "D", f32]:
    return ops.flash_attention(q, k, v, causal=True)
"""


def timed(functions: dict[str, Callable[[], object] | None], runs: int) -> dict:
    """Median seconds of each function, runs interleaved, after one warm-up each. A
    pause before each run keeps one library's spinning worker threads (OpenBLAS, torch,
    OpenMP) from taking the cores of the next: each run starts on idle cores. Then an
    untimed call wakes the function's own threads, so that the timed call runs as calls
    do back to back, not as the first call after an idle spell (which can wait
    milliseconds for a sleeping thread on a small VM: docs/cpu-backend.md, Threads)."""
    live = {name: fn for name, fn in functions.items() if fn is not None}
    for fn in live.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in live}
    for _ in range(runs):
        for name, fn in live.items():
            time.sleep(0.2)  # OpenBLAS's threads spin for about 0.1 s after a call
            fn()
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(samples[name]) if name in samples else None
            for name in functions}  # fmt: skip


CALLS = 1000


def _repeat(fn: Callable[..., object], *args: object) -> None:
    """``CALLS`` calls of ``fn``: one timed run of the call-overhead case."""
    for _ in range(CALLS):
        fn(*args)


def _gelu_written_out(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = x + b
    return 0.5 * y * (1.0 + torch.tanh(0.7978845608 * (y + 0.044715 * y * y * y)))


def _rmsnorm_written_out(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def _swish_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = a @ b
    return y * torch.sigmoid(y)


def machine(load_before: float | None = None) -> dict[str, object]:
    """The machine, its Python, numpy and torch, and with ``load_before`` (the 1-minute
    load average before the runs) how busy it was then and after: other work on a
    shared machine stretches every timing."""
    described: dict[str, object] = {
        "processor": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "python": platform.python_version(), "numpy": np.__version__,
        "torch": torch.__version__ if torch else None}  # fmt: skip
    if load_before is not None:
        described["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return described


def ratio(peer: float | None, ours: float) -> float | None:
    """How many times faster than the peer we are (above 1: faster)."""
    return None if peer is None else round(peer / ours, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--full", action="store_true", help="include SGEMM 4096")
    args = parser.parse_args()
    lib = tessera.compile(SOURCE, "bench.tsr", target="cpu").load()
    rng = np.random.default_rng(0)
    rows = []

    for n in (512, 1024, 1500, 2048, *((4096,) if args.full else ())):
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        ta, tb = (torch.from_numpy(a), torch.from_numpy(b)) if torch else (None, None)
        peers = {"tessera": partial(lib.sgemm, a, b), "numpy": partial(np.matmul, a, b),
                 "torch": partial(torch.matmul, ta, tb) if torch else None}  # fmt: skip
        t = timed(peers, args.runs)
        flops = 2 * n**3
        rows.append({"case": f"sgemm {n}", "seconds": t,
                     "gflops": {k: v and round(flops / v / 1e9, 1) for k, v in t.items()},
                     "vs_numpy": ratio(t["numpy"], t["tessera"]),
                     "vs_torch": ratio(t["torch"], t["tessera"])})  # fmt: skip

    # What a call costs beyond its kernel: argument checks, ctypes, the thread team.
    tiny = rng.standard_normal((4, 4), dtype=np.float32)
    t_tiny = torch.from_numpy(tiny) if torch else None
    t = timed({"tessera": partial(_repeat, lib.sgemm, tiny, tiny),
               "numpy": partial(_repeat, np.matmul, tiny, tiny),
               "torch": partial(_repeat, torch.matmul, t_tiny, t_tiny) if torch else None},
              args.runs)  # fmt: skip
    rows.append({"case": f"call overhead: sgemm 4x4, {CALLS} calls back to back",
                 "seconds": t,
                 "us_per_call": {k: v and round(v / CALLS * 1e6, 1) for k, v in t.items()},
                 "vs_numpy": ratio(t["numpy"], t["tessera"]),
                 "vs_torch": ratio(t["torch"], t["tessera"])})  # fmt: skip

    x = rng.standard_normal((4096, 4096), dtype=np.float32)
    w = rng.standard_normal(4096, dtype=np.float32)
    bias = rng.standard_normal(4096, dtype=np.float32)
    copy_dst = np.empty_like(x)
    tx = torch.from_numpy(x) if torch else None
    tw, tb = (torch.from_numpy(w), torch.from_numpy(bias)) if torch else (None, None)
    out = np.empty_like(x)
    # Each case runs twice: allocating its result, as torch does (against torch), and
    # into a preallocated array, as the copy does (against the copy's bandwidth): a
    # fresh 64 MiB array costs about as much in page faults as the copy itself.
    norms = {
        "softmax 4096x4096": (partial(lib.softmax_rows, x),
                              (lambda: torch.softmax(tx, -1)) if torch else None),
        "log_softmax 4096x4096": (partial(lib.log_softmax_rows, x),
                                  (lambda: torch.log_softmax(tx, -1)) if torch else None),
        "layernorm 4096x4096": (partial(lib.layernorm_rows, x, w, bias),
                                (lambda: torch.nn.functional.layer_norm(tx, (4096,), tw, tb))
                                if torch else None),
        "rmsnorm 4096x4096": (partial(lib.rmsnorm_rows, x, w),
                              (lambda: torch.nn.functional.rms_norm(tx, (4096,), tw, 1e-6))
                              if torch else None),
    }  # fmt: skip
    for name, (ours, peer) in norms.items():
        t = timed({"tessera": ours, "tessera_into": partial(ours, out=out), "torch": peer,
                   "copy": lambda: np.copyto(copy_dst, x)}, args.runs)  # fmt: skip
        moved = 2 * x.nbytes  # read once, write once
        rows.append({"case": name, "seconds": t,
                     "gb_per_s": {k: v and round(moved / v / 1e9, 1) for k, v in t.items()},
                     "of_copy_bandwidth": round(t["copy"] / t["tessera_into"], 3),
                     "vs_torch": ratio(t["torch"], t["tessera"])})  # fmt: skip

    # Reductions that are not over rows: over the columns (through a transpose), and
    # over two axes apart (one run of adjacent axes at a time).
    y = rng.standard_normal((64, 256, 1024), dtype=np.float32)
    ty = torch.from_numpy(y) if torch else None
    reductions = {
        "column sums 4096x4096": (partial(lib.column_sums, x), partial(np.sum, x, axis=0),
                                  (lambda: tx.sum(0)) if torch else None),
        "sum over axes (0, 2) of 64x256x1024": (partial(lib.sum_outer_axes, y),
                                                partial(np.sum, y, axis=(0, 2)),
                                                (lambda: ty.sum((0, 2))) if torch else None),
    }  # fmt: skip
    for name, (ours, numpy_peer, torch_peer) in reductions.items():
        t = timed({"tessera": ours, "numpy": numpy_peer, "torch": torch_peer}, args.runs)
        rows.append({"case": name, "seconds": t, "vs_numpy": ratio(t["numpy"], t["tessera"]),
                     "vs_torch": ratio(t["torch"], t["tessera"])})  # fmt: skip

    # A value read more than once stays in its kernel's registers; torch runs each op.
    n = 2048
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    fused = {
        "gelu written out 4096x4096": (partial(lib.gelu_written_out, x, bias),
                                       partial(_gelu_written_out, tx, tb) if torch else None),
        "rmsnorm written out 4096x4096": (partial(lib.rmsnorm_written_out, x, w),
                                          partial(_rmsnorm_written_out, tx, tw)
                                          if torch else None),
        f"sgemm {n} + y * sigmoid(y)": (partial(lib.swish_sgemm, a, b),
                                        partial(_swish_matmul, torch.from_numpy(a),
                                                torch.from_numpy(b)) if torch else None),
    }  # fmt: skip
    for name, (ours, peer) in fused.items():
        t = timed({"tessera": ours, "torch": peer}, args.runs)
        rows.append({"case": name, "seconds": t, "vs_torch": ratio(t["torch"], t["tessera"])})

    for seq, causal in itertools.product((1024, 2048), (False, True)):
        q, k, v = (rng.standard_normal((1, 8, seq, 64), dtype=np.float32) for _ in range(3))
        fn = lib.causal_attention if causal else lib.attention
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v)) if torch else (None,) * 3
        sdpa = torch.nn.functional.scaled_dot_product_attention if torch else None
        t = timed({"tessera": partial(fn, q, k, v),
                   "torch": partial(sdpa, tq, tk, tv, is_causal=causal) if sdpa else None},
                  args.runs)  # fmt: skip
        rows.append({"case": f"attention f32 B1 H8 S{seq} D64{' causal' if causal else ''}",
                     "seconds": t, "vs_torch": ratio(t["torch"], t["tessera"])})  # fmt: skip

    result = {
        "benchmark": "cpu",
        "machine": machine(),
        "method": f"median of {args.runs} interleaved runs after one warm-up; before each "
                  "run a 200 ms pause, then one untimed call; ratios are peer time / "
                  "tessera time (above 1: tessera is faster)",
        "results": rows,
    }  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_file(RESULTS, json.dumps(result, indent=2) + "\n")
    for row in rows:
        ratios = {k: v for k, v in row.items() if k.startswith(("vs_", "of_"))}
        print(f"{row['case']:<42} {row['seconds']['tessera'] * 1e3:9.2f} ms  {ratios}")


if __name__ == "__main__":
    main()
