"""Library kernels over operands of rank 3 and 4: the leading axes are a batch.

A transformer's activations are ``[B, S, C]`` and its attention scores ``[B, H, S, S]``;
the library's kernels are written for one matrix (``[M, K] @ [K, N]``, rows of ``[R, C]``)
and take such operands with one program-grid axis per leading dim. The kernels read the
reduction length as the operand's last axis: a batched matmul read its second
(``M``), and did not compile; a softmax, layernorm or rmsnorm over a rank-3 tensor
stopped the compiler. Each case runs on every backend against the float64 reference,
at sizes that are not multiples of the tiles, outputs poisoned first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera

from .reference import f64, softmax
from .test_cuda import ARCHS, _nvcc, needs_gxx, needs_nvcc
from .test_gpusim import _library
from .test_hip import _hipcc_warning_free, needs_hipcc
from .test_opencl import _platform

SOURCE = """\
@kernel
def bmm(a: Tensor["B", "M", "K", f32], b: Tensor["B", "K", "N", f32],
        bias: Tensor["N", f32]) -> Tensor["B", "M", "N", f32]:
    return a @ b + bias

@kernel
def bmm_bf16(a: Tensor["B", "M", "K", bf16],
             b: Tensor["B", "K", "N", bf16]) -> Tensor["B", "M", "N", f32]:
    return a @ b

@kernel
def scores_softmax(x: Tensor["B", "H", "S", "T", f32]) -> Tensor["B", "H", "S", "T", f32]:
    return softmax(x, axis=-1)

@kernel
def layer_norm(x: Tensor["B", "S", "C", f32], w: Tensor["C", f32],
               b: Tensor["C", f32]) -> Tensor["B", "S", "C", f32]:
    return layernorm(x, w, b, eps=1e-5)

@kernel
def rms_norm(x: Tensor["B", "S", "C", f32], w: Tensor["C", f32]) -> Tensor["B", "S", "C", f32]:
    return rmsnorm(x, w, eps=1e-6) * 0.5
"""

TARGETS = [("cpu", None), ("opencl", None), ("cuda", "sm_80"), ("cuda", "sm_90a"),
           ("hip", "gfx90a")]  # fmt: skip


@pytest.mark.compile
@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_with_nvcc_warning_free(arch: str, tmp_path: Path) -> None:
    _nvcc("batched.tsr", arch, tmp_path, text=SOURCE)


@pytest.mark.compile
@needs_hipcc
def test_compiles_with_hipcc_warning_free(tmp_path: Path) -> None:
    _hipcc_warning_free(tessera.compile(SOURCE, "batched.tsr", target="hip").source, tmp_path)


@pytest.fixture(scope="module", params=TARGETS, ids=[f"{t}-{a}" if a else t for t, a in TARGETS])
def library(request: pytest.FixtureRequest) -> Any:
    """The functions on a backend, CUDA and HIP on the simulated GPU; host functions
    write into arrays of NaNs (the simulated GPU poisons the arrays it allocates)."""
    target, arch = request.param
    if target == "opencl" and _platform() is not None:
        pytest.skip(f"needs pyopencl and PoCL: {_platform()}")
    with pytest.MonkeyPatch.context() as monkeypatch:
        functions = _library(SOURCE, target, arch, monkeypatch)
        yield functions if target in ("cuda", "hip") else _Poisoned(functions)


class _Poisoned:
    def __init__(self, functions: Any) -> None:
        self.functions = functions

    def __getattr__(self, name: str) -> Any:
        def call(*args: np.ndarray) -> np.ndarray:
            a = args[0]
            shape = (*a.shape[:-1], args[1].shape[-1]) if name.startswith("bmm") else a.shape
            out = np.full(shape, np.nan, dtype=np.float32)
            getattr(self.functions, name)(*args, out=out)
            return out

        return call


@pytest.mark.execute
@needs_gxx
def test_batched_matmul_with_a_bias(library: Any) -> None:
    rng = np.random.default_rng(21)
    a = rng.standard_normal((3, 37, 150), dtype=np.float32)
    b = rng.standard_normal((3, 150, 29), dtype=np.float32)
    bias = rng.standard_normal(29, dtype=np.float32)
    out = f64(library.bmm(a, b, bias))
    np.testing.assert_allclose(out, f64(a) @ f64(b) + f64(bias), rtol=1e-4, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_batched_bf16_matmul(library: Any) -> None:
    rng = np.random.default_rng(22)
    a = rng.standard_normal((2, 70, 45)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((2, 45, 33)).astype(ml_dtypes.bfloat16)
    out = f64(library.bmm_bf16(a, b))
    np.testing.assert_allclose(out, f64(a) @ f64(b), rtol=1e-4, atol=1e-3)


@pytest.mark.execute
@needs_gxx
def test_softmax_over_attention_scores(library: Any) -> None:
    x = np.random.default_rng(23).standard_normal((2, 3, 19, 45), dtype=np.float32) * 4
    np.testing.assert_allclose(f64(library.scores_softmax(x)), softmax(f64(x)), atol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_layernorm_over_a_batch_of_sequences(library: Any) -> None:
    rng = np.random.default_rng(24)
    x = rng.standard_normal((3, 21, 53), dtype=np.float32)
    w, b = rng.standard_normal((2, 53), dtype=np.float32)
    mean, var = f64(x).mean(-1, keepdims=True), f64(x).var(-1, keepdims=True)
    want = (f64(x) - mean) / np.sqrt(var + 1e-5) * f64(w) + f64(b)
    np.testing.assert_allclose(f64(library.layer_norm(x, w, b)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_rmsnorm_over_a_batch_of_sequences(library: Any) -> None:
    rng = np.random.default_rng(25)
    x = rng.standard_normal((3, 21, 53), dtype=np.float32)
    w = rng.standard_normal(53, dtype=np.float32)
    want = 0.5 * f64(x) / np.sqrt((f64(x) ** 2).mean(-1, keepdims=True) + 1e-6) * f64(w)
    np.testing.assert_allclose(f64(library.rms_norm(x, w)), want, rtol=1e-5, atol=1e-5)
