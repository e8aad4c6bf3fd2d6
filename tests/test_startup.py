"""Start-up: what ``import tessera`` and one compilation load, and the caches that keep
the parser tables, compiled templates and Tessera's own compiled modules between runs
(their speed is measured in bench/compile.py, not here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tessera
from tessera.bytecode import compiled
from tessera.cachedir import private_cache_dir
from tessera.transpiler.frontend import kept_parse, parser
from tessera.transpiler.pipeline import InternalCompilerError

from .conftest import ROOT

pytestmark = pytest.mark.unit


def _modules_after(code: str, cache: Path, **env: str) -> set[str]:
    """The modules loaded in a fresh interpreter after running ``code`` (with the
    environment variables ``env`` besides the cache folder)."""
    script = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "TESSERA_CACHE_DIR": str(cache), **env}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, check=True, cwd=ROOT)  # fmt: skip
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_import_tessera_loads_no_compiler_stage(tmp_path: Path) -> None:
    loaded = _modules_after("import tessera", tmp_path)
    heavy = {"tessera.transpiler.pipeline", "numpy", "jinja2", "lark"}
    assert not heavy & loaded


def test_the_command_line_loads_no_tuner_runtime_or_backend(tmp_path: Path) -> None:
    loaded = _modules_after("import tessera.cli", tmp_path)
    assert not {
        m
        for m in loaded
        if m.startswith(
            ("numpy", "jinja2", "tessera.tune", "tessera.runtime", "tessera.transpiler.target")
        )
    }


def test_a_compilation_loads_only_its_own_backend(tmp_path: Path) -> None:
    """Compiling for the CPU needs neither the SIMT emitters nor numpy nor the tuner;
    compiling for OpenCL needs no CPU emitter."""
    code = "import tessera\ntessera.compile_file('examples/mlp.tsr', target='{}').source"
    cpu = _modules_after(code.format("cpu"), tmp_path)
    assert "tessera.transpiler.target.cpu" in cpu
    assert not {m for m in cpu if "simt" in m or m.startswith(("numpy", "tessera.tune"))}
    opencl = _modules_after(code.format("opencl"), tmp_path)
    assert "tessera.transpiler.target.simt_module" in opencl
    assert "tessera.transpiler.target.cpu" not in opencl


def _parsing(code: str, cache: Path) -> set[str]:
    """The modules a run of ``code`` loads where it parses its file: with the file's
    kept tree (``kept_parse``) removed first."""
    shutil.rmtree(cache / "parsed", ignore_errors=True)
    return _modules_after(code, cache)


def test_the_parser_is_kept_and_a_damaged_copy_is_rebuilt(tmp_path: Path) -> None:
    """The first run writes Lark's stand-alone parser for the grammar; later runs that
    parse import it and not the lark package; a damaged copy is replaced."""
    code = "import tessera\nprint(tessera.compile_file('examples/mlp.tsr').inspect_ir('graph'))"
    assert "lark" in _modules_after(code, tmp_path)
    (kept,) = (tmp_path / "parser").glob("tessera_lalr_*.py")
    assert (tmp_path / "parser").stat().st_mode & 0o777 == 0o700
    loaded = _parsing(code, tmp_path)
    assert "lark" not in loaded and "tessera.transpiler.frontend.lark_runtime" in loaded
    for damage in ("not a parser\n", "Token = 1\n"):
        kept.write_text(damage)
        _parsing(code, tmp_path)  # check=True: the compilation still succeeds
        assert not kept.exists()
        _parsing(code, tmp_path)
        assert "Lark_StandAlone" in kept.read_text()
    # its compiled code is kept beside it, and read, not written, by the next run
    (code_file,) = (tmp_path / "parser").glob("tessera_lalr_*.code")
    inode = code_file.stat().st_ino
    assert "lark" not in _parsing(code, tmp_path)
    assert code_file.stat().st_ino == inode


def test_a_file_parsed_before_loads_no_parser(tmp_path: Path) -> None:
    """Its tree and the library's are kept: a second run of the same file loads
    neither the parser's tables nor the modules that drive them."""
    code = "import tessera\ntessera.compile_file('examples/mlp.tsr', target='cuda').source"
    assert "tessera.transpiler.frontend.lark_runtime" in _modules_after(code, tmp_path)
    loaded = _modules_after(code, tmp_path)
    assert not {m for m in loaded if m.endswith(("lark_runtime", "frontend.parser"))}


def test_without_a_private_folder_the_lark_package_parses(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o777)
    code = "import tessera\nprint(tessera.compile_file('examples/mlp.tsr').inspect_ir('graph'))"
    assert "lark" in _modules_after(code, tmp_path)
    assert not (tmp_path / "parser").exists() or not any((tmp_path / "parser").iterdir())


def test_a_cache_folder_others_can_write_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parser tables and template bytecode are loaded as code: a folder anyone can
    write to is never trusted with them."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    assert private_cache_dir("parser") == tmp_path / "parser"
    os.chmod(tmp_path / "parser", 0o777)
    assert private_cache_dir("parser") is None
    os.chmod(tmp_path, 0o777)
    assert private_cache_dir("templates") is None


def test_public_names_resolve_on_first_use() -> None:
    assert tessera.compile is tessera.transpiler.pipeline.compile
    assert set(dir(tessera)) == set(tessera.__all__)
    with pytest.raises(AttributeError, match="no attribute 'compiles'"):
        _ = tessera.compiles


def _no_parsing(*_: object) -> None:
    raise AssertionError("parsed again")


