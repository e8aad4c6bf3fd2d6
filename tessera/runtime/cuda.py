"""Run the CUDA backend's output through CuPy.

``load(source, meta)`` compiles the file with NVRTC (CuPy's ``RawModule``) for the
GPU in use and returns an object with one callable per function of the ``.tsr``
file, as ``tessera.runtime.cpu`` does: the same argument checks, the same result. A
GPU that cannot run the file's arch is refused first, in one line.

A call takes either numpy arrays or tensors on the GPU, not a mix:

- numpy arrays are copied to the GPU, and what the kernels wrote is copied back, so
  that the call reads as the CPU runtime's does (the result is a numpy array);
- GPU tensors (torch tensors, cupy arrays, anything with ``__dlpack__`` or
  ``__cuda_array_interface__``) are used where they lie, and the result is allocated
  beside them: a torch tensor for torch inputs, else a cupy array. CuPy has no bf16 or
  fp8 dtype, so cupy arrays of those carry their bits as uint16 and uint8.

The launches run in order on CuPy's current stream, with the grid, threads and
dynamic shared memory the metadata gives (raising a kernel's limit above the default
48 KiB where a launch needs more); DLPack producers order their pending work on an
argument before that stream's. Without CuPy or without a GPU, ``load`` says which, in
one line.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..frozen import frozen
from ..transpiler.check.bounds import FAULT, FAULT_BYTES
from ..transpiler.graph.dtypes import ENTRY_DTYPES
from ..transpiler.tile.interpret import numpy_dtype
from . import cuda_launch, tensor_map
from .entry import MISSED, Entry, Library, argument, evaluate
from .foreign import BIT_CARRIERS, DeviceKind, TensorView, describe
from .plan import fast_path
from .sentinel import check_finite, raise_fault
from .telemetry import copying, launched

__all__ = ["CudaLibrary", "CudaFunction", "CudaUnavailable", "load", "check_arch"]

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


@functools.cache
def _driver() -> Any:
    """The CUDA driver, which encodes the TMA tensor maps of sm_90a kernels."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise CudaUnavailable(
            "cannot encode TMA tensor maps: no CUDA driver (libcuda.so.1)"
        ) from None


@frozen
class _OnDevice:
    """A GPU tensor argument: the caller's object (kept alive for the call) and where
    its elements lie."""

    value: Any
    view: TensorView


