"""``@stochastic_round`` (``docs/numerics.md``): each element rounds toward zero or away
from it by Philox4x32-10 on stream 1, counting its row-major place in the result, under
the seed. Checked bit for bit on every target against an emulation written from the
documented rule (float64, not the headers' integer steps), and for unbiasedness."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.transpiler.tile.interpret import run_function

from .everywhere import EVERY_TARGET, load_everywhere
from .reference import philox4x32
from .test_cuda import needs_gxx
from .test_numerics import COLUMNS, FP8, PROGRAM, _bits, _matrix, _narrowing_values, _run

#: Per format: its NumPy type, stored mantissa bits, smallest normal exponent, and the
#: kernel of ``tests/test_numerics.py`` that rounds to it.
FORMATS = {
    "bf16": (ml_dtypes.bfloat16, 7, -126, "sr_bf16"),
    "f16": (np.float16, 10, -14, "sr_f16"),
    "fp8_e4m3": (FP8["fp8_e4m3"], 3, -6, "sr_e4m3"),
    "fp8_e5m2": (FP8["fp8_e5m2"], 2, -14, "sr_e5m2"),
}


@functools.lru_cache(maxsize=8)
def draws(count: int, seed: int) -> np.ndarray:
    """The top 24 bits of Philox's first word for the counters ``(n, 0, 1, 0)``."""
    seed &= 2**64 - 1
    key = (seed & 0xFFFFFFFF, seed >> 32)
    words = [philox4x32((n & 0xFFFFFFFF, n >> 32, 1, 0), key)[0] >> 8 for n in range(count)]
    return np.array(words, dtype=np.float64)


def stochastic(x: np.ndarray, dtype: str, seed: int, saturate: bool = False) -> np.ndarray:
    """The documented rule, in float64: with q the format's spacing at |x| and f the
    fraction of q by which |x| passes the multiple of q below it, |x| goes up to the next
    multiple when draw / 2^24 < f; then the conversion to the format, which is exact but
    for overflow (clamped first with ``@saturate``)."""
    np_type, mantissa, emin, _ = FORMATS[dtype]
    wide = x.astype(np.float64).ravel()
    finite = np.isfinite(wide)
    magnitude = np.abs(np.where(finite, wide, 1.0))
    exponent = np.frexp(magnitude)[1] - 1  # floor(log2 |x|), and -1075 for 0
    q = np.ldexp(1.0, np.maximum(exponent, emin) - mantissa)
    below = np.floor(magnitude / q)
    up = draws(wide.size, seed) / 2**24 < magnitude / q - below
    rounded = np.where(finite, np.copysign((below + up) * q, wide), wide)
    if saturate:
        largest = float(ml_dtypes.finfo(np_type).max)
        rounded = np.clip(rounded, -largest, largest)
    with np.errstate(over="ignore"):
        return rounded.astype(np.float32).astype(np_type).reshape(x.shape)


def _values() -> np.ndarray:
    """The narrowing values of ``test_numerics`` (each fp8 value, midpoints and their
    neighbours, overflow, infinities, NaN), random values over many binades, and the
    subnormals of every format, f32's own included."""
    rng = np.random.default_rng(7)
    spread = rng.standard_normal(300) * np.exp2(rng.integers(-30, 30, 300))
    tiny = np.concatenate([np.exp2(rng.uniform(-149, -120, 40)), np.exp2(rng.uniform(-26, -5, 40))])
    values = np.concatenate([_narrowing_values(), spread, tiny, -tiny]).astype(np.float32)
    return values


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_stochastic_rounding_is_the_documented_rule_on_every_target(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each format (fp8_e4m3 with @saturate), with the seed a parameter, gives the
    emulation's bits; in a product's epilogue too (by the identity, so the sum is exact),
    where the place counts across the product's tiles."""
    lib = load_everywhere(PROGRAM, target, arch, monkeypatch)
    x = _matrix(_values())
    for dtype, (np_type, _, _, name) in FORMATS.items():
        seed = 2**40 + 9  # the key's high word too
        want = stochastic(x, dtype, seed, saturate=dtype == "fp8_e4m3")
        got = _run(getattr(lib, name), np_type, x, seed, shape=x.shape)
        if dtype == "f16":  # OpenCL writes an f16 NaN as PoCL's vstore_half does (0x7fff)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            got, want = (np.nan_to_num(a) for a in (got, want))
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=dtype)
    finite = np.nan_to_num(x[:70], posinf=1e30, neginf=-1e30)
    eye = np.eye(COLUMNS, dtype=np.float32)
    want = stochastic(finite + np.float32(0), "bf16", 5)  # a sum from +0 makes -0 +0
    got = _run(lib.sr_gemm, ml_dtypes.bfloat16, finite, eye)
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_the_interpreter_rounds_by_the_documented_rule() -> None:
    program = tessera.compile(PROGRAM, filename="program.tsr", target="cpu")
    x = _matrix(_values())
    for dtype, (_, _, _, name) in FORMATS.items():
        out = run_function(program.ir("tile"), name, {"x": x, "step": 11})["out"]
        want = stochastic(x, dtype, 11, saturate=dtype == "fp8_e4m3")
        got = np.asarray(out).astype(want.dtype)
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=dtype)


@needs_gxx
@pytest.mark.execute
def test_stochastic_rounding_is_unbiased_and_rounding_to_nearest_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over n elements, the mean rounding error in units of the spacing is 0 within five
    standard errors (a fraction f rounds up with probability f, so one element's error
    has variance f(1 - f)); to nearest, it is far off. Another seed draws other bits."""
    sr_bf16 = load_everywhere(PROGRAM, "cpu", None, monkeypatch).sr_bf16
    rng = np.random.default_rng(11)
    x = (1.0 + rng.uniform(0.0, 1.0, (400, 500))).astype(np.float32)  # one binade: q = 2^-7
    q = 2.0**-7
    fraction = x / q - np.floor(x / q)
    n = x.size
    tolerance = 5 * np.sqrt(np.mean(fraction * (1 - fraction)) / n)
    out = sr_bf16(x, 2024).astype(np.float64)
    assert abs(np.mean(out - x) / q) < tolerance
    up = (out > x).mean()
    assert abs(up - fraction.mean()) < 5 * np.sqrt(fraction.mean() * (1 - fraction.mean()) / n)
    nearest = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    biased = x + np.float32(0.3 * q) * (fraction < 0.5)  # fractions in [0.3, 0.8): skewed down
    assert abs(np.mean(nearest - x) / q) < tolerance  # nearest is unbiased on uniform data ...
    assert abs(np.mean(biased.astype(ml_dtypes.bfloat16).astype(np.float64) - biased) / q) > 10 * (
        tolerance
    )  # ... but not on skewed data, where stochastic rounding still is:
    assert abs(np.mean(sr_bf16(biased, 2024).astype(np.float64) - biased) / q) < 2 * tolerance
    agree = (sr_bf16(x, 2025) == out.astype(ml_dtypes.bfloat16)).mean()
    assert agree < 0.9
