"""An ``int`` parameter in a shape is the size of its name, as the number of heads is
in model code: ``x.reshape(B, S, heads, E // heads)``. The call gives its value; a value
that does not divide ``E`` is refused before any kernel runs, on every target and on
both of the CPU's call paths (positional arguments take the C entry's)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from .everywhere import every_target_beyond, load_everywhere

pytestmark = pytest.mark.execute

SOURCE = """\
def split_heads(x: Tensor["B", "S", "E", f32], *,
                heads: int) -> Tensor["B", "heads", "S", "E/heads", f32]:
    B, S, E = x.shape
    return x.reshape(B, S, heads, E // heads).transpose(0, 2, 1, 3)

def head_sums(x: Tensor["S", "E", f32], h: int) -> Tensor["h", "S", f32]:
    S, E = x.shape
    return sum(x.reshape(S, h, E // h).transpose(1, 0, 2) * 2.0, axis=-1)
"""


@pytest.mark.parametrize(("target", "arch"), every_target_beyond("cpu", "opencl", "sm_80"))
def test_an_int_parameter_sizes_a_shape(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib: Any = load_everywhere(SOURCE, target, arch, monkeypatch)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 7, 12)).astype(np.float32)
    for heads in (1, 3, 4, 12):
        want = x.reshape(2, 7, heads, 12 // heads).transpose(0, 2, 1, 3)
        np.testing.assert_array_equal(lib.split_heads(x, heads=heads), want)
    rows = x[0]
    for h in (2, 6, 2):  # the positional call, again with a size it had before
        want = (rows.astype(np.float64).reshape(7, h, 12 // h).transpose(1, 0, 2) * 2).sum(-1)
        np.testing.assert_allclose(lib.head_sums(rows, h), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"E % heads == 0 with heads = 5"):
        lib.split_heads(x, heads=5)
    with pytest.raises(ValueError, match=r"h = 5"):
        lib.head_sums(rows, 5)
