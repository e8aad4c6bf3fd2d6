"""The process settings a compilation changes while it runs (the recursion limit, the
collector's first generation) are raised for it and given back as they were: nested
compilations share one change, a caller's higher setting is kept, and an error inside
a compilation restores them as well."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tessera.transpiler.pipeline as pipeline
from tessera.cli import main
from tessera.transpiler.frontend.depth import RECURSION_NEEDED
from tessera.transpiler.frontend.diagnostics import CompileError
from tessera.transpiler.process_settings import (
    FIRST_GENERATION,
    few_collections,
    recursion_headroom,
)

pytestmark = pytest.mark.unit

SOURCE = '@kernel\ndef f(x: Tensor["N", f32]) -> Tensor["N", f32]:\n    return x + 1.0\n'


@pytest.fixture
def default_settings() -> Iterator[None]:
    """Python's defaults for the test, and whatever the process had after it."""
    thresholds, limit = gc.get_threshold(), sys.getrecursionlimit()
    gc.set_threshold(700, 10, 10)
    sys.setrecursionlimit(1000)
    yield
    gc.set_threshold(*thresholds)
    sys.setrecursionlimit(limit)


def _settings() -> tuple[tuple[int, int, int], int]:
    return gc.get_threshold(), sys.getrecursionlimit()


def test_a_compilation_runs_with_both_raised_and_gives_them_back(
    default_settings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []
    parse = pipeline.parse_kept

    def parse_and_look(*args: object) -> object:
        seen.append(_settings())
        return parse(*args)

    monkeypatch.setattr(pipeline, "parse_kept", parse_and_look)
    before = _settings()
    pipeline.compile(SOURCE, target="cpu")
    assert seen == [((FIRST_GENERATION, 10, 10), RECURSION_NEEDED)]
    assert _settings() == before == ((700, 10, 10), 1000)


def test_nested_uses_share_one_change_and_the_last_out_restores(default_settings: None) -> None:
    with few_collections(), recursion_headroom():
        with few_collections(), recursion_headroom():
            assert _settings() == ((FIRST_GENERATION, 10, 10), RECURSION_NEEDED)
        assert _settings() == ((FIRST_GENERATION, 10, 10), RECURSION_NEEDED)
    assert _settings() == ((700, 10, 10), 1000)


def test_a_callers_higher_settings_are_kept(default_settings: None) -> None:
    gc.set_threshold(10 * FIRST_GENERATION, 5, 5)
    sys.setrecursionlimit(2 * RECURSION_NEEDED)
    with few_collections(), recursion_headroom():
        assert _settings() == ((10 * FIRST_GENERATION, 5, 5), 2 * RECURSION_NEEDED)
    assert _settings() == ((10 * FIRST_GENERATION, 5, 5), 2 * RECURSION_NEEDED)


def test_an_error_in_a_compilation_restores_them(default_settings: None, tmp_path: Path) -> None:
    bad = tmp_path / "bad.tsr"
    bad.write_text(SOURCE.replace("x + 1.0", "x + y"))
    assert main([str(bad), "--target", "cpu", "-o", str(tmp_path / "bad.cpp")]) == 1
    with pytest.raises(CompileError):
        pipeline.compile(SOURCE.replace("x + 1.0", "x + y"), target="cpu")
    assert _settings() == ((700, 10, 10), 1000)
