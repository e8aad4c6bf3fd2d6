"""Benchmark: attention over a KV cache compiled into a graph function, against
``tessera.decode_attention``, on the CPU, in one process.

``compiled``: a graph function ``attend(q, cache)`` that returns ``flash_attention(q,
cache)`` over a cache whose ``S_max`` is a size: one split a row, the visible-keys kernel
and the library's ``decode_partial``. ``compiled_splits``: the same with ``S_max`` fixed
at compile time (``-D S=...``), so split as ``decode_attention`` splits it: the library's
``decode_partial_lse`` (each split's output and log-sum-exp, from one pass over the keys
and values) and the combine in graph ops, all in the compiled call. ``decode_attention``:
``tessera.decode_attention(q, cache)``, the library's one ``decode_attention`` kernel,
the visible keys and the combine computed by numpy. The shape is ``bench/decode.py``'s
(B = 1, one query row, 32 query heads over 8 key/value heads, head dim 128, f32, S_max
equal to the length), and so is the timing (interleaved, median of 7 runs after a
warm-up, ``bench/quant.py``); the load average is kept beside each case, for a machine
shared with other work. Results go to ``bench/results/decode_compiled.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
from decode import DIM, KV_HEADS, Q_HEADS, _per_call  # bench/ is on the path
from quant import RUNS

import tessera
from tessera.files import write_file
from tessera.runtime.kvcache import KVCache, decode_block, decode_library

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "decode_compiled.json"
LENGTHS = (1024, 4096, 16384)
KEYS_A_RUN = 8192
SOURCE = f"""\
@kernel
def attend(q: Tensor[1, {Q_HEADS}, 1, {DIM}, f32],
           cache: KVCache[1, {KV_HEADS}, "S", {DIM}, f32]) -> Tensor[1, {Q_HEADS}, 1, {DIM}, f32]:
    return flash_attention(q, cache, causal=True)
"""


def _case(lib: object, length: int, rng: np.random.Generator) -> dict[str, object]:
    """One cache length: the three ways, timed interleaved."""
    fixed = tessera.compile(SOURCE, filename="attend.tsr", target="cpu",
                            defines={"S": length}).load()  # fmt: skip
    cache = KVCache.zeros(1, KV_HEADS, length, DIM)
    cache.K[:] = rng.standard_normal(cache.K.shape, np.float32)
    cache.V[:] = rng.standard_normal(cache.V.shape, np.float32)
    cache.lengths[:] = length
    q = rng.standard_normal((1, Q_HEADS, 1, DIM)).astype(np.float32)
    out = np.empty_like(q)
    want = tessera.decode_attention(q, cache)
    error = max(
        float(np.abs(f(q, cache, out=out) - want).max()) for f in (lib.attend, fixed.attend)
    )
    assert error < 1e-4, f"length {length}: the two differ by {error}"
    calls = max(1, KEYS_A_RUN // length)
    load = os.getloadavg()[0]
    seconds = _per_call({
        "compiled": lambda: lib.attend(q, cache, out=out),
        "compiled_splits": lambda: fixed.attend(q, cache, out=out),
        "decode_attention": lambda: tessera.decode_attention(q, cache),
    }, calls)  # fmt: skip
    return {
        "length": length, "calls_a_run": calls,
        "ms": {k: round(v * 1e3, 4) for k, v in seconds.items()},
        "speedup_over_decode_attention": {
            k: round(seconds["decode_attention"] / seconds[k], 3)
            for k in ("compiled", "compiled_splits")
        },
        "max_abs_difference": error, "load_average_1min": round(load, 2),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS),
                        help="cache lengths to measure (default: %(default)s)")  # fmt: skip
    parser.add_argument("--output", type=Path, default=RESULTS,
                        help="the JSON file written (default: %(default)s)")  # fmt: skip
    args = parser.parse_args()
    decode_library("cpu", "f32", decode_block("cpu", Q_HEADS // KV_HEADS))
    lib = tessera.compile(SOURCE, filename="attend.tsr", target="cpu").load()
    rng = np.random.default_rng(0)
    cases = []
    for length in args.lengths:
        case = _case(lib, length, rng)
        cases.append(case)
        print(json.dumps(case))
    result = {
        "machine": {
            "platform": platform.platform(), "cpus": os.cpu_count(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "numpy": np.__version__,
            "note": "a development machine shared with other work (see each case's load "
                    "average): ratios within a case are comparable, times across runs less",
        },
        "shape": {"batch": 1, "q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": DIM,
                  "dtype": "f32", "query_rows": 1},
        "runs": RUNS,
        "cases": cases,
    }  # fmt: skip
    write_file(args.output, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
