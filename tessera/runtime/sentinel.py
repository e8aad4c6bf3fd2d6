"""What a debug build's checks found: the NaN/Inf sentinel after each launch
(``check/sentinels.py``) and the first failed bounds check (``check/bounds.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..transpiler.graph.dtypes import DTYPES
from ..transpiler.tile.interpret import numpy_dtype

__all__ = ["BoundsError", "NonFiniteError", "check_finite", "raise_fault"]


class NonFiniteError(FloatingPointError):
    """A kernel of a debug build wrote NaN or infinity."""


class BoundsError(IndexError):
    """A kernel of a debug build indexed a tensor out of its bounds."""


def raise_fault(bounds: Sequence[Mapping[str, Any]], record: Sequence[int]) -> None:
    """Raise ``BoundsError`` for a fault record (check number, index, size, extent) that
    a debug build's code left, unless it is empty (number -1). ``bounds`` is the
    metadata's list of the checks."""
    site, index, size, extent = (int(v) for v in record)
    if site < 0:
        return
    check = bounds[site]
    # An unmasked tile that starts inside the axis fails at its first index past the end.
    bad = max(index, extent) if check["whole"] else index
    tile = f" (the tile covers [{index}, {index + size}))" if size > 1 else ""
    raise BoundsError(
        f"kernel '{check['kernel']}' ({check['line']}): {check['access']} of "
        f"'{check['tensor']}' out of bounds: index {bad} on axis {check['axis']}, which has "
        f"{extent} elements{tile}"
    )


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
