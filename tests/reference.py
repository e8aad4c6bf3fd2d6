"""Float64 references for the examples and the standard library, and their inputs.

Inputs are random (never zeros) and rounded to the dtype the kernel takes, so
that the reference sees exactly the values the kernel does. Sizes are
ragged: not multiples of any tile the schedules pick.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.transpiler.graph.dtypes import DTYPES
from tessera.transpiler.pipeline import Program
from tessera.transpiler.tile.interpret import numpy_dtype

from .conftest import FIXED_HEAD_DIM, ROOT

BF16 = ml_dtypes.bfloat16


def f64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def philox4x32(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """Philox4x32-10 of one counter block, in Python integers, as Random123 defines it."""
    c, (k0, k1) = list(counter), key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k1, p0 & 0xFFFFFFFF]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return tuple(c)


def dropout(x: Any, p: float, seed: int) -> np.ndarray:
    """Tessera's dropout of ``x`` (rounded to f32), in f32: element ``n`` (row-major) is
    kept when the top 24 bits of Philox's first word for the counter ``n`` under the key
    ``seed``, over 2^24, are at least ``p``."""
    seed &= 2**64 - 1
    key = (seed & 0xFFFFFFFF, seed >> 32)
    drawn = [philox4x32((n & 0xFFFFFFFF, n >> 32, 0, 0), key)[0] >> 8 for n in range(x.size)]
    u = np.array(drawn, dtype=np.float64).reshape(x.shape) / 2**24
    scale = np.float32(1.0) / (np.float32(1.0) - np.float32(p))
    return np.where(u >= np.float32(p), np.asarray(x, np.float32) * scale, np.float32(0.0))


def attention(q: Any, k: Any, v: Any, causal: bool, scale: float | None = None) -> np.ndarray:
    q, k, v = f64(q), f64(k), f64(v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        rows, cols = np.indices(s.shape[-2:])
        s = np.where(cols > rows, -np.inf, s)
    return softmax(s) @ v


def f32_attention_source(causal: bool) -> str:
    """A graph kernel over the library's attention with f32 tensors: the keys and values
    are read in place, with no copy (the sanitizer run checks no read leaves them)."""
    return f"""\
@kernel
def attention(q: Tensor["B", "H", "S", "D", f32], k: Tensor["B", "H", "S", "D", f32],
              v: Tensor["B", "H", "S", "D", f32]) -> Tensor["B", "H", "S", "D", f32]:
    return ops.flash_attention(q, k, v, causal={causal})
