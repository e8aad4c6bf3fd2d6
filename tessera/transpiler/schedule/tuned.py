"""Tuned schedules: measured configurations, and the key that says where one applies.

A record holds the configuration the autotuner measured fastest for one
launch, with the times of the best candidates. It applies to a launch with
the same key: the same function and launch, the same kernel fingerprint (a
changed kernel never gets an old record), target, arch, toolchain and
dtypes, and a shape bucket that agrees. Buckets round each size up to a
power of two, so a record tuned at 2000 serves 1800 and 2048 alike. A size
the compile leaves symbolic agrees with every bucket; when several records
then match, the one tuned at the largest sizes wins, since a shape-generic
kernel is worth the most at large sizes.

Nothing here reads files: ``tessera.tune.cachefile`` does, and hands the
compiler a ``TunedSchedules`` already narrowed to the toolchain in use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...frozen import frozen
from ..graph.dims import Dim
from ..graph.schedule_spec import ScheduleSpec
from .problem import Problem

__all__ = [
    "Bucket", "CacheWarning", "DEFAULT_SPACES", "TuningKey", "Timing", "TunedRecord",
    "TunedSchedules", "bucket_of", "knobs", "space_of",
]  # fmt: skip

#: Sizes by the problem's names (m, n, k, d, batch); None where the compile leaves it symbolic.
Bucket = tuple[tuple[str, int | None], ...]
#: A schedule as sorted (knob, value) pairs.
Knobs = tuple[tuple[str, int | str], ...]


#: Default spaces by (machine kind, kernel kind).
DEFAULT_SPACES: dict[tuple[str, str], dict[str, tuple[int, ...]]] = {
    ("cpu", "gemm"): {"block_m": (32, 64, 128, 256), "block_n": (64, 128, 256, 512),
                      "block_k": (128, 256, 512)},
    ("cpu", "attention"): {"block_m": (16, 32, 64, 128), "block_n": (32, 64, 128, 256)},
    ("gpu", "gemm"): {"block_m": (64, 128, 256), "block_n": (64, 128, 256),
                      "block_k": (32, 64), "warps": (4, 8), "stages": (2, 3, 4)},
    ("gpu", "attention"): {"block_m": (64, 128), "block_n": (32, 64, 128),
                           "warps": (4, 8), "stages": (2, 3)},
}  # fmt: skip


class CacheWarning(UserWarning):
    """A schedule cache file, or a record in it, could not be used as it is."""


def space_of(spec: ScheduleSpec | None, machine: str, kind: str) -> dict[str, tuple[Any, ...]]:
    """The knobs the tuner searches for a launch, with their values: the function's space
    when it has one, else the default space of the kernel's kind on this kind of machine
    (``Hardware.kind``). A record's configuration is always a point of it."""
    if spec is not None and spec.choices:
        return dict(spec.choices)
    return dict(DEFAULT_SPACES.get((machine, kind), {}))


def knobs(config: Mapping[str, object]) -> Knobs:
    """A configuration in the record's canonical form: sorted, ints and strings only."""
    return tuple(sorted((k, v if isinstance(v, str) else int(v)) for k, v in config.items()))


def _power_of_two(size: int) -> int:
    return 1 << max(0, (size - 1).bit_length())


def bucket_of(problem: Problem) -> Bucket:
    """The shape bucket of a launch: its sizes rounded up to powers of two."""
    dims: list[tuple[str, Dim | None]] = [
        ("m", problem.m), ("n", problem.n), ("k", problem.k), ("d", problem.d),
    ]  # fmt: skip
    if problem.batch:
        total: Dim | None = Dim.const(1)
        for dim in problem.batch:
            total = total * dim if total is not None else None
        dims.append(("batch", total))
    out: list[tuple[str, int | None]] = []
    for name, dim in dims:
        if dim is None:
            continue
        out.append((name, None if dim.constant is None else _power_of_two(dim.constant)))
    return tuple(out)


@frozen
class TuningKey:
    function: str
    launch: str
    #: ``frontend.fingerprint`` of the function: the kernel as written.
    kernel: str
    target: str
    arch: str
    toolchain: str
    #: Parameter and result dtypes, e.g. ``f32,f32->f32``.
    dtypes: str
    bucket: Bucket

    def __str__(self) -> str:
        sizes = " ".join(f"{k}={'?' if v is None else v}" for k, v in self.bucket)
        return (
            f"{self.function}/{self.launch} {self.kernel} {self.target} {self.arch} "
            f"[{self.toolchain}] {self.dtypes} {sizes}"
        )

    def _identity(self) -> tuple[object, ...]:
        return (self.function, self.launch, self.kernel, self.target, self.arch,
                self.toolchain, self.dtypes, tuple(k for k, _ in self.bucket))  # fmt: skip

    def same_kernel(self, other: TuningKey) -> bool:
        """Agrees on everything but the sizes: a record to start a nearby search from."""
        return self._identity() == other._identity()

    def agrees(self, other: TuningKey) -> bool:
        """Same kernel and machine; every size equal, or symbolic on this side."""
        return self.same_kernel(other) and all(
            mine is None or mine == theirs
            for (_, mine), (_, theirs) in zip(self.bucket, other.bucket, strict=True)
        )


@frozen
class Timing:
    config: Knobs
    ms: float


@frozen
class TunedRecord:
    key: TuningKey
    config: Knobs
    #: The exact sizes the candidates ran at, by the function's symbols.
    sizes: tuple[tuple[str, int], ...]
    #: The fastest candidates, fastest first; for comparison, the time of the schedule the
    #: compiler picks without a record.
    best: tuple[Timing, ...]
    baseline_ms: float | None
    #: How many candidates were measured.
    measured: int = 0

    @property
    def ms(self) -> float:
        return self.best[0].ms if self.best else float("inf")


@frozen
class TunedSchedules:
    """The records a compile may use, all for one toolchain."""

    toolchain: str
    records: tuple[TunedRecord, ...] = ()

    def lookup(self, key: TuningKey) -> TunedRecord | None:
        """The record for a launch; among several (sizes left symbolic), the largest."""
        matches = [r for r in self.records if key.agrees(r.key)]
        if not matches:
            return None
        return max(matches, key=lambda r: (_volume(r.key.bucket), str(r.key)))

    def nearest(self, key: TuningKey) -> TunedRecord | None:
        """The record of the same kernel whose bucket is closest, for a warm start."""
        near = [r for r in self.records if key.same_kernel(r.key)]
        if not near:
            return None
        return min(near, key=lambda r: (_distance(key.bucket, r.key.bucket), str(r.key)))


def _volume(bucket: Bucket) -> int:
    total = 1
    for _, size in bucket:
        total *= size or 1
    return total


def _distance(a: Bucket, b: Bucket) -> int:
    """Factors of two between two buckets, summed over sizes."""
    return sum(
        abs((x or 1).bit_length() - (y or 1).bit_length())
        for (_, x), (_, y) in zip(a, b, strict=True)
    )
