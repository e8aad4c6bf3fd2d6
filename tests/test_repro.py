"""Repro packs: what an internal compiler error leaves for the bug report, and what
``tesserac pack-repro`` writes on demand, byte for byte the same each time."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import tessera
from tessera.cli.main import main
from tessera.packs import MANIFEST, PackError, read_pack, write_pack
from tessera.transpiler import pipeline

SCALE = """\
@kernel
def scale(x: Tensor["N", f32], a: float) -> Tensor["N", f32]:
    return x * a
"""


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = main(args)
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "scale.tsr"
    path.write_text(SCALE)
    return path


def test_an_internal_error_writes_a_pack_of_the_stages_that_ran(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip

    def broken(*_: object) -> None:
        raise KeyError("oops")

    patched = tuple(s if s.name != "tile" else pipeline.Stage("tile", broken, s.show, True)
                    for s in pipeline.PIPELINE)  # fmt: skip
    monkeypatch.setattr(pipeline, "PIPELINE", patched)
    monkeypatch.setenv("TESSERA_REPRO_DIR", str(tmp_path / "packs"))
    (tmp_path / "packs").mkdir()
    paths, archives = [], []
    for _ in range(2):
        status, err = run([str(source), "--target", "cpu", "-D", "N=100"], capsys)
        assert status == 3 and "internal compiler error in stage 'tile'" in err
        found = re.search(r"a repro pack for the report: (\S+\.tar\.gz)\n", err)
        assert found is not None, err
        paths.append(found.group(1))
        archives.append(Path(found.group(1)).read_bytes())
    assert paths[0] == paths[1] and archives[0] == archives[1]
    files = read_pack(paths[0])
    assert files["source/scale.tsr"] == SCALE.encode()
    options = json.loads(files["options.json"])
    assert options["target"] == "cpu" and options["arch"] == "native"
    assert options["defines"] == {"N": 100} and options["stopped_at"] == "tile"
    assert options["stages_run"] == ["ast", "graph", "sched"]
    program = tessera.compile(SCALE, "scale.tsr", target="cpu", defines={"N": 100}, until="sched")
    assert files["ir/sched.txt"].decode() == program.inspect_ir("sched")
    assert set(json.loads(files["versions.json"])) >= {"tessera", "python", "lark", "jinja2"}
    assert "KeyError: 'oops'" in files["error.txt"].decode()
    assert "--target cpu --arch native -DN=100" in files["replay.sh"].decode()

    monkeypatch.setenv("TESSERA_REPRO", "0")
    status, err = run([str(source), "--target", "cpu"], capsys)
    assert status == 3 and "repro pack" not in err


def test_pack_repro_writes_a_directory_or_an_archive(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    packs = [tmp_path / "a", tmp_path / "a", tmp_path / "b.tar.gz"]
    for pack in packs:
        status, err = run(["pack-repro", str(source), "--target", "cpu", "-o", str(pack)], capsys)
        assert status == 0 and "every stage ran" in err
    directory, archive = read_pack(packs[0]), read_pack(packs[2])
    assert directory == archive and "error.txt" not in directory
    program = tessera.compile(SCALE, "scale.tsr", target="cpu")
    assert directory["ir/target.txt"].decode() == program.source
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b.tar.gz", "scale.tsr"]


def test_pack_repro_records_the_errors_of_a_wrong_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = tmp_path / "wrong.tsr"
    wrong.write_text(SCALE.replace("x * a", "x * b"))
    status, _ = run(["pack-repro", str(wrong), "--target", "cpu", "-o", str(tmp_path / "p")],
                    capsys)  # fmt: skip
    files = read_pack(tmp_path / "p")
    assert status == 0 and json.loads(files["options.json"])["stopped_at"] == "graph"
    assert "wrong.tsr:3:" in files["error.txt"].decode()
    status, err = run(["pack-repro", str(tmp_path / "no.tsr"), "-o", str(tmp_path / "q")], capsys)
    assert status == 1 and "cannot read" in err


def test_a_pack_replaces_only_a_pack(tmp_path: Path) -> None:
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("mine")
    with pytest.raises(PackError, match="not empty and not a pack"):
        write_pack(tmp_path / "keep", {"a.txt": b"x"})
    write_pack(tmp_path / "pack", {"a.txt": b"x"})
    (tmp_path / "pack" / "a.txt").write_bytes(b"y")
    with pytest.raises(PackError, match="differ from its manifest"):
        read_pack(tmp_path / "pack")
    write_pack(tmp_path / "pack", {"b/c.txt": b"z"})
    assert sorted(p.name for p in (tmp_path / "pack").iterdir()) == ["b", MANIFEST]
    (tmp_path / "link").symlink_to("pack")  # a link to a pack: the pack is written
    write_pack(tmp_path / "link", {"d.txt": b"w"})
    assert (tmp_path / "link").is_symlink() and read_pack(tmp_path / "pack") == {"d.txt": b"w"}
