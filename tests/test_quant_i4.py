"""Packed ``i4`` tensors (``docs/numerics.md``): ``quantize`` to i4 and ``dequantize``
from it, per column and per group, with zero points, bit for bit against a NumPy
emulation on every target; the packing (element ``2j`` in the low nibble of byte ``j``);
and the mistakes, at the user's line or at the call."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.transpiler.frontend.diagnostics import CompileError

from .conftest import ROOT
from .everywhere import EVERY_TARGET, load_everywhere
from .gpusim import simulated_cupy, simulated_driver, use_simulator
from .test_cuda import needs_gxx
from .test_loader import _loader_module
from .test_numerics import GROUP, PROGRAM, _run

#: K is a multiple of the group size, N an even size that is not a multiple of any tile.
K, N = 24, 38


def pack(q: np.ndarray) -> np.ndarray:
    """Values in [-8, 7] packed two to a byte: element ``2j`` of a row in the low nibble
    of byte ``j``, element ``2j + 1`` in the high nibble."""
    nibbles = q.astype(np.uint8) & 15
    return nibbles[..., 0::2] | nibbles[..., 1::2] << 4


def unpack(packed: np.ndarray) -> np.ndarray:
    """``pack``'s inverse: the values, as int8."""
    nibbles = np.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    return (nibbles.astype(np.int8) ^ 8) - 8


