"""A GPT block's training step as a PyTorch user writes it: nanoGPT's layers (``split``,
``view``, ``transpose``, ``masked_fill`` of ``tril(ones(T, T))``, layernorm, GELU, the
residuals) ending in ``cross_entropy`` of integer targets, and ``value_and_grad`` over
four of its weights. The loss and gradients against PyTorch autograd in float64, and the
gradient against a central difference of the compiled loss itself."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from .everywhere import built_everywhere

torch = pytest.importorskip("torch")
F = torch.nn.functional

SOURCE = """\
def block_loss(x: Tensor["B", "T", "C", f32], ln1_w: Tensor["C", f32], ln1_b: Tensor["C", f32],
               w_qkv: Tensor["C", "3*C", f32], w_o: Tensor["C", "C", f32],
               ln2_w: Tensor["C", f32], ln2_b: Tensor["C", f32],
               w_fc: Tensor["C", "4*C", f32], w_proj: Tensor["4*C", "C", f32],
               w_head: Tensor["C", "V", f32], targets: Tensor["B", "T", i32],
               n_head: int) -> Tensor[f32]:
    B, T, C = x.shape
    h = layernorm(x, ln1_w, ln1_b)
    q, k, v = (h @ w_qkv).split(C, dim=2)
    q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
    k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
    v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / sqrt(C // n_head))
    att = att.masked_fill(tril(ones(T, T)) == 0, float("-inf"))
    y = (softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    x = x + y @ w_o
    x = x + gelu(layernorm(x, ln2_w, ln2_b) @ w_fc, approximate="none") @ w_proj
    logits = x @ w_head
    return cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))

def train_step(x: Tensor["B", "T", "C", f32], ln1_w: Tensor["C", f32], ln1_b: Tensor["C", f32],
               w_qkv: Tensor["C", "3*C", f32], w_o: Tensor["C", "C", f32],
               ln2_w: Tensor["C", f32], ln2_b: Tensor["C", f32],
               w_fc: Tensor["C", "4*C", f32], w_proj: Tensor["4*C", "C", f32],
               w_head: Tensor["C", "V", f32], targets: Tensor["B", "T", i32], n_head: int
               ) -> tuple[Tensor[f32], Tensor["C", "3*C", f32], Tensor["C", "C", f32],
                          Tensor["C", f32], Tensor["C", "4*C", f32]]:
    wrt = ("w_qkv", "w_o", "ln2_w", "w_fc")
    loss, (g_qkv, g_o, g_ln2, g_fc) = value_and_grad(block_loss, wrt=wrt)(
        x, ln1_w, ln1_b, w_qkv, w_o, ln2_w, ln2_b, w_fc, w_proj, w_head, targets, n_head)
    return loss, g_qkv, g_o, g_ln2, g_fc
"""

built = built_everywhere(SOURCE, "cpu", "opencl")
#: Batch, steps, width, vocabulary and heads: none a multiple of a tile.
B, T, C, V, HEADS = 2, 7, 12, 11, 3
WRT = ("w_qkv", "w_o", "ln2_w", "w_fc")


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)

    def r(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return dict(
        x=r(B, T, C, scale=1.0), ln1_w=1 + r(C), ln1_b=r(C), w_qkv=r(C, 3 * C), w_o=r(C, C),
        ln2_w=1 + r(C), ln2_b=r(C), w_fc=r(C, 4 * C), w_proj=r(4 * C, C), w_head=r(C, V),
        targets=rng.integers(0, V, (B, T)).astype(np.int32),
    )  # fmt: skip


def _torch_loss(x, ln1_w, ln1_b, w_qkv, w_o, ln2_w, ln2_b, w_fc, w_proj, w_head, targets):
    h = F.layer_norm(x, (C,), ln1_w, ln1_b, eps=1e-5)
    q, k, v = ((a.view(B, T, HEADS, -1).transpose(1, 2)) for a in (h @ w_qkv).split(C, dim=2))
    att = (q @ k.transpose(-2, -1)) / (C // HEADS) ** 0.5
    att = att.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf")).softmax(-1)
    x = x + (att @ v).transpose(1, 2).reshape(B, T, C) @ w_o
    x = x + F.gelu(F.layer_norm(x, (C,), ln2_w, ln2_b, eps=1e-5) @ w_fc) @ w_proj
    return F.cross_entropy((x @ w_head).reshape(B * T, -1), targets.reshape(B * T).long())


def test_the_step_matches_pytorch_autograd(built: Any) -> None:
    inputs = _inputs()
    loss, *grads = built.train_step(*inputs.values(), HEADS)
    wide = {k: torch.tensor(v, dtype=torch.float64 if v.dtype == np.float32 else torch.int64)
            for k, v in inputs.items()}  # fmt: skip
    for name in WRT:
        wide[name].requires_grad_(True)
    want = _torch_loss(**wide)
    want_grads = torch.autograd.grad(want, [wide[n] for n in WRT])
    np.testing.assert_allclose(float(np.asarray(loss)), want.item(), rtol=1e-5)
    for name, have, expected in zip(WRT, grads, want_grads, strict=True):
        np.testing.assert_allclose(
            np.asarray(have), expected.numpy(), rtol=1e-4, atol=2e-6, err_msg=name
        )


def test_the_gradient_is_the_losss_slope(built: Any) -> None:
    """Along a random direction, the gradient of ``w_fc`` predicts the compiled loss's
    central difference (f32 arithmetic: a step of 1e-2 and a tolerance to match)."""
    inputs = _inputs()
    _, _, _, _, g_fc = built.train_step(*inputs.values(), HEADS)
    direction = np.random.default_rng(8).standard_normal(inputs["w_fc"].shape)
    direction = (direction / np.linalg.norm(direction)).astype(np.float32)
    step = 1e-2

    def loss_at(t: float) -> float:
        moved = inputs | {"w_fc": inputs["w_fc"] + np.float32(t) * direction}
        return float(np.asarray(built.block_loss(*moved.values(), HEADS)))

    slope = (loss_at(step) - loss_at(-step)) / (2 * step)
    predicted = float(np.sum(np.asarray(g_fc, np.float64) * direction))
    assert abs(slope - predicted) <= 2e-3 * max(1.0, abs(predicted)), (slope, predicted)
