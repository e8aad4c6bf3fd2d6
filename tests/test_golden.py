"""Golden files: every implemented stage of every example, byte for byte.

``pytest --update-golden`` rewrites them; review ``git diff golden/`` before
committing, since a golden file is only as good as the reading it got.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

import tessera
from tessera.transpiler.pipeline import PIPELINE

from .conftest import EXAMPLES, ROOT

GOLDEN = ROOT / "golden"
#: File name of each stage's golden output.
FILES = {"ast": "ast.tsr", "graph": "graph.txt"}

pytestmark = pytest.mark.golden

CASES = [(path, stage.name) for path in EXAMPLES for stage in PIPELINE]


@pytest.mark.parametrize(("example", "stage"), CASES, ids=[f"{p.stem}-{s}" for p, s in CASES])
def test_matches_golden(
    example: Path, stage: str, update_golden: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # outputs name the file as given: examples/x.tsr
    actual = tessera.compile_file(example.relative_to(ROOT)).inspect_ir(stage)
    golden = GOLDEN / example.stem / FILES[stage]
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(actual, encoding="utf-8")
        return
    assert golden.exists(), f"{golden} is missing; run pytest --update-golden and review it"
    expected = golden.read_text(encoding="utf-8")
    if actual != expected:
        diff = difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=str(golden.relative_to(ROOT)),
            tofile=f"{example.name} --emit {stage}",
        )
        pytest.fail("output differs from the golden file:\n" + "".join(diff), pytrace=False)


def test_every_stage_has_a_golden_file_name() -> None:
    assert {s.name for s in PIPELINE} <= set(FILES)


def test_no_stale_golden_files() -> None:
    """A golden file whose example or stage is gone would pin nothing."""
    expected = {GOLDEN / p.stem / FILES[s] for p, s in CASES}
    present = {p for p in GOLDEN.rglob("*") if p.is_file()}
    assert present <= expected, f"stale golden files: {sorted(present - expected)}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_output_is_deterministic(example: Path) -> None:
    first = [tessera.compile_file(example).inspect_ir(s.name) for s in PIPELINE]
    second = [tessera.compile_file(example).inspect_ir(s.name) for s in PIPELINE]
    assert first == second
