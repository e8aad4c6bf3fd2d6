"""The host runtimes (CPU, OpenCL) take any tensor in host memory where it lies: numpy
arrays, objects with ``__dlpack__`` (CPU torch tensors, bf16 ones included) and the
buffer protocol, inputs and results alike, with no copy."""

from __future__ import annotations

import array

import numpy as np
import pytest
import torch

import tessera

from .test_opencl import _platform

pytestmark = pytest.mark.execute

SOURCE = """\
@kernel
def f(x: Tensor["R", "C", f32], b: Tensor["C", bf16]) -> Tensor["R", "C", f32]:
    return x * 2.0 + cast(b, f32)
"""

TARGETS = [
    "cpu",
    pytest.param(
        "opencl",
        marks=pytest.mark.skipif(_platform() is not None, reason=f"needs PoCL: {_platform()}"),
    ),
]


@pytest.fixture(scope="module", params=TARGETS)
def f(request: pytest.FixtureRequest) -> object:
    return tessera.compile(SOURCE, target=request.param).load().f


def _inputs(rows: int = 37, cols: int = 29) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(rows, cols, generator=generator)
    b = torch.randn(cols, generator=generator).to(torch.bfloat16)
    return x, b


def _expected(x: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    return x.double().numpy() * 2.0 + b.double().numpy()


def test_torch_tensors_in_and_out_without_a_copy(f: object) -> None:
    x, b = _inputs()
    out = torch.full(x.shape, float("nan"))
    assert f(x, b, out=out) is out  # written where the caller's tensor lies
    np.testing.assert_allclose(out.numpy(), _expected(x, b), rtol=1e-6)


def test_torch_and_numpy_mix_and_the_result_is_a_numpy_array(f: object) -> None:
    x, b = _inputs(5, 3)
    result = f(x.numpy(), b)
    assert isinstance(result, np.ndarray)
    np.testing.assert_allclose(result, _expected(x, b), rtol=1e-6)


def test_buffer_protocol_objects(f: object) -> None:
    x, b = _inputs(1, 29)
    flat = array.array("f", x.numpy().ravel().tolist())
    out = np.full((1, 29), np.nan, dtype=np.float32)
    f(np.frombuffer(memoryview(flat), dtype=np.float32).reshape(1, 29), b, out=out)
    np.testing.assert_allclose(out, _expected(x, b), rtol=1e-6)
    with pytest.raises(ValueError, match=r"'x' has shape \(29,\), the kernel takes \[R, C\]"):
        f(flat, b)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda x, b: (x.t(), b), ValueError, "'x' must be C-contiguous"),
        (lambda x, b: ("x", b), TypeError, "'x' must be an array of f32 in host memory"),
        (lambda x, b: (x, b.float()), TypeError, "'b' is float32, the kernel takes bf16"),
    ],
)
def test_what_cannot_be_taken_is_a_clear_error(
    f: object, change: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        f(*change(*_inputs()))


def test_read_only_memory_is_no_result(f: object) -> None:
    x, b = _inputs(2, 29)
    frozen = memoryview(np.zeros((2, 29), dtype=np.float32).tobytes()).cast("f", (2, 29))
    with pytest.raises(ValueError, match="'out' is the result but is read-only"):
        f(x, b, out=frozen)
