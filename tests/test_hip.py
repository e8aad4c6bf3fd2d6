"""The HIP backend, compiled for gfx90a by hipcc: warning-free, with MFMA for products
and attention; and run on a simulated GPU.

No AMD GPU runs here, so these tests compile and read the device assembly, and run
every reference case on the CPU simulator of ``tests/gpusim`` (wavefronts of 64, MFMA
from AMD's matrix-instruction layouts) against float64; most of the same emitter's
output also runs through OpenCL on PoCL (``test_opencl.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import tessera
from tessera.runtime import cuda as cuda_runtime
from tessera.runtime.hip import HipUnavailable

from .conftest import COMPILED_SOURCES, FIXED_HEAD_DIM, ROOT
from .gpusim import load_hip, simulated_cupy
from .reference import CASES, Case, check_case, f32_attention_source, simulated
from .test_cuda import needs_gxx

HIPCC = shutil.which("hipcc")
BUILD = ["--offload-arch=gfx90a", "-O3", "-std=c++17"]
WARNINGS = ["-Wall", "-Wextra", "-Werror"]

needs_hipcc = pytest.mark.skipif(HIPCC is None, reason="needs hipcc (apt-get install hipcc)")
pytestmark = pytest.mark.compile


def _hipcc(source: str, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "kernels.hip"
    path.write_text(source)
    assert HIPCC is not None
    return subprocess.run(
        [HIPCC, *BUILD, *flags, str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "HIP_PLATFORM": "amd"},
        cwd=tmp_path,
        check=False,
    )


def _hipcc_warning_free(source: str, tmp_path: Path) -> None:
    """Compile generated HIP for gfx90a with every warning an error."""
    done = _hipcc(source, tmp_path, *WARNINGS, "-c", "-o", "kernels.o")
    assert done.returncode == 0, done.stderr


@needs_hipcc
@pytest.mark.parametrize("path", COMPILED_SOURCES)
def test_compiles_warning_free_for_gfx90a(path: str, tmp_path: Path) -> None:
    defines = FIXED_HEAD_DIM.get(("hip", path))
    program = tessera.compile_file(ROOT / path, target="hip", defines=defines)
    _hipcc_warning_free(program.source, tmp_path)


@needs_hipcc
def test_bf16_and_f16_products_run_on_mfma_without_scratch(tmp_path: Path) -> None:
    """The accumulators stay in registers: no private segment, no spills."""
    for path, instruction in (("examples/mlp.tsr", "v_mfma_f32_32x32x8bf16_1k"),
                              ("examples/attention.tsr", "v_mfma_f32_32x32x8bf16_1k"),
                              ("examples/schedules.tsr", "v_mfma_f32_32x32x8f16")):  # fmt: skip
        source = tessera.compile_file(ROOT / path, target="hip").source
        done = _hipcc(source, tmp_path, "--cuda-device-only", "-S", "-o", "kernels.s")
        assert done.returncode == 0, done.stderr
        assembly = (tmp_path / "kernels.s").read_text()
        assert instruction in assembly, f"{path}: no {instruction}"
        assert set(re.findall(r"\.private_segment_fixed_size:\s+(\d+)", assembly)) == {"0"}
        assert set(re.findall(r"\.vgpr_spill_count:\s+(\d+)", assembly)) == {"0"}


def test_loading_says_that_no_amd_gpu_is_present() -> None:
    if Path("/dev/kfd").exists():
        pytest.skip("an AMD GPU is present")
    program = tessera.compile_file(ROOT / "examples/norms.tsr", target="hip")
    with pytest.raises(HipUnavailable, match="no AMD GPU is present"):
        program.load()


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize("case", simulated(CASES))
def test_runs_to_the_float64_reference_on_the_simulator(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every case, built for gfx90a and launched as the metadata says, on the simulated
    GPU: MFMA and shuffles over 64-lane wavefronts, shared memory poisoned first."""
    monkeypatch.setattr(cuda_runtime, "_cupy", lambda: simulated_cupy("sm_80"))
    check_case(case, "hip", "gfx90a", load=load_hip)


@needs_hipcc
def test_f32_attention_fits_the_lds(tmp_path: Path) -> None:
    """On HIP the probabilities reach their product with the values through LDS, and the
    schedule counts them: f32 attention with a 128-wide head asked for 73984 bytes of
    the 65536 there are, and did not build."""
    source = tessera.compile(f32_attention_source(False), "attention.tsr", target="hip").source
    _hipcc_warning_free(source, tmp_path)
