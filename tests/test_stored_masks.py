"""A mask (a comparison) that one kernel computes and later kernels read: fusion keeps
it between them as the floats 1.0 and 0.0, and a kernel that reads it through a view (a
reshape) reads those floats too. The view had the mask's own type, which the CPU happens
to store as a float, but the GPU emitters and SYCL's host code have no storage for: they
stopped with an internal error."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from .everywhere import EVERY_TARGET, load_everywhere
from .reference import f64

pytestmark = pytest.mark.execute

SOURCE = """\
def largest_first(x: Tensor["N", "C", f32]) -> Tensor[f32]:
    m = x == max(x, axis=None)
    return min(where(m, x, 0.0), axis=None)

def column_peaks(x: Tensor["N", "C", f32]) -> Tensor["C", f32]:
    m = x >= max(x, axis=0)
    return sum(where(m, x, 0.0), axis=0) + sum(where(m, 1.0, 0.0), axis=0)

def positive_sum(x: Tensor["N", "C", f32]) -> Tensor[f32]:
    m = x.reshape(-1) > 0.0
    kept = where(m, x.reshape(-1), 0.0)
    return min(kept, axis=None) + sum(where(m, x.reshape(-1), 0.0), axis=None)
"""


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_a_mask_stored_between_kernels_is_read_back(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib: Any = load_everywhere(SOURCE, target, arch, monkeypatch)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((37, 53)).astype(np.float32)
    x[5, 7] = x.max() + 1.0  # one largest element, and columns with ties below
    x[:, 11] = 2.0
    top = x == x.max()
    np.testing.assert_array_equal(lib.largest_first(x), np.where(top, x, 0.0).min())
    peaks = x >= x.max(axis=0)
    want = np.where(peaks, f64(x), 0.0).sum(axis=0) + peaks.sum(axis=0)
    np.testing.assert_allclose(lib.column_peaks(x), want, rtol=1e-6)
    flat = x.reshape(-1)
    want = np.where(flat > 0, f64(flat), 0.0).sum()
    np.testing.assert_allclose(lib.positive_sum(x), want, rtol=1e-5)
