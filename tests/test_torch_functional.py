"""PyTorch's ``torch.nn.functional`` names in graph functions, with PyTorch's signatures:
``linear``, ``bmm``, ``scaled_dot_product_attention``, ``layer_norm``, ``rms_norm``,
``normalize`` and ``mse_loss``; and (``NAMES``) the activations, the other losses,
``cosine_similarity``, ``outer``, ``gather``, ``repeat_interleave``, ``pad`` and the
``logical_*`` ops of masks. Each is checked on the CPU and on PoCL (the other targets in
the exhaustive tier) against PyTorch in
float64, on random inputs of sizes that are no multiple of a tile, outputs poisoned
first; the bad calls are errors at their line; and the gradients through ``linear``,
``layer_norm``, the new losses and the activations are PyTorch's.
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


# ------------------------------------------- PyTorch's other activations, losses and ops

#: The functions ported PyTorch code reaches for beyond those above: the activations,
#: the ops of masks, ``outer``, ``cosine_similarity``, ``gather``, ``repeat_interleave``,
#: ``pad`` and the losses, in one program built once for each target.
NAMES = """\
def six(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:
    return relu6(x)

def hard_tanh(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:
    return hardtanh(x) + hardtanh(x, -0.5, max_val=2.5)

def hard_sigmoid(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:
    return hardsigmoid(x, inplace=True)

def hard_swish(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:
    return hardswish(x)

def mished(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:
    return mish(x)

def log_sigmoid(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:
    return logsigmoid(x * 40.0)  # far past where log(sigmoid(x)) is -inf in f32

def soft_sign(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:
    return softsign(x)

def selu_celu(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:
    return selu(x) + celu(x) + celu(x, alpha=0.7)

def gated(x: Tensor["N", "D", f32]) -> Tensor["N", "D/2", f32]:
    return glu(x)

def gated_rows(x: Tensor["N", "D", f32]) -> Tensor["N/2", "D", f32]:
    return glu(x, dim=0)

def masks(x: Tensor["N", "D", f32], y: Tensor["D", f32]) -> Tensor["N", "D", f32]:
    a, b = x > 0.0, y < 0.5
    return (where(logical_and(a, b), 1.0, 0.0) + where(logical_or(a, b), 2.0, 0.0)
            + where(logical_not(a), 4.0, 0.0) + where(logical_xor(a, b), 8.0, 0.0)
            + where(a ^ b, 16.0, 0.0))

def outer_product(a: Tensor["N", f32], b: Tensor["M", f32]) -> Tensor["N", "M", f32]:
    return outer(a, b)

def cosines(x: Tensor["A", "B", "C", f32], y: Tensor["A", "B", "C", f32]) -> Tensor["A", "C", f32]:
    return cosine_similarity(x, y)

def cosines_last(x: Tensor["N", "D", f32], y: Tensor["D", f32]) -> Tensor["N", f32]:
    return cosine_similarity(x, y, dim=-1, eps=1e-3)

def gathered(x: Tensor["N", "D", f32], i: Tensor["N", "K", i32]) -> Tensor["N", "K", f32]:
    return gather(x, 1, i)

def gathered_rows(x: Tensor["N", "D", f32], i: Tensor["K", "D", i32]) -> Tensor["K", "D", f32]:
    return x.gather(0, index=i)

def gathered_block(x: Tensor["N", "D", f32], i: Tensor["K", "J", i32]) -> Tensor["K", "J", f32]:
    return x.gather(0, i)

def gathered_ints(x: Tensor["N", "D", i32], i: Tensor["N", "K", i32]) -> Tensor["N", "K", i32]:
    return gather(x, -1, i)

def repeated(k: Tensor["B", "G", "S", "D", f32]) -> Tensor["B", "G*3", "S", "D", f32]:
    return k.repeat_interleave(3, dim=1)

def repeated_flat(x: Tensor["N", "D", f32]) -> Tensor["N*D*2", f32]:
    return repeat_interleave(x, 2)

def padded(x: Tensor["N", "D", f32]) -> Tensor["N", "D+3", f32]:
    return pad(x, (1, 2))

def padded_more(x: Tensor["A", "B", "C", f32]) -> Tensor["A+2", "B", "C+4", f32]:
    return pad(x, [3, 1, 0, 0, 2, 0], value=-1.5)

def bce_logits(x: Tensor["N", "C", f32], t: Tensor["N", "C", f32], w: Tensor["C", f32]
               ) -> tuple[Tensor[f32], Tensor[f32], Tensor["N", "C", f32]]:
    return (binary_cross_entropy_with_logits(x * 30.0, t),
            binary_cross_entropy_with_logits(x, t, w, reduction="sum", pos_weight=w * 2.0),
            binary_cross_entropy_with_logits(x, t, reduction="none", pos_weight=w))

def bce(p: Tensor["N", "C", f32], t: Tensor["N", "C", f32], w: Tensor["N", "C", f32]
        ) -> tuple[Tensor[f32], Tensor[f32], Tensor["N", "C", f32]]:
    return (binary_cross_entropy(p, t), binary_cross_entropy(p, t, w, reduction="sum"),
            binary_cross_entropy(p, t, reduction="none"))

def nll(x: Tensor["N", "C", f32], t: Tensor["N", i32], w: Tensor["C", f32]
        ) -> tuple[Tensor[f32], Tensor[f32], Tensor[f32], Tensor["N", f32]]:
    s = log_softmax(x, dim=-1)
    return (nll_loss(s, t), nll_loss(s, t, w), nll_loss(s, t, ignore_index=2, reduction="sum"),
            nll_loss(s, t, weight=w, reduction="none"))

def nll_spatial(x: Tensor["N", "C", "P", f32], t: Tensor["N", "P", i32]) -> Tensor[f32]:
    return nll_loss(x, t)

def nll_one(x: Tensor["C", f32], t: Tensor[i32]) -> tuple[Tensor[f32], Tensor[f32]]:
    return nll_loss(x, t), nll_loss(x, t, reduction="none")

def distances(x: Tensor["N", "D", f32], y: Tensor["N", "D", f32], w: Tensor["D", f32]
              ) -> tuple[Tensor[f32], Tensor[f32], Tensor["N", "D", f32], Tensor[f32],
                         Tensor[f32], Tensor[f32], Tensor["N", "D", f32], Tensor[f32]]:
    return (l1_loss(x, y), l1_loss(x, y, reduction="sum"), l1_loss(x, y, reduction="none",
            weight=w), l1_loss(x, y, weight=w), smooth_l1_loss(x, y),
            smooth_l1_loss(x, y, reduction="sum", beta=0.4), huber_loss(x, y, "none", 0.6),
            huber_loss(x, y, delta=0.3, weight=w))
"""

#: One loss made of the new losses and activations, and its gradient: built for the CPU
#: alone (the kernels of a gradient are those tested on every target). The gradients of
#: ``gather``, ``pad`` and ``repeat_interleave`` are those of ``take_along_axis``, a slice
#: and a broadcast, which ``test_autodiff`` checks.
GRADS = """\
def every_loss(x: Tensor["N", "C", f32], t: Tensor["N", "C", f32], p: Tensor["N", "C", f32],
               labels: Tensor["N", i32], w: Tensor["C", f32], y: Tensor["N", "C", f32]
               ) -> Tensor[f32]:
    return (binary_cross_entropy_with_logits(x, t, w, pos_weight=w)
            + binary_cross_entropy(sigmoid(x * 0.25), p, reduction="sum")
            + nll_loss(log_softmax(x, dim=-1), labels, w) + l1_loss(x, t)
            + smooth_l1_loss(x, t, beta=0.5) + huber_loss(x, t, delta=0.7)
            + mean(cosine_similarity(x, y))
            + sum((relu6(x) + hardtanh(x, -0.5, 0.7) + hardsigmoid(x) + hardswish(x) + mish(x)
                   + logsigmoid(x) + softsign(x) + selu(x) + celu(x, 0.7)) * y, axis=None)
            + sum(glu(x) * y[:, :3], axis=None))

def every_grad(x: Tensor["N", "C", f32], t: Tensor["N", "C", f32], p: Tensor["N", "C", f32],
               labels: Tensor["N", i32], w: Tensor["C", f32], y: Tensor["N", "C", f32]
               ) -> tuple[Tensor[f32], Tensor["N", "C", f32], Tensor["N", "C", f32]]:
    loss, (dx, dy) = value_and_grad(every_loss, wrt=("x", "y"))(x, t, p, labels, w, y)
    return loss, dx, dy
"""

built_names = built_everywhere(NAMES, "cpu", "opencl")

#: A float input of this shape: "wide" normal values times 4 (across every activation's
#: kinks), "normal", "prob" (in (0.02, 0.98): probabilities and targets), "positive"
#: (weights in [0.5, 1.5)), or integers in [0, n) as ("labels", n).
Arg = tuple[tuple[int, ...], Any]


def _make(rng: np.random.Generator, shape: tuple[int, ...], kind: Any) -> np.ndarray:
    if isinstance(kind, tuple):
        return np.asarray(rng.integers(0, kind[1], shape), np.int32)
    if kind == "prob":
        return rng.uniform(0.02, 0.98, shape).astype(np.float32)
    if kind == "positive":
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    scale = 4.0 if kind == "wide" else 1.0
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _as_torch(a: np.ndarray, grad: bool = False) -> torch.Tensor:
    if a.dtype.kind == "i":
        return torch.tensor(a, dtype=torch.int64)
    return torch.tensor(a, dtype=torch.float64, requires_grad=grad)


def _labels(n: int) -> tuple[str, int]:
    return ("labels", n)


_W = "wide"
#: Each case: the function, its arguments' shapes and kinds, and PyTorch's results.
NAMED: dict[str, tuple[str, tuple[Arg, ...], Any]] = {
    "relu6": ("six", (((7, 13), _W),), F.relu6),
    "hardtanh": ("hard_tanh", (((7, 13), _W),), lambda x: F.hardtanh(x) + F.hardtanh(x, -0.5, 2.5)),
    "hardsigmoid": ("hard_sigmoid", (((7, 13), _W),), F.hardsigmoid),
    "hardswish": ("hard_swish", (((7, 13), _W),), F.hardswish),
    "mish": ("mished", (((7, 13), _W),), F.mish),
    "logsigmoid": ("log_sigmoid", (((7, 13), _W),), lambda x: F.logsigmoid(x * 40.0)),
    "softsign": ("soft_sign", (((7, 13), _W),), F.softsign),
    "selu_celu": (
        "selu_celu",
        (((7, 13), _W),),
        lambda x: F.selu(x) + F.celu(x) + F.celu(x, alpha=0.7),
    ),
    "glu": ("gated", (((5, 18), _W),), F.glu),
    "glu_rows": ("gated_rows", (((10, 7), _W),), lambda x: F.glu(x, dim=0)),
    "logical": (
        "masks",
        (((6, 11), "normal"), ((11,), "prob")),
        lambda x, y: (
            torch.logical_and(x > 0, y < 0.5) * 1.0
            + torch.logical_or(x > 0, y < 0.5) * 2.0
            + torch.logical_not(x > 0) * 4.0
            + torch.logical_xor(x > 0, y < 0.5) * 24.0
        ),
    ),
    "outer": ("outer_product", (((7,), "normal"), ((5,), "normal")), torch.outer),
    "cosine_similarity": (
        "cosines",
        (((3, 7, 5), "normal"), ((3, 7, 5), "normal")),
        F.cosine_similarity,
    ),
    "cosine_similarity_broadcast": (
        "cosines_last",
        (((6, 9), "normal"), ((9,), "normal")),
        lambda x, y: F.cosine_similarity(x, y, dim=-1, eps=1e-3),
    ),
    "gather": (
        "gathered",
        (((7, 9), "normal"), ((7, 4), _labels(9))),
        lambda x, i: torch.gather(x, 1, i),
    ),
    "gather_method": (
        "gathered_rows",
        (((7, 9), "normal"), ((3, 9), _labels(7))),
        lambda x, i: x.gather(0, i),
    ),
    "gather_smaller_index": (
        "gathered_block",
        (((7, 9), "normal"), ((3, 4), _labels(7))),
        lambda x, i: x.gather(0, i),
    ),
    "gather_integers": (
        "gathered_ints",
        (((5, 8), _labels(1000)), ((5, 3), _labels(8))),
        lambda x, i: torch.gather(x, -1, i),
    ),
    "repeat_interleave": (
        "repeated",
        (((2, 3, 5, 4), "normal"),),
        lambda k: k.repeat_interleave(3, dim=1),
    ),
    "repeat_interleave_flat": (
        "repeated_flat",
        (((3, 5), "normal"),),
        lambda x: torch.repeat_interleave(x, 2),
    ),
    "pad": ("padded", (((5, 7), "normal"),), lambda x: F.pad(x, (1, 2))),
    "pad_three_dims": (
        "padded_more",
        (((2, 3, 5), "normal"),),
        lambda x: F.pad(x, [3, 1, 0, 0, 2, 0], value=-1.5),
    ),
    "binary_cross_entropy_with_logits": (
        "bce_logits",
        (((6, 7), "normal"), ((6, 7), "prob"), ((7,), "positive")),
        lambda x, t, w: (
            F.binary_cross_entropy_with_logits(x * 30.0, t),
            F.binary_cross_entropy_with_logits(x, t, w, reduction="sum", pos_weight=w * 2.0),
            F.binary_cross_entropy_with_logits(x, t, reduction="none", pos_weight=w),
        ),
    ),
    "binary_cross_entropy": (
        "bce",
        (((6, 7), "prob"), ((6, 7), "prob"), ((6, 7), "positive")),
        lambda p, t, w: (
            F.binary_cross_entropy(p, t),
            F.binary_cross_entropy(p, t, w, reduction="sum"),
            F.binary_cross_entropy(p, t, reduction="none"),
        ),
    ),
    "nll_loss": (
        "nll",
        (((9, 5), "normal"), ((9,), _labels(5)), ((5,), "positive")),
        lambda x, t, w: (
            F.nll_loss(F.log_softmax(x, -1), t),
            F.nll_loss(F.log_softmax(x, -1), t, w),
            F.nll_loss(F.log_softmax(x, -1), t, ignore_index=2, reduction="sum"),
            F.nll_loss(F.log_softmax(x, -1), t, w, reduction="none"),
        ),
    ),
    "nll_loss_one": (
        "nll_one",
        (((7,), "normal"), ((), _labels(7))),
        lambda x, t: (F.nll_loss(x, t), F.nll_loss(x, t, reduction="none")),
    ),
    "nll_loss_spatial": ("nll_spatial", (((3, 4, 5), "normal"), ((3, 5), _labels(4))), F.nll_loss),
    "distances": (
        "distances",
        (((6, 7), "normal"), ((6, 7), "normal"), ((7,), "positive")),
        lambda x, y, w: (
            F.l1_loss(x, y),
            F.l1_loss(x, y, reduction="sum"),
            F.l1_loss(x, y, reduction="none", weight=w.expand(6, 7)),
            F.l1_loss(x, y, weight=w.expand(6, 7)),
            F.smooth_l1_loss(x, y),
            F.smooth_l1_loss(x, y, reduction="sum", beta=0.4),
            F.huber_loss(x, y, "none", 0.6),
            F.huber_loss(x, y, delta=0.3, weight=w.expand(6, 7)),
        ),
    ),
}


def _named_inputs(case: str, args: tuple[Arg, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(sum(map(ord, case)))
    return [_make(rng, shape, kind) for shape, kind in args]


def _poison(want: np.ndarray) -> np.ndarray:
    """An output of ``want``'s shape filled with what no kernel writes: NaN, or for an
    integer result a number no gather of the inputs gives."""
    if want.dtype.kind == "i":
        return np.full(want.shape, -77777, np.int32)
    return np.full(want.shape, np.nan, np.float32)


@pytest.mark.parametrize("case", list(NAMED))
def test_more_of_pytorch_matches_it(built_names: Any, case: str) -> None:
    name, args, reference = NAMED[case]
    inputs = _named_inputs(case, args)
    if case == "nll_loss":
        inputs[1][[1, 4]] = 2  # ignored by the call with ignore_index=2 (-100: every_grad's)
    result = reference(*(_as_torch(a) for a in inputs))
    wants = [r.numpy() for r in (result if isinstance(result, tuple) else (result,))]
    poison = tuple(_poison(w) for w in wants)
    have = getattr(built_names, name)(*inputs, out=poison if len(poison) > 1 else poison[0])
    haves = have if isinstance(result, tuple) else (have,)
    for h, w in zip(haves, wants, strict=True):
        np.testing.assert_allclose(np.asarray(h), w, rtol=1e-5, atol=1e-5)


def test_a_gather_index_larger_than_the_input_is_refused(built_names: Any) -> None:
    """``x.gather(0, i)`` of ``i [K, J]`` reads the block ``x[:, :J]``: a ``J`` beyond
    ``x``'s columns is refused before any kernel runs, as PyTorch refuses it."""
    x = np.ones((7, 4), np.float32)
    with pytest.raises(ValueError, match="index size J <= input size D"):
        built_names.gathered_block(x, np.zeros((3, 5), np.int32))


def test_gradients_of_the_losses_and_activations_are_pytorchs() -> None:
    """``value_and_grad`` of one loss made of the new losses and activations (and
    ``cosine_similarity``): the loss and the gradients of both float inputs that flow
    into them, against autograd in float64 (the weights, probabilities and labels are
    constants). The
    probabilities of ``binary_cross_entropy`` stay away from 1, where an f32 sigmoid has
    too few bits left for ``log(1 - p)``."""
    n, c = 7, 6
    shapes = (((n, c), _W), ((n, c), "prob"), ((n, c), "prob"), ((n,), _labels(c)),
              ((c,), "positive"), ((n, c), "normal"))  # fmt: skip
    arrays = _named_inputs("every_grad", shapes)
    arrays[3][2] = -100
    lib: Any = tessera.compile(GRADS, "grads.tsr", target="cpu").load()
    loss, dx, dy = lib.every_grad(*arrays)
    x, t, p, labels, w, y = (_as_torch(a, grad=k in (0, 5)) for k, a in enumerate(arrays))
    want = (
        F.binary_cross_entropy_with_logits(x, t, w, pos_weight=w)
        + F.binary_cross_entropy(torch.sigmoid(x * 0.25), p, reduction="sum")
        + F.nll_loss(F.log_softmax(x, -1), labels, w) + F.l1_loss(x, t)
        + F.smooth_l1_loss(x, t, beta=0.5) + F.huber_loss(x, t, delta=0.7)
        + F.cosine_similarity(x, y).mean()
        + ((F.relu6(x) + F.hardtanh(x, -0.5, 0.7) + F.hardsigmoid(x) + F.hardswish(x)
            + F.mish(x) + F.logsigmoid(x) + F.softsign(x) + F.selu(x) + F.celu(x, 0.7)) * y).sum()
        + (F.glu(x) * y[:, :3]).sum()
    )  # fmt: skip
    want.backward()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
    np.testing.assert_allclose(dx, x.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dy, y.grad.numpy(), rtol=1e-4, atol=1e-5)


def _bad(signature: str, body: str) -> str:
    return f"def f({signature}):\n    return {body}\n"


_XW = 'x: Tensor["N", 7, f32], w: Tensor[6, 7, f32]'
_X5 = "x: Tensor['N', 5, f32]"
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
    "pad of an odd count": (
        "def f(x: Tensor['N', 5, f32]) -> Tensor['N', 8, f32]:\n"
        "    return pad(x,\n"
        "               (1, 2, 3))\n",
        3,
        "pad: 'pad' holds pairs of integers, (left, right) for each dim from the last; "
        "(1, 2, 3) is not",
    ),
    "pad of another mode": (
        _bad(_X5, "pad(x, (1, 1), mode='reflect')"),
        2,
        "pad: mode 'reflect' is not taken; only 'constant' (the default) pads here",
    ),
    "pad of a negative count": (
        _bad(_X5, "pad(x, (1, -1))"),
        2,
        "pad: 'pad' (1, -1) has a negative count, which PyTorch crops by: slice the input",
    ),
    "pad of too many dims": (
        _bad(_X5, "pad(x, (1, 1, 0, 0, 2, 2))"),
        2,
        "pad: 'pad' pads 3 dims; x is [N, 5]",
    ),
    "gather of float indices": (
        _bad(f"{_X5}, i: Tensor['N', 2, f32]", "x.gather(1, i)"),
        2,
        "x.gather: 'index' must be an integer tensor; i is f32",
    ),
    "gather of another rank": (
        _bad(f"{_X5}, i: Tensor['N', i32]", "gather(x, 1, i)"),
        2,
        "gather: 'index' must have input's rank; x is [N, 5], i is [N]",
    ),
    "gather of a larger index": (
        _bad(f"{_X5}, i: Tensor['N', 6, i32]", "gather(x, 0, i)"),
        2,
        "gather: 'index' is larger than input on dim 1: x is [N, 5], i is [N, 6]",
    ),
    "repeat_interleave of a tensor of counts": (
        _bad(f"{_X5}, r: Tensor[5, i32]", "x.repeat_interleave(r, dim=1)"),
        2,
        "'repeats' must be an integer (a count for every element); a tensor of counts is not "
        "taken: r is a tensor",
    ),
    "repeat_interleave of no count": (
        _bad(_X5, "x.repeat_interleave(0, dim=1)"),
        2,
        "'repeats' must be positive, not 0",
    ),
    "glu of an odd size": (
        _bad(_X5, "glu(x)"),
        2,
        "glu: halves dim 1, of odd size 5; x is [N, 5]",
    ),
    "hardtanh bounds": (
        _bad(_X5, "hardtanh(x, 1.0, -1.0)"),
        2,
        "hardtanh: max_val -1.0 is below min_val 1.0",
    ),
    "celu alpha": (_bad(_X5, "celu(x, alpha=0.0)"), 2, "celu: alpha must not be 0"),
    "relu6 of integers": (
        _bad("x: Tensor['N', 5, i32]", "relu6(x)"),
        2,
        "relu6: needs a floating-point input; x is i32",
    ),
    "logical_and of numbers": (
        _bad(f"{_X5}, y: Tensor['N', 5, f32]", "where(logical_and(x > 0.0, y), x, y)"),
        2,
        "logical_and: 'b' must be a mask (a comparison, such as x > 0.0), not tensor<[N, 5], "
        "f32> (numpy's reading of numbers: y != 0)",
    ),
    "outer of a matrix": (
        _bad(f"{_X5}, y: Tensor[3, f32]", "outer(x, y)"),
        2,
        "outer: 'input' must be a vector, as PyTorch's; x is [N, 5] (numpy's outer flattens "
        "it: write x.flatten())",
    ),
    "cosine_similarity dim": (
        _bad("x: Tensor[5, f32], y: Tensor[5, f32]", "cosine_similarity(x, y)"),
        2,
        "cosine_similarity: axis 1 is out of range for a rank-1 value",
    ),
    "nll_loss of float labels": (
        _bad(f"{_X5}, t: Tensor['N', f32]", "nll_loss(x, t)"),
        2,
        "nll_loss: 'target' must be integer class labels; t is f32",
    ),
    "nll_loss of a weight per row": (
        _bad(f"{_X5}, t: Tensor['N', i32], w: Tensor[4, f32]", "nll_loss(x, t, w)"),
        2,
        "nll_loss: 'weight' is one per class: x is [N, 5], w is [4]",
    ),
    "nll_loss of one label per element": (
        _bad(f"{_X5}, t: Tensor['N', 5, i32]", "nll_loss(x, t)"),
        2,
        "nll_loss: 'input' is [N, C] (or [C], or [N, C, d1, ...]) and 'target' the same "
        "without C; x is [N, 5], t is [N, 5]",
    ),
    "binary_cross_entropy shapes": (
        _bad(f"{_X5}, t: Tensor['N', 1, f32]", "binary_cross_entropy_with_logits(x, t)"),
        2,
        "binary_cross_entropy_with_logits: input and target must have one shape: x is [N, 5], "
        "t is [N, 1]",
    ),
    "binary_cross_entropy weight": (
        _bad(
            f"{_X5}, t: Tensor['N', 5, f32], w: Tensor[2, 'N', 5, f32]",
            "binary_cross_entropy(x, t, w)",
        ),
        2,
        "binary_cross_entropy: 'weight' must broadcast to the input's shape; w is [2, N, 5], "
        "x is [N, 5]",
    ),
    "smooth_l1_loss beta": (
        _bad(f"{_X5}, t: Tensor['N', 5, f32]", "smooth_l1_loss(x, t, beta=-1.0)"),
        2,
        "smooth_l1_loss: beta must be at least 0, not -1.0",
    ),
    "huber_loss delta": (
        _bad(f"{_X5}, t: Tensor['N', 5, f32]", "huber_loss(x, t, delta=0.0)"),
        2,
        "huber_loss: delta must be positive, not 0.0",
    ),
    "l1_loss reduction": (
        _bad(f"{_X5}, t: Tensor['N', 5, f32]", "l1_loss(x, t, reduction='max')"),
        2,
        "l1_loss: reduction is one of 'mean', 'sum', 'none', not 'max'",
    ),
    "size_average": (
        _bad(f"{_X5}, t: Tensor['N', 5, f32]", "l1_loss(x, t, size_average=False)"),
        2,
        "l1_loss has no parameter 'size_average'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_an_error_at_its_line(case: str) -> None:
    assert_one_error(*BAD[case])
