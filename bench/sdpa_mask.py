"""Benchmark: ``scaled_dot_product_attention`` with ``attn_mask`` on the CPU, in one process.

f32 B1 H8 L=S=1024 D64, a mask of ``[L, S]``: a comparison (``keep > 0.0``, about half
the keys of each query) and a float bias. With a mask, Tessera writes the attention out
as graph ops (the scores ``[B, H, L, S]`` through memory: a product with the mask in
its epilogue, a row softmax, a product), where without one it is the one
``flash_attention`` kernel; both are measured, against PyTorch 2.13's SDPA (its CPU
default path) with the same mask. Median of interleaved runs after warm-up (the method
of ``bench/cpu.py``); results go to ``bench/results/sdpa_mask.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from functools import partial
from pathlib import Path

import numpy as np
import torch
from cpu import machine, ratio, timed

import tessera
from tessera.files import write_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "sdpa_mask.json"

SOURCE = """\
def masked(q: Tensor["B", "H", "L", "D", f32], k: Tensor["B", "H", "S", "D", f32],
           v: Tensor["B", "H", "S", "D", f32], keep: Tensor["L", "S", f32]
           ) -> Tensor["B", "H", "L", "D", f32]:
    return scaled_dot_product_attention(q, k, v, attn_mask=keep > 0.0)

def biased(q: Tensor["B", "H", "L", "D", f32], k: Tensor["B", "H", "S", "D", f32],
           v: Tensor["B", "H", "S", "D", f32], bias: Tensor["L", "S", f32]
           ) -> Tensor["B", "H", "L", "D", f32]:
    return scaled_dot_product_attention(q, k, v, attn_mask=bias)

def unmasked(q: Tensor["B", "H", "L", "D", f32], k: Tensor["B", "H", "S", "D", f32],
             v: Tensor["B", "H", "S", "D", f32]) -> Tensor["B", "H", "L", "D", f32]:
    return scaled_dot_product_attention(q, k, v)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    lib = tessera.compile(SOURCE, "sdpa_mask.tsr", target="cpu").load()
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, 1024, 64), dtype=np.float32) for _ in range(3))
    keep, bias = (rng.standard_normal((1024, 1024), dtype=np.float32) for _ in range(2))
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows = []
    for case, ours, mask, attn_mask in (
        ("bool [L, S]", lib.masked, keep, torch.from_numpy(keep) > 0),
        ("float [L, S]", lib.biased, bias, torch.from_numpy(bias)),
    ):
        want = sdpa(tq, tk, tv, attn_mask=attn_mask).numpy()
        np.testing.assert_allclose(ours(q, k, v, mask), want, rtol=1e-4, atol=1e-5)
        t = timed({"tessera_masked": partial(ours, q, k, v, mask),
                   "tessera_unmasked_flash": partial(lib.unmasked, q, k, v),
                   "torch_masked": partial(sdpa, tq, tk, tv, attn_mask=attn_mask)},
                  args.runs)  # fmt: skip
        rows.append({"case": f"sdpa f32 B1 H8 L1024 S1024 D64, mask {case}",
                     "seconds": t,
                     "vs_torch_masked": ratio(t["torch_masked"], t["tessera_masked"]),
                     "vs_tessera_unmasked": ratio(t["tessera_unmasked_flash"],
                                                  t["tessera_masked"])})  # fmt: skip
    result = {
        "benchmark": "sdpa_mask",
        "machine": machine(load_before),
        "method": f"median of {args.runs} interleaved runs after one warm-up; before each "
                  "run a 200 ms pause, then one untimed call; ratios are peer time / "
                  "tessera_masked time (above 1: the masked attention is faster); "
                  "tessera_masked includes the mask's comparison or reduction kernels",
        "results": rows,
    }  # fmt: skip
    write_file(RESULTS, json.dumps(result, indent=2) + "\n")
    for row in rows:
        ratios = {k: v for k, v in row.items() if k.startswith("vs_")}
        print(f"{row['case']:<48} {row['seconds']['tessera_masked'] * 1e3:9.2f} ms  {ratios}")


if __name__ == "__main__":
    main()
