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
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..cachedir import cache_dir
from ..transpiler.graph.dtypes import ENTRY_DTYPES
from ..transpiler.tile.interpret import numpy_dtype
from .cpu_ext import load_extension
from .entry import Entry, Library
from .foreign import TensorView
from .mpi import agree, disagree, world
from .sentinel import raise_cpu_fault
from .telemetry import launched

__all__ = ["CpuLibrary", "CpuFunction", "BuildError", "load", "build", "cache_dir"]


class BuildError(RuntimeError):
    """The C++ compiler rejected the generated source (a compiler bug, or a broken
    toolchain); the message has its output."""


def build(source: str, flags: Sequence[str], compiler: str = "g++") -> Path:
    """The shared object for ``source``, compiled unless the cache has it."""
    if shutil.which(compiler) is None:
        hint = " (OpenMPI's compiler wrapper: apt-get install libopenmpi-dev)"
        raise BuildError(f"{compiler} is not installed{hint if compiler == 'mpicxx' else ''}")
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

    Once the module is warm (``WARM_CALLS`` calls of its functions), a call that passes
    every input by position as a C-contiguous numpy array of its dtype is checked and
    run by the module's C call for it (``tessera.runtime.cpu_ext``): about a
    microsecond, where the full checks take tens."""

    def __init__(self, entry: Any, meta: Mapping[str, Any], library: CpuLibrary) -> None:
        super().__init__(meta)
        self._library = library
        self._entry = entry
        entry.restype = None
        entry.argtypes = [
            *(_CTYPES[p["type"]] if p["kind"] == "scalar" else ctypes.c_void_p
              for p in self._params),
            *(ctypes.c_int64 for _ in self._dims),
        ]  # fmt: skip

    def __call__(self, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        """As ``Entry``'s; on a mesh, arguments refused on one process are refused on all
        (``mpi.agree``), before any of them reaches a collective."""
        if "mesh" not in self.meta:
            return super().__call__(*args, out=out, **kwargs)
        self._agreed = False
        try:
            return super().__call__(*args, out=out, **kwargs)
        except (TypeError, ValueError) as exc:
            if not self._agreed:
                agree(self.name, self.meta["mesh"], self._dims, None, str(exc))
            raise

    def _argument(self, value: np.ndarray, view: TensorView) -> int:
        """The array's address, which ``_run`` passes as the C pointer."""
        return view.address

    def _run(
        self, arrays: Mapping[str, int], values: Mapping[str, Any], sizes: Mapping[str, int]
    ) -> None:
        if "mesh" in self.meta:
            self._agreed = True
            agree(self.name, self.meta["mesh"], self._dims, sizes)
        call = [arrays[p["name"]] if p["kind"] == "tensor" else values[p["name"]]
                for p in self._params]  # fmt: skip
        launched(self._library.meta, self.name, self.meta["symbol"], self.meta["kernels"], sizes,
                 None, self._entry, *call, *(sizes[d] for d in self._dims))  # fmt: skip
        self._library.called()
        self._library.check_fault()


def _dtype(name: str) -> np.dtype:
    """The numpy dtype of a Tessera dtype, by its name."""
    return np.dtype(numpy_dtype(ENTRY_DTYPES[name]))


#: The C type of each scalar parameter type, as the generated entry declares it.
_CTYPES = {"bool": ctypes.c_bool, "int": ctypes.c_int64, "float": ctypes.c_float}


#: How many calls through the full checks make a module warm: then its C calls are
#: built (about a second of the compiler's, cached on disk), which pays off only for a
#: module that is called often; a module called a few times never waits for them.
WARM_CALLS = 32


class CpuLibrary(Library):
    """The loaded shared object: one attribute per function of the ``.tsr`` file."""

    def __init__(self, path: Path, meta: Mapping[str, Any]) -> None:
        self.path = path
        self._lib = ctypes.CDLL(str(path))
        self._calls = 0
        # A debug build's checks: the first failure of a call, taken after it.
        self._fault = getattr(self._lib, meta["fault"]) if "fault" in meta else None
        entries = [CpuFunction(getattr(self._lib, f["symbol"]), f, self)
                   for f in meta["functions"]]  # fmt: skip
        super().__init__(meta, entries)

    def called(self) -> None:
        """Count a call through the full checks; the ``WARM_CALLS``-th gives every
        function its C call."""
        self._calls += 1
        if self._calls != WARM_CALLS or self._fault is not None:
            return  # a debug build's calls all take the checks
        compiler = self.meta["build"]["compiler"]
        calls = load_extension(self.meta, self._lib, compiler, _dtype, self._disagreed)
        for name, call in calls.items():
            self.functions[name]._fast = call
            self.functions[name]._fast_takes_out = True

    def _disagreed(self, name: str, sizes: tuple[int, ...]) -> None:
        """The C call of the mesh function ``name`` met processes that disagree: the
        ValueError of ``mpi.disagree``, on every process alike (a process on the full
        checks raises it from ``mpi.agree``)."""
        function = self.functions[name]
        function._agreed = True  # met: the error is the meeting's, not a second one
        disagree(name, function._dims, sizes, None)

    def check_fault(self) -> None:
        """In a debug build, raise for the first check the call failed: ``BoundsError``,
        or ``NonFiniteError`` for the first launch that wrote NaN or infinity."""
        if self._fault is not None:
            record = (ctypes.c_int64 * 8)()
            self._fault(record)
            raise_cpu_fault(self.meta, record)


def load(source: str, meta: Mapping[str, Any], flags: Sequence[str] | None = None) -> CpuLibrary:
    """Build (or find in the cache) and load a CPU module from its source and metadata."""
    for f in meta["functions"]:
        if "mesh" in f:
            world(f["name"], f["mesh"])  # MPI is up, with one process per device
    flags = list(flags if flags is not None else meta["build"]["flags"])
    return CpuLibrary(build(source, flags, meta["build"]["compiler"]), meta)
