"""The OpenCL backend on PoCL: the SIMT lowering run for real, no GPU needed.

The kernels it lowers so far (elementwise and row reductions) run to the float64
reference, ragged sizes and rows wider than a work-group included; a kernel it
does not lower yet is an error that says so, at the function.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessera
from tessera.runtime.opencl import OpenclUnavailable, _queue

from .conftest import ROOT
from .reference import BF16, CASES, Case, check_case, f64, layernorm, rmsnorm, softmax


def _platform() -> str | None:
    """Why OpenCL code cannot run here, or None."""
    try:
        _queue()
    except OpenclUnavailable as exc:
        return str(exc)
    return None


pytestmark = [
    pytest.mark.execute,
    pytest.mark.skipif(_platform() is not None, reason=f"needs pyopencl and PoCL: {_platform()}"),
]

#: The files whose every kernel the OpenCL backend lowers so far.
LOWERED = ("examples/norms.tsr", "tessera/stdlib/fused_adam.tsr", "tessera/stdlib/layernorm.tsr",
           "tessera/stdlib/rmsnorm.tsr", "tessera/stdlib/softmax.tsr")  # fmt: skip
OPENCL_CASES = [c for c in CASES if c.path in LOWERED]


def test_every_lowered_file_has_cases() -> None:
    assert {c.path for c in OPENCL_CASES} == set(LOWERED)


@pytest.mark.parametrize("case", OPENCL_CASES, ids=[c.id for c in OPENCL_CASES])
def test_runs_to_the_float64_reference(case: Case) -> None:
    check_case(case, "opencl")


def test_rows_wider_than_a_work_group() -> None:
    """1029 columns: each thread strides along a row, the group combines the partials,
    and the last row block is ragged (37 rows in blocks of 4)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((37, 1029)) * 3).astype(np.float32)
    w, b = rng.standard_normal(1029).astype(np.float32), rng.standard_normal(1029).astype(
        np.float32
    )
    lib = tessera.compile_file(ROOT / "examples/norms.tsr", target="opencl").load()
    cases = {
        "row_softmax": (lib.row_softmax, (x,), softmax(f64(x)), np.float32),
        "rms": (lib.rms, (x, w), rmsnorm(x, w, 1e-6), np.float32),
        "pre_norm": (lib.pre_norm, (x.astype(BF16), w, b), layernorm(x.astype(BF16), w, b, 1e-5),
                     BF16),
    }  # fmt: skip
    for name, (fn, args, want, dtype) in cases.items():
        out = np.full(x.shape, np.nan).astype(dtype)
        fn(*args, out=out)
        error = np.abs(f64(out) - want).max() / np.abs(want).max()
        assert error < (1e-2 if dtype is BF16 else 1e-5), f"{name}: relative error {error:.2e}"


def test_a_kernel_not_lowered_yet_says_so_at_its_function() -> None:
    """Not a program error: the earlier stages still run and can be inspected."""
    program = tessera.compile_file(ROOT / "examples/mlp.tsr", target="opencl")
    assert "kernel @linear_gelu" in program.inspect_ir("tile")
    with pytest.raises(tessera.StageNotImplemented) as caught:
        program.inspect_ir("target")
    expected = (r"mlp.tsr:10:1: 'linear_gelu': the opencl backend lowers elementwise and "
                r"row-reduction kernels so far; this gemm kernel \(linear_gelu\) uses "
                r"'alloc'")  # fmt: skip
    assert re.search(expected, str(caught.value))


def test_the_source_is_self_contained_and_names_its_lines() -> None:
    source = tessera.compile_file(ROOT / "examples/norms.tsr", target="opencl").source
    assert "#include" not in source
    assert "inline float tsr_group_sum(" in source and "tsr_gelu" not in source
    assert "// norms.tsr" not in source  # library kernels name the library's lines
    assert "// layernorm.tsr:12: normed = centered * tile.rsqrt(variance + eps)[:, None]" in source
