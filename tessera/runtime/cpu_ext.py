"""The CPU module's calls for numpy arrays, as a Python extension module written in C.

A call through ctypes pays for Python on every step: reading each array's address
(``a.ctypes.data`` builds an object: 3 µs), converting each argument, checking dtypes
and shapes one attribute at a time. For the common call (every input by position, as a
C-contiguous numpy array of its dtype, the result allocated) this module writes those
checks in C instead, one function per function of the ``.tsr`` file: the number of
arguments, each array's type, dtype (the very dtype object), rank, contiguity and
writability, the dims binding the size symbols or matching them, the scalars' exact
Python types, the guards; then the result comes from ``PyArray_Empty``, or is the
caller's ``out=`` (an array of exactly the result's dtype, shape and layout, writable),
and the generated entry runs without the GIL, through its address in the shared object.

A function on a mesh meets the other processes first, as the full checks do
(``tessera.runtime.mpi.agree``): the same all-reduce of the same message over MPI's
world, made here in C, so that a process on this path and one on the full checks meet
each other. Where they disagree (a process refused its arguments, or the shards
differ), nothing runs and the call returns what the module's ``disagreed(name, sizes)``
returns, which gathers the details and raises on every process alike.

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
from collections.abc import Callable, Mapping, Sequence
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

// Whether the memory of the arrays a and b overlaps (both C-contiguous): a result
// written over an input it still reads would be wrong, so such a call takes the full
// checks, which run it into a new array and copy that (as numpy's out= does).
bool overlap(PyArrayObject* a, PyArrayObject* b) {{
  const char* const a0 = static_cast<const char*>(PyArray_DATA(a));
  const char* const b0 = static_cast<const char*>(PyArray_DATA(b));
  return a0 < b0 + PyArray_NBYTES(b) && b0 < a0 + PyArray_NBYTES(a);
}}

// What the calls of a mesh function return where the processes disagree (bind() sets
// it): the runtime's disagreed(name, sizes), which raises on every process.
PyObject* disagreed = nullptr;

// The keyword arguments a call takes: only `out`, into `given` (nullptr for None);
// false for any other.
bool keywords(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** given) {{
  *given = nullptr;
  if (kwnames == nullptr) return true;
  if (PyTuple_GET_SIZE(kwnames) != 1 ||
      PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "out") != 0)
    return false;
  if (args[nargs] != Py_None) *given = args[nargs];
  return true;
}}
"""

#: The meeting of a mesh function's call, in C: ``tessera.runtime.mpi.agree``'s message.
_MEETING = """
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

namespace {

// The processes' meeting before a mesh function's first collective, as
// tessera.runtime.mpi.agree makes it: the all-reduce (max) over the world of the
// failure flag, the n sizes and their negations, the first 1 + 2n of `message`, into
// its second 1 + 2n. Whether every process accepted its arguments and gave the same
// sizes.
bool meet(std::int64_t* message, int n) {
  std::int64_t* const extremes = message + 1 + 2 * n;
  MPI_Allreduce(message, extremes, 1 + 2 * n, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (extremes[0] != 0) return false;
  for (int i = 0; i < n; ++i) {
    if (extremes[1 + i] != -extremes[1 + n + i]) return false;
  }
  return true;
}

}  // namespace
"""

