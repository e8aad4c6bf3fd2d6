"""The C ABI of ``tsr.h``: a C program against its CPU implementation loads a module
image Tessera built, launches a function and gets each misuse's status; the CUDA
implementation compiles with nvcc."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import tessera
from tessera.cli.main import main
from tessera.runtime.c_abi import abi_version, cpu_module, runtime_dir

from .conftest import ROOT

CC, NVCC = shutil.which("cc") or shutil.which("gcc"), shutil.which("nvcc")

AXPY = """\
@kernel
def axpy(x: Tensor["N", f32], y: Tensor["N", f32], a: float) -> Tensor["N", f32]:
    return x * a + y
"""


@pytest.mark.execute
@pytest.mark.skipif(CC is None, reason="needs a C compiler (cc)")
def test_a_c_program_loads_and_launches_a_cpu_module(tmp_path: Path) -> None:
    image = cpu_module(tessera.compile(AXPY, "axpy.tsr", target="cpu"))
    check = tmp_path / "check"
    assert CC is not None
    done = subprocess.run(
        [CC, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{runtime_dir()}",
         str(ROOT / "tests/c_abi/cpu_check.c"), str(runtime_dir() / "tsr_cpu.c"), "-ldl", "-lm",
         "-o", str(check)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ran = subprocess.run([str(check), str(image)], capture_output=True, text=True, check=False)
    assert (ran.returncode, ran.stdout) == (0, "ok\n"), ran.stdout + ran.stderr


@pytest.mark.compile
@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_the_cuda_implementation_compiles_with_nvcc(tmp_path: Path) -> None:
    assert NVCC is not None
    for language in ([], ["-x", "cu"]):  # as C, and as CUDA C++
        done = subprocess.run(
            [NVCC, *language, "-c", str(runtime_dir() / "tsr_cuda.c"), "-Xcompiler",
             "-Wall,-Wextra,-Werror", "-o", str(tmp_path / "tsr_cuda.o")],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


def test_the_runtime_directory_is_printed_and_holds_the_abi(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--print-runtime-dir"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == runtime_dir()
    assert {p.name for p in printed.iterdir()} >= {"tsr.h", "tsr_cpu.c", "tsr_cuda.c"}
    assert abi_version() == (1, 0)
