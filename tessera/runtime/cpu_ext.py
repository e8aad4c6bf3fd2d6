"""The CPU module's calls for numpy arrays, as a Python extension module written in C.

A call through ctypes pays for Python on every step: reading each array's address
(``a.ctypes.data`` builds an object: 3 µs), converting each argument, checking dtypes
and shapes one attribute at a time. For the common call (every input by position, as a
C-contiguous numpy array of its dtype, the result allocated) this module writes those
checks in C instead, one function per function of the ``.tsr`` file: the number of
arguments, each array's type, dtype (the very dtype object), rank, contiguity and
writability, the dims binding the size symbols or matching them, the scalars' exact
Python types, the guards; then the results come from ``PyArray_Empty`` and the
generated entry runs without the GIL, through its address in the shared object.

Anything else returns ``NotImplemented`` and the runtime runs its full checks, which
raise the error with its message or run the call as before: the C code never decides
that a call is wrong. A function whose checks do not reduce so (a dim that is an
expression of sizes, a guard that divides by a size or reads a tensor's values) gets
no C function and always takes the full checks.

The extension is built once per text, Python and NumPy version, with the module's
compiler, beside the module in the cache; without Python's or NumPy's headers there is
none, and every call takes the full checks.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..cachedir import cache_dir
from ..transpiler.graph.dims import parse_dim
from ..transpiler.target.cexpr import c_dim

__all__ = ["extension_source", "load_extension"]

_PRELUDE = """\
// The calls of a Tessera CPU module for numpy arrays (tessera/runtime/cpu_ext.py).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <cstdint>

namespace {{

// The dtypes of the module's tensors, as numpy's dtype objects (bind() sets them).
PyArray_Descr* dtypes[{dtypes}];

// x as an array the fast path takes: exactly a numpy array, of the very dtype object
// `dtype`, of rank `ndim`, C-contiguous, and writable if `written`; else nullptr.
PyArrayObject* array(PyObject* x, PyArray_Descr* dtype, int ndim, bool written) {{
  if (!PyArray_CheckExact(x)) return nullptr;
  PyArrayObject* a = reinterpret_cast<PyArrayObject*>(x);
  if (PyArray_DESCR(a) != dtype || PyArray_NDIM(a) != ndim || !PyArray_IS_C_CONTIGUOUS(a))
    return nullptr;
  if (written && !PyArray_ISWRITEABLE(a)) return nullptr;
  return a;
}}

// A new array of `shape` and dtypes[dtype]; nullptr with the error set if there is no
// memory.
PyObject* empty(int ndim, npy_intp* shape, int dtype) {{
  Py_INCREF(dtypes[dtype]);  // PyArray_Empty takes a reference
  return PyArray_Empty(ndim, shape, dtypes[dtype], 0);
}}
"""

_BIND = """
// bind(entries, dtypes): the generated entries' addresses in the shared object, in the
// order of the functions above, and the dtype objects the calls compare with.
PyObject* bind(PyObject*, PyObject* args) {{
  PyObject *addresses, *kinds;
  if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &addresses, &PyTuple_Type, &kinds))
    return nullptr;
  if (PyTuple_GET_SIZE(addresses) != {entries} || PyTuple_GET_SIZE(kinds) != {dtypes}) {{
    PyErr_SetString(PyExc_ValueError, "bind() takes {entries} entries and {dtypes} dtypes");
    return nullptr;
  }}
{assign}  for (Py_ssize_t i = 0; i < {dtypes}; ++i) {{
    PyObject* kind = PyTuple_GET_ITEM(kinds, i);
    if (!PyArray_DescrCheck(kind)) {{
      PyErr_SetString(PyExc_TypeError, "bind() takes numpy dtypes");
      return nullptr;
    }}
    Py_INCREF(kind);
    dtypes[i] = reinterpret_cast<PyArray_Descr*>(kind);
  }}
  Py_RETURN_NONE;
}}

PyMethodDef methods[] = {{
{methods}    {{"bind", bind, METH_VARARGS, nullptr}},
    {{nullptr, nullptr, 0, nullptr}},
}};

PyModuleDef module = {{PyModuleDef_HEAD_INIT, "{name}", nullptr, -1, methods,
                      nullptr, nullptr, nullptr, nullptr}};

}}  // namespace

