"""Ahead-of-time bundles: ``tesserac bundle`` writes the same bytes twice, and
``tessera.load_bundle`` runs the CPU part without compiling anything."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.cli.main import main
from tessera.packs import read_pack
from tessera.runtime.bundle import BundleError, load_bundle
from tessera.runtime.c_abi import cpu_module
from tessera.runtime.kernel_yaml import load
from tessera.transpiler import pipeline
from tessera.transpiler.target.kernel_records import kernel_records

from .test_c_abi import AXPY
from .test_cuda import needs_gxx, needs_nvrtc


def _bundle(source: Path, output: Path, *options: str) -> None:
    assert main(["bundle", str(source), *options, "-o", str(output)]) == 0


@pytest.mark.execute
@needs_gxx
def test_a_bundle_is_reproducible_and_runs_without_the_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "axpy.tsr"  # test_c_abi's module: its build is shared
    source.write_text(AXPY)
    for name in ("a.tsrpkg", "b.tsrpkg", "a.tar.gz"):
        _bundle(source, tmp_path / name)
    files = read_pack(tmp_path / "a.tsrpkg")
    assert files == read_pack(tmp_path / "b.tsrpkg") == read_pack(tmp_path / "a.tar.gz")
    program = tessera.compile(AXPY, "axpy.tsr", target="cpu")
    want_kernels = kernel_records(program.ir("tile"), program.ir("meta"))
    image = tmp_path / "a.tsrpkg" / "cpu" / "axpy.so"
    assert image.read_bytes() == cpu_module(program).read_bytes()  # what tsr.h loads

    def no_compiler(*_: object, **__: object) -> None:
        raise AssertionError("a bundle loads without compiling")

    monkeypatch.setattr(pipeline.Program, "__init__", no_compiler)
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++, and so no C calls after warm-up
    rng = np.random.default_rng(11)
    x, y = rng.standard_normal((2, 1003)).astype(np.float32)
    for path in (tmp_path / "a.tsrpkg", tmp_path / "a.tar.gz"):
        bundle = load_bundle(path)
        assert bundle.kernels == want_kernels
        graph = bundle.files[bundle.info["graph"]]
        assert bundle.info["graph_sha256"] == hashlib.sha256(graph).hexdigest()
        for _ in range(40):  # past the warm-up, which would build the C calls
            out = np.full(1003, np.nan, np.float32)
            bundle.cpu.axpy(x, y, 0.75, out=out)
            np.testing.assert_allclose(out, x.astype(np.float64) * 0.75 + y, rtol=1e-6)
        with pytest.raises(BundleError, match="no cubin for sm_80"):
            bundle.cubin("sm_80")
    (tmp_path / "a.tsrpkg" / "cpu" / "axpy.cpp").write_text("changed")
    with pytest.raises(BundleError, match="differ from its manifest"):
        load_bundle(tmp_path / "a.tsrpkg")


@pytest.mark.compile
@needs_gxx
@needs_nvrtc
def test_a_bundle_holds_a_cubin_per_arch(tmp_path: Path) -> None:
    source = tmp_path / "axpy.tsr"
    source.write_text(AXPY)
    _bundle(source, tmp_path / "s.tsrpkg", "--arch", "sm_80")
    bundle = load_bundle(tmp_path / "s.tsrpkg")
    assert bundle.cubin("sm_80").startswith(b"\x7fELF")
    part = bundle.info["cuda"]["sm_80"]
    assert "\nint tessera_axpy(const float* x, " in bundle.files[part["source"]].decode()
    assert load(bundle.files[part["kernels"]].decode())[0]["name"] == "axpy"
    assert (
        repr(bundle)
        == f"<Bundle '{tmp_path / 's.tsrpkg'}': functions axpy; cpu native; cuda sm_80>"
    )


def test_bad_arches_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bundle", "x.tsr", "--arch", "sm_80,sm_75", "-o", "x.tsrpkg"])
    assert "--arch takes distinct CUDA arches" in capsys.readouterr().err
