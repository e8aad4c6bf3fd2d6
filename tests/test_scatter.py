"""Scatters by integer tensors: ``put_along_axis`` and ``scatter_add``, on every target.

Each function of one source runs against numpy (``put_along_axis``, ``add.at``) in
float64: rows that repeat an index (the last value wins, or the values sum), a gradient
of a cross-entropy's gather (``scatter_add`` into a computed zero tensor), a scatter
along the first axis (between transposes), into a vector, into a batch of matrices, one
with an epilogue, and one whose indices are computed in the function (clamped in the
kernel). CPU and OpenCL run here; CUDA (sm_80, sm_90a) and HIP on the simulated GPU.
Sizes are not multiples of any tile and outputs are poisoned. An index parameter out
of range is a ``ValueError`` naming the parameter, the index and the bound before
anything runs; bad arguments are errors at the call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tessera
from tessera.transpiler.tile.interpret import run_function

from .everywhere import EVERY_TARGET, load_everywhere
from .reference import f64

SOURCE = """\
@kernel
def put(x: Tensor["N", "C", f32], idx: Tensor["N", "K", i32],
        v: Tensor["N", "K", f32]) -> Tensor["N", "C", f32]:
    return put_along_axis(x, idx, v, axis=-1)

@kernel
def add(x: Tensor["N", "C", f32], idx: Tensor["N", "K", i32],
        v: Tensor["N", "K", f32]) -> Tensor["N", "C", f32]:
    return scatter_add(x, idx, v) * 2.0

@kernel
def label_grad(logits: Tensor["N", "C", f32], labels: Tensor["N", 1, i32],
               dy: Tensor["N", 1, f32]) -> Tensor["N", "C", f32]:
    return scatter_add(logits * 0.0, labels, dy)

@kernel
def first_axis(x: Tensor["C", "N", f32], idx: Tensor["K", "N", i32],
               v: Tensor["K", "N", f32]) -> Tensor["C", "N", f32]:
    return put_along_axis(x, idx, v, axis=0)

@kernel
def vector(x: Tensor["C", f32], idx: Tensor["K", i32], v: Tensor["K", f32]) -> Tensor["C", f32]:
    return scatter_add(x, idx, v)

@kernel
def batched(x: Tensor["B", "N", "C", f32], idx: Tensor["B", "N", "K", i32],
            v: Tensor["B", "N", "K", f32]) -> Tensor["B", "N", "C", f32]:
    return put_along_axis(x, idx, v)

@kernel
def computed(x: Tensor["N", "C", f32], idx: Tensor["N", "K", i32],
             v: Tensor["N", "K", f32]) -> Tensor["N", "C", f32]:
    return scatter_add(x, cast(cast(idx, f32) * 3.0 - 40.0, i32), v)

@kernel
def tile_put(x: Tensor["N", "C", f32], idx: Tensor["N", "K", i32],
             v: Tensor["N", "K", f32]) -> Tensor["N", "C", f32]:
    T = tile.context()
    rows = tile.load(x, rows=T.m)
    return tile.scatter(rows, tile.load(idx, rows=T.m), tile.load(v, rows=T.m))
"""

B, N, C, K = 3, 37, 50, 23


def _put(x: np.ndarray, idx: np.ndarray, v: np.ndarray, axis: int = -1) -> np.ndarray:
    out = f64(x).copy()
    np.put_along_axis(out, idx.astype(np.int64), f64(v), axis=axis)
    return out


def _add(x: np.ndarray, idx: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``np.add.at`` along the last axis: every value added, a repeated index summing."""
    out = f64(x).copy()
    lead = np.indices(idx.shape)[:-1]
    np.add.at(out, (*lead, idx.astype(np.int64)), f64(v))
    return out