class CudaFunction(Entry):
    """One function: its launches, on the current device."""

    _contiguous = "np.ascontiguousarray, torch's .contiguous(), cupy.ascontiguousarray"
    _fills_updates = True

    def __init__(
        self,
        module: Any,
        meta: Mapping[str, Any],
        top: Mapping[str, Any] | None = None,
        bounds: Sequence[Any] = (),
    ) -> None:
        """``meta`` is the function's metadata, ``top`` the module's (for the metrics),
        ``bounds`` a debug build's bounds checks."""
        super().__init__(meta)
        self._module = top or {}
        self._bounds = bounds
        self._kernels = {}
        for launch in meta["launches"]:
            kernel = module.get_function(launch["kernel"])
            # the opt-in is needed where the static and dynamic bytes together pass 48 KiB
            if launch["dynamic_smem"] + launch.get("static_smem", 0) > _DEFAULT_SMEM:
                kernel.max_dynamic_shared_size_bytes = launch["dynamic_smem"]
            self._kernels[launch["kernel"]] = kernel
        # A persistent launch runs a program per multiprocessor, each looping over tiles.
        persistent = any(launch.get("persistent") for launch in meta["launches"])
        self._units = multiprocessors() if persistent else 0
        # A debug build's launches are checked one by one, on the full path.
        debug = any(b["name"] == FAULT for b in meta["buffers"]) or any(
            "sentinel" in launch for launch in meta["launches"]
        )
        self._launches = None if debug else _raw_launches(meta, self._kernels, self._units)
        if self._launches is not None:
            self._device = _cupy().cuda.Device().id
            self._first_tensor = next(
                (i for i, p in enumerate(self._inputs) if p["kind"] == "tensor"), None
            )
            #: The fast path for each type of first tensor seen (None: there is none).
            self._paths: dict[type, Any] = {}
            self._fast = self._dispatch
            self._fast_takes_out = True

    def _dispatch(self, *args: Any, out: Any = None) -> Any:
        """The fast path for the library of the call's first tensor
        (``tessera.runtime.cuda_launch``), made the first time that library is seen."""
        if self._first_tensor is None or len(args) <= self._first_tensor:
            return MISSED
        kind = type(args[self._first_tensor])
        if kind not in self._paths:
            self._paths[kind] = self._path_for(kind)
        fast = self._paths[kind]
        return MISSED if fast is None else fast(*args, out=out)

    def _path_for(self, kind: type) -> Any:
        assert self._launches is not None
        cupy, launches = _cupy(), self._launches
        if kind.__module__.split(".")[0] == "torch" and kind.__name__ == "Tensor":
            import torch

            backend = cuda_launch.torch_backend(torch, self._device, launches)
        elif kind is cupy.ndarray and kind.__module__.split(".")[0] == "cupy":
            backend = cuda_launch.cupy_backend(cupy, self._device, launches)
        elif hasattr(kind, "__cuda_array_interface__") and not hasattr(kind, "__dlpack__"):
            backend = cuda_launch.interface_backend(kind, cupy, launches)
        else:
            return None
        return fast_path(self.meta, backend, _dtype, self._check_guards, MISSED)

    def _view(self, p: Mapping[str, Any], value: Any) -> TensorView:
        if isinstance(value, np.ndarray):
            return super()._view(p, value)
        name = p["name"]
        try:
            view = describe(value, stream=_cupy().cuda.get_current_stream().ptr or 1)
        except TypeError:
            raise TypeError(
                f"{self.name}(): '{name}' is a {type(value).__name__}: the kernel takes a "
                f"numpy array or a GPU tensor of {p['dtype']}"
            ) from None
        if view.device_type != DeviceKind.CUDA:
            raise TypeError(
                f"{self.name}(): '{name}' lies in {view.device} memory: pass a GPU "
                "tensor, or a numpy array to have it copied"
            )
        here = _cupy().cuda.Device().id
        if view.device_id not in (-1, here):
            raise ValueError(
                f"{self.name}(): '{name}' is on {view.device}; the module runs on CUDA:{here}"
            )
        return view

    def _takes(self, want: np.dtype, view: TensorView) -> bool:
        """A GPU tensor may carry a bf16 or fp8 tensor's bits (CuPy has neither dtype)."""
        carrier = view.device_type == DeviceKind.CUDA and view.dtype == BIT_CARRIERS.get(want)
        return super()._takes(want, view) or carrier

    def _argument(self, value: Any, view: TensorView) -> Any:
        return value if isinstance(value, np.ndarray) else _OnDevice(value, view)

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype, arrays: Mapping[str, Any]) -> Any:
        """Beside the inputs: a torch tensor on their device if they are torch
        tensors, a cupy array if they are other GPU tensors, else a numpy array."""
        like = next((a.value for a in arrays.values() if isinstance(a, _OnDevice)), None)
        if like is None:
            return super()._allocate(shape, dtype, arrays)
        if type(like).__module__.split(".")[0] == "torch":
            import torch

            return torch.empty(shape, dtype=getattr(torch, dtype.name), device=like.device)
        return _cupy().empty(shape, dtype=BIT_CARRIERS.get(dtype, dtype))

    def _copy(self, p: Mapping[str, Any], source: Any, target: Any) -> None:
        """A GPU tensor is copied on the device, from a tensor of its own library (the
        result computed apart, ``_allocate``'s; the input a result updates)."""
        if isinstance(target, np.ndarray) and isinstance(source, np.ndarray):
            super()._copy(p, source, target)
        elif type(source) is type(target):
            target[...] = source
        else:
            raise TypeError(
                f"{self.name}(): '{p['name']}' is a {type(target).__name__} and the inputs "
                f"{type(source).__name__}s: pass an 'out' of the inputs' kind"
            )

    def _run(
        self, arrays: Mapping[str, Any], values: Mapping[str, Any], sizes: Mapping[str, int]
    ) -> None:
        cupy = _cupy()
        on_device = {name: a for name, a in arrays.items() if isinstance(a, _OnDevice)}
        if on_device and len(on_device) < len(arrays):
            host = next(name for name in arrays if name not in on_device)
            raise TypeError(
                f"{self.name}(): '{host}' is a numpy array and '{next(iter(on_device))}' a "
                "GPU tensor: pass every tensor on the GPU, or every one as a numpy array"
            )
        if on_device:
            device = {name: np.uint64(a.view.address) for name, a in on_device.items()}
            for a in on_device.values():
                if a.view.producer_stream is not None:
                    cupy.cuda.ExternalStream(a.view.producer_stream).synchronize()
        else:
            with copying(self.name):
                # an array passed for two names (a donated state's tensor, its own
                # result) travels once: the kernels see one array, as on the device
                copies: dict[int, Any] = {}
                for a in arrays.values():
                    if id(a) not in copies:
                        copies[id(a)] = cupy.asarray(_bytes(a))
                device = {name: copies[id(a)] for name, a in arrays.items()}
        for name, size in self._buffer_bytes(sizes).items():
            device[name] = cupy.empty(size, dtype=cupy.uint8)
        if FAULT in device:  # a debug build's fault record starts empty
            device[FAULT] = cupy.asarray(np.zeros(FAULT_BYTES, np.uint8))
        scalars = self._kernel_scalars(values)
        for launch in self.meta["launches"]:
            grid = self._programs(launch, sizes)
            if 0 in grid:
                continue  # an empty tensor: no program to run
            if launch.get("persistent"):
                grid = [min(math.prod(grid), self._units)]
            for m in launch.get("tensor_maps", ()):
                device[m["name"]] = _tensor_map(m, device[m["tensor"]], sizes)
            args = tuple(argument(a, device, scalars, sizes) for a in launch["args"])
            grid += [1] * (3 - len(grid))
            launched(self._module, self.name, launch["kernel"], (launch["kernel"],), sizes,
                     _synchronize, self._kernels[launch["kernel"]],
                     tuple(grid), (launch["threads"], 1, 1), args,
                     shared_mem=launch["dynamic_smem"])  # fmt: skip
            if FAULT in launch["args"]:
                record = device[FAULT].get().view(np.int64)
                raise_fault(self._bounds, [record[0] - 1, *record[1:]])
            if "sentinel" in launch:
                self._check(launch, device, on_device)
        if on_device:
            return
        with copying(self.name):
            for p in self._params:
                if p["kind"] == "tensor" and p["io"] != "in":
                    device[p["name"]].get(out=_bytes(arrays[p["name"]]))

    def _check(
        self, launch: Mapping[str, Any], device: Mapping[str, Any], on_device: Mapping[str, Any]
    ) -> None:
        """A debug build's sentinel: what the launch wrote, copied back and checked."""
        cupy = _cupy()
        for write in launch["sentinel"]["writes"]:
            name = write["name"]
            if name in on_device:
                view = on_device[name].view
                nbytes = math.prod(view.shape) * ENTRY_DTYPES[write["dtype"]].bits // 8
                memory = cupy.cuda.UnownedMemory(view.address, nbytes, None)
                data = cupy.ndarray(nbytes, cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))
            else:
                data = device[name]
            check_finite(launch, name, data.get())