PyMODINIT_FUNC PyInit_{name}(void) {{
  import_array();
  return PyModule_Create(&module);
}}
"""

#: The C type a generated entry declares for each scalar parameter type.
_C_SCALARS = {"float": "float", "int": "std::int64_t", "bool": "bool"}


class _Function:
    """The C function of one ``.tsr`` function, or None from ``of`` where its checks do
    not reduce to the fast path's."""

    def __init__(self, index: int, lines: list[str], params: list[str]) -> None:
        self.index = index
        self.lines = lines
        self.params = params  # the entry's C parameter types

    @classmethod
    def of(cls, index: int, f: Mapping[str, Any], dtypes: dict[str, int]) -> _Function | None:
        inputs = [p for p in f["params"] if p.get("io") != "out"]
        if any(p.get("keyword_only") for p in inputs):
            return None
        symbols = {name: f"s{i}" for i, name in enumerate(f["dims"])}
        lines = [f"if (nargs != {len(inputs)}) Py_RETURN_NOTIMPLEMENTED;"]
        value = {}  # each parameter's C value in the entry's call
        bound: set[str] = set()
        for i, p in enumerate(inputs):
            x = f"a{i}"
            if p["kind"] == "scalar":
                lines += _scalar(x, i, p["type"])
                value[p["name"]] = x
                continue
            written = "true" if p["io"] != "in" else "false"
            lines += [
                f"PyArrayObject* const {x} = array(args[{i}], dtypes[{dtypes[p['dtype']]}], "
                f"{len(p['dims'])}, {written});",
                f"if ({x} == nullptr) Py_RETURN_NOTIMPLEMENTED;",
            ]
            for axis, text in enumerate(p["dims"]):
                have = f"PyArray_DIM({x}, {axis})"
                if text in symbols and text not in bound:
                    bound.add(text)
                    lines.append(f"const std::int64_t {symbols[text]} = {have};")
                elif text in symbols or text.isdigit():
                    lines.append(f"if ({have} != {symbols.get(text, text)}) "
                                 "Py_RETURN_NOTIMPLEMENTED;")  # fmt: skip
                else:
                    return None
            value[p["name"]] = f"PyArray_DATA({x})"
        if set(symbols) - bound:
            return None  # a size only a scalar gives
        for g in f["guards"]:
            condition = _guard(g, symbols)
            if condition is None:
                return None
            lines.append(f"if (!({condition})) Py_RETURN_NOTIMPLEMENTED;")
        by_name = {p["name"]: p for p in f["params"]}
        results = []
        for r, name in enumerate(f["results"]):
            dims = by_name[name]["dims"]
            if any(d not in symbols and not d.isdigit() for d in dims):
                return None
            shape = ", ".join(symbols.get(d, d) for d in dims)
            lines += [
                (
                    f"npy_intp r{r}_shape[] = {{{shape}}};"
                    if dims
                    else f"npy_intp* r{r}_shape = nullptr;"
                ),
                f"PyObject* const r{r} = empty({len(dims)}, r{r}_shape, "
                f"{dtypes[by_name[name]['dtype']]});",
                f"if (r{r} == nullptr) {{",
                *(f"  Py_DECREF(r{k});" for k in range(r)),
                "  return nullptr;",
                "}",
            ]
            value[name] = f"PyArray_DATA(reinterpret_cast<PyArrayObject*>(r{r}))"
            results.append(f"r{r}")
        arguments = [value[p["name"]] for p in f["params"]] + list(symbols.values())
        lines += ["Py_BEGIN_ALLOW_THREADS", f"entry_{index}({', '.join(arguments)});",
                  "Py_END_ALLOW_THREADS", _returned(results)]  # fmt: skip
        params = [_C_SCALARS[p["type"]] if p["kind"] == "scalar" else "void*" for p in f["params"]]
        return cls(index, lines, params + ["std::int64_t"] * len(f["dims"]))

    def text(self, name: str) -> str:
        body = "".join(f"  {line}\n" for line in self.lines)
        return (
            f"\n// {name}\nvoid (*entry_{self.index})({', '.join(self.params)});\n"
            f"PyObject* call_{self.index}(PyObject*, PyObject* const* args, Py_ssize_t nargs) "
            f"{{\n{body}}}\n"
        )


def _scalar(x: str, i: int, kind: str) -> list[str]:
    """The checks and the C value of a scalar argument of exactly its Python type."""
    if kind == "float":
        return [f"if (!PyFloat_CheckExact(args[{i}])) Py_RETURN_NOTIMPLEMENTED;",
                f"const float {x} = static_cast<float>(PyFloat_AS_DOUBLE(args[{i}]));"]  # fmt: skip
    if kind == "bool":
        return [f"if (!PyBool_Check(args[{i}])) Py_RETURN_NOTIMPLEMENTED;",
                f"const bool {x} = args[{i}] == Py_True;"]  # fmt: skip
    return [
        f"if (!PyLong_CheckExact(args[{i}])) Py_RETURN_NOTIMPLEMENTED;",
        f"int {x}_overflow = 0;",
        f"const std::int64_t {x} = PyLong_AsLongLongAndOverflow(args[{i}], &{x}_overflow);",
        f"if ({x}_overflow != 0) Py_RETURN_NOTIMPLEMENTED;",
    ]


