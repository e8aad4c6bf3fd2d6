"""Build and run the CPU backend's output: g++, a shared object, ctypes, numpy.

``load(program)`` compiles the generated C++ once per distinct source and flags
(the shared object is cached under ``$TESSERA_CACHE_DIR``, else
``$XDG_CACHE_HOME/tessera``, else ``~/.cache/tessera``), loads it, and returns
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
from pathlib import Path
from typing import Any

import numpy as np

from ..transpiler.graph.dims import Dim, parse_dim
from ..transpiler.graph.dtypes import DTYPES
from ..transpiler.tile.interpret import numpy_dtype

__all__ = ["CpuLibrary", "CpuFunction", "BuildError", "load", "build", "cache_dir"]


class BuildError(RuntimeError):
    """The C++ compiler rejected the generated source (a compiler bug, or a broken
    toolchain); the message has its output."""


def cache_dir() -> Path:
    if "TESSERA_CACHE_DIR" in os.environ:
        return Path(os.environ["TESSERA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tessera"


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


class CpuFunction:
    """One entry of the shared object, called with numpy arrays and scalars."""

    def __init__(self, entry: Any, meta: Mapping[str, Any]) -> None:
        self.name = meta["name"]
        self.meta = meta
        self._entry = entry
        self._entry.restype = None
        self._params = meta["params"]
        self._dims = meta["dims"]
        self.__doc__ = f"{self.name}({', '.join(self._signature())})"

    def _signature(self) -> list[str]:
        out = []
        for p in self._params:
            if p["kind"] == "scalar":
                out.append(f"{p['name']}: {p['type']}")
            elif p["io"] != "out":
                out.append(f"{p['name']}: {p['dtype']}[{', '.join(p['dims'])}]")
        return out

    def __call__(self, *args: Any, out: np.ndarray | None = None, **kwargs: Any) -> Any:
        """Run the function. ``out`` is an optional preallocated result array."""
        inputs = [p for p in self._params if p.get("io") != "out"]
        if len(args) > len(inputs):
            raise TypeError(f"{self.name}() takes {len(inputs)} arguments, {len(args)} given")
        values = dict(zip((p["name"] for p in inputs), args, strict=False))
        for name, value in kwargs.items():
            if name not in {p["name"] for p in inputs}:
                raise TypeError(f"{self.name}() has no parameter '{name}'")
            if name in values:
                raise TypeError(f"{self.name}() got '{name}' twice")
            values[name] = value
        missing = [p["name"] for p in inputs if p["name"] not in values]
        if missing:
            raise TypeError(f"{self.name}() is missing {', '.join(missing)}")
        sizes: dict[str, int] = {}
        arrays: dict[str, np.ndarray] = {}
        for p in inputs:
            if p["kind"] == "tensor":
                arrays[p["name"]] = self._tensor(p, values[p["name"]], sizes)
        self._check_guards(sizes)
        result = None
        if self.meta["result"] is not None:
            p = next(p for p in self._params if p["name"] == self.meta["result"])
            shape = tuple(_size(d, sizes, p["name"]) for d in p["dims"])
            if out is None:
                result = np.empty(shape, dtype=numpy_dtype(DTYPES[p["dtype"]]))
            else:
                result = self._tensor(p, out, dict(sizes))
            arrays[p["name"]] = result
        elif out is not None:
            raise TypeError(f"{self.name}() returns nothing; it takes no 'out'")
        call = []
        for p in self._params:
            if p["kind"] == "tensor":
                call.append(arrays[p["name"]].ctypes.data_as(ctypes.c_void_p))
            else:
                call.append(_scalar(p, values[p["name"]]))
        call += [ctypes.c_int64(sizes[d]) for d in self._dims]
        self._entry(*call)
        return result

    def _tensor(self, p: Mapping[str, Any], value: Any, sizes: dict[str, int]) -> np.ndarray:
        name = p["name"]
        want = numpy_dtype(DTYPES[p["dtype"]])
        if not isinstance(value, np.ndarray):
            raise TypeError(f"{self.name}(): '{name}' must be a numpy array of {p['dtype']}")
        if value.dtype != want:
            raise TypeError(
                f"{self.name}(): '{name}' is {value.dtype}, the kernel takes {p['dtype']} "
                f"(numpy {np.dtype(want).name})"
            )
        if value.ndim != len(p["dims"]):
            raise ValueError(
                f"{self.name}(): '{name}' has shape {value.shape}, the kernel takes "
                f"[{', '.join(p['dims'])}]"
            )
        if not value.flags.c_contiguous:
            raise ValueError(f"{self.name}(): '{name}' must be C-contiguous (np.ascontiguousarray)")
        if p["io"] != "in" and not value.flags.writeable:
            raise ValueError(f"{self.name}(): '{name}' is updated in place but is read-only")
        for text, size in zip(p["dims"], value.shape, strict=True):
            dim = parse_dim(text)
            if dim.symbol is not None and dim.symbol not in sizes:
                sizes[dim.symbol] = size
        for text, size in zip(p["dims"], value.shape, strict=True):
            want_size = _size(text, sizes, name)
            if want_size != size:
                raise ValueError(
                    f"{self.name}(): '{name}' has shape {value.shape}: dim {text} should be "
                    f"{want_size} ({_bindings(parse_dim(text), sizes)})"
                )
        return value

    def _check_guards(self, sizes: Mapping[str, int]) -> None:
        for g in self.meta["guards"]:
            left = _size(g["left"], sizes, "guard")
            right = _size(g["right"], sizes, "guard")
            ok = {"equal": left == right, "divisible": right != 0 and left % right == 0,
                  "at_most": left <= right}[g["kind"]]  # fmt: skip
            if not ok:
                relation = {"equal": "==", "divisible": "% ... == 0 with", "at_most": "<="}
                raise ValueError(
                    f"{self.name}(): {g['left']} = {left} breaks {g['left']} "
                    f"{relation[g['kind']]} {g['right']} ({g['reason']})"
                )


def _size(text: str, sizes: Mapping[str, int], where: str) -> int:
    dim = parse_dim(text)
    missing = sorted(dim.symbols() - set(sizes))
    if missing:
        raise ValueError(f"the size {', '.join(missing)} of '{where}' is given by no argument")
    value = dim.substitute(dict(sizes)).constant
    if value is None:
        raise ValueError(f"'{where}': {text} is not a whole number with {dict(sizes)}")
    return value


def _bindings(dim: Dim, sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{s} = {sizes[s]}" for s in sorted(dim.symbols()) if s in sizes)


def _scalar(p: Mapping[str, Any], value: Any) -> Any:
    kind = p["type"]
    if kind == "bool":
        return ctypes.c_bool(bool(value))
    if kind == "int":
        return ctypes.c_int64(int(value))
    return ctypes.c_float(float(value))


class CpuLibrary:
    """The loaded shared object: one attribute per function of the ``.tsr`` file."""

    def __init__(self, path: Path, meta: Mapping[str, Any]) -> None:
        self.path = path
        self.meta = meta
        self._lib = ctypes.CDLL(str(path))
        self.functions = {
            f["name"]: CpuFunction(getattr(self._lib, f["symbol"]), f) for f in meta["functions"]
        }

    def __getattr__(self, name: str) -> CpuFunction:
        functions = self.__dict__.get("functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"no function '{name}' (the file defines: {', '.join(functions)})")

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self.functions]


def load(source: str, meta: Mapping[str, Any], flags: Sequence[str] | None = None) -> CpuLibrary:
    """Build (or find in the cache) and load a CPU module from its source and metadata."""
    flags = list(flags if flags is not None else meta["build"]["flags"])
    return CpuLibrary(build(source, flags, meta["build"]["compiler"]), meta)
