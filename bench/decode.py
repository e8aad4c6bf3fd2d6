"""Benchmark: decode attention over a KV cache on the CPU, against PyTorch, in one process.

One query row per head, B = 1, 32 query heads over 8 key/value heads (grouped-query
attention, as Llama 3 8B's), head dim 128, f32, caches of 1k to 32k positions (S_max
equal to the length): ``tessera.decode_attention`` (the library's split-K
``decode_attention`` kernel and its combine) against ``torch.nn.functional.
scaled_dot_product_attention`` with ``enable_gqa=True`` on the same cache memory (torch
tensors made with ``from_numpy``). A decode step reads the whole cache once, so the cache's
bytes over the time is the bandwidth each reaches, beside this machine's copy bandwidth
(numpy ``copyto`` of the same bytes): the fraction of copy bandwidth. Each case is timed
interleaved with its peers, median of 7 runs (of several calls for a short cache)
after a warm-up; with ``--rounds N`` the whole measurement is repeated N times and each
number is the median over the rounds (each round's ratios and the load average kept
beside it, for a machine shared with other work); results go to
``bench/results/decode.json`` (``--output``). With ``OMP_NUM_THREADS=1`` both Tessera's
kernel and torch run on one thread, as the copy does: what one core reaches, which a
machine whose cores are taken by other work does not disturb as it does two threads
that wait for each other.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from quant import RUNS, _median_seconds  # bench/, the script's directory, is on the path

import tessera
from tessera.files import write_file
from tessera.runtime.kvcache import KVCache, decode_block, decode_library

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "decode.json"
Q_HEADS, KV_HEADS, DIM = 32, 8, 128
LENGTHS = (1024, 4096, 16384, 32768)
#: Keys a run reads at least: a run of a short cache is several calls, so that it takes
#: milliseconds, not microseconds.
KEYS_A_RUN = 8192


def _per_call(functions: dict[str, Callable[[], object]], calls: int) -> dict[str, float]:
    """Each function's median seconds a call, timed as ``bench/quant.py`` times (interleaved
    runs after a warm-up), a run being ``calls`` calls."""

    def repeated(f: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(calls):
                f()

        return run

    seconds = _median_seconds({name: repeated(f) for name, f in functions.items()})
    return {name: t / calls for name, t in seconds.items()}


def _case(length: int, rng: np.random.Generator, rounds: int) -> dict[str, object]:
    """One cache length: ``rounds`` measurements of the three, each number the median
    over the rounds."""
    cache = KVCache.zeros(1, KV_HEADS, length, DIM)
    cache.K[:] = rng.standard_normal(cache.K.shape, np.float32)
    cache.V[:] = rng.standard_normal(cache.V.shape, np.float32)
    cache.lengths[:] = length
    q = rng.standard_normal((1, Q_HEADS, 1, DIM)).astype(np.float32)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, cache.K, cache.V))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def torch_sdpa() -> torch.Tensor:  # one query at the last position sees every key
        return sdpa(tq, tk, tv, enable_gqa=True)

    ours = tessera.decode_attention(q, cache)
    error = float(np.abs(ours - torch_sdpa().numpy()).max())
    assert error < 1e-4, f"length {length}: tessera and torch differ by {error}"
    cache_bytes = cache.K.nbytes + cache.V.nbytes
    source, target = np.empty(cache_bytes, np.uint8), np.empty(cache_bytes, np.uint8)
    calls = max(1, KEYS_A_RUN // length)
    measured = []
    for _ in range(rounds):
        load = os.getloadavg()[0]
        measured.append((_per_call({
            "tessera": lambda: tessera.decode_attention(q, cache),
            "torch_sdpa": torch_sdpa,
            "copy_cache_bytes": lambda: np.copyto(target, source),
        }, calls), load))  # fmt: skip
    seconds = {k: statistics.median(m[k] for m, _ in measured) for k in measured[0][0]}
    gb_per_s = {k: round(cache_bytes / v / 1e9, 2) for k, v in seconds.items()}
    return {
        "length": length, "cache_mb": round(cache_bytes / 2**20, 1), "calls_a_run": calls,
        "ms": {k: round(v * 1e3, 4) for k, v in seconds.items()},
        "cache_gb_per_s": gb_per_s,
        "ratio_tessera_over_torch": round(seconds["torch_sdpa"] / seconds["tessera"], 3),
        "fraction_of_copy_bandwidth": {
            "tessera": round(seconds["copy_cache_bytes"] / seconds["tessera"], 3),
            "torch_sdpa": round(seconds["copy_cache_bytes"] / seconds["torch_sdpa"], 3),
        },
        "max_abs_difference": error,
        "rounds": [
            {"load_average_1min": round(load, 2),
             "ratio_tessera_over_torch": round(m["torch_sdpa"] / m["tessera"], 3),
             "fraction_of_copy_bandwidth": round(m["copy_cache_bytes"] / m["tessera"], 3)}
            for m, load in measured
        ],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS),
                        help="cache lengths to measure (default: %(default)s)")  # fmt: skip
    parser.add_argument(
        "--rounds", type=int, default=1, help="measurements of each length; medians are reported"
    )
    parser.add_argument("--output", type=Path, default=RESULTS,
                        help="the JSON file written (default: %(default)s)")  # fmt: skip
    args = parser.parse_args()
    # built before any timing: the kernel in the block decode_attention picks for the
    # step's query rows a key head
    decode_library("cpu", "f32", decode_block("cpu", Q_HEADS // KV_HEADS))
    rng = np.random.default_rng(0)
    cases = []
    for length in args.lengths:
        case = _case(length, rng, args.rounds)
        cases.append(case)
        print(json.dumps(case))
    result = {
        "machine": {
            "platform": platform.platform(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "numpy": np.__version__,
        },
        "shape": {"batch": 1, "q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": DIM,
                  "dtype": "f32", "query_rows": 1},
        "runs": RUNS,
        "rounds": args.rounds,
        "cases": cases,
    }  # fmt: skip
    write_file(args.output, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
