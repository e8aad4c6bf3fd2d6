"""Golden files: every implemented stage of every example, byte for byte.

Target-independent stages have one golden file per example; stages from the
schedule on have one per target and arch. ``pytest --update-golden``
rewrites them; review ``git diff golden/`` before committing, since a golden
file is only as good as the reading it got.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

import tessera
from tessera.transpiler.pipeline import PIPELINE

from .conftest import EXAMPLES, ROOT

GOLDEN = ROOT / "golden"
#: The targets and arches whose target-dependent stages are pinned.
TARGETS = [("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", "gfx90a"), ("cpu", "native"),
           ("opencl", "generic"), ("sycl", "generic")]  # fmt: skip
#: File name of each target-independent stage's golden output.
FILES = {"ast": "ast.tsr", "graph": "graph.txt"}
#: The targets whose source and metadata are pinned, the file suffix of their source,
#: and the examples they pin (None: every one).
BACKENDS = {
    ("cpu", "native"): ("cpp", None),
    ("opencl", "generic"): ("cl", None),
    ("sycl", "generic"): ("sycl.cpp", None),
    ("hip", "gfx90a"): ("hip", None),
    ("cuda", "sm_80"): ("cu", None),
    ("cuda", "sm_90a"): ("cu", None),
}
#: Stages that only targets with a backend have, and their file suffixes.
BACKEND_STAGES = {
    "target": [(target, suffix, only) for target, (suffix, only) in BACKENDS.items()],
    "meta": [(target, "json", only) for target, (_, only) in BACKENDS.items()],
}

pytestmark = pytest.mark.golden


def _cases() -> list[tuple[Path, str, tuple[str, str] | None, str]]:
    cases = []
    for example in EXAMPLES:
        for stage in PIPELINE:
            if stage.on_request:  # built by NVRTC: test_nvrtc.py reads them
                continue
            if stage.needs_target:
                targets = BACKEND_STAGES.get(stage.name, [(t, "txt", None) for t in TARGETS])
                for (target, arch), suffix, only in targets:
                    if only is not None and example.stem not in only:
                        continue
                    name = f"{stage.name}.{target}-{arch}.{suffix}"
                    cases.append((example, stage.name, (target, arch), name))
            else:
                cases.append((example, stage.name, None, FILES[stage.name]))
    return cases


CASES = _cases()


@pytest.mark.parametrize(
    ("example", "stage", "target", "file"),
    CASES,
    ids=[f"{p.stem}-{f.rsplit('.', 1)[0]}" for p, _, _, f in CASES],
)
def test_matches_golden(
    example: Path,
    stage: str,
    target: tuple[str, str] | None,
    file: str,
    update_golden: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)  # outputs name the file as given: examples/x.tsr
    options = {"target": target[0], "arch": target[1]} if target else {}
    actual = tessera.compile_file(example.relative_to(ROOT), **options).inspect_ir(stage)
    golden = GOLDEN / example.stem / file
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
    assert {s.name for s in PIPELINE if not s.needs_target} <= set(FILES)


def test_no_stale_golden_files() -> None:
    """A golden file whose example or stage is gone would pin nothing."""
    expected = {GOLDEN / p.stem / f for p, _, _, f in CASES}
    expected |= {GOLDEN / p.stem / "loader.cuda-sm_80.py" for p in EXAMPLES}  # test_loader.py
    present = {p for p in GOLDEN.rglob("*") if p.is_file()}
    assert present <= expected, f"stale golden files: {sorted(present - expected)}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_output_is_deterministic(example: Path) -> None:
    def every_stage() -> list[str]:
        cuda = tessera.compile_file(example, target="cuda")
        cpu = tessera.compile_file(example, target="cpu")
        stages = [s.name for s in PIPELINE if not s.on_request]
        return [cuda.inspect_ir(s) for s in stages if s not in BACKEND_STAGES] + [
            cpu.inspect_ir(s) for s in stages
        ]

    assert every_stage() == every_stage()