def quantized(w: np.ndarray, scale: np.ndarray, zero: np.ndarray | None = None) -> np.ndarray:
    """The emulation, in f32: ``round(w * (1 / scale)) + zero``, saturated to [-8, 7]."""
    q = np.rint(w * (np.float32(1) / scale)) + (0 if zero is None else zero)
    return np.clip(q, -8, 7).astype(np.int8)


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_i4_quantize_and_dequantize_are_bit_identical_everywhere(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = load_everywhere(PROGRAM, target, arch, monkeypatch)
    rng = np.random.default_rng(4)
    w = rng.standard_normal((K, N)).astype(np.float32)
    w[0, :4] = [1e6, -1e6, 2.5, -3.5]  # saturate; ties go to even
    group = (rng.random((K // GROUP, N)) * 0.2 + 0.1).astype(np.float32)
    zero = rng.integers(-3, 4, (K // GROUP, N)).astype(np.float32)
    per_row = np.repeat(group, GROUP, axis=0), np.repeat(zero, GROUP, axis=0)
    want = quantized(w, *per_row)
    assert len(np.unique(want)) == 16, "the weights use the range"
    packed = _run(lib.i4_per_group, np.uint8, w, group, zero, shape=(K, N // 2))
    np.testing.assert_array_equal(unpack(packed), want)
    np.testing.assert_array_equal(packed, pack(want))

    back = (want.astype(np.float32) - per_row[1]) * per_row[0]
    have = _run(lib.i4_back_per_group, np.float32, packed, group, zero, shape=(K, N))
    np.testing.assert_array_equal(have, back)

    column = (np.abs(w[1:]).max(axis=0) / 7).astype(np.float32)
    want = quantized(w, column)
    packed = _run(lib.i4_per_column, np.uint8, w, column, shape=(K, N // 2))
    np.testing.assert_array_equal(packed, pack(want))
    back = (want.astype(np.float32) * column).astype(ml_dtypes.bfloat16)
    have = _run(lib.i4_back_per_column, back.dtype, packed, column, shape=(K, N))
    np.testing.assert_array_equal(have.view(np.uint16), back.view(np.uint16))


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_w4a16_matches_dequantize_then_multiply(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``examples/quant_linear.tsr``: a weight quantized per group of 32 rows by
    ``quantize_i4``, and ``w4a16``, which unpacks it and dequantizes each group to bf16
    in the product's main loop, against float64 NumPy of the same bf16 weight at ragged
    M and N."""
    source = (ROOT / "examples" / "quant_linear.tsr").read_text(encoding="utf-8")
    lib = load_everywhere(source, target, arch, monkeypatch)
    rng = np.random.default_rng(16)
    m, k, n = 37, 160, 78  # K: five groups; M and N: no multiple of a tile
    w = rng.standard_normal((k, n)).astype(np.float32)
    scale = (np.abs(w).reshape(k // 32, 32, n).max(axis=1) / 7).astype(np.float32)
    packed = _run(lib.quantize_i4, np.uint8, w, scale, shape=(k, n // 2))
    q = quantized(w, np.repeat(scale, 32, axis=0))
    np.testing.assert_array_equal(packed, pack(q))
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    weight = (q * np.repeat(scale, 32, axis=0)).astype(ml_dtypes.bfloat16)
    want = x.astype(np.float64) @ weight.astype(np.float64)
    have = _run(lib.w4a16, np.float32, x, packed, scale, shape=(m, n))
    np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@needs_gxx
def test_the_cupy_loader_passes_i4_tensors_as_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CuPy loader of ``examples/quant_linear.tsr`` on the simulated GPU: an i4
    result is allocated and an i4 argument checked as ``uint8`` bytes of half the last
    dim, and its N is bound from them."""
    cupy = simulated_cupy("sm_80")
    use_simulator(monkeypatch, cupy)
    program = tessera.compile_file("examples/quant_linear.tsr", target="cuda", arch="sm_80")
    module = _loader_module(program, tmp_path, cupy, monkeypatch, driver=simulated_driver())
    rng = np.random.default_rng(2)
    m, k, n = 5, 64, 38
    w = rng.standard_normal((k, n)).astype(np.float32)
    scale = (np.abs(w).reshape(k // 32, 32, n).max(axis=1) / 7).astype(np.float32)
    packed = module.quantize_i4(cupy.asarray(w), cupy.asarray(scale))
    np.testing.assert_array_equal(packed.get(), pack(quantized(w, np.repeat(scale, 32, axis=0))))
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    have = module.w4a16(cupy.asarray(x.view(np.uint16)), packed, cupy.asarray(scale)).get()
    weight = (unpack(packed.get()) * np.repeat(scale, 32, axis=0)).astype(ml_dtypes.bfloat16)
    want = x.astype(np.float64) @ weight.astype(np.float64)
    np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    with pytest.raises(ValueError, match="bytes of two"):
        module.quantize_i4(cupy.asarray(w), cupy.asarray(scale),
                           out=cupy.asarray(np.zeros((k, n), np.uint8)))  # fmt: skip


def test_packing_round_trips() -> None:
    q = np.arange(-8, 8, dtype=np.int8).reshape(2, 8)
    assert pack(q)[0, 0] == 0x9 << 4 | 0x8  # -8 low, -7 high
    np.testing.assert_array_equal(unpack(pack(q)), q)


def test_an_i4_array_of_the_wrong_width_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lib = load_everywhere(PROGRAM, "cpu", None, monkeypatch)  # the build the test above made
    w, s = np.ones((K, N), np.float32), np.ones(N, np.float32)
    with pytest.raises(ValueError, match=r"dim N should be 38 elements, two to a byte"):
        lib.i4_per_column(w, s, out=np.zeros((K, N), np.uint8))  # N bytes hold 2N elements
    with pytest.raises(TypeError, match="numpy uint8"):
        lib.i4_back_per_column(np.zeros((K, N // 2), np.int8), s)
    with pytest.raises(ValueError, match="is i4, two to a byte: its last dim is even"):
        lib.i4_per_column(np.ones((K, N - 1), np.float32), s[:-1])  # odd: a half-byte row


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ('Tensor[12, 7, i4]', "2:21: error: an i4 tensor packs its last dim two to a byte: "
         "it must be even, not 7"),
        ('Tensor[i4]', "2:10: error: an i4 tensor packs its last dim two to a byte: it needs one"),
    ],
)  # fmt: skip
def test_an_odd_last_dim_is_an_error_at_its_line(param: str, message: str) -> None:
    source = f"@kernel\ndef f(q: {param}) -> Tensor[12, 8, f32]:\n    return q\n"
    with pytest.raises(CompileError) as info:
        tessera.compile(source, filename="q.tsr", target="cpu")
    assert str(info.value).startswith(f"q.tsr:{message}"), str(info.value)
