"""``scaled_dot_product_attention(q, k, v, attn_mask=...)`` as PyTorch takes it: a mask
(a comparison, true where a key takes part) or a float tensor added to the scaled
scores, of any shape that broadcasts to the scores ``[..., L, S]``; with ``scale``,
grouped-query heads, and rows that the mask leaves no key (zeros, as PyTorch 2.13's on
the CPU). Each case runs on the CPU and on PoCL (the simulated GPUs in the exhaustive
tier) against ``torch.nn.functional.scaled_dot_product_attention`` in float64, on
random inputs of sizes that are no multiple of a tile (L=13, S=29, D=24), outputs
poisoned first; the gradients are autograd's and a finite difference's; bad calls are
errors at their line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tessera

from .builds import assert_cpu_builds_warning_free
from .everywhere import built_everywhere
from .test_autodiff import assert_one_error
from .test_cpu import COMPILERS

pytestmark = pytest.mark.execute

F = torch.nn.functional

SOURCE = """\
def bool_mask(q: Tensor["B", "H", "L", "D", f32], k: Tensor["B", "H", "S", "D", f32],
              v: Tensor["B", "H", "S", "D", f32], keep: Tensor["L", "S", f32]
              ) -> Tensor["B", "H", "L", "D", f32]:
    return scaled_dot_product_attention(q, k, v, attn_mask=keep > 0.0)

def padding(q: Tensor["B", "H", "L", "D", f32], k: Tensor["B", "H", "S", "D", f32],
            v: Tensor["B", "H", "S", "D", f32], lengths: Tensor["B", i32]
            ) -> Tensor["B", "H", "L", "D", f32]:
    S = k.shape[-2]
    mask = arange(S) < lengths[:, None, None, None]
    return scaled_dot_product_attention(q, k, v, mask, scale=0.3)

def additive(q: Tensor["B", "H", "L", "D", f32], k: Tensor["B", "H", "S", "D", f32],
             v: Tensor["B", "H", "S", "D", f32], bias: Tensor["B", "H", "L", "S", f32],
             s: float) -> Tensor["B", "H", "L", "D", f32]:
    return scaled_dot_product_attention(q, k, v, bias, 0.0, False, scale=s)

def alibi(q: Tensor["B", "H", "L", "D", f32], k: Tensor["B", "H", "S", "D", f32],
          v: Tensor["B", "H", "S", "D", f32], slopes: Tensor["H", 1, "S", f32]
          ) -> Tensor["B", "H", "L", "D", f32]:
    return scaled_dot_product_attention(q, k, v, attn_mask=slopes)

def grouped(q: Tensor["B", 4, "L", "D", f32], k: Tensor["B", 2, "S", "D", f32],
            v: Tensor["B", 2, "S", "D", f32], keep: Tensor["B", 1, "L", "S", f32]
            ) -> Tensor["B", 4, "L", "D", f32]:
    return scaled_dot_product_attention(q, k, v, attn_mask=keep > 0.0, enable_gqa=True)

def headless(q: Tensor["B", "L", "D", f32], k: Tensor["B", "S", "D", f32],
             v: Tensor["B", "S", "D", f32], bias: Tensor["L", "S", f32]
             ) -> Tensor["B", "L", "D", f32]:
    return scaled_dot_product_attention(q, k, v, attn_mask=bias)
