"""Benchmark: one AdamW step on the CPU, one kernel against the kernels it was before,
against ``torch.optim.AdamW`` and this machine's copy bandwidth, in one process.

16M parameters: f32 (the moments f32), and bf16 with an f32 master copy
(``OptimizerState[w] @fp32_master``; torch steps the f32 master and copies it into the
bf16 parameter, as mixed-precision training does). ``tessera`` is ``fused_adam`` on
tensors, one elementwise kernel writing the parameter and both moments (and, with
``master=``, the bf16 parameter) into preallocated arrays; ``tessera_state`` the same
step on an ``OptimizerState``, whose kernel writes the state in place on the CPU (the
new parameter is a result the runtime allocates). ``before`` is the same step as the kernels
fusion made of it when a kernel wrote one value: the new ``m``, then ``v``, then the
parameter reading both back (and, with a master, the gradient widened first and the
bf16 parameter last), each a compiled function of its own writing into preallocated
arrays, so that the intermediates go through memory as they did. The peers are
``torch.optim.AdamW`` with ``foreach=True`` and with ``fused=True``. The bytes a step
must move are the parameter, gradient and moments read (and the master) and the new
ones written: 28 bytes a parameter either way; ``of_copy_bandwidth`` is those bytes
over the time, against a numpy copy (``copyto``) of one 16M f32 array. Median of
interleaved runs after warm-up (``bench/cpu.py``'s method); results go to
``bench/results/adamw.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from functools import partial
from pathlib import Path

import ml_dtypes
import numpy as np
import torch
from cpu import machine, ratio, timed

import tessera
from tessera.files import write_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "adamw.json"
N = 16 * 1024 * 1024
LR, DECAY, STEP = 1e-3, 0.01, 3
BF16 = ml_dtypes.bfloat16

#: The one-kernel steps (the example's), and the steps as the kernels they were before.
SOURCE = (ROOT / "examples/optimizer_step.tsr").read_text(encoding="utf-8") + """

def adamw_tensors(w: Tensor["N", f32], dw: Tensor["N", f32], m: Tensor["N", f32],
                  v: Tensor["N", f32], lr: float, step: int
                  ) -> tuple[Tensor["N", f32], Tensor["N", f32], Tensor["N", f32]]:
    return fused_adam(w, dw, m, v, lr=lr, step=step, weight_decay=0.01)

def adamw_master_tensors(w: Tensor["N", bf16], dw: Tensor["N", bf16], m: Tensor["N", f32],
                         v: Tensor["N", f32], w32: Tensor["N", f32], lr: float, step: int
                         ) -> tuple[Tensor["N", bf16], Tensor["N", f32], Tensor["N", f32],
                                    Tensor["N", f32]]:
    return fused_adam(w, dw, m, v, lr=lr, step=step, weight_decay=0.01, master=w32)

def widened(dw: Tensor["N", bf16]) -> Tensor["N", f32]:
    return cast(dw, f32)

def first_moment(m: Tensor["N", f32], dw: Tensor["N", f32]) -> Tensor["N", f32]:
    return m * 0.9 + dw * (1.0 - 0.9)

def second_moment(v: Tensor["N", f32], dw: Tensor["N", f32]) -> Tensor["N", f32]:
    return v * 0.999 + dw * dw * (1.0 - 0.999)

def update(w: Tensor["N", f32], m: Tensor["N", f32], v: Tensor["N", f32], lr: float,
           step: int) -> Tensor["N", f32]:
    m_hat = m / (1.0 - 0.9 ** float(step))
    v_hat = v / (1.0 - 0.999 ** float(step))
    return w * (1.0 - lr * 0.01) - m_hat * lr / (sqrt(v_hat) + 1e-8)

def rounded(w: Tensor["N", f32]) -> Tensor["N", bf16]:
    return cast(w, bf16)