"""


#: An f32 matmul: the left operand is read in place, the right one copied into tiles.
F32_MATMUL_SOURCE = """\
@kernel
def sgemm(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return a @ b
"""


#: The fp8 dtypes and their numpy types.
FP8 = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}


def low_precision_product_source(dtype: str, transposed: bool = False) -> str:
    """``A @ B`` of ``dtype`` tensors, accumulated in f32 and rounded once to ``dtype``;
    ``transposed``: ``A @ B.T`` of a ``B`` stored ``[N, K]``."""
    b, product = ('"N", "K"', "A @ B.T") if transposed else ('"K", "N"', "A @ B")
    return f"""\
@kernel
def f(A: Tensor["M", "K", {dtype}],
      B: Tensor[{b}, {dtype}]) -> Tensor["M", "N", {dtype} @accum(f32)]:
    return {product}
"""


def tf32(x: Any) -> np.ndarray:
    """``x`` rounded to tf32 (11 significant bits), to nearest even, as float64."""
    mantissa, exponent = np.frexp(f64(x))
    return np.ldexp(np.round(mantissa * 2**11) / 2**11, exponent)


def assert_tf32_product(have: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``have`` is ``a @ b`` of tf32 inputs (the f32s rounded to tf32 as they are read),
    accumulated in f32 and rounded once to tf32: within half a tf32 unit in the last
    place, with room for an f32 accumulation's order."""
    exact = tf32(a) @ tf32(b)
    assert not np.isnan(have).any(), "some outputs were never written"
    assert (f64(have) == tf32(have)).all(), "a result that is not a tf32 value"
    slack = np.abs(tf32(a)) @ np.abs(tf32(b)) * 2.0**-22
    assert (np.abs(f64(have) - exact) <= np.abs(exact) * 2.0**-11 + slack).all()


def assert_rounded_once(have: np.ndarray, exact: np.ndarray) -> None:
    """Every element of ``have`` is ``exact`` rounded to ``have``'s type: within half a
    unit in the last place (half the smallest subnormal near zero), with room for an f32
    accumulation's order."""
    info = ml_dtypes.finfo(have.dtype)
    bound = np.maximum(np.abs(exact) * float(info.eps) / 2, float(info.smallest_subnormal) / 2)
    error = np.abs(f64(have) - exact)
    assert not np.isnan(f64(have)).any(), "some outputs were never written"
    assert (error <= bound * (1 + 1e-5) + 1e-6 * np.abs(exact)).all(), error.max()


def layernorm(x: Any, w: Any, b: Any, eps: float) -> np.ndarray:
    x = f64(x)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * f64(w) + f64(b)


def rmsnorm(x: Any, w: Any, eps: float) -> np.ndarray:
    x = f64(x)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * f64(w)


def norm_grad(x: Any, w: Any, g: Any, eps: float, centred: bool) -> np.ndarray:
    """The gradient of ``layernorm(x) * w`` (``centred``) or ``rmsnorm(x) * w`` with
    respect to ``x``, given the cotangent ``g``, in float64: the textbook form
    ``s / n * (n gw - sum(gw) - xhat sum(gw xhat))``, ``gw = g w``, the middle term a
    layer norm's only."""
    x, gw = f64(x), f64(g) * f64(w)
    n = x.shape[-1]
    c = x - x.mean(axis=-1, keepdims=True) if centred else x
    s = 1.0 / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps)
    xhat = c * s
    shift = gw.sum(axis=-1, keepdims=True) if centred else 0.0
    return s / n * (n * gw - shift - xhat * (gw * xhat).sum(axis=-1, keepdims=True))


def norm_stats(x: Any, eps: float, centred: bool) -> np.ndarray:
    """Each row's mean (0 when not ``centred``) and scale ``rsqrt(mean((x - mean)^2) +
    eps)``, as two columns, in float64: the second result of ``layernorm_grad`` and
    ``rmsnorm_grad``."""
    x = f64(x)
    mean = x.mean(axis=-1, keepdims=True) if centred else np.zeros_like(x[..., :1])
    c = x - mean
    return np.concatenate([mean, 1.0 / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps)], -1)


def norm_param_grad(x: Any, g: Any, stats: Any) -> np.ndarray:
    """``sum(g * xhat)`` and ``sum(g)`` over the rows, as two columns, in float64; ``xhat``
    from the given statistics, ``(x - mean) * s``."""
    x, g, stats = f64(x), f64(g), f64(stats)
    xhat = (x - stats[:, :1]) * stats[:, 1:]
    return np.stack([(g * xhat).sum(axis=0), g.sum(axis=0)], -1)


def _norm_param_inputs(rng: np.random.Generator) -> dict[str, Any]:
    """x, g and x's statistics for ``norm_param_grad``: 133 rows (eight blocks of 16 and
    a ragged one), 203 columns."""
    x = _normal(rng, (133, 203), scale=3.0)
    return {
        "x": x,
        "g": _normal(rng, (133, 203)),
        "stats": norm_stats(x, 1e-5, centred=True).astype(np.float32),
    }


def _norm_grad_case(kernel: str, eps: float, centred: bool) -> Case:
    """``layernorm_grad`` or ``rmsnorm_grad``: dx and each row's statistics."""
    return Case(
        f"tessera/stdlib/{kernel}.tsr", kernel,
        lambda rng: {"x": _normal(rng, (R, 203), scale=3.0) + 1.0,
                     "weight": _normal(rng, (203,)), "g": _normal(rng, (R, 203)), "eps": eps,
                     "with_weight": True},
        lambda a: {"out0": norm_grad(a["x"], a["weight"], a["g"], eps, centred),
                   "out1": norm_stats(a["x"], eps, centred)},
        1e-5, True,
    )  # fmt: skip


