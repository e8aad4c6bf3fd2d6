"""Names from the source that C, the C library or the generated code already have.

A size, a loop counter or a kernel may be named anything Python allows. Sizes and
offsets share one namespace in the Tile IR (``pid_m``, a loop's ``kb``), and the
generated code declares names of its own (a loop's ``i``, a lane's ``e``): a size or
counter that took one of them was hidden by it, and the kernel computed with the wrong
value (rmsnorm over sizes ``r`` and ``i`` was off by 10 on the CPU; a tile kernel whose
loop counter was ``e`` or ``i`` was wrong on OpenCL). A kernel named like a C library
function (``norm``, ``exp``, ``printf``) did not compile for CUDA or HIP, nor one named
like an OpenCL built-in (``barrier``) for OpenCL; a parameter named like CUDA's thread
index or a size named like a C macro (``INFINITY``) did not compile anywhere, and a name
reserved to the implementation (``__shared__``) hung the compiler. Each case runs on
every backend, against the float64 reference, outputs poisoned first.
"""

from __future__ import annotations

import keyword
import re
import shutil
import subprocess
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.transpiler.target.header import Section, split
from tessera.transpiler.target.naming import (
    C_KEYWORDS,
    C_LIBRARY,
    GPU_BUILTINS,
    OPENCL_BUILTINS,
)
from tessera.transpiler.target.render import environment, header
from tessera.transpiler.target.simt_dialect import DIALECTS
from tessera.transpiler.target.simt_layout import FRAGMENT_SHAPES
from tessera.transpiler.target.simt_tiles import WGMMA_FORMS
from tessera.transpiler.target.sycl_launcher import LAUNCHER_NAMES

from .everywhere import EVERY_TARGET, load_everywhere
from .gpusim import simulated_cupy, simulated_driver, use_simulator
from .reference import attention, f64, rmsnorm
from .test_cpu import STRICT
from .test_cuda import ARCHS, NVCC, _cupy_put, _cupy_take, _nvcc, needs_gxx, needs_nvcc
from .test_gpusim import _library
from .test_hip import HIPCC, _hipcc_warning_free, needs_hipcc
from .test_loader import _loader_module
from .test_opencl import _platform
from .test_sycl import check_syntax, needs_sycl_headers

SOURCE = """\
@kernel
def norm(x: Tensor["new", "i", f32], w: Tensor["i", f32]) -> Tensor["new", "i", f32]:
    return rmsnorm(x, w, eps=1e-6)

@kernel
def exp(A: Tensor["pid_m", "kb", bf16],
        B: Tensor["kb", "max", bf16]) -> Tensor["pid_m", "max", f32]:
    return A @ B

@kernel
def printf(q: Tensor["lambda", "t", "cupy", bf16 @accum(f32)],
           k: Tensor["lambda", "t", "cupy", bf16], v: Tensor["lambda", "t", "cupy", bf16],
           *, causal: bool) -> Tensor["lambda", "t", "cupy", bf16]:
    T = tile.context()
    Qb = tile.load(q, rows=T.m, cols=T.d)
    acc = tile.zeros((T.m, T.d), f32)
    m = tile.full((T.m,), -INF)
    l = tile.zeros((T.m,), f32)
    for e in tile.range_n(k.shape, T.n, prefetch=2):
        Kb = tile.load(k, e, cols=T.d)
        Vb = tile.load(v, e, cols=T.d)
        S = tile.dot(Qb, tile.transpose(Kb)) * tile.rsqrt(float(q.shape[2]))
        if causal:
            tile.mask_causal(S, tile.row_index(), tile.col_index(e))
        P, m_c, l_c = tile.softmax_online(S)
        acc, m, l = tile.softmax_accumulate(acc, m, l, P, Vb, m_c, l_c)
    return tile.cast(acc / l[:, None], bf16)

@kernel
def barrier(threadIdx: Tensor["INFINITY", "__shared__", f32],
            smem: Tensor["__shared__", f32]) -> Tensor["INFINITY", "__shared__", f32]:
    return rmsnorm(threadIdx, smem, eps=1e-6)

@kernel
def shadowing(x: Tensor["R", "C", f32], w: Tensor["C", f32],
              *, eps: float = 1e-6) -> Tensor["R", "C", f32]:
    T = tile.context()
    rows = tile.load(x, rows=T.m)
    sum_sq = rows * tile.rsqrt(tile.sum(rows * rows, axis=1) / float(x.shape[-1]) + eps)[:, None]
    row_sum = sum_sq * tile.load(w)[None, :]
    return row_sum
"""