def test_library_trees_are_kept_and_a_stale_or_damaged_copy_is_parsed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    name = "tessera/stdlib/softmax.tsr"
    text = (ROOT / name).read_text()
    parsed = kept_parse.parse_library_file(name, text)
    (kept,) = (tmp_path / "library").glob("*.pickle")
    with monkeypatch.context() as patch:
        patch.setattr(parser, "parse", _no_parsing)
        assert kept_parse.parse_library_file(name, text) == parsed
        with pytest.raises(AssertionError, match="parsed again"):
            kept_parse.parse_library_file(name, text + "\n# an edit\n")
    kept.write_bytes(b"not a tree\n")
    assert kept_parse.parse_library_file(name, text) == parsed
    assert kept.read_bytes() != b"not a tree\n"


def test_a_users_tree_is_kept_for_its_name_and_text_and_points_at_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second compilation of the same text under the same name parses nothing and
    writes the same source; the kept tree's spans are the new compilation's file (its
    errors cite it, with its name); another name or an edit parses again."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    text = (ROOT / "examples" / "mlp.tsr").read_text()
    first = tessera.compile(text, filename="mlp.tsr", target="cuda").source
    with monkeypatch.context() as patch:
        patch.setattr(parser, "parse", _no_parsing)
        program = tessera.compile(text, filename="mlp.tsr", target="cuda")
        assert program.source == first
        spans = {id(s.span.source) for s in program.ir("ast").body}
        assert spans == {id(program.input)}
        # the parse the compiler would do again reaches the stand-in, an internal error
        with pytest.raises(InternalCompilerError, match="parsed again"):
            tessera.compile(text, filename="other.tsr", target="cuda")
        with pytest.raises(InternalCompilerError, match="parsed again"):
            tessera.compile(text + "\n# an edit\n", filename="mlp.tsr", target="cuda")


def test_a_file_with_findings_is_parsed_and_reported_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    text = "def f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return x +\n"
    for _ in range(2):
        with pytest.raises(tessera.CompileError, match=r"bad\.tsr:2"):
            tessera.compile(text, filename="bad.tsr", target="cpu")
    assert not (tmp_path / "parsed").exists() or not any((tmp_path / "parsed").iterdir())


_MLP = "import tessera\ntessera.compile_file('examples/mlp.tsr', target='cuda').source"


def test_where_python_keeps_no_bytecode_tesseras_is_kept(tmp_path: Path) -> None:
    """With PYTHONDONTWRITEBYTECODE, the modules a compilation imports are compiled by
    the first run, and the next runs read them without writing again; a damaged file
    is compiled anew and replaced."""
    _modules_after(_MLP, tmp_path, PYTHONDONTWRITEBYTECODE="1")
    kept = list((tmp_path / "bytecode").glob("tessera.*.code"))
    (pipeline,) = (tmp_path / "bytecode").glob("tessera.transpiler.pipeline.*")
    assert len(kept) > 50 and (tmp_path / "bytecode").stat().st_mode & 0o777 == 0o700
    inodes = {p: p.stat().st_ino for p in kept}
    _modules_after(_MLP, tmp_path, PYTHONDONTWRITEBYTECODE="1")
    assert {p: p.stat().st_ino for p in kept} == inodes
    good = pipeline.read_bytes()
    for damage in (b"", good[:100], good[:-1] + bytes([good[-1] ^ 1]), b"\0" * len(good)):
        pipeline.write_bytes(damage)
        loaded = _modules_after(_MLP, tmp_path, PYTHONDONTWRITEBYTECODE="1")
        assert "tessera.transpiler.pipeline" in loaded
        now = pipeline.read_bytes()
        assert now != damage and now[:32] == good[:32]  # rewritten, for the same source


def test_where_python_keeps_bytecode_tessera_keeps_none(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env |= {"PYTHONPYCACHEPREFIX": str(tmp_path / "python"), "TESSERA_CACHE_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", _MLP], env=env, cwd=ROOT, check=True)
    assert not (tmp_path / "bytecode").exists()
    assert any((tmp_path / "python").rglob("pipeline*.pyc"))


def test_a_read_only_or_missing_cache_folder_only_costs_time(tmp_path: Path) -> None:
    """The compilation succeeds (check=True) where nothing can be kept."""
    (tmp_path / "bytecode").mkdir(mode=0o500)
    _modules_after(_MLP, tmp_path, PYTHONDONTWRITEBYTECODE="1")
    if os.geteuid() != 0:  # root writes to a read-only folder all the same
        assert not any((tmp_path / "bytecode").iterdir())
    (tmp_path / "file").write_text("not a folder")
    _modules_after(_MLP, tmp_path / "file" / "cache", PYTHONDONTWRITEBYTECODE="1")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "bytecode").write_text("a file where the folder would be")
    _modules_after(_MLP, tmp_path / "other", PYTHONDONTWRITEBYTECODE="1")


def test_kept_code_serves_only_its_own_source_and_python(tmp_path: Path) -> None:
    kept = tmp_path / "m.code"
    source = b"x = 6 * 7\n"

    def run(text: bytes) -> object:
        scope: dict[str, object] = {}
        exec(compiled(text, "m.py", kept), scope)
        return scope["x"]

    assert run(source) == 42 and kept.is_file()
    assert run(b"x = 1\n") == 1  # another text: compiled, not the kept code of the first
    assert run(source) == 42
    good = kept.read_bytes()
    for damage in (b"", good[:40], good[:-3], good[:64] + b"\xff" * (len(good) - 64)):
        kept.write_bytes(damage)
        assert run(source) == 42
        assert kept.read_bytes() != damage and kept.read_bytes()[:32] == good[:32]
