"""NumPy's and PyTorch's array vocabulary (``squeeze``, ``unsqueeze``, ``flatten``,
``broadcast_to``, ``zeros``, ``arange``, ``concat``, ``stack``, ``tril``, ``any``...), on
every target against numpy in float64.

One source holds a function per case; each target builds it once. Sizes are ragged
(37 x 203, no multiple of any tile); outputs are poisoned first (NaN, or a large number
for integer results) so that an element never written shows. The gradients of the
differentiable ones are in ``test_autodiff.py`` (cases ``shapes``, ``joins`` and
``triangles``), against PyTorch and finite differences.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.transpiler.target.nvrtc import build
from tessera.transpiler.tile.interpret import run_function

from .builds import assert_cpu_builds_warning_free, assert_gpu_builds_warning_free
from .everywhere import built_everywhere
from .test_autodiff import assert_one_error
from .test_cpu import COMPILERS
from .test_cuda import needs_nvrtc
from .test_sycl import check_syntax, needs_sycl_headers

torch = pytest.importorskip("torch")
F = torch.nn.functional

R, C = 37, 203

#: Each case: its parameters (``name: Tensor[...]``), its result type, its body, the
#: same in numpy of float64 inputs, and each input's shape.
Case = tuple[str, str, str, Callable[..., Any], tuple[tuple[int, ...], ...]]
CASES: dict[str, Case] = {
    "squeeze_all": ('x: Tensor["R", 1, "C", 1, f32]', '"R", "C", f32', "x.squeeze()",
                    lambda x: x.squeeze(), ((R, 1, C, 1),)),
    "squeeze_axes": ('x: Tensor["R", 1, "C", 1, f32]', '"R", "C", 1, f32',
                     "squeeze(x, 1) + x.squeeze(dim=3).squeeze(1)[:, :, None] * 0.0",
                     lambda x: np.squeeze(x, 1), ((R, 1, C, 1),)),
    "unsqueeze": ('x: Tensor["R", "C", f32]', '"R", "C", 1, f32', "x.unsqueeze(-1)",
                  lambda x: x[:, :, None], ((R, C),)),
    "expand_dims": ('x: Tensor["R", "C", f32]', '1, "R", 1, "C", f32',
                    "expand_dims(x, (0, 2))", lambda x: np.expand_dims(x, (0, 2)), ((R, C),)),
    "unsqueeze_middle": ('x: Tensor["R", "C", f32]', '"R", 1, "C", f32',
                         "unsqueeze(x, dim=1) * 2.0", lambda x: x[:, None] * 2, ((R, C),)),
    "flatten": ('x: Tensor["R", 3, "C", f32]', '"R*3*C", f32', "flatten(x)",
                lambda x: x.flatten(), ((R, 3, C),)),
    "flatten_tail": ('x: Tensor["R", 3, "C", f32]', '"R", "3*C", f32', "x.flatten(1) + 1.0",
                     lambda x: x.reshape(R, -1) + 1, ((R, 3, C),)),
    "flatten_middle": ('x: Tensor[2, "R", 3, "C", f32]', '2, "R*3", "C", f32',
                       "x.flatten(start_dim=1, end_dim=-2)", lambda x: x.reshape(2, R * 3, C),
                       ((2, R, 3, C),)),
    "broadcast_to": ('x: Tensor["R", "C", f32], b: Tensor["C", f32]', '"R", "C", f32',
                     "broadcast_to(b, x.shape)", lambda x, b: np.broadcast_to(b, x.shape),
                     ((R, C), (C,))),
    "broadcast_to_new_axis": ('x: Tensor["R", 1, f32], y: Tensor["C", f32]', '2, "R", "C", f32',
                              'broadcast_to(x, (2, -1, "C")) * 3.0',
                              lambda x, y: np.broadcast_to(x, (2, R, C)) * 3, ((R, 1), (C,))),
    "expand": ('x: Tensor["R", "C", f32], b: Tensor[1, "C", f32]', '"R", "C", f32',
               "b.expand(x.shape[0], -1) - x", lambda x, b: b - x, ((R, C), (1, C))),
    "zeros_ones": ('x: Tensor["R", "C", f32]', '"R", "C", f32',
                   'zeros(x.shape) + ones(("R", "C")) * 3.0 + x',
                   lambda x: x + 3.0, ((R, C),)),
    "full": ('x: Tensor["R", "C", f32]', '"R", "C", f32', "full(x.shape, -2.5)",
             lambda x: np.full(x.shape, -2.5), ((R, C),)),
    "full_int": ('x: Tensor["R", "C", f32]', '"R", 3, i32', 'full(("R", 3), 2**24 - 3)',
                 lambda x: np.full((R, 3), 2**24 - 3, np.int32), ((R, C),)),
    "zeros_int": ('x: Tensor["R", "C", f32]', '"C", i32', "zeros(x.shape[1], dtype=i32)",
                  lambda x: np.zeros(C, np.int32), ((R, C),)),
    "arange": ('x: Tensor["R", "C", f32]', '"C", i32', "arange(x.shape[1])",
               lambda x: np.arange(C, dtype=np.int32), ((R, C),)),
    "arange_start": ('x: Tensor["R", "C", f32]', '"C - 5", i32', "arange(5, x.shape[1])",
                     lambda x: np.arange(5, C, dtype=np.int32), ((R, C),)),
    "arange_float": ('x: Tensor["R", "C", f32]', "13, f32", "arange(0.5, 10.0, 0.75)",
                     lambda x: np.arange(0.5, 10.0, 0.75), ((R, C),)),
    "arange_down": ('x: Tensor["R", "C", f32]', "4, i32", "arange(10, 0, -3)",
                    lambda x: np.arange(10, 0, -3, dtype=np.int32), ((R, C),)),
    "arange_row": ('x: Tensor["R", "C", f32]', '"R", "C", f32',
                   "where(arange(x.shape[1]) < 100, x, 0.0)",
                   lambda x: np.where(np.arange(C) < 100, x, 0), ((R, C),)),
    "concat_last": ('a: Tensor["R", 3, f32], b: Tensor["R", "C", f32]', '"R", "C+3", f32',
                    "concat([a, b], axis=-1)", lambda a, b: np.concatenate([a, b], -1),
                    ((R, 3), (R, C))),
    "concat_first": ('a: Tensor["R", "C", f32], b: Tensor[5, "C", f32]', '"R+5", "C", f32',
                     "cat((a, b))", lambda a, b: np.concatenate([a, b]), ((R, C), (5, C))),
    "concat_middle": ('a: Tensor["R", 2, "C", f32], b: Tensor["R", 3, "C", f32]',
                      '"R", 7, "C", f32', "concatenate([a, b, a], dim=1)",
                      lambda a, b: np.concatenate([a, b, a], 1), ((R, 2, C), (R, 3, C))),
    "concat_ints": ('a: Tensor["R", "C", f32], b: Tensor[5, "C", f32]', '"R+5", "C", i32',
                    "concat([cast(a * 1000.0, i32), cast(b * 1000.0, i32)], dim=0)",
                    lambda a, b: (np.concatenate([a, b]).astype(np.float32)
                                  * np.float32(1000)).astype(np.int32),
                    ((R, C), (5, C))),
    "concat_masks": ('a: Tensor["R", "C", f32], b: Tensor[5, "C", f32]', '"R+5", "C", f32',
                     "cast(concat([a > 0.0, b < 0.5]), f32)",
                     lambda a, b: np.concatenate([a > 0, b < 0.5]).astype(np.float64),
                     ((R, C), (5, C))),
    "stack": ('a: Tensor["R", "C", f32], b: Tensor["R", "C", f32]', '"R", "C", 2, f32',
              "stack([a, b], axis=-1)", lambda a, b: np.stack([a, b], -1), ((R, C), (R, C))),
    "stack_first": ('a: Tensor["R", "C", f32], b: Tensor["R", "C", f32]', '3, "R", "C", f32',
                    "stack((a, b, a * 2.0))", lambda a, b: np.stack([a, b, a * 2]),
                    ((R, C), (R, C))),
    "tril": ('x: Tensor["R", "C", f32]', '"R", "C", f32', "tril(x)", np.tril, ((R, C),)),
    "triu_k": ('x: Tensor["R", "C", f32]', '"R", "C", f32', "x.triu(1) + tril(x, -3) * 2.0",
               lambda x: np.triu(x, 1) + np.tril(x, -3) * 2, ((R, C),)),
    "triu_batch": ('x: Tensor[2, "C", "R", f32]', '2, "C", "R", f32', "triu(x, diagonal=-2)",
                   lambda x: np.triu(x, -2), ((2, C, R),)),
    "causal_scores": ('s: Tensor["R", "R", f32]', '"R", "R", f32',
                      "where(tril(ones_like(s)) > 0.0, s, -INF)",
                      lambda s: np.where(np.tril(np.ones_like(s)) > 0, s, -np.inf), ((R, R),)),
    "any_rows": ('x: Tensor["R", "C", f32]', '"R", f32', "cast(any(x > 2.0, axis=1), f32)",
                 lambda x: (x > 2).any(1).astype(np.float64), ((R, C),)),
    "all_columns": ('x: Tensor["R", "C", f32]', '1, "C", f32',
                    "all(x, axis=0, keepdims=True).astype(f32)",
                    lambda x: (x != 0).all(0, keepdims=True).astype(np.float64), ((R, C),)),
    "any_every_axis": ('x: Tensor["R", "C", f32]', "f32",
                       "cast(x.any(), f32) + cast(all(x > -10.0), f32) * 2.0",
                       lambda x: np.float64((x != 0).any() + 2.0 * (x > -10).all()), ((R, C),)),
    "all_where": ('x: Tensor["R", "C", f32]', '"R", "C", f32',
                  "where(all(x > -1.5, axis=-1, keepdims=True), x, 0.0)",
                  lambda x: np.where((x > -1.5).all(-1, keepdims=True), x, 0), ((R, C),)),
    "take_rows": ('w: Tensor["C", "R", f32], ids: Tensor["R", 5, i32]', '"R", 5, "R", f32',
                  "take(w, ids, axis=0)", lambda w, ids: w[ids], ((C, R), ("ix", C, (R, 5)))),
    "take_index": ('w: Tensor["C", "R", f32], ids: Tensor[11, i32]', '11, "R", f32',
                   "w[ids] * 2.0 + w[ids, :]", lambda w, ids: w[ids] * 3,
                   ((C, R), ("ix", C, (11,)))),
    "take_columns": ('w: Tensor["R", "C", f32], ids: Tensor[7, i32]', '"R", 7, f32',
                     "w.take(ids, axis=1)", lambda w, ids: np.take(w, ids, 1),
                     ((R, C), ("ix", C, (7,)))),
    "take_flat": ('w: Tensor["R", "C", f32], ids: Tensor[9, i32]', "9, f32", "take(w, ids)",
                  lambda w, ids: np.take(w, ids), ((R, C), ("ix", R * C, (9,)))),
    "embedding": ('w: Tensor["C", "R", f32], ids: Tensor[3, 4, i32]', '3, 4, "R", f32',
                  "embedding(ids, w)",
                  lambda w, ids: F.embedding(torch.tensor(ids).long(), torch.tensor(w)).numpy(),
                  ((C, R), ("ix", C, (3, 4)))),
    "cross_entropy": ('x: Tensor["R", "C", f32], y: Tensor["R", i32]', "f32",
                      "cross_entropy(x, y)", lambda x, y: _torch_ce(x, y),
                      ((R, C), ("labels", C, (R,)))),
    "cross_entropy_sum": ('x: Tensor["R", "C", bf16], y: Tensor["R", i32]', "f32",
                          "cross_entropy(x, y, reduction='sum', ignore_index=3)",
                          lambda x, y: _torch_ce(x, y, reduction="sum", ignore_index=3),
                          ((R, C), ("ix", C, (R,)))),
    "cross_entropy_none": ('x: Tensor["R", "C", f32], y: Tensor["R", i32]', '"R", f32',
                           'cross_entropy(x * 30.0, y, reduction="none", label_smoothing=0.1)',
                           lambda x, y: _torch_ce(x * 30, y, reduction="none",
                                                  label_smoothing=0.1),
                           ((R, C), ("labels", C, (R,)))),
    "einsum_product": ('a: Tensor["R", 19, f32], b: Tensor[19, "C", f32]', '"R", "C", f32',
                       'einsum("ij,jk->ik", a, b)', lambda a, b: np.einsum("ij,jk->ik", a, b),
                       ((R, 19), (19, C))),
    "einsum_batched": ('a: Tensor[3, "R", 19, f32], b: Tensor[3, 19, 23, f32]',
                       '3, "R", 23, f32', 'einsum("bij,bjk->bik", a, b)',
                       lambda a, b: np.einsum("bij,bjk->bik", a, b), ((3, R, 19), (3, 19, 23))),
    "einsum_scores": ('q: Tensor[2, 3, "R", 19, f32], k: Tensor[2, 3, 23, 19, f32]',
                      '2, 3, "R", 23, f32', 'einsum("bhqd,bhkd->bhqk", q, k)',
                      lambda q, k: np.einsum("bhqd,bhkd->bhqk", q, k),
                      ((2, 3, R, 19), (2, 3, 23, 19))),
    "einsum_implicit": ('a: Tensor["R", 19, f32], b: Tensor["C", 19, f32]', '"R", "C", f32',
                        'einsum("ij,kj", a, b)', lambda a, b: a @ b.T, ((R, 19), (C, 19))),
    "einsum_transpose": ('x: Tensor["R", "C", f32]', '"C", "R", f32', 'einsum("ij->ji", x)',
                         lambda x: x.T, ((R, C),)),
    "einsum_sums": ('x: Tensor["R", "C", f32]', '"C", f32',
                    'einsum("ij->j", x) + einsum("ij->", x)',
                    lambda x: x.sum(0) + x.sum(), ((R, C),)),
    "einsum_outer": ('a: Tensor["R", f32], b: Tensor["C", f32]', '"C", "R", f32',
                     'einsum("i,j->ji", [a, b])', lambda a, b: np.outer(b, a), ((R,), (C,))),
    "einsum_mixed": ('a: Tensor[5, "R", 19, f32], b: Tensor[19, 4, 3, f32]', '4, 5, f32',
                     'einsum("ijk,klm->li", a, b)', lambda a, b: np.einsum("ijk,klm->li", a, b),
                     ((5, R, 19), (19, 4, 3))),
    "cumsum_rows": ('x: Tensor["R", "C", f32]', '"R", "C", f32', "cumsum(x, axis=-1)",
                    lambda x: np.cumsum(x, -1), ((R, C),)),
    "cumsum_columns": ('x: Tensor["R", "C", bf16]', '"R", "C", bf16', "x.cumsum(dim=0)",
                       lambda x: np.cumsum(x, 0).astype(ml_dtypes.bfloat16).astype(np.float64),
                       ((R, C),)),
    "cumsum_flat": ('x: Tensor["R", 3, f32]', '"R*3", f32', "cumsum(x)",
                    lambda x: np.cumsum(x), ((R, 3),)),
    "cumsum_ints": ('x: Tensor["R", "C", f32]', '"R", "C", i32',
                    "cumsum(cast(x * 100.0, i32), axis=1)",
                    lambda x: np.cumsum((x.astype(np.float32) * np.float32(100)).astype(np.int32),
                                        1, dtype=np.int32), ((R, C),)),
}  # fmt: skip


def _torch_ce(x: np.ndarray, y: np.ndarray, **options: Any) -> np.ndarray:
    """PyTorch's cross-entropy in float64."""
    return F.cross_entropy(torch.tensor(x), torch.tensor(y).long(), **options).numpy()


