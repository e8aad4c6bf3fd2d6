"""PyTorch's ``torch.nn.functional`` names in graph functions, with PyTorch's signatures:
``linear``, ``bmm``, ``scaled_dot_product_attention``, ``layer_norm``, ``rms_norm``,
``normalize`` and ``mse_loss``. Each is checked on the CPU and on PoCL (the other targets
in the exhaustive tier) against ``torch.nn.functional`` in float64, on random inputs of
sizes that are no multiple of a tile, outputs poisoned first; the bad calls are errors
at their line; and the gradients through ``linear`` and ``layer_norm`` are PyTorch's.
``scaled_dot_product_attention`` with ``attn_mask`` is checked in ``test_sdpa_mask``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tessera

from .everywhere import built_everywhere
from .test_autodiff import assert_one_error

pytestmark = pytest.mark.execute

F = torch.nn.functional

SOURCE = """\
def projected(x: Tensor["B", "S", "K", f32], w: Tensor["N", "K", f32],
              b: Tensor["N", f32]) -> Tensor["B", "S", "N", f32]:
    return linear(x, w, b)

def two_layers(x: Tensor["S", "K", f32], w1: Tensor["H", "K", f32], b1: Tensor["H", f32],
               w2: Tensor["N", "H", f32]) -> Tensor["S", "N", f32]:
    return linear(gelu(linear(x, w1, bias=b1), approximate="none"), w2)

def one_vector(v: Tensor["K", f32], w: Tensor["N", "K", f32]) -> Tensor["N", f32]:
    return linear(v, w, None)

def batched(a: Tensor["B", "M", "K", f32], b: Tensor["B", "K", "N", f32]
            ) -> Tensor["B", "M", "N", f32]:
    return bmm(a, b)

def attention(q: Tensor["B", "H", "S", "D", f32], k: Tensor["B", "H", "T", "D", f32],
              v: Tensor["B", "H", "T", "D", f32]) -> Tensor["B", "H", "S", "D", f32]:
    return scaled_dot_product_attention(q, k, v)

def causal(q: Tensor["B", "H", "S", "D", f32], k: Tensor["B", "H", "T", "D", f32],
           v: Tensor["B", "H", "T", "D", f32]) -> Tensor["B", "H", "S", "D", f32]:
    return scaled_dot_product_attention(q, k, v, None, 0.0, True, scale=0.3)

def grouped(q: Tensor["B", "H", "S", "D", f32], k: Tensor["B", "G", "S", "D", f32],
            v: Tensor["B", "G", "S", "D", f32]) -> Tensor["B", "H", "S", "D", f32]:
    return scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

def layer_norms(x: Tensor["N", "D", f32], w: Tensor["D", f32],
                b: Tensor["D", f32]) -> Tensor["N", "D", f32]:
    N, D = x.shape
    return layer_norm(x, (D,), w, b) + layer_norm(x, x.shape[-1:], eps=1e-3) * 0.5

def fixed_width(x: Tensor["B", "S", 13, f32], w: Tensor[13, f32]) -> Tensor["B", "S", 13, f32]:
    return layer_norm(x, 13, weight=w) + layer_norm(x, [13], None, w, 1e-2)

def rms_norms(x: Tensor["N", "D", f32], w: Tensor["D", f32]) -> Tensor["N", "D", f32]:
    small = rms_norm(x * 0.0005, x.shape[-1:])  # where f32's eps, PyTorch's default, counts
    return rms_norm(x, x.shape[-1:], w) + rms_norm(x, (x.shape[-1],), eps=0.5) + small

def normalized(x: Tensor["A", "B", "C", f32]) -> Tensor["A", "B", "C", f32]:
    return normalize(x) + normalize(x, p=3.0, dim=-1, eps=0.1)

def squared_error(x: Tensor["N", "D", f32], y: Tensor["N", "D", f32]) -> Tensor[f32]:
    return mse_loss(x, y)

def squared_errors(x: Tensor["N", "D", f32], y: Tensor["N", "D", f32]
                   ) -> tuple[Tensor[f32], Tensor["N", "D", f32]]:
    return mse_loss(x, y, reduction="sum"), mse_loss(x, y, reduction="none")

