"""Benchmark: attention's backward pass on the CPU against PyTorch, in one process.

f32 B1 H8 S1024 D64, causal and not. Tessera's ``attention_vjp`` (from ``@autodiff``) takes
q, k, v and the output's gradient and returns dq, dk and dv: it runs ``attention_stats``
(the forward loop again, for each row's logsumexp and ``delta = rowsum(do * o)``) and the
FlashAttention-2 backward kernels, ``attention_dq`` and ``attention_dkdv``. The peers:
``scaled_dot_product_attention``'s backward alone (``torch.autograd.grad`` of a saved
forward), and its forward and backward together, which is the work ``attention_vjp`` does.

Then the keys' kernel alone: ``attention_dkdv``, which gives dk and dv from one pass over
the queries, against the two kernels it replaced, ``attention_dk`` and ``attention_dv``
(read from the commit before it, ``BEFORE``, and compiled by this compiler), each
computing the probabilities again; both on the same ``attention_stats``.

Median of interleaved runs after warm-up (the method of ``bench/cpu.py``); results go to
``bench/results/attention_backward.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
from functools import partial
from pathlib import Path

import numpy as np
import torch
from cpu import machine, ratio, timed

import tessera
from tessera.files import write_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "attention_backward.json"
#: The commit whose library still had attention_dk and attention_dv.
BEFORE = "60e9e48b8c1c916f0401b9bdc39cc660cee8ada8"

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


def _library(name: str, commit: str | None = None) -> object:
    """The library kernel ``name`` built for the CPU on its own: as it is, or as it was
    at ``commit``."""
    path = ROOT / "tessera" / "stdlib" / f"{name}.tsr"
    if commit is None:
        return tessera.compile_file(path, target="cpu").load()
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path.relative_to(ROOT)}"],
                          check=True, capture_output=True, text=True).stdout  # fmt: skip
    return tessera.compile(text, f"{name}.tsr", target="cpu").load()


def _two_kernels(dk: object, dv: object, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                 do: np.ndarray, stats: np.ndarray, causal: bool) -> tuple:  # fmt: skip
    return (dk.attention_dk(q, k, v, do, stats, causal=causal, scale=0.125),
            dv.attention_dv(q, k, do, stats, causal=causal, scale=0.125))  # fmt: skip


def _keys_kernels(seq: int, causal: bool, runs: int, rng: np.random.Generator) -> dict:
    """``attention_dkdv`` against ``attention_dk`` and ``attention_dv``, on 8 heads of
    ``seq`` x 64 and the same statistics: the same gradients, and their times."""
    stats_lib, dkdv = _library("attention_stats"), _library("attention_dkdv")
    dk, dv = _library("attention_dk", BEFORE), _library("attention_dv", BEFORE)
    q, k, v, do = (rng.standard_normal((8, seq, 64), dtype=np.float32) for _ in range(4))
    stats = stats_lib.attention_stats(q, k, v, do, causal=causal, scale=0.125)
    one = dkdv.attention_dkdv(q, k, v, do, stats, causal=causal, scale=0.125)
    for have, want in zip(one, _two_kernels(dk, dv, q, k, v, do, stats, causal), strict=True):
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5)
    t = timed({"attention_dkdv": partial(dkdv.attention_dkdv, q, k, v, do, stats,
                                         causal=causal, scale=0.125),
               "attention_dk_and_dv": partial(_two_kernels, dk, dv, q, k, v, do, stats, causal)},
              runs)  # fmt: skip
    return {"case": f"dk and dv f32 BH8 S{seq} D64{' causal' if causal else ''}",
            "seconds": t,
            "vs_two_kernels": ratio(t["attention_dk_and_dv"], t["attention_dkdv"])}  # fmt: skip


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
        rows.append(_keys_kernels(seq, causal, args.runs, rng))
    result = {
        "benchmark": "attention_backward",
        "machine": machine(load_before),
        "before": BEFORE,
        "method": f"median of {args.runs} interleaved runs after one warm-up; before each "
                  "run a 200 ms pause, then one untimed call; ratios are peer time / "
                  "tessera time (above 1: tessera is faster); tessera's time includes "
                  "attention_stats, which runs the forward loop again for the logsumexp "
                  "and delta that the backward kernels read; vs_two_kernels is the time "
                  "of attention_dk and attention_dv (as at BEFORE) / attention_dkdv's",
        "results": rows,
    }  # fmt: skip
    write_file(RESULTS, json.dumps(result, indent=2) + "\n")
    for row in rows:
        ratios = {k: v for k, v in row.items() if k.startswith("vs_")}
        ours = row["seconds"].get("tessera", row["seconds"].get("attention_dkdv"))
        print(f"{row['case']:<48} {ours * 1e3:9.2f} ms  {ratios}")


if __name__ == "__main__":
    main()
