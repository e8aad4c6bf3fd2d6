"""``quantize`` and ``dequantize`` (``docs/numerics.md``): per tensor, per column and per
group of rows, with and without zero points, to i8 and fp8, bit for bit against a
NumPy emulation on every target; and their mistakes, at the user's line or at the
call."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.transpiler.frontend.diagnostics import CompileError

from .conftest import ROOT
from .everywhere import EVERY_TARGET, load_everywhere
from .test_numerics import FP8, GROUP, PROGRAM, _bits, _run

#: K is a multiple of the group size, N is not a multiple of any tile.
K, N = 24, 13


def _per_group(a: np.ndarray) -> np.ndarray:
    """A per-group array repeated over the rows of its group."""
    return np.repeat(a, GROUP, axis=0)


def quantized(w: np.ndarray, scale: np.ndarray, dtype: str, zero: np.ndarray | None = None):
    """The emulation: ``round(w * (1 / scale)) + zero`` saturated into i8, or
    ``w * (1 / scale)`` saturated into fp8, all in f32."""
    scaled = w * (np.float32(1) / scale)
    if dtype != "i8":
        largest = float(ml_dtypes.finfo(FP8[dtype]).max)
        return np.clip(scaled, -largest, largest).astype(FP8[dtype])
    q = np.rint(scaled) + (0 if zero is None else zero)
    return np.clip(q, -128, 127).astype(np.int8)


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_quantize_and_dequantize_are_bit_identical_everywhere(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = load_everywhere(PROGRAM, target, arch, monkeypatch)
    rng = np.random.default_rng(39)
    w = (rng.standard_normal((K, N)) * 4).astype(np.float32)
    w[0, :4] = [1e6, -1e6, 2.5, -3.5]  # saturates; ties go to even
    one = np.array([0.5], np.float32)
    want = quantized(w, one, "i8")
    np.testing.assert_array_equal(_run(lib.per_tensor, np.int8, w, one, shape=w.shape), want)

    column = (rng.random(N) * 0.02 + 0.005).astype(np.float32)
    want = quantized(w, column, "fp8_e4m3")
    np.testing.assert_array_equal(_bits(_run(lib.per_column, want.dtype, w, column)), _bits(want))

    group = (rng.random((K // GROUP, N)) * 0.05 + 0.01).astype(np.float32)
    zero = rng.integers(-8, 8, (K // GROUP, N)).astype(np.float32)
    q = quantized(w, _per_group(group), "i8", _per_group(zero))
    assert len(np.unique(q)) > 100, "the weights use the range"
    np.testing.assert_array_equal(_run(lib.per_group, np.int8, w, group, zero), q)
    want = quantized(w, _per_group(group), "fp8_e5m2")
    np.testing.assert_array_equal(
        _bits(_run(lib.per_group_e5m2, want.dtype, w, group)), _bits(want)
    )

    want = (q.astype(np.float32) - _per_group(zero)) * _per_group(group)
    np.testing.assert_array_equal(_run(lib.back_per_group, np.float32, q, group, zero), want)
    e4m3 = quantized(w, column, "fp8_e4m3")
    want = (e4m3.astype(np.float32) * column).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(
        _bits(_run(lib.back_per_column, want.dtype, e4m3, column)), _bits(want)
    )


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_quantized_linear_layers_match_dequantize_then_multiply(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``examples/quant_linear.tsr``: weights quantized per column by the example's own
    function, multiplied in the main loop (``w8a16``) and, per group, through
    ``dequantize`` (``linear_per_group``), against float64 NumPy at ragged sizes."""
    source = (ROOT / "examples" / "quant_linear.tsr").read_text(encoding="utf-8")
    lib = load_everywhere(source, target, arch, monkeypatch)
    rng = np.random.default_rng(8)
    m, k, n = 37, 160, 77  # K: several K blocks on every target, and a ragged last one
    w = rng.standard_normal((k, n)).astype(np.float32)
    scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    q = _run(lib.quantize_weights, np.int8, w, scale, shape=w.shape)
    np.testing.assert_array_equal(q, quantized(w, scale, "i8"))
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    want = x.astype(np.float64) @ (q.astype(np.float64) * scale)
    have = _run(lib.w8a16, np.float32, x, q, scale)
    np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())

    group = (rng.random((k // 32, n)) * 0.02 + 0.005).astype(np.float32)
    weight = (q.astype(np.float32) * np.repeat(group, 32, axis=0)).astype(ml_dtypes.bfloat16)
    want = x.astype(np.float64) @ weight.astype(np.float64)
    have = _run(lib.linear_per_group, np.float32, x, q, group)
    np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_w8a8_sums_exactly_as_integers(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``examples/quant_linear.tsr``'s ``w8a8``: the int8 product's sum is exact past
    2^24 (where an f32 accumulator would round), rounded once to f32, then scaled per
    row and per column, bit for bit against NumPy's int64 sum."""
    source = (ROOT / "examples" / "quant_linear.tsr").read_text(encoding="utf-8")
    lib = load_everywhere(source, target, arch, monkeypatch)
    rng = np.random.default_rng(88)
    m, k, n = 37, 1400, 77  # K: 22 blocks of 64 with a ragged last one; M, N: ragged
    x = rng.integers(-128, 128, (m, k)).astype(np.int8)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    x[:2], w[:, :2] = rng.integers(118, 128, (2, k)), rng.integers(118, 128, (k, 2))
    x[1] = -x[1]  # sums past 2^24 of both signs, the last bits all kinds
    x_scale = (rng.random((m, 1)) * 0.01).astype(np.float32)
    w_scale = (rng.random(n) * 0.01).astype(np.float32)
    total = x.astype(np.int64) @ w.astype(np.int64)
    assert ((np.abs(total) > 2**24) & (total % 2 == 1)).sum() >= 2, "sums an f32 cannot hold"
    want = total.astype(np.float32) * x_scale * w_scale
    np.testing.assert_array_equal(_run(lib.w8a8, np.float32, x, w, x_scale, w_scale), want)


def test_a_scale_of_the_wrong_length_is_a_clear_error_at_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = (ROOT / "examples" / "quant_linear.tsr").read_text(encoding="utf-8")
    lib = load_everywhere(source, "cpu", None, monkeypatch)  # the build the test above made
    x = np.ones((4, 64), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="N"):
        lib.w8a16(x, np.ones((64, 8), np.int8), np.ones(9, np.float32))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("quantize(w, s, i8, group=5)", "5:34: error: quantize: group 5 does not divide the "
         "12 rows of w"),
        ("quantize(w, s, i8, group=4)", "5:21: error: quantize: with group=4, scale must be "
         "[3, 8] (one per column for each 4 rows), but s is [8]"),
        ("dequantize(q, s, group=4)", "5:23: error: dequantize: with group=4, scale must be "
         "[3, 8] (one per column for each 4 rows), but s is [8]"),
        ("quantize(w, r, i8)", "5:9: error: quantize: shapes do not broadcast: w is [12, 8], "
         "r is [12]"),
        ("quantize(w, s, fp8_e4m3, zero_point=s)", "5:45: error: quantize: a zero point "
         "applies to i8 and i4, not to fp8 dtypes"),
        ("quantize(w, s, bf16)", "5:24: error: quantize: quantizes to i8, i4, "
         "fp8_e4m3, fp8_e5m2, not bf16"),
        ("dequantize(w, s)", "5:20: error: dequantize: dequantizes i8, i4, fp8_e4m3, "
         "fp8_e5m2 tensors; w is f32"),
    ],
)  # fmt: skip
def test_mistakes_are_errors_at_their_line(body: str, message: str) -> None:
    source = (
        "@kernel\n"
        "def f(w: Tensor[12, 8, f32], q: Tensor[12, 8, i8], s: Tensor[8, f32],\n"
        "      r: Tensor[12, f32]) -> Tensor[12, 8, f32]:\n"
        "    y = w\n"
        f"    y = {body}\n"
        "    return w\n"
    )
    with pytest.raises(CompileError) as info:
        tessera.compile(source, filename="q.tsr", target="cpu")
    assert str(info.value).startswith(f"q.tsr:{message}"), str(info.value)


def test_a_group_that_does_not_divide_k_at_run_time_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lib = load_everywhere(PROGRAM, "cpu", None, monkeypatch)
    w = np.ones((K + 2, N), np.float32)
    group = np.ones(((K + 2) // GROUP, N), np.float32)
    with pytest.raises(ValueError, match="K/4 is not a whole number"):
        lib.per_group_e5m2(w, group)