def _raw_launches(meta: Mapping[str, Any], kernels: Mapping[str, Any], units: int) -> Any:
    """The function's launches through ``cuLaunchKernel`` (a persistent launch runs at
    most ``units`` programs), or None where the kernels or the driver do not offer it
    (then every call takes CuPy's launches)."""
    # CuPy's RawKernel.kernel is the loaded function of the current device (a CUfunction
    # at .ptr).
    handles = {name: getattr(getattr(k, "kernel", None), "ptr", None)
               for name, k in kernels.items()}  # fmt: skip
    if not all(isinstance(h, int) for h in handles.values()):
        return None
    try:
        driver = _driver()
    except CudaUnavailable:
        return None
    if not hasattr(driver, "cuLaunchKernel"):
        return None
    return cuda_launch.Launches(meta, handles, driver, units)


def _synchronize() -> None:
    """Wait for the work on CuPy's current stream (a timed launch's end)."""
    _cupy().cuda.get_current_stream().synchronize()


def _dtype(name: str) -> np.dtype:
    """The numpy dtype of a Tessera dtype, by its name."""
    return np.dtype(numpy_dtype(ENTRY_DTYPES[name]))


def _tensor_map(m: Mapping[str, Any], x: Any, sizes: Mapping[str, int]) -> np.ndarray:
    """The tensor map ``m`` of the metadata, for the tensor ``x`` (a device array, or the
    address of a GPU tensor's first element)."""
    address = int(x) if isinstance(x, np.integer) else x.__cuda_array_interface__["data"][0]
    dims = [evaluate(d, sizes, m["tensor"]) for d in m["dims"]]
    element_bytes = ENTRY_DTYPES[m["dtype"]].bits // 8
    return tensor_map.encode(_driver(), address, element_bytes, dims, m["box"])


