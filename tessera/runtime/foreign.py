"""Tensors that other libraries own, described without a copy: DLPack and the CUDA
array interface.

A GPU kernel needs four facts about a tensor argument: where it lies, its shape, its
dtype and whether it is contiguous. Each array library can import the others'
tensors (``cupy.from_dlpack``, ``torch.from_dlpack``), but only into its own dtypes,
and CuPy has no bf16 or fp8. So this module reads the DLPack capsule's C struct
itself, with ctypes, and reports the dtype as a NumPy dtype (``ml_dtypes`` gives the
ones NumPy lacks). The capsule is only read, never consumed: its producer keeps the
memory, and the capsule's destructor hands the struct back when the capsule goes.
Objects that have only ``__cuda_array_interface__`` (Numba's arrays) are described
from that dictionary.
"""

from __future__ import annotations

import ctypes
import enum
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

__all__ = [
    "TensorView",
    "DeviceKind",
    "describe",
    "numpy_view",
    "host_view",
    "host_array",
    "BIT_CARRIERS",
]


class DeviceKind(enum.IntEnum):
    """DLPack's device types, the ones a message may name."""

    CPU = 1
    CUDA = 2
    CUDA_HOST = 3
    ROCM = 10
    CUDA_MANAGED = 13


#: A dtype some libraries lack, and the unsigned integer dtype of the same width
#: whose arrays may carry its bits instead (CuPy has no bf16 or fp8).
BIT_CARRIERS = {
    np.dtype(ml_dtypes.bfloat16): np.dtype(np.uint16),
    np.dtype(ml_dtypes.float8_e4m3fn): np.dtype(np.uint8),
    np.dtype(ml_dtypes.float8_e5m2): np.dtype(np.uint8),
}

#: DLPack's (type code, bits) of every dtype a kernel may take, and of the integer
#: dtypes that carry bits, as NumPy dtypes.
_DLPACK_DTYPES = {
    (0, 8): np.int8, (0, 16): np.int16, (0, 32): np.int32, (0, 64): np.int64,
    (1, 8): np.uint8, (1, 16): np.uint16, (1, 32): np.uint32, (1, 64): np.uint64,
    (2, 16): np.float16, (2, 32): np.float32, (2, 64): np.float64,
    (4, 16): ml_dtypes.bfloat16, (6, 8): np.bool_,
    (10, 8): ml_dtypes.float8_e4m3fn, (12, 8): ml_dtypes.float8_e5m2,
}  # fmt: skip
_DLPACK_CODES = {0: "int", 1: "uint", 2: "float", 3: "handle", 4: "bfloat", 5: "complex",
                 6: "bool"}  # fmt: skip
_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY of a versioned capsule


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _VersionedHead(ctypes.Structure):
    """What precedes the DLTensor in a ``dltensor_versioned`` capsule (DLPack 1.x)."""

    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
    ]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


class TensorView(NamedTuple):
    """Where a tensor lies and how: what the runtime checks an argument against.

    ``dtype`` is ``None`` when NumPy and ``ml_dtypes`` have no dtype for the tensor's,
    and ``unknown_type`` then says what it is. ``device_id`` is -1 where the producer does
    not say (the CUDA array interface: the device current when it is used).
    ``producer_stream`` is a CUDA stream whose pending work on the tensor must finish
    before a kernel reads it (the CUDA array interface's ``stream``; DLPack producers
    order that work themselves). A named tuple: a call makes one per tensor, and a frozen
    dataclass took a microsecond longer to make.
    """

    address: int
    shape: tuple[int, ...]
    contiguous: bool
    dtype: np.dtype | None
    device_type: int
    device_id: int
    readonly: bool
    producer_stream: int | None = None
    unknown_type: str = ""

    @property
    def type_name(self) -> str:
        """The element type as a message names it. Asked only for a message: NumPy
        computes a dtype's name in Python, which costs a call microseconds."""
        return self.unknown_type if self.dtype is None else self.dtype.name

    @property
    def device(self) -> str:
        """The device as a message names it: ``CUDA:0``."""
        try:
            kind = DeviceKind(self.device_type).name
        except ValueError:
            kind = f"device type {self.device_type}"
        return kind if self.device_id < 0 else f"{kind}:{self.device_id}"


def numpy_view(a: np.ndarray) -> TensorView:
    """A NumPy array's view, for the checks every runtime makes."""
    return TensorView(
        address=a.ctypes.data,
        shape=a.shape,
        contiguous=a.flags.c_contiguous,
        dtype=a.dtype,
        device_type=DeviceKind.CPU,
        device_id=0,
        readonly=not a.flags.writeable,
    )


