"""Gathers by integer tensors: ``take_along_axis``, on every target.

A cross-entropy loss from integer labels (``logsumexp_safe(logits) - take_along_axis(
logits, labels)``), a gather of several columns per row, one along the first axis
(between transposes), one from a vector, and one whose indices are computed in the
function (clamped in the kernel). CPU and OpenCL run here; CUDA (sm_80, sm_90a) and HIP
on the simulated GPU, and the CuPy loader module too. Sizes are not multiples of any
tile, outputs are poisoned, and the reference is numpy's ``take_along_axis`` in float64.
An index parameter out of range, negative or past the axis, is a ``ValueError`` naming
the parameter, the index and the bound before anything runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tessera
from tessera.transpiler.target.cupy_loader import python_loader

from .everywhere import EVERY_TARGET, load_everywhere
from .gpusim import simulated_cupy, use_simulator
from .reference import f64
from .test_cuda import needs_gxx
from .test_loader import _import, assert_formatted

SOURCE = """\
@kernel
def cross_entropy(logits: Tensor["N", "C", f32],
                  labels: Tensor["N", 1, i32]) -> Tensor["N", 1, f32]:
    lse = logsumexp_safe(logits, axis=-1, keepdims=True)
    return lse - take_along_axis(logits, labels, axis=-1)

@kernel
def columns(x: Tensor["N", "C", f32], idx: Tensor["N", "K", i32]) -> Tensor["N", "K", f32]:
    return take_along_axis(x, idx) * 2.0

@kernel
def first_axis(x: Tensor["C", "N", f32], idx: Tensor["K", "N", i32]) -> Tensor["K", "N", f32]:
    return take_along_axis(x, idx, axis=0)

@kernel
def vector(v: Tensor["C", f32], idx: Tensor["K", i32]) -> Tensor["K", f32]:
    return take_along_axis(v, idx)

@kernel
def computed(x: Tensor["N", "C", f32], idx: Tensor["N", "K", i32]) -> Tensor["N", "K", f32]:
    return take_along_axis(x, cast(cast(idx, f32) * 3.0 - 40.0, i32))
