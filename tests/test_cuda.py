"""The CUDA backend: compiled by nvcc and NVRTC for sm_80 and sm_90a, read in SASS, and
run on a GPU where there is one.

Every example and library file compiles warning-free for both archs with nvcc and
with NVRTC, with no spills and no stack frame; bf16 products and attention run on
the tensor cores (HMMA on sm_80, HGMMA on sm_90a, in the SASS), and pipelined loops
copy ahead on cp.async (LDGSTS). Every case of
``reference.py`` runs against float64 on a GPU simulated on the CPU (``tests/gpusim``),
and again on a real GPU in the GPU tier (``-m gpu``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.runtime import cuda as cuda_runtime
from tessera.runtime.cuda import CudaUnavailable, _cupy, check_arch
from tessera.runtime.foreign import BIT_CARRIERS
from tessera.transpiler.schedule.hardware import hardware_for
from tessera.transpiler.target.nvrtc import parse_report

from .conftest import COMPILED_SOURCES, ROOT
from .gpusim import simulated_cupy, use_simulator
from .reference import (
    CASES,
    F32_MATMUL_SOURCE,
    Case,
    Placement,
    check_case,
    f64,
    low_precision_product_source,
    simulated,
)

NVCC = shutil.which("nvcc")
ARCHS = ["sm_80", "sm_90a"]


def _tool(name: str) -> str | None:
    """A CUDA tool from its pip package (nvidia-cuda-*), else from PATH."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
    except ImportError:
        return shutil.which(name)
    return find_nvidia_binary_utility(name) or shutil.which(name)


def _nvrtc() -> object | None:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return None
    return nvrtc


CUOBJDUMP, NVDISASM = _tool("cuobjdump"), _tool("nvdisasm")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")
needs_nvrtc = pytest.mark.skipif(
    _nvrtc() is None, reason="needs NVRTC (pip install cuda-bindings nvidia-cuda-nvrtc)"
)
needs_gxx = pytest.mark.skipif(
    shutil.which("g++") is None, reason="needs g++ (the GPU simulator is built with it)"
)
needs_sass_tools = pytest.mark.skipif(
    CUOBJDUMP is None or NVDISASM is None,
    reason="needs cuobjdump and nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)",
)