def host_view(x: Any) -> TensorView:
    """The view of a tensor in host memory that is not a NumPy array: one with
    ``__dlpack__`` (a CPU torch tensor, a JAX array on the CPU) or the buffer protocol
    (``memoryview``, ``array.array``). Nothing is copied. Raises TypeError for an object
    that is neither, or a tensor on another device."""
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        view = describe(x)
        if view.device_type not in (DeviceKind.CPU, DeviceKind.CUDA_HOST):
            raise TypeError(f"it is on {view.device}, not in host memory")
        return view
    try:
        return numpy_view(np.asarray(memoryview(x)))
    except TypeError:
        raise TypeError(
            f"a {type(x).__name__} has neither __dlpack__ nor the buffer protocol"
        ) from None


def host_array(view: TensorView) -> np.ndarray:
    """A NumPy array over the C-contiguous host memory ``view`` describes, for the
    backends that hand arrays on (OpenCL's buffers copy from and back into it). The
    memory stays its owner's: the caller keeps the owner alive while the array is used."""
    assert view.dtype is not None and view.contiguous
    count = int(np.prod(view.shape, dtype=np.int64))
    if count == 0 or not view.address:
        return np.empty(view.shape, dtype=view.dtype)
    memory = (ctypes.c_byte * (count * view.dtype.itemsize)).from_address(view.address)
    return np.frombuffer(memory, dtype=view.dtype).reshape(view.shape)


def _c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None, unit: int = 1) -> bool:
    """Whether strides (in elements, or bytes with ``unit`` the element size; ``None``
    means C order, as both protocols say) are C order. A dim of one element may have
    any stride."""
    if strides is None:
        return True
    step = unit
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and stride != step:
            return False
        step *= size
    return True


def describe(x: Any, stream: int | None = None) -> TensorView:
    """``x``'s view, from its DLPack capsule or its CUDA array interface.

    ``stream`` is the CUDA stream the caller will use ``x`` on, as DLPack's
    ``__dlpack__`` takes it (1: the legacy default stream); the producer orders its
    pending work on ``x`` before that stream's. It is passed only to producers on a
    CUDA device. Raises TypeError for an object that has neither protocol.
    """
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        device_type, _ = x.__dlpack_device__()
        kwargs = {"stream": stream} if device_type == DeviceKind.CUDA else {}
        try:
            capsule = x.__dlpack__(max_version=(1, 1), **kwargs)
        except TypeError:  # a producer older than DLPack 1.0
            capsule = x.__dlpack__(**kwargs)
        return _read_capsule(capsule)
    if hasattr(x, "__cuda_array_interface__"):
        return _from_interface(x.__cuda_array_interface__)
    raise TypeError(f"{type(x).__name__} has neither __dlpack__ nor __cuda_array_interface__")


def _read_capsule(capsule: Any) -> TensorView:
    name = _capsule_name(capsule)
    address = _capsule_pointer(capsule, name)
    flags = 0
    if name == b"dltensor_versioned":
        head = _VersionedHead.from_address(address)
        flags = head.flags
        address += ctypes.sizeof(_VersionedHead)
    elif name != b"dltensor":
        raise TypeError(f"a DLPack capsule named {name!r}: it has been consumed already")
    t = _DLTensor.from_address(address)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    dtype = _DLPACK_DTYPES.get((code, bits)) if lanes == 1 else None
    type_name = f"{_DLPACK_CODES.get(code, f'type code {code} ')}{bits}"
    if lanes != 1:
        type_name += f"x{lanes}"
    return TensorView(
        address=(t.data or 0) + t.byte_offset,
        shape=shape,
        contiguous=_c_contiguous(shape, strides),
        dtype=None if dtype is None else np.dtype(dtype),
        unknown_type=type_name if dtype is None else "",
        device_type=t.device.device_type,
        device_id=t.device.device_id,
        readonly=bool(flags & _READ_ONLY),
    )


def _from_interface(interface: dict[str, Any]) -> TensorView:
    """A view from ``__cuda_array_interface__`` (version 2 or 3). Its strides count
    bytes; the device is the one current when the caller uses it."""
    dtype = np.dtype(interface["typestr"])
    address, readonly = interface["data"]
    shape = tuple(interface["shape"])
    strides = interface.get("strides")
    strides = None if strides is None else tuple(strides)
    return TensorView(
        address=address or 0,
        shape=shape,
        contiguous=_c_contiguous(shape, strides, dtype.itemsize),
        dtype=dtype,
        device_type=DeviceKind.CUDA,
        device_id=-1,
        readonly=bool(readonly),
        producer_stream=interface.get("stream"),
    )