_BIND = """
// bind(entries, dtypes, disagreed): the generated entries' addresses in the shared
// object, in the order of the functions above, the dtype objects the calls compare with,
// and what a mesh function's call returns where the processes disagree.
PyObject* bind(PyObject*, PyObject* args) {{
  PyObject *addresses, *kinds, *failed;
  if (!PyArg_ParseTuple(args, "O!O!O", &PyTuple_Type, &addresses, &PyTuple_Type, &kinds,
                        &failed))
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
  Py_INCREF(failed);
  disagreed = failed;
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
        lines = [
            "PyObject* given;",
            "if (!keywords(args, nargs, kwnames, &given)) Py_RETURN_NOTIMPLEMENTED;",
            f"if (nargs != {len(inputs)}) Py_RETURN_NOTIMPLEMENTED;",
        ]
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
            if g["kind"] == "indices":
                at = next(i for i, p in enumerate(inputs) if p["name"] == g["tensor"])
                check = _indices(g, symbols, f"a{at}", inputs[at]["dtype"])
                if check is None:
                    return None
                lines += check
                continue
            condition = _guard(g, symbols)
            if condition is None:
                return None
            lines.append(f"if (!({condition})) Py_RETURN_NOTIMPLEMENTED;")
        by_name = {p["name"]: p for p in f["params"]}
        results = [by_name[name] for name in f["results"]]
        if any(d not in symbols and not d.isdigit() for r in results for d in r["dims"]):
            return None
        shapes = [", ".join(symbols.get(d, d) for d in r["dims"]) for r in results]
        tensors = [f"a{i}" for i, p in enumerate(inputs) if p["kind"] == "tensor"]
        lines += (
            _given(results[0], shapes[0], dtypes, tensors)
            if _takes_out(results)
            else ["if (given != nullptr) Py_RETURN_NOTIMPLEMENTED;"]
        )
        for r, (p, shape) in enumerate(zip(results, shapes, strict=True)):
            sized = f" r{r}_shape[] = {{{shape}}};" if shape else f"* r{r}_shape = nullptr;"
            made = [
                f"npy_intp{sized}",
                f"r{r} = empty({len(p['dims'])}, r{r}_shape, {dtypes[p['dtype']]});",
                f"if (r{r} == nullptr) {{",
                *(f"  Py_DECREF(r{k});" for k in range(r)),
                "  return nullptr;",
                "}",
            ]  # fmt: skip
            if r == 0 and _takes_out(results):
                lines += ["if (r0 == nullptr) {", *(f"  {line}" for line in made), "}"]
            else:
                lines += [f"PyObject* r{r} = nullptr;", *made]
            value[p["name"]] = f"PyArray_DATA(reinterpret_cast<PyArrayObject*>(r{r}))"
        names = [f"r{r}" for r in range(len(results))]
        arguments = [value[p["name"]] for p in f["params"]] + list(symbols.values())
        call = f"entry_{index}({', '.join(arguments)});"
        if "mesh" in f:
            lines += _met(f["name"], call, list(symbols.values()), names)
        else:
            lines += ["Py_BEGIN_ALLOW_THREADS", call, "Py_END_ALLOW_THREADS"]
        lines.append(_returned(names))
        params = [_C_SCALARS[p["type"]] if p["kind"] == "scalar" else "void*" for p in f["params"]]
        return cls(index, lines, params + ["std::int64_t"] * len(f["dims"]))

    def text(self, name: str) -> str:
        body = "".join(f"  {line}\n" for line in self.lines)
        return (
            f"\n// {name}\nvoid (*entry_{self.index})({', '.join(self.params)});\n"
            f"PyObject* call_{self.index}(PyObject*, PyObject* const* args, Py_ssize_t nargs, "
            f"PyObject* kwnames) {{\n{body}}}\n"
        )


def _takes_out(results: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the C call takes ``out=``: for a function of one result, not of i4 (whose
    array's last dim counts bytes, two elements to one)."""
    return len(results) == 1 and results[0]["dtype"] != "i4"


def _given(
    p: Mapping[str, Any], shape: str, dtypes: Mapping[str, int], tensors: Sequence[str]
) -> list[str]:
    """The checks of the caller's ``out=`` for the result ``p`` of ``shape`` (C sizes),
    as the full checks make them: where they do not hold, the full checks run instead
    and give the error, or, for an ``out`` over the memory of one of the input arrays
    ``tensors``, the result through a new array. ``r0`` is the given array, or nullptr."""
    dims, kind = p["dims"], dtypes[p["dtype"]]
    lines = [
        "PyObject* r0 = nullptr;",
        "if (given != nullptr) {",
        f"  PyArrayObject* const o = array(given, dtypes[{kind}], {len(dims)}, true);",
        "  if (o == nullptr) Py_RETURN_NOTIMPLEMENTED;",
    ]  # fmt: skip
    if dims:
        lines += [f"  const npy_intp want[] = {{{shape}}};",
                  f"  for (int i = 0; i < {len(dims)}; ++i) {{",
                  "    if (PyArray_DIM(o, i) != want[i]) Py_RETURN_NOTIMPLEMENTED;",
                  "  }"]  # fmt: skip
    lines += [f"  if (overlap(o, {x})) Py_RETURN_NOTIMPLEMENTED;" for x in tensors]
    return [*lines, "  Py_INCREF(given);", "  r0 = given;", "}"]


