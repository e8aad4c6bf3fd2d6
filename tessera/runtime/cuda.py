"""Run the CUDA backend's output through CuPy: numpy arrays in, numpy arrays out.

``load(source, meta)`` compiles the file with NVRTC (CuPy's ``RawModule``) for the
GPU in use and returns an object with one callable per function of the ``.tsr``
file, as ``tessera.runtime.cpu`` does: the same argument checks, the same result.
A call copies the tensors to the GPU, runs the function's launches in order with
the grid, threads and dynamic shared memory the metadata gives (raising the
kernel's limit above the default 48 KiB where a launch needs more), and copies
back what they wrote. Without CuPy or without a GPU, ``load`` says which, in one
line.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from .entry import Entry, Library, argument, evaluate

__all__ = ["CudaLibrary", "CudaFunction", "CudaUnavailable", "load"]

_SCALARS = {"float": np.float32, "int": np.int64, "bool": np.int32}
#: Dynamic shared memory a kernel may use without asking for more.
_DEFAULT_SMEM = 48 * 1024


class CudaUnavailable(RuntimeError):
    """CuPy or an NVIDIA GPU is missing; the message says which."""


@functools.cache
def _cupy() -> Any:
    try:
        import cupy
    except ImportError:
        raise CudaUnavailable(
            "running CUDA code needs CuPy (pip install cupy-cuda13x) and an NVIDIA GPU"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        count = 0
    if count == 0:
        raise CudaUnavailable("cannot run CUDA code: no NVIDIA GPU is present")
    return cupy


class CudaFunction(Entry):
    """One function: its launches, on the current device."""

    def __init__(self, module: Any, meta: Mapping[str, Any]) -> None:
        super().__init__(meta)
        self._kernels = {}
        for launch in meta["launches"]:
            kernel = module.get_function(launch["kernel"])
            if launch["dynamic_smem"] > _DEFAULT_SMEM:
                kernel.max_dynamic_shared_size_bytes = launch["dynamic_smem"]
            self._kernels[launch["kernel"]] = kernel

    def _run(
        self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any], sizes: Mapping[str, int]
    ) -> None:
        cupy = _cupy()
        device = {name: cupy.asarray(a) for name, a in arrays.items()}
        for b in self.meta["buffers"]:
            size = max(1, evaluate(b["bytes"], sizes, b["name"]))
            device[b["name"]] = cupy.empty(size, dtype=cupy.uint8)
        scalars = {p["name"]: _SCALARS[p["type"]](values[p["name"]])
                   for p in self._params if p["kind"] == "scalar"}  # fmt: skip
        for launch in self.meta["launches"]:
            grid = [-(-evaluate(g["extent"], sizes, "grid") // g["block"]) for g in launch["grid"]]
            if 0 in grid:
                continue  # an empty tensor: no program to run
            args = tuple(argument(a, device, scalars, sizes) for a in launch["args"])
            grid += [1] * (3 - len(grid))
            self._kernels[launch["kernel"]](
                tuple(grid), (launch["threads"], 1, 1), args, shared_mem=launch["dynamic_smem"]
            )
        for p in self._params:
            if p["kind"] == "tensor" and p["io"] != "in":
                device[p["name"]].get(out=arrays[p["name"]])


class CudaLibrary(Library):
    """The compiled module: one attribute per function of the ``.tsr`` file."""

    def __init__(self, source: str, meta: Mapping[str, Any]) -> None:
        cupy = _cupy()
        module = cupy.RawModule(
            code=source, options=tuple(meta["build"]["options"]), backend="nvrtc"
        )
        super().__init__(meta, [CudaFunction(module, f) for f in meta["functions"]])


def load(source: str, meta: Mapping[str, Any]) -> CudaLibrary:
    """Compile a CUDA module from its source and metadata, for the current GPU."""
    return CudaLibrary(source, meta)
