"""An f32 master copy of a bf16 parameter (``@fp32_master``'s optimizer state): AdamW
updates the master and both f32 moments and writes the parameter as the master rounded
to bf16; as the graph op (``fused_adam(..., master=)``) and as the standard library's
one-pass kernel (``fused_adam_master``), against ``torch.optim.AdamW`` step for step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from .conftest import ROOT
from .test_autodiff import assert_one_error, built_unoptimized
from .test_cuda import needs_gxx

torch = pytest.importorskip("torch")

#: A size that is a multiple of no tile, several steps, a decay large enough to matter.
N, STEPS, LR, DECAY = 1031, 4, 0.02, 0.1

SOURCE = """\
@jit
def master_step(w: Tensor["N", bf16], g: Tensor["N", bf16], master: Tensor["N", f32],
                m: Tensor["N", f32], v: Tensor["N", f32], lr: float, step: int
                ) -> tuple[Tensor["N", bf16], Tensor["N", f32], Tensor["N", f32],
                           Tensor["N", f32]]:
    return fused_adam(w, g, m, v, lr=lr, step=step, weight_decay=0.1, master=master)
"""


def _torch_steps(master: np.ndarray, grads: list[np.ndarray]) -> Iterator[list[np.ndarray]]:
    """AdamW in float64 on the master, with the bf16 gradients: per step, the master and
    the moments after it."""
    tp = torch.tensor(master, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.AdamW([tp], lr=LR, weight_decay=DECAY)
    for grad in grads:
        tp.grad = torch.tensor(grad.astype(np.float64))
        optimizer.step()
        state = optimizer.state[tp]
        yield [t.detach().numpy().copy() for t in (tp, state["exp_avg"], state["exp_avg_sq"])]


def _check(step: Callable[..., Any]) -> None:
    """``step(param, grad, master, m, v, step)`` returns the four updated arrays."""
    rng = np.random.default_rng(4)
    master = rng.standard_normal(N).astype(np.float32)
    param = master.astype(ml_dtypes.bfloat16)
    m, v = np.zeros_like(master), np.zeros_like(master)
    grads = [rng.standard_normal(N).astype(ml_dtypes.bfloat16) for _ in range(STEPS)]
    for i, (grad, want) in enumerate(zip(grads, _torch_steps(master, grads), strict=True)):
        param, master, m, v = step(param, grad, master, m, v, i + 1)
        for have, ref in zip((master, m, v), want, strict=True):
            np.testing.assert_allclose(have, ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(param, master.astype(ml_dtypes.bfloat16))


@needs_gxx
def test_the_graph_op_updates_an_f32_master_and_writes_the_bf16_parameter(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    lib = built_unoptimized(SOURCE, tmp_path_factory)
    _check(lambda p, g, w, m, v, step: lib.master_step(p, g, w, m, v, LR, step))


@needs_gxx
def test_the_library_kernel_updates_all_four_in_one_pass_in_place(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    lib = built_unoptimized(ROOT / "tessera/stdlib/fused_adam_master.tsr", tmp_path_factory)

    def step(p: Any, g: Any, w: Any, m: Any, v: Any, count: int) -> tuple[Any, ...]:
        lib.fused_adam_master(p, g, w, m, v, lr=LR, step=count, weight_decay=DECAY)
        return p, w, m, v

    _check(step)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(p: Tensor['N', bf16], w: Tensor['N', bf16]) -> Tensor['N', bf16]:\n"
         "    q, w, m, v = fused_adam(p, p, w, w, lr=0.1, step=1, master=w)\n    return q\n",
         "fused_adam: 'master' must be the f32 copy of param (p is [N], in f32)"),
        ("def f(p: Tensor['N', f32]) -> Tensor['N', f32]:\n"
         "    q, w, m, v = fused_adam(p, p, p, p, lr=0.1, step=1, master=p)\n    return q\n",
         "fused_adam: master= keeps an f32 copy of a narrower param"),
        ("def f(p: Tensor['N', bf16], w: Tensor['N', f32]) -> Tensor['N', bf16]:\n"
         "    q, w, m, v = fused_adam(p, p, p, w, lr=0.1, step=1, master=w)\n    return q\n",
         "fused_adam: 'exp_avg' must have master's type"),
    ],
)  # fmt: skip
def test_a_wrong_master_is_an_error_at_its_line(source: str, message: str) -> None:
    assert_one_error(source, 2, message)
