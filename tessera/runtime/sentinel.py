"""The NaN/Inf sentinel of a debug build, after each launch (``check/sentinels.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..transpiler.graph.dtypes import DTYPES
from ..transpiler.tile.interpret import numpy_dtype

__all__ = ["NonFiniteError", "check_finite"]


class NonFiniteError(FloatingPointError):
    """A kernel of a debug build wrote NaN or infinity."""


def check_finite(launch: Mapping[str, Any], name: str, data: bytes | np.ndarray) -> None:
    """Raise ``NonFiniteError`` if tensor ``name``, as ``launch`` wrote it, holds NaN or
    infinity: the kernel, its ``.tsr`` line and the first such element's index."""
    dtype = next(w["dtype"] for w in launch["sentinel"]["writes"] if w["name"] == name)
    kind = np.dtype(numpy_dtype(DTYPES[dtype]))
    raw = bytes(data)  # an empty tensor's buffer holds one byte that no program wrote
    raw = raw[: len(raw) // kind.itemsize * kind.itemsize]
    values = np.frombuffer(raw, dtype=kind).astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        first = int(bad[0])
        raise NonFiniteError(
            f"kernel '{launch['kernel']}' ({launch['sentinel']['line']}) wrote "
            f"{values[first]} to '{name}' at flat index {first} ({bad.size} non-finite "
            "values): the first launch of the call to produce one"
        )