TARGETS = [("cpu", None), ("opencl", None), ("cuda", "sm_80"), ("cuda", "sm_90a"),
           ("hip", "gfx90a"), ("loader", "sm_80"), ("loader", "sm_90a")]  # fmt: skip


@pytest.mark.compile
@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_with_nvcc_warning_free(arch: str, tmp_path: Path) -> None:
    _nvcc("names.tsr", arch, tmp_path, text=SOURCE)


@pytest.mark.compile
@needs_hipcc
def test_compiles_with_hipcc_warning_free(tmp_path: Path) -> None:
    _hipcc_warning_free(tessera.compile(SOURCE, "names.tsr", target="hip").source, tmp_path)


@pytest.fixture(params=TARGETS, ids=[f"{t}-{a}" if a else t for t, a in TARGETS])
def library(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The functions on a backend: CUDA and HIP on the simulated GPU, directly and (CUDA)
    through the ``--python-loader`` module, whose sizes are Python names."""
    target, arch = request.param
    if target == "opencl" and _platform() is not None:
        pytest.skip(f"needs pyopencl and PoCL: {_platform()}")
    if target == "loader":
        cupy = simulated_cupy(arch)
        use_simulator(monkeypatch, cupy)
        program = tessera.compile(SOURCE, "names.tsr", target="cuda", arch=arch)
        module = _loader_module(program, tmp_path, cupy, monkeypatch, simulated_driver())
        return LoaderCalls(module, _result)
    functions = _library(SOURCE, target, arch, monkeypatch)
    return functions if target in ("cuda", "hip") else HostCalls(functions, _result)


#: The shape and dtype of a function's result, from its name and arguments.
Result = Callable[[str, tuple[Any, ...]], tuple[tuple[int, ...], np.dtype]]


def _result(name: str, args: tuple[np.ndarray, ...]) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of a function's result, from its arguments."""
    if name == "exp":
        return (args[0].shape[0], args[1].shape[1]), np.dtype(np.float32)
    return args[0].shape, args[0].dtype


class HostCalls:
    """Host functions called with a result array of NaNs (the simulated GPU poisons
    the arrays it allocates itself); ``result`` gives its shape and dtype from the
    function's name and arguments."""

    def __init__(self, functions: Any, result: Result) -> None:
        self.functions = functions
        self.result = result

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **scalars: Any) -> np.ndarray:
            shape, dtype = self.result(name, args)
            out = np.full(shape, np.nan, dtype=dtype)
            getattr(self.functions, name)(*args, out=out, **scalars)
            return out

        return call


class LoaderCalls:
    """The loader's functions, called on cupy arrays as a project calls them."""

    def __init__(self, module: Any, result: Result) -> None:
        self.module = module
        self.result = result

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **scalars: Any) -> np.ndarray:
            put = [_cupy_put(a) if isinstance(a, np.ndarray) else a for a in args]
            return _cupy_take(
                getattr(self.module, name)(*put, **scalars), self.result(name, args)[1]
            )

        return call


def _bf16(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)


