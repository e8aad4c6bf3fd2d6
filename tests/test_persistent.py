"""Persistent GEMMs on sm_90a (``Schedule(persistent=True)``), on the simulated GPU.

One program per multiprocessor loops over output tiles in groups of rows, its producer
running ahead into the next tile through the same stages. The simulated GPU here has 3
multiprocessors, so the sizes below give programs several tiles each (with a ragged
last group of rows), exactly as many tiles as programs, and fewer; K of one step, of
several, not a multiple of the step, of zero, and rows TMA cannot copy. The stages'
phases running on across tiles are what can go wrong: a test frees nothing before a
tile's first copies and must see the poison the simulator leaves in a refilled stage.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera

from . import gpusim
from .conftest import ROOT
from .gpusim import simulated_cupy, simulated_driver, use_simulator
from .reference import f64
from .test_cuda import _check_shared_memory, _nvcc, needs_gxx, needs_nvcc, no_gpu
from .test_gpusim import _bf16, _check
from .test_loader import _loader_module

#: The simulated GPU's multiprocessors: the programs of a persistent launch.
UNITS = 3

SOURCE = """\
@kernel.schedule(Schedule(persistent=True))
def mm(A: Tensor["M", "K", bf16], B: Tensor["K", "N", bf16]) -> Tensor["M", "N", f32]:
    return A @ B


@kernel.schedule(Schedule(persistent=True))
def mlp(A: Tensor["M", "K", f16], B: Tensor["K", "N", f16],
        bias: Tensor["N", f32]) -> Tensor["M", "N", f16 @accum(f32)]:
    return silu(A @ B + bias)


@kernel.schedule(Schedule(persistent=True))
def linear_fp8(x: Tensor["M", "K", fp8_e4m3], w: Tensor["N", "K", fp8_e4m3],
               bias: Tensor["N", f32]) -> Tensor["M", "N", bf16 @accum(f32)]:
    return x @ w.T + bias


