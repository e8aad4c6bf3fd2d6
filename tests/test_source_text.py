"""Text from the source reaches generated files only inside comments and strings.

Every statement's ``.tsr`` line is echoed into a ``//`` comment, and the header names
the input file. A lone carriage return, which does not end a line for Tessera, ends
one for g++ and clang, so the text after it compiled as code; a comment or a
continuation line ending in a backslash spliced the next generated line (a store)
into the comment; a file name with a newline put code into the header. Each of them
goes through every target here: the payload appears only in comments, the file
compiles warning-free, and the result equals the float64 reference.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import pytest

import tessera
from tessera.transpiler.target.cupy_loader import python_loader
from tessera.transpiler.target.render import comment_text

from .gpusim import load_hip, simulated_cupy, use_simulator
from .reference import f64
from .test_cuda import _gencode, needs_gxx, needs_nvcc
from .test_hip import _hipcc_warning_free, needs_hipcc
from .test_opencl import _platform

#: What must never compile: text that, as code, would skip the store or run a command.
PAYLOAD = 'return; system("PAYLOAD");'

SOURCE = (
    "@kernel\n"
    'def scaled(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:\n'
    "    T = tile.context()\n"
    f"    rows = tile.load(x, rows=T.m)  # a carriage return\r{PAYLOAD}\n"
    "    twice = rows * 2.0  # a comment that ends in a backslash \\\n"
    "    shifted = twice + \\\n"
    "        1.0  # */ closes no comment\n"
    f"    scaled = shifted * 0.5  # a line separator\u2028{PAYLOAD} and ??/\n"
    f"    return scaled  # a bidirectional override \u202e{PAYLOAD}\n"
)

#: A file name that ends the header comment two ways (its folder, which could end it too,
#: is never printed: outputs name the file alone; and no file name holds a '/').
FILENAME = f"dir\n{PAYLOAD}/evil\n{PAYLOAD}\r {PAYLOAD} \\"

TARGETS = [("cpu", None), ("opencl", None), ("cuda", "sm_80"), ("cuda", "sm_90a"),
           ("hip", "gfx90a")]  # fmt: skip
IDS = [f"{t}-{a}" if a else t for t, a in TARGETS]

needs_opencl = pytest.mark.skipif(
    _platform() is not None, reason=f"needs pyopencl and PoCL: {_platform()}"
)


def _program(target: str, arch: str | None) -> tessera.Program:
    return tessera.compile(SOURCE, FILENAME, target=target, arch=arch)


def _code_lines(source: str) -> list[str]:
    """The file's lines as a C preprocessor sees them: CR, LF and CRLF end a line."""
    return re.split(r"\r\n|\r|\n", source)


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=IDS)
def test_source_text_stays_in_comments(target: str, arch: str | None) -> None:
    lines = _code_lines(_program(target, arch).source)
    found = [line for line in lines if "PAYLOAD" in line]
    assert found, "the header names the file"
    assert all(line.lstrip().startswith("//") for line in found), found
    # and no comment reaches into the next line
    comments = [line for line in lines if line.lstrip().startswith("//")]
    assert not [line for line in comments if line.rstrip().endswith(("\\", "??/"))]


@pytest.mark.parametrize(
    ("text", "printed"),
    [("x = 1  # plain", "x = 1  # plain"), ("a\rb\nc\u2028d", "a\\rb\\nc\\u2028d"),
     ("q = z + \\", "q = z +"), ("# ??/", "#"), ("/* */", "/* *\\/"), ("\tx\ty \\ \t", "x\ty")],
)  # fmt: skip
def test_comment_text_keeps_ordinary_text_and_escapes_the_rest(text: str, printed: str) -> None:
    assert comment_text(text) == printed


@pytest.mark.compile
@needs_gxx
def test_cpu_compiles_warning_free(tmp_path: Path) -> None:
    cpp = tmp_path / "k.cpp"
    cpp.write_bytes(_program("cpu", None).source.encode())
    strict = ["-std=c++17", "-fopenmp", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"]
    done = subprocess.run(["g++", *strict, str(cpp)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.compile
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_cuda_compiles_warning_free(arch: str, tmp_path: Path) -> None:
    cu = tmp_path / "k.cu"
    cu.write_bytes(_program("cuda", arch).source.encode())
    nvcc = shutil.which("nvcc") or "nvcc"
    done = subprocess.run(
        [nvcc, _gencode(arch), "-std=c++17", "-cubin", "-Werror", "all-warnings",
         "-Xcompiler", "-Wall,-Wextra", "-o", str(tmp_path / "k.cubin"), str(cu)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.compile
@needs_hipcc
def test_hip_compiles_warning_free(tmp_path: Path) -> None:
    _hipcc_warning_free(_program("hip", "gfx90a").source, tmp_path)


def _functions(target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The program built for ``target``: CUDA and HIP on the simulated GPU."""
    if target == "opencl" and _platform() is not None:
        pytest.skip(f"needs pyopencl and PoCL: {_platform()}")
    if target in ("cuda", "hip"):
        use_simulator(monkeypatch, simulated_cupy(arch if target == "cuda" else "sm_80"))
    program = _program(target, arch)
    return load_hip(program) if target == "hip" else program.load()


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=IDS)
def test_runs_to_the_reference(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    functions = _functions(target, arch, monkeypatch)
    rng = np.random.default_rng(21)
    x = rng.standard_normal((37, 53), dtype=np.float32)
    out = np.full_like(x, np.nan)
    functions.scaled(x, out=out)
    np.testing.assert_allclose(f64(out), (f64(x) * 2 + 1) * 0.5, rtol=1e-6)


@pytest.mark.parametrize("cuda_file", ['k"""\nimport os\n""".cu', "k\\\n'\".cu"])
def test_loader_keeps_file_names_in_its_strings(cuda_file: str) -> None:
    """The loader module names the CUDA file and the source in its docstring and in a
    string literal: neither ends early, whatever the names hold."""
    meta = _program("cuda", "sm_80").ir("meta")
    module = ast.parse(python_loader(meta, cuda_file))
    assert [type(node).__name__ for node in module.body[:3]] == ["Expr", "ImportFrom", "Import"]
    docstring = ast.get_docstring(module, clean=False) or ""
    assert cuda_file in docstring and PurePath(FILENAME).name in docstring
    (source,) = (node for node in module.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", "") == "_SOURCE")  # fmt: skip
    assert ast.literal_eval(source.value.args[0]) == cuda_file  # type: ignore[attr-defined]
