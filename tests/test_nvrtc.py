"""PTX, cubin and ptxas's resource report, built by NVRTC (``--emit ptx``, ``--emit
cubin``, ``--emit meta --resources``).

The report is checked against the cubin itself: ``cuobjdump -res-usage`` reads the
registers, stack and shared memory out of the binary that NVRTC wrote, so a parse that
took a number from the wrong line or the wrong kernel fails here.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import tessera
from tessera.cli.main import main
from tessera.transpiler.target.nvrtc import NvrtcError, Resources, build, parse_report

from .conftest import COMPILED_SOURCES, ROOT
from .test_cuda import ARCHS, CUOBJDUMP, cuobjdump, needs_nvrtc

REPORT = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'scale' for 'sm_80'
ptxas info    : Function properties for scale
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, 368 bytes cmem[0]
ptxas info    : Compile time = 2.000 ms
ptxas info    : Compiling entry function 'attention' for 'sm_80'
ptxas info    : Function properties for attention
ptxas         .     24 bytes stack frame, 8 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 2 barriers, 33280 bytes smem, 416 bytes cmem[0]
"""

EXAMPLES = ["examples/norms.tsr", "examples/attention.tsr", "examples/mlp.tsr"]


def test_the_report_is_read_per_kernel() -> None:
    assert parse_report(REPORT) == {
        "scale": Resources(12, 0, 0, 0, 0, 0),
        "attention": Resources(255, 33280, 2, 24, 8, 16),
    }


def test_an_incomplete_report_is_an_error() -> None:
    with pytest.raises(NvrtcError, match="'scale' is incomplete"):
        parse_report(REPORT.replace("Used 12 registers", "Used registers"))


def _launched(meta: dict) -> set[str]:
    return {launch["kernel"] for f in meta["functions"] for launch in f["launches"]}


def _res_usage(cubin: Path) -> dict[str, dict[str, int]]:
    """cuobjdump's reading of the binary: per function, REG, STACK, SHARED, LOCAL."""
    found = re.findall(r"Function (\w+):\s*\n\s*(.*)", cuobjdump("-res-usage", cubin))
    return {
        name: {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", usage)} for name, usage in found
    }


@pytest.mark.compile
@needs_nvrtc
@pytest.mark.skipif(CUOBJDUMP is None, reason="needs cuobjdump (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", EXAMPLES)
def test_the_report_is_what_the_cubin_holds(path: str, arch: str, tmp_path: Path) -> None:
    meta_file, cubin = tmp_path / "meta.json", tmp_path / "kernels.cubin"
    common = [str(ROOT / path), "--target", "cuda", "--arch", arch]
    assert main([*common, "--emit", "meta", "--resources", "-o", str(meta_file)]) == 0
    assert main([*common, "--emit", "cubin", "-o", str(cubin)]) == 0
    meta = json.loads(meta_file.read_text())
    report, usage = meta["resources"]["kernels"], _res_usage(cubin)
    assert meta["resources"]["compiler"].startswith("NVRTC ")
    assert set(report) == _launched(meta) and set(usage) >= set(report)
    # An sm_90 cubin counts the 1 KiB of shared memory the hardware keeps per block.
    reserved = 1024 if arch.startswith("sm_90") else 0
    for name, r in report.items():
        u = usage[name]
        got = (r["registers"], r["stack_frame_bytes"], r["shared_bytes"] + reserved)
        assert got == (u["REG"], u["STACK"], u["SHARED"]), name
        assert r["spill_store_bytes"] == r["spill_load_bytes"] == u["LOCAL"] == 0, name


#: How far the Tile IR's register estimate may be from ptxas's count, by the size of the
#: estimate (bench/registers.py measures every example and library kernel; the goal is
#: 15%, and 92 of 101 on sm_80, 89 on sm_90a are within it). A kernel that holds tiles
#: (an estimate of 64 or more: products, attention) is within 25%: the largest are
#: skinny_gemm on sm_80 (+25%) and decode_attention on sm_90a (-25%, whose epilogue
#: ptxas computes as an array of its own there and not on sm_80). A row or elementwise
#: kernel (under 64) is within 38%: there ptxas's choice of how many loads of a walk to
#: keep in flight moves the count by 8 registers or more between archs for the same code
#: (rms 32 and 40, pre_norm 32 and 40, layernorm 48 and 40), over 15% of 32 or 40; the
#: largest are pre_norm on sm_80 (+38%) and quantize_i4_k0 (+33%).
REGISTER_TOLERANCE = {"tiles": 0.25, "rows": 0.38}
#: Kernels the model is known to miss by more, and why. gemm_i8 adds one dot's split
#: into two accumulators (``h`` and ``s - 4096 h``): ptxas keeps ``h`` as a tile of its
#: own beside them, which the model, reading ``h`` as lazy, does not count (140 against
#: 196 on sm_80, -29%).
KERNEL_TOLERANCE = {"gemm_i8": 0.32}
#: The estimate from which a kernel counts as holding tiles.
TILE_KERNEL_REGISTERS = 64


@pytest.mark.compile
@needs_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", COMPILED_SOURCES)
def test_the_register_estimate_is_near_ptxas_count(path: str, arch: str) -> None:
    """Every kernel of every example (and, in the exhaustive tier, of every library
    file), each arch: the estimate within its class's REGISTER_TOLERANCE of what ptxas
    allocates."""
    program = tessera.compile_file(ROOT / path, target="cuda", arch=arch)
    meta = program.ir("meta")
    counted = build(program.source, arch, meta["build"]["options"]).resources
    assert meta["analysis"]
    for entry in meta["analysis"]:
        estimate, registers = entry["registers_estimate"], counted[entry["kernel"]].registers
        error = (estimate - registers) / registers
        kind = "tiles" if estimate >= TILE_KERNEL_REGISTERS else "rows"
        tolerance = KERNEL_TOLERANCE.get(entry["kernel"], REGISTER_TOLERANCE[kind])
        assert abs(error) <= tolerance, (entry["kernel"], estimate, registers)


@pytest.mark.compile
@needs_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_names_every_kernel_for_its_arch(arch: str) -> None:
    program = tessera.compile_file(ROOT / "examples/attention.tsr", target="cuda", arch=arch)
    ptx = program.inspect_ir("ptx")
    assert isinstance(ptx, str) and re.search(rf"^\.target {arch}\b", ptx, re.M), ptx[:400]
    entries = set(re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.M))
    assert entries == _launched(program.ir("meta"))
    assert program.inspect_ir("cubin")[:4] == b"\x7fELF"


