"""Entries that take NumPy arrays themselves, built into the CPU module beside its own.

Taking a NumPy array's address from Python costs microseconds (``a.ctypes.data``
builds an object per call, ``__array_interface__`` a dictionary), more than the rest
of a small call together. So the shared object the runtime loads carries, after the
generated source, one more entry per function, ``tsr_numpy_<function>``: the same
parameters, with each tensor passed as the array object (ctypes hands a
``py_object`` on as its address, for nothing) and its data pointer read where NumPy's
C API declares it: ``PyArrayObject_fields.data``, the first member after the object
header. ``load`` checks that offset on a live array before it uses these entries.
The generated ``.cpp`` file itself is unchanged: these entries exist only in the
runtime's build of it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["shim_source", "header_matches", "DATA_OFFSET"]

#: Where a NumPy array's data pointer lies in the array object: after CPython's object
#: header (a reference count and a type pointer) in a release build.
DATA_OFFSET = 2 * ctypes.sizeof(ctypes.c_void_p)

_PRELUDE = f"""
// ---- entries for Python: NumPy arrays in place of their data pointers

#include <cstddef>
#include <tuple>

namespace tsr_py {{

// The type of parameter I of the entry F.
template <typename F>
struct Signature;
template <typename... A>
struct Signature<void (*)(A...)> {{
  template <std::size_t I>
  using Param = std::tuple_element_t<I, std::tuple<A...>>;
}};
template <auto F, std::size_t I>
using Param = typename Signature<decltype(F)>::template Param<I>;

// The data pointer of a NumPy array object (PyArrayObject_fields.data).
template <typename T>
T data(const void* array) {{
  const char* object = static_cast<const char*>(array);
  return static_cast<T>(*reinterpret_cast<void* const*>(object + {DATA_OFFSET}));
}}

}}  // namespace tsr_py
"""


def shim_source(meta: Mapping[str, Any]) -> str:
    """The Python entries of every function of the CPU module ``meta`` describes."""
    return _PRELUDE + "".join(_entry(f) for f in meta["functions"])


def _entry(f: Mapping[str, Any]) -> str:
    symbol = f["symbol"]
    params, args = [], []
    for i, p in enumerate(f["params"]):
        name = f"p{i}"
        if p["kind"] == "tensor":
            params.append(f"const void* {name}")
            args.append(f"tsr_py::data<tsr_py::Param<&{symbol}, {i}>>({name})")
        else:
            params.append(f"tsr_py::Param<&{symbol}, {i}> {name}")
            args.append(name)
    count = len(f["params"])
    for j, _ in enumerate(f["dims"]):
        params.append(f"tsr_py::Param<&{symbol}, {count + j}> d{j}")
        args.append(f"d{j}")
    return (
        f'\nextern "C" void tsr_numpy_{f["name"]}({", ".join(params)}) {{\n'
        f"  {symbol}({', '.join(args)});\n}}\n"
    )


def header_matches() -> bool:
    """Whether this interpreter's NumPy arrays keep their data pointer at ``DATA_OFFSET``
    (a debug or free-threaded CPython has a larger object header)."""
    probe = np.empty(1)
    seen = ctypes.c_void_p.from_address(id(probe) + DATA_OFFSET).value
    return seen == probe.ctypes.data