def _cases(rng: np.random.Generator) -> list[tuple[str, dict[str, Any], np.ndarray]]:
    """(function, arguments, float64 result) for each function of ``SOURCE``."""

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    def indices(bound: int, *shape: int) -> np.ndarray:
        return rng.integers(0, bound, shape).astype(np.int32)

    x, v = normal(N, C), normal(N, K)
    idx = indices(C, N, K)  # K of C columns: most rows repeat an index
    idx[0, :] = 5  # a row that names one column K times
    idx[1, :2] = (0, C - 1)  # the first and last column
    labels, dy = indices(C, N, 1), normal(N, 1)
    xt, idx_t, vt = normal(C, N), indices(C, K, N), normal(K, N)
    xv, idx_v, vv = normal(C), indices(C, 3 * C), normal(3 * C)
    xb, idx_b, vb = normal(B, N, C), indices(C, B, N, K), normal(B, N, K)
    clamped = np.clip(idx.astype(np.int64) * 3 - 40, 0, C - 1)
    wild = rng.integers(-5, C + 5, (N, K)).astype(np.int32)  # a tile kernel checks nothing
    return [
        ("put", {"x": x, "idx": idx, "v": v}, _put(x, idx, v)),
        ("add", {"x": x, "idx": idx, "v": v}, 2 * _add(x, idx, v)),
        ("label_grad", {"logits": x, "labels": labels, "dy": dy}, _add(0 * x, labels, dy)),
        ("first_axis", {"x": xt, "idx": idx_t, "v": vt}, _put(xt, idx_t, vt, axis=0)),
        ("vector", {"x": xv, "idx": idx_v, "v": vv}, _add(xv, idx_v, vv)),
        ("batched", {"x": xb, "idx": idx_b, "v": vb}, _put(xb, idx_b, vb)),
        ("computed", {"x": x, "idx": idx, "v": v}, _add(x, clamped, v)),
        ("tile_put", {"x": x, "idx": wild, "v": v}, _put(x, np.clip(wild, 0, C - 1), v)),
    ]


def _run_all(lib: Any) -> None:
    for function, args, want in _cases(np.random.default_rng(11)):
        out = np.full(want.shape, np.nan, np.float32)
        getattr(lib, function)(**args, out=out)
        assert not np.isnan(out).any(), f"{function}: the result was not all written"
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=function)


