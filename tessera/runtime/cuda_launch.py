"""The CUDA launch path of the common call: raw pointers, prepared parameters,
``cuLaunchKernel``.

A call through CuPy's ``RawKernel`` costs the host tens of microseconds per launch,
and reading a torch tensor through ``__dlpack__`` as many again per tensor. A call
whose every input is a contiguous GPU tensor of one library (torch, CuPy, or an object
with ``__cuda_array_interface__`` and no stream of its own) needs neither: the fast
path (``tessera.runtime.plan``) checks it and takes each tensor's address
(``data_ptr()``, ``data.ptr``), and a ``Launches`` writes the addresses, scalars and
sizes into parameter blocks prepared once per launch, in the layout the driver reads
(one address per kernel parameter), and launches every kernel of the function in
order with ``cuLaunchKernel``.

The launches run on the current stream of the tensors' library (torch's for torch
tensors, CuPy's otherwise), so that they follow the work that produced the inputs and
precede the work that reads the results, without a synchronization. The results, and
the intermediate buffers, come from that library's allocator, which orders reuse by
the same stream.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..transpiler.graph.dtypes import ENTRY_DTYPES
from . import tensor_map
from .entry import evaluate
from .foreign import BIT_CARRIERS
from .plan import Backend

__all__ = ["Launches", "torch_backend", "cupy_backend", "interface_backend"]

#: Buffers start on 256 bytes within the workspace, as cudaMalloc's do.
_ALIGN = 256

_C_SCALARS = {"float": ctypes.c_float, "int": ctypes.c_int64, "bool": ctypes.c_int32}


class _Launch:
    """One kernel launch of a function, its parameter block prepared: a ctypes slot per
    kernel parameter, and the array of their addresses that ``cuLaunchKernel`` reads."""

    def __init__(
        self, handle: int, launch: Mapping[str, Any], where: Mapping[str, tuple[str, int]],
        scalars: Mapping[str, str],
    ) -> None:  # fmt: skip
        self.handle = handle
        self.threads = launch["threads"]
        self.smem = launch["dynamic_smem"]
        self.grid = [(g["extent"], g["block"]) for g in launch["grid"]]
        self.persistent = bool(launch.get("persistent"))
        self.maps = list(launch.get("tensor_maps", ()))
        map_names = {m["name"] for m in self.maps}
        self.slots: list[Any] = []
        #: (slot, where its value comes from: "value" and a call value's index, or
        #: "buffer" and a buffer's index).
        self.fills: list[tuple[Any, str, int]] = []
        self.map_slots: dict[str, Any] = {}
        for name in launch["args"]:
            if name in map_names:
                slot = (ctypes.c_uint8 * 128)()
                self.map_slots[name] = slot
            else:
                kind, index = where[name]
                c_type = _C_SCALARS[scalars[name]] if name in scalars else ctypes.c_uint64
                slot = ctypes.c_int64() if kind == "size" else c_type()
                self.fills.append((slot, "buffer" if kind == "buffer" else "value", index))
            self.slots.append(slot)
        self.params = (ctypes.c_void_p * max(1, len(self.slots)))(
            *(ctypes.addressof(s) for s in self.slots)
        )
        #: What each tensor map was last encoded for: (address, dims).
        self.encoded: dict[str, tuple[int, tuple[int, ...]]] = {}


class Launches:
    """Every launch of one function, run from the values of a call: the tensors'
    addresses and the scalars in parameter order, then the sizes in the metadata's
    order (what the fast path hands on). ``handles`` are the kernels' CUfunctions; a
    persistent launch runs at most ``units`` programs (the GPU's multiprocessors), each
    looping over the tiles."""

    def __init__(
        self, meta: Mapping[str, Any], handles: Mapping[str, int], driver: Any, units: int = 0
    ) -> None:
        params = meta["params"]
        where: dict[str, tuple[str, int]] = {p["name"]: ("value", i) for i, p in enumerate(params)}
        where.update({d: ("size", len(params) + i) for i, d in enumerate(meta["dims"])})
        where.update({b["name"]: ("buffer", i) for i, b in enumerate(meta["buffers"])})
        scalars = {p["name"]: p["type"] for p in params if p["kind"] == "scalar"}
        self._symbols = list(meta["dims"])
        self._first_size = len(params)
        self._tensors = {p["name"]: i for i, p in enumerate(params) if p["kind"] == "tensor"}
        self._buffers = [b["bytes"] for b in meta["buffers"]]
        self._buffer_index = {b["name"]: i for i, b in enumerate(meta["buffers"])}
        self._launch = driver.cuLaunchKernel
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
        self._driver = driver
        self._units = units
        self._launches = [_Launch(handles[launch["kernel"]], launch, where, scalars)
                          for launch in meta["launches"]]  # fmt: skip
        # Two threads must not fill one parameter block at once: the driver reads it
        # during the call, which ctypes makes without the GIL.
        self._lock = threading.Lock()

    def run(self, stream: int, values: Sequence[Any], scratch: Callable[[int], Any]) -> Any:
        """Launch every kernel on ``stream``; ``scratch(bytes)`` allocates the workspace
        (a tensor of the caller's library, whose address ``address`` gives). Returns the
        workspace, which the caller keeps until the launches are enqueued."""
        sizes = values[self._first_size :]
        named = None
        workspace, buffers = None, []
        if self._buffers:
            named = dict(zip(self._symbols, sizes, strict=True))
            lengths = [max(1, evaluate(b, named, "buffer")) for b in self._buffers]
            workspace, base = scratch(sum(-(-n // _ALIGN) * _ALIGN for n in lengths))
            for n in lengths:
                buffers.append(base)
                base += -(-n // _ALIGN) * _ALIGN
        with self._lock:
            for launch in self._launches:
                grid = []
                for extent, block in launch.grid:
                    size = _size(extent, self._symbols, sizes)
                    if size is None:
                        named = named or dict(zip(self._symbols, sizes, strict=True))
                        size = evaluate(extent, named, "grid")
                    grid.append(-(-size // block))
                if 0 in grid:
                    continue  # an empty tensor: no program to run
                if launch.persistent:
                    grid = [min(math.prod(grid), self._units)]
                grid += [1] * (3 - len(grid))
                for slot, kind, index in launch.fills:
                    slot.value = values[index] if kind == "value" else buffers[index]
                if launch.maps:
                    named = named or dict(zip(self._symbols, sizes, strict=True))
                    self._encode(launch, values, buffers, named)
                status = self._launch(launch.handle, *grid, launch.threads, 1, 1, launch.smem,
                                      stream, launch.params, None)  # fmt: skip
                if status != 0:
                    raise RuntimeError(f"cuLaunchKernel failed (CUresult {status})")
        return workspace

    def _encode(
        self, launch: _Launch, values: Sequence[Any], buffers: Sequence[int],
        named: Mapping[str, int],
    ) -> None:  # fmt: skip
        """Write each tensor map of ``launch`` (of a tensor argument or an intermediate
        buffer), unless it describes what it did last time."""
        for m in launch.maps:
            tensor = m["tensor"]
            if tensor in self._tensors:
                address = values[self._tensors[tensor]]
            else:
                address = buffers[self._buffer_index[tensor]]
            dims = tuple(evaluate(d, named, tensor) for d in m["dims"])
            if launch.encoded.get(m["name"]) == (address, dims):
                continue
            element_bytes = ENTRY_DTYPES[m["dtype"]].bits // 8
            encoded = tensor_map.encode(self._driver, address, element_bytes, dims, m["box"])
            ctypes.memmove(launch.map_slots[m["name"]], encoded.ctypes.data, 128)
            launch.encoded[m["name"]] = (address, dims)


def _size(text: str, symbols: Sequence[str], sizes: Sequence[int]) -> int | None:
    """A grid extent that is a size by its name or a number; None for an expression."""
    if text.isdigit():
        return int(text)
    try:
        return sizes[symbols.index(text)]
    except ValueError:
        return None


def torch_backend(torch: Any, device: int, launches: Launches) -> Backend:
    """The fast path for torch tensors on CUDA device ``device``: launches on torch's
    current stream there, results from torch's allocator."""
    dtypes = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
              np.dtype(np.float64): torch.float64, np.dtype(np.int32): torch.int32,
              np.dtype(np.int64): torch.int64, np.dtype(np.int8): torch.int8,
              np.dtype(np.uint8): torch.uint8, np.dtype(np.bool_): torch.bool}  # fmt: skip
    for carried in BIT_CARRIERS:  # bfloat16, float8_e4m3fn, float8_e5m2: as torch names them
        if hasattr(torch, carried.name):
            dtypes[carried] = getattr(torch, carried.name)
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw_stream is not None:
        stream = lambda: raw_stream(device)  # noqa: E731
    else:
        stream = lambda: torch.cuda.current_stream(device).cuda_stream  # noqa: E731
    where = torch.device("cuda", device)

    def scratch(size: int) -> tuple[Any, int]:
        buffer = torch.empty(size, dtype=torch.uint8, device=where)
        return buffer, buffer.data_ptr()

    names = {"Tensor": torch.Tensor, "empty": torch.empty, "where": where, "run": launches.run,
             "stream": stream, "scratch": scratch}  # fmt: skip
    return Backend(
        accepts=lambda x, allowed, written: (
            f"type({x}) is Tensor and {x}.dtype in {allowed} and {x}.is_cuda "
            f"and {x}.get_device() == {device} and {x}.is_contiguous()"
        ),
        address=lambda x: f"{x}.data_ptr()",
        dtypes=lambda dtype: (dtypes[dtype],) if dtype in dtypes else (),
        allocate=lambda shape, dtype: f"empty({shape}, dtype={dtype}, device=where)",
        result_dtype=lambda dtype: dtypes.get(dtype),
        call=lambda arguments: f"run(stream(), ({arguments},), scratch)",
        names=names,
    )


def cupy_backend(cupy: Any, device: int, launches: Launches) -> Backend:
    """The fast path for CuPy arrays on device ``device``: launches on CuPy's current
    stream, results from CuPy's allocator (bf16 and fp8 as their bits)."""
    return Backend(
        accepts=lambda x, allowed, written: (
            f"type({x}) is ndarray and {x}.dtype in {allowed} and {x}.flags.c_contiguous "
            f"and {x}.data.device_id == {device}"
        ),
        address=lambda x: f"{x}.data.ptr",
        **_on_cupy(cupy, launches),
        names={"ndarray": cupy.ndarray, **_cupy_names(cupy, launches)},
    )


def interface_backend(kind: type, cupy: Any, launches: Launches) -> Backend:
    """The fast path for another library's arrays of type ``kind`` that have
    ``__cuda_array_interface__`` without a stream to wait for: launches on CuPy's
    current stream, results in CuPy arrays (as the full path allocates them)."""
    return Backend(
        accepts=lambda x, allowed, written: (
            f"type({x}) is kind and ({x}_v := view({x}, {allowed}, {written})) is not None"
        ),
        address=lambda x: f"{x}_v[0]",
        shape=lambda x: f"{x}_v[1]",
        result_address=lambda r: f"{r}.__cuda_array_interface__['data'][0]",
        **_on_cupy(cupy, launches),
        names={"kind": kind, "view": _interface_view, **_cupy_names(cupy, launches)},
    )


def _on_cupy(cupy: Any, launches: Launches) -> dict[str, Any]:
    """What the backends that allocate with CuPy and launch on its stream share."""
    return {
        "dtypes": _carried,
        "allocate": lambda shape, dtype: f"empty({shape}, dtype={dtype})",
        "result_dtype": lambda dtype: BIT_CARRIERS.get(dtype, dtype),
        "call": lambda arguments: f"run(stream(), ({arguments},), scratch)",
    }


def _cupy_names(cupy: Any, launches: Launches) -> dict[str, Any]:
    def stream() -> int:
        return cupy.cuda.get_current_stream().ptr

    def scratch(size: int) -> tuple[Any, int]:
        buffer = cupy.empty(size, dtype=cupy.uint8)
        return buffer, buffer.__cuda_array_interface__["data"][0]

    return {"empty": cupy.empty, "run": launches.run, "stream": stream, "scratch": scratch}


def _carried(dtype: np.dtype) -> tuple[np.dtype, ...]:
    """A tensor's dtype, or the unsigned integers that carry its bits."""
    return (dtype, BIT_CARRIERS[dtype]) if dtype in BIT_CARRIERS else (dtype,)


def _interface_view(
    x: Any, allowed: tuple[np.dtype, ...], written: bool
) -> tuple[int, tuple[int, ...]] | None:
    """An array's address and shape from its ``__cuda_array_interface__``, if it is one
    the fast path takes: an allowed dtype, C-contiguous, no stream to wait for."""
    interface = x.__cuda_array_interface__
    address, readonly = interface["data"]
    if interface.get("stream") is not None or (written and readonly):
        return None
    if interface.get("strides") is not None or np.dtype(interface["typestr"]) not in allowed:
        return None
    return address, tuple(interface["shape"])
