"""The schedule cache file: JSON that people commit, diff, merge and share.

The file holds one record per tuned launch, sorted by key, with sorted keys
and no timestamps, so that a re-tune shows as a small diff and two caches
merge by taking the union (the faster record where both have one key).

A cache is a convenience, so a bad one never stops a compile or a tuning
run: a file that is not JSON, is cut short, or has another format version is
ignored with a warning, and a tuning run that writes to it first moves it
aside to ``PATH.unreadable``. Writers take an exclusive lock on ``PATH.lock``,
re-read the file under it, merge, and replace the file atomically, so two
tuners sharing a cache lose no record.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..files import write_file
from ..transpiler.schedule.tuned import Timing, TunedRecord, TunedSchedules, TuningKey, knobs

__all__ = ["FORMAT", "VERSION", "CacheWarning", "read", "merge", "update", "schedules_for"]

FORMAT = "tessera-schedule-cache"
VERSION = 1


class CacheWarning(UserWarning):
    """A schedule cache file could not be used as it is."""


def read(path: str | Path) -> list[TunedRecord]:
    """The records of a cache file; none (with a warning) if it is missing or unreadable."""
    return _read(Path(path))[0]


def schedules_for(path: str | Path, toolchain: str) -> TunedSchedules:
    """What a compile may use from a cache file: the records for this toolchain."""
    return TunedSchedules(toolchain, tuple(r for r in read(path) if r.key.toolchain == toolchain))


def merge(*caches: Iterable[TunedRecord]) -> list[TunedRecord]:
    """The union of caches, sorted by key; where two have one key, the faster record
    (the earlier cache on a tie)."""
    merged: dict[str, TunedRecord] = {}
    for records in caches:
        for record in records:
            key = str(record.key)
            if key not in merged or record.ms < merged[key].ms:
                merged[key] = record
    return [merged[k] for k in sorted(merged)]


def update(path: str | Path, records: Iterable[TunedRecord]) -> list[TunedRecord]:
    """Merge records into a cache file under its lock; returns what the file now holds.
    A symlinked cache is the file it points to: its lock and the file moved aside sit
    there, and the link stays."""
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        current, readable = _read(path)
        if not readable:
            os.replace(path, path.with_name(path.name + ".unreadable"))
            warnings.warn(
                f"schedule cache {path}: moved the unreadable file to {path.name}.unreadable",
                CacheWarning,
                stacklevel=2,
            )
        merged = merge(current, records)
        write_file(path, dumps(merged))
    return merged


def dumps(records: Iterable[TunedRecord]) -> str:
    document = {"format": FORMAT, "version": VERSION, "records": [_encode(r) for r in records]}
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


# -- reading ------------------------------------------------------------------------


def _read(path: Path) -> tuple[list[TunedRecord], bool]:
    """(records, readable): a missing file is readable and empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], True
    except (OSError, UnicodeDecodeError) as exc:
        return _unusable(path, f"cannot be read ({exc})")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        return _unusable(path, f"is not valid JSON (line {exc.lineno}: {exc.msg})")
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return _unusable(path, f'is not a Tessera schedule cache (no "format": "{FORMAT}")')
    if document.get("version") != VERSION:
        return _unusable(
            path, f"has format version {document.get('version')!r}; this tesserac reads {VERSION}"
        )
    records = []
    for index, item in enumerate(document.get("records", [])):
        try:
            records.append(_decode(item))
        except (KeyError, TypeError, ValueError) as exc:
            warnings.warn(
                f"schedule cache {path}: record {index} is malformed ({exc!r}); skipped",
                CacheWarning,
                stacklevel=3,
            )
    return merge(records), True


def _unusable(path: Path, why: str) -> tuple[list[TunedRecord], bool]:
    warnings.warn(f"schedule cache {path} {why}; ignoring it", CacheWarning, stacklevel=4)
    return [], False


def _decode(item: dict[str, Any]) -> TunedRecord:
    k = item["key"]
    bucket = tuple((str(name), None if v is None else int(v)) for name, v in k["bucket"])
    key = TuningKey(str(k["function"]), str(k["launch"]), str(k["kernel"]), str(k["target"]),
                    str(k["arch"]), str(k["toolchain"]), str(k["dtypes"]), bucket)  # fmt: skip
    best = tuple(Timing(knobs(t["config"]), float(t["ms"])) for t in item["best"])
    baseline = item.get("baseline_ms")
    return TunedRecord(
        key, knobs(item["config"]), tuple((str(s), int(v)) for s, v in item["sizes"].items()),
        best, None if baseline is None else float(baseline), int(item.get("measured", 0)),
    )  # fmt: skip


# -- writing ------------------------------------------------------------------------


def _encode(record: TunedRecord) -> dict[str, Any]:
    k = record.key
    return {
        "key": {
            "function": k.function, "launch": k.launch, "kernel": k.kernel, "target": k.target,
            "arch": k.arch, "toolchain": k.toolchain, "dtypes": k.dtypes,
            "bucket": [list(pair) for pair in k.bucket],
        },
        "config": dict(record.config),
        "sizes": dict(record.sizes),
        "best": [{"config": dict(t.config), "ms": round(t.ms, 4)} for t in record.best],
        "baseline_ms": None if record.baseline_ms is None else round(record.baseline_ms, 4),
        "measured": record.measured,
    }  # fmt: skip


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside the file: the file itself is replaced, the lock is not."""
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