"""

N, C, K = 37, 50, 7


def _take(x: np.ndarray, idx: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.take_along_axis(f64(x), idx.astype(np.int64), axis=axis)


def _cases(rng: np.random.Generator) -> list[tuple[str, dict[str, Any], np.ndarray]]:
    """(function, arguments, float64 result) for each function of ``SOURCE``."""
    logits = (rng.standard_normal((N, C)) * 4).astype(np.float32)
    labels = rng.integers(0, C, (N, 1)).astype(np.int32)
    labels[0, 0], labels[1, 0] = 0, C - 1  # the first and last column
    idx = rng.integers(0, C, (N, K)).astype(np.int32)
    lse = np.log(np.exp(f64(logits)).sum(axis=-1, keepdims=True))
    xt = rng.standard_normal((C, N)).astype(np.float32)
    idx_t = rng.integers(0, C, (K, N)).astype(np.int32)
    v = rng.standard_normal(C).astype(np.float32)
    idx_v = rng.integers(0, C, K).astype(np.int32)
    clamped = np.clip(idx.astype(np.int64) * 3 - 40, 0, C - 1)
    return [
        ("cross_entropy", {"logits": logits, "labels": labels}, lse - _take(logits, labels)),
        ("columns", {"x": logits, "idx": idx}, 2 * _take(logits, idx)),
        ("first_axis", {"x": xt, "idx": idx_t}, _take(xt, idx_t, axis=0)),
        ("vector", {"v": v, "idx": idx_v}, _take(v, idx_v)),
        ("computed", {"x": logits, "idx": idx}, _take(logits, clamped)),
    ]


def _run_all(lib: Any) -> None:
    for function, args, want in _cases(np.random.default_rng(7)):
        out = np.full(want.shape, np.nan, np.float32)
        getattr(lib, function)(**args, out=out)
        assert not np.isnan(out).any(), f"{function}: the result was not all written"
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=function)


def _check_range(lib: Any) -> None:
    """A label below 0 or past the classes is an error before the launch."""
    logits = np.ones((N, C), np.float32)
    for bad in (-1, C, C + 1000):
        labels = np.zeros((N, 1), np.int32)
        labels[N // 2, 0] = bad
        with pytest.raises(
            ValueError, match=rf"'labels' holds the index {bad}, outside \[0, C = {C}\)"
        ):
            lib.cross_entropy(logits, labels)
    idx = np.full((K, N), C, np.int32)
    with pytest.raises(ValueError, match=rf"'idx' holds the index {C}, outside \[0, C = {C}\)"):
        lib.first_axis(np.ones((C, N), np.float32), idx)
    # an index computed in the function is clamped into the row: an empty row has no element
    with pytest.raises(ValueError, match=r"C = 0 breaks C >= 1 \(take_along_axis: an index comp"):
        lib.computed(np.ones((N, 0), np.float32), np.zeros((N, K), np.int32))


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_take_along_axis_equals_numpy(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_all(load_everywhere(SOURCE, target, arch, monkeypatch))


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_an_index_out_of_range_is_a_value_error(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check_range(load_everywhere(SOURCE, target, arch, monkeypatch))


@needs_gxx
@pytest.mark.execute
def test_the_cupy_loader_checks_the_indices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generated loader computes as the runtime does, and refuses a bad label with
    the runtime's message."""
    cupy = simulated_cupy("sm_80")
    use_simulator(monkeypatch, cupy)
    program = tessera.compile(SOURCE, filename="gather.tsr", target="cuda", arch="sm_80")
    (tmp_path / "gather.cu").write_text(program.source)
    loader = tmp_path / "gather_loader.py"
    loader.write_text(python_loader(program.ir("meta"), "gather.cu"))
    assert_formatted(loader)
    module = _import(loader, cupy, monkeypatch)
    for function, args, want in _cases(np.random.default_rng(8)):
        placed = {k: cupy.asarray(v) for k, v in args.items()}
        out = cupy.asarray(np.full(want.shape, np.nan, np.float32))
        getattr(module, function)(**placed, out=out)
        np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=1e-5, err_msg=function)
    labels = np.zeros((N, 1), np.int32)
    labels[3, 0] = -2
    with pytest.raises(ValueError, match=rf"'labels' holds the index -2, outside \[0, C = {C}\)"):
        module.cross_entropy(cupy.asarray(np.ones((N, C), np.float32)), cupy.asarray(labels))


def _compile_error(source: str) -> str:
    with pytest.raises(tessera.CompileError) as info:
        tessera.compile(source, filename="bad.tsr", target="cpu")
    return str(info.value)


HEAD = '@kernel\ndef f(x: Tensor["N", "C", f32], i: {index}) -> Tensor["N", 1, f32]:\n'


@pytest.mark.parametrize(
    ("index", "body", "message"),
    [
        ('Tensor["N", 1, f32]', "take_along_axis(x, i)",
         "3:31: error: take_along_axis: the indices must be an integer tensor; i is f32"),
        ('Tensor["N", i32]', "take_along_axis(x, i)",
         "3:31: error: take_along_axis: the indices need x's rank, at least 1; x is [N, C], "
         "i is [N]"),
        ('Tensor["N", 1, i32]', "take_along_axis(x, i, axis=2)",
         "3:39: error: take_along_axis: axis 2 is out of range for a rank-2 value"),
        ('Tensor["M", 1, i32]', "take_along_axis(x, i)",
         "3:12: error: take_along_axis: the indices' sizes on the other axes are x's: x is [N, C], "
         "i is [M, 1]"),
        ('Tensor["N", 1, i32]', "take_along_axis(i, i)",
         "3:28: error: take_along_axis: needs a floating-point input; i is i32"),
        ('Tensor["N", 1, i32]', "x[:, i]",
         "3:17: error: an index or a slice bound is an integer or a size, not tensor<[N, 1], "
         "i32> (a gather by a tensor's values, x[i, labels[i]], is take_along_axis(x, labels, "
         "axis=-1); rows by integer ids, w[ids], are take(w, ids, axis=0))"),
    ],
)  # fmt: skip
def test_wrong_indices_are_errors_at_the_call(index: str, body: str, message: str) -> None:
    assert message in _compile_error(HEAD.format(index=index) + f"    return {body}\n")
