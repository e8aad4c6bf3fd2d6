"""Functions of several results, on every target.

``return a, b`` with and without a declared ``-> (A, B)``, the same value returned
twice, a parameter returned as it is, results of mixed dtypes, a result that another
result's kernel reads too, and three results, one a view of another: each result is
written by a kernel of its own into an array of its own, which a call returns as a
tuple. CPU and OpenCL run here; CUDA (sm_80, sm_90a) and HIP on the simulated GPU,
and the CuPy loader module too. Outputs are poisoned first; the reference is float64.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.transpiler.target.cupy_loader import python_loader
from tessera.tune.measure import Runner, disagreement, make_inputs

from .everywhere import EVERY_TARGET, load_everywhere
from .gpusim import simulated_cupy, use_simulator
from .helpers import assert_round_trip
from .reference import f64
from .test_cuda import needs_gxx
from .test_loader import _import, assert_formatted

SOURCE = """\
@kernel
def declared(x: Tensor["R", "C", bf16], w: Tensor["C", "N", bf16]) -> (
        Tensor["R", "N", f32], Tensor["R", "C", bf16]):
    return x @ w, cast(x * 2.0, bf16)

@kernel
def rope(q: Tensor["S", "D", f32], k: Tensor["S", "D", f32], cos: Tensor["S", "D/2", f32],
         sin: Tensor["S", "D/2", f32]):
    return rotary_embedding(q, cos, sin), rotary_embedding(k, cos, sin)

@kernel
def twice(x: Tensor["R", "C", f32]):
    y = relu(x) + 1.0
    return y, y

@kernel
def given(x: Tensor["R", "C", f32]) -> tuple[Tensor["R", "C", f32], Tensor["R", "C", f32]]:
    return x, exp(x)

@kernel
def shared(x: Tensor["R", "C", bf16], w: Tensor["C", "N", bf16]):
    h = x @ w
    return h, relu(h) * 2.0

@kernel
def aliased(x: Tensor["R", "C", f32]):
    y = exp(x)
    return y, reshape(y, ("R*C",)), softmax(y)

@kernel
def caller(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    a, b = given(x)
    return a - b
"""

R, C, N, S, D = 37, 50, 13, 70, 48


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    x1, x2 = np.split(f64(x), 2, axis=-1)
    c, s = f64(cos), f64(sin)
    return np.concatenate((x1 * c - x2 * s, x1 * s + x2 * c), axis=-1)


def _cases(rng: np.random.Generator) -> list[tuple[str, dict[str, Any], list[np.ndarray]]]:
    """(function, arguments, float64 results) for each function of ``SOURCE``."""
    xb = rng.standard_normal((R, C)).astype(ml_dtypes.bfloat16)
    wb = rng.standard_normal((C, N)).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((R, C)).astype(np.float32)
    q, k = (rng.standard_normal((S, D)).astype(np.float32) for _ in range(2))
    angle = rng.uniform(0, 6, (S, D // 2))
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    h = f64(xb) @ f64(wb)
    y = np.maximum(f64(x), 0) + 1
    rotated = [_rope(q, cos, sin), _rope(k, cos, sin)]
    e = np.exp(f64(x))
    e_norm = np.exp(e - e.max(axis=-1, keepdims=True))
    e_norm /= e_norm.sum(axis=-1, keepdims=True)
    return [
        ("declared", {"x": xb, "w": wb}, [h, 2 * f64(xb)]),
        ("rope", {"q": q, "k": k, "cos": cos, "sin": sin}, rotated),
        ("twice", {"x": x}, [y, y]),
        ("given", {"x": x}, [f64(x), np.exp(f64(x))]),
        ("shared", {"x": xb, "w": wb}, [h, np.maximum(h, 0) * 2]),
        ("aliased", {"x": x}, [e, e.reshape(-1), e_norm]),
    ]  # fmt: skip


#: Result dtypes: the second result of ``declared`` is bf16, every other f32.
def _dtype(function: str, index: int) -> Any:
    return ml_dtypes.bfloat16 if (function, index) == ("declared", 1) else np.float32


def _check(function: str, have: Any, want: list[np.ndarray]) -> None:
    assert isinstance(have, tuple) and len(have) == len(want), f"{function}: {have!r}"
    for i, (got, expected) in enumerate(zip(have, want, strict=True)):
        got = f64(got)
        assert not np.isnan(got).any(), f"{function}: result {i} was not all written"
        rtol = 1e-2 if _dtype(function, i) is ml_dtypes.bfloat16 else 1e-5
        error = np.abs(got - expected).max() / np.abs(expected).max()
        assert error < rtol, f"{function}: result {i} has relative error {error:.2e}"


def _run_all(lib: Any) -> None:
    """Every function, into poisoned arrays given as ``out=`` and into arrays of its own."""
    for function, args, want in _cases(np.random.default_rng(5)):
        fn = getattr(lib, function)
        outs = tuple(np.full(w.shape, np.nan).astype(_dtype(function, i))
                     for i, w in enumerate(want))  # fmt: skip
        returned = fn(**args, out=outs)
        assert all(r is o for r, o in zip(returned, outs, strict=True))
        _check(function, returned, want)
        _check(function, fn(**args), want)
    x = np.random.default_rng(6).standard_normal((R, C)).astype(np.float32)
    out = np.full((R, C), np.nan, np.float32)
    lib.caller(x, out=out)
    np.testing.assert_allclose(out, x - np.exp(f64(x)), rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_every_target(target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    _run_all(load_everywhere(SOURCE, target, arch, monkeypatch))


@needs_gxx
@pytest.mark.execute
def test_cupy_loader_on_the_simulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The generated loader takes ``out=(a, b)`` and returns a tuple, as the runtime."""
    cupy = simulated_cupy("sm_80")
    use_simulator(monkeypatch, cupy)
    program = tessera.compile(SOURCE, filename="results.tsr", target="cuda", arch="sm_80")
    (tmp_path / "results.cu").write_text(program.source)
    (tmp_path / "results_loader.py").write_text(python_loader(program.ir("meta"), "results.cu"))
    module = _import(tmp_path / "results_loader.py", cupy, monkeypatch)
    for function, args, want in _cases(np.random.default_rng(5)):
        if any(a.dtype == ml_dtypes.bfloat16 for a in args.values()):
            continue  # cupy carries bf16 as bits: the reference cases cover that
        placed = {k: cupy.asarray(v) for k, v in args.items()}
        outs = tuple(cupy.asarray(np.full(w.shape, np.nan, np.float32)) for w in want)
        returned = getattr(module, function)(**placed, out=outs)
        _check(function, tuple(r.get() for r in returned), want)
        _check(function, tuple(r.get() for r in getattr(module, function)(**placed)), want)


def _compile_error(source: str) -> str:
    with pytest.raises(tessera.CompileError) as info:
        tessera.compile(source, filename="bad.tsr", target="cpu")
    return str(info.value)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ('def f(x: Tensor["N", f32]) -> (Tensor["N", f32], Tensor["N", f32]):\n    return x\n',
         "returns 1 value, but the declared result is 2"),
        ('def f(x: Tensor["N", f32]) -> Tensor["N", f32]:\n    return x, x\n',
         "returns 2 values, but the declared result is one"),
        ('def f(x: tuple[Tensor["N", f32], Tensor["N", f32]]):\n    return x\n',
         "tuple[...] is a function's result type only"),
        ('def f(x: Tensor["N", f32]) -> tuple[Tensor["N", f32]]:\n    return x\n',
         "a tuple result lists the type of each returned value, two or more"),
        ('def f(out0: Tensor["N", f32]):\n    return out0, exp(out0)\n',
         "cannot be named 'out0'"),
        ('def f(out: Tensor["N", f32]):\n    return out, exp(out)\n',
         "cannot be named 'out'"),
        ('def f(x: Tensor["N", f32]) -> (Tensor["N", f32], Tensor["N", i32]):\n'
         "    return x, x\n", "returns f32, but the declared result is i32"),
        ('@kernel\ndef f(x: Tensor["N", f32]):\n    T = tile.context()\n'
         "    a = tile.load(x, rows=T.m)\n    return a, a\n",
         "returns a tile but declares no result type"),
    ],
)  # fmt: skip
def test_wrong_results_are_errors_at_the_return(source: str, message: str) -> None:
    assert message in _compile_error(source)