def logsumexp(x: Any) -> np.ndarray:
    x = f64(x)
    m = x.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[..., 0]


def log_softmax(x: Any, axis: int = -1) -> np.ndarray:
    d = f64(x) - f64(x).max(axis=axis, keepdims=True)
    return d - np.log(np.exp(d).sum(axis=axis, keepdims=True))


def rotary(x: Any, cos: Any, sin: Any) -> np.ndarray:
    x, c, s = f64(x), f64(cos), f64(sin)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate((x1 * c - x2 * s, x1 * s + x2 * c), axis=-1)


def adam(p: Any, g: Any, m: Any, v: Any, lr: float, step: int, b1: float, b2: float,
         eps: float, weight_decay: float = 0.0) -> dict[str, np.ndarray]:  # fmt: skip
    p, g, m, v = f64(p), f64(g), f64(m), f64(v)
    m = m * b1 + g * (1 - b1)
    v = v * b2 + g * g * (1 - b2)
    m_hat, v_hat = m / (1 - b1**step), v / (1 - b2**step)
    p = p * (1 - lr * weight_decay)
    return {"param": p - m_hat * lr / (np.sqrt(v_hat) + eps), "exp_avg": m, "exp_avg_sq": v}


def decoder_block(a: dict[str, Any], heads: int) -> np.ndarray:
    """``examples/decoder_block.tsr``: pre-norm attention over heads of 64 and a SwiGLU MLP,
    each with its residual add."""
    x = f64(a["x"])
    rows = x.shape[0]

    def split(t: np.ndarray) -> np.ndarray:
        return t.reshape(rows, heads, 64).transpose(1, 0, 2)

    h = rmsnorm(x, a["norm1"], 1e-6)
    q, k, v = (split(h @ f64(a[w])) for w in ("wq", "wk", "wv"))
    mixed = attention(q, k, v, causal=False).transpose(1, 0, 2).reshape(rows, -1)
    x = x + mixed @ f64(a["wo"])
    h = rmsnorm(x, a["norm2"], 1e-6)
    gate = h @ f64(a["w1"])
    return x + (gate / (1.0 + np.exp(-gate)) * (h @ f64(a["w3"]))) @ f64(a["w2"])


@dataclass(frozen=True)
class Case:
    """One function of a ``.tsr`` file, its inputs, and what it must compute."""

    path: str
    function: str
    make: Callable[[np.random.Generator], dict[str, Any]]
    reference: Callable[[dict[str, Any]], dict[str, np.ndarray]]
    #: Relative tolerance (of the largest reference value): bf16 outputs round.
    rtol: float = 2e-2
    #: Whether its runs beyond the CPU (OpenCL, the simulated GPUs, the tile interpreter)
    #: are the exhaustive tier's (make test-exhaustive): make test runs it on the CPU.
    simulated_exhaustive: bool = False

    @property
    def id(self) -> str:
        return f"{self.path.split('/')[-1].removesuffix('.tsr')}:{self.function}"


def simulated(cases: tuple[Case, ...]) -> list[Any]:
    """``cases`` as the parameters of a test that runs them beyond the CPU: those marked
    ``simulated_exhaustive`` in the exhaustive tier."""
    return [
        pytest.param(c, id=c.id, marks=pytest.mark.exhaustive) if c.simulated_exhaustive
        else pytest.param(c, id=c.id)
        for c in cases
    ]  # fmt: skip


def _normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any = np.float32,
            scale: float = 1.0) -> np.ndarray:  # fmt: skip
    return (rng.standard_normal(shape) * scale).astype(dtype)


