"""What a numpy or PyTorch user writes for infinity and NaN works (``-inf``, ``nan``,
``float("-inf")``), and reaching for a module (``np.exp``, ``math.inf``) is an error
that gives the ``.tsr`` spelling, not "unknown name 'np'"."""

from __future__ import annotations

import numpy as np
import pytest

import tessera

from .test_autodiff import assert_one_error
from .test_cuda import needs_gxx

SOURCE = """\
def masked(x: Tensor["N", f32]) -> Tensor["N", f32]:
    return where(x > 0.5, -inf, x) + where(x < -1.0, float("-inf"), 0.0)

def poisoned(x: Tensor["N", f32]) -> Tensor["N", f32]:
    return where(x > 1.0, nan, x) + float("1e-3")

def shadowed(x: Tensor["N", f32], inf: float) -> Tensor["N", f32]:
    return minimum(x, inf)
"""


@needs_gxx
def test_infinity_and_nan_spelled_as_in_numpy() -> None:
    lib = tessera.compile(SOURCE, filename="spell.tsr", target="cpu").load()
    x = np.random.default_rng(3).standard_normal(45).astype(np.float32) * 2
    want = np.where(x > 0.5, -np.inf, x) + np.where(x < -1.0, -np.inf, 0.0)
    np.testing.assert_array_equal(lib.masked(x), want.astype(np.float32))
    got = lib.poisoned(x)
    np.testing.assert_array_equal(np.isnan(got), x > 1.0)
    np.testing.assert_allclose(got[x <= 1.0], x[x <= 1.0] + np.float32(1e-3), rtol=1e-6)
    # a parameter named inf is the parameter
    np.testing.assert_array_equal(lib.shadowed(x, 0.25), np.minimum(x, np.float32(0.25)))


BAD = {
    "numpy function": ("return np.exp(x)", "'np' is no module in a .tsr file: exp is a builtin"),
    "math constant": ("return x + math.inf", "'math' is no module in a .tsr file: write inf"),
    "torch function": ("return torch.relux(x)", "the ops Tessera has are builtins (docs/ops.md)"),
    "float of a word": ('return x + float("abc")', "float('abc') is not a number"),
    "gelu approximation": (
        'return gelu(x, approximate="exact")',
        'approximate is "tanh" (or True) or "none" (or False), not "exact"',
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_module_spellings_are_errors_that_say_what_to_write(case: str) -> None:
    body, message = BAD[case]
    source = f'def f(x: Tensor["N", f32]) -> Tensor["N", f32]:\n    {body}\n'
    assert_one_error(source, 2, message)