@kernel.schedule(Schedule(persistent=True))
def mm_f32(A: Tensor["M", "K", f32], B: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return A @ B
"""

#: (M, N, K): tiles of 128 x 256 over 3 programs. 9 tiles, K ragged and of odd rows
#: (element copies of A); 4 tiles, 10 steps each; 20 tiles in 8 + 2 rows of tiles,
#: one step each; one tile; 3 tiles, K of zero.
SIZES = [(300, 600, 301), (129, 257, 600), (1200, 300, 40), (70, 136, 64), (300, 5, 0)]


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def _build(monkeypatch: pytest.MonkeyPatch, edit: Any = None) -> list[tuple[str, tuple[int, ...]]]:
    """Run the runtime over the simulated sm_90a (the generated file changed by ``edit``
    where given); the launches it makes, by kernel and grid."""
    cupy = simulated_cupy("sm_90a", multiprocessors=UNITS)
    if edit is not None:
        cupy.RawModule = functools.partial(lambda real, code, **kw: real(edit(code), **kw),
                                           cupy.RawModule)  # fmt: skip
    use_simulator(monkeypatch, cupy)
    launches: list[tuple[str, tuple[int, ...]]] = []
    launch = gpusim._Launcher.__call__

    def recorded(self: Any, grid: Any, *args: Any, **kw: Any) -> None:
        launches.append((self.name, tuple(grid)))
        launch(self, grid, *args, **kw)

    monkeypatch.setattr(gpusim._Launcher, "__call__", recorded)
    return launches


@pytest.fixture(scope="module")
def program() -> tessera.Program:
    return tessera.compile(SOURCE, filename="persistent.tsr", target="cuda", arch="sm_90a")


def test_the_schedule_asks_and_specialized_gemms_loop_over_tiles(
    program: tessera.Program,
) -> None:
    kernels = re.split(r'^extern "C" __global__', program.source, flags=re.M)[1:]
    looping = {re.search(r"\) (\w+)\(", k).group(1) for k in kernels if "tsr_tile" in k}
    assert looping == {"mm", "mlp", "linear_fp8"}  # f32 products are not on wgmma: no producer
    launches = {f["name"]: f["launches"] for f in program.ir("meta")["functions"]}
    assert all(launches[f][0].get("persistent") for f in looping)
    assert "persistent" not in launches["mm_f32"][0]
    assert str(program.inspect_ir("sched")).count("  persistent\n") == 4


@pytest.mark.parametrize(
    ("schedule", "persistent"),
    [("persistent=[True, False]", False), ("persistent=[True]", True), ("warps=8", False)],
)
def test_a_space_of_both_keeps_the_heuristics_choice(schedule: str, persistent: bool) -> None:
    """The schedule scores both alike; among equals the heuristic's choice wins."""
    source = SOURCE.split("\n\n\n")[0].replace("persistent=True", schedule)
    sched = tessera.compile(source, target="cuda", arch="sm_90a", defines={"M": 4096, "N": 4096,
                            "K": 4096}).inspect_ir("sched")  # fmt: skip
    assert ("  persistent\n" in str(sched)) is persistent


@pytest.mark.execute
@needs_gxx
def test_persistent_gemms_match_float64(
    program: tessera.Program, monkeypatch: pytest.MonkeyPatch
) -> None:
    launches = _build(monkeypatch)
    _check_cases(program.load(), SIZES, launches, UNITS)


@pytest.mark.execute
@needs_gxx
def test_the_python_loader_launches_a_program_per_multiprocessor(
    program: tessera.Program, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launches = _build(monkeypatch)
    cupy = simulated_cupy("sm_90a", multiprocessors=UNITS)
    loader = _loader_module(program, tmp_path, cupy, monkeypatch, simulated_driver())
    rng = np.random.default_rng(3)
    a, b = _bf16(rng, 300, 72), _bf16(rng, 72, 600)
    out = loader.mm(cupy.asarray(a.view(np.uint16)), cupy.asarray(b.view(np.uint16)))
    _check(out.get(), f64(a) @ f64(b), 1e-5)
    assert launches == [("mm", (UNITS, 1, 1))]


@pytest.mark.gpu
@pytest.mark.execute
@pytest.mark.skipif(no_gpu() is not None, reason=f"needs a GPU: {no_gpu()}")
def test_persistent_gemms_match_float64_on_a_gpu(program: tessera.Program) -> None:
    """On an sm_90 GPU, also with more tiles than an H100 or H200 has multiprocessors."""
    from tessera.runtime.cuda import _cupy, multiprocessors

    if _cupy().cuda.Device().compute_capability != "90":
        pytest.skip("needs an sm_90 GPU (H100, H200)")
    _check_cases(program.load(), [*SIZES, (2100, 4400, 200)], [], multiprocessors())


@pytest.mark.gpu
@pytest.mark.execute
@pytest.mark.skipif(no_gpu() is not None, reason=f"needs a GPU: {no_gpu()}")
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="needs compute-sanitizer")
def test_persistent_gemms_pass_memcheck() -> None:
    done = subprocess.run(
        ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "86",
         "--print-limit", "20", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-m", "gpu", "-k", "match_float64_on_a_gpu", str(Path(__file__))],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert re.search(r"ERROR SUMMARY: 0 errors", done.stdout + done.stderr)


def _check_cases(
    lib: Any, sizes: list[tuple[int, int, int]], launches: list[Any], units: int
) -> None:
    """Every function at every size against float64; with ``launches`` recorded, each
    persistent launch ran one program per multiprocessor, or per tile where fewer."""
    rng = np.random.default_rng(44)
    for m, n, k in sizes:
        tiles = -(-m // 128) * -(-n // 256)
        a, b = (rng.standard_normal(s) for s in ((m, k), (k, n)))
        bias = rng.standard_normal(n).astype(np.float32)
        a16, b16 = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
        out = np.full((m, n), np.nan, np.float32)
        lib.mm(a16, b16, out=out)
        _check(out, f64(a16) @ f64(b16), 1e-5)
        if launches:
            assert launches[-1] == ("mm", (min(tiles, units), 1, 1))
        h16, w16 = a.astype(np.float16), b.astype(np.float16)
        out16 = np.full((m, n), np.nan, np.float16)
        lib.mlp(h16, w16, bias, out=out16)
        _check(out16, _silu(f64(h16) @ f64(w16) + bias), 2e-3)
        x8, w8 = a.astype(ml_dtypes.float8_e4m3fn), b.T.copy().astype(ml_dtypes.float8_e4m3fn)
        out8 = np.full((m, n), np.nan, ml_dtypes.bfloat16)
        lib.linear_fp8(x8, w8, bias, out=out8)
        _check(out8, f64(x8) @ f64(w8).T + bias, 1e-2)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((70, 33), (33, 300)))
    out32 = np.full((70, 300), np.nan, np.float32)
    lib.mm_f32(a, b, out=out32)
    _check(out32, f64(a) @ f64(b), 1e-5)


@pytest.mark.execute
@needs_gxx
def test_a_tile_refilling_stages_the_last_tile_still_reads_is_caught(
    program: tessera.Program, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the wait for a stage to be freed before a tile's first copies, the
    producer refills a stage whose batch of the tile before still runs."""

    def early(code: str) -> str:
        waits = re.findall(r"if \(\(?tsr_kt(?: \+ 1\))? >= 4\) ", code)
        assert len(waits) == 6, waits  # the first two stages of a tile, in 3 kernels
        return re.sub(r"if \(\(?tsr_kt(?: \+ 1\))? >= 4\) ", "if (false) ", code)

    _build(monkeypatch, early)
    rng = np.random.default_rng(1)
    a, b = _bf16(rng, 300, 301), _bf16(rng, 301, 600)
    out = np.full((300, 600), np.nan, np.float32)
    program.load().mm(a, b, out=out)
    assert np.isnan(out).any()


@pytest.mark.compile
@needs_nvcc
def test_persistent_gemms_compile_without_spills_and_fit_shared_memory(
    program: tessera.Program, tmp_path: Path
) -> None:
    _, report = _nvcc("persistent.tsr", "sm_90a", tmp_path, SOURCE)
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill",
                        report)  # fmt: skip
    assert len(frames) == 4 and {f for frame in frames for f in frame} == {"0"}, report
    _check_shared_memory(program, report)
