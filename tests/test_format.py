"""``tesserac --emit target --format clang-format``: generated source through clang-format.

The formatted file must be the same program (only white space differs), stable under a
second clang-format run, and still compile warning-free; without clang-format the
output is the unformatted source, with a warning.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tessera.cli import main
from tessera.transpiler.target.formatting import STYLE, clang_format, formatted

from .conftest import ROOT
from .test_cli import run

pytestmark = pytest.mark.unit
MLP = str(ROOT / "examples" / "mlp.tsr")
TARGETS = ("cuda", "hip", "cpu", "opencl", "sycl")
needs_clang_format = pytest.mark.skipif(
    clang_format() is None, reason="clang-format is not installed"
)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """Each target's source of the MLP example, as generated and as formatted."""
    folder = tmp_path_factory.mktemp("formatted")
    sources = {}
    for target in TARGETS:
        plain, pretty = folder / f"{target}.plain", folder / f"{target}.pretty"
        assert main([MLP, "--target", target, "-o", str(plain)]) == 0
        assert main([MLP, "--target", target, "--format", "clang-format", "-o", str(pretty)]) == 0
        sources[target] = (plain.read_text(), pretty.read_text())
    return sources


def _code(text: str) -> str:
    return re.sub(r"\s+", "", text)


@needs_clang_format
@pytest.mark.parametrize("target", TARGETS)
def test_formatting_changes_only_white_space_and_is_stable(
    target: str, outputs: dict[str, tuple[str, str]]
) -> None:
    plain, pretty = outputs[target]
    assert pretty != plain
    assert _code(pretty) == _code(plain)
    assert formatted(pretty, target, clang_format() or "") == pretty
    assert all(len(line) <= 100 for line in pretty.splitlines() if "//" not in line)


@needs_clang_format
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_formatted_cpp_compiles_warning_free(
    outputs: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    source = tmp_path / "mlp.cpp"
    source.write_text(outputs["cpu"][1])
    done = subprocess.run(
        ["g++", "-std=c++17", "-fopenmp", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
         str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_style_is_checked_in() -> None:
    assert "ColumnLimit: 100" in STYLE.read_text()


def test_without_clang_format_the_source_is_unformatted_with_a_warning(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)
    status, out, err = run([MLP, "--target", "cpu", "--format", "clang-format"], capsys)
    assert status == 0 and out == run([MLP, "--target", "cpu"], capsys)[1]
    assert "clang-format is not installed" in err


def test_format_goes_with_target_source(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run([MLP, "--emit", "graph", "--format", "clang-format"], capsys)
    assert status == 2 and "--format clang-format goes with --emit target" in err