def test_a_result_tuple_prints_as_tuple_and_round_trips() -> None:
    text = assert_round_trip(
        'def f(x: Tensor["N", f32]) -> (Tensor["N", f32], Tensor["N", bf16]):\n    ...\n'
    )
    assert '-> tuple[Tensor["N", f32], Tensor["N", bf16]]' in text


@needs_gxx
@pytest.mark.execute
def test_out_must_be_a_tuple_of_distinct_arrays() -> None:
    lib = tessera.compile(SOURCE, filename="results.tsr", target="cpu").load()
    x = np.ones((R, C), np.float32)
    a = np.empty_like(x)
    with pytest.raises(TypeError, match=r"returns 2 results; 'out' is a tuple of 2 arrays"):
        lib.twice(x, out=a)
    with pytest.raises(ValueError, match="the same array for two results"):
        lib.twice(x, out=(a, a))
    first, second = lib.twice(x, out=(None, a))
    assert second is a and first is not a
    np.testing.assert_array_equal(first, 2.0)


def test_each_result_is_a_kernel_of_its_own() -> None:
    """``return y, y`` and ``return x, ...`` copy: each result has its own writer."""
    program = tessera.compile(SOURCE, filename="results.tsr", target="opencl")
    meta = {f["name"]: f for f in program.ir("meta")["functions"]}
    for name in ("twice", "given", "rope", "declared", "shared", "aliased"):
        results = meta[name]["results"]
        assert results == ["out0", "out1", "out2"][: len(results)] and len(results) >= 2
        written = [a for launch in meta[name]["launches"] for a in launch["args"]]
        assert all(out in written for out in results), name
    cpu = tessera.compile(SOURCE, filename="results.tsr", target="cpu").source
    assert "float* out0, float* out1" in cpu


@needs_gxx
@pytest.mark.execute
def test_the_tuner_measures_a_function_of_several_results() -> None:
    """The autotuner's runner passes ``out=`` as a tuple and compares every result."""
    program = tessera.compile(SOURCE, filename="results.tsr", target="cpu",
                              defines={"R": 5, "C": 7})  # fmt: skip
    meta = next(f for f in program.ir("meta")["functions"] if f["name"] == "aliased")
    runner = Runner(program.load().aliased, make_inputs(meta))
    outputs = runner.output()
    assert [o.shape for o in outputs] == [(5, 7), (35,), (5, 7)]
    assert not any(np.isnan(o).any() for o in outputs)
    runner.run(2)
    assert len(runner.times) == 2 and disagreement(runner.output(), outputs) is None


def test_the_loader_of_several_results_is_formatted_and_lint_clean(tmp_path: Path) -> None:
    program = tessera.compile(SOURCE, filename="results.tsr", target="cuda", arch="sm_80")
    module = tmp_path / "results_loader.py"
    module.write_text(python_loader(program.ir("meta"), "results.cu"))
    assert_formatted(module)
