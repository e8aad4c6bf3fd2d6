"""Build and run the CPU backend's output: g++, a shared object, ctypes, numpy.

``load(program)`` compiles the generated C++ once per distinct source and flags
(the shared object is cached in ``tessera.cachedir.cache_dir()``), loads it, and returns
an object with one callable per function of the ``.tsr`` file, named as in the
source. A call checks every argument against the metadata (dtype, rank,
contiguity, the sizes its dims give, the guards), allocates the result, runs
the kernels and returns the result as a numpy array; a function without a
result updates its arguments in place and returns None.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..cachedir import cache_dir
from ..transpiler.graph.dtypes import DTYPES
from ..transpiler.tile.interpret import numpy_dtype
from .cpu_shim import header_matches, shim_source
from .entry import MISSED, Entry, Library
from .foreign import TensorView
from .plan import Backend, fast_path

__all__ = ["CpuLibrary", "CpuFunction", "BuildError", "load", "build", "cache_dir"]


class BuildError(RuntimeError):
    """The C++ compiler rejected the generated source (a compiler bug, or a broken
    toolchain); the message has its output."""


def build(source: str, flags: Sequence[str], compiler: str = "g++") -> Path:
    """The shared object for ``source``, compiled unless the cache has it."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([source, *flags, version]).encode()).hexdigest()[:24]
    target = cache_dir() / f"{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cpp = Path(tmp) / "kernel.cpp"
        cpp.write_text(source, encoding="utf-8")
        out = Path(tmp) / "kernel.so"
        done = subprocess.run([compiler, *flags, str(cpp), "-o", str(out)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            raise BuildError(f"{compiler} failed on the generated source:\n{done.stderr}")
        os.replace(out, target)  # atomic: a concurrent build of the same key is harmless
    return target


class CpuFunction(Entry):
    """One entry of the shared object: the checked arguments go through ctypes, whose
    declared argument types convert addresses and sizes without a Python object each.

    A call that passes every input by position as a C-contiguous numpy array of its
    dtype goes through the module's NumPy entry (``tessera.runtime.cpu_shim``) after
    the checks of its fast path (``tessera.runtime.plan``): a few microseconds, where
    the full checks take tens."""

    def __init__(self, entry: Any, meta: Mapping[str, Any], numpy_entry: Any = None) -> None:
        super().__init__(meta)
        self._entry = entry
        self._declare(entry)
        if numpy_entry is not None:
            self._declare(numpy_entry)
            backend = replace(_NUMPY, names={**_NUMPY.names, "entry": numpy_entry})
            self._fast = fast_path(meta, backend, _dtype, self._check_guards, MISSED)

    def _declare(self, entry: Any) -> None:
        """Declare an entry's C types: tensors as addresses, scalars, the sizes."""
        entry.restype = None
        entry.argtypes = [
            *(_CTYPES[p["type"]] if p["kind"] == "scalar" else ctypes.c_void_p
              for p in self._params),
            *(ctypes.c_int64 for _ in self._dims),
        ]  # fmt: skip

    def _argument(self, value: np.ndarray, view: TensorView) -> int:
        """The array's address, which ``_run`` passes as the C pointer."""
        return view.address

    def _run(
        self, arrays: Mapping[str, int], values: Mapping[str, Any], sizes: Mapping[str, int]
    ) -> None:
        call = [arrays[p["name"]] if p["kind"] == "tensor" else values[p["name"]]
                for p in self._params]  # fmt: skip
        self._entry(*call, *(sizes[d] for d in self._dims))


#: The fast path's view of numpy arrays (``tessera.runtime.plan``): the C entry takes
#: each array object's address (``id``; the call's arguments keep the objects alive).
_NUMPY = Backend(
    accepts=lambda x, dtypes, written: (
        f"type({x}) is ndarray and {x}.dtype in {dtypes} and {x}.flags.c_contiguous"
        + (f" and {x}.flags.writeable" if written else "")
    ),
    address=lambda x: f"id({x})",
    dtypes=lambda dtype: (dtype,),
    allocate=lambda shape, dtype: f"empty({shape}, {dtype})",
    result_dtype=lambda dtype: dtype,
    call=lambda arguments: f"entry({arguments})",
    names={"ndarray": np.ndarray, "empty": np.empty},
)


def _dtype(name: str) -> np.dtype:
    """The numpy dtype of a Tessera dtype, by its name."""
    return np.dtype(numpy_dtype(DTYPES[name]))


#: The C type of each scalar parameter type, as the generated entry declares it.
_CTYPES = {"bool": ctypes.c_bool, "int": ctypes.c_int64, "float": ctypes.c_float}


class CpuLibrary(Library):
    """The loaded shared object: one attribute per function of the ``.tsr`` file."""

    def __init__(self, path: Path, meta: Mapping[str, Any]) -> None:
        self.path = path
        self._lib = ctypes.CDLL(str(path))
        shim = header_matches()
        entries = [
            CpuFunction(getattr(self._lib, f["symbol"]), f,
                        getattr(self._lib, f"tsr_numpy_{f['name']}") if shim else None)
            for f in meta["functions"]
        ]  # fmt: skip
        super().__init__(meta, entries)


def load(source: str, meta: Mapping[str, Any], flags: Sequence[str] | None = None) -> CpuLibrary:
    """Build (or find in the cache) and load a CPU module from its source and metadata."""
    flags = list(flags if flags is not None else meta["build"]["flags"])
    return CpuLibrary(build(source + shim_source(meta), flags, meta["build"]["compiler"]), meta)
