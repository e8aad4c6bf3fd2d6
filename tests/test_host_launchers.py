"""The host launchers of the generated CUDA and HIP files (``simt_host``): a C++ program
of a downstream repository builds against the file with nvcc or hipcc alone and calls a
function of the ``.tsr`` file. Compiled and linked here; run where an NVIDIA GPU is at
hand, against the CPU backend's result."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.cli.main import main
from tessera.transpiler.target.simt_host import HostNameClash, host_source

from .conftest import ROOT
from .reference import f64

NVCC, HIPCC = shutil.which("nvcc"), shutil.which("hipcc")

#: A program that calls mlp (examples/mlp.tsr) through its host launcher (see its
#: opening comment); ``bench/launch.py --gpu`` runs it too.
PROGRAM = ROOT / "tests" / "host_launcher" / "mlp_main.cpp"

SIZES = {"T": 70, "D": 48, "F": 136}


def _gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi], capture_output=True).returncode == 0


def _build(compiler: str, flags: list[str], target: str, tmp_path: Path) -> Path:
    """The program, built against mlp.tsr's file for ``target`` as tesserac writes it."""
    suffix = ".cu" if target == "cuda" else ".hip"
    kernels = tmp_path / f"mlp{suffix}"
    arch = ["--arch", "sm_90a"] if target == "cuda" else []
    assert main([str(ROOT / "examples/mlp.tsr"), "-o", str(kernels), *arch]) == 0
    (tmp_path / "main.cpp").write_text(PROGRAM.read_text())
    binary = tmp_path / "mlp_host"
    warn = ["-Xcompiler", "-Wall,-Wextra"] if target == "cuda" else ["-Wall", "-Wextra"]
    done = subprocess.run(
        [compiler, "-std=c++17", *flags, *warn, str(kernels), str(tmp_path / "main.cpp"),
         "-o", str(binary)],
        capture_output=True, text=True, cwd=tmp_path, check=False,
        env={**os.environ, "HIP_PLATFORM": "amd"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line and
                str(kernels.name) in line]  # fmt: skip
    assert not warnings, done.stderr
    return binary


@pytest.mark.compile
@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_a_cpp_program_builds_against_the_cuda_file_and_runs_it_on_a_gpu(tmp_path: Path) -> None:
    """sm_90a: two launches, an intermediate in the workspace, 196 KiB of dynamic shared
    memory each, and TMA tensor maps of the inputs and of the intermediate. Built as
    PTX for sm_90a (the driver finishes it on the GPU), so that ptxas does not run."""
    binary = _build(NVCC, ["-gencode=arch=compute_90a,code=compute_90a"], "cuda", tmp_path)
    if not _gpu():
        pytest.skip("built; running it needs an NVIDIA GPU")
    rng = np.random.default_rng(7)
    T, D, F = SIZES.values()
    inputs = {
        "x": rng.standard_normal((T, D)).astype(ml_dtypes.bfloat16),
        "W_in": (rng.standard_normal((D, F)) / 8).astype(ml_dtypes.bfloat16),
        "b_in": rng.standard_normal(F).astype(np.float32),
        "W_out": (rng.standard_normal((F, D)) / 8).astype(ml_dtypes.bfloat16),
        "b_out": rng.standard_normal(D).astype(np.float32),
    }
    for name, a in inputs.items():
        (tmp_path / name).write_bytes(a.tobytes())
    done = subprocess.run([str(binary), str(tmp_path), str(T), str(D), str(F)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    need, small, given, none, negative = map(int, done.stdout.split())
    assert need >= 2 * T * F and (small, given, none, negative) == (2, 0, 0, 1)
    have = np.frombuffer((tmp_path / "out").read_bytes(), ml_dtypes.bfloat16).reshape(T, D)
    want = tessera.compile_file(ROOT / "examples/mlp.tsr", target="cpu").load().mlp(**inputs)
    error = np.abs(f64(have) - f64(want)).max() / np.abs(f64(want)).max()
    assert error < 2e-2, f"relative error {error:.2e}"


@pytest.mark.compile
@pytest.mark.skipif(HIPCC is None, reason="needs hipcc")
def test_a_cpp_program_builds_against_the_hip_file(tmp_path: Path) -> None:
    _build(HIPCC, ["--offload-arch=gfx90a", "-O1"], "hip", tmp_path)


def test_the_launchers_are_left_out_on_request_and_never_clash_with_a_kernel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mlp.cu"
    assert main([str(ROOT / "examples/mlp.tsr"), "-o", str(out), "--no-host"]) == 0
    program = tessera.compile_file(ROOT / "examples/mlp.tsr", target="cuda")
    assert out.read_text() == program.source
    assert "\nint tessera_mlp(const unsigned short* x," in host_source(program.ir("meta"))
    clash = tmp_path / "clash.tsr"
    clash.write_text(
        '@kernel\ndef x(a: Tensor["N", f32]) -> Tensor["N", f32]:\n    return a * 2.0\n\n'
        '@kernel\ndef tessera_x(a: Tensor["N", f32]) -> Tensor["N", f32]:\n    return a * 3.0\n'
    )
    assert main([str(clash), "-o", str(tmp_path / "clash.cu")]) == 1
    assert "named like the kernel 'tessera_x'" in capsys.readouterr().err
    with pytest.raises(HostNameClash):
        host_source(tessera.compile(clash.read_text(), "clash.tsr", target="cuda").ir("meta"))


@pytest.mark.parametrize(
    "static, dynamic, opts_in", [(40_000, 20_000, True), (0, 20_000, False), (0, 60_000, True)]
)
def test_a_launcher_opts_in_where_static_and_dynamic_shared_memory_pass_48_kib(
    static: int, dynamic: int, opts_in: bool
) -> None:
    """Without the opt-in a block may have 48 KiB of shared memory, static and dynamic
    together: a kernel with 40,000 static bytes fails to launch with 20,000 dynamic ones
    unless its launcher raises the attribute, though 20,000 alone is under the limit."""
    meta = copy.deepcopy(tessera.compile_file(ROOT / "examples/mlp.tsr", target="cuda").ir("meta"))
    launch = meta["functions"][0]["launches"][0]
    launch |= {"static_smem": static, "dynamic_smem": dynamic}
    attribute = (
        f"cudaFuncSetAttribute({launch['kernel']}, cudaFuncAttributeMaxDynamicSharedMemorySize,"
        f" {dynamic})"
    )
    assert (attribute in host_source(meta)) == opts_in


@pytest.mark.parametrize("target", ["cuda", "hip", "sycl"])
def test_an_unused_parameter_is_left_unnamed_in_the_launcher(target: str, tmp_path: Path) -> None:
    """A parameter no kernel reads keeps its place in the host function, unnamed, as in
    the CPU entry: named, it was an unused-parameter warning under -Wextra."""
    from .test_targets import UNUSED_PARAMETERS

    (tmp_path / "unused.tsr").write_text(UNUSED_PARAMETERS)
    out = tmp_path / f"unused.{target}.cpp"
    assert main([str(tmp_path / "unused.tsr"), "--target", target, "-o", str(out)]) == 0
    source = out.read_text()
    start = source.index("inline void scaled(" if target == "sycl" else "int tessera_scaled(")
    signature = " ".join(source[start : source.index("{", start)].split())
    for unused in ("s", "y", "n", "eps"):
        assert f"/* {unused} */" in signature, signature
    assert "/* x */" not in signature and "* x," in signature, signature


#: nvcc and hipcc, every warning an error: a launcher test builds its file with each.
STRICT_BUILDS = pytest.mark.parametrize(
    ("target", "compiler", "flags"),
    [("cuda", NVCC, ["-gencode=arch=compute_80,code=sm_80", "-Werror", "all-warnings",
                     "-Xcompiler", "-Wall,-Wextra"]),
     ("hip", HIPCC, ["--offload-arch=gfx90a", "-O1", "-Wall", "-Wextra", "-Werror"])],
    ids=["cuda", "hip"],
)  # fmt: skip


def _compiles_warning_free(compiler: str, flags: list[str], source: Path) -> None:
    """``source`` compiled to an object by ``compiler``, without a warning."""
    done = subprocess.run([compiler, "-std=c++17", *flags, "-c", str(source), "-o",
                           str(source.with_suffix(".o"))], capture_output=True, text=True,
                          cwd=source.parent, env={**os.environ, "HIP_PLATFORM": "amd"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr


@pytest.mark.compile
@STRICT_BUILDS
def test_a_launcher_copies_a_state_into_results_it_is_not_given_in_place(
    target: str, compiler: str | None, flags: list[str], tmp_path: Path
) -> None:
    """The kernel of an optimizer step reads the donated state through its results'
    pointers: the launcher takes the state and the results, as the CPU entry does, and
    copies the state into a result on the device first unless they are one array.
    Compiled warning-free with the host code."""
    if compiler is None:
        pytest.skip(f"needs {'nvcc' if target == 'cuda' else 'hipcc'}")
    out = tmp_path / f"optimizer_step.{'cu' if target == 'cuda' else 'hip'}"
    assert main([str(ROOT / "examples/optimizer_step.tsr"), "-o", str(out)]) == 0
    source = out.read_text()
    start = source.index("int tessera_adamw(")
    launcher = source[start : source.index("\n}\n", start)]
    copy = "cudaMemcpyAsync" if target == "cuda" else "hipMemcpyAsync"
    kind = "cudaMemcpyDeviceToDevice" if target == "cuda" else "hipMemcpyDeviceToDevice"
    for result, state in (("out1", "state_m"), ("out2", "state_v")):
        assert (f"if ({result} != {state} && {copy}({result}, {state}, N * sizeof(float), "
                f"{kind}, stream)") in launcher, launcher  # fmt: skip
    assert "(out1, dw, out2, step, lr, w, out0, N);" in launcher, launcher
    _compiles_warning_free(compiler, flags, out)


#: Parameters named as the launcher's own parameters and locals, an intermediate named
#: ``grid``, and an int that sizes intermediates (nanoGPT's ``n_head``).
NAMES_OF_THE_LAUNCHER = """\
def f(base: Tensor["N", "D", f32], need: Tensor["D", "D", f32], own: Tensor["D", "D", f32],
      offset: Tensor["D", f32], status: Tensor["N", "D", f32], workspace: Tensor["N", "D", f32],
      stream: Tensor["N", "D", f32], *, n_head: int = 2) -> Tensor["N", "D", f32]:
    grid = relu(base @ need) + status
    h = grid.view(N, n_head, D // n_head).transpose(0, 1)
    att = softmax(h @ h.transpose(1, 2), axis=-1)
    heads = (att @ h).transpose(0, 1).reshape(N, D)
    k = softmax(heads @ own + offset, axis=-1) * workspace
    spread = (h @ h.transpose(1, 2)).max(axis=-1).sum(axis=0)
    return sum(k, axis=0)[None, :] + stream * grid + spread[:, None]
"""


@pytest.mark.compile
@STRICT_BUILDS
def test_a_launcher_names_nothing_of_the_function_twice(
    target: str, compiler: str | None, flags: list[str], tmp_path: Path
) -> None:
    """The launcher's workspace, stream and locals take other names where the function
    has a parameter or an intermediate of that name, and an int parameter that sizes an
    intermediate is a size of the workspace too: both failed to compile."""
    if compiler is None:
        pytest.skip(f"needs {'nvcc' if target == 'cuda' else 'hipcc'}")
    (tmp_path / "names.tsr").write_text(NAMES_OF_THE_LAUNCHER)
    out = tmp_path / f"names.{'cu' if target == 'cuda' else 'hip'}"
    assert main([str(tmp_path / "names.tsr"), "-o", str(out)]) == 0
    source = out.read_text()
    assert "tessera_f_workspace(std::int64_t n_head, std::int64_t N, std::int64_t D)" in source
    stream = "cudaStream_t" if target == "cuda" else "hipStream_t"
    assert f"void* workspace_, std::size_t workspace_bytes, {stream} stream_)" in source
    _compiles_warning_free(compiler, flags, out)
