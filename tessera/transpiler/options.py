"""Every switch of a compilation, in one frozen object.

Nothing deeper in the compiler reads the environment or the command line: a
stage gets an ``Options`` and its result depends on nothing else, which is
what makes output deterministic and lets ``cache_key()`` stand for a build.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict

from ..frozen import frozen
from .frontend.ast import INT64_MAX
from .schedule.tuned import TunedSchedules

__all__ = ["Options", "OptionsError", "TARGETS", "DEFAULT_TARGET", "SUFFIXES", "target_for_output"]

#: Targets and the architectures each accepts; the first is the default.
TARGETS: dict[str, tuple[str, ...]] = {
    "cuda": ("sm_80", "sm_90a"),
    "hip": ("gfx90a", "gfx942"),
    "cpu": ("native", "x86-64-v2", "x86-64-v3", "x86-64-v4", "armv8-a"),
    "opencl": ("generic",),
    "sycl": ("generic",),
}

#: The target of a command line that names none, by option or output suffix.
DEFAULT_TARGET = "cuda"

#: Output suffix to target, for ``-o kernel.cu``; the first that a name ends with wins
#: (``.sycl.cpp`` before ``.cpp``).
SUFFIXES = {".sycl.cpp": "sycl", ".cu": "cuda", ".hip": "hip", ".cpp": "cpu", ".cl": "opencl"}

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class OptionsError(ValueError):
    """A switch is malformed or contradicts another: a usage error (exit 2)."""


def target_for_output(path: str) -> str | None:
    """The target an output file name implies, or None for other suffixes."""
    for suffix, target in SUFFIXES.items():
        if path.endswith(suffix):
            return target
    return None


@frozen
class Options:
    target: str | None = None
    arch: str | None = None
    #: Symbolic dims fixed at compile time (``-D S=1024``), sorted by name.
    defines: tuple[tuple[str, int], ...] = ()
    kernel: str | None = None
    #: Tuned schedules to use where they apply (``--schedule-cache``).
    schedule_cache: TunedSchedules | None = None
    #: Debug builds (``--debug``): each global access is checked against its bounds, and
    #: after each launch what the kernel wrote for NaN and infinity (docs/tools.md).
    debug: bool = False

    def __post_init__(self) -> None:
        if self.target is not None and self.target not in TARGETS:
            raise OptionsError(
                f"unknown target '{self.target}'; choose one of {', '.join(TARGETS)}"
            )
        if self.arch is not None:
            if self.target is None:
                raise OptionsError("--arch needs a target: give --target or an -o file name")
            if self.arch not in TARGETS[self.target]:
                raise OptionsError(
                    f"target {self.target} has no arch '{self.arch}'; "
                    f"choose one of {', '.join(TARGETS[self.target])}"
                )
        names = [name for name, _ in self.defines]
        if names != sorted(set(names)):
            raise OptionsError("defines must be unique and sorted; use Options.create()")

    @classmethod
    def create(
        cls,
        target: str | None = None,
        arch: str | None = None,
        defines: Mapping[str, int] | Iterable[str] | None = None,
        kernel: str | None = None,
        schedule_cache: TunedSchedules | None = None,
        debug: bool = False,
    ) -> Options:
        """Build options from user input: ``defines`` as a mapping or ``SYM=VALUE`` strings."""
        return cls(target, arch, _parse_defines(defines or ()), kernel, schedule_cache, debug)

    @property
    def resolved_arch(self) -> str | None:
        if self.arch is not None or self.target is None:
            return self.arch
        return TARGETS[self.target][0]

    def cache_key(self) -> str:
        """A stable hash of every switch, for build caches."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _parse_defines(defines: Mapping[str, int] | Iterable[str]) -> tuple[tuple[str, int], ...]:
    pairs: dict[str, int] = {}
    items = defines.items() if isinstance(defines, Mapping) else map(_split_define, defines)
    for name, value in items:
        if not _IDENTIFIER.match(name):
            raise OptionsError(f"-D {name}: a symbol must be a name such as S or D_h")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise OptionsError(f"-D {name}={value}: the value must be a positive integer")
        if value > INT64_MAX:
            raise OptionsError(
                f"-D {name}={value}: the value does not fit in 64 bits (at most {INT64_MAX})"
            )
        if name in pairs and pairs[name] != value:
            raise OptionsError(f"-D {name} given twice, as {pairs[name]} and {value}")
        pairs[name] = value
    return tuple(sorted(pairs.items()))


def _split_define(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep:
        raise OptionsError(f"-D {text}: expected SYM=VALUE, for example -D S=1024")
    try:
        number = int(value.strip())
    except ValueError:
        raise OptionsError(f"-D {text}: the value must be a positive integer") from None
    return name.strip(), number
