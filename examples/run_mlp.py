"""Compile examples/mlp.tsr for the CPU, run it, check it against numpy, time it.

    python examples/run_mlp.py [--tokens T] [--dim D] [--hidden F]

This is what `make demo` runs: the whole road from a .tsr file to numbers.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import ml_dtypes
import numpy as np

import tessera

HERE = Path(__file__).resolve().parent


def f(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def reference(x: np.ndarray, w_in: np.ndarray, b_in: np.ndarray, w_out: np.ndarray,
              b_out: np.ndarray) -> np.ndarray:  # fmt: skip
    """The MLP in float64 numpy, with the hidden activation rounded to bf16 as the
    kernel does."""
    z = f(x) @ f(w_in) + f(b_in)
    h = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    h = f(h.astype(ml_dtypes.bfloat16))
    return f(x) + h @ f(w_out) + f(b_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--hidden", type=int, default=1536)
    args = parser.parse_args()
    t, d, hidden = args.tokens, args.dim, args.hidden

    start = time.perf_counter()
    mlp = tessera.compile_file(HERE / "mlp.tsr", target="cpu").load().mlp
    print(f"compiled and built examples/mlp.tsr for the CPU in {time.perf_counter() - start:.1f} s")

    rng = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16
    x = rng.standard_normal((t, d)).astype(bf16)
    w_in = (rng.standard_normal((d, hidden)) / math.sqrt(d)).astype(bf16)
    b_in = rng.standard_normal(hidden).astype(np.float32)
    w_out = (rng.standard_normal((hidden, d)) / math.sqrt(hidden)).astype(bf16)
    b_out = rng.standard_normal(d).astype(np.float32)

    out = mlp(x, w_in, b_in, w_out, b_out)
    want = reference(x, w_in, b_in, w_out, b_out)
    error = np.abs(out.astype(np.float64) - want).max() / np.abs(want).max()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        mlp(x, w_in, b_in, w_out, b_out)
        times.append(time.perf_counter() - start)
    best = sorted(times)[len(times) // 2]
    gflops = 2 * 2 * t * d * hidden / best / 1e9
    print(f"mlp x[{t}, {d}] -> [{t}, {hidden}] -> [{t}, {d}], bf16 with f32 accumulation")
    print(f"max error vs float64 numpy, relative to the largest value: {error:.1e}")
    print(f"median of 5 runs: {best * 1e3:.2f} ms ({gflops:.1f} GFLOP/s)")
    if not error < 2e-2:
        raise SystemExit("FAILED: the result does not match the reference")
    print("OK")


if __name__ == "__main__":
    main()
