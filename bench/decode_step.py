"""Benchmark: a decode step of ``examples/decode.tsr`` on the CPU, the append compiled
into the projection against the same step glued together in Python.

``compiled``: ``project(x, ..., cache)``, which computes the rotated queries and appends
the new keys and values to the cache in the same compiled call (two launches after the
projection). ``glued``: ``qkv(x, ...)``, then ``KVCache.append`` in Python (numpy fancy
indexing per batch row). Both then run the rest of the step, ``tessera.decode_attention``
and ``finish``, which is timed alone too (``attend_finish``) so that the share the append
costs can be read off. One token (T = 1) a step, a cache of 4096 slots holding 2048
positions per row, B = 1 and 8; each call puts the lengths back first (both paths alike),
so every step appends at the same place. Timed as ``bench/quant.py`` times (interleaved
runs, a warm-up, median of 7), a run being 20 steps; with ``--rounds N`` each number is
the median over N rounds, each round's numbers and the load average kept beside it (the
machine is shared). Results go to ``bench/results/decode_step.json``.
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
from quant import _median_seconds  # bench/, the script's directory, is on the path

import tessera
from tessera.files import write_file
from tessera.runtime.kvcache import KVCache, decode_attention

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "decode_step.json"
WIDTH, HIDDEN, KV_HEADS, DIM, S_MAX, LENGTH = 256, 512, 2, 64, 4096, 2048
STEPS_A_RUN = 20


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = {"wq": (WIDTH, WIDTH), "wk": (WIDTH, KV_HEADS * DIM), "wv": (WIDTH, KV_HEADS * DIM),
              "wo": (WIDTH, WIDTH), "wg": (WIDTH, HIDDEN), "wu": (WIDTH, HIDDEN),
              "wd": (HIDDEN, WIDTH), "norm1": (WIDTH,), "norm2": (WIDTH,)}  # fmt: skip
    return {k: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
            for k, s in shapes.items()}  # fmt: skip


def _steps(lib: object, batch: int, rng: np.random.Generator) -> dict[str, Callable[[], None]]:
    """The three ways of running a step, each a run of ``STEPS_A_RUN`` steps."""
    w = _weights(rng)
    x = rng.standard_normal((batch, 1, WIDTH)).astype(np.float32)
    angle = LENGTH * 10000.0 ** (-np.arange(DIM // 2) / (DIM // 2))
    cos, sin = (f(angle).astype(np.float32)[None, :] for f in (np.cos, np.sin))
    weights = (w["norm1"], w["wq"], w["wk"], w["wv"], cos, sin)
    cache = KVCache.zeros(batch, KV_HEADS, S_MAX, DIM)
    cache.K[:] = rng.standard_normal(cache.K.shape, np.float32)
    cache.V[:] = rng.standard_normal(cache.V.shape, np.float32)
    q_ready, _, _ = lib.qkv(x, *weights)

    def finish(q: np.ndarray) -> None:
        o = decode_attention(q, cache)
        lib.finish(x, o, w["wo"], w["norm2"], w["wg"], w["wu"], w["wd"])

    def compiled() -> None:
        cache.lengths[:] = LENGTH
        q, _ = lib.project(x, *weights, cache)
        finish(q)

    def glued() -> None:
        cache.lengths[:] = LENGTH
        q, k, v = lib.qkv(x, *weights)
        cache.append(k, v)
        finish(q)

    def attend_finish() -> None:
        cache.lengths[:] = LENGTH + 1
        finish(q_ready)

    def run(step: Callable[[], None]) -> Callable[[], None]:
        def steps() -> None:
            for _ in range(STEPS_A_RUN):
                step()

        return steps

    ways = {"compiled": compiled, "glued": glued, "attend_finish": attend_finish}
    return {name: run(f) for name, f in ways.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    lib = tessera.compile_file(ROOT / "examples/decode.tsr", target="cpu").load()
    rng = np.random.default_rng(0)
    cases = []
    for batch in (1, 8):
        steps = _steps(lib, batch, rng)
        rounds = []
        for _ in range(args.rounds):
            seconds = _median_seconds(steps)
            us = {k: 1e6 * t / STEPS_A_RUN for k, t in seconds.items()}
            us["append_compiled"] = us["compiled"] - us["attend_finish"]
            us["append_glued"] = us["glued"] - us["attend_finish"]
            rounds.append({"us_per_step": us, "glued_over_compiled": us["glued"] / us["compiled"],
                           "load_average": os.getloadavg()})  # fmt: skip
            print(batch, json.dumps(rounds[-1]))
        median = {k: statistics.median(r["us_per_step"][k] for r in rounds)
                  for k in rounds[0]["us_per_step"]}  # fmt: skip
        cases.append({"batch": batch, "us_per_step": median,
                      "glued_over_compiled": median["glued"] / median["compiled"],
                      "rounds": rounds})  # fmt: skip
    result = {
        "what": __doc__.split("\n\n")[0],
        "machine": platform.processor() or platform.machine(),
        "threads": os.environ.get("OMP_NUM_THREADS", "all"),
        "shape": dict(
            width=WIDTH, kv_heads=KV_HEADS, dim=DIM, s_max=S_MAX, length=LENGTH, tokens_a_step=1
        ),
        "noise": "a shared 2-core machine: each round's numbers and load average are kept",
        "cases": cases,
    }
    write_file(args.output, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
