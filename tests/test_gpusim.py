"""GPU kernels at edge sizes, on the simulated GPU of ``tests/gpusim``.

The reference cases take one ragged size per function. Here a product and attention
run at the sizes where tiling goes wrong first: one element, exactly one tile, one
past a tile, a head dim under the tile's, a sequence shorter than a key block, for
CUDA on both archs and for HIP. Outputs are poisoned first; the reference is float64
on the same bf16 inputs.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.runtime import cuda as cuda_runtime

from .gpusim import load_hip, simulated_cupy
from .reference import attention, f64
from .test_cuda import needs_gxx

pytestmark = [pytest.mark.execute, needs_gxx]

TARGETS = [("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", "gfx90a")]

GEMM = """\
@kernel
def mm(A: Tensor["M", "K", bf16], B: Tensor["K", "N", bf16]) -> Tensor["M", "N", f32]:
    return A @ B
"""


def _attention_source(causal: bool) -> str:
    return f"""\
@kernel
def attn(q: Tensor["BH", "S", "D", bf16], k: Tensor["BH", "S", "D", bf16],
         v: Tensor["BH", "S", "D", bf16]) -> Tensor["BH", "S", "D", bf16]:
    return ops.flash_attention(q, k, v, causal={causal})
"""


def _function(source: str, target: str, arch: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The source's one function, built for ``target`` and run on the simulated GPU."""
    monkeypatch.setattr(cuda_runtime, "_cupy", lambda: simulated_cupy(arch))
    program = tessera.compile(source, filename="edge.tsr", target=target, arch=arch)
    library = load_hip(program) if target == "hip" else program.load()
    (name,) = (f["name"] for f in program.ir("meta")["functions"])
    return getattr(library, name)


def _bf16(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)


def _check(have: np.ndarray, want: np.ndarray, rtol: float) -> None:
    have = f64(have)
    assert not np.isnan(have).any(), "some outputs were never written"
    error = np.abs(have - want).max() / max(np.abs(want).max(), 1e-30)
    assert error < rtol, f"relative error {error:.2e}"


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a for _, a in TARGETS])
@pytest.mark.parametrize(
    ("m", "n", "k"), [(1, 1, 1), (16, 8, 16), (33, 65, 17), (128, 128, 64), (129, 257, 80)]
)
def test_products_at_edge_sizes(
    m: int, n: int, k: int, target: str, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mm = _function(GEMM, target, arch, monkeypatch)
    rng = np.random.default_rng(m * n * k)
    a, b = _bf16(rng, m, k), _bf16(rng, k, n)
    out = np.full((m, n), np.nan, np.float32)
    mm(a, b, out=out)
    _check(out, f64(a) @ f64(b), 1e-5)


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a for _, a in TARGETS])
@pytest.mark.parametrize(
    ("bh", "s", "d", "causal"),
    [(1, 1, 64, True), (2, 17, 64, False), (1, 128, 128, True), (1, 200, 96, False),
     (1, 130, 32, True)],
)  # fmt: skip
def test_attention_at_edge_sizes(
    bh: int, s: int, d: int, causal: bool, target: str, arch: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    attn = _function(_attention_source(causal), target, arch, monkeypatch)
    rng = np.random.default_rng(bh * s * d)
    q, k, v = (_bf16(rng, bh, s, d) for _ in range(3))
    out = np.full((bh, s, d), np.nan, np.float32).astype(ml_dtypes.bfloat16)
    attn(q, k, v, out=out)
    _check(out, attention(q, k, v, causal), 2e-2)
