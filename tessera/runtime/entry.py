"""What every runtime does before it runs a function: check the arguments.

The metadata of every target describes an entry the same way (parameters with
dtypes and dims, size symbols, guards; ``transpiler/target/entry.py``), so the
checks, and their messages, are the same whichever backend runs the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..transpiler.graph.dims import Dim, parse_dim
from ..transpiler.graph.dtypes import DTYPES
from ..transpiler.tile.interpret import numpy_dtype

__all__ = ["Entry", "Library", "evaluate", "argument"]


class Entry:
    """One function of a loaded module, called with numpy arrays and scalars.

    A call checks every argument against the metadata (dtype, rank, contiguity,
    the sizes its dims give, the guards), allocates the result, and hands the
    arrays, the scalars and the sizes to the backend's ``_run``.
    """

    def __init__(self, meta: Mapping[str, Any]) -> None:
        self.name = meta["name"]
        self.meta = meta
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
            shape = tuple(evaluate(d, sizes, p["name"]) for d in p["dims"])
            if out is None:
                result = np.empty(shape, dtype=numpy_dtype(DTYPES[p["dtype"]]))
            else:
                result = self._tensor(p, out, dict(sizes))
            arrays[p["name"]] = result
        elif out is not None:
            raise TypeError(f"{self.name}() returns nothing; it takes no 'out'")
        self._run(arrays, values, sizes)
        return result

    def _run(
        self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any], sizes: Mapping[str, int]
    ) -> None:
        """Run the function: tensors (the result included) by name, every argument by
        name, and the value of every size symbol."""
        raise NotImplementedError

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
            want_size = evaluate(text, sizes, name)
            if want_size != size:
                raise ValueError(
                    f"{self.name}(): '{name}' has shape {value.shape}: dim {text} should be "
                    f"{want_size} ({_bindings(parse_dim(text), sizes)})"
                )
        return value

    def _check_guards(self, sizes: Mapping[str, int]) -> None:
        for g in self.meta["guards"]:
            left = evaluate(g["left"], sizes, "guard")
            right = evaluate(g["right"], sizes, "guard")
            ok = {"equal": left == right, "divisible": right != 0 and left % right == 0,
                  "at_most": left <= right}[g["kind"]]  # fmt: skip
            if not ok:
                relation = {"equal": "==", "divisible": "% ... == 0 with", "at_most": "<="}
                raise ValueError(
                    f"{self.name}(): {g['left']} = {left} breaks {g['left']} "
                    f"{relation[g['kind']]} {g['right']} ({g['reason']})"
                )


class Library:
    """A loaded module: one attribute per function of the ``.tsr`` file, named as there."""

    def __init__(self, meta: Mapping[str, Any], entries: list[Entry]) -> None:
        self.meta = meta
        self.functions = {e.name: e for e in entries}

    def __getattr__(self, name: str) -> Any:
        functions = self.__dict__.get("functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"no function '{name}' (the file defines: {', '.join(functions)})")

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self.functions]


def evaluate(text: str, sizes: Mapping[str, int], where: str) -> int:
    """The value of a size expression (a dim as the metadata writes it) at ``sizes``."""
    dim = parse_dim(text)
    missing = sorted(dim.symbols() - set(sizes))
    if missing:
        raise ValueError(f"the size {', '.join(missing)} of '{where}' is given by no argument")
    value = dim.substitute(dict(sizes)).constant
    if value is None:
        raise ValueError(f"'{where}': {text} is not a whole number with {dict(sizes)}")
    return value


def argument(
    name: str, device: Mapping[str, Any], scalars: Mapping[str, Any], sizes: Mapping[str, int]
) -> Any:
    """A kernel argument by its metadata name: a device buffer, a scalar, or a size (a
    64-bit integer, as every backend declares sizes)."""
    if name in device:
        return device[name]
    if name in scalars:
        return scalars[name]
    return np.int64(sizes[name])


def _bindings(dim: Dim, sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{s} = {sizes[s]}" for s in sorted(dim.symbols()) if s in sizes)
