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
after a warm-up; results go to ``bench/results/decode.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from quant import RUNS, _median_seconds  # bench/, the script's directory, is on the path

import tessera
from tessera.files import write_file
from tessera.runtime.kvcache import KVCache, decode_library

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


def _case(length: int, rng: np.random.Generator) -> dict[str, object]:
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
    seconds = _per_call({
        "tessera": lambda: tessera.decode_attention(q, cache),
        "torch_sdpa": torch_sdpa,
        "copy_cache_bytes": lambda: np.copyto(target, source),
    }, calls)  # fmt: skip
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
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS),
                        help="cache lengths to measure (default: %(default)s)")  # fmt: skip
    args = parser.parse_args()
    decode_library("cpu", "f32")  # built before any timing
    rng = np.random.default_rng(0)
    cases = []
    for length in args.lengths:
        case = _case(length, rng)
        cases.append(case)
        print(json.dumps(case))
    result = {
        "machine": {
            "platform": platform.platform(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "numpy": np.__version__,
        },
        "shape": {"batch": 1, "q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": DIM,
                  "dtype": "f32", "query_rows": 1},
        "runs": RUNS,
        "cases": cases,
    }  # fmt: skip
    write_file(RESULTS, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
