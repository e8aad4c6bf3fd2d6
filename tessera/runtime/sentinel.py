"""What a debug build's checks found: the NaN/Inf sentinel after each launch
(``check/sentinels.py``) and the first failed bounds check (``check/bounds.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..transpiler.check.bounds import accessed
from ..transpiler.graph.dtypes import ENTRY_DTYPES
from ..transpiler.tile.interpret import numpy_dtype

__all__ = ["BoundsError", "NonFiniteError", "check_finite", "raise_cpu_fault", "raise_fault"]


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
        f"kernel '{check['kernel']}' ({check['line']}): {accessed(check)} out of bounds: "
        f"index {bad} on axis {check['axis']}, which has {extent} elements{tile}"
    )


def check_finite(launch: Mapping[str, Any], name: str, data: bytes | np.ndarray) -> None:
    """Raise ``NonFiniteError`` if tensor ``name``, as ``launch`` wrote it, holds NaN or
    infinity: the kernel, its ``.tsr`` line and the first such element's index."""
    dtype = next(w["dtype"] for w in launch["sentinel"]["writes"] if w["name"] == name)
    kind = np.dtype(numpy_dtype(ENTRY_DTYPES[dtype]))
    raw = bytes(data)  # an empty tensor's buffer holds one byte that no program wrote
    raw = raw[: len(raw) // kind.itemsize * kind.itemsize]
    values = np.frombuffer(raw, dtype=kind).astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        first = int(bad[0])
        raise nonfinite_error(
            launch["kernel"], launch["sentinel"]["line"], name, values[first], first, bad.size
        )


def nonfinite_error(
    kernel: str, line: str, name: str, value: float, first: int, count: int
) -> NonFiniteError:
    """The error of a sentinel that found ``count`` non-finite values in ``name``."""
    return NonFiniteError(
        f"kernel '{kernel}' ({line}) wrote {value} to '{name}' at flat index {first} "
        f"({count} non-finite values): the first launch of the call to produce one"
    )


def raise_cpu_fault(meta: Mapping[str, Any], record: Sequence[int]) -> None:
    """Raise for the CPU's fault record (``take_fault`` in the tile header): a failed
    bounds check, or a sentinel that found NaN or infinity; nothing if neither."""
    raise_fault(meta["bounds"], record[:4])
    sentinel, first, count = (int(v) for v in record[4:7])
    if sentinel >= 0:
        check = meta["sentinels"][sentinel]
        value = np.array([record[7]], np.int64).view(np.float32)[0]  # the low half
        raise nonfinite_error(check["kernel"], check["line"], check["name"], value, first, count)