def cuobjdump(option: str, cubin: Path) -> str:
    """cuobjdump's output for a cubin; ``-sass`` runs nvdisasm, which it finds on PATH."""
    assert CUOBJDUMP is not None
    path = str(Path(NVDISASM).parent) if NVDISASM else ""
    done = subprocess.run([CUOBJDUMP, option, str(cubin)], capture_output=True, text=True,
                          env={"PATH": path}, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _gencode(arch: str) -> str:
    return f"-gencode=arch=compute_{arch.removeprefix('sm_')},code={arch}"


def _nvcc(path: str, arch: str, tmp_path: Path, text: str | None = None) -> tuple[Path, str]:
    """Compile the file at ``path`` (or ``text``, named so) to a cubin; returns it and
    ptxas's resource report."""
    source = tmp_path / "kernels.cu"
    program = (tessera.compile_file(ROOT / path, target="cuda", arch=arch) if text is None
               else tessera.compile(text, path, target="cuda", arch=arch))  # fmt: skip
    source.write_text(program.source)
    cubin = tmp_path / "kernels.cubin"
    assert NVCC is not None
    done = subprocess.run(
        [NVCC, _gencode(arch), "-std=c++17", "-O3", "-cubin", "-Xptxas", "-v",
         "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra", "-o", str(cubin), str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return cubin, done.stderr


@pytest.mark.compile
@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", COMPILED_SOURCES)
def test_compiles_with_nvcc_warning_free_without_spills(path: str, arch: str, tmp_path: Path):
    _, report = _nvcc(path, arch, tmp_path)
    frames = re.findall(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill", report
    )
    assert frames, report
    assert {f for frame in frames for f in frame} == {"0"}, report
    _check_shared_memory(tessera.compile_file(ROOT / path, target="cuda", arch=arch), report)


def _check_shared_memory(program: tessera.Program, report: str) -> None:
    """Every launch fits its arch: ptxas's static shared memory (the kernel's own arrays)
    plus the dynamic arena the metadata asks for, and the metadata's count of the static
    arrays is ptxas's, give or take what ptxas reserves (at most 1 KiB)."""
    meta, static = program.ir("meta"), parse_report(report)
    limit = hardware_for("cuda", meta["arch"]).smem_bytes
    for launch in (launch for f in meta["functions"] for launch in f["launches"]):
        ptxas = static[launch["kernel"]].shared_bytes
        assert 0 <= ptxas - launch["static_smem"] <= 1024, (launch, ptxas)
        assert launch["dynamic_smem"] + ptxas <= limit, (launch, ptxas, limit)


@pytest.mark.compile
@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_attention_of_any_head_dim_fits_shared_memory(arch: str, dtype: str, tmp_path: Path):
    """A symbolic head dim takes the widest head-dim tile; with f32 operands the
    probabilities and the row maxima also pass through arrays the kernel declares
    itself (they once took a decoder block's attention to 238,080 bytes on sm_90a)."""
    source = f"""\
@kernel
def mha(q: Tensor["B", "H", "S", "D", {dtype}], k: Tensor["B", "H", "S", "D", {dtype}],
        v: Tensor["B", "H", "S", "D", {dtype}]) -> Tensor["B", "H", "S", "D", {dtype}]:
    return ops.flash_attention(q, k, v, causal=True)
"""
    _, report = _nvcc("mha.tsr", arch, tmp_path, text=source)
    _check_shared_memory(tessera.compile(source, "mha.tsr", target="cuda", arch=arch), report)


@pytest.mark.compile
@needs_nvcc
def test_swizzled_and_plain_arenas_in_one_file_compile_warning_free(tmp_path: Path) -> None:
    """The dynamic shared-memory arena is one symbol in the file: a kernel with swizzled
    buffers (TMA's, aligned to 1024 bytes) and one without declare it alike. nvcc
    warned of the second alignment when they did not."""
    bf16 = F32_MATMUL_SOURCE.replace("f32", "bf16").replace("sgemm", "gemm")
    _nvcc("mixed.tsr", "sm_90a", tmp_path, text=F32_MATMUL_SOURCE + "\n" + bf16)


@pytest.mark.compile
@needs_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", COMPILED_SOURCES)
def test_compiles_with_nvrtc_as_it_is(path: str, arch: str) -> None:
    """NVRTC has no include path: the file must need nothing but itself."""
    from cuda.bindings import nvrtc

    source = tessera.compile_file(ROOT / path, target="cuda", arch=arch).source.encode()
    _, program = nvrtc.nvrtcCreateProgram(source, b"kernels.cu", 0, [], [])
    options = [b"-std=c++17", f"-arch={arch}".encode()]
    (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    _, size = nvrtc.nvrtcGetProgramLogSize(program)
    buffer = bytearray(size)  # NVRTC writes into it: never a (shared) bytes object
    nvrtc.nvrtcGetProgramLog(program, buffer)
    log = buffer.rstrip(b"\0").decode()
    assert status == nvrtc.nvrtcResult.NVRTC_SUCCESS, log
    assert "warning" not in log, log
    nvrtc.nvrtcDestroyProgram(program)


@pytest.mark.compile
@needs_nvcc
@needs_sass_tools
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", ["examples/mlp.tsr", "examples/attention.tsr"])
def test_bf16_products_run_on_tensor_cores(path: str, arch: str, tmp_path: Path) -> None:
    """sm_80 multiplies on mma.sync (HMMA), its operands loaded from shared memory with
    ldmatrix (LDSM; transposed, MT88, for an operand stored the other way round); sm_90a
    on wgmma (HGMMA) alone, with steps that add to the accumulator (its input register
    is its output, not RZ). On both, the bf16 results leave the fragments two columns a
    store (32-bit STG.E beside the 16-bit STG.E.U16 of the edges)."""
    cubin, _ = _nvcc(path, arch, tmp_path)
    sass = cuobjdump("-sass", cubin)
    assert re.search(r"\bSTG\.E\s", sass), f"{path}: no paired stores"
    hmma = re.findall(r"\bHMMA\.16816\.F32\.BF16\b", sass)
    if arch == "sm_80":
        assert hmma, f"{path}: no bf16 HMMA"
        assert re.search(r"\bLDSM\.16\.M88\.4\b", sass), f"{path}: no ldmatrix of a"
        assert re.search(r"\bLDSM\.16\.MT88\.2\b", sass), f"{path}: no ldmatrix.trans of b"
        return
    assert not hmma, f"{path}: products left on mma.sync"
    hgmma = re.findall(r"\bHGMMA\.64x\d+x16\.F32\.BF16 (R\d+), ([^;]*);", sass)
    assert hgmma, f"{path}: no bf16 HGMMA"
    accumulating = [d for d, rest in hgmma if re.search(rf"\b{d}, gsb0$", rest.strip())]
    assert accumulating, f"{path}: no HGMMA adds to its accumulator: {hgmma[:4]}"


@pytest.mark.compile
@needs_nvcc
@needs_sass_tools
@pytest.mark.parametrize("arch", ARCHS)
def test_tf32_products_run_on_tensor_cores(arch: str, tmp_path: Path) -> None:
    """A tf32 GEMM multiplies on mma.sync m16n8k8 (HMMA.1688.F32.TF32) on both archs,
    warning-free and without spills."""
    cubin, report = _nvcc("tf32.tsr", arch, tmp_path, low_precision_product_source("tf32"))
    assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", report)
    assert re.search(r"\bHMMA\.1688\.F32\.TF32\b", cuobjdump("-sass", cubin)), "no tf32 HMMA"


@pytest.mark.compile
@needs_nvcc
@needs_sass_tools
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("transposed", [False, True], ids=["a@b", "a@b.T"])
def test_fp8_products_run_on_tensor_cores(arch: str, transposed: bool, tmp_path: Path) -> None:
    """sm_80 multiplies fp8 on mma.sync as f16 (HMMA.16816.F32), and so does sm_90a where
    ``b`` lies N-major; ``a @ b.T`` runs on wgmma's fp8 form on sm_90a (QGMMA, k32)
    alone. Warning-free and without spills."""
    source = low_precision_product_source("fp8_e4m3", transposed)
    cubin, report = _nvcc("fp8.tsr", arch, tmp_path, source)
    assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", report)
    sass = cuobjdump("-sass", cubin)
    hmma = re.search(r"\bHMMA\.16816\.F32\b", sass)
    qgmma = re.search(r"\bQGMMA\.64x\d+x32\.F32\.E4M3\.E4M3\b", sass)
    if arch == "sm_90a" and transposed:
        assert qgmma and not hmma, "fp8 products left on mma.sync"
    else:
        assert hmma and not qgmma, "no f16 HMMA for an fp8 product"


@pytest.mark.compile
@needs_nvcc
@needs_sass_tools
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", ["examples/mlp.tsr", "examples/attention.tsr"])
def test_copies_ahead_run_on_cp_async_or_tma(path: str, arch: str, tmp_path: Path) -> None:
    """A pipelined loop copies the operands of later iterations ahead: on sm_80 with
    cp.async, 16 bytes a thread (LDGSTS), waiting for them (DEPBAR); on sm_90a with TMA
    (UTMALDG), waiting on an mbarrier (SYNCS.PHASECHK), and no cp.async. Attention's query
    tile, copied once before its loop, moves in 16-byte loads (LDG.E.128) on sm_80, and
    through TMA with the first stage's copies on sm_90a (its producer warpgroup's)."""
    cubin, _ = _nvcc(path, arch, tmp_path)
    sass = cuobjdump("-sass", cubin)
    cp_async = re.search(r"\bLDGSTS\.E\.BYPASS\.128\b", sass)
    if arch == "sm_90a":
        assert re.search(r"\bUTMALDG\.[2-5]D\b", sass), f"{path}: no TMA copy"
        assert re.search(
            r"\bSYNCS\.PHASECHK\.TRANS64\.TRYWAIT\b", sass
        ), f"{path}: no mbarrier wait"
        assert not cp_async, f"{path}: cp.async left beside TMA"
    else:
        assert cp_async, f"{path}: no 16-byte cp.async"
        assert re.search(r"\bLDGDEPBAR\b", sass) and re.search(r"\bDEPBAR\.LE\b", sass)
    if "attention" in path and arch == "sm_80":
        assert re.search(r"\bLDG\.E\.128\b", sass), f"{path}: no 16-byte loads"


@pytest.mark.parametrize(
    ("arch", "capability", "refused"),
    [("sm_80", "80", None), ("sm_80", "90", None), ("sm_90a", "90", None),
     ("sm_90a", "100", "needs a GPU of compute capability 9.0; this GPU is sm_100 (compile "
      "with --arch sm_80)"),
     ("sm_80", "75", "needs a GPU of compute capability 8.0 or newer; this GPU is sm_75")],
)  # fmt: skip
def test_a_gpu_that_cannot_run_the_arch_is_refused(
    arch: str, capability: str, refused: str | None
) -> None:
    """sm_90a code (wgmma) runs on sm_90 alone; sm_80 code on sm_80 and newer."""
    if refused is None:
        check_arch(arch, capability)
        return
    with pytest.raises(CudaUnavailable) as caught:
        check_arch(arch, capability)
    assert str(caught.value).endswith(refused) and "\n" not in str(caught.value)


def test_loading_without_a_gpu_says_so() -> None:
    try:
        _cupy()
    except CudaUnavailable:
        pass
    else:
        pytest.skip("CuPy and a GPU are present")
    program = tessera.compile_file(ROOT / "examples/norms.tsr", target="cuda")
    with pytest.raises(CudaUnavailable, match=r"CuPy|no NVIDIA GPU") as caught:
        program.load()
    assert "\n" not in str(caught.value)


class _Device:
    """A device array of the stand-in below: host memory, so that addresses are real."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self.data.__array_interface__ | {"version": 3, "stream": None}

    def get(self, out: np.ndarray) -> None:
        out[...] = self.data


def _stand_in_cupy(launches: list[tuple[str, tuple[Any, ...]]]) -> Any:
    """CuPy's names the runtime uses: a launch is recorded, and writes 7s into the
    arrays it is given (pointers of GPU tensors are left alone: host memory here)."""

    class Kernel:
        def __init__(self, name: str) -> None:
            self.name = name

        def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int) -> None:
            launches.append((self.name, args))
            for a in args:
                if isinstance(a, _Device):
                    a.data[...] = 7

    class RawModule:
        def __init__(self, code: str, options: tuple[str, ...], backend: str) -> None:
            assert 'extern "C" __global__' in code and backend == "nvrtc"

        def get_function(self, name: str) -> Kernel:
            return Kernel(name)

    stream, gpu = SimpleNamespace(ptr=0), SimpleNamespace(id=0, compute_capability="90")
    cuda = SimpleNamespace(get_current_stream=lambda: stream, Device=lambda: gpu)
    return SimpleNamespace(
        cuda=cuda, RawModule=RawModule, uint8=np.uint8,
        asarray=lambda a: _Device(a.copy()),
        empty=lambda shape, dtype: _Device(np.empty(shape, dtype)),
    )  # fmt: skip


def test_arguments_reach_the_launches_as_the_metadata_orders_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a GPU, with a stand-in for CuPy: GPU tensors go to the kernels as their
    addresses and the result is allocated beside them (bf16 as its bits, in CuPy);
    numpy arrays travel as bytes and what the kernels wrote comes back."""
    launches: list[tuple[str, tuple[Any, ...]]] = []
    use_simulator(monkeypatch, _stand_in_cupy(launches))  # its driver encodes tensor maps
    program = tessera.compile_file(ROOT / "examples/mlp.tsr", target="cuda", arch="sm_90a")
    mlp = program.load().mlp
    meta = mlp.meta
    sizes = {"T": 30, "D": 24, "F": 40}
    rng = np.random.default_rng(0)
    shapes = {"x": (30, 24), "W_in": (24, 40), "b_in": (40,), "W_out": (40, 24), "b_out": (24,)}
    host = {k: rng.standard_normal(v).astype(np.float32 if k[0] == "b" else ml_dtypes.bfloat16)
            for k, v in shapes.items()}  # fmt: skip
    device = {k: _Device(v.view(BIT_CARRIERS.get(v.dtype, v.dtype))) for k, v in host.items()}
    out = mlp(**device)
    assert isinstance(out, _Device) and out.data.dtype == np.uint16 and out.data.shape == (30, 24)
    named = {**device, "out": out}
    assert [name for name, _ in launches] == [k["kernel"] for k in meta["launches"]]
    for (_, args), launch in zip(launches, meta["launches"], strict=True):
        maps = {m["name"]: m["tensor"] for m in launch.get("tensor_maps", ())}
        assert maps, "sm_90a's GEMMs copy through TMA"
        for arg, name in zip(args, launch["args"], strict=True):
            if name in named:
                assert arg == named[name].data.ctypes.data and isinstance(arg, np.uint64), name
            elif name in maps:  # 128 bytes by value, describing its tensor where it lies
                assert isinstance(arg, np.ndarray) and arg.dtype.itemsize == 128, name
                where = named[maps[name]].data if maps[name] in named else None
                assert where is None or arg.view(np.uint64)[1] == where.ctypes.data, name
            elif name in sizes:
                assert arg == sizes[name] and isinstance(arg, np.int64), name
            else:
                assert isinstance(arg, _Device), name  # the intermediate buffer
    launches.clear()
    result = mlp(**host)
    assert result.dtype == ml_dtypes.bfloat16 and result.shape == (30, 24)
    assert (result.view(np.uint16) == 0x0707).all()  # the bytes the last launch wrote
    with pytest.raises(TypeError, match="'x' is a numpy array and 'W_in' a GPU tensor"):
        mlp(host["x"], *list(device.values())[1:])


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", simulated(CASES))
def test_runs_to_the_float64_reference_on_the_simulator(
    case: Case, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every case as ``tessera.runtime.cuda`` runs it, with the GPU simulated on the CPU
    (``tests/gpusim``): mma.sync and wgmma as the PTX ISA defines them, cp.async landing
    only at its wait, shared memory and buffers poisoned first."""
    use_simulator(monkeypatch, simulated_cupy(arch))
    check_case(case, "cuda", arch)


def _sabotage(source: str, old: str, new: str) -> str:
    assert old in source, old
    return source.replace(old, new)


#: Kernels broken as a code generator could break them, and the case that must fail.
SABOTAGED = {
    "a wait that lets the copy ahead still run": (
        "gemm:gemm", "sm_80", "tsr_copy_wait<1>();", "tsr_copy_wait<2>();"),
    "the query tile sharing its bytes with the keys": (
        "attention:attention", "sm_80", "k_tile_smem = (unsigned short*)(tsr_smem + 32768)",
        "k_tile_smem = (unsigned short*)(tsr_smem + 0)"),
    "a wgmma operand read in the wrong major order": (
        "gemm:gemm", "sm_90a", "_ss<0,\n            1>", "_ss<0,\n            0>"),
    "a GEMM's last wgmma batch left running": (
        "gemm:gemm", "sm_90a", "  tsr_wgmma_wait<0>();\n", "\n"),
    "a TMA stage's wait on the phase before": (
        "gemm:gemm", "sm_90a", "kb / 4 % 2);", "(kb / 4 + 1) % 2);"),
    "TMA copies whose bytes the barrier is not told of": (
        "gemm:gemm", "sm_90a",
        "tsr_landed + 1,\n"
        "          ptid == 0 ? (a_aligned ? A_TILE_BYTES : 0) "
        "+ (b_aligned ? B_TILE_BYTES : 0) : 0);",
        "tsr_landed + 1, 0);"),

    "a TMA box's coordinates outermost first": (
        "gemm:gemm", "sm_90a", "&b_map, tsr_landed + 0, BN*pid_n + PANEL, 0)",
        "&b_map, tsr_landed + 0, 0, BN*pid_n + PANEL)"),
    "a causal block on the diagonal taken for one the mask leaves whole": (
        "attention:attention", "sm_90a", "BN*nblk + 127 <= BM*pid_m", "BN*nblk <= BM*pid_m"),
    "the ragged last key block taken for a whole one": (
        "attention:flash_attention", "sm_90a", "if (BN*nblk + BN <= S) {", "if (true) {"),
    "an fp8 wgmma stepping along k as a 16-bit one does": (
        "mlp:linear_fp8", "sm_90a", "kk < BK; kk += WGMMA_K)", "kk < BK; kk += WGMMA_K / 2)"),
    "an ldmatrix of a row-major b without .trans": (
        "gemm:gemm", "sm_80", "tsr_ldmatrix_x2_trans(b_frag", "tsr_ldmatrix_x2(b_frag"),
}  # fmt: skip


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize("broken", sorted(SABOTAGED))
def test_the_simulator_catches_a_broken_kernel(
    broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulator is strict enough to fail on the bugs it is there to find."""
    case_id, arch, old, new = SABOTAGED[broken]
    (case,) = [c for c in CASES if c.id == case_id]
    cupy = simulated_cupy(arch)
    real = cupy.RawModule
    cupy.RawModule = lambda code, *args, **kw: real(_sabotage(code, old, new), *args, **kw)
    use_simulator(monkeypatch, cupy)
    with pytest.raises(AssertionError, match=r"relative error|never written"):
        check_case(case, "cuda", arch)


def no_gpu() -> str | None:
    """Why CUDA code cannot run here, or None."""
    try:
        _cupy()
    except CudaUnavailable as exc:
        return str(exc)
    return None


@pytest.mark.gpu
@pytest.mark.execute
@pytest.mark.skipif(no_gpu() is not None, reason=f"needs a GPU: {no_gpu()}")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_runs_to_the_float64_reference_on_a_gpu(case: Case, arch: str) -> None:
    check_case(case, "cuda", arch)


def _torch_put(a: np.ndarray) -> Any:
    import torch

    raw = torch.from_numpy(a.reshape(-1).view(np.uint8).copy()).cuda()
    return raw.view(getattr(torch, a.dtype.name)).reshape(a.shape)


def _torch_take(t: Any, dtype: np.dtype) -> np.ndarray:
    import torch

    flat = t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().view(dtype)
    return flat.reshape(tuple(t.shape))


def _cupy_put(a: np.ndarray) -> Any:
    """A cupy array (the runtime's CuPy: a test may have put the simulated one there)."""
    return cuda_runtime._cupy().asarray(a.view(BIT_CARRIERS.get(a.dtype, a.dtype)))


def _cupy_take(x: Any, dtype: np.dtype) -> np.ndarray:
    return x.get().view(dtype)


#: GPU tensors, handed over where they lie: torch's (bf16 and fp8 as themselves) and
#: cupy's (bf16 and fp8 as their bits).
ON_GPU = {"torch": Placement(_torch_put, _torch_take), "cupy": Placement(_cupy_put, _cupy_take)}
#: One case per example and library kernel with bf16 tensors, and one in place.
GPU_TENSOR_IDS = {
    "mlp:mlp",
    "attention:flash_attention",
    "layernorm:layernorm",
    "fused_adam:fused_adam",
}
GPU_TENSOR_CASES = [c for c in CASES if c.id in GPU_TENSOR_IDS]


@pytest.mark.gpu
@pytest.mark.execute
@pytest.mark.skipif(no_gpu() is not None, reason=f"needs a GPU: {no_gpu()}")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("holder", sorted(ON_GPU))
@pytest.mark.parametrize("case", GPU_TENSOR_CASES, ids=[c.id for c in GPU_TENSOR_CASES])
def test_runs_on_gpu_tensors_where_they_lie(case: Case, holder: str, arch: str) -> None:
    if holder == "torch":
        pytest.importorskip("torch", reason="needs torch with CUDA")
    check_case(case, "cuda", arch, placement=ON_GPU[holder])


@pytest.mark.gpu
@pytest.mark.execute
@pytest.mark.skipif(no_gpu() is not None, reason=f"needs a GPU: {no_gpu()}")
def test_a_result_is_allocated_beside_torch_inputs() -> None:
    torch = pytest.importorskip("torch", reason="needs torch with CUDA")
    (case,) = [c for c in CASES if c.id == "mlp:mlp"]
    inputs = case.make(np.random.default_rng(1))
    fn = tessera.compile_file(ROOT / case.path, target="cuda", arch="sm_80").load().mlp
    out = fn(**{k: _torch_put(v) for k, v in inputs.items()})
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.dtype == torch.bfloat16
    want = case.reference(inputs)["out"]
    error = np.abs(f64(_torch_take(out, np.dtype(ml_dtypes.bfloat16))) - want)
    assert error.max() / np.abs(want).max() < case.rtol
    with pytest.raises(TypeError, match="'x' is a numpy array and 'W_in' a GPU tensor"):
        fn(**{k: v if k == "x" else _torch_put(v) for k, v in inputs.items()})
    with pytest.raises(TypeError, match="'x' lies in CPU:0 memory"):
        fn(**{k: torch.from_numpy(v.view(np.uint16)).view(torch.bfloat16) if k == "x"
              else _torch_put(v) for k, v in inputs.items()})  # fmt: skip


@pytest.mark.gpu
@pytest.mark.execute
@pytest.mark.skipif(no_gpu() is not None, reason=f"needs a GPU: {no_gpu()}")
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="needs compute-sanitizer")
def test_memcheck_finds_no_bad_access() -> None:
    """Every case of the GPU tier, again under ``compute-sanitizer --tool memcheck``: an
    access past a ragged edge that lands in another allocation gives no wrong number,
    only this."""
    done = subprocess.run(
        ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "86",
         "--print-limit", "20", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-m", "gpu", "-k", "runs_to_the_float64_reference", str(Path(__file__))],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert re.search(r"ERROR SUMMARY: 0 errors", done.stdout + done.stderr)
