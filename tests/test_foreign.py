"""Describing tensors other libraries own (``tessera.runtime.foreign``).

The CUDA runtime hands a GPU tensor's address straight to the kernels, so the
address, shape, dtype and contiguity read from a DLPack capsule must be exact. The
capsule layout is the same on every device, so CPU tensors (numpy, torch) check the
reader here; the GPU tier runs the same path on CUDA tensors.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from tessera.runtime.foreign import BIT_CARRIERS, DeviceKind, describe, numpy_view

torch = pytest.importorskip("torch", reason="needs torch (the test extras) for its DLPack")


def test_numpy_arrays_are_described_where_they_lie() -> None:
    a = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    view = describe(a)
    assert view.address == a.ctypes.data
    assert view.shape == (5, 7)
    assert view.dtype == np.float32
    assert view.contiguous and not view.readonly
    assert (view.device_type, view.device) == (DeviceKind.CPU, "CPU:0")
    assert view == numpy_view(a)


def test_an_offset_slice_points_at_its_first_element() -> None:
    a = np.arange(40, dtype=np.float32).reshape(8, 5)
    rows = a[3:]
    view = describe(rows)
    assert view.address == a.ctypes.data + 3 * 5 * 4
    assert view.shape == (5, 5) and view.contiguous


@pytest.mark.parametrize(
    ("make", "contiguous"),
    [
        (lambda a: a.T, False),
        (lambda a: a[:, ::2], False),
        (lambda a: a[:, 1:], False),
        (lambda a: a[:, 4:5], False),
        (lambda a: a[2:3, :].T[None], True),  # (1, 6, 1): only the 6 has to be dense
        (lambda a: a[2:3], True),
    ],
    ids=[
        "transposed",
        "every-other-column",
        "columns-cut",
        "one-column",
        "row-as-column",
        "one-row",
    ],
)
def test_contiguity_follows_the_strides(make: Any, contiguous: bool) -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = make(a)
    assert describe(x).contiguous is contiguous
    assert x.flags.c_contiguous is contiguous  # numpy agrees


def test_read_only_arrays_say_so() -> None:
    a = np.ones((3, 3), dtype=np.float32)
    a.flags.writeable = False
    assert describe(a).readonly


@pytest.mark.parametrize(
    ("torch_dtype", "numpy_dtype"),
    [
        ("float32", np.float32),
        ("float16", np.float16),
        ("bfloat16", ml_dtypes.bfloat16),
        ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
        ("float8_e5m2", ml_dtypes.float8_e5m2),
        ("int32", np.int32),
        ("uint16", np.uint16),
    ],
)
def test_torch_tensors_keep_their_dtype(torch_dtype: str, numpy_dtype: Any) -> None:
    """Also the dtypes numpy lacks: ``ml_dtypes`` names them."""
    t = torch.randn(6, 10).to(getattr(torch, torch_dtype))
    view = describe(t[1:])
    assert view.dtype == np.dtype(numpy_dtype)
    assert view.type_name == np.dtype(numpy_dtype).name
    assert view.address == t[1:].data_ptr() == t.data_ptr() + 10 * t.element_size()
    assert view.shape == (5, 10) and view.contiguous


def test_a_dtype_with_no_numpy_name_is_named_for_the_message() -> None:
    view = describe(torch.zeros(3, dtype=torch.complex64))
    assert view.dtype is None
    assert view.type_name == "complex64"


def test_bit_carriers_have_the_width_of_what_they_carry() -> None:
    for dtype, carrier in BIT_CARRIERS.items():
        assert dtype.itemsize == carrier.itemsize and carrier.kind == "u"


class _InterfaceOnly:
    """An array that speaks only the CUDA array interface, as Numba's do."""

    def __init__(self, **interface: Any) -> None:
        self.__cuda_array_interface__ = {"version": 3, **interface}


def test_the_cuda_array_interface_counts_strides_in_bytes() -> None:
    dense = _InterfaceOnly(shape=(4, 6), typestr="<u2", data=(0x7000, False), strides=(12, 2))
    view = describe(dense)
    assert (view.address, view.shape, view.dtype) == (0x7000, (4, 6), np.uint16)
    assert view.contiguous and not view.readonly
    assert (view.device_type, view.device) == (DeviceKind.CUDA, "CUDA")
    columns = _InterfaceOnly(shape=(4, 3), typestr="<f4", data=(0x7000, True), strides=(24, 4))
    assert not describe(columns).contiguous
    assert describe(columns).readonly


def test_the_cuda_array_interface_passes_on_its_stream() -> None:
    x = _InterfaceOnly(shape=(2,), typestr="<f4", data=(0x7000, False), strides=None, stream=7)
    assert describe(x).producer_stream == 7
    assert describe(x).contiguous


def test_an_object_with_neither_protocol_is_refused() -> None:
    with pytest.raises(TypeError, match="neither __dlpack__ nor __cuda_array_interface__"):
        describe([1.0, 2.0])