SOURCE = "\n".join(
    f"def of_{name}({params}) -> Tensor[{result}]:\n    return {body}\n"
    for name, (params, result, body, _, _) in CASES.items()
)


def _inputs(name: str) -> list[np.ndarray]:
    """Normals with zeros among them (``any``/``all`` see a zero as false), and a row of
    zeros when the input has rows of ``C``."""
    rng = np.random.default_rng(list(CASES).index(name))
    made = []
    for shape in CASES[name][4]:
        if isinstance(shape[0], str):  # integers in [0, high), and class labels with -100s
            kind, high, shape = shape
            ints = rng.integers(0, high, shape)
            if kind == "labels":
                ints[rng.random(shape) < 0.15] = -100
            made.append(ints.astype(np.int32))
            continue
        x = rng.standard_normal(shape) * 2.0
        x[rng.random(shape) < 0.02] = 0.0
        if name.startswith(("any", "all")):
            x[3] = 0.0
            x[5] = np.abs(x[5]) + 1.0
        made.append(x.astype(ml_dtypes.bfloat16 if "bf16" in CASES[name][0] else np.float32))
    return made


def _expected(name: str) -> tuple[list[np.ndarray], np.ndarray]:
    inputs = _inputs(name)
    as64 = (x if np.issubdtype(x.dtype, np.integer) else x.astype(np.float64) for x in inputs)
    want = np.asarray(CASES[name][3](*as64))
    return inputs, want


