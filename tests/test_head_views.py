"""Products of heads split from a projection's columns (``(x @ w).reshape(B, S, H, E // H)``
moved to ``[B, H, S, E/H]``), as hand-written multi-head attention has them: each head is
read in place, a block of the projection's rows. A head that is not a whole number of
16-byte chunks wide (a head dim of 3 or 5 floats) ended inside a chunk, and the GPU
kernels' whole-chunk copies took the next head's first columns with it; the 64-lane
product on gfx90a then summed them into the scores."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from .everywhere import every_target_beyond, load_everywhere
from .reference import f64

pytestmark = pytest.mark.execute

SOURCE = """\
def scores(x: Tensor["B", "S", "E", f32], wq: Tensor["E", "E", f32],
           wk: Tensor["E", "E", f32]) -> Tensor["B", 4, "S", "S", f32]:
    B, S, E = x.shape
    q = (x @ wq).reshape(B, S, 4, E // 4).transpose(0, 2, 1, 3)
    k = (x @ wk).reshape(B, S, 4, E // 4).transpose(0, 2, 1, 3)
    return q @ k.transpose(0, 1, 3, 2)

def attention(x: Tensor["B", "S", "E", f32], wq: Tensor["E", "E", f32],
              wk: Tensor["E", "E", f32], wv: Tensor["E", "E", f32]) -> Tensor["B", "S", "E", f32]:
    B, S, E = x.shape
    q = (x @ wq).reshape(B, S, 4, E // 4).transpose(0, 2, 1, 3)
    k = (x @ wk).reshape(B, S, 4, E // 4).transpose(0, 2, 1, 3)
    v = (x @ wv).reshape(B, S, 4, E // 4).transpose(0, 2, 1, 3)
    p = softmax(q @ k.transpose(0, 1, 3, 2) / sqrt(float(E // 4)), axis=-1)
    return (p @ v).transpose(0, 2, 1, 3).reshape(B, S, E)
"""


def _heads(t: np.ndarray) -> np.ndarray:
    b, s, e = t.shape
    return t.reshape(b, s, 4, e // 4).transpose(0, 2, 1, 3)


@pytest.mark.parametrize(
    ("target", "arch"), every_target_beyond("cpu", "opencl", "sm_80", "gfx90a")
)
@pytest.mark.parametrize("head_dim", [3, 5, 8])
def test_products_of_split_heads(
    target: str, arch: str | None, head_dim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib: Any = load_everywhere(SOURCE, target, arch, monkeypatch)
    rng = np.random.default_rng(head_dim)
    b, s, e = 2, 7, 4 * head_dim
    x, wq, wk, wv = (rng.standard_normal(shape).astype(np.float32) * 0.5
                     for shape in ((b, s, e), (e, e), (e, e), (e, e)))  # fmt: skip
    q, k, v = (_heads(f64(x) @ w) for w in (wq, wk, wv))
    want = q @ k.transpose(0, 1, 3, 2)
    poison = np.full(want.shape, np.nan, np.float32)
    np.testing.assert_allclose(lib.scores(x, wq, wk, out=poison), want, rtol=1e-5, atol=1e-5)
    p = np.exp(want / np.sqrt(head_dim) - (want / np.sqrt(head_dim)).max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = (p @ v).transpose(0, 2, 1, 3).reshape(b, s, e)
    np.testing.assert_allclose(lib.attention(x, wq, wk, wv), want, rtol=1e-4, atol=1e-5)
