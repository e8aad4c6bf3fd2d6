"""The schedule cache and the autotuner.

Most tests write records by hand, so that a tuned schedule differs from the
heuristic's and nothing depends on timing; the end-to-end tests measure for
real, at small sizes and budgets, and check what was measured, not how fast.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import re
import shutil
import stat
import warnings
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import numpy as np
import pytest

import tessera
from tessera.cli import main
from tessera.transpiler.frontend.fingerprint import fingerprints
from tessera.transpiler.schedule.lower import tuning_points
from tessera.transpiler.schedule.tuned import Timing, TunedRecord, TuningKey, knobs
from tessera.tune import CacheWarning, TuneError, cachefile, search, tune, tune_file
from tessera.tune.measure import disagreement
from tessera.tune.toolchain import toolchain

from .helpers import parse_ok
from .special_files import make_fifo, stat_as_device

pytestmark = pytest.mark.unit

SGEMM = """\
@kernel
def sgemm(A: Tensor["M", "K", f32], B: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return A @ B
"""
SIZES = {"M": 300, "N": 260, "K": 200}
#: A configuration the heuristic does not pick (it picks 128 x 256 x 256 on CPUs).
TUNED = {"block_m": 64, "block_n": 128, "block_k": 128}


@pytest.fixture(autouse=True)
def _build_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "build"))


def key_of(src: str = SGEMM, sizes: dict[str, int] = SIZES, launch: int = 0) -> TuningKey:
    program = tessera.compile(src, "k.tsr", target="cpu", defines=sizes, until="sched")
    points = tuning_points(program.ir("graph"), program.options,
                           fingerprints(program.ir("ast")), toolchain("cpu"))  # fmt: skip
    return points[launch].key


def record(
    key: TuningKey, config: dict[str, int] = TUNED, ms: float = 1.0, sizes: dict = SIZES
) -> TunedRecord:
    return TunedRecord(key, knobs(config), tuple(sorted(sizes.items())),
                       (Timing(knobs(config), ms),), 2 * ms)  # fmt: skip


def launch_of(src: str, cache: Path | None, sizes: dict[str, int] | None = SIZES) -> str:
    """The first launch's schedule lines in ``--emit sched``."""
    program = tessera.compile(src, "k.tsr", target="cpu", defines=sizes, schedule_cache=cache,
                              until="sched")  # fmt: skip
    text = program.inspect_ir("sched")
    return "\n".join(line for line in text.splitlines() if "schedule" in line or "tiles" in line)


def write(path: Path, *records: TunedRecord) -> Path:
    cachefile.update(path, records)
    return path


# -- using a cache -------------------------------------------------------------------


def test_hit_applies_the_tuned_tiles(tmp_path: Path) -> None:
    cache = write(tmp_path / "c.json", record(key_of()))
    assert "schedule heuristic" in launch_of(SGEMM, None)
    tuned = launch_of(SGEMM, cache)
    assert "schedule tuned" in tuned and "BM=64 BN=128 BK=128" in tuned


def test_hit_in_the_same_bucket_and_for_symbolic_sizes(tmp_path: Path) -> None:
    cache = write(tmp_path / "c.json", record(key_of()))
    assert "schedule tuned" in launch_of(SGEMM, cache, {"M": 400, "N": 500, "K": 129})
    assert "schedule tuned" in launch_of(SGEMM, cache, None)


def test_symbolic_sizes_take_the_largest_bucket(tmp_path: Path) -> None:
    small = record(key_of(), {"block_m": 32, "block_n": 64, "block_k": 128})
    large = record(key_of(sizes={"M": 4000, "N": 4000, "K": 4000}))
    cache = write(tmp_path / "c.json", small, large)
    assert "BM=64 BN=128" in launch_of(SGEMM, cache, None)
    assert "BM=32 BN=64" in launch_of(SGEMM, cache)


@pytest.mark.parametrize(
    ("why", "change"),
    [
        ("another bucket", {"key": {"bucket": [["m", 4096], ["n", 512], ["k", 256]]}}),
        ("another arch", {"key": {"arch": "x86-64-v3"}}),
        ("another toolchain", {"key": {"toolchain": "tesserac 0.0.1, g++ 9.0.0, elsewhere"}}),
        ("another kernel", {"key": {"kernel": "0123456789abcdef"}}),
        ("a config the machine cannot run", {"config": {"block_m": 4096, "block_n": 4096}}),
    ],
)
def test_miss(tmp_path: Path, why: str, change: dict) -> None:
    cache = write(tmp_path / "c.json", record(key_of()))
    document = json.loads(cache.read_text())
    for field, values in change.items():
        document["records"][0][field].update(values)
    cache.write_text(json.dumps(document))
    if "config" in change:  # a record the cache holds but cannot use says so
        with pytest.warns(CacheWarning, match="is not a point of the space tuned over"):
            assert "schedule heuristic" in launch_of(SGEMM, cache), why
    else:
        assert "schedule heuristic" in launch_of(SGEMM, cache), why


def test_cosmetic_edits_keep_the_record_and_real_edits_drop_it(tmp_path: Path) -> None:
    cache = write(tmp_path / "c.json", record(key_of()))
    cosmetic = "# a comment\n" + SGEMM.replace("return A @ B", "return A  @  B   # the product")
    other = (
        SGEMM
        + '\n\n@kernel\ndef neg(x: Tensor["N", f32]) -> Tensor["N", f32]:\n    return relu(x)\n'
    )
    assert "schedule tuned" in launch_of(cosmetic, cache)
    assert "schedule tuned" in launch_of(other, cache)
    assert "schedule heuristic" in launch_of(SGEMM.replace("A @ B", "relu(A @ B)"), cache)


def test_a_changed_helper_changes_the_fingerprint() -> None:
    base = "def scale(x):\n    return x * 2.0\n\n\n@kernel\ndef f(x: Tensor['N', f32]):\n"
    body = "    return scale(x)\n"
    first = fingerprints(parse_ok(base + body))["f"]
    again = fingerprints(parse_ok("# note\n" + base + body))["f"]
    changed = fingerprints(parse_ok(base.replace("2.0", "3.0") + body))["f"]
    assert first == again != changed


def test_a_space_decides_which_records_still_apply(tmp_path: Path) -> None:
    space = "@kernel.autotune(space=dict(BM=[32, 64], BN=[128]), budget_ms=5)\n"
    point = {"block_m": 64, "block_n": 128}  # a record holds the knobs the space searches
    cache = write(tmp_path / "c.json", record(key_of(space + SGEMM), point))
    assert "schedule tuned" in launch_of(space + SGEMM, cache)
    narrowed = space.replace("[32, 64]", "[32]")
    assert key_of(narrowed + SGEMM) == key_of(space + SGEMM)  # the space is not the kernel
    with pytest.warns(CacheWarning, match="block_m=64 block_n=128 is not a point of the space"):
        assert "schedule tuned" not in launch_of(narrowed + SGEMM, cache)


def test_an_explicit_schedule_is_never_overridden(tmp_path: Path) -> None:
    fixed = "@kernel.schedule(Schedule(block=(32, 64)))\n" + SGEMM
    cache = write(tmp_path / "c.json", record(key_of()))
    program = tessera.compile(fixed, "k.tsr", target="cpu", defines=SIZES, until="sched")
    assert tuning_points(program.ir("graph"), program.options, {}, "t") == []
    assert "schedule explicit" in launch_of(fixed, cache)


def test_compiles_with_a_cache_are_byte_identical(tmp_path: Path) -> None:
    cache = write(tmp_path / "c.json", record(key_of()))
    first = tessera.compile(SGEMM, "k.tsr", target="cpu", schedule_cache=cache).source
    again = tessera.compile(SGEMM, "k.tsr", target="cpu", schedule_cache=cache).source
    plain = tessera.compile(SGEMM, "k.tsr", target="cpu").source
    assert first == again != plain


# -- the file ------------------------------------------------------------------------


def test_the_file_is_stable_whatever_the_order(tmp_path: Path) -> None:
    a, b = record(key_of()), record(key_of(sizes={"M": 4000, "N": 4000, "K": 4000}))
    write(tmp_path / "ab.json", a, b)
    write(tmp_path / "ba.json", b, a)
    text = (tmp_path / "ab.json").read_text()
    assert text == (tmp_path / "ba.json").read_text()
    assert cachefile.read(tmp_path / "ab.json") == sorted([a, b], key=lambda r: str(r.key))
    assert '"format": "tessera-schedule-cache"' in text and '"version": 1' in text


def test_merge_keeps_both_and_the_faster_of_one_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key, other = key_of(), key_of(sizes={"M": 4000, "N": 4000, "K": 4000})
    slow = record(key, {"block_m": 32, "block_n": 64, "block_k": 128}, ms=3.0)
    fast = record(key, ms=1.0)
    write(tmp_path / "a.json", slow)
    write(tmp_path / "b.json", fast, record(other))
    status = main(["cache", "merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                   "--into", str(tmp_path / "c.json")])  # fmt: skip
    assert status == 0 and "2 records" in capsys.readouterr().out
    merged = cachefile.read(tmp_path / "c.json")
    assert main(["cache", "show", str(tmp_path / "c.json")]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 2 and all(
        line.startswith("sgemm/k0 [K=200 M=300 N=260]") for line in shown
    )
    assert main(["cache", "show", str(tmp_path / "none.json")]) == 0
    assert capsys.readouterr().out.endswith("none.json: no records\n")
    assert [r.key for r in merged] == sorted([key, other], key=str)
    assert next(r for r in merged if r.key == key).config == knobs(TUNED)


@pytest.mark.parametrize(
    "content",
    [
        "not json at all",
        '{"format": "tessera-schedule-cache", "version": 1, "records": [',  # cut short
        '{"format": "tessera-schedule-cache", "version": 99, "records": []}',
        '{"something": "else"}',
        "",
        '{"format": "tessera-schedule-cache", "version": 1, "records": 3}',
        '{"format": "tessera-schedule-cache", "version": 1, "records": null}',
        '{"format": "tessera-schedule-cache", "version": 1, "records": [{"measured": '
        + "9" * 5000
        + "}]}",
        '{"format": "tessera-schedule-cache", "version": 1, "records": '
        + "[" * 100_000
        + "]" * 100_000
        + "}",
    ],
    ids=[
        "text",
        "cut short",
        "version",
        "other",
        "empty",
        "records 3",
        "records null",
        "long number",
        "deep nesting",
    ],
)
def test_a_bad_file_is_ignored_with_a_warning(tmp_path: Path, content: str) -> None:
    cache = tmp_path / "c.json"
    cache.write_text(content)
    with pytest.warns(CacheWarning, match="ignoring it"):
        assert "schedule heuristic" in launch_of(SGEMM, cache)
    with pytest.warns(CacheWarning):
        cachefile.update(cache, [record(key_of())])
    assert (tmp_path / "c.json.unreadable").read_text() == content
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "schedule tuned" in launch_of(SGEMM, cache)


def test_a_malformed_record_is_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    cache = write(tmp_path / "c.json", record(key_of()))
    document = json.loads(cache.read_text())
    document["records"].append({"key": {"function": "sgemm"}})
    cache.write_text(json.dumps(document))
    with pytest.warns(CacheWarning, match="record 1 is malformed"):
        assert len(cachefile.read(cache)) == 1


#: Records that a hand edit, a merge gone wrong or another program can leave: (where in
#: the record, the value put there, what the warning says). ``()`` is the record itself.
MALFORMED = {
    "not an object": ((), [1, 2], "the record is an array, not an object"),
    "config a string": (("config",), "block_m=64", 'config is "block_m=64", not an object'),
    "config 'abc'": (("config", "block_m"), "abc", "block_m takes positive integers, not 'abc'"),
    "config 0": (("config", "block_n"), 0, "block_n takes positive integers, not 0"),
    "config -64": (("config", "block_m"), -64, "block_m takes positive integers, not -64"),
    "config true": (("config", "block_m"), True, "block_m takes positive integers, not True"),
    "config 64.5": (("config", "block_k"), 64.5, "block_k takes positive integers, not 64.5"),
    "config huge": (("config", "block_k"), 1 << 40, "block_k is at most 65536"),
    "unknown knob": (("config", "tiles"), 64, "there is no knob 'tiles'"),
    "sizes a list": (("sizes",), [["M", 300]], "sizes is an array, not an object"),
    "size zero": (("sizes", "M"), 0, "sizes.M is 0, not an integer of at least 1"),
    "size Infinity": (("sizes", "M"), math.inf, "sizes.M is Infinity"),
    "ms Infinity": (("best", 0, "ms"), math.inf, "best[0].ms is Infinity, not a finite time"),
    "ms NaN": (("best", 0, "ms"), math.nan, "best[0].ms is NaN"),
    "ms negative": (("best", 0, "ms"), -1.0, "best[0].ms is -1.0"),
    "baseline Infinity": (("baseline_ms",), -math.inf, "baseline_ms is -Infinity"),
    "best a string": (("best",), "fast", 'best is "fast", not an array'),
    "best config": (("best", 0, "config", "block_m"), -64, "best[0].config: block_m takes"),
    "bucket Infinity": (("key", "bucket", 0, 1), math.inf, "key.bucket[0][1] is Infinity"),
    "bucket pair": (("key", "bucket", 0), ["m"], "key.bucket[0] has 1 items"),
    "key a string": (("key",), "sgemm", 'key is "sgemm", not an object'),
    "kernel a number": (("key", "kernel"), 12, "key.kernel is 12, not a string"),
    "measured -1": (("measured",), -1, "measured is -1, not an integer of at least 0"),
}


def edited(item: Any, where: tuple[Any, ...], value: Any) -> Any:
    if not where:
        return value
    copy = json.loads(json.dumps(item))
    inner = copy
    for step in where[:-1]:
        inner = inner[step]
    inner[where[-1]] = value
    return copy


def cache_with(path: Path, where: tuple[Any, ...], value: Any) -> Path:
    """A cache whose one record (tuned for SGEMM at SIZES) has ``value`` at ``where``."""
    document = json.loads(write(path, record(key_of())).read_text())
    document["records"][0] = edited(document["records"][0], where, value)
    path.write_text(json.dumps(document))
    return path


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


def compiled_with(cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``tesserac`` on SGEMM with the cache: it succeeds, writes the heuristic schedule's
    source, and returns what it printed on standard error."""
    source = tmp_path / "k.tsr"
    source.write_text(SGEMM)
    out = tmp_path / "k.cpp"
    sizes = [arg for name, size in SIZES.items() for arg in ("-D", f"{name}={size}")]
    status, _, err = cli([str(source), *sizes, "--schedule-cache", str(cache), "-o", str(out)],
                         capsys)  # fmt: skip
    assert status == 0, err
    untuned = tessera.compile(SGEMM, "k.tsr", target="cpu", defines=SIZES).source
    assert out.read_text() == untuned
    return err


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_record_is_dropped_with_a_warning_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    where, value, why = MALFORMED[case]
    cache = cache_with(tmp_path / "c.json", where, value)
    named = "record 0 " if where in ((), ("key",)) else "record 0 (sgemm/k0) "
    warning = f"tesserac: warning: schedule cache {cache}: {named}is malformed ("
    with pytest.warns(CacheWarning, match=re.escape(why)):
        assert "schedule heuristic" in launch_of(SGEMM, cache)
    err = compiled_with(cache, tmp_path, capsys)
    assert err.startswith(warning) and why in err and err.endswith("); skipped\n")
    status, out, err = cli(["cache", "show", str(cache)], capsys)
    assert (status, out) == (0, f"{cache}: no records\n")
    assert err.startswith(warning) and why in err


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"block_m": 48, "block_n": 128, "block_k": 128}, "block_m=48 block_n=128 is not a point"),
        ({"block_m": 64, "block_n": 128}, "block_m=64 block_n=128 is not a point"),
        ({**TUNED, "warps": 2}, "warps=2 is not a point"),
        ({"block_m": 256, "block_n": 512, "block_k": 512}, "keeps 1536 KiB of panels"),
    ],
    ids=["not in the space", "a knob missing", "a knob more", "over the arch's limits"],
)
def test_a_record_the_kernel_or_machine_cannot_take_is_dropped_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: dict[str, int], why: str
) -> None:
    cache = write(tmp_path / "c.json", record(key_of(), config))
    with pytest.warns(CacheWarning, match=re.escape(why)):
        assert "schedule heuristic" in launch_of(SGEMM, cache)
    err = compiled_with(cache, tmp_path, capsys)
    assert err.startswith("tesserac: warning: schedule cache record sgemm/k0 ")
    assert why in err and err.endswith("; not used\n")


def test_show_lists_a_record_measured_at_zero_ms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Times are rounded to 0.1 us in the file, so a tiny kernel's can be 0."""
    cache = write(tmp_path / "c.json", record(key_of(), ms=0.0))
    status, out, _ = cli(["cache", "show", str(cache)], capsys)
    assert status == 0 and out.endswith(": 0.000 ms (untuned 0.000 ms)\n")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{", "is not valid JSON"),
        ('{"format": "tessera-schedule-cache", "version": 1, "records": null}', '"records": null'),
        ('{"format": "tessera-schedule-cache", "version": 1, "records": '
         + "[" * 100_000 + "]" * 100_000 + "}", "nests arrays or objects too deeply"),
    ],
    ids=["cut short", "records null", "deep nesting"],
)  # fmt: skip
def test_the_cli_warns_about_a_bad_cache_and_compiles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, why: str
) -> None:
    (tmp_path / "c.json").write_text(content)
    err = compiled_with(tmp_path / "c.json", tmp_path, capsys)
    assert err.startswith("tesserac: warning: schedule cache") and why in err
    status, out, err = cli(["cache", "show", str(tmp_path / "c.json")], capsys)
    assert status == 0 and out.endswith("no records\n") and why in err


def merged_into(
    into: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """``tesserac cache merge`` of a one-record cache into ``into``."""
    source = write(tmp_path / "source.json", record(key_of()))
    return cli(["cache", "merge", str(source), "--into", str(into)], capsys)


def test_a_cache_through_a_symlink_writes_its_target_and_keeps_its_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "shared").mkdir()
    target = write(tmp_path / "shared" / "c.json", record(key_of(sizes={"M": 9, "N": 9, "K": 9})))
    target.chmod(0o640)
    link = tmp_path / "c.json"
    link.symlink_to(Path("shared") / "c.json")
    status, out, err = merged_into(link, tmp_path, capsys)
    assert (status, err) == (0, "") and out.endswith("2 records\n")
    assert link.is_symlink() and len(cachefile.read(target)) == 2
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert (tmp_path / "shared" / "c.json.lock").exists()
    assert not (tmp_path / "c.json.lock").exists()


def test_a_cache_into_a_fifo_is_written_and_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--into /dev/stdout``: a FIFO stands in for it, so no device is touched."""
    fifo = tmp_path / "pipe"
    reader = make_fifo(fifo)
    status, _, err = merged_into(fifo, tmp_path, capsys)
    assert (status, err) == (0, "")
    assert reader.text() == cachefile.dumps([record(key_of())])
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "pipe", "source.json", "source.json.lock"
    ]  # fmt: skip


def test_a_cache_into_a_device_is_written_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--into /dev/null`` as root must neither move the node aside as unreadable nor
    put a lock beside it. A regular file stands in for the device: ``os.stat`` says it
    is one."""
    source = write(tmp_path / "source.json", record(key_of()))
    device = tmp_path / "null"
    device.write_text("not a cache")
    inode = device.stat().st_ino
    stat_as_device(monkeypatch, device)
    status, _, err = cli(["cache", "merge", str(source), "--into", str(device)], capsys)
    monkeypatch.undo()
    assert (status, err) == (0, "")
    assert device.stat().st_ino == inode
    assert device.read_text() == cachefile.dumps([record(key_of())])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "null", "source.json", "source.json.lock"
    ]  # fmt: skip


def test_a_cache_that_cannot_be_written_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    into = tmp_path / "file" / "c.json"
    status, out, err = merged_into(into, tmp_path, capsys)
    assert (status, out) == (1, "")
    assert err == f"tesserac: error: cannot write '{into}': Not a directory\n"


def _writer(path: str, first: int, start: Any) -> None:
    """Write 15 records one at a time, as a tuner does after each launch."""
    start.wait()  # all writers at once, so that their updates overlap
    for m in range(first, first + 15):
        key = TuningKey("f", "k0", "0" * 16, "cpu", "native", "t", "f32", (("m", 1 << m),))
        cachefile.update(path, [TunedRecord(key, (("block_m", 64),), (), (), None)])


def test_concurrent_processes_writing_one_cache_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.json")
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(3)
    writers = [context.Process(target=_writer, args=(path, first, start)) for first in (0, 15, 30)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
    assert [w.exitcode for w in writers] == [0, 0, 0]
    buckets = sorted(r.key.bucket[0][1] for r in cachefile.read(path))
    assert buckets == [1 << m for m in range(45)]


# -- checking and tuning -------------------------------------------------------------


def test_disagreement_catches_wrong_and_non_finite_outputs() -> None:
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((33, 17)).astype(np.float32)
    assert disagreement(ref + np.float32(1e-5), ref) is None
    wrong = ref.copy()
    wrong[5, 3] += 0.5
    assert "largest error" in (disagreement(wrong, ref) or "")
    poisoned = ref.copy()
    poisoned[0, 0] = np.nan
    assert "non-finite" in (disagreement(poisoned, ref) or "")


@pytest.mark.parametrize(
    ("decorator", "message"),
    [
        ('@kernel.autotune(metric="throughput")', 'the one metric is "latency_ms"'),
        ("@kernel.autotune(budget_ms=-5)", "budget_ms is a positive number"),
        ("@kernel.autotune(cache=3)", "cache is a file path"),
    ],
)
def test_autotune_options_are_checked(decorator: str, message: str) -> None:
    with pytest.raises(tessera.CompileError, match=message):
        tessera.compile(decorator + "\n" + SGEMM, "k.tsr")


def test_tuning_needs_a_file_sizes_and_a_measurable_target(tmp_path: Path) -> None:
    with pytest.raises(tessera.CompileError, match="no such file"):
        tune_file(tmp_path / "missing.tsr", defines=SIZES)
    with pytest.raises(TuneError, match=re.escape("give -D K=... -D N=...")):
        tune(SGEMM, defines={"M": 64})
    with pytest.raises(TuneError, match="not supported yet"):
        tune(SGEMM, target="cuda", defines=SIZES)


needs_gpp = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@needs_gpp
@pytest.mark.execute
def test_tune_measures_records_and_the_record_compiles_correctly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    space = "@kernel.autotune(space=dict(BM=[32, 64, 512, 640], BN=[64, 128]), budget_ms=20)\n"
    cache = tmp_path / "c.json"
    with caplog.at_level(logging.INFO, logger="tessera.tune"):
        (rec,) = tune(space + SGEMM, "k.tsr", defines={**SIZES, "X": 5}, cache=cache)
    assert rec.sizes == tuple(sorted(SIZES.items()))  # the function's own sizes
    for n in (64, 128):
        why = "block_m 640 only pads what block_m 512 covers (m = 300)"
        assert f"pruned block_m=640 block_n={n}: {why}" in caplog.text
    config = dict(rec.config)
    assert config["block_m"] in (32, 64, 512) and config["block_n"] in (64, 128)
    assert len(rec.best) == 5 and rec.baseline_ms is not None  # of the 3 x 2 that fit
    assert [t.ms for t in rec.best] == sorted(t.ms for t in rec.best)
    (saved,) = cachefile.read(cache)
    assert (saved.key, saved.config) == (rec.key, rec.config)
    program = tessera.compile(space + SGEMM, "k.tsr", target="cpu", schedule_cache=cache)
    assert "schedule tuned" in program.inspect_ir("sched")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((SIZES["M"] - 3, SIZES["K"] + 5)).astype(np.float32)
    b = rng.standard_normal((SIZES["K"] + 5, SIZES["N"] + 1)).astype(np.float32)
    out = np.full((a.shape[0], b.shape[1]), np.nan, np.float32)
    program.load().sgemm(a, b, out=out)
    reference = a.astype(np.float64) @ b.astype(np.float64)
    assert np.max(np.abs(out - reference)) < 1e-3 * np.max(np.abs(reference))


@needs_gpp
@pytest.mark.execute
def test_a_nearby_record_warm_starts_the_search(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    near = {"M": 1000, "N": 260, "K": 200}
    cache = write(tmp_path / "c.json", record(key_of(sizes=near), sizes=near))
    with caplog.at_level(logging.INFO, logger="tessera.tune"):
        tune(SGEMM, "k.tsr", defines=SIZES, cache=cache, budget_ms=5, max_candidates=3)
    assert "warm start from [K=200 M=1000 N=260]" in caplog.text
    assert "3 candidates to measure" in caplog.text  # untuned, warm start, best by cost
    assert len(cachefile.read(cache)) == 2


@needs_gpp
@pytest.mark.execute
def test_the_cli_tunes_into_a_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "k.tsr"
    source.write_text(SGEMM)
    cache = tmp_path / "c.json"
    status = main(["tune", str(source), "-D", "M=40", "-D", "N=70", "-D", "K=30",
                   "--cache", str(cache), "--budget-ms", "5", "--max-candidates", "2"])  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.startswith("sgemm/k0 [K=30 M=40 N=70] ") and "untuned" in out
    assert "measuring" in err  # the progress lines
    assert [r.key.function for r in cachefile.read(cache)] == ["sgemm"]


@needs_gpp
@pytest.mark.execute
def test_the_cli_tunes_past_malformed_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every malformed record is dropped with a warning, and one of the kernel's own that
    does not fit its space is no warm start; the tuned record is saved beside it."""
    source = tmp_path / "k.tsr"
    source.write_text(SGEMM)
    unfit = record(key_of(), {"block_m": 48, "block_n": 128, "block_k": 128})
    cache = write(tmp_path / "c.json", unfit)
    document = json.loads(cache.read_text())
    good = document["records"][0]
    document["records"] += [edited(good, where, value) for where, value, _ in MALFORMED.values()]
    cache.write_text(json.dumps(document))
    status, out, err = cli(["tune", str(source), "-D", "M=40", "-D", "N=70", "-D", "K=30",
                            "--cache", str(cache), "--budget-ms", "5", "--max-candidates", "2"],
                           capsys)  # fmt: skip
    assert status == 0, err
    assert out.startswith("sgemm/k0 [K=30 M=40 N=70] ")
    for index, (_, _, why) in enumerate(MALFORMED.values(), start=1):
        assert f"record {index} " in err and why in err
    assert [r.config for r in cachefile.read(cache)] == [unfit.config, ANY]


@needs_gpp
@pytest.mark.execute
def test_the_cli_says_when_the_cache_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "k.tsr"
    source.write_text(SGEMM)
    (tmp_path / "file").write_text("")
    cache = tmp_path / "file" / "c.json"
    status, out, err = cli(["tune", str(source), "-D", "M=40", "-D", "N=70", "-D", "K=30",
                            "--cache", str(cache), "--budget-ms", "5", "--max-candidates", "2"],
                           capsys)  # fmt: skip
    assert (status, out) == (1, "")
    assert err.endswith(f"tesserac: error: {cache}: Not a directory\n")


@needs_gpp
@pytest.mark.execute
def test_the_cli_tunes_into_a_fifo_without_reading_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--cache /dev/stdout``: the cache is only written (reading it would wait for input
    that never comes). A FIFO stands in for the device."""
    source = tmp_path / "k.tsr"
    source.write_text(SGEMM)
    fifo = tmp_path / "pipe"
    reader = make_fifo(fifo)
    status, _, err = cli(["tune", str(source), "-D", "M=40", "-D", "N=70", "-D", "K=30",
                          "--cache", str(fifo), "--budget-ms", "5", "--max-candidates", "2"],
                         capsys)  # fmt: skip
    assert status == 0, err
    assert '"function": "sgemm"' in (reader.text() or "")
    assert stat.S_ISFIFO(fifo.stat().st_mode)


@needs_gpp
@pytest.mark.execute
def test_a_candidate_that_disagrees_is_dropped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    space = "@kernel.autotune(space=dict(BM=[32, 64], BN=[64]), budget_ms=5)\n"
    monkeypatch.setattr(search, "disagreement", lambda output, reference: "made to differ")
    with caplog.at_level(logging.WARNING, logger="tessera.tune"):
        (rec,) = tune(space + SGEMM, "k.tsr", defines=SIZES)
    assert caplog.text.count("made to differ (a compiler bug; please report it)") == 1
    assert rec.measured == 1 and len(rec.best) == 1  # only the untuned baseline is left