def block_loss(x: Tensor["N", "D", f32], g: Tensor["D", f32], beta: Tensor["D", f32],
               w: Tensor["M", "D", f32], b: Tensor["M", f32],
               t: Tensor["N", "M", f32]) -> Tensor[f32]:
    return mse_loss(tanh(linear(layer_norm(x, x.shape[-1:], g, beta), w, b)), t)

def block_grads(x: Tensor["N", "D", f32], g: Tensor["D", f32], beta: Tensor["D", f32],
                w: Tensor["M", "D", f32], b: Tensor["M", f32], t: Tensor["N", "M", f32]
                ) -> tuple[Tensor[f32], Tensor["N", "D", f32], Tensor["D", f32],
                           Tensor["D", f32], Tensor["M", "D", f32], Tensor["M", f32]]:
    loss, (dx, dg, dbeta, dw, db) = value_and_grad(
        block_loss, wrt=("x", "g", "beta", "w", "b"))(x, g, beta, w, b, t)
    return loss, dx, dg, dbeta, dw, db
"""

_F32_EPS = torch.finfo(torch.float32).eps

#: Each case: the function, its inputs' shapes, and PyTorch's result in float64.
CASES: dict[str, tuple[str, tuple[tuple[int, ...], ...], Any]] = {
    "linear": ("projected", ((2, 5, 7), (6, 7), (6,)), F.linear),
    "linear_twice": (
        "two_layers",
        ((9, 7), (11, 7), (11,), (5, 11)),
        lambda x, w1, b1, w2: F.linear(F.gelu(F.linear(x, w1, b1)), w2),
    ),
    "linear_vector": ("one_vector", ((13,), (3, 13)), F.linear),
    "bmm": ("batched", ((3, 5, 7), (3, 7, 9)), torch.bmm),
    "sdpa": (
        "attention",
        ((2, 3, 9, 6), (2, 3, 11, 6), (2, 3, 11, 6)),
        F.scaled_dot_product_attention,
    ),
    "sdpa_causal": (
        "causal",
        ((2, 3, 9, 6), (2, 3, 11, 6), (2, 3, 11, 6)),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
    ),
    "sdpa_grouped": (
        "grouped",
        ((1, 4, 7, 6), (1, 2, 7, 6), (1, 2, 7, 6)),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    ),
    "layer_norm": (
        "layer_norms",
        ((7, 19), (19,), (19,)),
        lambda x, w, b: F.layer_norm(x, (19,), w, b) + F.layer_norm(x, (19,), eps=1e-3) * 0.5,
    ),
    "layer_norm_fixed": (
        "fixed_width",
        ((2, 5, 13), (13,)),
        lambda x, w: F.layer_norm(x, (13,), w) + F.layer_norm(x, (13,), None, w, 1e-2),
    ),
    "rms_norm": (
        "rms_norms",
        ((7, 19), (19,)),
        # PyTorch's eps of None is the input's dtype's: f32's here, float64's in torch
        lambda x, w: F.rms_norm(x, (19,), w, eps=_F32_EPS)
        + F.rms_norm(x, (19,), eps=0.5)
        + F.rms_norm(x * 0.0005, (19,), eps=_F32_EPS),
    ),
    "normalize": (
        "normalized",
        ((3, 5, 7),),
        lambda x: F.normalize(x) + F.normalize(x, p=3.0, dim=-1, eps=0.1),
    ),
    "mse_loss": ("squared_error", ((7, 9), (7, 9)), F.mse_loss),
}


built = built_everywhere(SOURCE, "cpu", "opencl")


def _inputs(case: str, shapes: tuple[tuple[int, ...], ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(len(case) + 100 * len(shapes))
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


def _torch(*arrays: np.ndarray, grad: bool = False) -> list[torch.Tensor]:
    return [torch.tensor(a, dtype=torch.float64, requires_grad=grad) for a in arrays]


@pytest.mark.parametrize("case", list(CASES))
def test_matches_pytorch(built: Any, case: str) -> None:
    name, shapes, reference = CASES[case]
    inputs = _inputs(case, shapes)
    want = reference(*_torch(*inputs)).numpy()
    poison = np.full(want.shape, np.nan, np.float32)
    have = getattr(built, name)(*inputs, out=poison)
    np.testing.assert_allclose(np.asarray(have), want, rtol=1e-5, atol=1e-5)


def test_mse_loss_sums_or_keeps_each_error(built: Any) -> None:
    x, y = _inputs("mse", ((11, 6), (11, 6)))
    total, each = built.squared_errors(x, y)
    tx, ty = _torch(x, y)
    np.testing.assert_allclose(total, F.mse_loss(tx, ty, reduction="sum").item(), rtol=1e-5)
    np.testing.assert_allclose(each, F.mse_loss(tx, ty, reduction="none").numpy(), rtol=1e-5)


def test_gradients_through_linear_and_layer_norm_are_pytorchs(built: Any) -> None:
    """``value_and_grad`` of a loss made of ``layer_norm``, ``linear`` and ``mse_loss``:
    the loss and the gradients of the input and of every parameter, against autograd."""
    n, d, m = 9, 13, 5
    arrays = _inputs("grads", ((n, d), (d,), (d,), (m, d), (m,), (n, m)))
    loss, *grads = built.block_grads(*arrays)
    x, g, beta, w, b, t = _torch(*arrays, grad=True)
    want = F.mse_loss(torch.tanh(F.linear(F.layer_norm(x, (d,), g, beta), w, b)), t)
    want.backward()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
    for have, param in zip(grads, (x, g, beta, w, b), strict=True):
        np.testing.assert_allclose(have, param.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_linear_reads_the_weight_where_it_lies() -> None:
    """``linear(x, w, b)`` is the product with the weight read transposed in place, and
    the bias added in its epilogue: one kernel, no copy of the weight."""
    text = str(tessera.compile(SOURCE, "functional.tsr", target="cpu").inspect_ir("graph"))
    body = text[text.index("func @projected") : text.index("func @two_layers")]
    assert body.count("kernel ") == 1 and "trans_b = true" in body, body
    assert "transpose" not in body, body


def test_a_normalized_shape_against_a_symbolic_size_is_checked_at_the_call() -> None:
    """``layer_norm(x, 8)`` of ``x [N, D]``: ``D`` is 8 or the call is refused before
    any kernel runs."""
    source = 'def f(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:\n' + (
        "    return layer_norm(x, 8)\n"
    )
    lib: Any = tessera.compile(source, "guarded.tsr", target="cpu").load()
    x = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    want = F.layer_norm(torch.tensor(x, dtype=torch.float64), (8,)).numpy()
    np.testing.assert_allclose(lib.f(x), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="normalized_shape"):
        lib.f(np.ones((3, 9), np.float32))


def test_linear_and_bmm_keep_their_inputs_dtype_as_torch() -> None:
    """bf16 in, bf16 out, as PyTorch's: the sums are f32, rounded once after the bias,
    so that a chain of layers needs no cast; to a bf16 rounding of torch's (the f32
    sums may be taken in another order)."""
    import ml_dtypes

    source = """\