def _bytes(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array's bytes, as a flat uint8 view: how it travels to and from the
    GPU whatever its dtype (CuPy has no bf16 or fp8)."""
    return a.reshape(-1).view(np.uint8)


class CudaLibrary(Library):
    """The compiled module: one attribute per function of the ``.tsr`` file."""

    def __init__(self, source: str, meta: Mapping[str, Any]) -> None:
        cupy = _cupy()
        check_arch(meta["arch"], cupy.cuda.Device().compute_capability)
        module = cupy.RawModule(
            code=source, options=tuple(meta["build"]["options"]), backend="nvrtc"
        )
        bounds = meta.get("bounds", ())
        super().__init__(meta, [CudaFunction(module, f, meta, bounds) for f in meta["functions"]])


def multiprocessors() -> int:
    """The current GPU's multiprocessors: a persistent launch's programs."""
    return int(_cupy().cuda.Device().attributes["MultiProcessorCount"])


def load(source: str, meta: Mapping[str, Any]) -> CudaLibrary:
    """Compile a CUDA module from its source and metadata, for the current GPU. A
    function with collectives is refused: its NCCL host code needs nvcc, not NVRTC."""
    for f in meta["functions"]:
        if f.get("collectives"):
            raise RuntimeError(
                f"{f['name']}() runs collectives, which the CuPy runtime does not call yet: "
                "build the file with nvcc against NCCL and call its tessera_"
                f"{f['name']}_<launch> functions between the launches "
                "(docs/distributed.md), or compile it for the cpu target and run it on MPI"
            )
    return CudaLibrary(source, meta)


def check_arch(arch: str, capability: str) -> None:
    """Refuse, in one line, a GPU of compute ``capability`` (``"90"``) that cannot run a
    file generated for ``arch``: one for an arch-specific target (``sm_90a``: wgmma,
    setmaxnreg) runs on that GPU alone, one for a generic arch on it and newer ones."""
    number = arch.removeprefix("sm_")
    generic = number.rstrip("a")
    if capability == generic or (number == generic and int(capability) > int(generic)):
        return
    needs = f"a GPU of compute capability {generic[:-1]}.{generic[-1]}"
    if number == generic:
        needs += " or newer"
    hint = " (compile with --arch sm_80)" if int(capability) >= 80 else ""
    raise CudaUnavailable(
        f"this module is built for {arch} and needs {needs}; this GPU is sm_{capability}{hint}"
    )