#: What CuPy's ``RawModule`` adds to a module's options on an H100: ``-ftz=true``,
#: ``--device-as-default-execution-space``, and the GPU's generic ``-arch=sm_90`` last.
CUPY_OPTIONS = ["-ftz=true", "--device-as-default-execution-space"]


@pytest.mark.compile
@needs_nvrtc
@pytest.mark.skipif(CUOBJDUMP is None, reason="needs cuobjdump (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", EXAMPLES)
def test_cupy_builds_every_file_for_an_h100(path: str, arch: str, tmp_path: Path) -> None:
    """The runtime and the generated loader compile with CuPy, which adds its own options
    and the GPU's ``-arch=sm_90`` to the metadata's. An sm_90a file names ``-arch=sm_90a``
    in its options, and NVRTC, given both, must still build for sm_90a: wgmma exists
    nowhere else."""
    program = tessera.compile_file(ROOT / path, target="cuda", arch=arch)
    options = [*program.ir("meta")["build"]["options"], *CUPY_OPTIONS]
    cubin = tmp_path / "kernels.cubin"
    cubin.write_bytes(build(program.source, "sm_90", options).cubin)
    want = "sm_90a" if arch == "sm_90a" else "sm_90"
    assert re.search(rf"^\s*code for {want}$", cuobjdump("-sass", cubin), re.M)


def test_without_nvrtc_the_dump_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    status = main([str(ROOT / "examples/norms.tsr"), "--target", "cuda", "--emit", "ptx"])
    err = capsys.readouterr().err
    assert status == 2 and "pip install cuda-bindings" in err and err.count("\n") == 1, err


def test_compiling_never_runs_nvrtc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dumps are built on request only: a compile, its target code and metadata do
    not depend on NVRTC being installed."""
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    program = tessera.compile_file(ROOT / "examples/norms.tsr", target="cuda")
    assert "__global__" in program.source and "resources" not in program.ir("meta")