def _check_range(lib: Any) -> None:
    """An index below 0 or past the axis is an error before the launch."""
    x, v = np.ones((N, C), np.float32), np.ones((N, K), np.float32)
    for function in ("put", "add"):
        for bad in (-1, C, C + 1000):
            idx = np.zeros((N, K), np.int32)
            idx[N // 2, K - 1] = bad
            with pytest.raises(
                ValueError, match=rf"'idx' holds the index {bad}, outside \[0, C = {C}\)"
            ):
                getattr(lib, function)(x, idx, v)
    with pytest.raises(ValueError, match=r"C = 0 breaks C >= 1 \(scatter_add: an index computed"):
        lib.computed(np.ones((N, 0), np.float32), np.zeros((N, K), np.int32), v)
    idx = np.full((K, N), C, np.int32)
    with pytest.raises(ValueError, match=rf"'idx' holds the index {C}, outside \[0, C = {C}\)"):
        lib.first_axis(np.ones((C, N), np.float32), idx, np.ones((K, N), np.float32))


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_scatters_equal_numpy_and_check_their_indices(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = load_everywhere(SOURCE, target, arch, monkeypatch)
    _run_all(lib)
    _check_range(lib)


def test_the_tile_interpreter_scatters_as_numpy() -> None:
    """The Tile IR's numpy interpreter, which proves a lowering before a backend prints
    it, scatters as the kernels do (on the matrices: it binds a function's tensors to
    its kernels' parameters as they are, not reshaped)."""
    module = tessera.compile(SOURCE, filename="program.tsr", target="cpu").ir("tile")
    for function, args, want in _cases(np.random.default_rng(12)):
        if function in ("vector", "batched"):
            continue
        out = run_function(module, function, args)["out"]
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=function)


def _compile_error(source: str) -> str:
    with pytest.raises(tessera.CompileError) as info:
        tessera.compile(source, filename="bad.tsr", target="cpu")
    return str(info.value)


HEAD = (
    '@kernel\ndef f(x: Tensor["N", "C", f32], i: {index},\n'
    '      v: {values}) -> Tensor["N", "C", f32]:\n'
)


@pytest.mark.parametrize(
    ("index", "values", "body", "message"),
    [
        ('Tensor["N", 2, f32]', 'Tensor["N", 2, f32]', "put_along_axis(x, i, v)",
         "4:30: error: put_along_axis: the indices must be an integer tensor; i is f32"),
        ('Tensor["N", 2, i32]', 'Tensor["N", 3, f32]', "scatter_add(x, i, v)",
         "4:12: error: scatter_add: the values need the indices' shape; i is [N, 2], v is "
         "[N, 3]"),
        ('Tensor["N", 2, i32]', 'Tensor["N", f32]', "scatter_add(x, i, v)",
         "4:30: error: scatter_add: the values need the indices' shape; i is [N, 2], v is [N]"),
        ('Tensor["N", 2, i32]', 'Tensor["N", 2, i32]', "put_along_axis(x, i, v)",
         "4:33: error: put_along_axis: needs a floating-point input; v is i32"),
        ('Tensor["M", 2, i32]', 'Tensor["M", 2, f32]', "put_along_axis(x, i, v)",
         "4:12: error: put_along_axis: the indices' sizes on the other axes are x's: x is "
         "[N, C], i is [M, 2]"),
        ('Tensor["N", 2, i32]', 'Tensor["N", 2, f32]', "scatter_add(x, i, v, axis=-3)",
         "4:38: error: scatter_add: axis -3 is out of range for a rank-2 value"),
    ],
)  # fmt: skip
def test_wrong_arguments_are_errors_at_the_call(
    index: str, values: str, body: str, message: str
) -> None:
    source = HEAD.format(index=index, values=values) + f"    return {body}\n"
    assert message in _compile_error(source)


TILE_HEAD = (
    '@kernel\ndef f(x: Tensor["N", "C", f32], i: Tensor["N", "K", {dtype}],\n'
    '      v: Tensor["N", "{cols}", f32]) -> Tensor["N", "C", f32]:\n'
    "    T = tile.context()\n"
    "    return tile.{op}(tile.load(x, rows=T.m), tile.load(i, rows=T.m), "
    "tile.load(v, rows=T.m))\n"
)


@pytest.mark.parametrize(
    ("dtype", "cols", "op", "message"),
    [
        ("f32", "K", "scatter", "5:49: error: tile.scatter: the index must be an integer tile; "
         "tile.load(i, rows=T.m) is f32"),
        ("i32", "J", "scatter_add", "5:12: error: tile.scatter_add: the values' shape and the "
         "index's: J and K differ"),
    ],
)  # fmt: skip
def test_wrong_tiles_are_errors_at_the_call(dtype: str, cols: str, op: str, message: str) -> None:
    assert message in _compile_error(TILE_HEAD.format(dtype=dtype, cols=cols, op=op))


def test_a_reduction_of_a_scattered_tile_is_refused_on_the_gpu_targets() -> None:
    """Each element of a scattered tile is a loop written before the statement that reads
    it; a row reduction reads elements inside its own loop, so a GPU target says it does
    not lower one, where it would have printed code that does not build."""
    source = (
        '@kernel\ndef f(x: Tensor["N", "C", f32], i: Tensor["N", "K", i32],\n'
        '      v: Tensor["N", "K", f32]) -> Tensor["N", f32]:\n'
        "    T = tile.context()\n"
        "    t = tile.scatter(tile.load(x, rows=T.m), tile.load(i, rows=T.m), "
        "tile.load(v, rows=T.m))\n"
        "    return tile.sum(t, axis=1)\n"
    )
    program = tessera.compile(source, filename="sum.tsr", target="opencl")
    with pytest.raises(NotImplementedError, match="a scattered tile read outside a walk"):
        _ = program.source
