"""Benchmark: attention's backward pass on the CPU against PyTorch, in one process.

f32 B1 H8 S1024 D64, causal and not. Tessera's ``attention_vjp`` (from ``@autodiff``) takes
q, k, v and the output's gradient and returns dq, dk and dv: it runs ``attention_stats``
(the forward loop again, for each row's logsumexp and ``delta = rowsum(do * o)``) and the
three FlashAttention-2 backward kernels. The peers: ``scaled_dot_product_attention``'s backward
alone (``torch.autograd.grad`` of a saved forward), and its forward and backward together,
which is the work ``attention_vjp`` does. Median of interleaved runs after warm-up (the
method of ``bench/cpu.py``); results go to ``bench/results/attention_backward.json``.
"""

from __future__ import annotations

import argparse
import itertools
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
RESULTS = ROOT / "bench" / "results" / "attention_backward.json"

SOURCE = """\
@autodiff
def attention(q: Tensor["B", "H", "S", "D", f32], k: Tensor["B", "H", "S", "D", f32],
              v: Tensor["B", "H", "S", "D", f32]) -> Tensor["B", "H", "S", "D", f32]:
    return flash_attention(q, k, v)

@autodiff
def causal_attention(q: Tensor["B", "H", "S", "D", f32], k: Tensor["B", "H", "S", "D", f32],
                     v: Tensor["B", "H", "S", "D", f32]) -> Tensor["B", "H", "S", "D", f32]:
    return flash_attention(q, k, v, causal=True)
"""


def _torch_backward(out: torch.Tensor, inputs: tuple, grad: torch.Tensor) -> object:
    return torch.autograd.grad(out, inputs, grad, retain_graph=True)


def _torch_both(inputs: tuple, grad: torch.Tensor, causal: bool) -> object:
    out = torch.nn.functional.scaled_dot_product_attention(*inputs, is_causal=causal)
    return torch.autograd.grad(out, inputs, grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    lib = tessera.compile(SOURCE, "attention_backward.tsr", target="cpu").load()
    rng = np.random.default_rng(0)
    rows = []
    for seq, causal in itertools.product((1024,), (False, True)):
        q, k, v, do = (rng.standard_normal((1, 8, seq, 64), dtype=np.float32) for _ in range(4))
        fn = lib.causal_attention_vjp if causal else lib.attention_vjp
        inputs = tuple(torch.from_numpy(a).requires_grad_() for a in (q, k, v))
        grad = torch.from_numpy(do)
        out = torch.nn.functional.scaled_dot_product_attention(*inputs, is_causal=causal)
        for have, want in zip(fn(q, k, v, do), _torch_backward(out, inputs, grad), strict=True):
            np.testing.assert_allclose(have, want.numpy(), rtol=1e-3, atol=1e-4)
        t = timed({"tessera": partial(fn, q, k, v, do),
                   "torch_backward": partial(_torch_backward, out, inputs, grad),
                   "torch_forward_backward": partial(_torch_both, inputs, grad, causal)},
                  args.runs)  # fmt: skip
        rows.append({"case": f"attention backward f32 B1 H8 S{seq} D64"
                             f"{' causal' if causal else ''}",
                     "seconds": t,
                     "vs_torch_backward": ratio(t["torch_backward"], t["tessera"]),
                     "vs_torch_forward_backward": ratio(t["torch_forward_backward"],
                                                        t["tessera"])})  # fmt: skip
    result = {
        "benchmark": "attention_backward",
        "machine": machine(load_before),
        "method": f"median of {args.runs} interleaved runs after one warm-up; before each "
                  "run a 200 ms pause, then one untimed call; ratios are peer time / "
                  "tessera time (above 1: tessera is faster); tessera's time includes "
                  "attention_stats, which runs the forward loop again for the logsumexp "
                  "and delta that the backward kernels read",
        "results": rows,
    }  # fmt: skip
    write_file(RESULTS, json.dumps(result, indent=2) + "\n")
    for row in rows:
        ratios = {k: v for k, v in row.items() if k.startswith("vs_")}
        print(f"{row['case']:<48} {row['seconds']['tessera'] * 1e3:9.2f} ms  {ratios}")


if __name__ == "__main__":
    main()