def _met(name: str, call: str, sizes: list[str], results: list[str]) -> list[str]:
    """A mesh function's entry ``call``, after the processes' meeting on its ``sizes``;
    where they disagree, the ``results`` are dropped and ``disagreed`` raises."""
    n = len(sizes)
    message = ", ".join(["0", *sizes, *(f"-{s}" for s in sizes)])
    every = "".join(f", static_cast<long long>({s})" for s in sizes)
    return [
        f"std::int64_t message[{2 * (1 + 2 * n)}] = {{{message}}};",
        "bool agreed = false;",
        "Py_BEGIN_ALLOW_THREADS",
        f"agreed = meet(message, {n});",
        f"if (agreed) {call}",
        "Py_END_ALLOW_THREADS",
        "if (!agreed) {",
        *(f"  Py_DECREF({r});" for r in results),
        f'  return PyObject_CallFunction(disagreed, "s({"L" * n})", "{name}"{every});',
        "}",
    ]


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


def _sides(g: Mapping[str, Any], symbols: Mapping[str, str]) -> list[str] | None:
    """A guard's two sides as C expressions of the sizes, or None where C's integers
    could differ from the exact arithmetic of the full checks (a fraction, a division
    by a size)."""
    sides = []
    for text in (g["left"], g["right"]):
        dim = parse_dim(text)
        if any(p < 0 for monomial, _ in dim.terms for _, p in monomial):
            return None
        if any(Fraction(c).denominator != 1 for _, c in dim.terms):
            return None
        sides.append(f"({c_dim(dim, dict(symbols))})")
    return sides


#: The C types of the integer tensors whose values a guard checks.
_INDEX_TYPES = {"i32": "std::int32_t", "i64": "std::int64_t"}


def _indices(
    g: Mapping[str, Any], symbols: Mapping[str, str], x: str, dtype: str
) -> list[str] | None:
    """An ``indices`` guard as a C loop over the values of the tensor ``x``: one outside
    ``[left, right)`` leaves the call to the full checks, which say which and why (a
    gather's index, a cache's row that an append would overflow)."""
    sides = _sides(g, symbols)
    if sides is None or dtype not in _INDEX_TYPES:
        return None
    left, right = sides
    values = f"static_cast<const {_INDEX_TYPES[dtype]}*>(PyArray_DATA({x}))"
    return [
        f"for (npy_intp i = 0, n = PyArray_SIZE({x}); i < n; ++i) {{",
        f"  const std::int64_t value = {values}[i];",
        f"  if (value < {left} || value >= {right}) Py_RETURN_NOTIMPLEMENTED;",
        "}",
    ]


def _guard(g: Mapping[str, Any], symbols: Mapping[str, str]) -> str | None:
    """A guard on the sizes as a C condition, or None where ``_sides`` has none."""
    sides = _sides(g, symbols)
    if sides is None:
        return None
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
    if any("mesh" in meta["functions"][i] for i, _ in made):
        text += _MEETING
    text += "".join(fn.text(meta["functions"][i]["name"]) for i, fn in made)
    assign = "".join(
        f"  entry_{i} = reinterpret_cast<decltype(entry_{i})>("
        f"PyLong_AsVoidPtr(PyTuple_GET_ITEM(addresses, {k})));\n"
        for k, (i, _) in enumerate(made)
    )
    methods = "".join(
        f'    {{"f{i}", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call_{i})), '
        "METH_FASTCALL | METH_KEYWORDS, nullptr},\n"
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
    dtype: Any, disagreed: Callable[[str, tuple[int, ...]], Any],
) -> dict[str, Any]:  # fmt: skip
    """Each function's C call, by name, for the loaded shared object ``library`` (empty
    where the extension cannot be built here). ``dtype(name)`` is a dtype's numpy dtype;
    a mesh function's call returns ``disagreed(name, sizes)`` where the processes'
    meeting finds that they disagree (``sizes``: this process's, in the order of the
    function's ``dims``)."""
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
    module.bind(addresses, tuple(dtype(d) for d in dtype_names), disagreed)
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