"""


def _before(lib: object, w: np.ndarray, dw: np.ndarray, m: np.ndarray, v: np.ndarray,
            outs: tuple[np.ndarray, ...]) -> None:  # fmt: skip
    """The f32 step as three kernels: m, v, then the parameter reading both back."""
    new_w, new_m, new_v = outs
    lib.first_moment(m, dw, out=new_m)
    lib.second_moment(v, dw, out=new_v)
    lib.update(w, new_m, new_v, LR, STEP, out=new_w)


def _before_master(lib: object, dw: np.ndarray, master: np.ndarray, m: np.ndarray,
                   v: np.ndarray, outs: tuple[np.ndarray, ...]) -> None:  # fmt: skip
    """The bf16 step with a master as five kernels: the gradient widened, m, v, the
    master, and the bf16 parameter rounded from it."""
    wide, new_w, new_master, new_m, new_v = outs
    lib.widened(dw, out=wide)
    lib.first_moment(m, wide, out=new_m)
    lib.second_moment(v, wide, out=new_v)
    lib.update(master, new_m, new_v, LR, STEP, out=new_master)
    lib.rounded(new_master, out=new_w)


def _torch_adamw(param: torch.Tensor, grad: torch.Tensor, **kind: bool) -> torch.optim.AdamW:
    """AdamW over ``param`` with ``grad``, moments already made (a first step made them)."""
    param.grad = grad
    optimizer = torch.optim.AdamW([param], lr=LR, weight_decay=DECAY, **kind)
    optimizer.step()
    return optimizer


def _torch_master_step(optimizer: torch.optim.AdamW, master: torch.Tensor,
                       param: torch.Tensor) -> None:  # fmt: skip
    optimizer.step()
    param.copy_(master)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    lib = tessera.compile(SOURCE, "adamw.tsr", target="cpu").load()
    rng = np.random.default_rng(0)
    w, dw = (rng.standard_normal(N, dtype=np.float32) for _ in range(2))
    m = rng.standard_normal(N, dtype=np.float32) * 0.1
    v = np.abs(rng.standard_normal(N, dtype=np.float32)) * 0.01
    outs = tuple(np.empty_like(w) for _ in range(3))
    before_outs = tuple(np.empty_like(w) for _ in range(3))
    # the one kernel and the three compute the same step
    lib.adamw_tensors(w, dw, m, v, LR, STEP, out=outs)
    _before(lib, w, dw, m, v, before_outs)
    for one, three in zip(outs, before_outs, strict=True):
        np.testing.assert_allclose(one, three, rtol=1e-6, atol=1e-7)
    state = tessera.OptimizerState(m.copy(), v.copy())
    ws = w.copy()
    copy_dst = np.empty_like(w)
    torches = {
        kind: _torch_adamw(torch.from_numpy(w.copy()), torch.from_numpy(dw.copy()),
                           **{kind: True})
        for kind in ("foreach", "fused")
    }  # fmt: skip
    t = timed({
        "tessera": partial(lib.adamw_tensors, w, dw, m, v, LR, STEP, out=outs),
        "tessera_state": partial(lib.adamw, ws, dw, state, LR, STEP),
        "before": partial(_before, lib, w, dw, m, v, before_outs),
        "torch_foreach": torches["foreach"].step,
        "torch_fused": torches["fused"].step,
        "copy": lambda: np.copyto(copy_dst, w),
    }, args.runs)  # fmt: skip
    rows = [_row("AdamW f32 16M", t, 28 * N, w.nbytes)]

    wb, gb = w.astype(BF16), dw.astype(BF16)
    master = tessera.OptimizerState(m.copy(), v.copy(), w.copy())
    wide = np.empty_like(w)
    before_outs = (wide, np.empty_like(wb), *(np.empty_like(w) for _ in range(3)))
    masters = {}
    for kind in ("foreach", "fused"):
        tm = torch.from_numpy(w.copy())
        param = torch.from_numpy(wb.view(np.uint16).copy()).view(torch.bfloat16)
        optimizer = _torch_adamw(tm, torch.from_numpy(gb.astype(np.float32)), **{kind: True})
        masters[kind] = partial(_torch_master_step, optimizer, tm, param)
    outs = (np.empty_like(wb), *(np.empty_like(w) for _ in range(3)))
    t = timed({
        "tessera": partial(lib.adamw_master_tensors, wb, gb, m, v, w, LR, STEP, out=outs),
        "tessera_state": partial(lib.adamw_bf16, wb, gb, master, LR, STEP),
        "before": partial(_before_master, lib, gb, w, m, v, before_outs),
        "torch_foreach": masters["foreach"],
        "torch_fused": masters["fused"],
        "copy": lambda: np.copyto(copy_dst, w),
    }, args.runs)  # fmt: skip
    rows.append(_row("AdamW bf16 16M, f32 master state", t, 28 * N, w.nbytes))

    result = {
        "benchmark": "adamw",
        "machine": machine(load_before),
        "method": f"median of {args.runs} interleaved runs after one warm-up; before each "
                  "run a 200 ms pause, then one untimed call; of_copy_bandwidth is the 28 "
                  "bytes a parameter the step must move per second, over a numpy copy's "
                  "bytes per second; vs_* is the peer's time / tessera's (above 1: "
                  "faster); the machine is shared with other work (load_average: before "
                  "and after), so that every time is stretched and the ratios are those of "
                  "one run",
        "results": rows,
    }  # fmt: skip
    write_file(RESULTS, json.dumps(result, indent=2) + "\n")
    for row in rows:
        ms = {k: round(v * 1e3, 1) for k, v in row["seconds"].items() if v}
        print(f"{row['case']}: ms {ms}")
        print(f"  vs {row['vs']}, of copy bandwidth {row['of_copy_bandwidth']}")


def _row(case: str, t: dict, moved: int, copied: int) -> dict:
    """A result: the times, the ratios of the one-kernel step to the others, and the
    fraction of copy bandwidth each tessera step reaches."""
    ours = "tessera" if "tessera" in t else "tessera_state"
    peers: dict[str, float | None] = {
        f"{k}_vs_{ours}": ratio(t[k], t[ours]) for k in t if k not in (ours, "copy")
    }
    copy_rate = 2 * copied / t["copy"]
    return {
        "case": case,
        "seconds": t,
        "vs": peers,
        "of_copy_bandwidth": {k: round(moved / t[k] / copy_rate, 3)
                              for k in t if k.startswith("tessera") or k == "before"},
    }  # fmt: skip


if __name__ == "__main__":
    main()
