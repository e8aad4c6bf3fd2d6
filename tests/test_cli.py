"""The ``tesserac`` contract: options, exit statuses, output files, determinism."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import tessera
from tessera.cli import main
from tessera.transpiler import pipeline
from tessera.transpiler.options import Options, OptionsError, target_for_output
from tessera.transpiler.target.simt_host import host_source

from .conftest import ROOT
from .helpers import BRANCH_WITH_STATEMENTS
from .special_files import make_fifo

pytestmark = pytest.mark.unit
ATTENTION = str(ROOT / "examples" / "attention.tsr")


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        status = main(args)
    except SystemExit as exc:  # argparse exits on usage errors
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def test_emit_ast_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run([ATTENTION, "--emit", "ast"], capsys)
    assert (status, err) == (0, "")
    assert out == tessera.compile_file(ATTENTION).inspect_ir("ast")


def test_output_file_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "attention.ast.tsr"
    status, out, _ = run([ATTENTION, "--emit", "ast", "-o", str(target)], capsys)
    assert (status, out) == (0, "")
    assert target.read_text() == tessera.compile_file(ATTENTION).inspect_ir("ast")
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temporary left


def test_errors_leave_no_output_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "bad.tsr"
    source.write_text("def f(x)\n    return x\n")
    target = tmp_path / "out.tsr"
    status, _, err = run([str(source), "--emit", "ast", "-o", str(target)], capsys)
    assert status == 1
    assert "bad.tsr:1:9: error: expected ':' after the function signature" in err
    assert not target.exists()


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("no/dir/x.cu", "No such file or directory"),
        ("file/x.cu", "Not a directory"),
        ("folder", "Is a directory"),
    ],
)
def test_unwritable_output_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, why: str
) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "folder").mkdir()
    status, out, err = run([ATTENTION, "-o", str(tmp_path / where)], capsys)
    assert (status, out) == (1, "")
    assert err == f"tesserac: error: cannot write '{tmp_path / where}': {why}\n"


def test_output_through_a_symlink_writes_its_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "src").mkdir()
    for name in ("attention.cu", "attention_loader.py"):
        (tmp_path / "src" / name).write_text("old")
        (tmp_path / name).symlink_to(Path("src") / name)
    cu, loader = tmp_path / "attention.cu", tmp_path / "attention_loader.py"
    status, _, err = run([ATTENTION, "-o", str(cu), "--python-loader", str(loader)], capsys)
    assert status == 0, err
    assert cu.is_symlink() and loader.is_symlink()
    assert 'extern "C" __global__' in (tmp_path / "src" / "attention.cu").read_text()
    assert "RawModule" in (tmp_path / "src" / "attention_loader.py").read_text()


def test_outputs_get_the_mode_of_a_new_file_or_of_the_one_they_replace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cu, loader = tmp_path / "attention.cu", tmp_path / "attention_loader.py"
    loader.write_text("old")
    loader.chmod(0o640)
    old = os.umask(0o022)
    try:
        status, _, err = run([ATTENTION, "-o", str(cu), "--python-loader", str(loader)], capsys)
    finally:
        os.umask(old)
    assert status == 0, err
    assert stat.S_IMODE(cu.stat().st_mode) == 0o644
    assert stat.S_IMODE(loader.stat().st_mode) == 0o640


def test_output_to_a_fifo_writes_it_and_leaves_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As ``-o /dev/stdout`` or ``-o /dev/null`` does, without touching a real device."""
    fifo = tmp_path / "pipe"
    reader = make_fifo(fifo)
    status, _, err = run([ATTENTION, "--emit", "ast", "-o", str(fifo)], capsys)
    assert status == 0, err
    assert reader.text() == tessera.compile_file(ATTENTION).inspect_ir("ast")
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_kernels_a_backend_does_not_lower_yet_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "branch.tsr"
    path.write_text(BRANCH_WITH_STATEMENTS)
    status, out, err = run([str(path), "--emit", "target", "--target", "opencl"], capsys)
    assert status == 2 and out == ""
    assert "branch.tsr:1:1: 'normalize_if': the opencl backend does not lower" in err


def test_default_is_target_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run([ATTENTION, "-o", str(tmp_path / "attention.cu")], capsys)
    assert status == 0, err
    assert 'extern "C" __global__' in (tmp_path / "attention.cu").read_text()
    status, _, err = run([ATTENTION, "-o", str(tmp_path / "attention.cpp")], capsys)
    assert status == 0, err
    text = (tmp_path / "attention.cpp").read_text()
    assert 'extern "C" void tessera_attention(' in text


