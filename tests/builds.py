"""A file's generated source built warning-free with each compiler a user has: the
checks that a test module over one ``.tsr`` source runs for its own source."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import tessera

from .test_cpu import COMPILERS, STRICT
from .test_cuda import NVCC, _nvcc
from .test_hip import HIPCC, _hipcc_warning_free


def assert_cpu_builds_warning_free(source: str, name: str, compiler: str, tmp_path: Path) -> None:
    """g++ or clang++ with -Wall -Wextra -Werror on the CPU target's file."""
    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    (tmp_path / "k.cpp").write_text(tessera.compile(source, name, target="cpu").source)
    done = subprocess.run([compiler, *STRICT, *COMPILERS[compiler], "k.cpp"],
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0 and not done.stderr, done.stderr


def assert_gpu_builds_warning_free(
    source: str, name: str, target: str, arch: str, tmp_path: Path
) -> None:
    """nvcc (``target`` cuda) or hipcc, every warning an error."""
    if target == "cuda":
        if NVCC is None:
            pytest.skip("needs nvcc (the CUDA toolkit)")
        _nvcc(name, arch, tmp_path, source)
    else:
        if HIPCC is None:
            pytest.skip("needs hipcc (apt-get install hipcc)")
        _hipcc_warning_free(tessera.compile(source, name, target="hip").source, tmp_path)
