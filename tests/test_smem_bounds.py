"""Debug builds' bounds checks on shared memory (``target/smem_checks.py``): a product
that reads past the tile its shared buffer holds is caught at the staged load's line,
with the index and the tile's extent, on OpenCL (PoCL, operands read element by element)
and on the simulated GPU (CUDA's ``ldmatrix``); the same kernel, unbroken, runs clean.
The plain build has no checks: the golden files pin it."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.runtime.sentinel import BoundsError
from tessera.transpiler.graph.dims import Dim
from tessera.transpiler.graph.ir import Block
from tessera.transpiler.schedule.hardware import Hardware
from tessera.transpiler.tile import passes
from tessera.transpiler.tile.ir import TileKernel

from .gpusim import simulated_cupy, use_simulator
from .test_bounds import MATMUL, load_gpu, needs_opencl
from .test_cuda import needs_gxx

#: The product reads the rows of ``a``'s tile past the half that its buffer holds.
MESSAGE = re.compile(
    r"kernel 'mm' \(gemm\.tsr:14\): read of shared buffer 'a_tile_smem' out of bounds: "
    r"index (\d+) on axis 0, which has (\d+) elements"
)


def _halved(kernel: TileKernel, hw: Hardware) -> TileKernel:
    """The defect: ``a``'s reads take its shared buffer for one of half the rows it has
    (the copies, which the verifier checks against their tiles, fill it whole), and
    still give the whole tile."""
    buffer = next(op for op in kernel.body.ops if op.kind == "alloc").result
    rows, *rest = buffer.type.dims
    half = Dim.const(rows.constant // 2)
    smaller = replace(buffer, type=replace(buffer.type, dims=(half, *rest)))

    def block(b: Block) -> Block:
        ops = []
        for op in b.ops:
            if op.kind == "read" and op.operands[0].id == buffer.id:
                op = replace(op, operands=(smaller,))
            ops.append(replace(op, regions=tuple(block(r) for r in op.regions)))
        return replace(b, ops=tuple(ops))

    return replace(kernel, body=block(kernel.body))


def _compile(target: str, arch: str | None, dtype: str) -> Any:
    source = MATMUL.replace("bf16", dtype)
    return tessera.compile(source, "mm.tsr", target=target, arch=arch, debug=True)


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize(
    ("target", "arch", "dtype"),
    [
        pytest.param("opencl", None, "f32", marks=needs_opencl, id="opencl"),
        pytest.param("cuda", "sm_80", "bf16", id="cuda-ldmatrix", marks=pytest.mark.exhaustive),
        pytest.param("sycl", None, "f32", id="sycl", marks=pytest.mark.exhaustive),
    ],
)
def test_a_read_past_a_shared_tile_is_caught(
    target: str, arch: str | None, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ragged sizes (150 x 40 by 40 x 70), so that copies mask their edges."""
    use_simulator(monkeypatch, simulated_cupy("sm_80"))
    rng = np.random.default_rng(5)
    kind = ml_dtypes.bfloat16 if dtype == "bf16" else np.float32
    a = rng.standard_normal((150, 40)).astype(kind)
    b = rng.standard_normal((40, 70)).astype(kind)
    program = _compile(target, arch, dtype)
    assert "tsr_smem_index" in program.source
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(load_gpu(program).mm(a, b), want, rtol=1e-5, atol=1e-4)

    halved = (*passes.TILE_PASSES, passes.TilePass("defect", _halved))
    monkeypatch.setattr(passes, "TILE_PASSES", halved)
    with pytest.raises(BoundsError, match=MESSAGE.pattern) as caught:
        load_gpu(_compile(target, arch, dtype)).mm(a, b)
    found = MESSAGE.search(str(caught.value))
    assert found is not None
    index, extent = (int(v) for v in found.groups())
    assert extent <= index < 2 * extent