def test_program_errors_come_before_missing_stages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "bad.tsr"
    source.write_text("x = (\n")
    status, _, err = run([str(source), "--emit", "sched"], capsys)
    assert status == 1 and "'(' was never closed" in err


def test_a_define_that_takes_a_dim_past_64_bits_is_an_error_at_the_dim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value that fits alone may not fit multiplied: the dim is checked with it."""
    source = tmp_path / "big.tsr"
    source.write_text(
        '@kernel\ndef f(x: Tensor["R", "4*N", f32]) -> Tensor["R", "4*N", f32]:\n'
        "    return x * 2.0\n"
    )
    status, out, err = run([str(source), "--target", "cpu", "-D", f"N={2**62}"], capsys)
    assert status == 1 and out == ""
    assert f"big.tsr:2:22: error: this dim is {2**64}, more than a 64-bit size holds" in err
    status, out, _ = run([str(source), "--target", "cpu", "-D", f"N={2**61 - 1}"], capsys)
    assert status == 0 and f"{2**63 - 4}" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "metal"], "invalid choice: 'metal'"),
        (["--emit", "sass"], "invalid choice: 'sass'"),
        (["--target", "hip", "--emit", "ptx"], "for the cuda target, not hip"),
        (["--target", "cpu", "--emit", "meta", "--resources"], "--resources goes with"),
        (["--target", "cuda", "--arch", "gfx90a"], "target cuda has no arch 'gfx90a'"),
        (["--arch", "gfx90a"], "target cuda has no arch 'gfx90a'"),
        (["-D", "S"], "expected SYM=VALUE"),
        (["-D", "S=0"], "must be a positive integer"),
        (["-D", "S=abc"], "must be a positive integer"),
        (["-D", "S=-3"], "must be a positive integer"),
        (["-D", "S=9223372036854775808"], "does not fit in 64 bits (at most 9223372036854775807)"),
        (["-D", "S=99999999999999999999999"], "does not fit in 64 bits"),
        (["-D", "1S=4"], "a symbol must be a name"),
        (["-D", "S=4", "-D", "S=8"], "-D S given twice"),
        (["--kernel", "nope", "--emit", "ast"], "no kernel named 'nope'"),
        (["-o", "notes.txt", "--arch", "gfx90a"], "target cuda has no arch 'gfx90a'"),
    ],
)
def test_usage_errors_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run([ATTENTION, *args], capsys)
    assert status == 2
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("stage", ["target", "sched", "tile", "meta"])
def test_without_a_target_or_an_output_suffix_the_default_is_cuda_sm_80(
    stage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """As --help says: the stages that need a target get CUDA for sm_80."""
    status, out, err = run([ATTENTION, "--emit", stage], capsys)
    assert (status, err) == (0, "")
    program = tessera.compile_file(ATTENTION, target="cuda", arch="sm_80")
    explicit = program.inspect_ir(stage)
    if stage == "target":  # and the host launchers after the kernels
        explicit += host_source(program.ir("meta"))
    assert out == explicit


def test_kernel_selects_one_function(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run([ATTENTION, "--emit", "graph", "--kernel", "flash_attention"], capsys)
    assert status == 0
    assert "func @flash_attention" in out and "func @attention " not in out


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["no/such/file.tsr", "--emit", "ast"], capsys)
    assert status == 1
    assert "error: no such file: 'no/such/file.tsr'" in err


def test_directory_instead_of_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run([str(tmp_path), "--emit", "ast"], capsys)
    assert status == 1 and "is a directory" in err


def test_internal_error_exits_3_and_names_the_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_: object) -> None:
        raise KeyError("oops")

    stage = pipeline.PIPELINE[0]
    monkeypatch.setattr(pipeline, "PIPELINE", (pipeline.Stage(stage.name, broken, stage.show),))
    monkeypatch.setenv("TESSERA_REPRO_DIR", str(tmp_path))
    status, _, err = run([ATTENTION, "--emit", "ast"], capsys)
    assert status == 3
    assert "internal compiler error in stage 'ast'" in err
    assert "a repro pack for the report:" in err  # tests/test_repro.py looks inside


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["--version"], capsys)
    assert (status, out.strip()) == (0, f"tesserac {tessera.__version__}")
    status, out, _ = run(["--help"], capsys)
    assert status == 0
    for needle in ("--emit", "--target", "-D SYM=VALUE", "exit status", ".cu cuda"):
        assert needle in out


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("k.cu", "cuda"),
        ("k.hip", "hip"),
        ("k.cpp", "cpu"),
        ("k.cl", "opencl"),
        ("k.sycl.cpp", "sycl"),
        ("k.txt", None),
    ],
)
def test_target_follows_the_output_suffix(name: str, target: str | None) -> None:
    assert target_for_output(name) == target


def test_options_normalise_defines() -> None:
    a = Options.create("cpu", defines=["S=1024", "D=64"])
    b = Options.create("cpu", defines={"D": 64, "S": 1024})
    assert a == b and a.defines == (("D", 64), ("S", 1024))
    assert a.cache_key() == b.cache_key() != Options.create("cpu").cache_key()
    assert Options.create("cuda").resolved_arch == "sm_80"
    with pytest.raises(OptionsError):
        Options.create("cpu", defines={"S": True})


def test_installed_command_is_deterministic(tmp_path: Path) -> None:
    """Two runs of the installed entry point give byte-identical output."""
    tesserac = Path(sys.executable).with_name("tesserac")
    command = [str(tesserac)] if tesserac.exists() else [sys.executable, "-m", "tessera"]
    outputs = []
    for i in range(2):
        target = tmp_path / f"out{i}.tsr"
        subprocess.run([*command, ATTENTION, "--emit", "ast", "-o", str(target)], check=True)
        outputs.append(target.read_bytes())
    assert outputs[0] == outputs[1] and outputs[0]


@pytest.mark.parametrize("emit", ["graph", "sched", "tile", "target", "meta"])
def test_two_checkouts_give_the_same_bytes(emit: str, tmp_path: Path) -> None:
    """The same source in two folders, compiled from two working directories, once by a
    relative path and once by an absolute one, gives byte-identical output: what names
    the input names the file, not where it was found."""
    tesserac = Path(sys.executable).with_name("tesserac")
    command = [str(tesserac)] if tesserac.exists() else [sys.executable, "-m", "tessera"]
    outputs = []
    for checkout, relative in (("a", True), ("b/deeper", False)):
        folder = tmp_path / checkout / "examples"
        folder.mkdir(parents=True)
        shutil.copy(ATTENTION, folder / "attention.tsr")
        path = "examples/attention.tsr" if relative else str(folder / "attention.tsr")
        out = tmp_path / checkout / f"out.{emit}"
        subprocess.run([*command, path, "--target", "hip", "--emit", emit, "-o", str(out)],
                       check=True, cwd=folder.parent)  # fmt: skip
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    assert str(tmp_path).encode() not in outputs[0]


def test_the_header_names_version_source_hash_target_and_schedules() -> None:
    text = Path(ATTENTION).read_text()
    program = tessera.compile(text, "some/folder/attention.tsr", target="cuda", arch="sm_90a")
    digest = hashlib.sha256(text.encode()).hexdigest()
    head = program.source.splitlines()[:6]
    assert head == [
        f"// Generated by tesserac {tessera.__version__} from attention.tsr for cuda sm_90a; "
        "do not edit.",
        f"// Source SHA-256: {digest}",
        "// Schedules (template, tiles, warps, stages; what chose them):",
        "// - attention k0: flash_attention BM=128 BN=128 BD=128, 8 warps, 2 stages "
        "(the heuristics)",
        "// - flash_attention k0: tile_kernel T.m=128 T.n=128 T.d=128, 8 warps, 2 stages "
        "(the source's autotuning space)",
        head[5],
    ]
    facts = program.ir("meta")["provenance"]
    assert (facts["source"], facts["sha256"]) == ("attention.tsr", digest)
    assert [s["chosen_by"] for s in facts["schedules"]] == ["heuristic", "space"]


def test_the_cli_module_run_as_a_script_compiles(tmp_path: Path) -> None:
    """``python -m tessera.cli.main FILE`` is the command, not a silent import: a bad
    file's errors and status come back as from ``tesserac``."""
    bad = tmp_path / "bad.tsr"
    bad.write_text('def f(x: Tensor["N", f32]) -> Tensor["N", f32]:\n    return y\n')
    done = subprocess.run(
        [sys.executable, "-m", "tessera.cli.main", str(bad), "--target", "cpu"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "bad.tsr:2:12: error: unknown name 'y'" in done.stderr


def test_a_function_of_a_program_not_loaded_says_to_load_it() -> None:
    program = tessera.compile('def f(x: Tensor["N", f32]) -> Tensor["N", f32]:\n    return x\n')
    with pytest.raises(AttributeError, match=r"compiled but not loaded.*prog\.load\(\)\.f"):
        program.f  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'g'"):
        program.g  # noqa: B018
