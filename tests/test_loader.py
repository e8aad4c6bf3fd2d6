"""``--python-loader``: the CuPy module written beside a CUDA file.

Its text is pinned per example like every other output, it is formatted as black
formats it, and it runs: with a stand-in for CuPy that records launches instead of
making them, its checks and launches must be the ones ``tessera.runtime.cuda`` derives
from the same metadata; over the simulated GPU of ``tests/gpusim``, and on a GPU where
there is one, every reference case gives the float64 reference's numbers.
"""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tessera
from tessera.runtime.cuda import _cupy
from tessera.runtime.entry import evaluate
from tessera.runtime.foreign import BIT_CARRIERS
from tessera.transpiler.pipeline import Program
from tessera.transpiler.target.cupy_loader import python_loader

from .conftest import EXAMPLES, ROOT, SOURCES
from .gpusim import simulated_cupy, simulated_driver, use_simulator
from .reference import CASES, Case, check_case, simulated
from .test_cuda import ARCHS, GPU_TENSOR_CASES, ON_GPU, needs_gxx, no_gpu

GOLDEN = ROOT / "golden"


def _loader(path: Path) -> str:
    """The loader of a file, named by its path in the repository (as the module says)."""
    program = tessera.compile_file(path.relative_to(ROOT), target="cuda", arch="sm_80")
    return python_loader(program.ir("meta"), f"{path.stem}.cu")


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_loader_matches_golden(
    example: Path, update_golden: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the module names its source as given: examples/x.tsr
    golden = GOLDEN / example.stem / "loader.cuda-sm_80.py"
    text = _loader(example)
    if update_golden:
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden}: run pytest --update-golden"
    assert text == golden.read_text(), f"{golden} differs: review, then --update-golden"


@pytest.mark.parametrize("source", SOURCES, ids=[Path(p).stem for p in SOURCES])
def test_loader_is_formatted_and_lint_clean(source: str, tmp_path: Path) -> None:
    """black's default style, and ruff at black's line length: a downstream project can
    check the module in under its own formatter without a diff."""
    module = tmp_path / f"{Path(source).stem}.py"
    module.write_text(_loader(ROOT / source))
    assert_formatted(module)


def assert_formatted(module: Path) -> None:
    """The module is as black formats it, and ruff finds nothing at black's line length."""
    pytest.importorskip("black", reason="needs black")
    black = subprocess.run([sys.executable, "-m", "black", "--check", "--diff", str(module)],
                           capture_output=True, text=True)  # fmt: skip
    assert black.returncode == 0, black.stdout
    lint = ["check", "--no-cache", "--isolated", "--line-length", "88", str(module)]
    ruff = subprocess.run([sys.executable, "-m", "ruff", *lint], capture_output=True, text=True)
    assert ruff.returncode == 0, ruff.stdout


class _Array:
    """A device array as far as the loader looks at one."""

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)
        self.flags = types.SimpleNamespace(c_contiguous=True)


def _fake_cupy(launches: list[tuple[Any, ...]]) -> types.ModuleType:
    """CuPy's names the loader uses; a kernel call is recorded, not run."""

    class Kernel:
        def __init__(self, name: str) -> None:
            self.name, self.max_dynamic_shared_size_bytes = name, 0
            self.shared_size_bytes = 0

        def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int) -> None:
            launches.append((self.name, grid, block, args, shared_mem))

    class RawModule:
        def __init__(self, code: str, options: tuple[str, ...], backend: str) -> None:
            assert 'extern "C" __global__' in code and backend == "nvrtc"

        def get_function(self, name: str) -> Kernel:
            return Kernel(name)

    cupy = types.ModuleType("cupy")
    cupy.ndarray, cupy.RawModule, cupy.RawKernel = _Array, RawModule, Kernel
    cupy.dtype, cupy.int64, cupy.int32, cupy.float32 = np.dtype, np.int64, np.int32, np.float32
    cupy.empty = lambda shape, dtype: _Array(shape if isinstance(shape, tuple) else (shape,), dtype)
    cupy.asarray = _from_interface
    return cupy