"""

B, H, L, S, D = 2, 3, 13, 29, 24

_QKV = ((B, H, L, D), (B, H, S, D), (B, H, S, D))

#: Each case: the function, its float inputs' shapes, its other arguments (after the
#: floats), and PyTorch's result of the float64 tensors and those arguments.
CASES: dict[str, tuple[str, tuple[tuple[int, ...], ...], tuple, Any]] = {
    "bool [L, S]": (
        "bool_mask",
        (*_QKV, (L, S)),
        (),
        lambda q, k, v, keep: F.scaled_dot_product_attention(q, k, v, attn_mask=keep > 0),
    ),
    "padding [B, 1, 1, S]": (
        "padding",
        _QKV,
        (np.array([17, 0], np.int32),),
        lambda q, k, v, n: F.scaled_dot_product_attention(
            q, k, v, torch.arange(S) < torch.tensor(n)[:, None, None, None], scale=0.3
        ),
    ),
    "float [B, H, L, S]": (
        "additive",
        (*_QKV, (B, H, L, S)),
        (0.7,),
        lambda q, k, v, bias, s: F.scaled_dot_product_attention(q, k, v, bias, scale=s),
    ),
    "float [H, 1, S]": (
        "alibi",
        (*_QKV, (H, 1, S)),
        (),
        lambda q, k, v, slopes: F.scaled_dot_product_attention(q, k, v, attn_mask=slopes),
    ),
    "grouped bool [B, 1, L, S]": (
        "grouped",
        ((B, 4, L, D), (B, 2, S, D), (B, 2, S, D), (B, 1, L, S)),
        (),
        lambda q, k, v, keep: F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep > 0, enable_gqa=True
        ),
    ),
    "3-d float [L, S]": (
        "headless",
        ((B, L, D), (B, S, D), (B, S, D), (L, S)),
        (),
        lambda q, k, v, bias: F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
    ),
}

built = built_everywhere(SOURCE, "cpu", "opencl")


def _inputs(case: str, shapes: tuple[tuple[int, ...], ...]) -> list[np.ndarray]:
    """Random floats of ``shapes``; the last, the mask, leaves a query no key: row 4 is
    all false (a bool mask's), or all ``-inf`` (a float mask's, with some more ``-inf``
    scattered), so that the zeros of such rows are checked too."""
    rng = np.random.default_rng(sum(map(ord, case)))
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    mask = arrays[-1]
    if len(shapes) > 3 and mask.shape[-2] > 1:
        mask[..., 4, :] = -np.inf
        mask[rng.random(mask.shape) < 0.2] = -np.inf
    return arrays


def _torch(*arrays: np.ndarray, grad: bool = False) -> list[torch.Tensor]:
    return [torch.tensor(a, dtype=torch.float64, requires_grad=grad) for a in arrays]


@pytest.mark.parametrize("case", list(CASES))
def test_matches_pytorch(built: Any, case: str) -> None:
    name, shapes, others, reference = CASES[case]
    inputs = _inputs(case, shapes)
    want = reference(*_torch(*inputs), *others).numpy()
    poison = np.full(want.shape, np.nan, np.float32)
    have = np.asarray(getattr(built, name)(*inputs, *others, out=poison))
    np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5)
    if name != "alibi":  # every mask but the broadcast bias leaves some query no key
        empty = np.all(want == 0.0, axis=-1)
        assert empty.any() and np.all(have[empty] == 0.0)


GRADIENTS = """\
@autodiff
def masked(q: Tensor["B", 4, "L", "D", f32], k: Tensor["B", 2, "S", "D", f32],
           v: Tensor["B", 2, "S", "D", f32], bias: Tensor[4, "L", "S", f32],
           keep: Tensor["B", 1, 1, "S", f32]) -> Tensor["B", 4, "L", "D", f32]:
    padded = scaled_dot_product_attention(q, k, v, attn_mask=keep > 0.0, scale=0.3)
    return scaled_dot_product_attention(q, k, v, bias, enable_gqa=True) + padded

def loss(q: Tensor["B", 4, "L", "D", f32], k: Tensor["B", 2, "S", "D", f32],
         v: Tensor["B", 2, "S", "D", f32], bias: Tensor[4, "L", "S", f32],
         keep: Tensor["B", 1, 1, "S", f32], g: Tensor["B", 4, "L", "D", f32]) -> Tensor[f32]:
    return sum(masked(q, k, v, bias, keep) * g, axis=None)

def step(q: Tensor["B", 4, "L", "D", f32], k: Tensor["B", 2, "S", "D", f32],
         v: Tensor["B", 2, "S", "D", f32], bias: Tensor[4, "L", "S", f32],
         keep: Tensor["B", 1, 1, "S", f32], g: Tensor["B", 4, "L", "D", f32]
         ) -> tuple[Tensor[f32], Tensor["B", 4, "L", "D", f32], Tensor["B", 2, "S", "D", f32],
                    Tensor["B", 2, "S", "D", f32], Tensor[4, "L", "S", f32]]:
    value, (dq, dk, dv, dbias) = value_and_grad(loss, wrt=("q", "k", "v", "bias"))(
        q, k, v, bias, keep, g)
    return value, dq, dk, dv, dbias
