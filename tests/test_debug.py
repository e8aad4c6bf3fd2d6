"""Debug builds: each launch's NaN/Inf sentinel, at the user's line: on the CPU, on
OpenCL (PoCL), through the CUDA runtime and the ``--python-loader`` module on the
simulated GPU, and in a SYCL file's own host functions (which throw std::domain_error)
on the simulated GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.cli.main import main
from tessera.runtime.sentinel import NonFiniteError
from tessera.transpiler.graph.dtypes import DTYPES
from tessera.transpiler.tile.interpret import numpy_dtype

from .gpusim import load_sycl, simulated_cupy, use_simulator
from .test_cuda import needs_gxx
from .test_loader import _loader_module, assert_formatted
from .test_opencl import _platform

SOURCE = """\
@kernel
def f(x: Tensor["R", "C", f32], w: Tensor["C", "C", f32]) -> Tensor["R", "C", f32]:
    y = matmul(x, w)
    z = log(y)
    return softmax(z, axis=-1) * 2.0
"""


def test_a_debug_build_names_each_launch_and_what_it_writes() -> None:
    plain = tessera.compile(SOURCE, "dbg.tsr", target="opencl").ir("meta")
    assert "debug" not in plain and all(
        "sentinel" not in launch for f in plain["functions"] for launch in f["launches"]
    )
    meta = tessera.compile(SOURCE, "dbg.tsr", target="opencl", debug=True).ir("meta")
    assert meta["debug"] is True
    sentinels = [launch["sentinel"] for launch in meta["functions"][0]["launches"]]
    assert sentinels == [
        {"line": "dbg.tsr:3", "writes": [{"name": "z", "dtype": "f32"}]},
        {"line": "dbg.tsr:5", "writes": [{"name": "out", "dtype": "f32"}]},
    ]


def test_the_debug_switch(tmp_path, capsys) -> None:
    path = tmp_path / "dbg.tsr"
    path.write_text(SOURCE)
    assert main([str(path), "--target", "opencl", "--emit", "meta", "--debug"]) == 0
    assert json.loads(capsys.readouterr().out)["debug"] is True


def _load(target: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    if target == "opencl" and _platform() is not None:
        pytest.skip(f"needs pyopencl and PoCL: {_platform()}")
    if target == "cuda":
        use_simulator(monkeypatch, simulated_cupy("sm_80"))
    program = tessera.compile(SOURCE, "dbg.tsr", target=target, debug=True)
    return load_sycl(program) if target == "sycl" else program.load()


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize("target", ["cpu", "opencl", "cuda", "sycl"])
def test_the_first_kernel_to_write_nan_is_named(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = _load(target, monkeypatch)
    rng = np.random.default_rng(7)
    x = rng.uniform(0.5, 1.5, (5, 37)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, (37, 37)).astype(np.float32)
    z = np.log(x.astype(np.float64) @ w)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(lib.f(x, w), 2 * e / e.sum(axis=-1, keepdims=True), rtol=1e-4)
    w[:, 3] = -1.0  # column 3 of the product is negative: its log is NaN
    with pytest.raises(NonFiniteError, match=r"kernel 'f_k0' \(dbg\.tsr:3\) wrote nan to 'z' "
                       r"at flat index 3 \(5 non-finite values\)"):  # fmt: skip
        lib.f(x, w)
    w[:, 3] = 1.0  # the failure was that call's alone
    assert np.isfinite(lib.f(x, w)).all()


#: A bf16 result, whose sentinel reads the bits the loader holds as uint16.
BF16 = """\
@kernel
def g(x: Tensor["R", "C", bf16]) -> Tensor["R", "C", bf16]:
    return log(x)
"""


@pytest.mark.execute
@needs_gxx
def test_the_python_loader_of_a_debug_build_names_the_first_kernel_to_write_nan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``--python-loader`` module, which a project runs without Tessera, checks what
    each launch wrote, intermediates included, and raises its own ``NonFiniteError`` (a
    ``FloatingPointError``) with the runtime's text; a bf16 result is checked from its
    bits."""
    cupy = simulated_cupy("sm_80")
    use_simulator(monkeypatch, cupy)
    program = tessera.compile(SOURCE + "\n\n" + BF16, "dbg.tsr", target="cuda", debug=True)
    module = _loader_module(program, tmp_path, cupy, monkeypatch)
    assert_formatted(tmp_path / "k_loader.py")
    rng = np.random.default_rng(7)
    x = rng.uniform(0.5, 1.5, (5, 37)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, (37, 37)).astype(np.float32)
    assert np.isfinite(module.f(cupy.asarray(x), cupy.asarray(w)).get()).all()
    w[:, 3] = -1.0
    with pytest.raises(FloatingPointError, match=r"kernel 'f_k0' \(dbg\.tsr:3\) wrote nan to "
                       r"'z' at flat index 3 \(5 non-finite values\)") as caught:  # fmt: skip
        module.f(cupy.asarray(x), cupy.asarray(w))
    assert type(caught.value).__name__ == "NonFiniteError"
    h = rng.uniform(0.5, 1.5, (3, 11)).astype(ml_dtypes.bfloat16)
    assert np.isfinite(module.g(cupy.asarray(h.view(np.uint16))).get().view(h.dtype)).all()
    h[2, 4] = 0.0  # log(0) = -inf
    with pytest.raises(FloatingPointError, match=r"wrote -inf to 'out' at flat index 26 \(1 "):
        module.g(cupy.asarray(h.view(np.uint16)))


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3", "fp8_e5m2", "f16", "f32"])
def test_the_loaders_sentinel_reads_each_float_format(
    dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader's view of a tensor's bytes is non-finite exactly where ml_dtypes says
    the stored values are, for every float format."""
    program = tessera.compile(SOURCE, "dbg.tsr", target="cuda", debug=True)
    module = _loader_module(program, tmp_path, simulated_cupy("sm_80"), monkeypatch)
    kind = numpy_dtype(DTYPES[dtype])
    every = np.arange(256, dtype=np.uint8) if np.dtype(kind).itemsize == 1 else None
    rng = np.random.default_rng(11)
    values = (
        every.view(kind)
        if every is not None
        else np.concatenate([rng.standard_normal(64) * 1e3, [np.nan, np.inf, -np.inf]]).astype(kind)
    )
    seen = module._as_floats(values.view(np.uint8), dtype)
    np.testing.assert_array_equal(np.isfinite(seen), np.isfinite(values))