def _check(have: np.ndarray, want: np.ndarray, rtol: float = 1e-6) -> None:
    assert have.shape == want.shape
    if np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(have, want)
        return
    written = ~np.isnan(want)
    assert not np.isnan(have[written]).any(), "some outputs were never written"
    # sums of products of normals cancel: their error is relative to the terms' size
    atol = rtol * np.abs(want[written]).max(initial=0.0) if rtol > 1e-6 else 0.0
    np.testing.assert_allclose(have, want, rtol=rtol, atol=atol)


def _tolerance(name: str) -> float:
    """Exact copies and index arithmetic to the last bit; a loss to f32's rounding of a
    log-softmax and its sums."""
    if name == "cumsum_columns":  # a bf16 result: to its rounding
        return 8e-3
    return 2e-5 if name.startswith(("cross_entropy", "einsum", "cumsum")) else 1e-6


#: Every case's function, built once for each target: the CPU, OpenCL and CUDA on the
#: simulated GPU here, the rest exhaustive.
built = built_everywhere(SOURCE, "cpu", "opencl", "sm_80")


@pytest.mark.parametrize("name", list(CASES))
def test_op_matches_numpy(built: Any, name: str) -> None:
    inputs, want = _expected(name)
    integer = np.issubdtype(want.dtype, np.integer)
    dtype = np.int32 if integer else np.float32
    if CASES[name][1].endswith("bf16"):
        dtype = ml_dtypes.bfloat16
    poison = np.full(want.shape, 12345 if integer else np.nan, dtype)
    have = getattr(built, f"of_{name}")(*inputs, out=poison)
    _check(np.asarray(have), want, _tolerance(name))


