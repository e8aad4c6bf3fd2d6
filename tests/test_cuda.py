"""The CUDA backend: compiled by nvcc and NVRTC for sm_80 and sm_90a, read in SASS, and
run on a GPU where there is one.

Every example and library file compiles warning-free for both archs with nvcc and
with NVRTC, with no spills and no stack frame; bf16 products and attention run on
the tensor cores (HMMA on sm_80, HGMMA on sm_90a, in the SASS). The GPU tier
(``-m gpu``) runs every case of ``reference.py`` against float64, as the OpenCL tier
does on PoCL.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import tessera
from tessera.runtime.cuda import CudaUnavailable, _cupy

from .conftest import ROOT, SOURCES
from .reference import CASES, Case, check_case

NVCC = shutil.which("nvcc")
ARCHS = ["sm_80", "sm_90a"]


def _tool(name: str) -> str | None:
    """A CUDA tool from its pip package (nvidia-cuda-*), else from PATH."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
    except ImportError:
        return shutil.which(name)
    return find_nvidia_binary_utility(name) or shutil.which(name)


def _nvrtc() -> object | None:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return None
    return nvrtc


CUOBJDUMP, NVDISASM = _tool("cuobjdump"), _tool("nvdisasm")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")
needs_nvrtc = pytest.mark.skipif(
    _nvrtc() is None, reason="needs NVRTC (pip install cuda-bindings nvidia-cuda-nvrtc)"
)
needs_sass_tools = pytest.mark.skipif(
    CUOBJDUMP is None or NVDISASM is None,
    reason="needs cuobjdump and nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)",
)


def cuobjdump(option: str, cubin: Path) -> str:
    """cuobjdump's output for a cubin; ``-sass`` runs nvdisasm, which it finds on PATH."""
    assert CUOBJDUMP is not None
    path = str(Path(NVDISASM).parent) if NVDISASM else ""
    done = subprocess.run([CUOBJDUMP, option, str(cubin)], capture_output=True, text=True,
                          env={"PATH": path}, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _gencode(arch: str) -> str:
    return f"-gencode=arch=compute_{arch.removeprefix('sm_')},code={arch}"


def _nvcc(path: str, arch: str, tmp_path: Path) -> tuple[Path, str]:
    """Compile to a cubin; returns it and ptxas's resource report."""
    source = tmp_path / "kernels.cu"
    source.write_text(tessera.compile_file(ROOT / path, target="cuda", arch=arch).source)
    cubin = tmp_path / "kernels.cubin"
    assert NVCC is not None
    done = subprocess.run(
        [NVCC, _gencode(arch), "-std=c++17", "-O3", "-cubin", "-Xptxas", "-v",
         "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra", "-o", str(cubin), str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return cubin, done.stderr


@pytest.mark.compile
@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", SOURCES)
def test_compiles_with_nvcc_warning_free_without_spills(path: str, arch: str, tmp_path: Path):
    _, report = _nvcc(path, arch, tmp_path)
    frames = re.findall(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill", report
    )
    assert frames, report
    assert {f for frame in frames for f in frame} == {"0"}, report


@pytest.mark.compile
@needs_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", SOURCES)
def test_compiles_with_nvrtc_as_it_is(path: str, arch: str) -> None:
    """NVRTC has no include path: the file must need nothing but itself."""
    from cuda.bindings import nvrtc

    source = tessera.compile_file(ROOT / path, target="cuda", arch=arch).source.encode()
    _, program = nvrtc.nvrtcCreateProgram(source, b"kernels.cu", 0, [], [])
    options = [b"-std=c++17", f"-arch={arch}".encode()]
    (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    _, size = nvrtc.nvrtcGetProgramLogSize(program)
    buffer = bytearray(size)  # NVRTC writes into it: never a (shared) bytes object
    nvrtc.nvrtcGetProgramLog(program, buffer)
    log = buffer.rstrip(b"\0").decode()
    assert status == nvrtc.nvrtcResult.NVRTC_SUCCESS, log
    assert "warning" not in log, log
    nvrtc.nvrtcDestroyProgram(program)


@pytest.mark.compile
@needs_nvcc
@needs_sass_tools
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", ["examples/mlp.tsr", "examples/attention.tsr"])
def test_bf16_products_run_on_tensor_cores(path: str, arch: str, tmp_path: Path) -> None:
    """sm_80 multiplies on mma.sync (HMMA); sm_90a on wgmma (HGMMA) alone, with steps
    that add to the accumulator (its input register is its output, not RZ)."""
    cubin, _ = _nvcc(path, arch, tmp_path)
    sass = cuobjdump("-sass", cubin)
    hmma = re.findall(r"\bHMMA\.16816\.F32\.BF16\b", sass)
    if arch == "sm_80":
        assert hmma, f"{path}: no bf16 HMMA"
        return
    assert not hmma, f"{path}: products left on mma.sync"
    hgmma = re.findall(r"\bHGMMA\.64x\d+x16\.F32\.BF16 (R\d+), ([^;]*);", sass)
    assert hgmma, f"{path}: no bf16 HGMMA"
    accumulating = [d for d, rest in hgmma if re.search(rf"\b{d}, gsb0$", rest.strip())]
    assert accumulating, f"{path}: no HGMMA adds to its accumulator: {hgmma[:4]}"


def test_loading_without_a_gpu_says_so() -> None:
    try:
        _cupy()
    except CudaUnavailable:
        pass
    else:
        pytest.skip("CuPy and a GPU are present")
    program = tessera.compile_file(ROOT / "examples/norms.tsr", target="cuda")
    with pytest.raises(CudaUnavailable, match=r"CuPy|no NVIDIA GPU") as caught:
        program.load()
    assert "\n" not in str(caught.value)


def _gpu() -> str | None:
    """Why CUDA code cannot run here, or None."""
    try:
        _cupy()
    except CudaUnavailable as exc:
        return str(exc)
    return None


@pytest.mark.gpu
@pytest.mark.execute
@pytest.mark.skipif(_gpu() is not None, reason=f"needs a GPU: {_gpu()}")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_runs_to_the_float64_reference_on_a_gpu(case: Case, arch: str) -> None:
    check_case(case, "cuda", arch)