def _from_interface(x: Any) -> _Array:
    """``cupy.asarray`` of a GPU tensor: an array of its interface's dtype that keeps
    ``x`` as its owner, as CuPy's does."""
    interface = x.__cuda_array_interface__
    array = _Array(interface["shape"], np.dtype(interface["typestr"]))
    array.owner = x
    return array


class _TorchLike:
    """A GPU tensor as torch shows one through ``__cuda_array_interface__``: bf16 as raw
    2-byte values, fp8 as a KeyError (torch has no typestr for it)."""

    def __init__(self, shape: tuple[int, ...], typestr: str | None) -> None:
        self.shape, self.typestr = shape, typestr

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if self.typestr is None:
            raise KeyError("torch.float8_e4m3fn")
        return {"shape": self.shape, "typestr": self.typestr, "data": (4096, False),
                "strides": None, "version": 2}  # fmt: skip


def _import(path: Path, cupy: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_loader_checks_and_launches_as_the_runtime_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MLP at ragged sizes: two launches, an intermediate buffer, grids and
    arguments as the metadata gives them; a wrong shape names the parameter and dim."""
    example = ROOT / "examples" / "mlp.tsr"
    program = tessera.compile_file(example, target="cuda", arch="sm_80")
    (tmp_path / "mlp.cu").write_text(program.source)
    (tmp_path / "mlp_loader.py").write_text(python_loader(program.ir("meta"), "mlp.cu"))
    launches: list[tuple[Any, ...]] = []
    mlp = _import(tmp_path / "mlp_loader.py", _fake_cupy(launches), monkeypatch)
    sizes = {"T": 300, "D": 96, "F": 200}
    x, w_in = _Array((300, 96), np.uint16), _Array((96, 200), np.uint16)
    b_in, w_out, b_out = (
        _Array((200,), np.float32),
        _Array((200, 96), np.uint16),
        _Array((96,), np.float32),
    )
    out = mlp.mlp(x, w_in, b_in, w_out, b_out)
    assert out.shape == (300, 96) and out.dtype == np.uint16
    meta = next(f for f in program.ir("meta")["functions"] if f["name"] == "mlp")
    assert [launch[0] for launch in launches] == [k["kernel"] for k in meta["launches"]]
    for (_, grid, block, args, smem), want in zip(launches, meta["launches"], strict=True):
        blocks = [-(-evaluate(g["extent"], sizes, "grid") // g["block"]) for g in want["grid"]]
        assert list(grid) == blocks + [1] * (3 - len(blocks))
        assert block == (want["threads"], 1, 1) and smem == want["dynamic_smem"]
        named = {"x": x, "W_in": w_in, "b_in": b_in, "W_out": w_out, "b_out": b_out, "out": out}
        for arg, name in zip(args, want["args"], strict=True):
            if name in sizes:
                assert arg == sizes[name] and isinstance(arg, np.int64)
            elif name in named:
                assert arg is named[name]
            else:  # the intermediate buffer
                assert arg.shape == (evaluate(meta["buffers"][0]["bytes"], sizes, name),)
    with pytest.raises(ValueError, match=r"mlp\(\): 'W_out' has shape \(201, 96\), \[F, D\]"):
        mlp.mlp(x, w_in, b_in, _Array((201, 96), np.uint16), b_out)
    with pytest.raises(TypeError, match=r"'x' is float32, the kernel takes uint16"):
        mlp.mlp(_Array((300, 96), np.float32), w_in, b_in, w_out, b_out)


def test_loader_takes_bf16_torch_tensors_as_their_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch names bf16 as raw 2-byte values ("<V2") in its interface: the loader reads
    such a tensor as the uint16 bits the kernel takes, and only for a bf16 parameter."""
    program = tessera.compile_file(ROOT / "examples" / "mlp.tsr", target="cuda", arch="sm_80")
    (tmp_path / "mlp.cu").write_text(program.source)
    (tmp_path / "mlp_loader.py").write_text(python_loader(program.ir("meta"), "mlp.cu"))
    launches: list[tuple[Any, ...]] = []
    mlp = _import(tmp_path / "mlp_loader.py", _fake_cupy(launches), monkeypatch)
    a, b = _TorchLike((30, 16), "<V2"), _TorchLike((16, 20), "<V2")
    bias = _TorchLike((20,), "<f4")
    out = mlp.linear_gelu(a, b, bias)
    args = launches[0][3]
    taken = [arg for arg in args if isinstance(arg, _Array) and arg is not out]
    assert [t.dtype for t in taken] == [np.uint16, np.uint16, np.float32]
    assert taken[0].owner.tensor is a and taken[1].owner.tensor is b and taken[2].owner is bias
    with pytest.raises(TypeError, match=r"'bias' is \|V2, the kernel takes float32"):
        mlp.linear_gelu(a, b, _TorchLike((20,), "<V2"))
    with pytest.raises(TypeError, match=r"'A' must be a cupy array .* t.view\(torch.uint8\)"):
        mlp.linear_gelu(_TorchLike((30, 16), None), b, bias)


def test_loader_binds_a_vector_length_and_passes_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fused Adam: a rank-1 tensor binds its length as an int, and the scalars the call
    leaves out reach the kernel with the .tsr file's defaults."""
    program = tessera.compile_file(ROOT / "tessera/stdlib/fused_adam.tsr", target="cuda")
    (tmp_path / "adam.cu").write_text(program.source)
    (tmp_path / "adam_loader.py").write_text(python_loader(program.ir("meta"), "adam.cu"))
    launches: list[tuple[Any, ...]] = []
    adam = _import(tmp_path / "adam_loader.py", _fake_cupy(launches), monkeypatch)
    param, grad, m, v = (_Array((1000,), np.float32) for _ in range(4))
    assert adam.fused_adam(param, grad, m, v, lr=0.01, step=3) is None
    meta = program.ir("meta")["functions"][0]
    (launch,) = launches
    named = dict(zip(meta["launches"][0]["args"], launch[3], strict=True))
    assert named["N"] == 1000 and isinstance(named["N"], np.int64)
    assert (named["lr"], named["step"]) == (np.float32(0.01), 3)
    defaults = {p["name"]: p["default"] for p in meta["params"] if "default" in p}
    assert defaults == {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    for name, value in defaults.items():
        assert named[name] == np.float32(value) and isinstance(named[name], np.float32)
    adam.fused_adam(param, grad, m, v, lr=0.01, step=3, beta1=0.5)
    assert dict(zip(meta["launches"][0]["args"], launches[1][3], strict=True))["beta1"] == 0.5
    with pytest.raises(ValueError, match=r"'grad' has shape \(999,\), \[N\] is \(1000,\)"):
        adam.fused_adam(param, _Array((999,), np.float32), m, v, lr=0.01, step=3)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_reference_case_passes_the_loaders_checks(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each case's inputs, as device arrays of their storage dtypes, pass the loader's
    checks and reach the launches the metadata lists, sizes bound to the case's."""
    program = tessera.compile_file(ROOT / case.path, target="cuda", arch="sm_80")
    (tmp_path / "k.cu").write_text(program.source)
    (tmp_path / "k_loader.py").write_text(python_loader(program.ir("meta"), "k.cu"))
    launches: list[tuple[Any, ...]] = []
    module = _import(tmp_path / "k_loader.py", _fake_cupy(launches), monkeypatch)
    inputs = case.make(np.random.default_rng(0))
    args = {k: _Array(v.shape, BIT_CARRIERS.get(v.dtype, v.dtype))
            if isinstance(v, np.ndarray) else v for k, v in inputs.items()}  # fmt: skip
    getattr(module, case.function)(**args)
    meta = next(f for f in program.ir("meta")["functions"] if f["name"] == case.function)
    assert [launch[0] for launch in launches] == [k["kernel"] for k in meta["launches"]]
    sizes = {}
    for p in meta["params"]:
        if p["kind"] == "tensor" and p["name"] in args:
            sizes.update((d, n) for d, n in zip(p["dims"], args[p["name"]].shape, strict=True))
    for launch, want in zip(launches, meta["launches"], strict=True):
        for arg, name in zip(launch[3], want["args"], strict=True):
            if name in args:
                assert arg is args[name] or arg == args[name]
            elif name in meta["dims"]:
                assert arg == sizes[name]


def test_loader_needs_cuda_output(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tessera", str(ROOT / "examples/mlp.tsr"),
                           "-o", str(tmp_path / "mlp.cpp"), "--python-loader",
                           str(tmp_path / "mlp.py")], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and "--python-loader needs CUDA output" in done.stderr
    assert not (tmp_path / "mlp.py").exists()


def test_loader_refuses_a_parameter_named_like_its_own_names(tmp_path: Path) -> None:
    """A parameter named ``cupy`` would hide the module the function's body allocates
    with; the CUDA file alone is fine."""
    source = tmp_path / "k.tsr"
    source.write_text(
        "@kernel\n"
        'def g(A: Tensor["M", "K", f32], cupy: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:\n'
        "    return A @ cupy\n"
    )
    command = [sys.executable, "-m", "tessera", str(source), "-o", str(tmp_path / "k.cu")]
    done = subprocess.run([*command, "--python-loader", str(tmp_path / "k.py")],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 1
    assert "function 'g': the loader module cannot take a parameter named 'cupy'" in done.stderr
    assert not (tmp_path / "k.py").exists() and not (tmp_path / "k.cu").exists()
    assert subprocess.run(command, capture_output=True).returncode == 0


def _loader_module(
    program: Program, tmp_path: Path, cupy: Any, monkeypatch: pytest.MonkeyPatch,
    driver: Any = None,
) -> Any:  # fmt: skip
    """A program's CUDA file and loader, written as a project checks them in, and the
    loader imported over ``cupy`` (and ``driver``, where given, for the CUDA driver)."""
    (tmp_path / "k.cu").write_text(program.source)
    (tmp_path / "k_loader.py").write_text(python_loader(program.ir("meta"), "k.cu"))
    module = _import(tmp_path / "k_loader.py", cupy, monkeypatch)
    if driver is not None and hasattr(module, "_driver"):
        monkeypatch.setattr(module, "_driver", lambda: driver)
    return module


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", simulated(CASES))
def test_loader_runs_to_the_float64_reference_on_the_simulator(
    case: Case, arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files a downstream project checks in, run with nothing but (a simulated)
    CuPy on cupy arrays, outputs poisoned first."""
    cupy = simulated_cupy(arch)
    use_simulator(monkeypatch, cupy)
    load = functools.partial(_loader_module, tmp_path=tmp_path, cupy=cupy,
                             monkeypatch=monkeypatch, driver=simulated_driver())  # fmt: skip
    check_case(case, "cuda", arch, placement=ON_GPU["cupy"], load=load)


#: Every case through the loader on cupy arrays (bf16 and fp8 as their bits), and the
#: GPU-tensor cases on torch tensors of their own dtypes.
LOADER_RUNS = [(c, "cupy") for c in CASES] + [(c, "torch") for c in GPU_TENSOR_CASES]


@pytest.mark.gpu
@pytest.mark.execute
@pytest.mark.skipif(no_gpu() is not None, reason=f"needs a GPU: {no_gpu()}")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    ("case", "holder"), LOADER_RUNS, ids=[f"{c.id}-{h}" for c, h in LOADER_RUNS]
)
def test_loader_runs_to_the_float64_reference(
    case: Case, holder: str, arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files a downstream project checks in, run with nothing but CuPy, outputs
    poisoned first."""
    if holder == "torch":
        pytest.importorskip("torch", reason="needs torch with CUDA")
    load = functools.partial(
        _loader_module, tmp_path=tmp_path, cupy=_cupy(), monkeypatch=monkeypatch
    )
    check_case(case, "cuda", arch, placement=ON_GPU[holder], load=load)