#: The cases whose kernels the tile interpreter cannot run yet: reductions along the
#: first axis or over every axis (``test_math_ops.INTERPRETER_LACKS``; a mean loss sums
#: its rows), kernels that read an input through a view of other dims (``squeeze``,
#: ``flatten``, the gathers' indices), the joins, whose library ``pad`` kernel reads its
#: row as a view of the tensor joined, and the gathers along the first axis, which
#: read the table through a transpose. (``einsum_sums`` sums columns; ``einsum_outer``
#: reads a vector as a view of one column; ``cumsum_flat`` reads its input flattened.)
INTERPRETER_LACKS = frozenset(
    {"all_columns", "any_every_axis", "einsum_sums", "einsum_outer", "cumsum_flat"}
) | {
    n for n in CASES
    if n.startswith(("concat", "stack", "squeeze", "flatten", "take", "embedding", "cross"))
}  # fmt: skip


def test_the_tile_interpreter_computes_each_op() -> None:
    """The reference semantics of the Tile IR (``tile/interpret.py``) on the CPU's
    kernels, ``index_along`` of no operand (``arange``, the fills, the triangles)
    among them."""
    module = tessera.compile(SOURCE, "ops.tsr", target="cpu", until="tile").ir("tile")
    for name in (n for n in CASES if n not in INTERPRETER_LACKS):
        inputs, want = _expected(name)
        params = [p.split(":")[0].strip() for p in CASES[name][0].split("],")]
        out = run_function(module, f"of_{name}", dict(zip(params, inputs, strict=True)))["out"]
        _check(np.asarray(out).reshape(want.shape), want, _tolerance(name))


