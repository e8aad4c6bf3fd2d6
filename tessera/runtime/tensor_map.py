"""TMA tensor maps for sm_90a kernels, encoded on the host by the CUDA driver.

A kernel whose pipelined copies go through TMA takes one tensor map per tensor and
box (the metadata's ``tensor_maps``): 128 opaque bytes that ``cuTensorMapEncodeTiled``
writes from the tensor's address, sizes and row strides, the box and the 128-byte
swizzle, and that the launch passes by value (CuPy passes a one-element numpy array's
bytes). Where TMA cannot describe a tensor (its address or its rows do not start on
16 bytes, or it is empty) the map is zeros: the kernel checks the same condition and
copies that tensor element by element instead, never reading the map.

The generated Python loaders carry the same function, so that they need no Tessera.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["MAP_DTYPE", "encode"]

#: A tensor map as a launch argument: 128 bytes, passed by value.
MAP_DTYPE = np.dtype((np.void, 128))
#: The driver's enums (cuda.h): element types by size (TMA moves bits, so unsigned
#: integers serve every dtype), no interleave, the 128-byte swizzle, L2 promotion by
#: 128 bytes, and zeros for the elements past the tensor's edges.
_ELEMENT = {1: 0, 2: 1, 4: 2, 8: 4}
_INTERLEAVE_NONE, _SWIZZLE_128B, _L2_128B, _FILL_ZEROS = 0, 3, 2, 0


def encode(
    driver: Any, address: int, element_bytes: int, dims: Sequence[int], box: Sequence[int]
) -> np.ndarray:
    """The tensor map of the ``dims`` tensor (outermost first) at ``address``, for
    copies of ``box`` (innermost first), or zeros where TMA cannot describe it."""
    out = np.zeros(1, MAP_DTYPE)
    if address % 16 or dims[-1] * element_bytes % 16 or 0 in dims:
        return out
    rank = len(dims)
    # The driver writes the map in place: 64-byte aligned, as CUtensorMap is declared.
    storage = np.zeros(128 + 64, np.uint8)
    start = -storage.ctypes.data % 64
    sizes = (ctypes.c_uint64 * rank)(*reversed(dims))
    strides = (ctypes.c_uint64 * max(rank - 1, 1))(
        *(element_bytes * math.prod(dims[axis:]) for axis in range(rank - 1, 0, -1))
    )
    status = driver.cuTensorMapEncodeTiled(
        ctypes.c_void_p(storage.ctypes.data + start), _ELEMENT[element_bytes], rank,
        ctypes.c_void_p(address), sizes, strides, (ctypes.c_uint32 * rank)(*box),
        (ctypes.c_uint32 * rank)(*[1] * rank), _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_128B,
        _FILL_ZEROS,
    )  # fmt: skip
    if status != 0:
        raise RuntimeError(
            f"cuTensorMapEncodeTiled refused a tensor of {list(dims)} elements of "
            f"{element_bytes} bytes with a box of {list(box)} (CUresult {status})"
        )
    out.view(np.uint8)[:] = storage[start : start + 128]
    return out
