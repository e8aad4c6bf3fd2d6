"""Debug builds' bounds checks (``check/bounds.py``): a tile kernel that indexes past the
end of a tensor is stopped at its ``.tsr`` line, with the index and the extent, on the
CPU, on OpenCL (PoCL) and on the simulated GPU (CUDA on both archs, HIP); the CUDA and
HIP host launchers compile with the checks; a plain build has none. Every example runs
clean and bit for bit alike under ``--debug`` with ``--debug-examples``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tessera
from tessera.cli.main import main
from tessera.runtime.kvcache import KVCache
from tessera.runtime.sentinel import BoundsError
from tessera.transpiler.graph.dims import parse_dim
from tessera.transpiler.graph.dtypes import DTYPES
from tessera.transpiler.tile.interpret import numpy_dtype

from .conftest import EXAMPLES
from .gpusim import load_hip, load_sycl, simulated_cupy, use_simulator
from .test_cuda import needs_gxx
from .test_hip import HIPCC
from .test_loader import _loader_module, assert_formatted
from .test_opencl import _platform
from .test_sycl import check_syntax, needs_sycl_headers

#: ``k`` has L rows but each of the S / T.m programs loads its own block of them: with
#: more programs than ``k`` has blocks, the last ones load past its end.
SOURCE = """\
@kernel
def shifted(q: Tensor["S", "D", f32], k: Tensor["L", "D", f32]) -> Tensor["S", "D", f32]:
    T = tile.context()
    a = tile.load(q, rows=T.m)
    b = tile.load(k, rows=T.m)
    return a + b
"""

#: A product whose operands go through shared memory (bf16: ``ldmatrix`` on sm_80), whose
#: shared accesses a debug build checks on the GPU targets.
MATMUL = """\
@kernel
def mm(a: Tensor["M", "K", bf16], b: Tensor["K", "N", bf16]) -> Tensor["M", "N", f32]:
    return matmul(a, b)
