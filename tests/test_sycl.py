"""The SYCL backend: every example and library file, checked against SYCL 2020's headers.

No SYCL device compiler runs here. Debian's clang++ parses each generated file, host
launchers and kernel functions alike, against the headers of Intel's SYCL runtime
wheel (``intel-sycl-rt``), warning-free: names, types, overloads and templates are
checked, device code generation is not. All files go through one compiler run, each
in a namespace of its own, since the headers cost most of the time.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
from pathlib import Path

import pytest

import tessera

from .conftest import ROOT, SOURCES

CLANG = shutil.which("clang++")
FLAGS = ["-fsyntax-only", "-std=c++17", "-Wall", "-Wextra", "-Werror"]


def _sycl_include() -> Path | None:
    """The folder holding ``sycl/sycl.hpp`` from the intel-sycl-rt wheel, if installed."""
    try:
        files = importlib.metadata.files("intel-sycl-rt") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).replace("\\", "/").endswith("include/sycl/sycl.hpp"):
            return Path(f.locate()).parent.parent
    return None


SYCL_INCLUDE = _sycl_include()
needs_sycl_headers = pytest.mark.skipif(
    CLANG is None or SYCL_INCLUDE is None,
    reason="needs clang++ (apt-get install clang) and the SYCL headers "
    "(pip install intel-sycl-rt)",
)


def check_syntax(sources: dict[str, str], tmp_path: Path) -> None:
    """Parse the SYCL files (by a name fit for a namespace) in one clang++ run, each in
    its own namespace, warning-free."""
    unit = ["#include <sycl/sycl.hpp>", "", "#include <cmath>"]
    for name, text in sources.items():
        (tmp_path / f"{name}.sycl.cpp").write_text(text)
        unit += [f"namespace {name} {{", f'#include "{name}.sycl.cpp"', "}"]
    (tmp_path / "all.cpp").write_text("\n".join(unit) + "\n")
    assert CLANG is not None and SYCL_INCLUDE is not None
    done = subprocess.run([CLANG, *FLAGS, "-isystem", str(SYCL_INCLUDE), "all.cpp"],
                          cwd=tmp_path, capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0 and not done.stderr, done.stderr[:6000]


@pytest.mark.compile
@needs_sycl_headers
def test_every_example_and_library_file_parses_warning_free(tmp_path: Path) -> None:
    sources = {
        f"f{i}_{Path(path).stem}": tessera.compile_file(ROOT / path, target="sycl").source
        for i, path in enumerate(SOURCES)
    }
    check_syntax(sources, tmp_path)


def test_each_function_has_a_host_function_on_a_queue() -> None:
    source = tessera.compile_file(ROOT / "examples/decoder_block.tsr", target="sycl").source
    assert "inline void decoder_block(\n    sycl::queue& queue, const float* x," in source
    # Each launch waits for the one before it, whatever the queue's order.
    assert source.count("cgh.depends_on(done);") == source.count("queue.submit(") == 10
    # A launch's numbers are named once, in the function that submits it.
    assert source.count("done = decoder_block_k") == 10
    assert (
        "sycl::local_accessor<float, 1> tsr_scratch(sycl::range<1>(SCRATCH_SIZE), cgh);" in source
    )
    assert "const sycl::range<3> global(1, 1, THREADS * ((S + BM - 1) / BM));" in source


def test_loading_says_to_build_with_a_sycl_compiler() -> None:
    program = tessera.compile_file(ROOT / "examples/norms.tsr", target="sycl")
    with pytest.raises(RuntimeError, match="SYCL 2020 compiler"):
        program.load()
