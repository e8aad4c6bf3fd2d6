"""The CPU backend's W4A16 product (``tsr::mma_i4``, ``docs/cpu-backend.md``): a packed
i4 weight that a tile kernel widens, scales by a row of scales and rounds before a product
is dequantized inside the product, a panel of columns at a time, with the same bits as the
program that dequantizes the whole block first, at ragged sizes (a last panel narrower
than the rest, a second column tile), for either operand order of the scaling and for a
weight rounded to bf16 or f16, with scales computed in the loop (which stay stored for
the product to read), and with zero points subtracted before the scale."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.transpiler.target import cpu_kernel

from .test_cuda import needs_gxx
from .test_numerics import _run
from .test_quant_i4 import pack, unpack

#: ``w4a16`` of ``examples/quant_linear.tsr``; a variant with f16 activations that puts the
#: scale first, so that both orders of the scaling are seen; one with a scale per row,
#: computed from the loaded scales, a tile of the block's shape that could be inlined; one
#: with a zero point per column for each group, subtracted before the scale; and one with a
#: zero point and a scale per column over K blocks of the schedule's, past whose last row
#: the zero point would leave the masked rows nonzero (the product reads none of them).
SOURCE = """
@kernel
def w4a16(x: Tensor["M", "K", bf16], w: Tensor["K", "N", i4],
          scale: Tensor["K/32", "N", f32]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(x.shape[-1], 32):
        a = tile.load(x, rows=T.m, cols=kb)
        s = tile.load(scale, kb, cols=T.n)
        b = tile.cast(tile.cast(tile.load(w, kb, cols=T.n), f32) * s, bf16)
        acc += tile.dot(a, b)
    return acc


@kernel
def w4a16_f16(x: Tensor["M", "K", f16], w: Tensor["K", "N", i4],
              scale: Tensor["K/32", "N", f32]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(x.shape[-1], 32):
        a = tile.load(x, rows=T.m, cols=kb)
        s = tile.load(scale, kb, cols=T.n)
        b = tile.cast(s * tile.cast(tile.load(w, kb, cols=T.n), f32), f16)
        acc += tile.dot(a, b)
    return acc


@kernel
def w4a16_by_row(x: Tensor["M", "K", bf16], w: Tensor["K", "N", i4],
                 scale: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(x.shape[-1], 1):
        a = tile.load(x, rows=T.m, cols=kb)
        s = tile.load(scale, kb, cols=T.n) * 0.5
        b = tile.cast(tile.cast(tile.load(w, kb, cols=T.n), f32) * s, bf16)
        acc += tile.dot(a, b)
    return acc


@kernel
def w4a16_zero(x: Tensor["M", "K", bf16], w: Tensor["K", "N", i4],
               scale: Tensor["K/32", "N", f32]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(x.shape[-1], 32):
        a = tile.load(x, rows=T.m, cols=kb)
        s = tile.load(scale, kb, cols=T.n)
        z = tile.round(s * 100.0) - 3.0
        b = tile.cast((tile.cast(tile.load(w, kb, cols=T.n), f32) - z) * s, bf16)
        acc += tile.dot(a, b)
    return acc


@kernel
def w4a16_zero_columns(x: Tensor["M", "K", bf16], w: Tensor["K", "N", i4],
                       scale: Tensor["N", f32]) -> Tensor["M", "N", f32]:
    T = tile.context()
    s = tile.load(scale, cols=T.n)[None, :]
    z = tile.round(s * 100.0) - 3.0
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(x.shape[-1], T.k):
        a = tile.load(x, rows=T.m, cols=kb)
        b = tile.cast((tile.cast(tile.load(w, kb, cols=T.n), f32) - z) * s, bf16)
        acc += tile.dot(a, b)
    return acc
"""


@needs_gxx
def test_the_product_dequantizes_with_the_bits_of_the_staged_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fused = tessera.compile(SOURCE, filename="quant.tsr", target="cpu")
    with monkeypatch.context() as patch:  # the same program, each step emitted alone
        patch.setattr(cpu_kernel, "dequantized_operands", lambda ops, uses: {})
        staged = tessera.compile(SOURCE, filename="quant.tsr", target="cpu")
    assert fused.source.count("tsr::mma_i4(") == 5, "every kernel dequantizes in the product"
    assert "tsr::mma_i4" not in staged.source
    fused_lib, staged_lib = fused.load(), staged.load()
    rng = np.random.default_rng(39)
    kernels = (("w4a16", ml_dtypes.bfloat16, 32, 1.0), ("w4a16_f16", np.float16, 32, 1.0),
               ("w4a16_by_row", ml_dtypes.bfloat16, 1, 0.5),
               ("w4a16_zero", ml_dtypes.bfloat16, 32, 1.0),
               ("w4a16_zero_columns", ml_dtypes.bfloat16, None, 1.0))  # fmt: skip
    # Up to kRows (6 or 8) rows the weight is dequantized in registers, one row block
    # over each whole panel; more rows, or a ragged last panel, go through a panel in
    # memory. Panels of 16 or 32 columns: 14, 2 and 12 columns left (or 14, 2, 12).
    for m, k, n in ((1, 64, 78), (5, 96, 130), (37, 160, 300)):
        packed = pack(rng.integers(-8, 8, (k, n)))
        for name, dtype, group, factor in kernels:
            shape = (k // group, n) if group else (n,)
            scale = (rng.random(shape) * 0.1 + 0.01).astype(np.float32)
            x = rng.standard_normal((m, k)).astype(dtype)
            have = _run(getattr(fused_lib, name), np.float32, x, packed, scale, shape=(m, n))
            want = _run(getattr(staged_lib, name), np.float32, x, packed, scale, shape=(m, n))
            np.testing.assert_array_equal(have.view(np.uint32), want.view(np.uint32))
            scales = np.repeat(scale * np.float32(factor), group or 1, axis=0)
            zeros = np.rint(scales * np.float32(100)) - 3 if "zero" in name else 0
            weight = ((unpack(packed).astype(np.float32) - zeros) * scales).astype(dtype)
            exact = x.astype(np.float64) @ weight.astype(np.float64)
            np.testing.assert_allclose(have, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())
