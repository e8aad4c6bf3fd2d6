"""Benchmark: the backward passes of layernorm, rmsnorm and log_softmax on the CPU, in one
process, against PyTorch and this machine's copy bandwidth.

4096 x 4096 f32. Tessera's ``F_vjp`` (from ``@autodiff``) of ``layernorm(x, w, b)`` and
``rmsnorm(x, w)`` returns dx and the weight's (and bias's) gradients: the library's row
kernel (``layernorm_grad``, ``rmsnorm_grad``) gives dx and each row's statistics, and
``norm_param_grad`` the other two from them; ``wrt="x"`` the input's alone, the row
kernel's dx;
``log_softmax``'s is ``log_softmax_grad``. The bytes a backward pass must move are x (or
y), the cotangent and the weight read and dx written, three 4096 x 4096 arrays;
``of_copy_bandwidth`` is those bytes over tessera's time, against a numpy copy
(``copyto``) of x's bytes over its time, each into a preallocated array. The torch peer
is ``torch.autograd.grad`` of a saved ``F.layer_norm``, ``F.rms_norm`` or
``log_softmax``: the backward alone. Median of interleaved runs after warm-up (the
method of ``bench/cpu.py``); results go to ``bench/results/norm_backward.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
from cpu import machine, ratio, timed

import tessera
from tessera.files import write_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "norm_backward.json"
N = 4096

SOURCE = """\
@autodiff
def layer_norm(x: Tensor["R", "C", f32], w: Tensor["C", f32],
               b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return layernorm(x, w, b)

@autodiff(wrt="x")
def layer_norm_dx(x: Tensor["R", "C", f32], w: Tensor["C", f32],
                  b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return layernorm(x, w, b)

@autodiff
def rms_norm(x: Tensor["R", "C", f32], w: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return rmsnorm(x, w)

@autodiff(wrt="x")
def rms_norm_dx(x: Tensor["R", "C", f32], w: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return rmsnorm(x, w)

@autodiff
def log_probs(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return log_softmax(x, axis=-1)
"""


def _torch_backward(out: torch.Tensor, inputs: tuple, grad: torch.Tensor) -> object:
    return torch.autograd.grad(out, inputs, grad, retain_graph=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    lib = tessera.compile(SOURCE, "norm_backward.tsr", target="cpu").load()
    rng = np.random.default_rng(0)
    x, dy = (rng.standard_normal((N, N), dtype=np.float32) for _ in range(2))
    w, b = (rng.standard_normal(N, dtype=np.float32) for _ in range(2))
    tx, tw, tb = (torch.from_numpy(a).requires_grad_() for a in (x, w, b))
    grad = torch.from_numpy(dy)
    F = torch.nn.functional
    outs = {
        "layer_norm": F.layer_norm(tx, (N,), tw, tb),
        "rms_norm": F.rms_norm(tx, (N,), tw, 1e-6),
        "log_probs": torch.log_softmax(tx, -1),
    }
    dx, dw, db = (np.empty_like(a) for a in (x, w, b))
    copy_dst = np.empty_like(x)
    cases: dict[str, tuple[Callable[..., object], tuple, tuple, tuple]] = {
        "layernorm backward (dx, dw, db)": (lib.layer_norm_vjp, (x, w, b, dy), (dx, dw, db),
                                           (tx, tw, tb)),
        "layernorm backward, dx alone": (lib.layer_norm_dx_vjp, (x, w, b, dy), dx, (tx,)),
        "rmsnorm backward (dx, dw)": (lib.rms_norm_vjp, (x, w, dy), (dx, dw), (tx, tw)),
        "rmsnorm backward, dx alone": (lib.rms_norm_dx_vjp, (x, w, dy), dx, (tx,)),
        "log_softmax backward": (lib.log_probs_vjp, (x, dy), dx, (tx,)),
    }  # fmt: skip
    rows = []
    for name, (fn, inputs, into, wrt) in cases.items():
        key = name.split()[0].replace("layernorm", "layer_norm").replace("rmsnorm", "rms_norm")
        out = outs["log_probs" if key == "log_softmax" else key]
        want = _torch_backward(out, wrt, grad)
        have = fn(*inputs)
        for h, t in zip(have if isinstance(have, tuple) else (have,), want, strict=True):
            np.testing.assert_allclose(h, t.numpy(), rtol=1e-3, atol=2e-3)
        t = timed({"tessera": partial(fn, *inputs), "tessera_into": partial(fn, *inputs, out=into),
                   "torch_backward": partial(_torch_backward, out, wrt, grad),
                   "copy": lambda: np.copyto(copy_dst, x)}, args.runs)  # fmt: skip
        moved = 3 * x.nbytes + w.nbytes  # x (or y) and the cotangent read, dx written
        rows.append({"case": f"{name} f32 {N}x{N}", "seconds": t,
                     "gb_per_s": {k: v and round((2 * x.nbytes if k == "copy" else moved)
                                                 / v / 1e9, 1) for k, v in t.items()},
                     "of_copy_bandwidth": round(moved / t["tessera_into"]
                                                / (2 * x.nbytes / t["copy"]), 3),
                     "vs_torch_backward": ratio(t["torch_backward"], t["tessera"])})  # fmt: skip
    result = {
        "benchmark": "norm_backward",
        "machine": machine(load_before),
        "method": f"median of {args.runs} interleaved runs after one warm-up; before each "
                  "run a 200 ms pause, then one untimed call; of_copy_bandwidth is the bytes "
                  "the pass must move (x, the cotangent and the weight read, dx written) "
                  "per second into preallocated arrays, over a numpy copy's bytes per "
                  "second; vs_torch_backward is torch's time / tessera's (allocating)",
        "results": rows,
    }  # fmt: skip
    write_file(RESULTS, json.dumps(result, indent=2) + "\n")
    for row in rows:
        print(
            f"{row['case']:<50} {row['seconds']['tessera_into'] * 1e3:8.2f} ms into, "
            f"copy {row['seconds']['copy'] * 1e3:6.2f} ms, of copy bandwidth "
            f"{row['of_copy_bandwidth']}, vs torch {row['vs_torch_backward']}"
        )


if __name__ == "__main__":
    main()