def _check_rmsnorm(function: Any, rows: int, cols: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    w = rng.standard_normal(cols, dtype=np.float32)
    out = function(x, w)
    assert not np.isnan(f64(out)).any()
    np.testing.assert_allclose(f64(out), rmsnorm(x, w, 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_sizes_named_like_keywords_and_the_generated_codes_own_names(library: Any) -> None:
    _check_rmsnorm(library.norm, 37, 53, seed=11)


@pytest.mark.execute
@needs_gxx
def test_names_the_dialects_and_their_headers_declare(library: Any) -> None:
    _check_rmsnorm(library.barrier, 29, 45, seed=14)


@pytest.mark.execute
@needs_gxx
def test_sizes_named_like_program_ids_and_loop_counters(library: Any) -> None:
    rng = np.random.default_rng(12)
    a, b = _bf16(rng, 133, 301), _bf16(rng, 301, 70)
    out = library.exp(a, b)
    np.testing.assert_allclose(f64(out), f64(a) @ f64(b), rtol=1e-4, atol=1e-3)


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize("causal", [False, True])
def test_a_loop_counter_named_like_the_generated_codes_own(library: Any, causal: bool) -> None:
    rng = np.random.default_rng(13)
    q, k, v = (_bf16(rng, 2, 77, 64) for _ in range(3))
    out = library.printf(q, k, v, causal=causal)
    want = attention(f64(q), f64(k), f64(v), causal=causal)
    assert np.abs(f64(out) - want).max() < 2e-2


@pytest.mark.execute
@needs_gxx
def test_source_names_that_a_temporary_would_be_called(library: Any) -> None:
    """The source's ``sum_sq`` and ``row_sum`` keep their names, and the unnamed sum of
    squares, which would be called ``sum_sq``, is called otherwise: neither hides the
    other."""
    _check_rmsnorm(library.shadowing, 41, 67, seed=15)


@pytest.mark.parametrize("target", ["cpu", "cuda", "opencl"])
def test_a_temporary_keeps_clear_of_the_source_names(target: str) -> None:
    """The temporary steps aside (``sum_sq_tmp``), not the source's name (``sum_sq_1``)."""
    source = tessera.compile(SOURCE, "names.tsr", target=target).source
    kernel = source[source.index("// ---- shadowing") :]
    declared = re.findall(r"\b(?:float|float\* const) (\w+)\b", kernel)
    assert "sum_sq_tmp" in declared, declared
    assert not re.search(r"\b(sum_sq|row_sum)_\d\b", kernel)


def _defined(text: str) -> set[str]:
    """The names a tile-primitives header defines, in every section."""
    preamble, sections, _ = split(text)
    return set().union(Section("", preamble).defines, *(s.defines for s in sections))


def _template_words(path: str) -> tuple[set[str], set[str]]:
    """The names a module template writes itself (``area``, ``lid``), outside its Jinja
    tags and comments, and the suffixes it appends to names it is given (``_launch``)."""
    text = resources.files("tessera.templates").joinpath(path).read_text()
    text = re.sub(r"\{#.*?#\}|\{%.*?%\}|//[^\n]*", " ", text, flags=re.S)
    suffixes = set(re.findall(r"\}\}(_\w+)", text))
    text = re.sub(r"\{\{.*?\}\}\w*", " ", text, flags=re.S)
    return set(re.findall(r"\b[A-Za-z_]\w*", text)), suffixes


def _generated_names() -> list[str]:
    """Every name the headers and the module templates of every target declare, read
    from them (a TMA copy of each rank and a wgmma of each form included), the names the
    templates make of a kernel's and a program id's (``f_launch``, ``pid_m_count``) and
    of a function's (``tessera_f``), and ``main``: each a kernel, a parameter and a size
    below."""
    names = _defined(header("cpu/tessera_tile.hpp"))
    wgmma = [(dtype, 64, form) for dtype in WGMMA_FORMS for form in ("ss", "rs")]
    for dialect in DIALECTS.values():
        primitives = (
            environment("simt")
            .get_template("tessera_tile.j2")
            .render(
                d=dialect,
                wgmma=wgmma,
                forms=WGMMA_FORMS,
                tma_ranks=[1, 2, 3, 4, 5],
                lanes=32,
                mma=FRAGMENT_SHAPES.get(dialect.name),
            )
        )
        names |= _defined(primitives)
    names |= LAUNCHER_NAMES  # the SYCL host functions' own
    stems = {"f", "pid_m"}
    for template in ("cpu/module.cpp.j2", "simt/module.j2"):
        words, suffixes = _template_words(template)
        names |= words | {stem + suffix for stem in stems for suffix in suffixes}
    entry = tessera.compile(GENERATED.format(name="f", param="y", size="S"), target="cpu")
    names |= {entry.ir("meta")["functions"][0]["symbol"], "pid_m_count", "main"}
    # What a .tsr file cannot name: Python's keywords, the names results are passed under
    # (out, out0, ...: a parameter so named is an error), and the names the kernels below
    # use.
    return sorted(
        n for n in names
        if not keyword.iskeyword(n) and not re.fullmatch(r"out\d*", n) and n not in {"R", "w", "x"}
    )  # fmt: skip


GENERATED = """\
@kernel
def {name}({param}: Tensor["R", "{size}", f32],
           w: Tensor["{size}", f32]) -> Tensor["R", "{size}", f32]:
    return rmsnorm({param}, w, eps=1e-6)
"""
#: nvcc and hipcc take minutes over a kernel per name: theirs are the exhaustive tier's.
GENERATED_TARGETS = [("cpu", None), ("opencl", None),
                     *(pytest.param(t, a, marks=pytest.mark.exhaustive)
                       for t, a in (("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", "gfx90a"))),
                     pytest.param("sycl", None, marks=needs_sycl_headers)]  # fmt: skip


@pytest.fixture(scope="module")
def generated_names() -> str:
    """One kernel per name: named by it, with the next name as its parameter and the
    one after as its size, so that each name is all three once."""
    names = _generated_names()
    kernels = [GENERATED.format(name=n, param=names[(i + 1) % len(names)],
                                size=names[(i + 2) % len(names)])
               for i, n in enumerate(names)]  # fmt: skip
    return "\n".join(kernels)


@pytest.mark.compile
@pytest.mark.parametrize(("target", "arch"), GENERATED_TARGETS, ids=lambda v: v)
def test_no_name_meets_one_the_generated_code_declares(
    generated_names: str, target: str, arch: str | None, tmp_path: Path
) -> None:
    """Every name the headers and templates declare, as a kernel, a parameter and a size,
    compiles warning-free on every target (and OpenCL's kernels are found by name)."""
    if target == "cuda" and arch is not None:
        if NVCC is None:
            pytest.skip("needs nvcc (the CUDA toolkit)")
        _nvcc("generated.tsr", arch, tmp_path, text=generated_names)
        return
    if target == "hip" and HIPCC is None:
        pytest.skip("needs hipcc (apt-get install hipcc)")
    if target == "opencl" and _platform() is not None:
        pytest.skip(f"needs pyopencl and PoCL: {_platform()}")
    if target == "cpu" and shutil.which("g++") is None:
        pytest.skip("needs g++")
    program = tessera.compile(generated_names, "generated.tsr", target=target, arch=arch)
    if target == "hip":
        _hipcc_warning_free(program.source, tmp_path)
    elif target == "sycl":
        check_syntax({"generated": program.source}, tmp_path)
    elif target == "opencl":
        program.load()
    else:
        (tmp_path / "k.cpp").write_text(program.source)
        done = subprocess.run(["g++", *STRICT, "-fsyntax-only", "k.cpp"], cwd=tmp_path,
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr[:4000]


#: The prefixes of the OpenCL built-ins that OpenCL C 1.2, which the files are written
#: in, does not declare: OpenCL 2.0's and vendor extensions'.
_LATER_OPENCL = ("intel_", "amd_", "arm_", "sub_group_", "work_group_", "get_sub_group",
                 "get_max_sub_group", "get_num_sub_groups", "get_enqueued", "ndrange_",
                 "enqueue_", "get_default_queue", "is_valid_", "capture_event",
                 "create_user_event", "release_event", "retain_event", "set_user_event",
                 "atomic_", "dot_", "bitfield_", "bit_reverse", "get_image_num_")  # fmt: skip
# (OpenCL 1.1's atomic_add and the like, which 2.0's atomic_ prefix hides here, are
# in OPENCL_BUILTINS too.)


def test_every_opencl_builtin_is_reserved() -> None:
    """Every built-in function that OpenCL C declares (read from the OpenCL header that
    clang and PoCL build with) is a name no kernel takes."""
    headers = sorted(Path("/usr").glob("lib/llvm-*/lib/clang/*/include/opencl-c.h"))
    headers += sorted(Path("/usr").glob("share/pocl/include/opencl-c.h"))
    if not headers:
        pytest.skip("needs the OpenCL C header of clang or PoCL (opencl-c.h)")
    declared = set(re.findall(r"__ovld\b[^;{(]*?\b(\w+)\s*\(", headers[-1].read_text()))
    reserved = C_KEYWORDS | C_LIBRARY | GPU_BUILTINS | OPENCL_BUILTINS
    later = ("__", "as_", "convert_", *_LATER_OPENCL)
    missing = sorted(n for n in declared - reserved if not n.startswith(later))
    assert not missing, missing


RESULT_NAMED = """\
@kernel
def f(x: Tensor["N", "N", f32]) -> Tensor["N", "N", f32]:
    out = x @ x
    return softmax(out) * 2.0
"""


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_an_intermediate_named_like_the_result(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value the source calls ``out``, written by one kernel and read by the next: the
    entry passes its result as ``out``, and the two were one name (the CPU entry declared
    the buffer over its result parameter and did not compile)."""
    lib = load_everywhere(RESULT_NAMED, target, arch, monkeypatch)
    x = np.random.default_rng(8).standard_normal((37, 37)).astype(np.float32)
    out = np.full(x.shape, np.nan, np.float32)
    lib.f(x, out=out)
    y = x.astype(np.float64) @ x
    e = np.exp(y - y.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, 2 * e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-5)