"""

#: The gradients on the CPU; PoCL's build of the backward kernels takes 25 s, so there
#: and on the simulated GPUs they are checked in the exhaustive tier.
differentiated = built_everywhere(GRADIENTS, "cpu")


def _grad_inputs() -> list[np.ndarray]:
    """q, k and v of two groups of two heads, a float mask of each head with ``-inf``
    scattered and a row all ``-inf``, a padding mask of which batch 1 keeps no key, and
    the cotangent."""
    rng = np.random.default_rng(13)
    q, k, v, bias, keep, g = (
        rng.standard_normal(shape).astype(np.float32)
        for shape in ((B, 4, L, D), (B, 2, S, D), (B, 2, S, D), (4, L, S), (B, 1, 1, S),
                      (B, 4, L, D))
    )  # fmt: skip
    bias[rng.random(bias.shape) < 0.2] = -np.inf
    bias[1, 6] = -np.inf
    keep[1] = -1.0
    return [q, k, v, bias, keep, g]


def _pytorch_gradients(arrays: list[np.ndarray]) -> tuple[float, list[np.ndarray]]:
    q, k, v, bias, keep, g = arrays
    tq, tk, tv, tbias = _torch(q, k, v, bias, grad=True)
    padded = F.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=torch.tensor(keep) > 0, scale=0.3, enable_gqa=True
    )
    out = F.scaled_dot_product_attention(tq, tk, tv, tbias, enable_gqa=True) + padded
    total = (out * torch.tensor(g, dtype=torch.float64)).sum()
    total.backward()
    return total.item(), [t.grad.numpy() for t in (tq, tk, tv, tbias)]


def _poisoned(*like: np.ndarray) -> tuple[np.ndarray, ...]:
    """NaN-filled arrays of the shapes of ``like``, for ``out=``."""
    return tuple(np.full(np.shape(x), np.nan, np.float32) for x in like)


def test_gradients_are_pytorchs(differentiated: Any) -> None:
    """``masked_vjp`` and ``value_and_grad`` of a loss of it: dq, dk (summed over each
    group of q heads), dv and the float mask's gradient, against autograd; none NaN,
    where the mask leaves a query no key or a score is ``-inf``."""
    arrays = _grad_inputs()
    value, want = _pytorch_gradients(arrays)
    *inputs, g = arrays
    through_vjp = differentiated.masked_vjp(*inputs, g, out=_poisoned(*inputs))
    total, *through_step = differentiated.step(*arrays, out=_poisoned(np.float32(0), *inputs[:4]))
    np.testing.assert_allclose(total, value, rtol=1e-5)
    for have in (through_vjp[:4], through_step):
        for got, expected in zip(have, want, strict=True):
            assert not np.isnan(got).any()
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert np.all(through_vjp[4] == 0.0)  # the padding mask is a comparison: no gradient


def test_gradients_are_the_slope(differentiated: Any) -> None:
    """The directional derivative of the loss along a random direction of q, k, v and
    the mask's finite elements, against a central difference of the f32 loss."""
    arrays = _grad_inputs()
    *inputs, g = arrays
    rng = np.random.default_rng(31)
    directions = [rng.standard_normal(x.shape).astype(np.float32) for x in inputs[:4]]
    directions[3][np.isinf(inputs[3])] = 0.0
    grads = differentiated.masked_vjp(*inputs, g, out=_poisoned(*inputs))[:4]
    slope = sum(
        float(np.sum(gr.astype(np.float64) * d)) for gr, d in zip(grads, directions, strict=True)
    )

    def loss_at(t: float) -> float:
        moved = [x + t * d for x, d in zip(inputs[:4], directions, strict=True)]
        return float(np.asarray(differentiated.loss(*moved, inputs[4], g)))

    h = 1e-2
    difference = (loss_at(h) - loss_at(-h)) / (2 * h)
    assert abs(difference - slope) <= 2e-3 * abs(slope) + 1e-3, (difference, slope)


def test_bf16_with_a_bf16_mask() -> None:
    """bf16 queries, keys, values and mask: the scores and the softmax in f32, the
    probabilities rounded to bf16 for the second product, the result bf16."""
    source = (
        'def f(q: Tensor[2, "L", 32, bf16], k: Tensor[2, "S", 32, bf16], '
        'v: Tensor[2, "S", 32, bf16], bias: Tensor["L", "S", bf16]) -> Tensor[2, "L", 32, bf16]:\n'
        "    return scaled_dot_product_attention(q, k, v, attn_mask=bias)\n"
    )
    lib: Any = tessera.compile(source, "bf16.tsr", target="cpu").load()
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, n, 32)).astype(ml_dtypes.bfloat16) for n in (L, S, S))
    bias = rng.standard_normal((L, S)).astype(ml_dtypes.bfloat16)
    have = lib.f(q, k, v, bias)
    assert have.dtype == ml_dtypes.bfloat16
    want = F.scaled_dot_product_attention(
        *_torch(*(x.astype(np.float32) for x in (q, k, v, bias)))
    ).numpy()
    np.testing.assert_allclose(have.astype(np.float32), want, rtol=2e-2, atol=2e-2)


def _bad(signature: str, body: str) -> str:
    return f"def f({signature}):\n    return {body}\n"


_QKV_SIG = "q: Tensor[2, 4, 9, 8, f32], k: Tensor[2, 4, 11, 8, f32], v: Tensor[2, 4, 11, 8, f32]"
_SDPA = "scaled_dot_product_attention"

