"""``@loss_scale(k)`` (``docs/numerics.md``): the backward pass runs on ``k`` times the
cotangent and the gradients are divided by ``k``, so they are the loss's own (against
PyTorch); a scale that overflows the backward pass gives gradients that ``all_finite``
flags, and a training step that reads it keeps its parameters."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from .test_autodiff import built_unoptimized
from .test_cuda import needs_gxx

torch = pytest.importorskip("torch")

#: 2^126: the cotangents of ``huge`` overflow f32 in the backward pass.
HUGE = 2.0**126

SOURCE = f"""\
@jit @autodiff
def scaled(x: Tensor["N", "D", f32], w: Tensor["D", "C", f32]) -> Tensor[f32 @loss_scale(1024)]:
    return sum(tanh(x @ w), axis=None)

@jit @autodiff
def huge(x: Tensor["N", "D", f32], w: Tensor["D", "C", f32]) -> Tensor[f32 @loss_scale({HUGE!r})]:
    return sum(tanh(x @ w), axis=None)

@jit
def step(x: Tensor["N", "D", f32], w: Tensor["D", "C", f32], lr: float) -> Tensor["D", "C", f32]:
    dw = grad(scaled, wrt="w")(x, w)
    return where(all_finite(dw) == 1.0, w - lr * dw, w)

@jit
def huge_step(x: Tensor["N", "D", f32], w: Tensor["D", "C", f32],
              lr: float) -> Tensor["D", "C", f32]:
    dw = grad(huge, wrt="w")(x, w)
    return where(all_finite(dw) == 1.0, w - lr * dw, w)

@jit
def finite(g: Tensor["N", "D", bf16]) -> Tensor[1, f32]:
    return all_finite(g)
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return built_unoptimized(SOURCE, tmp_path_factory)


def _inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random x and w of sizes that are multiples of no tile."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((23, 19)).astype(np.float32),
            rng.standard_normal((19, 11)).astype(np.float32))  # fmt: skip


def _torch_grads(x: np.ndarray, w: np.ndarray) -> tuple[Any, Any]:
    """The gradients of the loss, in float64, as PyTorch's autograd takes them."""
    tx, tw = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, w))
    torch.tanh(tx @ tw).sum().backward()
    return tx.grad.numpy(), tw.grad.numpy()


@needs_gxx
@pytest.mark.execute
def test_loss_scaled_gradients_are_the_losss_own_and_overflow_shows(lib: Any) -> None:
    x, w = _inputs(38)
    want_x, want_w = _torch_grads(x, w)
    dx, dw = lib.scaled_vjp(x, w, np.float32(1.0))
    np.testing.assert_allclose(dx, want_x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, want_w, rtol=1e-5, atol=1e-5)
    assert np.isclose(lib.scaled(x, w), np.tanh(x.astype(np.float64) @ w).sum(), rtol=1e-5)
    # 2^126 times a cotangent above 4 is past f32's largest: only a backward pass run on
    # the scaled cotangents overflows, and dividing keeps the infinity
    dx, dw = lib.huge_vjp(x, w, np.float32(1.0))
    assert not np.isfinite(dx).all() and not np.isfinite(dw).all()
    assert np.isfinite(lib.huge(x, w))


@needs_gxx
@pytest.mark.execute
def test_a_training_step_skips_the_update_whose_gradients_overflowed(lib: Any) -> None:
    x, w = _inputs(39)
    _, want_w = _torch_grads(x, w)
    np.testing.assert_allclose(lib.step(x, w, 0.1), w - 0.1 * want_w, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(lib.huge_step(x, w, 0.1), w)


@needs_gxx
@pytest.mark.execute
@pytest.mark.parametrize("bad", [None, np.inf, -np.inf, np.nan])
def test_all_finite_flags_an_infinity_or_nan_anywhere(lib: Any, bad: float | None) -> None:
    g = np.random.default_rng(5).standard_normal((29, 37)).astype(ml_dtypes.bfloat16)
    if bad is not None:
        g[17, 31] = bad
    np.testing.assert_array_equal(lib.finite(g), [1.0 if bad is None else 0.0])
