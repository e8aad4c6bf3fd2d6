"""A compiled function's Python arguments matched to its parameters by name, as Python
matches them: the calls that take a KVCache or an OptimizerState check and unpack those
arguments before the entry's own checks run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["bound_arguments"]


def bound_arguments(
    name: str, inputs: Sequence[Mapping[str, Any]], args: tuple, kwargs: dict
) -> dict[str, Any]:
    """Each argument by its parameter's name: positional ones in the metadata's order
    (keyword-only parameters take none), then the keywords; too many positional
    arguments, or one parameter given twice, is a TypeError as Python raises it."""
    positional = [p["name"] for p in inputs if not p.get("keyword_only")]
    if len(args) > len(positional):
        raise TypeError(f"{name}() takes {len(positional)} positional arguments, "
                        f"{len(args)} given")  # fmt: skip
    values = dict(zip(positional, args, strict=False))
    for key, value in kwargs.items():
        if key in values:
            raise TypeError(f"{name}() got '{key}' twice")
        values[key] = value
    return values