#: Calls PyTorch refuses too, or that Tessera does not take: the source, the line of
#: the error, and its text.
BAD = {
    "mask that does not broadcast": (
        _bad(f"{_QKV_SIG}, m: Tensor[9, 10, f32]", f"{_SDPA}(q, k, v, attn_mask=m)"),
        2,
        "attn_mask must broadcast to the scores [..., L, S] = [2, 4, 9, 11]; m is [9, 10]",
    ),
    "mask of another name": (
        _bad(
            'q: Tensor["B", "L", 8, f32], k: Tensor["B", "S", 8, f32], '
            'v: Tensor["B", "S", 8, f32], m: Tensor["L", "T", f32]',
            f"{_SDPA}(q, k, v, attn_mask=m > 0.0)",
        ),
        2,
        "attn_mask must broadcast to the scores [..., L, S] = [B, L, S]; m > 0.0 is [L, T]",
    ),
    "mask of more dims than the scores": (
        _bad(f"{_QKV_SIG}, m: Tensor[3, 2, 4, 9, 11, f32]", f"{_SDPA}(q, k, v, m)"),
        2,
        "attn_mask must broadcast to the scores [..., L, S] = [2, 4, 9, 11]; m is "
        "[3, 2, 4, 9, 11]",
    ),
    "mask of one dim": (
        _bad(f"{_QKV_SIG}, m: Tensor[11, f32]", f"{_SDPA}(q, k, v, attn_mask=m)"),
        2,
        "attn_mask must broadcast to the scores [..., L, S] = [2, 4, 9, 11]; m is [11]",
    ),
    "integer mask": (
        _bad(f"{_QKV_SIG}, m: Tensor[9, 11, i32]", f"{_SDPA}(q, k, v, attn_mask=m)"),
        2,
        "attn_mask must be a mask (a comparison, true where a key takes part) or floats of "
        "the query's dtype (f32) added to the scores, as PyTorch's; m is i32: write m != 0",
    ),
    "float mask of another dtype": (
        _bad(
            "q: Tensor[4, 9, 8, bf16], k: Tensor[4, 11, 8, bf16], v: Tensor[4, 11, 8, bf16], "
            "m: Tensor[9, 11, f32]",
            f"{_SDPA}(q, k, v, attn_mask=m)",
        ),
        2,
        "the query's dtype (bf16) added to the scores, as PyTorch's; m is f32: write "
        "cast(m, bf16)",
    ),
    "mask of a number": (
        _bad(_QKV_SIG, f"{_SDPA}(q, k, v, attn_mask=0.5)"),
        2,
        "'attn_mask' must be a tensor",
    ),
    "mask and is_causal": (
        "def f(" + _QKV_SIG + ", m: Tensor[9, 11, f32]) -> Tensor[2, 4, 9, 8, f32]:\n"
        "    y = q * 2.0\n"
        f"    return {_SDPA}(y, k, v, attn_mask=m > 0.0,\n"
        "                   is_causal=True)\n",
        4,
        "attn_mask with is_causal=True is an error, as in PyTorch",
    ),
    "mask and dropout": (
        _bad(f"{_QKV_SIG}, m: Tensor[9, 11, f32]", f"{_SDPA}(q, k, v, m, dropout_p=0.1)"),
        2,
        "dropout_p with attn_mask is not taken: its dropout would have no seed",
    ),
    "mask and a dropout parameter": (
        _bad(f"{_QKV_SIG}, m: Tensor[9, 11, f32], p: float", f"{_SDPA}(q, k, v, m, p)"),
        2,
        "dropout_p with attn_mask is not taken",
    ),
    "mask and a negative scale": (
        _bad(f"{_QKV_SIG}, m: Tensor[9, 11, f32]", f"{_SDPA}(q, k, v, m, scale=-1.0)"),
        2,
        "scale must be positive, not -1.0",
    ),
    "mask and head dims": (
        _bad(
            "q: Tensor[2, 9, 8, f32], k: Tensor[2, 11, 6, f32], v: Tensor[2, 11, 6, f32], "
            "m: Tensor[9, 11, f32]",
            f"{_SDPA}(q, k, v, m)",
        ),
        2,
        "scaled_dot_product_attention: q and k head dims differ: q is [2, 9, 8], k is [2, 11, 6]",
    ),
    "mask as the query": (
        _bad(f"{_QKV_SIG}, m: Tensor[9, 11, f32]", f"{_SDPA}(q > 0.0, k, v)"),
        2,
        "q > 0.0 is a mask (a comparison): attention reads floats, and only attn_mask takes",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_an_error_at_its_line(case: str) -> None:
    assert_one_error(*BAD[case])


@pytest.mark.compile
@pytest.mark.parametrize(
    "compiler",
    [c if c == "g++" else pytest.param(c, marks=pytest.mark.exhaustive) for c in COMPILERS],
)
def test_cpu_code_compiles_warning_free(compiler: str, tmp_path: Path) -> None:
    """The masked attention, its gradient and ``value_and_grad`` of it, by g++ and
    clang++ with -Wall -Wextra -Werror (clang++'s full compile, 18 s, in the exhaustive
    tier)."""
    assert_cpu_builds_warning_free(SOURCE + "\n" + GRADIENTS, "sdpa.tsr", compiler, tmp_path)
