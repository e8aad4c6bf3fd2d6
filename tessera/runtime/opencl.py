"""Run the OpenCL backend's output through pyopencl: numpy arrays in, numpy arrays out.

``load(source, meta)`` builds the program for the first OpenCL device (PoCL on a
machine without a GPU; ``PYOPENCL_CTX`` picks another, as pyopencl documents)
and returns an object with one callable per function of the ``.tsr`` file, as
``tessera.runtime.cpu`` does: the same argument checks, the same result. A call
copies the tensors to the device, runs the function's launches in order with
the grid and group size the metadata gives, and copies back what they wrote.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..transpiler.check.bounds import FAULT, FAULT_BYTES
from .entry import Entry, Library, argument
from .sentinel import check_finite, raise_fault
from .telemetry import copying, launched

__all__ = ["OpenclLibrary", "OpenclFunction", "OpenclUnavailable", "load"]


class OpenclUnavailable(RuntimeError):
    """pyopencl or an OpenCL platform is missing; the message says what to install."""


@functools.cache
def _queue() -> Any:
    try:
        import pyopencl as cl
    except (ImportError, OSError):  # not installed, or no OpenCL loader to link against
        raise OpenclUnavailable(
            "running OpenCL code needs pyopencl (pip install pyopencl) and an OpenCL "
            "platform (PoCL on a CPU: apt-get install pocl-opencl-icd)"
        ) from None
    try:
        context = cl.create_some_context(interactive=False)
    except (cl.Error, RuntimeError) as exc:
        raise OpenclUnavailable(f"no OpenCL platform to run on: {exc}") from None
    return cl.CommandQueue(context)


class OpenclFunction(Entry):
    """One function: its launches, run on the library's queue."""

    _fills_updates = True

    def __init__(
        self,
        program: Any,
        queue: Any,
        meta: Mapping[str, Any],
        module: Mapping[str, Any],
        bounds: Sequence[Any] = (),
    ) -> None:
        super().__init__(meta)
        self._module = module
        self._queue = queue
        self._bounds = bounds
        self._kernels = {k["kernel"]: getattr(program, k["kernel"]) for k in meta["launches"]}

    def _run(
        self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any], sizes: Mapping[str, int]
    ) -> None:
        import pyopencl as cl

        context = self._queue.context
        with copying(self.name):
            # an array passed for two names (a donated state's tensor, its own result)
            # travels once: the kernels see one buffer, as on a GPU
            buffers: dict[int, Any] = {}
            for a in arrays.values():
                if id(a) not in buffers:
                    buffers[id(a)] = _buffer(context, a.nbytes, a)
            device = {name: buffers[id(a)] for name, a in arrays.items()}
        for name, size in self._buffer_bytes(sizes).items():
            device[name] = _buffer(context, size)
        if FAULT in device:  # a debug build's fault record starts empty
            device[FAULT] = _buffer(context, FAULT_BYTES, np.zeros(FAULT_BYTES // 8, np.int64))
        scalars = self._kernel_scalars(values)
        for launch in self.meta["launches"]:
            counts = self._programs(launch, sizes)
            if 0 in counts:
                continue  # an empty tensor: no program to run
            kernel = self._kernels[launch["kernel"]]
            kernel.set_args(*(argument(a, device, scalars, sizes) for a in launch["args"]))
            threads = launch["threads"]
            grid = (counts[0] * threads, *counts[1:])
            group = (threads,) + (1,) * (len(grid) - 1)
            launched(self._module, self.name, launch["kernel"], (launch["kernel"],), sizes,
                     self._queue.finish, cl.enqueue_nd_range_kernel, self._queue, kernel, grid,
                     group)  # fmt: skip
            if FAULT in launch["args"]:
                self._check_bounds(device[FAULT])
            if "sentinel" in launch:
                self._check(launch, device)
        with copying(self.name):
            for p in self._params:
                if p["kind"] == "tensor" and p["io"] != "in" and arrays[p["name"]].nbytes:
                    cl.enqueue_copy(self._queue, arrays[p["name"]], device[p["name"]])
            self._queue.finish()

    def _check_bounds(self, fault: Any) -> None:
        """A debug build's bounds checks: the launch's first failure, read back."""
        import pyopencl as cl

        record = np.empty(FAULT_BYTES // 8, np.int64)
        cl.enqueue_copy(self._queue, record, fault)
        raise_fault(self._bounds, [record[0] - 1, *record[1:]])

    def _check(self, launch: Mapping[str, Any], device: Mapping[str, Any]) -> None:
        """A debug build's sentinel: what the launch wrote, read back and checked."""
        import pyopencl as cl

        for write in launch["sentinel"]["writes"]:
            data = np.empty(device[write["name"]].size, np.uint8)
            cl.enqueue_copy(self._queue, data, device[write["name"]])
            check_finite(launch, write["name"], data)


def _buffer(context: Any, size: int, host: np.ndarray | None = None) -> Any:
    """A device buffer of ``size`` bytes, filled from ``host`` where given. OpenCL has no
    buffer of 0 bytes (INVALID_BUFFER_SIZE): an empty tensor gets one byte, which no
    program reads, as none reads past a tensor's end."""
    import pyopencl as cl

    flags = cl.mem_flags.READ_WRITE
    if size == 0:
        return cl.Buffer(context, flags, size=1)
    if host is None:
        return cl.Buffer(context, flags, size=size)
    return cl.Buffer(context, flags | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)


class OpenclLibrary(Library):
    """The built program: one attribute per function of the ``.tsr`` file."""

    def __init__(self, source: str, meta: Mapping[str, Any]) -> None:
        queue = _queue()
        import pyopencl as cl

        program = cl.Program(queue.context, source).build(options=meta["build"]["options"])
        bounds = meta.get("bounds", ())
        functions = [OpenclFunction(program, queue, f, meta, bounds) for f in meta["functions"]]
        super().__init__(meta, functions)


def load(source: str, meta: Mapping[str, Any]) -> OpenclLibrary:
    """Build an OpenCL module from its source and metadata, on the first device."""
    return OpenclLibrary(source, meta)
