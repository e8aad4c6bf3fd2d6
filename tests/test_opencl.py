"""The OpenCL backend on PoCL: the SIMT lowering run for real, no GPU needed.

Every example and library kernel (products through local memory, online softmax,
norms, rotary, optimizer steps) runs to the float64 reference, ragged sizes and
rows wider than a work-group included; a kernel it does not lower yet is an error
that says so, at the function.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.runtime.opencl import OpenclUnavailable, _queue

from .conftest import ROOT
from .helpers import (
    BRANCH_WITH_STATEMENTS,
    INTEGERS,
    ZERO_SIZES,
    check_integers,
    check_store_in_a_loop,
    check_zero_sizes,
)
from .reference import (
    BF16,
    CASES,
    FP8,
    Case,
    assert_rounded_once,
    assert_tf32_product,
    check_case,
    f64,
    layernorm,
    low_precision_product_source,
    rmsnorm,
    simulated,
    softmax,
)


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


@pytest.mark.parametrize("case", simulated(CASES))
def test_runs_to_the_float64_reference(case: Case) -> None:
    """Every example and library kernel: products, online softmax, norms, rotary."""
    check_case(case, "opencl")


@pytest.mark.parametrize("dtype", sorted(FP8))
def test_fp8_products_widen_exactly_and_round_once(dtype: str) -> None:
    """fp8 inputs widen exactly, products accumulate in f32, the result rounds once to
    fp8 (ragged: 37 x 45 x 29)."""
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((37, 45)) * 2).astype(FP8[dtype])
    b = (rng.standard_normal((45, 29)) * 2).astype(FP8[dtype])
    out = np.full((37, 29), np.nan).astype(FP8[dtype])
    tessera.compile(low_precision_product_source(dtype), target="opencl").load().f(a, b, out=out)
    assert_rounded_once(out, f64(a) @ f64(b))


def test_tf32_products_read_tf32_and_round_once() -> None:
    """tf32 tensors filled with f32s that are not tf32 values are read as tf32; the f32
    result rounds once to tf32 (ragged: 37 x 45 x 29)."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((37, 45)).astype(np.float32)
    b = rng.standard_normal((45, 29)).astype(np.float32)
    out = np.full((37, 29), np.nan, np.float32)
    tessera.compile(low_precision_product_source("tf32"), target="opencl").load().f(a, b, out=out)
    assert_tf32_product(out, a, b)


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


def test_a_kernel_not_lowered_yet_says_so_at_its_function(tmp_path: Path) -> None:
    """Not a program error: the earlier stages still run and can be inspected."""
    path = tmp_path / "branchy.tsr"
    path.write_text(BRANCH_WITH_STATEMENTS)
    program = tessera.compile_file(path, target="opencl")
    assert "kernel @normalize_if" in program.inspect_ir("tile")
    with pytest.raises(tessera.StageNotImplemented) as caught:
        program.inspect_ir("target")
    expected = (r"branchy.tsr:1:1: 'normalize_if': the opencl backend does not lower this tile "
                r"kernel \(normalize_if\) yet: it uses an 'if' whose branches compute more than "
                r"expressions")  # fmt: skip
    assert re.search(expected, str(caught.value))


def test_the_source_is_self_contained_and_names_its_lines() -> None:
    source = tessera.compile_file(ROOT / "examples/norms.tsr", target="opencl").source
    assert "#include" not in source
    assert "inline float tsr_group_sum(" in source and "tsr_gelu" not in source
    assert "// norms.tsr" not in source  # library kernels name the library's lines
    lines = (ROOT / "tessera/stdlib/layernorm.tsr").read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if "normed = centered" in text)
    assert f"// layernorm.tsr:{line}: {lines[line - 1].strip()}" in source


def test_a_loop_that_only_stores_runs() -> None:
    check_store_in_a_loop("opencl")


def test_integer_loads_stores_and_casts() -> None:
    check_integers(tessera.compile(INTEGERS, target="opencl").load())


def test_sizes_of_zero_run() -> None:
    """OpenCL has no empty buffers: an empty tensor's is a byte that nothing reads."""
    check_zero_sizes(tessera.compile(ZERO_SIZES, target="opencl").load())


@pytest.mark.parametrize("path", ["tessera/stdlib/pad.tsr", "examples/norms.tsr"])
def test_builds_warning_free(path: str) -> None:
    """PoCL's compiler with -Werror: OpenCL C names every parameter of a definition
    (pad's ``like``, which no statement reads, was left unnamed, a C2x extension)."""
    import pyopencl as cl

    program = tessera.compile_file(ROOT / path, target="opencl")
    options = [*program.ir("meta")["build"]["options"], "-Werror"]
    cl.Program(_queue().context, program.source).build(options=options)