M, N, K = 150, 136, 70  # more than one 128-tile, K with a ragged last step
B, H, S, D = 2, 2, 150, 64  # head dim below the 128-wide tile: masked columns
R, C = 37, 50


def _gemm_inputs(dtype: Any) -> Callable[[np.random.Generator], dict[str, Any]]:
    return lambda rng: {"A": _normal(rng, (M, K), dtype), "B": _normal(rng, (K, N), dtype, 0.3)}


def _dequant_inputs(group: int | None, packed: bool, k: int) -> Callable[..., dict[str, Any]]:
    """Inputs of the library's ``gemm_dequant`` (``group`` None: a scale and a zero point
    per column) or ``gemm_dequant_grouped``: bf16 activations, a weight of i4 values
    (``packed``: two to a byte, as an i4 tensor is passed) or i8 ones, f32 scales and
    integral zero points."""

    def make(rng: np.random.Generator) -> dict[str, Any]:
        bound = 8 if packed else 128
        q = rng.integers(-bound, bound, (k, N)).astype(np.int8)
        shape = (k // group, N) if group else (N,)
        nibbles = q.astype(np.uint8) & 15
        return {"a": _normal(rng, (M, k), BF16),
                "q": nibbles[:, 0::2] | nibbles[:, 1::2] << 4 if packed else q,
                "scale": (rng.random(shape) * 0.02 + 0.01).astype(np.float32),
                "zero_point": rng.integers(-3, 4, shape).astype(np.float32),
                "with_zero_point": True}  # fmt: skip

    return make


def _dequant_product(a: dict[str, Any]) -> dict[str, np.ndarray]:
    """``a @ dequantize(q, scale, zero_point, dtype=bf16)`` in float64, the weight rounded
    to bf16 as ``dequantize`` rounds it (``docs/numerics.md``)."""
    q, scale, zero = a["q"], a["scale"], a["zero_point"]
    if q.dtype == np.uint8:  # packed i4: element 2j in the low nibble of byte j
        nibbles = np.stack([q & 15, q >> 4], axis=-1).reshape(q.shape[0], -1)
        q = (nibbles.astype(np.int8) ^ 8) - 8
    if scale.ndim == 2:
        group = q.shape[0] // scale.shape[0]
        scale, zero = np.repeat(scale, group, axis=0), np.repeat(zero, group, axis=0)
    w = ((q.astype(np.float32) - zero) * scale).astype(BF16)
    return {"out": f64(a["a"]) @ f64(w)}


def _qkv(shape: tuple[int, ...], names: str = "QKV") -> Callable[[np.random.Generator], dict]:
    return lambda rng: {n: _normal(rng, shape, BF16) for n in names}


def _decoder_inputs(rng: np.random.Generator, heads: int = 2, hidden: int = 97) -> dict:
    width = 64 * heads
    weights = {w: _normal(rng, (width, width), scale=width**-0.5) for w in ("wq", "wk", "wv", "wo")}
    return {"x": _normal(rng, (R, width)), "norm1": _normal(rng, (width,)), **weights,
            "norm2": _normal(rng, (width,)), "w1": _normal(rng, (width, hidden), scale=0.1),
            "w3": _normal(rng, (width, hidden), scale=0.1),
            "w2": _normal(rng, (hidden, width), scale=0.1)}  # fmt: skip


CASES = (
    Case("examples/mlp.tsr", "linear_gelu",
         lambda rng: {**_gemm_inputs(BF16)(rng), "bias": _normal(rng, (N,))},
         lambda a: {"out": gelu(f64(a["A"]) @ f64(a["B"]) + f64(a["bias"]))}),
    Case("examples/mlp.tsr", "mlp",
         lambda rng: {"x": _normal(rng, (M, 40), BF16), "W_in": _normal(rng, (40, N), BF16, 0.2),
                      "b_in": _normal(rng, (N,)), "W_out": _normal(rng, (N, 40), BF16, 0.2),
                      "b_out": _normal(rng, (40,))},
         lambda a: {"out": f64(a["x"]) + f64(gelu(f64(a["x"]) @ f64(a["W_in"]) + f64(a["b_in"]))
                                             .astype(BF16)) @ f64(a["W_out"]) + f64(a["b_out"])}),
    Case("examples/mlp.tsr", "linear_fp8",
         lambda rng: {"x": _normal(rng, (M, 256), FP8["fp8_e4m3"]),
                      "w": _normal(rng, (N, 256), FP8["fp8_e4m3"]), "bias": _normal(rng, (N,))},
         lambda a: {"out": f64(a["x"]) @ f64(a["w"]).T + f64(a["bias"])}),
    Case("examples/attention.tsr", "attention", _qkv((B, H, S, D)),
         lambda a: {"out": attention(a["Q"], a["K"], a["V"], causal=True)}),
    Case("examples/attention.tsr", "flash_attention",
         lambda rng: {**_qkv((B * H, S, D), "qkv")(rng), "causal": False},
         lambda a: {"out": attention(a["q"], a["k"], a["v"], causal=False)}),
    Case("examples/norms.tsr", "row_softmax", lambda rng: {"x": _normal(rng, (R, C), scale=4.0)},
         lambda a: {"out": softmax(f64(a["x"]))}, 1e-5),
    Case("examples/norms.tsr", "pre_norm",
         lambda rng: {"x": _normal(rng, (R, C), BF16), "gamma": _normal(rng, (C,)),
                      "beta": _normal(rng, (C,))},
         lambda a: {"out": layernorm(a["x"], a["gamma"], a["beta"], 1e-5)}),
    Case("examples/norms.tsr", "rms", lambda rng: {"x": _normal(rng, (R, C)),
                                                   "weight": _normal(rng, (C,))},
         lambda a: {"out": rmsnorm(a["x"], a["weight"], 1e-6)}, 1e-5),
    Case("examples/norms.tsr", "add_rms",
         lambda rng: {"x": _normal(rng, (B, S, C)), "residual": _normal(rng, (B, S, C)),
                      "weight": _normal(rng, (C,))},
         lambda a: {"out": rmsnorm(f64(a["x"] + a["residual"]), a["weight"], 1e-6)}, 1e-5),
    Case("examples/decoder_block.tsr", "decoder_block", _decoder_inputs,
         lambda a: {"out": decoder_block(a, heads=2)}, 1e-4),
    Case("examples/schedules.tsr", "gemm", _gemm_inputs(np.float16),
         lambda a: {"out": f64(a["A"]) @ f64(a["B"])}, 2e-3),
    Case("examples/schedules.tsr", "skinny_gemm", _gemm_inputs(np.float16),
         lambda a: {"out": f64(a["A"]) @ f64(a["B"])}, 2e-3),
    Case("examples/schedules.tsr", "gemm_bias_relu",
         lambda rng: {**_gemm_inputs(BF16)(rng), "bias": _normal(rng, (N,))},
         lambda a: {"out": np.maximum(f64(a["A"]) @ f64(a["B"]) + f64(a["bias"]), 0)}),
    Case("tessera/stdlib/gemm.tsr", "gemm",
         lambda rng: {"a": _normal(rng, (M, K), BF16), "b": _normal(rng, (K, N), BF16)},
         lambda a: {"out": f64(a["a"]) @ f64(a["b"])}, 1e-5),
    Case("tessera/stdlib/gemm_nt.tsr", "gemm_nt",
         lambda rng: {"a": _normal(rng, (M, K), BF16), "b": _normal(rng, (N, K), BF16)},
         lambda a: {"out": f64(a["a"]) @ f64(a["b"]).T}, 1e-5),
    Case("tessera/stdlib/gemm_dequant.tsr", "gemm_dequant", _dequant_inputs(None, False, K),
         _dequant_product, 1e-5),
    Case("tessera/stdlib/gemm_dequant_grouped.tsr", "gemm_dequant_grouped",
         _dequant_inputs(32, False, 160), _dequant_product, 1e-5),
    Case("tessera/stdlib/flash_attention.tsr", "flash_attention",
         lambda rng: {**_qkv((B * H, S, D), "qkv")(rng), "causal": True, "scale": 0.2},
         lambda a: {"out": attention(a["q"], a["k"], a["v"], causal=True, scale=0.2)}),
    Case("tessera/stdlib/softmax.tsr", "softmax", lambda rng: {"x": _normal(rng, (R, C), scale=4)},
         lambda a: {"out": softmax(f64(a["x"]))}, 1e-5),
    Case("tessera/stdlib/log_softmax.tsr", "log_softmax",
         lambda rng: {"x": _normal(rng, (R, C), scale=30.0)},
         lambda a: {"out": log_softmax(a["x"])}, 1e-5),
    Case("tessera/stdlib/layernorm.tsr", "layernorm",
         lambda rng: {"x": _normal(rng, (R, C)), "weight": _normal(rng, (C,)),
                      "bias": _normal(rng, (C,)), "eps": 1e-5, "with_weight": True,
                      "with_bias": True},
         lambda a: {"out": layernorm(a["x"], a["weight"], a["bias"], 1e-5)}, 1e-5),
    Case("tessera/stdlib/rmsnorm.tsr", "rmsnorm",
         lambda rng: {"x": _normal(rng, (R, C)), "weight": _normal(rng, (C,)), "eps": 1e-6,
                      "with_weight": True},
         lambda a: {"out": rmsnorm(a["x"], a["weight"], 1e-6)}, 1e-5),
    Case("tessera/stdlib/rotary_embedding.tsr", "rotary_embedding",
         lambda rng: {"x": _normal(rng, (R, 48)), "cos": _normal(rng, (R, 24)),
                      "sin": _normal(rng, (R, 24))},
         lambda a: {"out": rotary(a["x"], a["cos"], a["sin"])}, 1e-5),
    Case("tessera/stdlib/elementwise.tsr", "elementwise",
         lambda rng: {"x": _normal(rng, (R, C))}, lambda a: {"out": f64(a["x"])}, 1e-7),
    Case("tessera/stdlib/transpose.tsr", "transpose", lambda rng: {"x": _normal(rng, (R, 70))},
         lambda a: {"out": f64(a["x"]).T}, 1e-7),
    Case("tessera/stdlib/row_sum.tsr", "row_sum", lambda rng: {"x": _normal(rng, (R, C))},
         lambda a: {"out": f64(a["x"]).sum(axis=-1)}, 1e-6),
    Case("tessera/stdlib/row_mean.tsr", "row_mean", lambda rng: {"x": _normal(rng, (R, C))},
         lambda a: {"out": f64(a["x"]).mean(axis=-1)}, 1e-6),
    Case("tessera/stdlib/row_max.tsr", "row_max", lambda rng: {"x": _normal(rng, (R, C))},
         lambda a: {"out": f64(a["x"]).max(axis=-1)}, 1e-7),
    Case("tessera/stdlib/logsumexp.tsr", "logsumexp",
         lambda rng: {"x": _normal(rng, (R, C), scale=30.0)},
         lambda a: {"out": logsumexp(a["x"])}, 1e-6),
    # a tile kernel has no range check: indices past either end are clamped into the row
    Case("tessera/stdlib/take_along_axis.tsr", "take_along_axis",
         lambda rng: {"x": _normal(rng, (R, C)),
                      "index": rng.integers(-5, C + 5, (R, 7)).astype(np.int32)},
         lambda a: {"out": np.take_along_axis(f64(a["x"]), np.clip(a["index"], 0, C - 1),
                                              axis=-1)}, 1e-7),
    Case("tessera/stdlib/fused_adam.tsr", "fused_adam",
         lambda rng: {"param": _normal(rng, (1100,)), "grad": _normal(rng, (1100,)),
                      "exp_avg": _normal(rng, (1100,), scale=0.1),
                      "exp_avg_sq": np.abs(_normal(rng, (1100,), scale=0.1)), "lr": 1e-2,
                      "step": 3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                      "weight_decay": 0.1},
         lambda a: adam(a["param"], a["grad"], a["exp_avg"], a["exp_avg_sq"], a["lr"], a["step"],
                        a["beta1"], a["beta2"], a["eps"], a["weight_decay"]), 1e-5),
    Case("tessera/stdlib/attention_stats.tsr", "attention_stats",
         lambda rng: _attention_backward_inputs(rng, "q", "k", "v", "do"),
         lambda a: {"out": attention_backward(a)["stats"]}, 1e-5, True),
    Case("tessera/stdlib/attention_dq.tsr", "attention_dq",
         lambda rng: _attention_backward_inputs(rng, "q", "k", "v", "do", "stats"),
         lambda a: {"out": attention_backward(a)["dq"]}, 1e-4, True),
    Case("tessera/stdlib/attention_dkdv.tsr", "attention_dkdv",
         lambda rng: _attention_backward_inputs(rng, "q", "k", "v", "do", "stats"),
         lambda a: {"out0": attention_backward(a)["dk"], "out1": attention_backward(a)["dv"]},
         1e-4, True),
    Case("tessera/stdlib/pad.tsr", "pad",
         lambda rng: {"g": _normal(rng, (R, 13)), "like": _normal(rng, (3, C)), "start": 29.0},
         lambda a: {"out": np.pad(f64(a["g"]), ((0, 0), (29, C - 29 - 13)))}, 1e-7, True),
    Case("tessera/stdlib/softmax_grad.tsr", "softmax_grad",
         lambda rng: {"y": softmax(_normal(rng, (R, C), np.float64)).astype(np.float32),
                      "g": _normal(rng, (R, C))},
         lambda a: {"out": f64(a["y"]) * (f64(a["g"]) - (f64(a["g"]) * f64(a["y"])).sum(
             axis=-1, keepdims=True))}, 1e-5, True),
    Case("tessera/stdlib/log_softmax_grad.tsr", "log_softmax_grad",
         lambda rng: {"y": log_softmax(_normal(rng, (R, 203), np.float64)).astype(np.float32),
                      "g": _normal(rng, (R, 203))},
         lambda a: {"out": f64(a["g"]) - np.exp(f64(a["y"])) * f64(a["g"]).sum(
             axis=-1, keepdims=True)}, 1e-5, True),
    _norm_grad_case("layernorm_grad", 1e-5, centred=True),
    _norm_grad_case("rmsnorm_grad", 1e-6, centred=False),
    Case("tessera/stdlib/norm_param_grad.tsr", "norm_param_grad", _norm_param_inputs,
         lambda a: {"out": norm_param_grad(a["x"], a["g"], a["stats"])}, 1e-5, True),
    # a large step (lr 0.3), so that the bf16 parameter's rounding (the tolerance) is
    # small beside the update; tests/test_fp32_master.py checks its bits on the CPU
    Case("tessera/stdlib/fused_adam_master.tsr", "fused_adam_master",
         lambda rng: {"param": _normal(rng, (1100,), ml_dtypes.bfloat16),
                      "grad": _normal(rng, (1100,), ml_dtypes.bfloat16),
                      "master": _normal(rng, (1100,)),
                      "exp_avg": _normal(rng, (1100,), scale=0.1),
                      "exp_avg_sq": np.abs(_normal(rng, (1100,), scale=0.1)), "lr": 0.3,
                      "step": 3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                      "weight_decay": 0.1},
         lambda a: _adam_master(a), 1e-2, True),
)  # fmt: skip


def attention_backward(a: dict[str, Any]) -> dict[str, np.ndarray]:
    """FlashAttention-2's backward in float64 from ``a``'s q, k, v and do: the row
    logsumexp and ``delta = rowsum(do * o)`` side by side (``stats``), and the gradients
    of q, k and v."""
    q, k, v, do = (f64(a[n]) for n in ("q", "k", "v", "do"))
    s = q @ np.swapaxes(k, -1, -2) * a["scale"]
    if a["causal"]:
        rows, cols = np.indices(s.shape[-2:])
        s = np.where(cols > rows, -np.inf, s)
    lse = logsumexp(s)[..., None]
    p = np.exp(s - lse)
    delta = (do * (p @ v)).sum(axis=-1, keepdims=True)
    ds = p * (do @ np.swapaxes(v, -1, -2) - delta)
    return {
        "stats": np.concatenate([lse, delta], axis=-1),
        "dq": ds @ k * a["scale"],
        "dk": np.swapaxes(ds, -1, -2) @ q * a["scale"],
        "dv": np.swapaxes(p, -1, -2) @ do,
    }


def _attention_backward_inputs(rng: np.random.Generator, *names: str) -> dict[str, Any]:
    """q, k, v and do of 2 x 150 x 64 (ragged against the 128-row tiles), causal, with
    the lse and delta the backward kernels read where ``names`` asks for them."""
    a: dict[str, Any] = {n: _normal(rng, (2, 150, 64)) for n in ("q", "k", "v", "do")}
    a |= {"causal": True, "scale": 0.125}
    if "stats" in names:
        a["stats"] = attention_backward(a)["stats"].astype(np.float32)
    return {n: a[n] for n in (*names, "causal", "scale")}


def _adam_master(a: dict[str, Any]) -> dict[str, np.ndarray]:
    """``fused_adam_master``'s step: Adam on the f32 master, the parameter its rounding."""
    step = adam(a["master"], a["grad"], a["exp_avg"], a["exp_avg_sq"], a["lr"], a["step"],
                a["beta1"], a["beta2"], a["eps"], a["weight_decay"])  # fmt: skip
    master = step.pop("param")
    return {**step, "master": master, "param": master}


@dataclass(frozen=True)
class Placement:
    """Where a test puts a case's arrays for the runtime, and how it reads them back:
    numpy arrays as they are, or copies on a GPU (torch tensors, cupy arrays)."""

    put: Callable[[np.ndarray], Any]
    take: Callable[[Any, np.dtype], np.ndarray]


HOST = Placement(put=lambda a: a, take=lambda x, dtype: x)


def check_case(
    case: Case,
    target: str,
    arch: str | None = None,
    seed: int = 0,
    placement: Placement = HOST,
    load: Callable[[Program], Any] = Program.load,
) -> None:
    """Run a case's function built for ``target`` on its random inputs, every output
    poisoned with NaN first, and compare with the float64 reference. ``load`` gives
    the module whose function runs: Tessera's runtime, or a generated loader."""
    inputs = case.make(np.random.default_rng(seed))
    expected = case.reference({k: np.copy(v) for k, v in inputs.items()})
    defines = FIXED_HEAD_DIM.get((target, case.path))
    program = tessera.compile_file(ROOT / case.path, target=target, arch=arch, defines=defines)
    fn = getattr(load(program), case.function)
    meta = next(f for f in program.ir("meta")["functions"] if f["name"] == case.function)
    placed = {k: placement.put(v) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
    if meta["results"]:
        params = {p["name"]: p for p in meta["params"]}
        dtypes = {n: np.dtype(numpy_dtype(DTYPES[params[n]["dtype"]])) for n in meta["results"]}
        outs = {n: placement.put(np.full(expected[n].shape, np.nan).astype(dtypes[n]))
                for n in meta["results"]}  # fmt: skip
        fn(**placed, out=outs["out"] if "out" in outs else tuple(outs.values()))
        got = {n: placement.take(out, dtypes[n]) for n, out in outs.items()}
    else:
        fn(**placed)
        got = {k: placement.take(placed[k], inputs[k].dtype) for k in expected}
    for name, want in expected.items():
        have = f64(got[name])
        assert not np.isnan(have).any(), f"{name}: some outputs were never written"
        error = np.abs(have - want).max() / np.abs(want).max()
        assert error < case.rtol, f"{name}: relative error {error:.2e}"