"""

MESSAGE = (
    r"kernel 'shifted' \(oob\.tsr:5\): load of 'k' out of bounds: index 8 on axis 0, which "
    r"has 8 elements \(the tile covers \[8, 12\)\)"
)

needs_opencl = pytest.mark.skipif(_platform() is not None, reason=f"needs PoCL: {_platform()}")


def _caught(lib: Any) -> None:
    """In range the debug build computes the sum; past the end of ``k`` it raises at the
    load's line; the failure is the call's alone."""
    rng = np.random.default_rng(3)
    q, k = (rng.standard_normal((8, 5)).astype(np.float32) for _ in range(2))
    np.testing.assert_array_equal(lib.shifted(q, k), q + k)
    with pytest.raises(BoundsError, match=MESSAGE):
        lib.shifted(rng.standard_normal((13, 5)).astype(np.float32), k)
    np.testing.assert_array_equal(lib.shifted(q, k), q + k)


def test_a_plain_build_checks_nothing() -> None:
    for target in ("cpu", "cuda"):  # OpenCL's and HIP's kernels are CUDA's emitter's
        plain = tessera.compile(SOURCE, "oob.tsr", target=target)
        assert "out_of_bounds" not in plain.source and "bounds" not in plain.ir("meta")
        debug = tessera.compile(SOURCE, "oob.tsr", target=target, debug=True)
        assert "out_of_bounds" in debug.source
        assert [(c["line"], c["tensor"]) for c in debug.ir("meta")["bounds"]] == [
            ("oob.tsr:4", "q"), ("oob.tsr:5", "k"), ("oob.tsr:1", "out")
        ]  # fmt: skip


@pytest.mark.execute
@pytest.mark.parametrize("defines", [[], ["L=8"]], ids=["masked", "unmasked"])
def test_an_index_past_the_end_is_caught_on_the_cpu(defines: list[str]) -> None:
    _caught(tessera.compile(SOURCE, "oob.tsr", target="cpu", defines=defines, debug=True).load())


@pytest.mark.execute
@needs_opencl
def test_an_index_past_the_end_is_caught_on_opencl() -> None:
    _caught(tessera.compile(SOURCE, "oob.tsr", target="opencl", defines=["L=8"], debug=True).load())


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize(
    ("target", "arch"), [("cuda", "sm_90a"), ("hip", "gfx90a"), ("sycl", None)]
)
def test_an_index_past_the_end_is_caught_on_the_simulated_gpu(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SYCL's host function reads the fault record back itself and throws
    ``std::out_of_range``, which the simulator's caller raises as ``BoundsError``."""
    use_simulator(monkeypatch, simulated_cupy("sm_90a"))
    program = tessera.compile(SOURCE, "oob.tsr", target=target, arch=arch, defines=["L=8"],
                              debug=True)  # fmt: skip
    _caught(load_gpu(program))


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_python_loader_of_a_debug_build_raises_at_the_tsr_line(
    arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``--python-loader`` module, which a project runs without Tessera, reads the
    fault record after each launch and raises its own ``BoundsError`` (an
    ``IndexError``) with the runtime's text; in range it computes the sum."""
    cupy = simulated_cupy(arch)
    use_simulator(monkeypatch, cupy)
    program = tessera.compile(SOURCE, "oob.tsr", target="cuda", arch=arch, defines=["L=8"],
                              debug=True)  # fmt: skip
    module = _loader_module(program, tmp_path, cupy, monkeypatch)
    assert_formatted(tmp_path / "k_loader.py")  # its checks' table too, as black prints it
    rng = np.random.default_rng(5)
    q, k = (rng.standard_normal((8, 5)).astype(np.float32) for _ in range(2))
    np.testing.assert_array_equal(module.shifted(cupy.asarray(q), cupy.asarray(k)).get(), q + k)
    long_q = cupy.asarray(rng.standard_normal((13, 5)).astype(np.float32))
    with pytest.raises(IndexError, match=MESSAGE) as caught:
        module.shifted(long_q, cupy.asarray(k))
    assert type(caught.value).__name__ == "BoundsError"
    np.testing.assert_array_equal(module.shifted(cupy.asarray(q), cupy.asarray(k)).get(), q + k)


@pytest.mark.compile
@pytest.mark.parametrize("target", ["cuda", "hip"])
def test_the_host_launchers_check_bounds(target: str, tmp_path: Path) -> None:
    """The launcher clears the fault record, reads it back after the launch and prints
    the failed check, and checks what the launch wrote for NaN and infinity; nvcc and
    hipcc build it, and the shared-memory checks of a product, warning-free."""
    compiler = shutil.which("nvcc") if target == "cuda" else HIPCC
    if compiler is None:
        pytest.skip(f"needs {'nvcc' if target == 'cuda' else 'hipcc'}")
    path = tmp_path / "oob.tsr"
    path.write_text(SOURCE + "\n\n" + MATMUL)
    out = tmp_path / f"oob.{'cu' if target == 'cuda' else 'hip'}"
    assert main([str(path), "--target", target, "--debug", "-D", "L=8", "-o", str(out)]) == 0
    text = out.read_text()
    assert "tsr_host::check_bounds(tsr_fault, stream)" in text
    assert "\"kernel 'shifted' (oob.tsr:5): load of 'k' on axis 0\"," in text
    assert "tsr_host::check_finite(out, D*S, 4, 0x7f800000u, " in text
    assert "tsr_smem_index(tsr_fault, " in text
    flags = (["-gencode=arch=compute_80,code=sm_80", "-Werror", "all-warnings", "-Xcompiler",
              "-Wall,-Wextra"] if target == "cuda"
             else ["--offload-arch=gfx90a", "-Wall", "-Wextra", "-Werror"])  # fmt: skip
    done = subprocess.run([compiler, "-std=c++17", *flags, "-c", "-o", str(tmp_path / "oob.o"),
                           str(out)], capture_output=True, text=True, cwd=tmp_path,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.compile
@needs_sycl_headers
def test_a_sycl_debug_build_parses_warning_free(tmp_path: Path) -> None:
    """Its kernels check global and shared accesses; its host functions pass and read
    the fault record."""
    program = tessera.compile(SOURCE + "\n\n" + MATMUL, "oob.tsr", target="sycl", debug=True)
    assert "tsr_debug::check_bounds(tsr_fault, queue, done);" in program.source
    assert "tsr_smem_index(tsr_fault, " in program.source
    check_syntax({"oob": program.source}, tmp_path)


#: Sizes for the examples: ragged, and C a multiple of 64 (decoder_block reshapes it); T
#: within decode's rolling window (6), and S a cache that holds two calls' appends.
_SIZES = {"C": 128, "T": 5, "S": 19}
_DEFAULT = 96
#: The simulated GPU runs a block's threads one after another: few heads.
_SIMULATED_SIZES = {**_SIZES, "B": 2, "H": 2}


def _inputs(function: dict[str, Any], sizes: dict[str, int] = _SIZES) -> dict[str, Any]:
    """Random arguments; a cache parameter an empty ``KVCache`` (its appends then fit)."""
    rng = np.random.default_rng(1)
    args: dict[str, Any] = {}
    caches = {c["name"]: c for c in function.get("caches", ())}
    for p in function["params"]:
        cache = p["name"].rsplit("_", 1)[0]
        if cache in caches and p["name"] in (f"{cache}_v", f"{cache}_lengths"):
            continue
        if cache in caches:  # its K: the cache's shape and dtype
            shape = [parse_dim(d).value({s: sizes.get(s, _DEFAULT) for s in parse_dim(d).symbols()})
                     for d in p["dims"]]  # fmt: skip
            window = caches[cache]["window"]
            args[cache] = KVCache.zeros(*map(int, shape), numpy_dtype(DTYPES[p["dtype"]]),
                                        window=window)  # fmt: skip
        elif p["kind"] == "scalar":
            args[p["name"]] = {"bool": False, "int": 1}.get(p["type"], 0.5)
        elif p["io"] != "out":
            dims = [parse_dim(d) for d in p["dims"]]
            shape = tuple(int(d.value({s: sizes.get(s, _DEFAULT) for s in d.symbols()}))
                          for d in dims)  # fmt: skip
            if p["dtype"] == "i4":  # two to a byte along the last axis
                shape = (*shape[:-1], shape[-1] // 2)
            args[p["name"]] = rng.standard_normal(shape).astype(numpy_dtype(DTYPES[p["dtype"]]))
    return args


@pytest.mark.execute
@pytest.mark.parametrize(
    ("target", "arch"),
    [
        ("cpu", None),
        ("opencl", None),
        ("cuda", "sm_80"),
        ("cuda", "sm_90a"),
        ("hip", "gfx90a"),
        ("sycl", None),
    ],
    ids=["cpu", "opencl", "cuda-sm_80", "cuda-sm_90a", "hip", "sycl"],
)
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_runs_clean_under_debug(
    path: Path, target: str, arch: str | None, request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Global and shared-memory checks alike: CUDA, HIP and SYCL on the simulated GPU."""
    if not request.config.getoption("--debug-examples"):
        pytest.skip("builds every example twice: run with --debug-examples")
    if target == "opencl" and _platform() is not None:
        pytest.skip(f"needs PoCL: {_platform()}")
    if target in ("cuda", "hip", "sycl"):
        if shutil.which("g++") is None:
            pytest.skip("needs g++ (the GPU simulator is built with it)")
        use_simulator(monkeypatch, simulated_cupy(arch if target == "cuda" else "sm_80"))

    plain = load_gpu(tessera.compile_file(path, target=target, arch=arch))
    program = tessera.compile_file(path, target=target, arch=arch, debug=True)
    debug = load_gpu(program)
    for function in program.ir("meta")["functions"]:
        args = _inputs(function, _SIZES if target in ("cpu", "opencl") else _SIMULATED_SIZES)
        want = getattr(plain, function["name"])(**args)
        have = getattr(debug, function["name"])(**args)
        for a, b in zip(*(r if isinstance(r, tuple) else (r,) for r in (want, have)), strict=True):
            if isinstance(a, KVCache):  # the one cache, appended to twice: each half once
                assert a is b, function["name"]
                continue
            assert _host(a).tobytes() == _host(b).tobytes(), function["name"]


def _host(x: Any) -> np.ndarray:
    """A result as a host array (the simulated GPU's arrays copy out with ``get``)."""
    return x.get() if hasattr(x, "get") else np.asarray(x)


def load_gpu(program: Any) -> Any:
    """A program's functions on its target: HIP and SYCL files on the simulated GPU, as
    ``load_hip`` and ``load_sycl`` run them, the others as ``load`` does."""
    target = program.ir("meta")["target"]
    loaders = {"hip": load_hip, "sycl": load_sycl}
    return loaders[target](program) if target in loaders else program.load()
