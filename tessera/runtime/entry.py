"""What every runtime does before it runs a function: check the arguments.

The metadata of every target describes an entry the same way (parameters with
dtypes and dims, size symbols, guards; ``transpiler/target/entry.py``), so the
checks, and their messages, are the same whichever backend runs the call.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..transpiler.graph.dims import Dim, parse_dim
from ..transpiler.graph.dtypes import ENTRY_DTYPES
from ..transpiler.target.entry import signature_items
from ..transpiler.tile.interpret import numpy_dtype
from .foreign import TensorView, host_array, host_view, numpy_view
from .kvcache import CacheSignature
from .optstate import StateSignature
from .telemetry import STATE as TELEMETRY

__all__ = ["Entry", "Library", "evaluate", "argument", "MISSED"]

#: What a fast path returns for a call it does not recognize (as C's binary operators
#: say they do not take an operand).
MISSED = NotImplemented

#: The NumPy scalar type of each scalar parameter type in a device kernel's signature.
_KERNEL_SCALARS = {"float": np.float32, "int": np.int64, "bool": np.int32}


class Entry:
    """One function of a loaded module, called with arrays and scalars.

    A call checks every argument against the metadata (dtype, rank, contiguity,
    the sizes its dims give, the guards), allocates the result, and hands the
    arrays, the scalars and the sizes to the backend's ``_run``. The arrays are
    numpy arrays unless the backend says otherwise (``_view``, ``_allocate``).
    """

    #: How to make a tensor C-contiguous, for the message that asks for it.
    _contiguous = "np.ascontiguousarray"
    #: Whether the backend launches the kernels itself (CUDA, HIP, OpenCL), so that a
    #: result whose kernel reads the input it updates (the metadata's ``updates``: a
    #: SIMT kernel's one pointer for a donated state's tensor) must hold that input's
    #: values when the launches start. A C entry (the CPU's, a SYCL host function)
    #: copies them itself where the two arrays differ.
    _fills_updates = False

    def __init__(self, meta: Mapping[str, Any]) -> None:
        self.name = meta["name"]
        self.meta = meta
        self._params = meta["params"]
        self._dims = meta["dims"]
        # What every call checks, prepared once: a call costs microseconds, not the
        # parsing of the same dim texts again.
        self._shapes = {p["name"]: tuple(parse_dim(t) for t in p["dims"])
                        for p in self._params if p["kind"] == "tensor"}  # fmt: skip
        self._dtypes = {p["name"]: np.dtype(numpy_dtype(ENTRY_DTYPES[p["dtype"]]))
                        for p in self._params if p["kind"] == "tensor"}  # fmt: skip
        self._inputs = [p for p in self._params if p.get("io") != "out"]
        #: The inputs a caller may pass by position: those before a bare ``*``.
        self._positional = [p for p in self._inputs if not p.get("keyword_only")]
        self._input_names = {p["name"] for p in self._inputs}
        by_name = {p["name"]: p for p in self._params}
        self._results = [by_name[name] for name in meta["results"]]
        #: The backend's fast path (``tessera.runtime.plan``): the call of the common
        #: case, or ``MISSED`` where it does not recognize the call.
        self._fast: Callable[..., Any] | None = None
        #: Whether the fast path also takes ``out=`` (the generated ones of
        #: ``tessera.runtime.plan`` do; the CPU's C calls do not).
        self._fast_takes_out = False
        #: The ``OptimizerState`` parameters and results, if any: a call takes and
        #: returns state objects in place of their arrays.
        self._states = (
            StateSignature(self.name, self._inputs, meta["states"], meta["results"])
            if "states" in meta
            else None
        )
        #: The results that the kernels may write over an input, by name: a returned
        #: state's tensors over the donated state's (``in_place``).
        self._donated = self._states.donated if self._states is not None else {}
        #: The results that start as a copy of an input, by name, where the backend
        #: makes that copy (``_fills_updates``): none when the call passes the input's
        #: own array as the result, as a donated state's call does.
        self._updates = {p["name"]: by_name[p["updates"]] for p in self._results
                         if "updates" in p and self._fills_updates}  # fmt: skip
        #: The ``KVCache`` parameters, if any: a call takes a ``tessera.KVCache`` for each,
        #: whose arrays the function's appends write; and each one's metadata by the name
        #: of its lengths, whose guard says whether an append fits.
        self._caches = CacheSignature(self.name, self._inputs, meta) if "caches" in meta else None
        self._lengths = {f"{c['name']}_lengths": c for c in meta.get("caches", ())}
        self.__doc__ = f"{self.name}({', '.join(self._signature())})"

    def _signature(self) -> list[str]:
        """The parameters as the docstring shows them, ``out`` last."""
        if self._states is not None:
            items = self._states.signature(signature_items)
        elif self._caches is not None:
            items = self._caches.signature(signature_items)
        else:
            items = signature_items(self._inputs)
        if len(self._inputs) < len(self._params):
            items += [] if "*" in items else ["*"]
            items.append("out=None")
        return items

    def __call__(self, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        """Run the function. ``out`` is an optional preallocated result array, or for a
        function of several results a tuple of them (``None`` where one is allocated),
        as numpy's ufuncs take it. A function of several results returns a tuple. An
        ``OptimizerState`` parameter takes a ``tessera.OptimizerState``, and a returned
        state is written into the one given (``tessera.runtime.optstate``)."""
        flat = [p["name"] for p in self._positional]
        if self._states is not None and self._caches is not None:
            raise TypeError(f"{self.name}() takes an OptimizerState and a KVCache, which a call "
                            "from Python does not unpack together yet: split the function "
                            "in two")  # fmt: skip
        if self._states is not None:
            return self._states.call(self._call, flat, args, kwargs, out)
        if self._caches is not None:
            return self._caches.call(self._call, flat, args, kwargs, out)
        return self._call(*args, out=out, **kwargs)

    def _call(self, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        """The call of the function's tensors and scalars as the metadata lists them."""
        fast = self._fast is not None and not TELEMETRY.on  # telemetry: the full path
        if fast and not kwargs and (out is None or self._fast_takes_out):
            done = self._fast(*args) if out is None else self._fast(*args, out=out)
            if done is not MISSED:
                return done
        inputs, positional = self._inputs, self._positional
        if len(args) > len(positional):
            named = [p["name"] for p in inputs if p.get("keyword_only")]
            only = f" ({', '.join(named)} by name only)" if named else ""
            raise TypeError(
                f"{self.name}() takes {len(positional)} positional arguments{only}, "
                f"{len(args)} given"
            )
        values = dict(zip((p["name"] for p in positional), args, strict=False))
        for name, value in kwargs.items():
            if name not in self._input_names:
                raise TypeError(f"{self.name}() has no parameter '{name}'")
            if name in values:
                raise TypeError(f"{self.name}() got '{name}' twice")
            values[name] = value
        for p in inputs:
            if p["name"] not in values and "default" in p:
                values[p["name"]] = p["default"]
        missing = [p["name"] for p in inputs if p["name"] not in values]
        if missing:
            raise TypeError(f"{self.name}() is missing {', '.join(missing)}")
        sizes: dict[str, int] = {}
        arrays: dict[str, Any] = {}
        for p in inputs:
            if p["kind"] == "tensor":
                arrays[p["name"]] = self._tensor(p, values[p["name"]], sizes)
            else:
                values[p["name"]] = self._scalar(p, values[p["name"]])
        for p in inputs:  # an int parameter gives the size of its name (E // heads)
            if p["kind"] == "scalar" and p["type"] == "int":
                sizes.setdefault(p["name"], values[p["name"]])
        self._check_guards(sizes, values)
        results = []
        copies = []  # the results whose out lies over an input: computed, then copied
        for i, (p, given) in enumerate(zip(self._results, self._outs(out), strict=True)):
            target = given
            if given is not None:
                checked = self._tensor(p, given, dict(sizes))
                if self._overlaps(p, given, values):
                    copies.append((i, given))
                    target = None
            if target is None:
                shape = tuple(evaluate(d, sizes, p["name"]) for d in p["dims"])
                target = self._allocate(_bytes(p, shape), self._dtypes[p["name"]], arrays)
                checked = self._tensor(p, target, dict(sizes))
            source = self._updates.get(p["name"])
            if source is not None:
                memory = self._extent(source, values[source["name"]])
                if self._extent(p, target) != memory:  # not the input's own array
                    self._copy(p, values[source["name"]], target)
                    checked = self._tensor(p, target, dict(sizes))  # seen after the copy
            arrays[p["name"]] = checked
            results.append(target)
        self._run(arrays, values, sizes)
        for i, given in copies:  # as numpy's out= over an input: the result, then the copy
            self._copy(self._results[i], results[i], given)
            results[i] = given
        if len(results) > 1:
            return tuple(results)
        return results[0] if results else None

    def _outs(self, out: Any) -> list[Any]:
        """The caller's result arrays, one per result (None where none is given). Two
        results in one array would leave one of them overwritten, so that is refused."""
        count = len(self._results)
        if count == 0:
            if out is not None:
                raise TypeError(f"{self.name}() returns nothing; it takes no 'out'")
            return []
        if count == 1:
            return [out]
        if out is None:
            return [None] * count
        if not isinstance(out, (tuple, list)) or len(out) != count:
            raise TypeError(
                f"{self.name}() returns {count} results; 'out' is a tuple of {count} arrays "
                "(None where one is allocated)"
            )
        given = [o for o in out if o is not None]
        if len({id(o) for o in given}) != len(given):
            raise ValueError(f"{self.name}(): 'out' holds the same array for two results")
        return list(out)

    def _run(
        self, arrays: Mapping[str, Any], values: Mapping[str, Any], sizes: Mapping[str, int]
    ) -> None:
        """Run the function: tensors (the result included) by name, as ``_argument``
        gives them, every argument by name, and the value of every size symbol."""
        raise NotImplementedError

    def _tensor(self, p: Mapping[str, Any], value: Any, sizes: dict[str, int]) -> Any:
        """Check one tensor argument, binding the size symbols its dims give; what the
        backend's ``_run`` receives for it."""
        name = p["name"]
        view = self._view(p, value)
        want = self._dtypes[name]
        if not self._takes(want, view):
            raise TypeError(
                f"{self.name}(): '{name}' is {view.type_name}, the kernel takes {p['dtype']} "
                f"(numpy {want.name})"
            )
        if len(view.shape) != len(p["dims"]):
            raise ValueError(
                f"{self.name}(): '{name}' has shape {view.shape}, the kernel takes "
                f"[{', '.join(p['dims'])}]"
            )
        if not view.contiguous:
            raise ValueError(f"{self.name}(): '{name}' must be C-contiguous ({self._contiguous})")
        if p["io"] != "in" and view.readonly:
            written = "the result" if p["io"] == "out" else "updated in place"
            raise ValueError(f"{self.name}(): '{name}' is {written} but is read-only")
        dims = self._shapes[name]
        shape = _elements(p, view.shape)
        binding = set()  # the positions whose size gives a symbol its value
        for i, (dim, size) in enumerate(zip(dims, shape, strict=True)):
            if dim.symbol is not None and dim.symbol not in sizes:
                sizes[dim.symbol] = size
                binding.add(i)
        for i, (text, dim, size) in enumerate(zip(p["dims"], dims, shape, strict=True)):
            want_size = size if i in binding else evaluate(text, sizes, name)
            if want_size != size:
                last = p["dtype"] == "i4" and i == len(shape) - 1
                packed = " elements, two to a byte" if last else ""
                raise ValueError(
                    f"{self.name}(): '{name}' has shape {view.shape}: dim {text} should be "
                    f"{want_size}{packed} ({_bindings(dim, sizes)})"
                )
        return self._argument(value, view)

    def _scalar(self, p: Mapping[str, Any], value: Any) -> bool | int | float:
        """A scalar argument as the Python number of its declared type. A value of
        another kind is refused, naming the parameter, rather than cut to fit (2.5
        passed for an int)."""
        kind = p["type"]
        if kind == "int" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        if kind == "float" and isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        if kind == "bool" and isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise TypeError(f"{self.name}(): '{p['name']}' is {kind}, given {value!r}")

    def _kernel_scalars(self, values: Mapping[str, Any]) -> dict[str, np.generic]:
        """The scalar arguments as a GPU kernel declares them (float, int64_t, and bool
        as a 32-bit int): sized NumPy scalars, which kernel launchers pass by value."""
        return {p["name"]: _KERNEL_SCALARS[p["type"]](values[p["name"]])
                for p in self._params if p["kind"] == "scalar"}  # fmt: skip

    def _buffer_bytes(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """The bytes of each intermediate buffer a device backend allocates (at least
        one: an allocator may refuse zero)."""
        return {b["name"]: max(1, evaluate(b["bytes"], sizes, b["name"]))
                for b in self.meta["buffers"]}  # fmt: skip

    @staticmethod
    def _programs(launch: Mapping[str, Any], sizes: Mapping[str, int]) -> list[int]:
        """How many programs a launch runs along each grid axis: the extent in blocks,
        rounded up (0 along an axis of an empty tensor)."""
        return [-(-evaluate(g["extent"], sizes, "grid") // g["block"]) for g in launch["grid"]]

    def _view(self, p: Mapping[str, Any], value: Any) -> TensorView:
        """What the checks need to know of a tensor argument. The host backends take
        any tensor in host memory, where it lies: a numpy array, or an object with
        ``__dlpack__`` or the buffer protocol (a CPU torch tensor); a device backend
        takes its own tensors instead."""
        if isinstance(value, np.ndarray):
            return numpy_view(value)
        try:
            return host_view(value)
        except TypeError as exc:
            raise TypeError(
                f"{self.name}(): '{p['name']}' must be an array of {p['dtype']} in host "
                f"memory (numpy, or with __dlpack__ or the buffer protocol): {exc}"
            ) from None

    def _takes(self, want: np.dtype, view: TensorView) -> bool:
        """Whether a tensor of ``view``'s dtype may stand for one of ``want``."""
        return view.dtype == want

    def _argument(self, value: Any, view: TensorView) -> Any:
        """What ``_run`` receives for a checked tensor: here a numpy array over its
        memory (the array itself, for a numpy array)."""
        return value if isinstance(value, np.ndarray) else host_array(view)

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype, arrays: Mapping[str, Any]) -> Any:
        """The result's storage, when the caller gives no ``out``; ``arrays`` are the
        checked inputs, for a backend that allocates where they lie."""
        return np.empty(shape, dtype=dtype)

    def _overlaps(self, p: Mapping[str, Any], given: Any, values: Mapping[str, Any]) -> bool:
        """Whether the caller's ``out`` for the result ``p`` lies over the memory of a
        tensor argument: kernels that write it while they still read the input (a
        product, a reduction) would give a wrong result."""
        start, end = self._extent(p, given)
        for q in self._inputs:
            if q["kind"] == "tensor":
                first, last = self._extent(q, values[q["name"]])
                if self._donated.get(p["name"]) == q["name"] and (first, last) == (start, end):
                    continue  # the kernel reads each element before it writes it
                if start < last and first < end:
                    return True
        return False

    def _extent(self, p: Mapping[str, Any], value: Any) -> tuple[int, int]:
        """The addresses a checked tensor argument spans (a device's and the host's
        never meet: the device kind is part of the address)."""
        view = self._view(p, value)
        start = (view.device_type << 64) + view.address
        return start, start + math.prod(view.shape) * self._dtypes[p["name"]].itemsize

    def _copy(self, p: Mapping[str, Any], source: Any, target: Any) -> None:
        """Copy into the result ``p``'s ``target``: the result computed apart, where the
        caller's ``out`` lay over an input, or the input the result updates
        (``_updates``), where the result is not that input's own memory."""
        into = target if isinstance(target, np.ndarray) else host_array(self._view(p, target))
        np.copyto(into, source)

    def _check_guards(self, sizes: Mapping[str, int], values: Mapping[str, Any]) -> None:
        for g in self.meta["guards"]:
            left = evaluate(g["left"], sizes, "guard")
            right = evaluate(g["right"], sizes, "guard")
            if g["kind"] == "indices" and g["tensor"] in self._lengths:
                self._check_lengths(g, values[g["tensor"]], left, right, sizes)
                continue
            if g["kind"] == "indices":
                self._check_indices(g, values[g["tensor"]], left, right)
                continue
            ok = {"equal": left == right, "divisible": right != 0 and left % right == 0,
                  "at_most": left <= right, "at_least": left >= right}[g["kind"]]  # fmt: skip
            if not ok:
                relation = {"equal": "==", "at_most": "<=", "at_least": ">="}
                # A size on the right has its value shown too: H % G == 0 with G = 4.
                value = "" if g["right"].isdigit() else f"{g['right']} = {right}"
                if g["kind"] == "divisible":
                    broken = f"{g['left']} % {g['right']} == 0" + (f" with {value}" * bool(value))
                else:
                    broken = f"{g['left']} {relation[g['kind']]} {value or g['right']}"
                raise ValueError(
                    f"{self.name}(): {g['left']} = {left} breaks {broken} ({g['reason']})"
                )

    def _check_lengths(
        self, g: Mapping[str, Any], lengths: Any, low: int, bound: int, sizes: Mapping[str, int]
    ) -> None:
        """A cache's lengths are in ``[low, bound)``, before any launch, so that nothing
        is written when they are not: the appends into a cache without a rolling window
        fit (each row's length is below ``S_max`` less the positions appended, plus one),
        and the rows that ``flash_attention`` attends to hold what it reads (the guard's
        reason says what)."""
        extremes = _extremes(lengths)
        if extremes is None or (low <= extremes[0] and extremes[1] < bound):
            return
        cache = self._lengths[g["tensor"]]
        if not g["reason"].startswith("KVCache.append"):
            values = np.asarray(lengths)
            row = int(np.argmax((values < low) | (values >= bound)))
            raise ValueError(f"{self.name}(): row {row} of '{cache['name']}' holds "
                             f"{int(values[row])} positions: {g['reason']}")  # fmt: skip
        top = evaluate(cache["s_max"], sizes, "S_max")
        row = int(np.argmax(np.asarray(lengths) >= bound))
        raise ValueError(
            f"{self.name}(): row {row} of '{cache['name']}' holds {int(lengths[row])} of "
            f"S_max = {top} positions; {top + 1 - bound} more do not fit (declare "
            "@rolling_window(W) to keep the last positions instead)"
        )

    def _check_indices(self, g: Mapping[str, Any], array: Any, low: int, bound: int) -> None:
        """An index tensor's values are in ``[low, bound)``: a gather's kernel would
        clamp a wrong one, and give a wrong answer without a word."""
        extremes = _extremes(array)
        if extremes is None:
            return
        smallest, largest = extremes
        if low <= smallest and largest < bound:
            return
        bad = smallest if smallest < low else largest
        shown = g["right"] if g["right"].isdigit() else f"{g['right']} = {bound}"
        raise ValueError(
            f"{self.name}(): '{g['tensor']}' holds the index {bad}, outside [{g['left']}, "
            f"{shown}) ({g['reason']})"
        )


def _extremes(array: Any) -> tuple[int, int] | None:
    """The smallest and largest element of a checked tensor argument, reduced where it
    lies (numpy's, cupy's and torch's ``min`` and ``max``: two numbers come back from a
    GPU, not the tensor); None for an empty one."""
    numel = getattr(array, "numel", None)
    if (numel() if callable(numel) else array.size) == 0:
        return None
    return int(array.min()), int(array.max())


class Library:
    """A loaded module: one attribute per function of the ``.tsr`` file, named as there."""

    def __init__(self, meta: Mapping[str, Any], entries: list[Entry]) -> None:
        self.meta = meta
        self.functions = {e.name: e for e in entries}
        # Each function as an instance attribute too, where no attribute of the library's
        # has its name: ``lib.f`` is then found without a call of ``__getattr__``.
        for name, entry in self.functions.items():
            if name not in self.__dict__ and not hasattr(type(self), name):
                setattr(self, name, entry)

    def __getattr__(self, name: str) -> Any:
        functions = self.__dict__.get("functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"no function '{name}' (the file defines: {', '.join(functions)})")

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self.functions]

    def __repr__(self) -> str:
        """The file, the target and the functions, in a line."""
        meta = self.meta
        where = f"{meta.get('source')} for {meta.get('target')} {meta.get('arch')}"
        return f"<{type(self).__name__} of {where}: {', '.join(self.functions)}>"


def evaluate(text: str, sizes: Mapping[str, int], where: str) -> int:
    """The value of a size expression (a dim as the metadata writes it) at ``sizes``.
    Most dims are a size by its name or a number, which a call checks without parsing."""
    size = sizes.get(text)
    if size is not None:
        return size
    if text.isdigit():
        return int(text)
    dim = parse_dim(text)
    missing = sorted(dim.symbols() - set(sizes))
    if missing:
        raise ValueError(f"the size {', '.join(missing)} of '{where}' is given by no argument")
    value = dim.value(sizes)
    if value.denominator != 1:
        raise ValueError(f"'{where}': {text} is not a whole number with {dict(sizes)}")
    return int(value)


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


def _elements(p: Mapping[str, Any], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape in elements of a tensor argument whose array has ``shape``: an i4
    tensor's array holds two elements in each byte of its last dim."""
    if p["dtype"] != "i4" or not shape:
        return shape
    return (*shape[:-1], 2 * shape[-1])


def _bytes(p: Mapping[str, Any], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The array shape of a result of ``shape`` elements (``_elements``'s inverse)."""
    if p["dtype"] != "i4" or not shape:
        return shape
    return (*shape[:-1], shape[-1] // 2)