def _guard(g: Mapping[str, Any], symbols: Mapping[str, str]) -> str | None:
    """A guard as a C condition on the sizes, or None where C's integers could differ
    from the exact arithmetic of the full checks (a fraction, a division by a size) or
    the guard reads a tensor's values."""
    if g["kind"] == "indices":
        return None
    sides = []
    for text in (g["left"], g["right"]):
        dim = parse_dim(text)
        if any(p < 0 for monomial, _ in dim.terms for _, p in monomial):
            return None
        if any(Fraction(c).denominator != 1 for _, c in dim.terms):
            return None
        sides.append(f"({c_dim(dim, dict(symbols))})")
    left, right = sides
    if g["kind"] == "divisible":
        return f"{right} != 0 && {left} % {right} == 0"
    return f"{left} {_RELATIONS[g['kind']]} {right}"


_RELATIONS = {"equal": "==", "at_most": "<=", "at_least": ">="}


def _returned(results: list[str]) -> str:
    if not results:
        return "Py_RETURN_NONE;"
    if len(results) == 1:
        return f"return {results[0]};"
    steals = ", ".join(results)
    # PyTuple_Pack takes new references: the results' own go with the tuple.
    return (f"PyObject* const all = PyTuple_Pack({len(results)}, {steals});\n  "
            + "".join(f"Py_DECREF({r}); " for r in results) + "\n  return all;")  # fmt: skip


def extension_source(meta: Mapping[str, Any], name: str) -> tuple[str, list[int], list[str]]:
    """The extension's C++ source for the module ``meta`` describes, named ``name``; the
    index of each function that has a C call (in ``meta``'s order); the dtypes by name."""
    dtype_names = sorted({p["dtype"] for f in meta["functions"] for p in f["params"]
                          if p["kind"] == "tensor"})  # fmt: skip
    dtypes = {d: i for i, d in enumerate(dtype_names)}
    functions = [(i, _Function.of(i, f, dtypes)) for i, f in enumerate(meta["functions"])]
    made = [(i, fn) for i, fn in functions if fn is not None]
    text = _PRELUDE.format(dtypes=max(1, len(dtypes)))
    text += "".join(fn.text(meta["functions"][i]["name"]) for i, fn in made)
    assign = "".join(
        f"  entry_{i} = reinterpret_cast<decltype(entry_{i})>("
        f"PyLong_AsVoidPtr(PyTuple_GET_ITEM(addresses, {k})));\n"
        for k, (i, _) in enumerate(made)
    )
    methods = "".join(
        f'    {{"f{i}", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call_{i})), '
        "METH_FASTCALL, nullptr},\n"
        for i, _ in made
    )
    text += _BIND.format(entries=len(made), dtypes=len(dtypes), assign=assign,
                         methods=methods, name=name)  # fmt: skip
    return text, [i for i, _ in made], dtype_names


def _headers() -> list[str] | None:
    """The include flags for Python's and NumPy's headers, or None where either lacks."""
    python = sysconfig.get_paths().get("include")
    if not python or not (Path(python) / "Python.h").exists():
        return None
    return [f"-I{python}", f"-I{np.get_include()}"]


def load_extension(
    meta: Mapping[str, Any], library: ctypes.CDLL, compiler: str,
    dtype: Any,
) -> dict[str, Any]:  # fmt: skip
    """Each function's C call, by name, for the loaded shared object ``library`` (empty
    where the extension cannot be built here). ``dtype(name)`` is a dtype's numpy dtype."""
    headers = _headers()
    if headers is None or shutil.which(compiler) is None:  # a bundle runs without one
        return {}
    probe, _, _ = extension_source(meta, "tsr_numpy")
    versions = "\0".join([sys.version, np.__version__, compiler])
    key = hashlib.sha256(f"{probe}\0{versions}".encode()).hexdigest()[:24]
    name = f"tsr_numpy_{key}"
    text, made, dtype_names = extension_source(meta, name)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    target = cache_dir() / f"{name}{suffix}"
    if not target.exists():
        _build(text, target, compiler, headers)
    spec = importlib.util.spec_from_file_location(name, target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    functions = meta["functions"]
    addresses = tuple(
        ctypes.cast(getattr(library, functions[i]["symbol"]), ctypes.c_void_p).value for i in made
    )
    module.bind(addresses, tuple(dtype(d) for d in dtype_names))
    return {functions[i]["name"]: getattr(module, f"f{i}") for i in made}


def _build(text: str, target: Path, compiler: str, headers: Sequence[str]) -> None:
    """Compile the extension into ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source = Path(tmp) / "numpy_calls.cpp"
        source.write_text(text, encoding="utf-8")
        out = Path(tmp) / target.name
        flags = ["-std=c++17", "-O2", "-shared", "-fPIC", *headers]
        done = subprocess.run([compiler, *flags, str(source), "-o", str(out)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed on the numpy calls' source:\n{done.stderr}")
        os.replace(out, target)  # atomic: a concurrent build of the same key is harmless
