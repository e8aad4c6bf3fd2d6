"""The fast path of a call (``tessera.runtime.plan``): the same results as the full
checks, and every call it does not recognize left to them, errors included.

CPU: numpy arrays through the module's NumPy entries (``tessera.runtime.cpu_shim``).
CUDA: device arrays on the simulated GPU (``tests/gpusim``), launched through the
simulated driver's ``cuLaunchKernel`` from prepared parameter blocks, tensor maps and
intermediate buffers included (``tessera.runtime.cuda_launch``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.runtime import cuda_launch
from tessera.runtime.cpu import WARM_CALLS, CpuLibrary
from tessera.runtime.cuda import _dtype
from tessera.runtime.entry import MISSED
from tessera.runtime.foreign import BIT_CARRIERS
from tessera.runtime.plan import fast_path

from .conftest import ROOT
from .gpusim import DeviceArray, simulated_cupy, use_simulator
from .reference import f64
from .test_cuda import needs_gxx

pytestmark = [pytest.mark.execute, needs_gxx]

SOURCE = """\
@kernel
def scaled_sum(a: Tensor["M", "N", f32], b: Tensor["M", "N", f32], s: float,
               w: Tensor["N", f32]) -> Tensor["M", "N", f32]:
    return (a + b) * s + w

@kernel
def matmul(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return a @ b

@kernel
def column(v: Tensor["N", f32], m: Tensor["N", "N", f32]) -> Tensor["N", "N", f32]:
    return m @ v[:, None]

@kernel
def doubled_into(x: Tensor["R", f32], y: Tensor["R", f32]):
    T = tile.context()
    v = tile.load(x, rows=T.m)
    tile.store(y, v * 2.0)
"""


@pytest.fixture(scope="module")
def cpu() -> CpuLibrary:
    """The module, warm: its functions' C calls built."""
    lib = tessera.compile(SOURCE, "launch.tsr", target="cpu").load()
    x = np.ones(3, np.float32)
    for _ in range(WARM_CALLS):
        assert lib.scaled_sum._fast is None
        lib.doubled_into(x, x)
    assert lib.scaled_sum._fast is not None
    return lib


def test_the_cpu_fast_path_gives_the_full_paths_results(cpu: CpuLibrary) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 37, 21), dtype=np.float32)
    w = rng.standard_normal(21, dtype=np.float32)
    f = cpu.scaled_sum
    fast = f(a, b, 0.5, w)
    assert f._fast(a, b, 0.5, w) is not MISSED  # the call took the fast path
    full = f(a=a, b=b, s=0.5, w=w)  # the full checks: the inputs by name
    np.testing.assert_array_equal(fast, full)
    out = np.full_like(a, np.nan)
    assert f._fast(a, b, 0.5, w, out=out) is out  # the fast path takes a given out
    np.testing.assert_array_equal(fast, out)
    np.testing.assert_allclose(fast, (f64(a) + b) * 0.5 + w, rtol=1e-5, atol=1e-6)
    # A small product after a larger one: its tiles' storage holds the larger one's
    # values past the small corner, which it clears and copies alone.
    for m, k, n in ((300, 280, 260), (37, 21, 5), (1, 1, 1)):
        x = rng.standard_normal((m, k), dtype=np.float32)
        y = rng.standard_normal((k, n), dtype=np.float32)
        np.testing.assert_allclose(cpu.matmul(x, y), f64(x) @ y, rtol=1e-4, atol=1e-5)
    v, into = rng.standard_normal(11, dtype=np.float32), np.full(11, np.nan, np.float32)
    assert cpu.doubled_into(v, into) is None
    np.testing.assert_array_equal(into, v * 2)


def test_a_tiny_product_clears_and_copies_only_its_corner() -> None:
    """A 4 x 4 product under a 256 x 256 tile: zeroing the whole accumulator and the
    whole right operand's tile cost 13 of its 14 microseconds a call."""
    source = tessera.compile(SOURCE, "launch.tsr", target="cpu").source
    assert "tsr::zero_corner(acc, BN, tsr::live(BM, M - BM*pid_m)" in source
    assert "tsr::load_corner(b_tile_smem, BK, BN, b, N," in source
    assert "std::fill_n(acc," not in source


