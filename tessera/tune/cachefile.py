"""The schedule cache file: JSON that people commit, diff, merge and share.

The file holds one record per tuned launch, sorted by key, with sorted keys
and no timestamps, so that a re-tune shows as a small diff and two caches
merge by taking the union (the faster record where both have one key).

A cache is a convenience, so a bad one never stops a compile or a tuning
run: a file that is not JSON, is cut short, or has another format version is
ignored with a warning, and a tuning run that writes to it first moves it
aside to ``PATH.unreadable``. The file is input like a ``.tsr`` file: every
field of a record is checked for its type and range, and a record that fails
is skipped with a warning naming it (the compile checks the rest: whether the
machine runs the record's schedule and the kernel's space holds it). Writers
take an exclusive lock on ``PATH.lock``, re-read the file under it, merge, and
replace the file atomically, so two tuners sharing a cache lose no record.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..files import is_special, write_file
from ..transpiler.graph.schedule_spec import check_value
from ..transpiler.schedule.tuned import (
    CacheWarning,
    Knobs,
    Timing,
    TunedRecord,
    TunedSchedules,
    TuningKey,
    knobs,
)

__all__ = ["FORMAT", "VERSION", "CacheWarning", "read", "merge", "update", "schedules_for"]

FORMAT = "tessera-schedule-cache"
VERSION = 1


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
    there, and the link stays. A path that is not a regular file (``/dev/stdout``, a
    FIFO) is only written: never read, locked beside or moved aside."""
    if is_special(path):
        merged = merge(records)
        write_file(path, dumps(merged))
        return merged
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
    except RecursionError:
        return _unusable(path, "nests arrays or objects too deeply")
    except ValueError as exc:  # an integer too long to read
        return _unusable(path, f"is not valid JSON ({exc})")
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return _unusable(path, f'is not a Tessera schedule cache (no "format": "{FORMAT}")')
    if document.get("version") != VERSION:
        return _unusable(
            path, f"has format version {document.get('version')!r}; this tesserac reads {VERSION}"
        )
    items = document.get("records", [])
    if not isinstance(items, list):
        return _unusable(path, f'has "records": {_described(items)}, not an array')
    records = []
    for index, item in enumerate(items):
        try:
            records.append(_decode(item))
        except _Malformed as exc:
            warnings.warn(
                f"schedule cache {path}: record {index}{_named(item)} is malformed ({exc}); "
                "skipped",
                CacheWarning,
                stacklevel=3,
            )
    return merge(records), True


def _unusable(path: Path, why: str) -> tuple[list[TunedRecord], bool]:
    warnings.warn(f"schedule cache {path} {why}; ignoring it", CacheWarning, stacklevel=4)
    return [], False


class _Malformed(ValueError):
    """A field of a record with the wrong type or range; the message names the field."""


_KEY_FIELDS = ("function", "launch", "kernel", "target", "arch", "toolchain", "dtypes")


def _decode(item: object) -> TunedRecord:
    """A record from its JSON, every field checked for type and range: the file is input
    that anyone may have edited, and no number in it reaches the compiler unchecked."""
    fields = _object(item, "the record")
    k = _object(_field(fields, "key"), "key")
    bucket = tuple(
        _bucket_entry(entry, f"key.bucket[{i}]")
        for i, entry in enumerate(_array(_field(k, "bucket"), "key.bucket"))
    )
    key = TuningKey(*(_string(_field(k, name), f"key.{name}") for name in _KEY_FIELDS), bucket)
    sizes = _object(_field(fields, "sizes"), "sizes")
    best = _array(_field(fields, "best"), "best")
    baseline = fields.get("baseline_ms")
    return TunedRecord(
        key,
        _config(_field(fields, "config"), "config"),
        tuple((name, _integer(size, f"sizes.{name}", 1)) for name, size in sizes.items()),
        tuple(_timing(timing, f"best[{i}]") for i, timing in enumerate(best)),
        None if baseline is None else _ms(baseline, "baseline_ms"),
        _integer(fields.get("measured", 0), "measured", 0),
    )


def _named(item: object) -> str:
    """`` (function/launch)`` of a record whose key says so, for its warning."""
    key = item.get("key") if isinstance(item, dict) else None
    names = [key.get(f) for f in ("function", "launch")] if isinstance(key, dict) else []
    return f" ({'/'.join(names)})" if names and all(isinstance(n, str) for n in names) else ""


def _field(fields: dict[str, Any], name: str) -> Any:
    if name not in fields:
        raise _Malformed(f"{name} is missing")
    return fields[name]


def _described(value: object) -> str:
    """A JSON value as the file shows it, short; containers by their kind."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Malformed(f"{what} is {_described(value)}, not an object")
    return value


def _array(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _Malformed(f"{what} is {_described(value)}, not an array")
    return value


def _string(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _Malformed(f"{what} is {_described(value)}, not a string")
    return value


def _integer(value: object, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise _Malformed(f"{what} is {_described(value)}, not an integer of at least {least}")
    return value


def _ms(value: object, what: str) -> float:
    """A time: a finite number of milliseconds, 0 included (a rounded fast kernel)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise _Malformed(f"{what} is {_described(value)}, not a finite time in ms")
    return float(value)


def _config(value: object, what: str) -> Knobs:
    """A schedule: knobs the compiler has, each with a value it can take."""
    config = _object(value, what)
    for knob, setting in config.items():
        try:
            check_value(knob, setting)
        except ValueError as exc:
            raise _Malformed(f"{what}: {exc}") from None
    return knobs(config)


def _timing(value: object, what: str) -> Timing:
    fields = _object(value, what)
    config = _config(_field(fields, "config"), f"{what}.config")
    return Timing(config, _ms(_field(fields, "ms"), f"{what}.ms"))


def _bucket_entry(value: object, what: str) -> tuple[str, int | None]:
    """``[name, size]``: a size rounded up to a power of two, or null where symbolic."""
    entry = _array(value, what)
    if len(entry) != 2:
        raise _Malformed(f"{what} has {len(entry)} items, not a name and a size")
    name, size = entry
    return _string(name, f"{what}[0]"), None if size is None else _integer(size, f"{what}[1]", 1)


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
