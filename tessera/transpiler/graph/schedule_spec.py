"""Schedules as a ``.tsr`` file writes them.

``Schedule(block=(128, 128), k=32, warps=8, stages=3)`` fixes a point;
``base.with_block(64, 64)`` derives a variant (seed 004's inheritance);
``Schedule().block(m=[64, 128]).warps([4, 8])`` and ``@kernel.autotune(space=
dict(BM=[64, 128], ...))`` describe a space of candidates. All three become
one value: each knob with its candidate values, a point when each has one.
Whether a choice fits the hardware is the schedule stage's question; here
only the values themselves are checked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...frozen import frozen

__all__ = ["ScheduleSpec", "KNOBS", "SPACE_KEYS", "MAX_BLOCK", "apply_method", "check_value"]

#: The knobs, in printing order, and what each is.
KNOBS = {
    "block_m": "rows of the output tile (BM, T.m)",
    "block_n": "columns of the output tile, or keys per step in attention (BN, T.n)",
    "block_k": "the reduction step (BK, T.k)",
    "block_d": "the head-dim tile of attention (BD, T.d)",
    "warps": "warps per program (wavefronts on AMD, threads/32 on CPUs)",
    "stages": "pipeline stages of the staged copies",
    "vector": "elements per vector load",
    "swizzle": "shared-memory layout: 'xor' or 'none'",
    "persistent": "one program per multiprocessor, looping over output tiles (sm_90a GEMMs)",
}
#: The largest tile size along one axis: far above what any machine's shared memory or
#: cache holds for a tile, so that a number beyond it is a typo or a corrupt file.
MAX_BLOCK = 1 << 16
#: Keys of an ``@kernel.autotune(space=dict(...))`` and their knobs.
SPACE_KEYS = {
    "BM": "block_m",
    "BN": "block_n",
    "BK": "block_k",
    "BD": "block_d",
    "warps": "warps",
    "stages": "stages",
    "vector": "vector",
    "swizzle": "swizzle",
}


@frozen
class ScheduleSpec:
    #: (knob, candidate values), in ``KNOBS`` order; one value is a fixed choice.
    choices: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    #: From ``@kernel.autotune``: a space to search even where a knob has one value.
    autotune: bool = False
    #: ``@kernel.autotune``'s measuring budget and default cache file, for ``tesserac tune``.
    budget_ms: float | None = None
    cache: str | None = None

    def get(self, knob: str) -> tuple[Any, ...] | None:
        return dict(self.choices).get(knob)

    def set(self, knob: str, values: tuple[Any, ...]) -> ScheduleSpec:
        _check(knob, values)
        merged = dict(self.choices)
        merged[knob] = tuple(values)
        return replace(self, choices=tuple((k, merged[k]) for k in KNOBS if k in merged))

    @property
    def is_point(self) -> bool:
        return not self.autotune and all(len(values) == 1 for _, values in self.choices)

    def __str__(self) -> str:
        parts = []
        for knob, values in self.choices:
            shown = [repr(v) if isinstance(v, str) else str(v) for v in values]
            parts.append(
                f"{knob}={shown[0]}" if len(values) == 1 else f"{knob}=[{', '.join(shown)}]"
            )
        return f"Schedule({', '.join(parts)})"


def _check(knob: str, values: tuple[Any, ...]) -> None:
    if not values:
        raise ValueError(f"{knob} needs at least one value")
    for value in values:
        check_value(knob, value)


def check_value(knob: str, value: Any) -> None:
    """ValueError unless ``value`` is a value ``knob`` can take on some machine. Whether a
    machine can run it is the schedule stage's question; this keeps the numbers that
    reach it (from a ``.tsr`` file or a schedule cache) sane."""
    if knob not in KNOBS:
        raise ValueError(f"there is no knob '{knob}' (knobs: {', '.join(KNOBS)})")
    if knob == "swizzle":
        if value not in ("xor", "none"):
            raise ValueError(f"swizzle is 'xor' or 'none', not {value!r}")
        return
    if knob == "persistent":
        if not isinstance(value, bool):
            raise ValueError(f"persistent is True or False, not {value!r}")
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{knob} takes positive integers, not {value!r}")
    if knob.startswith("block_") and value > MAX_BLOCK:
        raise ValueError(f"{knob} is at most {MAX_BLOCK}, not {value}")
    if knob == "warps" and (value > 32 or value & (value - 1)):
        raise ValueError(f"warps is a power of two up to 32, not {value}")
    if knob == "vector" and (value > 16 or value & (value - 1)):
        raise ValueError(f"vector is a power of two up to 16, not {value}")
    if knob == "stages" and value > 8:
        raise ValueError(f"stages is at most 8, not {value}")


def _values(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


#: Method and keyword names to the knobs they set; ``block`` sets two.
_SIMPLE = {
    "k": "block_k",
    "block_m": "block_m",
    "block_n": "block_n",
    "block_k": "block_k",
    "block_d": "block_d",
    "warps": "warps",
    "stages": "stages",
    "vector": "vector",
    "swizzle": "swizzle",
    "persistent": "persistent",
}


def apply_method(
    spec: ScheduleSpec, method: str, args: list[Any], keywords: dict[str, Any]
) -> ScheduleSpec:
    """``Schedule(...)`` (method ``"Schedule"``) or ``spec.method(...)``; ValueError on misuse."""
    name = method.removeprefix("with_")
    if method == "Schedule":
        if args:
            raise ValueError(
                "Schedule takes keyword arguments: block=, k=, warps=, stages=, vector=, "
                "swizzle=, persistent="
            )
        for key, value in keywords.items():
            spec = apply_method(
                spec,
                "block" if key == "block" else key,
                [value] if key != "block" else _block_args(value),
                {},
            )
        return spec
    if name == "block":
        if keywords:
            unknown = set(keywords) - {"m", "n", "k"}
            if unknown or args:
                raise ValueError("block() takes (m, n) or m=[...], n=[...], k=[...]")
            for key, value in keywords.items():
                spec = spec.set(
                    {"m": "block_m", "n": "block_n", "k": "block_k"}[key], _values(value)
                )
            return spec
        if len(args) != 2:
            raise ValueError(
                f"{method}() takes two sizes, the rows and the columns: {method}(64, 64)"
            )
        return spec.set("block_m", _values(args[0])).set("block_n", _values(args[1]))
    if name in _SIMPLE:
        if len(args) != 1 or keywords:
            raise ValueError(f"{method}() takes one value or a list of candidates")
        return spec.set(_SIMPLE[name], _values(args[0]))
    raise ValueError(f"a Schedule has no method '{method}'")


def _block_args(value: Any) -> list[Any]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError("block= takes two sizes: block=(128, 128)")
    return list(value)
