"""Malformed programs: each file in tests/errors/ says what tesserac must print.

A file's ``# expect:`` lines are the exact headlines (``line:col: error: ...``
and notes) of its diagnostics, in order. Files named ``sema_*`` hold semantic
mistakes, the others syntax errors. Exit status 1, never a traceback, and no
output file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tessera.cli import main

from .conftest import ROOT
from .helpers import HEADLINE

ERRORS = sorted((ROOT / "tests" / "errors").glob("*.tsr"))
EXPECT = re.compile(rb"^# expect: (.*)$", re.M)

pytestmark = pytest.mark.unit


def test_there_are_enough_cases() -> None:
    semantic = [p for p in ERRORS if p.stem.startswith("sema_")]
    assert len(ERRORS) - len(semantic) >= 15
    assert len(semantic) >= 40


@pytest.mark.parametrize("path", ERRORS, ids=[p.stem for p in ERRORS])
def test_malformed_file(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expected = [m.decode() for m in EXPECT.findall(path.read_bytes())]
    assert expected, f"{path.name} has no '# expect:' line"
    output = tmp_path / "out.txt"
    status = main([str(path), "--emit", "graph", "-o", str(output)])
    assert not output.exists()
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert status == 1
    assert captured.out == ""
    prefix = f"{path}:"
    headlines = [h.removeprefix(prefix) for h in HEADLINE.findall(captured.err)]
    assert headlines == expected, captured.err