BAD = {
    "squeeze of a size that is not 1": (
        "def f(x: Tensor[4, 3, f32]) -> Tensor[4, f32]:\n    return squeeze(x, 1)\n",
        2, "squeeze: can only drop axes of size 1; axis 1 of x is [4, 3] is 3",
    ),
    "squeeze of a symbolic size": (
        "def f(x: Tensor['N', 'C', f32]) -> Tensor['N', f32]:\n    return x.squeeze(-1)\n",
        2, "can only drop axes of size 1; axis 1 of x is [N, C] is C",
    ),
    "unsqueeze out of range": (
        "def f(x: Tensor['N', f32]) -> Tensor['N', 1, f32]:\n    return x.unsqueeze(2)\n",
        2, "unsqueeze: axis 2 is out of range for a rank-2 result",
    ),
    "unsqueeze without an axis": (
        "def f(x: Tensor['N', f32]) -> Tensor['N', 1, f32]:\n    return unsqueeze(x)\n",
        2, "unsqueeze: needs the new axis: unsqueeze(x, 0)",
    ),
    "axis and dim": (
        "def f(x: Tensor['N', f32]) -> Tensor['N', 1, f32]:\n    return unsqueeze(x, 1, dim=1)\n",
        2, "give 'axis' or 'dim' (its PyTorch name), not both",
    ),
    "flatten bounds": (
        "def f(x: Tensor['N', 3, f32]) -> Tensor['N', 3, f32]:\n    return flatten(x, 1, 0)\n",
        2, "flatten: start_dim 1 comes after end_dim 0",
    ),
    "broadcast of a size that is not 1": (
        "def f(x: Tensor[3, f32]) -> Tensor[2, 4, f32]:\n    return broadcast_to(x, (2, 4))\n",
        2, "broadcast_to: cannot broadcast x is [3] to [2, 4]: only an axis of size 1",
    ),
    "broadcast to fewer dims": (
        "def f(x: Tensor[2, 3, f32]) -> Tensor[3, f32]:\n    return broadcast_to(x, (3,))\n",
        2, "cannot broadcast x is [2, 3] to 1 dims: fewer than its 2",
    ),
    "zeros of a tensor": (
        "def f(x: Tensor[2, 3, f32]) -> Tensor[2, 3, f32]:\n    return zeros(x)\n",
        2, "zeros: 'shape' must be a shape: a size, or a tuple of sizes",
    ),
    "a size no parameter has": (
        "def f(x: Tensor['N', f32]) -> Tensor['N', 'Q', f32]:\n    return zeros(('N', 'Q'))\n",
        2, "zeros: \"Q\" names Q, which no parameter has as a size",
    ),
    "arange of a float size step": (
        "def f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return arange(0, x.shape[0], 2)\n",
        2, "arange: a size as a bound needs integer bounds and a step of 1",
    ),
    "arange step zero": (
        "def f(x: Tensor['N', f32]) -> Tensor[3, f32]:\n    return arange(0, 3, 0)\n",
        2, "arange: 'step' must be a nonzero number, not 0",
    ),
    "concat shapes": (
        "def f(a: Tensor[4, 3, f32], b: Tensor[5, 2, f32]) -> Tensor[9, 3, f32]:\n"
        "    return concat([a, b])\n",
        2, "concat: the tensors' sizes differ off the joined axis 0: [4, 3], [5, 2]",
    ),
    "concat ranks": (
        "def f(a: Tensor[4, 3, f32], b: Tensor[3, f32]) -> Tensor[5, 3, f32]:\n"
        "    return cat((a, b))\n",
        2, "cat: the tensors must have one rank: [4, 3], [3]",
    ),
    "concat of a tensor": (
        "def f(a: Tensor[4, 3, f32]) -> Tensor[4, 3, f32]:\n    return concat(a)\n",
        2, "concat: 'tensors' must be a list or tuple of tensors, such as [a, b]",
    ),
    "concat axis": (
        "def f(a: Tensor[4, 3, f32]) -> Tensor[4, 6, f32]:\n    return concat([a, a], axis=2)\n",
        2, "concat: axis 2 is out of range for a rank-2 result",
    ),
    "stack shapes": (
        "def f(a: Tensor[4, 3, f32], b: Tensor[4, 2, f32]) -> Tensor[2, 4, 3, f32]:\n"
        "    return stack([a, b])\n",
        2, "stack: the tensors' sizes differ off the joined axis 0",
    ),
    "tril of a vector": (
        "def f(x: Tensor[4, f32]) -> Tensor[4, f32]:\n    return tril(x)\n",
        2, "tril: needs at least 2 dims; x is [4]",
    ),
    "any axis": (
        "def f(x: Tensor[4, f32]) -> Tensor[f32]:\n    return cast(any(x, axis=1), f32)\n",
        2, "any: axis 1 is out of range for a rank-1 value",
    ),
    "any result": (
        "def f(x: Tensor[4, f32]) -> Tensor[f32]:\n    return any(x)\n",
        2, "returns bool, but the declared result is f32; convert it with cast(..., f32)",
    ),
    "take of float indices": (
        "def f(w: Tensor[5, 3, f32], i: Tensor[4, f32]) -> Tensor[4, 3, f32]:\n"
        "    return take(w, i, axis=0)\n",
        2, "take: the indices must be an integer tensor; i is f32",
    ),
    "indexing by a tensor and a number": (
        "def f(w: Tensor[5, 3, f32], i: Tensor[4, i32]) -> Tensor[4, f32]:\n"
        "    return w[i, 0]\n",
        2, "indexing by an integer tensor takes whole rows: w[ids] or w[ids, :]",
    ),
    "embedding of a vector": (
        "def f(w: Tensor[5, f32], i: Tensor[4, i32]) -> Tensor[4, f32]:\n"
        "    return embedding(i, w)\n",
        2, "embedding: 'weight' must be a [V, D] table; w is [5]",
    ),
    "cross_entropy of float targets": (
        "def f(x: Tensor[4, 3, f32], t: Tensor[4, 3, f32]) -> Tensor[f32]:\n"
        "    return cross_entropy(x, t)\n",
        2, "cross_entropy: 'target' must be integer class labels [N]; t is [4, 3], f32",
    ),
    "cross_entropy rows": (
        "def f(x: Tensor[4, 3, f32], t: Tensor[5, i32]) -> Tensor[f32]:\n"
        "    return cross_entropy(x, t)\n",
        2, "cross_entropy: one label per row: x is [4, 3], t is [5]",
    ),
    "cross_entropy reduction": (
        "def f(x: Tensor[4, 3, f32], t: Tensor[4, i32]) -> Tensor[f32]:\n"
        "    return cross_entropy(x, t, reduction='avg')\n",
        2, "cross_entropy: reduction is one of 'mean', 'sum', 'none', not 'avg'",
    ),
    "einsum with a diagonal": (
        "def f(x: Tensor[4, 4, f32]) -> Tensor[f32]:\n    return einsum('ii->', x)\n",
        2, "einsum: 'ii' repeats 'i': a diagonal (a trace) is not supported",
    ),
    "einsum term count": (
        "def f(x: Tensor[4, 4, f32]) -> Tensor[4, f32]:\n    return einsum('ij,jk->i', x)\n",
        2, "einsum: 'ij,jk->i' has 2 operand terms, but 1 operand is given",
    ),
    "einsum term rank": (
        "def f(x: Tensor[4, 4, f32]) -> Tensor[4, f32]:\n    return einsum('ijk->i', x)\n",
        2, "einsum: the term 'ijk' names 3 axes of a tensor of 2: [4, 4]",
    ),
    "einsum result letter": (
        "def f(x: Tensor[4, 4, f32]) -> Tensor[4, f32]:\n    return einsum('ij->k', x)\n",
        2, "einsum: the result's 'k' is in no operand: 'ij->k'",
    ),
    "einsum sizes": (
        "def f(a: Tensor[4, 3, f32], b: Tensor[5, 2, f32]) -> Tensor[4, 2, f32]:\n"
        "    return einsum('ij,jk->ik', a, b)\n",
        2, "einsum: 'j' is 3 in one operand and 5 in another",
    ),
    "cumsum of axes": (
        "def f(x: Tensor[4, 4, f32]) -> Tensor[4, 4, f32]:\n    return cumsum(x, axis=(0, 1))\n",
        2, "cumsum: takes one axis",
    ),
    "einsum ellipsis": (
        "def f(x: Tensor[4, 4, f32]) -> Tensor[4, 4, f32]:\n    return einsum('...ij->...ji', x)\n",
        2, "einsum: '...' (broadcast dims) is not supported",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_an_error_at_its_line(case: str) -> None:
    assert_one_error(*BAD[case])


@pytest.mark.compile
@pytest.mark.parametrize("compiler", COMPILERS)
def test_cpu_code_compiles_warning_free(compiler: str, tmp_path: Path) -> None:
    """g++ and clang++ with -Wall -Wextra -Werror: a kernel that reads no input
    (``arange``'s, the fills') included."""
    assert_cpu_builds_warning_free(SOURCE, "ops.tsr", compiler, tmp_path)


@pytest.mark.compile
@pytest.mark.parametrize(
    ("target", "arch"),
    [
        # 40 s of one core: the sweep's, as the others (the examples' builds by nvcc, in
        # the default tier, cover the same emitter)
        pytest.param("cuda", "sm_80", marks=pytest.mark.exhaustive),
        pytest.param("cuda", "sm_90a", marks=pytest.mark.exhaustive),
        pytest.param("hip", "gfx90a", marks=pytest.mark.exhaustive),  # hipcc: minutes of one core
    ],
)
def test_gpu_code_compiles_warning_free(target: str, arch: str, tmp_path: Path) -> None:
    """nvcc and hipcc, every warning an error."""
    assert_gpu_builds_warning_free(SOURCE, "ops.tsr", target, arch, tmp_path)


@pytest.mark.compile
@needs_nvrtc
@pytest.mark.parametrize(
    "arch",
    [
        # 40 to 70 s of one core each: the sweep's (nvcc builds sm_80 in the default tier,
        # and the examples' sm_90a builds there cover the same emitter)
        pytest.param("sm_80", marks=pytest.mark.exhaustive),
        pytest.param("sm_90a", marks=pytest.mark.exhaustive),
    ],
)
def test_nvrtc_builds_the_cuda_code(arch: str) -> None:
    """NVRTC, as the runtime builds the file: a warning in ptxas's report fails too."""
    program = tessera.compile(SOURCE, "ops.tsr", target="cuda", arch=arch)
    built = build(program.source, arch, program.ir("meta")["build"]["options"])
    assert built.cubin and "warning" not in built.report.lower(), built.report


@pytest.mark.compile
@needs_sycl_headers
def test_sycl_code_compiles_warning_free(tmp_path: Path) -> None:
    check_syntax({"ops": tessera.compile(SOURCE, "ops.tsr", target="sycl").source}, tmp_path)


def _kernels(source: str) -> list[str]:
    """The kinds of the kernels of the file's one function."""
    (function,) = tessera.compile(source, "fused.tsr", until="graph").ir("graph").functions
    return [g.kind for g in function.groups]


def test_compositions_fuse_as_their_ops_do() -> None:
    """Broadcasts, fills, ranges and triangles are elementwise math that one kernel
    computes where it reads them, with no kernel of their own (a value of fewer dims than
    the kernel's, ``arange(C)`` added to ``[R, C]``, is a kernel of its own, as ``exp(b)``
    of ``b [C]`` is); a join is a pad per tensor, the adds fused into them (and a zeros
    that gives the pads their row length); a batched einsum is one product."""
    elementwise = """\
def f(x: Tensor["R", "C", f32], b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    m = tril(x) + triu(x, 1) * broadcast_to(b, x.shape) + zeros(x.shape) + full(x.shape, 2.0)
    return m * x
"""
    assert _kernels(elementwise) == ["elementwise"]
    joined = """\
def f(a: Tensor["R", "C", f32], b: Tensor["R", 3, f32]) -> Tensor["R", "C+3", f32]:
    return concat([a, b], axis=-1)
"""
    assert _kernels(joined) == ["elementwise", "reduction", "reduction"]  # the add fused
    product = """\
def f(a: Tensor[3, "R", 8, f32], b: Tensor[3, 8, "C", f32]) -> Tensor[3, "R", "C", f32]:
    return einsum("bij,bjk->bik", a, b)
"""
    assert len(_kernels(product)) == 1