def test_calls_the_cpu_fast_path_does_not_recognize_get_the_full_checks(cpu: CpuLibrary) -> None:
    """Each of these would give a wrong answer or a crash if the fast path took it."""
    f = cpu.scaled_sum
    a = np.ones((6, 4), np.float32)
    w = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="'a' must be C-contiguous"):
        f(np.ones((4, 6), np.float32).T, a, 1.0, w)
    with pytest.raises(TypeError, match="'b' is float64, the kernel takes f32"):
        f(a, a.astype(np.float64), 1.0, w)
    with pytest.raises(ValueError, match="dim N should be 4"):
        f(a, a, 1.0, np.ones(5, np.float32))
    with pytest.raises(ValueError, match="'b' has shape"):
        f(a, a[None], 1.0, w)
    with pytest.raises(TypeError, match="'s' is float, given 'x'"):
        f(a, a, "x", w)
    with pytest.raises(TypeError, match="takes 4 positional arguments"):
        f(a, a, 1.0, w, w)
    np.testing.assert_array_equal(f(a, a, 2, w), np.full((6, 4), 5.0))  # an int for a float
    assert cpu.column._fast is not None  # its guard, N == 1, is checked in C
    one = np.full((1, 1), 3.0, np.float32)
    np.testing.assert_array_equal(cpu.column(np.full(1, 2.0, np.float32), one), one * 2)
    with pytest.raises(ValueError, match=r"N = 3 breaks N == 1 \(result shape\)"):
        cpu.column(np.ones(3, np.float32), np.ones((3, 3), np.float32))
    # an out the result cannot be written into
    with pytest.raises(ValueError, match=r"'out' has shape \(4, 6\): dim M should be 6"):
        f(a, a, 1.0, w, out=np.empty((4, 6), np.float32))
    with pytest.raises(TypeError, match="'out' is float64, the kernel takes f32"):
        f(a, a, 1.0, w, out=np.empty((6, 4)))
    with pytest.raises(ValueError, match="'out' must be C-contiguous"):
        f(a, a, 1.0, w, out=np.empty((4, 6), np.float32).T)
    frozen = np.ones((6, 4), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="'out' is the result but is read-only"):
        f(a, a, 1.0, w, out=frozen)
    frozen = np.ones(3, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="'y' is updated in place but is read-only"):
        cpu.doubled_into(frozen, frozen)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_device_arrays_launch_through_the_driver_as_the_full_path_does(
    arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MLP example: two launches, an intermediate buffer, and on sm_90a the TMA
    tensor maps of its operands and of the buffer. Device arrays take the fast path,
    numpy arrays the full one (copied to the GPU and back): the same bits."""
    use_simulator(monkeypatch, simulated_cupy(arch))
    mlp = tessera.compile_file(ROOT / "examples/mlp.tsr", target="cuda", arch=arch).load().mlp
    rng = np.random.default_rng(2)
    shapes = {"x": (30, 24), "W_in": (24, 40), "b_in": (40,), "W_out": (40, 24), "b_out": (24,)}
    host = {k: rng.standard_normal(v).astype(np.float32 if k[0] == "b" else ml_dtypes.bfloat16)
            for k, v in shapes.items()}  # fmt: skip
    want = mlp(**host).view(np.uint16)
    device = [DeviceArray(v.view(BIT_CARRIERS.get(v.dtype, v.dtype)).copy())
              for v in host.values()]  # fmt: skip
    for _ in range(2):  # the second call reuses the tensor maps encoded by the first
        have = mlp(*device)
        assert isinstance(have, DeviceArray)
        np.testing.assert_array_equal(have.data, want)
    assert mlp._paths[DeviceArray] is not None
    # A preallocated result (poisoned) takes the fast path too; one of the wrong shape
    # goes to the full checks, which say what is wrong with it.
    given = DeviceArray(np.full(want.shape, 0xFFFF, np.uint16))
    assert mlp._fast(*device, out=given) is given
    np.testing.assert_array_equal(given.data, want)
    wrong = DeviceArray(np.zeros((want.shape[0] + 1, want.shape[1]), np.uint16))
    assert mlp._fast(*device, out=wrong) is MISSED
    with pytest.raises(ValueError, match="'out'"):
        mlp(*device, out=wrong)
    with pytest.raises(ValueError, match="'W_in' has shape"):
        mlp(device[0], device[3], *device[2:])


def test_scalars_and_empty_grids_on_the_simulated_gpus_fast_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A float scalar in its 32-bit slot, a size that binds from a second tensor, and a
    call with an empty tensor, whose grid launches nothing."""
    use_simulator(monkeypatch, simulated_cupy("sm_80"))
    source = SOURCE[: SOURCE.index("@kernel\ndef matmul")]
    f = tessera.compile(source, "launch.tsr", target="cuda", arch="sm_80").load().scaled_sum
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((2, 9, 7), dtype=np.float32)
    w = rng.standard_normal(7, dtype=np.float32)
    have = f(DeviceArray(x), DeviceArray(y), 0.25, DeviceArray(w))
    assert f._paths[DeviceArray] is not None
    np.testing.assert_allclose(have.data, (f64(x) + y) * 0.25 + w, rtol=1e-5, atol=1e-6)
    empty = DeviceArray(np.ones((0, 7), np.float32))
    assert f(empty, empty, 1.0, DeviceArray(w)).shape == (0, 7)


class _FakeTorch:
    """What the torch fast path uses of torch, over host memory (the simulated GPU's):
    enough to run its generated checks and launches without a CUDA build of torch."""

    class Tensor:
        def __init__(self, data: np.ndarray) -> None:
            self.data, self.shape, self.is_cuda = data, data.shape, True
            self.dtype = data.dtype.name

        def get_device(self) -> int:
            return 0

        def is_contiguous(self) -> bool:
            return bool(self.data.flags.c_contiguous)

        def data_ptr(self) -> int:
            return int(self.data.ctypes.data)

    _C = SimpleNamespace(_cuda_getCurrentRawStream=lambda device: 0)
    uint8, float32, float16, float64, int32, int64, int8, bool = (
        "uint8", "float32", "float16", "float64", "int32", "int64", "int8", "bool")  # fmt: skip
    bfloat16, float8_e4m3fn, float8_e5m2 = "bfloat16", "float8_e4m3fn", "float8_e5m2"

    @staticmethod
    def device(kind: str, index: int) -> tuple[str, int]:
        return kind, index

    @classmethod
    def empty(cls, shape: Any, dtype: str, device: Any) -> Any:
        wanted = np.dtype(getattr(ml_dtypes, dtype, dtype))
        return cls.Tensor(np.full(shape, 0xFF, np.uint8).view(wanted) if wanted.itemsize == 1
                          else np.full(shape, np.nan, wanted))  # fmt: skip


def test_the_torch_fast_path_launches_torch_tensors_where_they_lie(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast path torch tensors take (``cuda_launch.torch_backend``), over a stand-in
    for torch with torch's tensor API: the same bits as the full path."""
    use_simulator(monkeypatch, simulated_cupy("sm_90a"))
    mlp = tessera.compile_file(ROOT / "examples/mlp.tsr", target="cuda", arch="sm_90a").load().mlp
    rng = np.random.default_rng(5)
    shapes = {"x": (17, 24), "W_in": (24, 40), "b_in": (40,), "W_out": (40, 24), "b_out": (24,)}
    host = {k: rng.standard_normal(v).astype(np.float32 if k[0] == "b" else ml_dtypes.bfloat16)
            for k, v in shapes.items()}  # fmt: skip
    want = mlp(**host)
    backend = cuda_launch.torch_backend(_FakeTorch, 0, mlp._launches)
    fast = fast_path(mlp.meta, backend, _dtype, mlp._check_guards, MISSED)
    tensors = tuple(_FakeTorch.Tensor(v.copy()) for v in host.values())
    have = fast(*tensors)
    assert have.dtype == "bfloat16"
    np.testing.assert_array_equal(have.data.view(np.uint16), want.view(np.uint16))
    assert fast(*tensors[:4], _FakeTorch.Tensor(host["b_out"][:5].copy())) is MISSED
