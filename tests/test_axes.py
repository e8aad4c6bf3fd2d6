"""Every permutation of a rank-3 and a rank-4 tensor, and every reduction and softmax
over every axis, with and without ``keepdims``, on the CPU against numpy.

The library's kernels take rows: a transpose either keeps the last axis or swaps the
last two, and a reduction runs over the last axis. Everything else is made of those
(``canonicalize``): axes merged by reshapes, swaps, copies. These cases cover every
shape of that rewrite at once, in one generated file, at sizes that are not multiples
of the tiles, into outputs filled with NaN first.
"""

from __future__ import annotations

import itertools
import shutil
from typing import Any

import numpy as np
import pytest

import tessera

from .reference import f64, softmax

pytestmark = [
    pytest.mark.execute,
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
]

DIMS = ("A", "B", "C", "D")
SHAPE = (3, 37, 5, 70)  # the row blocks are 64 x 64: 37 and 70 straddle them
PERMUTATIONS = [p for rank in (3, 4) for p in itertools.permutations(range(rank))]
REDUCTIONS = [
    (kind, rank, axis, keepdims)
    for kind in ("sum", "max", "min", "mean")
    for rank in (3, 4)
    for axis in range(rank)
    for keepdims in (False, True)
]
SOFTMAXES = [(rank, axis) for rank in (3, 4) for axis in range(rank)]


def _tensor(dims: tuple[str, ...]) -> str:
    return "Tensor[" + ", ".join(f'"{d}"' for d in dims) + ", f32]"


def _source() -> str:
    functions = []
    for perm in PERMUTATIONS:
        dims = DIMS[: len(perm)]
        out = tuple(dims[i] for i in perm)
        functions.append(
            f"def permuted_{''.join(map(str, perm))}(x: {_tensor(dims)}) -> {_tensor(out)}:\n"
            f"    return transpose(x, {perm})"
        )
    for kind, rank, axis, keepdims in REDUCTIONS:
        dims = DIMS[:rank]
        out = tuple("1" if i == axis else d for i, d in enumerate(dims) if keepdims or i != axis)
        result = _tensor(out).replace('"1"', "1")
        functions.append(
            f"def {kind}_{rank}_{axis}_{int(keepdims)}(x: {_tensor(dims)}) -> {result}:\n"
            f"    return {kind}(x, axis={axis}, keepdims={keepdims})"
        )
    for rank, axis in SOFTMAXES:
        dims = DIMS[:rank]
        functions.append(
            f"def softmax_{rank}_{axis}(x: {_tensor(dims)}) -> {_tensor(dims)}:\n"
            f"    return softmax(x, axis={axis})"
        )
    return "".join(f"@kernel\n{f}\n\n" for f in functions)


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield tessera.compile(_source(), "axes.tsr", target="cpu").load()


def _input(rank: int) -> np.ndarray:
    rng = np.random.default_rng(rank)
    return rng.standard_normal(SHAPE[:rank], dtype=np.float32)


def _call(library: Any, name: str, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = np.full(shape, np.nan, dtype=np.float32)
    getattr(library, name)(x, out=out)
    return out


@pytest.mark.parametrize("perm", PERMUTATIONS, ids=lambda p: "".join(map(str, p)))
def test_every_permutation(library: Any, perm: tuple[int, ...]) -> None:
    x = _input(len(perm))
    want = x.transpose(perm)
    got = _call(library, f"permuted_{''.join(map(str, perm))}", x, want.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "kind, rank, axis, keepdims",
    REDUCTIONS,
    ids=lambda v: str(int(v) if isinstance(v, bool) else v),
)
def test_every_reduction_over_every_axis(
    library: Any, kind: str, rank: int, axis: int, keepdims: bool
) -> None:
    x = _input(rank)
    want = getattr(np, kind)(f64(x), axis=axis, keepdims=keepdims)
    got = _call(library, f"{kind}_{rank}_{axis}_{int(keepdims)}", x, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rank, axis", SOFTMAXES)
def test_every_softmax_axis(library: Any, rank: int, axis: int) -> None:
    x = _input(rank)
    got = _call(library, f"softmax_{rank}_{axis}", x, x.shape)
    want = np.moveaxis(softmax(np.moveaxis(f64(x), axis, -1)), -1, axis)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


#: The methods that reorder axes, as NumPy and PyTorch code writes them.
AXIS_METHODS = """\
def numpy_tuple(x: Tensor["A", "B", "C", f32]) -> Tensor["C", "A", "B", f32]:
    return x.transpose((2, 0, 1))

def numpy_axes(x: Tensor["A", "B", "C", f32]) -> Tensor["B", "C", "A", f32]:
    return x.transpose(1, 2, 0)

def torch_swap(x: Tensor["A", "B", "C", f32]) -> Tensor["A", "C", "B", f32]:
    return x.transpose(1, 2)

def torch_swap_negative(x: Tensor["A", "B", "C", f32]) -> Tensor["C", "B", "A", f32]:
    return x.transpose(-1, 0)

def torch_permute(x: Tensor["A", "B", "C", f32]) -> Tensor["B", "A", "C", f32]:
    return x.permute(1, 0, 2)

def matrix_swap(y: Tensor["A", "B", f32]) -> Tensor["B", "A", f32]:
    return y.transpose(0, 1)
"""


def test_transpose_and_permute_methods_read_as_numpy_and_pytorch_do() -> None:
    library = tessera.compile(AXIS_METHODS, "axes.tsr", target="cpu").load()
    x = np.random.default_rng(3).standard_normal(SHAPE[:3]).astype(np.float32)
    for name, want in (
        ("numpy_tuple", x.transpose((2, 0, 1))),
        ("numpy_axes", x.transpose(1, 2, 0)),
        ("torch_swap", np.swapaxes(x, 1, 2)),
        ("torch_swap_negative", np.swapaxes(x, -1, 0)),
        ("torch_permute", x.transpose(1, 0, 2)),
        ("matrix_swap", x[0].T),
    ):
        arg = x[0] if name == "matrix_swap" else x
        np.testing.assert_array_equal(_call(library, name, arg, want.shape), want, err_msg=name)
