"""``@accum(bf16)`` and ``@accum(f16)`` (``docs/numerics.md``): a product's running sum is
rounded to the 16-bit dtype after each term, k ascending, on every target. Checked bit for
bit against a NumPy emulation of that order on the CPU, OpenCL and the simulated GPUs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from .everywhere import EVERY_TARGET, load_everywhere
from .test_numerics import PROGRAM, _bits, _run

FORMATS = {"acc_bf16": ml_dtypes.bfloat16, "acc_f16": np.float16}


def accumulated(a: np.ndarray, b: np.ndarray, np_type: type) -> np.ndarray:
    """``a @ b`` summed k = 0, 1, ... with each step ``s = dtype(f32(s + a[:, k] b[k]))``:
    the product is exact in f32, the sum rounded to f32, then to the dtype."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    s = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        s = (s + a32[:, k, None] * b32[None, k, :]).astype(np_type).astype(np.float32)
    return s.astype(np_type)


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_a_product_accumulates_in_its_16_bit_dtype_in_k_order_everywhere(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K spans several of every target's K blocks and is a multiple of none; the result
    differs from an f32 sum rounded once in most elements, so the order is what the test
    checks."""
    lib = load_everywhere(PROGRAM, target, arch, monkeypatch)
    rng = np.random.default_rng(16)
    for name, np_type in FORMATS.items():
        a = rng.uniform(0.5, 1.5, (9, 601)).astype(np_type)
        b = rng.uniform(0.5, 1.5, (601, 7)).astype(np_type)
        want = accumulated(a, b, np_type)
        got = _run(getattr(lib, name), np_type, a, b)
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=name)
        once = (a.astype(np.float64) @ b.astype(np.float64)).astype(np_type)
        assert (_bits(once) != _bits(want)).mean() > 0.5
