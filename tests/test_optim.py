"""``fused_adam``: AdamW steps against ``torch.optim.AdamW``, step for step. The graph op
in a training step (loss, gradients and the update in one compiled function) on the CPU
and on OpenCL; the standard library's in-place tile kernel on the CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from .conftest import ROOT
from .everywhere import EVERY_TARGET, load_everywhere
from .test_autodiff import assert_one_error, built_unoptimized
from .test_cuda import needs_gxx

torch = pytest.importorskip("torch")

#: Ragged sizes, several steps, a weight decay large enough to matter.
R, D, C, STEPS, LR, DECAY = 37, 19, 23, 5, 0.02, 0.1

TRAIN = """\
def loss(x: Tensor["R", "D", f32], w: Tensor["D", "C", f32], b: Tensor["C", f32],
         t: Tensor["R", "C", f32]) -> Tensor[f32]:
    return mean(tanh(x @ w + b) * t, axis=None)

def train_step(x: Tensor["R", "D", f32], w: Tensor["D", "C", f32], b: Tensor["C", f32],
               t: Tensor["R", "C", f32], mw: Tensor["D", "C", f32], vw: Tensor["D", "C", f32],
               mb: Tensor["C", f32], vb: Tensor["C", f32], lr: float, step: int
               ) -> tuple[Tensor[f32], Tensor["D", "C", f32], Tensor["C", f32],
                          Tensor["D", "C", f32], Tensor["D", "C", f32], Tensor["C", f32],
                          Tensor["C", f32]]:
    value, (dw, db) = value_and_grad(loss, wrt=("w", "b"))(x, w, b, t)
    w, mw, vw = fused_adam(w, dw, mw, vw, lr=lr, step=step, weight_decay=0.1)
    b, mb, vb = fused_adam(b, db, mb, vb, lr=lr, step=step, beta1=0.8, eps=1e-6)
    return value, w, b, mw, vw, mb, vb
"""


def _torch_steps(x: np.ndarray, w: np.ndarray, b: np.ndarray, t: np.ndarray) -> list[Any]:
    """The same steps with torch.optim.AdamW in float64: per step, the loss and the
    parameters and moments after it."""
    tw, tb = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (w, b))
    tx, tt = (torch.tensor(v, dtype=torch.float64) for v in (x, t))
    optimizers = (torch.optim.AdamW([tw], lr=LR, weight_decay=DECAY),
                  torch.optim.AdamW([tb], lr=LR, betas=(0.8, 0.999), eps=1e-6,
                                    weight_decay=0.0))  # fmt: skip
    steps = []
    for _ in range(STEPS):
        for o in optimizers:
            o.zero_grad()
        value = (torch.tanh(tx @ tw + tb) * tt).mean()
        value.backward()
        for o in optimizers:
            o.step()
        moments = [optimizers[i].state[p][k] for i, p in ((0, tw), (1, tb))
                   for k in ("exp_avg", "exp_avg_sq")]  # fmt: skip
        steps.append([value, tw, tb, *moments])
        steps[-1] = [v.detach().numpy().copy() for v in steps[-1]]
    return steps


@pytest.mark.parametrize(("target", "arch"), [p for p in EVERY_TARGET if p.id in ("cpu", "opencl")])
def test_a_training_step_with_adamw_matches_torch(
    target: str,
    arch: str | None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    rng = np.random.default_rng(0)
    x, w, b, t = (rng.standard_normal(s).astype(np.float32)
                  for s in ((R, D), (D, C), (C,), (R, C)))  # fmt: skip
    expected = _torch_steps(x, w, b, t)
    if target == "cpu":
        built = built_unoptimized(TRAIN, tmp_path_factory)
    else:
        built = load_everywhere(TRAIN, target, arch, monkeypatch)
    step_fn = built.train_step
    state = [w, b, *(np.zeros_like(v) for v in (w, w, b, b))]
    for step, want in enumerate(expected, start=1):
        value, *state = step_fn(x, state[0], state[1], t, state[2], state[3], state[4],
                                state[5], LR, step)  # fmt: skip
        np.testing.assert_allclose(value, want[0], rtol=1e-5, atol=1e-6)
        for have, ref in zip(state, want[1:], strict=True):
            np.testing.assert_allclose(have, ref, rtol=1e-4, atol=1e-6)


@needs_gxx
def test_the_library_kernel_takes_adamw_steps_in_place(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``tessera/stdlib/fused_adam.tsr``: one kernel that updates the parameter and both
    moments in place, against torch's AdamW for several steps of random gradients."""
    lib = built_unoptimized(ROOT / "tessera/stdlib/fused_adam.tsr", tmp_path_factory)
    rng = np.random.default_rng(1)
    param = rng.standard_normal(1031).astype(np.float32)
    m, v = np.zeros_like(param), np.zeros_like(param)
    tp = torch.tensor(param, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.AdamW([tp], lr=LR, weight_decay=DECAY)
    for step in range(1, STEPS + 1):
        grad = rng.standard_normal(param.shape).astype(np.float32)
        lib.fused_adam(param, grad, m, v, lr=LR, step=step, weight_decay=DECAY)
        tp.grad = torch.tensor(grad, dtype=torch.float64)
        optimizer.step()
        state = optimizer.state[tp]
        np.testing.assert_allclose(param, tp.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m, state["exp_avg"].numpy(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(v, state["exp_avg_sq"].numpy(), rtol=1e-5, atol=1e-7)


BAD = {
    "grad shape": (
        "def f(p: Tensor['N', f32], g: Tensor['M', f32]) -> Tensor['N', f32]:\n"
        "    q, m, v = fused_adam(p, g, p, p, lr=0.1, step=1)\n    return q\n",
        "fused_adam: 'grad' must have param's type",
    ),
    "integer param": (
        "def f(p: Tensor['N', i32]) -> Tensor['N', i32]:\n"
        "    q, m, v = fused_adam(p, p, p, p, lr=0.1, step=1)\n    return q\n",
        "fused_adam: 'param' must be a float tensor",
    ),
    "step not an int": (
        "def f(p: Tensor['N', f32]) -> Tensor['N', f32]:\n"
        "    q, m, v = fused_adam(p, p, p, p, lr=0.1, step=1.5)\n    return q\n",
        "fused_adam: 'step' must be",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_wrong_call_is_an_error_at_its_line(case: str) -> None:
    source, message = BAD[case]
    assert_one_error(source, 2, message)