def layers(x: Tensor["N", 16, bf16], w1: Tensor[32, 16, bf16], b1: Tensor[32, bf16],
           w2: Tensor[8, 32, bf16]) -> Tensor["N", 8, bf16]:
    return linear(relu(linear(x, w1, b1)), w2)

def batched(a: Tensor[3, "M", 16, bf16], b: Tensor[3, 16, 5, bf16]) -> Tensor[3, "M", 5, bf16]:
    return bmm(a, b)
"""
    lib: Any = tessera.compile(source, "bf16.tsr", target="cpu").load()
    rng = np.random.default_rng(7)

    def bf16(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)

    def torch_of(a: np.ndarray) -> torch.Tensor:
        return torch.tensor(a.astype(np.float32)).bfloat16()

    x, w1, b1, w2 = bf16(9, 16), bf16(32, 16), bf16(32), bf16(8, 32)
    got = lib.layers(x, w1, b1, w2)
    want = F.linear(F.relu(F.linear(torch_of(x), torch_of(w1), torch_of(b1))), torch_of(w2))
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float32), want.float().numpy(), rtol=8e-3, atol=1e-2)
    a, b = bf16(3, 7, 16), bf16(3, 16, 5)
    got = lib.batched(a, b)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float32),
                               torch.bmm(torch_of(a), torch_of(b)).float().numpy(),
                               rtol=8e-3, atol=1e-2)  # fmt: skip


def test_normalize_of_a_zero_row_has_torch_gradient() -> None:
    """The 2-norm of a zero row is below ``eps``, so its gradient is ``g / eps`` through
    the division alone, as PyTorch's: none flows through the norm's square root, whose
    slope at 0 is infinite (NaN before)."""
    source = (
        "@autodiff\n"
        'def f(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:\n'
        "    return normalize(x, dim=-1, eps=1e-3)\n"
    )
    lib: Any = tessera.compile(source, "normalize.tsr", target="cpu").load()
    rng = np.random.default_rng(6)
    x, g = (rng.standard_normal((5, 7)).astype(np.float32) for _ in range(2))
    x[2] = 0.0
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    F.normalize(t, dim=-1, eps=1e-3).backward(torch.tensor(g, dtype=torch.float64))
    np.testing.assert_allclose(lib.f_vjp(x, g), t.grad.numpy(), rtol=1e-5, atol=1e-5)


def _bad(signature: str, body: str) -> str:
    return f"def f({signature}):\n    return {body}\n"


_XW = 'x: Tensor["N", 7, f32], w: Tensor[6, 7, f32]'
_QKV = "q: Tensor[2, 4, 9, 8, f32], k: Tensor[2, 4, 9, 8, f32], v: Tensor[2, 4, 9, 8, f32]"

#: Calls PyTorch would refuse too, or that Tessera does not take: the source, the line
#: of the error, and its text.
BAD = {
    "linear weight of one dim": (
        _bad('x: Tensor["N", 7, f32], w: Tensor[7, f32]', "linear(x, w)"),
        2,
        "linear: 'weight' must be [out_features, in_features], as PyTorch's; w is [7]",
    ),
    "linear weight the other way": (
        _bad('x: Tensor["N", 7, f32], w: Tensor[7, 6, f32]', "linear(x, w)"),
        2,
        "in_features differ: x is [N, 7], w is [7, 6] (PyTorch's layout: weight is "
        "[out_features, in_features])",
    ),
    "linear bias of in_features": (
        _bad(f"{_XW}, b: Tensor[7, f32]", "linear(x, w, b)"),
        2,
        "'bias' must be [out_features] = [6]; b is [7]",
    ),
    "linear bias of two dims": (
        _bad(f"{_XW}, b: Tensor[1, 6, f32]", "linear(x, w, bias=b)"),
        2,
        "'bias' must be [out_features] = [6]; b is [1, 6]",
    ),
    "linear of mixed dtypes": (
        _bad('x: Tensor["N", 7, f32], w: Tensor[6, 7, bf16]', "linear(x, w)"),
        2,
        "x is f32, w is bf16: one dtype for both, e.g. cast(w, f32)",
    ),
    "linear of integers": (
        _bad('x: Tensor["N", 7, i32], w: Tensor[6, 7, i32]', "linear(x, w)"),
        2,
        "needs a floating-point input; x is i32",
    ),
    "bmm of matrices": (
        _bad("a: Tensor[5, 7, f32], b: Tensor[7, 3, f32]", "bmm(a, b)"),
        2,
        "bmm: 'input' must be a 3-d tensor [B, M, K], as PyTorch's; a is [5, 7]",
    ),
    "bmm of a 4-d tensor": (
        _bad("a: Tensor[2, 5, 7, f32], b: Tensor[1, 2, 7, 3, f32]", "bmm(a, b)"),
        2,
        "bmm: 'mat2' must be a 3-d tensor [B, M, K], as PyTorch's; b is [1, 2, 7, 3]",
    ),
    "bmm batch sizes": (
        _bad("a: Tensor[2, 5, 7, f32], b: Tensor[3, 7, 4, f32]", "bmm(a, b)"),
        2,
        "bmm: batch sizes differ: a is [2, 5, 7], b is [3, 7, 4]",
    ),
    "bmm inner sizes": (
        _bad("a: Tensor[2, 5, 7, f32], b: Tensor[2, 6, 4, f32]", "bmm(a, b)"),
        2,
        "bmm: inner dimensions differ: a is [2, 5, 7], b is [2, 6, 4]",
    ),
    "sdpa head dims": (
        _bad(
            "q: Tensor[2, 9, 8, f32], k: Tensor[2, 9, 6, f32], v: Tensor[2, 9, 6, f32]",
            "scaled_dot_product_attention(q, k, v)",
        ),
        2,
        "scaled_dot_product_attention: q and k head dims differ: q is [2, 9, 8], k is [2, 9, 6]",
    ),
    "sdpa dropout": (
        _bad(_QKV, "scaled_dot_product_attention(q, k, v, dropout_p=1.5)"),
        2,
        "dropout is a probability in [0, 1), not 1.5",
    ),
    "sdpa enable_gqa": (
        _bad(_QKV, "scaled_dot_product_attention(q, k, v, enable_gqa=1)"),
        2,
        "'enable_gqa' must be a bool known at compile time",
    ),
    "layer_norm over two dims": (
        _bad('x: Tensor["N", 4, 5, f32]', "layer_norm(x, (4, 5))"),
        2,
        "layer_norm: normalized_shape [4, 5] names 2 dims; only the last dim is normalised",
    ),
    "layer_norm of another size": (
        _bad('x: Tensor["N", 5, f32]', "layer_norm(x, 4)"),
        2,
        "layer_norm: normalized_shape [4] is not the last dim of x is [N, 5]",
    ),
    "layer_norm of another name": (
        _bad('x: Tensor["N", "D", f32], y: Tensor["E", f32]', "layer_norm(x, y.shape)"),
        2,
        "layer_norm: normalized_shape [E] is not the last dim of x is [N, D]",
    ),
    "layer_norm weight": (
        _bad('x: Tensor["N", 5, f32], w: Tensor[4, f32]', "layer_norm(x, (5,), w)"),
        2,
        "layer_norm: 'weight' does not match the normalised dim: x is [N, 5], w is [4]",
    ),
    "layer_norm eps": (
        _bad('x: Tensor["N", 5, f32]', "layer_norm(x, 5, eps=0.0)"),
        2,
        "eps must be positive, not 0.0",
    ),
    "rms_norm over two dims": (
        _bad('x: Tensor["N", 4, 5, f32]', "rms_norm(x, x.shape[1:])"),
        2,
        "rms_norm: normalized_shape [4, 5] names 2 dims",
    ),
    "rms_norm weight of two dims": (
        _bad('x: Tensor["N", 5, f32], w: Tensor[1, 5, f32]', "rms_norm(x, 5, w)"),
        2,
        "rms_norm: 'weight' must have one dim, the normalised size 5; w is [1, 5]",
    ),
    "normalize p": (
        _bad('x: Tensor["N", 5, f32]', "normalize(x, p=0.0)"),
        2,
        "normalize: p must be a positive number, not 0.0",
    ),
    "normalize dim": (
        _bad("x: Tensor[5, f32]", "normalize(x)"),
        2,
        "normalize: axis 1 is out of range for a rank-1 value",
    ),
    "mse_loss shapes": (
        _bad('x: Tensor["N", 5, f32], y: Tensor["N", 4, f32]', "mse_loss(x, y)"),
        2,
        "mse_loss: input and target must have one shape: x is [N, 5], y is [N, 4]",
    ),
    "mse_loss reduction": (
        _bad('x: Tensor["N", 5, f32], y: Tensor["N", 5, f32]', "mse_loss(x, y, reduction='max')"),
        2,
        "reduction is one of 'mean', 'sum', 'none', not 'max'",
    ),
    "F.linear": (
        _bad(_XW, "F.linear(x, w)"),
        2,
        "'F' is no module in a .tsr file: linear is a builtin, write linear(...)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_an_error_at_its_line(case: str) -> None:
    assert_one_error(*BAD[case])
