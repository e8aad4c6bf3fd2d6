"""What numpy and PyTorch users write, spelled their way: ``&``, ``|``, ``^`` and ``~`` of
masks, ``pow``/``power``, PyTorch's ``dim=`` and ``keepdim=``, ``"D//2"`` in a dim, slices
of vectors, a slice of a slice, and strided slices (``x[:, 1::2]``, the interleaved
rotary embedding's halves). Each is checked on every target against numpy in float64 on
random inputs with sizes that are no multiple of a tile, outputs poisoned first."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tessera

from .everywhere import built_everywhere
from .test_autodiff import assert_one_error

pytestmark = pytest.mark.execute

F = torch.nn.functional

SOURCE = """\
def masks(x: Tensor["N", "D", f32], y: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:
    flipped = (x > 0.0) ^ (y > 0.0)
    inside = (x > -1.0) & (x < 1.0)
    return where(~flipped | inside, x, y) + where((x < y) & ~(y > 0.5), 1.0, 0.0)

@kernel
def tile_masks(x: Tensor["R", "C", f32], y: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    T = tile.context()
    a = tile.load(x, rows=T.m)
    b = tile.load(y, rows=T.m)
    return tile.where((a > 0.0) & ~(b > 1.0) | (a > b) ^ (b < -1.0), a, b)

def powers(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:
    return pow(abs(x), 0.5) + power(x, 2) + 2.0 ** clip(x, -1.0, 1.0)

def torch_axes(x: Tensor["N", "D", f32]) -> Tensor["N", 1, f32]:
    return softmax(x, dim=-1).max(dim=-1, keepdim=True) + sum(x, dim=1, keepdim=True)

def halves(x: Tensor["S", "D", f32], c: Tensor["S", "D//2", f32],
           s: Tensor["S", "D//2", f32]) -> Tensor["S", "D", f32]:
    S, D = x.shape
    x1 = x[:, : D // 2]
    x2 = x[:, D // 2 :]
    return concat((x1 * c - x2 * s, x1 * s + x2 * c), axis=-1)

def pairs(x: Tensor["S", "D", f32], c: Tensor["S", "D/2", f32],
          s: Tensor["S", "D/2", f32]) -> Tensor["S", "D", f32]:
    S, D = x.shape
    a = x[:, ::2]
    b = x[:, 1::2]
    return stack((a * c - b * s, a * s + b * c), axis=-1).reshape(S, D)

def odd_sum(x: Tensor["N", "D", f32]) -> Tensor["N", f32]:
    return sum(x[:, 1::2], axis=-1)

def steps(x: Tensor["N", "D", f32]) -> Tensor["N", 3, f32]:
    return x[:, 2:9:3] + x[:, -3:][:, ::1] + x[:, None, -1][:, 0][:, None]

def fixed(x: Tensor[5, 7, f32], v: Tensor[11, f32]) -> Tensor[4, f32]:
    return x[1, ::2] + v[1::3] + x[:, 2:7:3].sum(axis=0)[:1] + v[-4:] * v[:4]

def counts(x: Tensor["N", "D", f32]) -> tuple[Tensor["N", i32], Tensor["D", i32], Tensor[f32]]:
    return (x > 0.0).sum(-1), sum((x > 0.0) & (x < 1.0), axis=0), mean(x > 0.5)

def created(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:
    N, D = x.shape
    return x * ones(N, D) + zeros(N, D, dtype=f32) + ones((N, D), f32) * 2.0 + ones(D) * 3.0

def swiglu(x: Tensor["N", "D", f32], w: Tensor["D", "F2", f32]) -> Tensor["N", "F2//2", f32]:
    a, b = (x @ w).chunk(2, dim=-1)
    return silu(a) * b

def rms(x: Tensor["N", "D", f32], g: Tensor["D", f32]) -> Tensor["N", "D", f32]:
    return x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * g

def accuracy(logits: Tensor["N", "C", f32], y: Tensor["N", i32]) -> Tensor[f32]:
    return (logits.argmax(-1) == y).float().mean() + y.float().sum() * 0.0

def linear(x: Tensor["N", "D", f32], w: Tensor["F", "D", f32],
           b: Tensor["F", f32]) -> Tensor["N", "F", f32]:
    return x @ w.t() + b + x.matmul(w.T) * 0.5 + x.mm(w.t())

def parts(x: Tensor["N", 12, f32]) -> Tensor["N", 4, f32]:
    q, k, v = split(x, 3, axis=-1)
    head, tail = x.split(8, dim=1)
    first, second, third = chunk(x, 3, dim=-1)
    left, right = split(x, [5], axis=1)
    return q * k + v + third + tail + left[:, :4] + right[:, 3:] * x.ndim

def casts(x: Tensor["N", f16], n: Tensor["N", i32]) -> Tensor["N", f32]:
    return x.float().half().float() * 2.0 + x.float().bfloat16().float() + (n * 2).float()

def typed(x: Tensor["N", f32], like: Tensor["N", f16]) -> Tensor["N", f16]:
    return (x * 3.0).type_as(like)

def swapped(x: Tensor["B", "N", "D", f32], y: Tensor["N", "D", f32]) -> Tensor["B", "D", "N", f32]:
    return x.mT * 2.0 + y.mT

def layers(x: Tensor["N", "D", f32], w1: Tensor["D", "D", f32],
           w2: Tensor["D", "D", f32]) -> Tensor["N", "D", f32]:
    h = x
    for w in (w1, w2):
        h = relu(h @ w) + h
    for scale in [0.5, 2.0]:
        h = h * scale
    return h

def scaled(x: Tensor["N", "D", f32]) -> Tensor["N", "D", f32]:
    d = x.shape[-1]
    return x / d ** 0.5 + x * d ** -0.5 + x / len(x) + x * (2 ** 0.5 * len(x.shape))

def extremes(x: Tensor["N", "D", f32]) -> Tensor["N", f32]:
    return x.amax(-1) + amin(x, axis=-1)

def nanogpt_attention(x: Tensor["B", "T", "C", f32], w_attn: Tensor["C", "3*C", f32],
                      b_attn: Tensor["3*C", f32], w_proj: Tensor["C", "C", f32], *,
                      n_head: int) -> Tensor["B", "T", "C", f32]:
    B, T, C = x.size()
    q, k, v = (x @ w_attn + b_attn).split(C, dim=2)
    k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
    q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
    v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / sqrt(k.size(-1)))
    mask = tril(ones((T, T)))
    att = att.masked_fill(mask == 0, float("-inf"))
    att = softmax(att, dim=-1)
    y = att @ v
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    return y @ w_proj

def halves_of(v: Tensor["L", f32]) -> Tensor["L/2", f32]:
    a, b = v.chunk(2)
    return a - b
"""


def _masks(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    flipped = (x > 0) ^ (y > 0)
    inside = (x > -1) & (x < 1)
    return np.where(~flipped | inside, x, y) + np.where((x < y) & ~(y > 0.5), 1.0, 0.0)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _halves(x: np.ndarray, c: np.ndarray, s: np.ndarray) -> np.ndarray:
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate((x1 * c - x2 * s, x1 * s + x2 * c), axis=-1)


def _pairs(x: np.ndarray, c: np.ndarray, s: np.ndarray) -> np.ndarray:
    a, b = x[:, ::2], x[:, 1::2]
    return np.stack((a * c - b * s, a * s + b * c), axis=-1).reshape(x.shape)


#: Each case: the function, its inputs' shapes, and numpy's result in float64.
CASES: dict[str, tuple[str, tuple[tuple[int, ...], ...], Any]] = {
    "masks": ("masks", ((13, 9), (13, 9)), _masks),
    "tile_masks": (
        "tile_masks",
        ((37, 29), (37, 29)),
        lambda a, b: np.where((a > 0) & ~(b > 1) | (a > b) ^ (b < -1), a, b),
    ),
    "powers": (
        "powers",
        ((6, 11),),
        lambda x: np.abs(x) ** 0.5 + x**2 + 2.0 ** np.clip(x, -1, 1),
    ),
    "torch_axes": (
        "torch_axes",
        ((7, 19),),
        lambda x: _softmax(x).max(-1, keepdims=True) + x.sum(1, keepdims=True),
    ),
    "halves": ("halves", ((9, 10), (9, 5), (9, 5)), _halves),
    "pairs": ("pairs", ((9, 14), (9, 7), (9, 7)), _pairs),
    "odd_sum": ("odd_sum", ((5, 12),), lambda x: x[:, 1::2].sum(-1)),
    **{
        f"steps_{d}": ("steps", ((3, d),), lambda x: x[:, 2:9:3] + x[:, -3:] + x[:, -1:])
        for d in (9, 10, 11, 14)
    },
    "swiglu": (
        "swiglu",
        ((7, 9), (9, 10)),
        lambda x, w: (lambda h: h[:, :5] / (1 + np.exp(-h[:, :5])) * h[:, 5:])(x @ w),
    ),
    "rms": (
        "rms",
        ((6, 13), (13,)),
        lambda x, g: x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * g,
    ),
    "linear": (
        "linear",
        ((5, 7), (6, 7), (6,)),
        lambda x, w, b: x @ w.T + b + 0.5 * x @ w.T + x @ w.T,
    ),
    "parts": (
        "parts",
        ((5, 12),),
        lambda x: x[:, :4] * x[:, 4:8] + 2 * x[:, 8:] + x[:, 8:] + x[:, :4] + 2 * x[:, 8:],
    ),
    "layers": (
        "layers",
        ((6, 5), (5, 5), (5, 5)),
        lambda x, w1, w2: (lambda h: np.maximum(h @ w2, 0) + h)(np.maximum(x @ w1, 0) + x),
    ),
    "scaled": (
        "scaled",
        ((7, 9),),
        lambda x: x / 3 + x / 3 + x / 7 + x * 2**0.5 * 2,
    ),
    "extremes": ("extremes", ((7, 9),), lambda x: x.max(-1) + x.min(-1)),
    "halves_of": ("halves_of", ((14,),), lambda v: v[:7] - v[7:]),
    "mT": ("swapped", ((3, 7, 9), (7, 9)), lambda x, y: x.transpose(0, 2, 1) * 2 + y.T),
    "created": ("created", ((7, 9),), lambda x: x + 5),
    "fixed": (
        "fixed",
        ((5, 7), (11,)),
        lambda x, v: x[1, ::2] + v[1::3] + x[:, 2:7:3].sum(0)[:1] + v[-4:] * v[:4],
    ),
}


built = built_everywhere(SOURCE, "cpu", "opencl", "sm_80")


@pytest.mark.parametrize("case", list(CASES))
def test_matches_numpy(built: Any, case: str) -> None:
    name, shapes, reference = CASES[case]
    rng = np.random.default_rng(len(case))
    inputs = [rng.standard_normal(shape).astype(np.float32) * 1.5 for shape in shapes]
    want = reference(*(x.astype(np.float64) for x in inputs))
    poison = np.full(want.shape, np.nan, np.float32)
    have = getattr(built, name)(*inputs, out=poison)
    np.testing.assert_allclose(np.asarray(have), want, rtol=1e-5, atol=1e-5)


def test_a_masks_sum_counts_and_its_mean_is_a_fraction(built: Any) -> None:
    """``(x > 0).sum(-1)``, as numpy and PyTorch count: i32 counts, and an f32 mean."""
    x = np.random.default_rng(13).standard_normal((37, 21)).astype(np.float32)
    rows, columns, fraction = built.counts(x)
    np.testing.assert_array_equal(rows, (x > 0).sum(-1))
    np.testing.assert_array_equal(columns, ((x > 0) & (x < 1)).sum(0))
    assert np.asarray(rows).dtype == np.int32 and np.asarray(fraction).dtype == np.float32
    np.testing.assert_allclose(fraction, (x > 0.5).mean(), rtol=1e-6)


def test_pytorch_casts_and_an_accuracy(built: Any) -> None:
    """``x.float()``, ``x.half()``, ``x.bfloat16()`` and ``(pred == y).float().mean()``."""
    rng = np.random.default_rng(11)
    logits = rng.standard_normal((37, 5)).astype(np.float32)
    y = rng.integers(0, 5, 37).astype(np.int32)
    want = (logits.argmax(-1) == y).mean()
    np.testing.assert_allclose(built.accuracy(logits, y), want, rtol=1e-6)
    x = rng.standard_normal(29).astype(np.float16)
    n = rng.integers(-50, 50, 29).astype(np.int32)
    wide = x.astype(np.float32)
    want = wide * 2 + wide.astype(ml_dtypes.bfloat16).astype(np.float32) + 2 * n
    poison = np.full(29, np.nan, np.float32)
    np.testing.assert_array_equal(built.casts(x, n, out=poison), want)


def test_type_as_casts_to_the_other_tensors_dtype(built: Any) -> None:
    """PyTorch's ``x.type_as(y)``: ``x`` rounded to ``y``'s dtype (f16 here)."""
    x = np.random.default_rng(12).standard_normal(29).astype(np.float32)
    like = np.zeros(29, np.float16)
    have = np.asarray(built.typed(x, like, out=np.full(29, np.nan, np.float16)))
    assert have.dtype == np.float16
    np.testing.assert_array_equal(have, (x * 3).astype(np.float16))


def test_nanogpt_attention_as_written_for_pytorch(built: Any) -> None:
    """nanoGPT's causal self-attention, line for line (``math.sqrt`` spelled ``sqrt``):
    ``x.size()``, ``split(C, dim=2)``, ``view``, ``masked_fill``, ``contiguous``, and the
    head count an int parameter that sizes the intermediates."""
    rng = np.random.default_rng(12)
    batch, steps, width = 2, 7, 12
    x = rng.standard_normal((batch, steps, width)).astype(np.float32)
    w_attn = (rng.standard_normal((width, 3 * width)) * 0.3).astype(np.float32)
    b_attn = rng.standard_normal(3 * width).astype(np.float32)
    w_proj = rng.standard_normal((width, width)).astype(np.float32)
    for heads in (3, 4):
        t = [torch.tensor(a, dtype=torch.float64) for a in (x, w_attn, b_attn, w_proj)]
        q, k, v = (t[0] @ t[1] + t[2]).split(width, dim=2)
        q, k, v = (a.view(batch, steps, heads, -1).transpose(1, 2) for a in (q, k, v))
        causal = torch.tril(torch.ones(steps, steps, dtype=torch.bool))
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        want = want.transpose(1, 2).reshape(batch, steps, width) @ t[3]
        poison = np.full(want.shape, np.nan, np.float32)
        have = built.nanogpt_attention(x, w_attn, b_attn, w_proj, n_head=heads, out=poison)
        np.testing.assert_allclose(have, want.numpy(), rtol=1e-5, atol=1e-5)


def test_a_strided_slice_that_takes_no_whole_steps_is_refused_at_the_call() -> None:
    """``x[:, 1::2]`` of an odd width: numpy takes ``(D - 1) / 2`` elements, a count no
    symbolic size gives here, so the call is refused (never a wrong answer)."""
    lib: Any = tessera.compile(SOURCE, "spellings.tsr", target="cpu").load()
    x = np.ones((4, 12), np.float32)
    np.testing.assert_allclose(lib.odd_sum(x), 6.0)
    with pytest.raises(ValueError, match=r"1:D:2 .* takes whole steps"):
        lib.odd_sum(np.ones((4, 11), np.float32))


def test_a_slice_of_a_slice_is_one_view() -> None:
    text = str(tessera.compile(SOURCE, "spellings.tsr", target="cpu").inspect_ir("graph"))
    body = text[text.index("func @steps") : text.index("func @fixed")]
    # x[:, 2:9:3]: a window and its column; x[:, -3:][:, ::1] and x[:, None, -1][:, 0]: one each
    assert body.count("= slice ") == 4, body


BAD = {
    "PyTorch's max(dim).values": (
        "def f(x: Tensor[4, 3, f32]) -> Tensor[4, f32]:\n    return x.max(dim=-1).values\n",
        2,
        "write x.max(axis) for the values (as numpy's max: PyTorch's max(dim) gives a pair)",
    ),
    "PyTorch's unbiased=": (
        "def f(x: Tensor[4, 3, f32]) -> Tensor[4, f32]:\n"
        "    return x.var(dim=-1, unbiased=False)\n",
        2,
        "write ddof=1 for unbiased=True (PyTorch's default), ddof=0 for unbiased=False",
    ),
    "PyTorch's long()": (
        "def f(x: Tensor[4, f32]) -> Tensor[4, i32]:\n    return x.long()\n",
        2,
        "a tensor has no attribute 'long'; write x.int(): integer tensors are i32 here",
    ),
    "PyTorch's item()": (
        "def f(x: Tensor[4, f32]) -> Tensor[4, f32]:\n    return x * x.sum().item()\n",
        2,
        "a tensor has no attribute 'item'; write x itself",
    ),
    "PyTorch's clamp_min": (
        "def f(x: Tensor[4, f32]) -> Tensor[4, f32]:\n    return x.clamp_min(0.0)\n",
        2,
        "write clamp(x, min=v) or maximum(x, v)",
    ),
    "an error whose result nested names receive": (
        "def f(x: Tensor[4, f32]) -> Tensor[4, f32]:\n"
        "    a, (b, c) = gleu(x)\n"
        "    return a + b + c\n",
        2,
        "unknown name 'gleu'",
    ),
    "& of floats": (
        "def f(x: Tensor[4, f32]) -> Tensor[4, f32]:\n    return where(x & x, x, x)\n",
        2,
        "'&' combines masks (comparisons of tensors), not",
    ),
    "& before a comparison": (
        "def f(x: Tensor[4, f32]) -> Tensor[4, f32]:\n"
        "    return where(x > 0.0 & x < 1.0, x, 0.0)\n",
        2,
        "'&' combines masks (comparisons of tensors), not",
    ),
    "~ of floats": (
        "def f(x: Tensor[4, f32]) -> Tensor[4, f32]:\n    return ~x\n",
        2,
        "'~' needs a mask (a comparison of tensors) or a value known at compile time",
    ),
    "a negative step": (
        "def f(x: Tensor[4, 6, f32]) -> Tensor[4, 6, f32]:\n    return x[:, ::-1]\n",
        2,
        "a slice step is positive: a negative one (reversing an axis) is not supported",
    ),
    "a zero step": (
        "def f(x: Tensor[4, 6, f32]) -> Tensor[4, 6, f32]:\n    return x[:, ::0]\n",
        2,
        "a slice step cannot be zero",
    ),
    "a tensor step": (
        "def f(x: Tensor[4, 6, f32], k: Tensor[1, i32]) -> Tensor[4, 6, f32]:\n"
        "    return x[:, ::k]\n",
        2,
        "a slice step is an integer, not",
    ),
    "a shift": (
        "def f(x: Tensor[4, f32]) -> Tensor[4, f32]:\n    return x << 2\n",
        2,
        "the shift operator '<<' is not supported in Tessera",
    ),
    "split unequal": (
        "def f(x: Tensor[4, 7, f32]) -> Tensor[4, 3, f32]:\n"
        "    a, b = split(x, 2, axis=1)\n    return a\n",
        2,
        "split: 7 elements do not split into 2 equal sections",
    ),
    "split indices out of order": (
        "def f(x: Tensor[4, 7, f32]) -> Tensor[4, 3, f32]:\n"
        "    a, b, c = split(x, [5, 3], axis=1)\n    return a\n",
        2,
        "part 1 would be 5:3 of an axis of 7",
    ),
    "split sizes": (
        "def f(x: Tensor[4, 7, f32]) -> Tensor[4, 3, f32]:\n"
        "    a, b = x.split([3, 3], dim=1)\n    return a\n",
        2,
        "the sizes add up to 6, but the axis has 7",
    ),
    "parts of a symbolic size": (
        'def f(x: Tensor[4, "D", f32]) -> Tensor[4, 3, f32]:\n'
        "    a, b = x.split(3, dim=1)\n    return a\n",
        2,
        "parts of 3 elements of a symbolic size D",
    ),
    "t of a batch": (
        "def f(x: Tensor[2, 4, 3, f32]) -> Tensor[2, 3, 4, f32]:\n    return x.t()\n",
        2,
        "x.t() transposes a matrix (PyTorch's rule); x has rank 3",
    ),
    "mT of a vector": (
        "def f(x: Tensor[4, f32]) -> Tensor[4, f32]:\n    return x.mT\n",
        2,
        "x.mT swaps the last two dims; x has rank 1",
    ),
    "dim and axis both": (
        "def f(x: Tensor[4, 6, f32]) -> Tensor[4, f32]:\n    return sum(x, axis=1, dim=1)\n",
        2,
        "sum got two values for 'axis'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_an_error_at_its_line(case: str) -> None:
    assert_one_error(*BAD[case])


def test_compile_time_bits_are_pythons() -> None:
    """Of numbers known at compile time, ``& | ^ ~`` compute as Python does."""
    source = (
        "MASK = (240 | 15) & ~3 ^ 1\n"
        "def f(x: Tensor[4, f32]) -> Tensor[4, f32]:\n    return x * float(MASK)\n"
    )
    lib: Any = tessera.compile(source, "bits.tsr", target="cpu").load()
    x = np.arange(1, 5, dtype=np.float32)
    np.testing.assert_allclose(lib.f(x), x * float((240 | 15) & ~3 ^ 1))
