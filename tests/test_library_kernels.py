"""Library kernels over the shapes and fusions a model has, on every backend.

A transformer's activations are ``[B, S, C]`` and its attention scores ``[B, H, S, S]``;
the library's kernels are written for one matrix (``[M, K] @ [K, N]``, rows of ``[R, C]``)
and take such operands with one program-grid axis per leading dim. The kernels read the
reduction length as the operand's last axis: a batched matmul read its second
(``M``), and did not compile; a softmax, layernorm or rmsnorm over a rank-3 tensor
stopped the compiler, and so did rotary embedding over ``[B, S, D]``.

Elementwise ops that feed a softmax or a norm are computed where the kernel loads its
operand (``softmax(x * t)`` stopped the compiler), and a chain of elementwise ops alone
(``gelu(x + b) + r``) is a kernel of its own (it had none).

A product of a transposed operand (``x @ w.T`` of a ``[N, K]`` weight, ``q @ k.T``) reads
the operand as it lies, through the library's ``gemm_nt``: it used to need a transpose
kernel, which no backend had. A launch over more batch axes than a GPU grid has (a
product of ``[B, H, S, D]`` tensors: four) folds them into the third.

Attention written with graph ops (``softmax(q @ k.T * c) @ v``, with or without a cast
of the probabilities) runs as ``flash_attention``: one kernel, no score matrix in
memory.

A reduction over the second-to-last axis (``sum(x, axis=0)`` of a matrix) is the row
reduction of the transpose: two kernels, where it used to be an error; a softmax over it
is the transpose of the softmax of the transpose. Over any other axis, the axes before
and after it are merged first (a view), so that the same swap serves; ``keepdims`` is a
reshape of the result. A transpose by any permutation is a swap of merged axes, with a
copy before and after where the merging is not enough: those were errors.

A new axis on a value in memory (``x * s[:, None]``, ``x / norm(x)[:, None]``) is a view
that the kernel reading it loads, broadcast: such a chain had no kernel.

A transpose that no product reads in place (``x.T + y``) is the library's
``transpose`` kernel, of square blocks; so is a tile kernel that loads its block with
``rows=T.n, cols=T.m`` (its ``T.n`` used to reach the generated code unset).

A scalar computed from sizes or scalar parameters (``(a @ b) / sqrt(float(K))``, a
size read by its name as in ``sum(d * d, axis=-1) / C``) is
computed by each kernel that reads it: such a scalar used to be host-side work, which no
backend ran. ``softmax(q @ k.T / sqrt(float(D))) @ v`` is ``flash_attention`` with its
default scale.

A norm without its weight or bias (``layernorm(x)``, ``rmsnorm(x)``) leaves the product or
the sum out of the library kernel: those were errors.

A row kernel's op on a vector (``softmax(v)``, ``max(v)``, ``rmsnorm(v, w)``) runs on the
one row of ``v`` as ``[1, N]``: those were errors.

A softmax, an RMSNorm or a LayerNorm written out with reductions and elementwise ops
(Llama's ``x * rsqrt(mean(x ** 2, ...) + eps) * w``) is the library's op: one kernel, where
it was three or four.

A function that returns a parameter as it is (``return x``, ``x * 1.0``) copies it: it
had no entry point at all.

An elementwise op on a 0-d tensor (``sqrt(sum(v * v))``, ``v / max(abs(v))``, a 0-d
parameter) computes on it as ``[1]``: those were errors.

A reshape reads the tensor in memory with the new dims, in the kernel that reads it:
``reshape`` had no kernel. So does a transpose that keeps the last axis (``[B, S, H, D]``
as ``[B, H, S, D]``), reading each row where it lies: such a transpose was an error.

A value that elementwise ops read more than once (``y * sigmoid(y)`` of a product,
``sum(y * y)``, a GELU written out) is computed in the kernel of its readers: it used
to end a kernel, written to memory and read back by the next.

Each case runs against the float64 reference at sizes that are not multiples of the
tiles, outputs poisoned first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera

from .conftest import ROOT
from .gpusim import simulated_cupy, simulated_driver, use_simulator
from .reference import dropout, f64, gelu, layernorm, log_softmax, rmsnorm, rotary, softmax
from .test_cuda import ARCHS, _nvcc, needs_gxx, needs_nvcc
from .test_gpusim import _library
from .test_hip import _hipcc_warning_free, needs_hipcc
from .test_loader import _loader_module
from .test_names import HostCalls, LoaderCalls
from .test_opencl import _platform

SOURCE = """\
@kernel
def bmm(a: Tensor["B", "M", "K", f32], b: Tensor["B", "K", "N", f32],
        bias: Tensor["N", f32]) -> Tensor["B", "M", "N", f32]:
    return a @ b + bias

@kernel
def bmm_bf16(a: Tensor["B", "M", "K", bf16],
             b: Tensor["B", "K", "N", bf16]) -> Tensor["B", "M", "N", f32]:
    return a @ b

@kernel
def scores_softmax(x: Tensor["B", "H", "S", "T", f32]) -> Tensor["B", "H", "S", "T", f32]:
    return softmax(x, axis=-1)

@kernel
def log_probs(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return log_softmax(x * 2.0)

@kernel
def log_probs_written_out(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    m = max(x, axis=-1, keepdims=True)
    return x - m - log(sum(exp(x - m), axis=-1, keepdims=True))

@kernel
def column_log_probs(x: Tensor["R", "C", bf16]) -> Tensor["R", "C", f32]:
    return cast(log_softmax(x, axis=0), f32)

@kernel
def cross_entropy(x: Tensor["R", "C", f32], t: Tensor["R", "C", f32]) -> Tensor["R", f32]:
    return -sum(t * log_softmax(x), axis=-1)

@kernel
def layer_norm(x: Tensor["B", "S", "C", f32], w: Tensor["C", f32],
               b: Tensor["C", f32]) -> Tensor["B", "S", "C", f32]:
    return layernorm(x, w, b, eps=1e-5)

@kernel
def plain_norms(x: Tensor["B", "S", "D", f32], w: Tensor["D", f32],
                b: Tensor["D", f32]) -> Tensor["B", "S", "D", f32]:
    return layernorm(x) + layernorm(x, w) * 2.0 + layernorm(x, bias=b) * 4.0 + rmsnorm(x) * 8.0

@kernel
def rms_norm(x: Tensor["B", "S", "C", f32], w: Tensor["C", f32]) -> Tensor["B", "S", "C", f32]:
    return rmsnorm(x, w, eps=1e-6) * 0.5

@kernel
def rope(x: Tensor["B", "S", "D", f32], cos: Tensor["S", "D/2", f32],
         sin: Tensor["S", "D/2", f32]) -> Tensor["B", "S", "D", f32]:
    return rotary_embedding(x, cos, sin)

@kernel
def scaled_softmax(x: Tensor["B", "H", "S", "T", f32], t: float) -> Tensor["B", "H", "S", "T", f32]:
    return softmax(x * t, axis=-1)

@kernel
def add_rms_norm(x: Tensor["B", "S", "C", f32], r: Tensor["B", "S", "C", f32],
                 w: Tensor["C", f32]) -> Tensor["B", "S", "C", f32]:
    return rmsnorm(x + r, w, eps=1e-6)

@kernel
def bias_gelu_residual(x: Tensor["B", "S", "C", f32], b: Tensor["C", f32],
                       r: Tensor["B", "S", "C", f32]) -> Tensor["B", "S", "C", f32]:
    return gelu(x + b) + r

@kernel
def gated(x: Tensor["R", "C", bf16], g: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return silu(x) * g

@kernel
def axpy(x: Tensor["N", f32], y: Tensor["N", f32], alpha: float) -> Tensor["N", f32]:
    return x * alpha + y

@kernel
def row_scale(x: Tensor["R", "C", f32], s: Tensor["R", 1, f32]) -> Tensor["R", "C", f32]:
    return 2.0 - x * s

@kernel
def twice_used(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    y = x * 2.0
    return relu(y) + y

@kernel
def scaled_matmul(x: Tensor["M", "K", f32], s: Tensor["K", f32],
                  w: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return (x * s) @ w

@kernel
def matmul_norm(x: Tensor["M", "K", f32], w: Tensor["K", "N", f32],
                g: Tensor["N", f32]) -> Tensor["M", "N", f32]:
    return rmsnorm((x @ w) * 2.0, g, eps=1e-6)

@kernel
def row_sums(x: Tensor["B", "S", "C", f32]) -> Tensor["B", "S", f32]:
    return sum(x, axis=-1)

@kernel
def row_means(x: Tensor["R", "C", bf16]) -> Tensor["R", f32]:
    return mean(x, axis=-1)

@kernel
def row_maxes(x: Tensor["B", "S", "C", f32]) -> Tensor["B", "S", f32]:
    return max(x, axis=-1)

@kernel
def log_partition(x: Tensor["R", "C", f32], t: float) -> Tensor["R", f32]:
    return logsumexp_safe(x * t, axis=-1)

@kernel
def row_max_kept(x: Tensor["R", "C", f32]) -> Tensor["R", 1, f32]:
    return max(x, axis=-1, keepdims=True)

@kernel
def centered(x: Tensor["B", "S", "C", f32]) -> Tensor["B", "S", "C", f32]:
    return x - mean(x, axis=-1, keepdims=True)

@kernel
def linear(x: Tensor["M", "K", f32], w: Tensor["N", "K", f32],
           b: Tensor["N", f32]) -> Tensor["M", "N", f32]:
    return relu(x @ w.T + b)

@kernel
def linear_bf16(x: Tensor["B", "S", "K", bf16],
                w: Tensor["N", "K", bf16]) -> Tensor["B", "S", "N", f32]:
    return x @ w.T

@kernel
def linear_fp8(x: Tensor["M", "K", fp8_e4m3],
               w: Tensor["N", "K", fp8_e4m3]) -> Tensor["M", "N", f32]:
    return x @ w.T

@kernel
def scores(q: Tensor["B", "H", "S", "D", f32],
           k: Tensor["B", "H", "T", "D", f32]) -> Tensor["B", "H", "S", "T", f32]:
    return q @ k.T * 0.125

@kernel
def graph_attention(q: Tensor["B", "H", "S", "D", f32], k: Tensor["B", "H", "T", "D", f32],
                    v: Tensor["B", "H", "T", "D", f32]) -> Tensor["B", "H", "S", "D", f32]:
    return softmax_safe(q @ k.T * 0.125, axis=-1) @ v

@kernel
def graph_attention_bf16(q: Tensor["B", "H", "S", "D", bf16], k: Tensor["B", "H", "T", "D", bf16],
                         v: Tensor["B", "H", "T", "D", bf16]) -> Tensor["B", "H", "S", "D", f32]:
    return cast(softmax(q @ k.T / 8.0, axis=-1), bf16) @ v

@kernel
def param_scaled_attention(q: Tensor["B", "H", "S", "D", bf16],
                           k: Tensor["B", "H", "T", "D", bf16],
                           v: Tensor["B", "H", "T", "D", bf16],
                           scale: float) -> Tensor["B", "H", "S", "D", f32]:
    return cast(softmax(scale * (q @ k.T)), bf16) @ v

@kernel
def param_scaled_flash(q: Tensor["B", "S", "D", f32], k: Tensor["B", "T", "D", f32],
                       v: Tensor["B", "T", "D", f32], scale: float) -> Tensor["B", "S", "D", f32]:
    return flash_attention(q, k, v, causal=True, scale=scale)

@kernel
def transposed_sum(x: Tensor["B", "M", "N", f32],
                   y: Tensor["B", "N", "M", f32]) -> Tensor["B", "N", "M", f32]:
    return x.T + y

@kernel
def transposed_bf16(x: Tensor["M", "N", bf16]) -> Tensor["N", "M", bf16]:
    return transpose(x * 2.0)

@kernel
def tile_transpose(x: Tensor["M", "N", f32]) -> Tensor["N", "M", f32]:
    T = tile.context()
    return tile.transpose(tile.load(x, rows=T.n, cols=T.m))

@kernel
def row_scaled(x: Tensor["B", "R", "C", f32], s: Tensor["R", f32],
               c: Tensor["C", f32]) -> Tensor["B", "R", "C", f32]:
    return x * s[:, None] - c[None, :]

@kernel
def unit_rows(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return x / sqrt(sum(x * x, axis=-1))[:, None]

@kernel
def outer(a: Tensor["R", f32], b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return a[:, None] * b[None, :]

@kernel
def scaled_rows_matmul(x: Tensor["M", "K", f32], w: Tensor["K", "N", f32],
                       s: Tensor["M", f32]) -> Tensor["M", "N", f32]:
    t = s[:, None]
    return (x @ w) * t

@kernel
def product_by_later_sums(x: Tensor["M", "K", f32], w: Tensor["K", "N", f32],
                          y: Tensor["M", "C", f32]) -> Tensor["M", "N", f32]:
    return (x @ w) * sum(y, axis=-1)[:, None]

@kernel
def tempered_softmax(x: Tensor["R", "C", f32], t: Tensor["R", f32]) -> Tensor["R", "C", f32]:
    return softmax(x / t[:, None], axis=-1)

@kernel
def column_sums(x: Tensor["R", "C", f32]) -> Tensor["C", f32]:
    return sum(x, axis=0)

@kernel
def column_means(x: Tensor["B", "R", "C", bf16]) -> Tensor["B", "C", f32]:
    return mean(x, axis=1)

@kernel
def column_maxes(x: Tensor["R", "C", f32]) -> Tensor["C", f32]:
    return max(x * 2.0, axis=-2)

@kernel
def column_softmax(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return softmax_safe(x, axis=0)

@kernel
def outer_axis_sums(x: Tensor["A", "R", "C", f32]) -> Tensor["R", "C", f32]:
    return sum(x, axis=0)

@kernel
def middle_axis_means(x: Tensor["A", "R", "B", "C", bf16]) -> Tensor["A", "B", "C", f32]:
    return mean(x, axis=1)

@kernel
def centered_columns(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return x - mean(x, axis=0, keepdims=True)

@kernel
def outer_axis_softmax(x: Tensor["A", "R", "C", f32]) -> Tensor["A", "R", "C", f32]:
    return softmax(x, axis=0)

@kernel
def permuted_twice(x: Tensor["A", "B", "C", f32]) -> Tensor["B", "A", "C", f32]:
    return transpose(x, (1, 0, 2)) + transpose(x, (1, 0, 2)) * 2.0

@kernel
def permuted_beside(x: Tensor["A", "A", "C", f32]) -> Tensor["A", "A", "C", f32]:
    return transpose(x, (1, 0, 2)) + x

@kernel
def flattened_beside(x: Tensor["A", "B", f32], y: Tensor["A*B", f32]) -> Tensor["A*B", f32]:
    return x.reshape("A*B") + x.reshape("A*B") * y

@kernel
def rotated(x: Tensor["A", "B", "C", f32]) -> Tensor["C", "A", "B", f32]:
    return transpose(x, (2, 0, 1))

@kernel
def scrambled(x: Tensor["A", "B", "C", "D", f32]) -> Tensor["C", "A", "D", "B", f32]:
    return transpose(x, (2, 0, 3, 1)) + 1.0

@kernel
def pairs_swapped(x: Tensor["A", "B", "C", "D", f32]) -> Tensor["B", "A", "D", "C", f32]:
    return transpose(x, (1, 0, 3, 2))

@kernel
def dropped(x: Tensor["B", "R", "C", f32], p: float, seed: int) -> Tensor["B", "R", "C", f32]:
    return dropout(x, p, seed=seed)

@kernel
def dropped_residual(x: Tensor["R", "C", f32], y: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return residual(x, y * 2.0, dropout=0.25, seed=11)

@kernel
def dropped_product(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32],
                    seed: int) -> Tensor["M", "N", f32]:
    return dropout(relu(a @ b), 0.5, seed=seed)

@kernel
def dropped_softmax(x: Tensor["R", "C", f32], seed: int) -> Tensor["R", "C", f32]:
    return dropout(softmax(x), 0.1, seed=seed)

@kernel
def dropped_then_swapped(x: Tensor["R", "C", f32]) -> Tensor["C", "R", f32]:
    return dropout(x, 0.2, seed=5).T

@kernel
def leaky(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return maximum(x, x * 0.1)

@kernel
def clipped(x: Tensor["R", "C", bf16], lo: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return minimum(maximum(x, lo), 6.0)

@kernel
def floored(x: Tensor["R", "C", f32], s: float) -> Tensor["R", "C", f32]:
    return x * maximum(s, 1.0) + minimum(x, 0.5)

@kernel
def column_mins(x: Tensor["A", "R", "C", f32]) -> Tensor["A", "C", f32]:
    return x.min(axis=1) + min(x, axis=-2)

@kernel
def row_range(x: Tensor["R", "C", bf16]) -> Tensor["R", bf16]:
    return max(x, axis=-1) - min(x, axis=-1)

@kernel
def tile_row_min(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    T = tile.context()
    t = tile.load(x, rows=T.m)
    return t - t.min(axis=1)[:, None]

@kernel
def relu6(x: Tensor["R", "C", bf16], lo: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return clamp(x, 0.0, 6.0) + clamp(x, min=lo)

@kernel
def kept_sums(x: Tensor["R", "C", f32], b: Tensor["R", 1, f32]) -> Tensor["R", 1, f32]:
    return sum(x, axis=-1, keepdims=True) + sum(x * 2.0, axis=-1, keepdims=True) + b

@kernel
def amax(x: Tensor["R", "C", f32]) -> Tensor["R", f32]:
    return max(abs(x), axis=-1)

@kernel
def scaled_fp8(x: Tensor["R", "C", f32]) -> Tensor["R", "C", fp8_e4m3]:
    return cast(x * (448.0 / maximum(max(abs(x), axis=-1, keepdims=True), 1e-12)), fp8_e4m3)

@kernel
def tile_clamp(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    T = tile.context()
    return tile.abs(tile.clamp(tile.load(x, rows=T.m), max=2.0))

@kernel
def rms_by_hand(x: Tensor["B", "S", "C", f32], w: Tensor["C", f32]) -> Tensor["B", "S", "C", f32]:
    return x * rsqrt(mean(x * x, axis=-1, keepdims=True) + 1e-6) * w

@kernel
def size_scaled_matmul(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return (a @ b) / sqrt(float(a.shape[-1]))

@kernel
def size_scaled_softmax(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return softmax(x * rsqrt(x.shape[-1]), axis=-1)

@kernel
def shared_scalar(x: Tensor["R", "C", f32], y: Tensor["R", "C", f32],
                  s: float) -> Tensor["R", "C", f32]:
    t = s * float(x.shape[0])
    return softmax(y, axis=-1) * t + exp(x * t)

@kernel
def size_scaled_attention(q: Tensor["B", "S", "D", f32], k: Tensor["B", "T", "D", f32],
                          v: Tensor["B", "T", "D", f32]) -> Tensor["B", "S", "D", f32]:
    return softmax(q @ k.T / sqrt(float(q.shape[-1])), axis=-1) @ v

@kernel
def split_heads(x: Tensor["S", "C", f32]) -> Tensor["S", "C/16", 16, f32]:
    return reshape(x, ("S", "C/16", 16))

@kernel
def merged_rows(x: Tensor["B", "S", "C", f32]) -> Tensor["B*S", "C", f32]:
    return reshape(x, ("B*S", "C")) * 2.0

@kernel
def grouped_softmax(x: Tensor["S", "C", f32]) -> Tensor["S", "C/4", 4, f32]:
    return softmax(reshape(x, ("S", "C/4", 4)), axis=-1)

@kernel
def reshaped_twice(x: Tensor["B", "S", "C", f32],
                   w: Tensor["C", "N", f32]) -> Tensor["B*S", "N", f32]:
    r = x.reshape("B*S", "C")
    return (r @ w) * sum(r, axis=-1)[:, None]

@kernel
def merged_matmul(x: Tensor["B", "S", "C", f32],
                  w: Tensor["C", "N", f32]) -> Tensor["B*S", "N", f32]:
    return x.reshape("B*S", "C") @ w

@kernel
def split_heads_t(x: Tensor["S", "C", f32],
                  w: Tensor["C", "C", f32]) -> Tensor[4, "S", "C/4", f32]:
    return transpose((x @ w).reshape("S", 4, "C/4"), (1, 0, 2))

@kernel
def heads_first(x: Tensor["B", "S", "H", "D", bf16],
                y: Tensor["B", "H", "S", "D", f32]) -> Tensor["B", "H", "S", "D", f32]:
    return transpose(x, (0, 2, 1, 3)) * 2.0 + y

@kernel
def rows_last(x: Tensor["A", "B", "R", "C", f32]) -> Tensor["R", "A", "B", "C", f32]:
    return relu(transpose(x, (2, 0, 1, 3)))

@kernel
def multi_head(x: Tensor["S", "C", f32], wq: Tensor["C", "C", f32], wk: Tensor["C", "C", f32],
               wv: Tensor["C", "C", f32], wo: Tensor["C", "C", f32]) -> Tensor["S", "C", f32]:
    q = transpose((x @ wq).reshape("S", 4, "C/4"), (1, 0, 2))
    k = transpose((x @ wk).reshape("S", 4, "C/4"), (1, 0, 2))
    v = transpose((x @ wv).reshape("S", 4, "C/4"), (1, 0, 2))
    o = softmax(q @ k.T / sqrt(float(q.shape[-1])), axis=-1) @ v
    return transpose(o, (1, 0, 2)).reshape("S", "C") @ wo + x

@kernel
def heads_attention(x: Tensor["B", "S", "H", 64, bf16],
                    y: Tensor["B", "S", "H", 64, bf16]) -> Tensor["B", "S", "H", 64, f32]:
    kv = transpose(y, (0, 2, 1, 3))
    o = flash_attention(transpose(x, (0, 2, 1, 3)), kv, kv, causal=True)
    return cast(transpose(o * 0.5, (0, 2, 1, 3)), f32)

@kernel
def fused_qkv_attention(x: Tensor["S", 128, f32],
                        w: Tensor[128, 384, f32]) -> Tensor["S", 128, f32]:
    q, k, v = split_qkv(x @ w, heads=2)
    return transpose(flash_attention(q, k, v, causal=True), (1, 0, 2)).reshape("S", 128)

@kernel
def split_attention_bf16(qkv: Tensor["B", "S", 384, bf16]) -> Tensor["B", 4, "S", 32, f32]:
    q, k, v = split_qkv(qkv, heads=4)
    return cast(flash_attention(q, k, v), f32)

@kernel
def split_attention(qkv: Tensor["B", "S", "C", bf16]) -> Tensor["B", "S", "C/3", f32]:
    q, k, v = split_qkv(qkv, heads=3)
    o = flash_attention(q, k, v, causal=True)
    return cast(transpose(o, (0, 2, 1, 3)), f32).reshape("B", "S", "C/3")

@kernel
def matrix_vector(a: Tensor["M", "K", f32], x: Tensor["K", f32]) -> Tensor["M", f32]:
    return a @ x

@kernel
def matrix_vector_bf16(a: Tensor["B", "M", "K", bf16],
                       x: Tensor["K", bf16]) -> Tensor["B", "M", f32]:
    return a @ x

@kernel
def vector_matrix(x: Tensor["K", f32], w: Tensor["K", "N", f32]) -> Tensor["N", f32]:
    return x @ w + 1.0

@kernel
def vector_vector(x: Tensor["K", bf16], y: Tensor["K", bf16]) -> Tensor[f32]:
    return x @ y

@kernel
def rest_inferred(x: Tensor["B", "S", "C", f32], w: Tensor["C", "N", f32]) -> Tensor["B*S*N", f32]:
    y = softmax(x.reshape("B", "S", -1, 4), axis=-1).reshape(-1, "C")
    return (y @ w).reshape(-1)

@kernel
def heads_scores(x: Tensor["B", "S", 128, bf16],
                 y: Tensor["B", "S", 128, bf16]) -> Tensor["B", 2, "S", "S", f32]:
    q = transpose(x.reshape("B", "S", 2, 64), (0, 2, 1, 3))
    k = transpose(y.reshape("B", "S", 2, 64), (0, 2, 1, 3))
    return q @ transpose(k, (0, 1, 3, 2))

@kernel
def heads_values(p: Tensor["B", 2, "S", "S", f32],
                 y: Tensor["B", "S", 80, f32]) -> Tensor["B", 2, "S", 40, f32]:
    return p @ transpose(y.reshape("B", "S", 2, 40), (0, 2, 1, 3))

@kernel
def broadcast_batch(a: Tensor["B", "M", "K", f32],
                    w: Tensor[1, "K", "N", f32]) -> Tensor["B", "M", "N", f32]:
    return a @ w

@kernel
def gated_mlp(h: Tensor["N", "E", f32], wg: Tensor["E", "G", f32],
              wu: Tensor["E", "G", f32]) -> Tensor["N", "G", f32]:
    return silu(h @ wg) * (h @ wu)

@kernel
def grouped_norm(x: Tensor["N", "E", f32], eps: float = 1e-5) -> Tensor["N", "E", f32]:
    g = x.reshape("N", "E/4", 4)
    return (g / sqrt(mean(g * g, axis=-1, keepdims=True) + eps)).reshape("N", "E")

@kernel
def calls_helpers(x: Tensor["B", "S", "C", f32], wg: Tensor["C", "F", f32],
                  wu: Tensor["C", "F", f32],
                  wd: Tensor["F", "C", f32]) -> Tensor["B", "S", "C", f32]:
    h = grouped_norm(x.reshape("B*S", "C"))
    y = gated_mlp(h, wg, wu) @ wd
    return x + grouped_norm(y, eps=1e-3).reshape("B", "S", "C")

@kernel
def grouped_attention(q: Tensor["B", 4, "S", 64, bf16], k: Tensor["B", 2, "S", 64, bf16],
                      v: Tensor["B", 2, "S", 64, bf16]) -> Tensor["B", 4, "S", 64, f32]:
    return cast(flash_attention(q, k, v, causal=True), f32)

@kernel
def multi_query(q: Tensor["B", 3, "S", 64, f32], k: Tensor["B", 1, "S", 64, f32],
                v: Tensor["B", 1, "S", 64, f32]) -> Tensor["B", 3, "S", 64, f32]:
    return flash_attention(q, k, v)

@kernel
def llama_block(x: Tensor["B", "S", 256, f32], wn1: Tensor[256, f32], wq: Tensor[256, 256, f32],
                wk: Tensor[256, 128, f32], wv: Tensor[256, 128, f32], wo: Tensor[256, 256, f32],
                cos: Tensor["S", 32, f32], sin: Tensor["S", 32, f32], wn2: Tensor[256, f32],
                wg: Tensor[256, 512, f32], wu: Tensor[256, 512, f32],
                wd: Tensor[512, 256, f32]) -> Tensor["B", "S", 256, f32]:
    h = rmsnorm(x, wn1, eps=1e-5)
    q = rotary_embedding(transpose((h @ wq).reshape("B", "S", 4, 64), (0, 2, 1, 3)), cos, sin)
    k = rotary_embedding(transpose((h @ wk).reshape("B", "S", 2, 64), (0, 2, 1, 3)), cos, sin)
    v = transpose((h @ wv).reshape("B", "S", 2, 64), (0, 2, 1, 3))
    o = flash_attention(q, k, v, causal=True)
    x = x + transpose(o, (0, 2, 1, 3)).reshape("B", "S", 256) @ wo
    h = rmsnorm(x, wn2, eps=1e-5)
    return x + (silu(h @ wg) * (h @ wu)) @ wd

@kernel
def spatial_mean(x: Tensor["B", "H", "W", "C", f32]) -> Tensor["B", "C", f32]:
    return mean(x, axis=(1, 2))

@kernel
def tail_max(x: Tensor["B", "R", "C", f32]) -> Tensor["B", 1, 1, f32]:
    return max(x, axis=(-2, -1), keepdims=True)

@kernel
def tail_range_bf16(x: Tensor["B", "R", "C", bf16]) -> Tensor["B", f32]:
    return sum(x, axis=(1, 2)) - cast(x.min(axis=(1, 2)), f32)

@kernel
def apart_sum(x: Tensor["A", "B", "C", f32]) -> Tensor["B", f32]:
    return sum(x, axis=(0, 2))

@kernel
def apart_max_keep(x: Tensor["A", "B", "C", "D", f32]) -> Tensor[1, "B", 1, "D", f32]:
    return max(x, axis=(0, 2), keepdims=True)

@kernel
def apart_mean(x: Tensor["A", "B", "C", "D", f32]) -> Tensor["B", "D", f32]:
    return mean(x, axis=(-2, 0))

@kernel
def apart_min_bf16(x: Tensor["A", "B", "C", bf16]) -> Tensor["B", bf16]:
    return x.min(axis=(2, 0))

@kernel
def named_result(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    y = x * 2.0 + 1.0
    return y

@kernel
def split_scaled_attention(qkv: Tensor["S", 384, f32]) -> Tensor[2, "S", 64, f32]:
    q, k, v = split_qkv(qkv, heads=2)
    return flash_attention(q * 0.5, k, v)

@kernel
def split_keys(qkv: Tensor["B", "S", 240, bf16]) -> Tensor["B", 4, "S", 20, bf16]:
    q, k, v = split_qkv(qkv, heads=4)
    return k

@kernel
def split_rotary_attention(qkv: Tensor["B", "S", 192, f32], cos: Tensor["S", 16, f32],
                           sin: Tensor["S", 16, f32]) -> Tensor["B", "S", 64, f32]:
    q, k, v = split_qkv(qkv, heads=2)
    q = rotary_embedding(q, cos, sin)
    k = rotary_embedding(k, cos, sin)
    o = flash_attention(q, k, v, causal=True)
    return transpose(o, (0, 2, 1, 3)).reshape("B", "S", 64)

@kernel
def split_scores(qkv: Tensor["S", "C", f32]) -> Tensor[3, "S", "S", f32]:
    q, k, v = split_qkv(qkv, heads=3)
    return q @ transpose(k, (0, 2, 1))

@kernel
def gpt2_block(x: Tensor["B", "S", 128, f32], ln1_w: Tensor[128, f32], ln1_b: Tensor[128, f32],
               w_qkv: Tensor[128, 384, f32], b_qkv: Tensor[384, f32],
               w_o: Tensor[128, 128, f32], b_o: Tensor[128, f32], ln2_w: Tensor[128, f32],
               ln2_b: Tensor[128, f32], w_fc: Tensor[128, 512, f32], b_fc: Tensor[512, f32],
               w_proj: Tensor[512, 128, f32],
               b_proj: Tensor[128, f32]) -> Tensor["B", "S", 128, f32]:
    h = layernorm(x, ln1_w, ln1_b, eps=1e-5)
    q, k, v = split_qkv(h @ w_qkv + b_qkv, heads=2)
    a = flash_attention(q, k, v, causal=True)
    x = x + transpose(a, (0, 2, 1, 3)).reshape("B", "S", 128) @ w_o + b_o
    h = layernorm(x, ln2_w, ln2_b, eps=1e-5)
    return x + gelu(h @ w_fc + b_fc) @ w_proj + b_proj

@kernel
def vector_softmax(x: Tensor["N", f32]) -> Tensor["N", f32]:
    return softmax(x * 2.0)

@kernel
def vector_max(x: Tensor["N", f32]) -> Tensor[f32]:
    return max(x, axis=0)

@kernel
def vector_norm(x: Tensor["N", f32], w: Tensor["N", f32]) -> Tensor["N", f32]:
    return rmsnorm(x, w, eps=1e-6) + 1.0

@kernel
def swish_product(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    y = a @ b
    return y * sigmoid(y)

@kernel
def gelu_written_out(x: Tensor["R", "C", f32], b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    y = x + b
    return 0.5 * y * (1.0 + tanh(0.7978845608 * (y + 0.044715 * y * y * y)))

@kernel
def layernorm_written_out(x: Tensor["R", "C", f32], w: Tensor["C", f32],
                          b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    d = x - mean(x, axis=-1, keepdims=True)
    return d / sqrt(mean(d * d, axis=-1, keepdims=True) + 1e-5) * w + b

@kernel
def softmax_written_out(x: Tensor["B", "S", "C", f32]) -> Tensor["B", "S", "C", f32]:
    e = exp(x - max(x, axis=-1, keepdims=True))
    return e / sum(e, axis=-1, keepdims=True)

@kernel
def llama_rmsnorm(x: Tensor["B", "S", "C", f32], w: Tensor["C", f32]) -> Tensor["B", "S", "C", f32]:
    return w * (x * rsqrt(mean(x ** 2, axis=-1, keepdims=True) + 1e-6))

@kernel
def returned_as_is(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return transpose(x * 1.0, (0, 1))

@kernel
def sum_of_squares(x: Tensor["N", f32]) -> Tensor[f32]:
    return sum(x * x)

@kernel
def row_energy(x: Tensor["R", "C", f32]) -> Tensor["R", f32]:
    y = x - 0.5
    return sum(y * y, axis=-1)

@kernel
def mean_squares(x: Tensor["R", "C", f32], y: Tensor["R", "C", f32]) -> Tensor["R", f32]:
    d = x - y
    return sum(d * d, axis=-1) / C

@kernel
def vector_length(x: Tensor["N", f32]) -> Tensor[f32]:
    return sqrt(sum(x * x))

@kernel
def absmax_scaled(x: Tensor["N", f32]) -> Tensor["N", f32]:
    return x / max(abs(x))

@kernel
def mean_squared_error(x: Tensor["N", f32], y: Tensor["N", f32]) -> Tensor[f32]:
    d = x - y
    return sum(d * d) / N

@kernel
def cosine_similarity(x: Tensor["N", f32], y: Tensor["N", f32]) -> Tensor[f32]:
    return sum(x * y) / (sqrt(sum(x * x)) * sqrt(sum(y * y)) + 1e-8)

@kernel
def times_a_0d(x: Tensor["R", "C", f32], s: Tensor[f32]) -> Tensor["R", "C", f32]:
    return x * s + 1.0

@kernel
def tile_nt(a: Tensor["M", "K", f32], b: Tensor["N", "K", f32]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(a.shape[-1], T.k):
        acc += tile.dot(tile.load(a, rows=T.m, cols=kb),
                        tile.transpose(tile.load(b, rows=T.n, cols=kb)))
    return acc

@kernel
def leaky_where(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return where(x > 0.0, x, 0.01 * x)

@kernel
def masked_scores(s: Tensor["B", "R", "C", f32],
                  m: Tensor["R", "C", f32]) -> Tensor["B", "R", "C", f32]:
    return softmax(where(m == 0.0, -INF, s))

@kernel
def count_at_least(x: Tensor["R", "C", f32], t: float) -> Tensor["R", f32]:
    return sum(cast(x >= t, f32), axis=-1)

@kernel
def column_gate(x: Tensor["R", "C", bf16], b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return where(b < 0.5, x * 2.0, b)

@kernel
def product_relu(a: Tensor["M", "K", f32], w: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    s = a @ w
    return where(s <= 0.0, 0.0, s)

@kernel
def tile_where(x: Tensor["R", "C", f32], y: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    T = tile.context()
    a = tile.load(x, rows=T.m)
    b = tile.load(y, rows=T.m)
    return tile.where(a != b, b - a, -1.0)

@kernel
def band_or_far(x: Tensor["R", "C", f32], lo: float) -> Tensor["R", "C", f32]:
    return where(x > lo and x < 1.0 or not x > -2.0, x, 0.0)

@kernel
def gate_and_sign(x: Tensor["R", "C", bf16], b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return where(b < 0.5 and x > 0.0, x, b)

@kernel
def tile_and_not(x: Tensor["R", "C", f32], y: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    T = tile.context()
    a = tile.load(x, rows=T.m)
    b = tile.load(y, rows=T.m)
    return tile.where(a > 0.0 and not b > a, a, b)

@kernel
def tile_cat(a: Tensor["R", "C", f32], b: Tensor["R", "D", f32]) -> Tensor["R", "C+D", f32]:
    T = tile.context()
    return tile.concat((tile.load(a, rows=T.m), tile.load(b, rows=T.m)), axis=1)

@kernel
def tile_cat_wider(x: Tensor["R", "C", f32],
                   y: Tensor["R", "C+2", f32]) -> Tensor["R", "2*C+2", f32]:
    T = tile.context()
    return tile.concat((tile.load(x, rows=T.m), tile.load(y, rows=T.m) * 2.0), axis=1)

@kernel
def int_ratio(x: Tensor["R", "C", f32], n: int, m: int) -> Tensor["R", "C", f32]:
    return x * (n / m) + float(n)

@kernel
def swiglu_halves(h: Tensor["R", "C", f32]) -> Tensor["R", "C/2", f32]:
    F = h.shape[-1] / 2
    return silu(h[:, :F]) * h[:, F:]

@kernel
def slices_broadcast(h: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return h + h[1:2, :] * h[:, 3:4]

@kernel
def halves_as_numpy_writes_them(h: Tensor["R", "C", f32]) -> Tensor["R", "C/2", f32]:
    return silu(h[:, : h.shape[1] // 2]) * h[:, "C/2":] + h[:, 7 // 2 : 7 % 3 + 3]

@kernel
def fused_gate_up(x: Tensor["M", "K", bf16],
                  w: Tensor["K", "F2", bf16]) -> Tensor["M", "F2/2", f32]:
    h = x @ w
    return silu(h[..., :h.shape[-1] / 2]) * h[..., h.shape[-1] / 2:]

@kernel
def sliced_operands(x: Tensor["M", "K", f32], w: Tensor["N", "K", f32]) -> Tensor["M", "N", f32]:
    return x[:, 8:] @ w[:, 8:].T

@kernel
def sliced_softmax(x: Tensor["B", "R", "C", f32]) -> Tensor["B", "R", "C-8", f32]:
    return softmax(x[:, :, 8:])

@kernel
def last_columns(x: Tensor["B", "S", "C", f32]) -> Tensor["B", "S", 24, f32]:
    return x[..., -24:]

@kernel
def cached_rows(k: Tensor["B", "S", "D", f32],
                y: Tensor["B", "T", "D", f32]) -> Tensor["B", "T", "D", f32]:
    return k[:, :y.shape[1]] * 2.0 + y

@kernel
def cache_prefix_attention(q: Tensor["B", "T", 64, f32], k: Tensor["B", "S", 64, f32],
                           v: Tensor["B", "S", 64, f32]) -> Tensor["B", "T", 64, f32]:
    T = q.shape[1]
    return flash_attention(q, k[:, :T], v[:, :T], causal=True)

@kernel
def inner_block_product(x: Tensor["M", "K", f32],
                        w: Tensor["K", "N", f32]) -> Tensor["M-4", "N-3", f32]:
    return x[2:-2, 5:] @ w[5:, 1:-2]

@kernel
def last_token_logits(h: Tensor["B", "S", "C", f32],
                      w: Tensor["C", "V", f32]) -> Tensor["B", "V", f32]:
    return h[:, -1] @ w

@kernel
def second_head(x: Tensor["B", "H", "S", "D", bf16]) -> Tensor["B", "S", "D", f32]:
    return cast(x[:, 1], f32) * 2.0

@kernel
def columns_on_a_new_axis(x: Tensor["N", "C", f32]) -> Tensor["N", 1, 4, f32]:
    return x[..., None, :4] * 2.0

@kernel
def later_rows_softmax(x: Tensor["A", "R", "C", f32]) -> Tensor["A", "R-1", "C", f32]:
    return softmax(x[:, 1:])
""" + (ROOT / "examples" / "decoder_block.tsr").read_text(encoding="utf-8")

TARGETS = [("cpu", None), ("opencl", None), ("cuda", "sm_80"), ("cuda", "sm_90a"),
           ("hip", "gfx90a"), ("loader", "sm_80")]  # fmt: skip
#: The functions whose result is a product, and which argument is its right operand.
PRODUCTS = {"bmm": 1, "bmm_bf16": 1, "scaled_matmul": 2, "matmul_norm": 1,
            "graph_attention": 2, "graph_attention_bf16": 2, "scaled_rows_matmul": 1,
            "size_scaled_matmul": 1, "size_scaled_attention": 2,
            "product_by_later_sums": 1, "param_scaled_attention": 2,
            "param_scaled_flash": 2, "dropped_product": 1, "swish_product": 1,
            "broadcast_batch": 1, "gated_mlp": 1, "product_relu": 1}  # fmt: skip
#: The functions whose result is a product with a transposed right operand, and which.
TRANSPOSED = {"linear": 1, "linear_bf16": 1, "linear_fp8": 1, "scores": 1, "tile_nt": 1,
              "sliced_operands": 1}  # fmt: skip
#: The functions whose result is their first argument with the last two axes swapped.
SWAPPED = {"transposed_sum", "transposed_bf16", "tile_transpose", "dropped_then_swapped"}
#: The functions whose result drops the second-to-last axis.
COLUMNS = {"column_sums", "column_means", "column_maxes"}
#: The functions whose result is a reshape or a permutation, and its shape for the arguments.
RESHAPED = {
    "swiglu_halves": lambda h: (h.shape[0], h.shape[1] // 2),
    "halves_as_numpy_writes_them": lambda h: (h.shape[0], h.shape[1] // 2),
    "fused_gate_up": lambda x, w: (x.shape[0], w.shape[1] // 2),
    "sliced_softmax": lambda x: (*x.shape[:2], x.shape[2] - 8),
    "last_columns": lambda x: (*x.shape[:2], 24),
    "cached_rows": lambda k, y: y.shape,
    "cache_prefix_attention": lambda q, k, v: q.shape,
    "inner_block_product": lambda x, w: (x.shape[0] - 4, w.shape[1] - 3),
    "later_rows_softmax": lambda x: (x.shape[0], x.shape[1] - 1, x.shape[2]),
    "last_token_logits": lambda h, w: (h.shape[0], w.shape[1]),
    "second_head": lambda x: (x.shape[0], *x.shape[2:]),
    "columns_on_a_new_axis": lambda x: (x.shape[0], 1, 4),
    "split_heads_t": lambda x, w: (4, x.shape[0], w.shape[1] // 4),
    "heads_first": lambda x, y: y.shape,
    "rows_last": lambda x: (x.shape[2], x.shape[0], x.shape[1], x.shape[3]),
    "multi_head": lambda x, *weights: x.shape,
    "heads_attention": lambda x, y: x.shape,
    "fused_qkv_attention": lambda x, w: x.shape,
    "gpt2_block": lambda x, *weights: x.shape,
    "llama_block": lambda x, *weights: x.shape,
    "split_attention_bf16": lambda qkv: (qkv.shape[0], 4, qkv.shape[1], 32),
    "split_attention": lambda qkv: (*qkv.shape[:2], qkv.shape[2] // 3),
    "split_scaled_attention": lambda qkv: (2, qkv.shape[0], 64),
    "split_rotary_attention": lambda qkv, cos, sin: (*qkv.shape[:2], 64),
    "split_scores": lambda qkv: (3, qkv.shape[0], qkv.shape[0]),
    "matrix_vector": lambda a, x: a.shape[:-1],
    "matrix_vector_bf16": lambda a, x: a.shape[:-1],
    "vector_matrix": lambda x, w: w.shape[1:],
    "vector_vector": lambda x, y: (),
    "spatial_mean": lambda x: (x.shape[0], x.shape[3]),
    "tail_max": lambda x: (x.shape[0], 1, 1),
    "tail_range_bf16": lambda x: x.shape[:1],
    "apart_sum": lambda x: x.shape[1:2],
    "tile_cat": lambda a, b: (a.shape[0], a.shape[1] + b.shape[1]),
    "tile_cat_wider": lambda x, y: (x.shape[0], x.shape[1] + y.shape[1]),
    "apart_max_keep": lambda x: (1, x.shape[1], 1, x.shape[3]),
    "apart_mean": lambda x: (x.shape[1], x.shape[3]),
    "heads_scores": lambda x, y: (x.shape[0], 2, x.shape[1], y.shape[1]),
    "heads_values": lambda p, y: (*p.shape[:-1], 40),
    "rest_inferred": lambda x, w: (x.shape[0] * x.shape[1] * w.shape[1],),
    "vector_softmax": lambda x: x.shape,
    "vector_max": lambda x: (),
    "sum_of_squares": lambda x: (),
    "vector_length": lambda x: (),
    "absmax_scaled": lambda x: x.shape,
    "mean_squared_error": lambda x, y: (),
    "cosine_similarity": lambda x, y: (),
    "vector_norm": lambda x, w: x.shape,
    "split_heads": lambda x: (x.shape[0], x.shape[1] // 16, 16),
    "merged_rows": lambda x: (x.shape[0] * x.shape[1], x.shape[2]),
    "grouped_softmax": lambda x: (x.shape[0], x.shape[1] // 4, 4),
    "merged_matmul": lambda x, w: (x.shape[0] * x.shape[1], w.shape[1]),
    "reshaped_twice": lambda x, w: (x.shape[0] * x.shape[1], w.shape[1]),
    "outer_axis_sums": lambda x: x.shape[1:],
    "middle_axis_means": lambda x: (x.shape[0], *x.shape[2:]),
    "centered_columns": lambda x: x.shape,
    "outer_axis_softmax": lambda x: x.shape,
    "rotated": lambda x: (x.shape[2], x.shape[0], x.shape[1]),
    "permuted_twice": lambda x: (x.shape[1], x.shape[0], x.shape[2]),
    "permuted_beside": lambda x: x.shape,
    "flattened_beside": lambda x, y: y.shape,
    "scrambled": lambda x: tuple(x.shape[i] for i in (2, 0, 3, 1)),
    "pairs_swapped": lambda x: tuple(x.shape[i] for i in (1, 0, 3, 2)),
}
#: The functions whose result drops the last axis.
REDUCTIONS = {"row_sums", "row_means", "row_maxes", "log_partition", "amax", "row_energy",
              "mean_squares", "cross_entropy", "count_at_least"}  # fmt: skip


@pytest.mark.exhaustive
@pytest.mark.compile
@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_with_nvcc_warning_free(arch: str, tmp_path: Path) -> None:
    _nvcc("library.tsr", arch, tmp_path, text=SOURCE)


@pytest.mark.exhaustive
@pytest.mark.compile
@needs_hipcc
def test_compiles_with_hipcc_warning_free(tmp_path: Path) -> None:
    _hipcc_warning_free(tessera.compile(SOURCE, "library.tsr", target="hip").source, tmp_path)


@pytest.fixture(scope="module", params=TARGETS, ids=[f"{t}-{a}" if a else t for t, a in TARGETS])
def library(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The functions on a backend: CUDA and HIP on the simulated GPU, directly and
    (CUDA) through the ``--python-loader`` module."""
    target, arch = request.param
    if target == "opencl" and _platform() is not None:
        pytest.skip(f"needs pyopencl and PoCL: {_platform()}")
    with pytest.MonkeyPatch.context() as monkeypatch:
        if target == "loader":
            cupy = simulated_cupy(arch)
            use_simulator(monkeypatch, cupy)
            program = tessera.compile(SOURCE, "library.tsr", target="cuda", arch=arch)
            tmp_path = tmp_path_factory.mktemp("loader")
            module = _loader_module(program, tmp_path, cupy, monkeypatch, simulated_driver())
            yield LoaderCalls(module, _result)
        else:
            functions = _library(SOURCE, target, arch, monkeypatch)
            yield functions if target in ("cuda", "hip") else HostCalls(functions, _result)


def _result(name: str, args: tuple[Any, ...]) -> tuple[tuple[int, ...], np.dtype]:
    """Every function's result is f32 (but a bf16 transpose's); a product's has its right
    operand's columns, a reduction's drops the last axis."""
    right = PRODUCTS.get(name)
    shape = args[0].shape
    if name in RESHAPED:
        shape = RESHAPED[name](*args)
    elif right is not None:
        shape = (*shape[:-1], args[right].shape[-1])
    elif name in TRANSPOSED:
        shape = (*shape[:-1], args[TRANSPOSED[name]].shape[-2])
    elif name in REDUCTIONS:
        shape = shape[:-1]
    elif name in SWAPPED:
        shape = (*shape[:-2], shape[-1], shape[-2])
        return shape, np.dtype(ml_dtypes.bfloat16 if name == "transposed_bf16" else np.float32)
    elif name in COLUMNS:
        shape = (*shape[:-2], shape[-1])
    elif name == "outer":
        shape = (shape[0], args[1].shape[0])
    elif name in ("row_max_kept", "kept_sums"):
        shape = (*shape[:-1], 1)
    elif name == "split_keys":
        return (args[0].shape[0], 4, args[0].shape[1], 20), np.dtype(ml_dtypes.bfloat16)
    elif name == "scaled_fp8":
        return shape, np.dtype(ml_dtypes.float8_e4m3fn)
    elif name == "row_range":
        return shape[:-1], np.dtype(ml_dtypes.bfloat16)
    elif name == "apart_min_bf16":
        return shape[1:2], np.dtype(ml_dtypes.bfloat16)
    elif name == "column_mins":
        shape = (shape[0], shape[2])
    return shape, np.dtype(np.float32)


@pytest.mark.execute
@needs_gxx
def test_batched_matmul_with_a_bias(library: Any) -> None:
    rng = np.random.default_rng(21)
    a = rng.standard_normal((3, 37, 150), dtype=np.float32)
    b = rng.standard_normal((3, 150, 29), dtype=np.float32)
    bias = rng.standard_normal(29, dtype=np.float32)
    out = f64(library.bmm(a, b, bias))
    np.testing.assert_allclose(out, f64(a) @ f64(b) + f64(bias), rtol=1e-4, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_batched_bf16_matmul(library: Any) -> None:
    rng = np.random.default_rng(22)
    a = rng.standard_normal((2, 70, 45)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((2, 45, 33)).astype(ml_dtypes.bfloat16)
    out = f64(library.bmm_bf16(a, b))
    np.testing.assert_allclose(out, f64(a) @ f64(b), rtol=1e-4, atol=1e-3)


@pytest.mark.execute
@needs_gxx
def test_log_softmax_keeps_rows_that_softmax_rounds_to_zero(library: Any) -> None:
    """Rows spread over hundreds (softmax underflows to 0 for most of each row, so
    ``log(softmax(x))`` is ``-inf`` there) and a ragged width; the op, the same written
    out, over the other axis, and a classifier's loss."""
    rng = np.random.default_rng(57)
    x = rng.standard_normal((37, 301), dtype=np.float32) * 60
    t = rng.random((37, 301), dtype=np.float32)
    want = log_softmax(2 * f64(x))
    assert (softmax(f64(x) * 2).astype(np.float32) == 0).any()
    np.testing.assert_allclose(f64(library.log_probs(x)), want, rtol=1e-5, atol=1e-4)
    out = f64(library.log_probs_written_out(x))
    np.testing.assert_allclose(out, log_softmax(f64(x)), rtol=1e-5, atol=1e-4)
    xb = (x / 30).astype(ml_dtypes.bfloat16)
    want = log_softmax(f64(xb), axis=0).astype(ml_dtypes.bfloat16)  # the op's dtype
    np.testing.assert_allclose(f64(library.column_log_probs(xb)), f64(want), rtol=1e-2)
    want = -(f64(t) * log_softmax(f64(x))).sum(-1)
    np.testing.assert_allclose(f64(library.cross_entropy(x, t)), want, rtol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_softmax_over_attention_scores(library: Any) -> None:
    x = np.random.default_rng(23).standard_normal((2, 3, 19, 45), dtype=np.float32) * 4
    np.testing.assert_allclose(f64(library.scores_softmax(x)), softmax(f64(x)), atol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_layernorm_over_a_batch_of_sequences(library: Any) -> None:
    rng = np.random.default_rng(24)
    x = rng.standard_normal((3, 21, 53), dtype=np.float32)
    w, b = rng.standard_normal((2, 53), dtype=np.float32)
    want = layernorm(x, w, b, 1e-5)
    np.testing.assert_allclose(f64(library.layer_norm(x, w, b)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_rmsnorm_over_a_batch_of_sequences(library: Any) -> None:
    rng = np.random.default_rng(25)
    x = rng.standard_normal((3, 21, 53), dtype=np.float32)
    w = rng.standard_normal(53, dtype=np.float32)
    want = 0.5 * rmsnorm(x, w, 1e-6)
    np.testing.assert_allclose(f64(library.rms_norm(x, w)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_rotary_embedding_over_a_batch(library: Any) -> None:
    rng = np.random.default_rng(26)
    x = rng.standard_normal((2, 19, 64), dtype=np.float32)
    angle = rng.uniform(0, 6.3, (19, 32))
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    np.testing.assert_allclose(f64(library.rope(x, cos, sin)), rotary(x, cos, sin), atol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_a_scaled_softmax_computes_its_operand_where_it_loads_it(library: Any) -> None:
    x = np.random.default_rng(27).standard_normal((2, 3, 19, 45), dtype=np.float32)
    out = f64(library.scaled_softmax(x, 0.37))
    np.testing.assert_allclose(out, softmax(f64(x) * np.float32(0.37)), atol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_a_norm_of_a_residual_sum(library: Any) -> None:
    rng = np.random.default_rng(28)
    x, r = rng.standard_normal((2, 3, 21, 53), dtype=np.float32)
    w = rng.standard_normal(53, dtype=np.float32)
    want = rmsnorm(x + r, w, 1e-6)  # the sum in f32, as the kernel adds
    np.testing.assert_allclose(f64(library.add_rms_norm(x, r, w)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_an_elementwise_chain_is_a_kernel_of_its_own(library: Any) -> None:
    rng = np.random.default_rng(29)
    x, r = rng.standard_normal((2, 3, 21, 53), dtype=np.float32)
    b = rng.standard_normal(53, dtype=np.float32)
    want = gelu(f64(x) + f64(b)) + f64(r)
    out = f64(library.bias_gelu_residual(x, b, r))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_an_elementwise_chain_widens_a_bf16_operand(library: Any) -> None:
    rng = np.random.default_rng(30)
    x = rng.standard_normal((37, 45)).astype(ml_dtypes.bfloat16)
    g = rng.standard_normal((37, 45), dtype=np.float32)
    # silu keeps its operand's dtype: its result is rounded to bf16 before the product
    silu = (f64(x) / (1 + np.exp(-f64(x)))).astype(ml_dtypes.bfloat16)
    want = f64(silu) * f64(g)
    np.testing.assert_allclose(f64(library.gated(x, g)), want, rtol=2**-8, atol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_an_elementwise_chain_over_a_vector(library: Any) -> None:
    rng = np.random.default_rng(31)
    x, y = rng.standard_normal((2, 10007), dtype=np.float32)
    want = f64(x) * np.float32(1.5) + f64(y)
    np.testing.assert_allclose(f64(library.axpy(x, y, 1.5)), want, rtol=1e-6, atol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_an_elementwise_chain_with_an_operand_broadcast_along_the_columns(library: Any) -> None:
    rng = np.random.default_rng(32)
    x = rng.standard_normal((37, 45), dtype=np.float32)
    s = rng.standard_normal((37, 1), dtype=np.float32)
    want = 2.0 - f64(x) * f64(s)
    np.testing.assert_allclose(f64(library.row_scale(x, s)), want, rtol=1e-6, atol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_a_value_that_elementwise_ops_read_twice_is_computed_in_their_kernel(
    library: Any,
) -> None:
    rng = np.random.default_rng(33)
    x = rng.standard_normal((37, 45), dtype=np.float32)
    want = np.maximum(2 * f64(x), 0) + 2 * f64(x)
    np.testing.assert_allclose(f64(library.twice_used(x)), want, rtol=1e-6, atol=1e-6)
    a = rng.standard_normal((37, 150), dtype=np.float32)
    b = rng.standard_normal((150, 29), dtype=np.float32)
    y = f64(a) @ f64(b)
    want = y / (1 + np.exp(-y))
    np.testing.assert_allclose(f64(library.swish_product(a, b)), want, rtol=1e-4, atol=1e-4)
    bias = rng.standard_normal(45, dtype=np.float32)
    y = f64(x) + f64(bias)
    want = 0.5 * y * (1 + np.tanh(0.7978845608 * (y + 0.044715 * y**3)))
    out = f64(library.gelu_written_out(x, bias))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    v = rng.standard_normal(1000, dtype=np.float32)
    total = library.sum_of_squares(v)
    assert total.shape == ()
    np.testing.assert_allclose(float(total), (f64(v) ** 2).sum(), rtol=1e-5)
    want = ((f64(x) - 0.5) ** 2).sum(axis=-1)
    np.testing.assert_allclose(f64(library.row_energy(x)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_an_elementwise_kernel_hands_a_product_its_operand_through_memory(library: Any) -> None:
    rng = np.random.default_rng(34)
    x = rng.standard_normal((37, 45), dtype=np.float32)
    s = rng.standard_normal(45, dtype=np.float32)
    w = rng.standard_normal((45, 29), dtype=np.float32)
    want = f64(x * s) @ f64(w)  # the scaled operand in f32, as the kernel writes it
    np.testing.assert_allclose(f64(library.scaled_matmul(x, s, w)), want, rtol=1e-5, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_an_unnamed_intermediate_between_a_product_and_a_norm(library: Any) -> None:
    rng = np.random.default_rng(35)
    x = rng.standard_normal((37, 45), dtype=np.float32)
    w = rng.standard_normal((45, 29), dtype=np.float32)
    g = rng.standard_normal(29, dtype=np.float32)
    want = rmsnorm(2 * (f64(x) @ f64(w)), g, 1e-6)
    np.testing.assert_allclose(f64(library.matmul_norm(x, w, g)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_row_reductions(library: Any) -> None:
    rng = np.random.default_rng(36)
    x = rng.standard_normal((2, 21, 53), dtype=np.float32)
    np.testing.assert_allclose(f64(library.row_sums(x)), f64(x).sum(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(f64(library.row_maxes(x)), f64(x).max(-1))
    xb = rng.standard_normal((37, 45)).astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(f64(library.row_means(xb)), f64(xb).mean(-1), atol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_logsumexp_of_large_scores(library: Any) -> None:
    x = np.random.default_rng(37).standard_normal((37, 45), dtype=np.float32) * 30
    s = f64(x * np.float32(4.0))  # past exp's range in f32: the maximum goes first
    want = s.max(-1) + np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1))
    np.testing.assert_allclose(f64(library.log_partition(x, 4.0)), want, rtol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_a_reduction_that_keeps_its_axis_and_its_broadcast_back(library: Any) -> None:
    rng = np.random.default_rng(38)
    x = rng.standard_normal((37, 45), dtype=np.float32)
    np.testing.assert_array_equal(f64(library.row_max_kept(x)), f64(x).max(-1, keepdims=True))
    x3 = rng.standard_normal((2, 21, 53), dtype=np.float32)
    want = f64(x3) - f64(x3).mean(-1, keepdims=True)
    np.testing.assert_allclose(f64(library.centered(x3)), want, rtol=1e-5, atol=1e-6)
    # numbers after the kept axis are computed by the reduction's kernel
    w = rng.standard_normal(53, dtype=np.float32)
    want = f64(x3) / np.sqrt((f64(x3) ** 2).mean(-1, keepdims=True) + 1e-6) * f64(w)
    np.testing.assert_allclose(f64(library.rms_by_hand(x3, w)), want, rtol=1e-5, atol=1e-6)
    # a tensor after a kept axis is read by the next kernel
    b = rng.standard_normal((37, 1), dtype=np.float32)
    want = f64(x).sum(-1, keepdims=True) * 3 + f64(b)
    np.testing.assert_allclose(f64(library.kept_sums(x, b)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_a_linear_layer_reads_its_weight_as_it_lies(library: Any) -> None:
    rng = np.random.default_rng(39)
    x = rng.standard_normal((300, 70), dtype=np.float32)  # past a 256-row tile
    w = rng.standard_normal((270, 70), dtype=np.float32)
    b = rng.standard_normal(270, dtype=np.float32)
    want = np.maximum(f64(x) @ f64(w).T + f64(b), 0)
    np.testing.assert_allclose(f64(library.linear(x, w, b)), want, rtol=1e-5, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_low_precision_linear_layers(library: Any) -> None:
    rng = np.random.default_rng(40)
    x = rng.standard_normal((2, 75, 90)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((140, 90)).astype(ml_dtypes.bfloat16)
    want = f64(x) @ f64(w).T
    np.testing.assert_allclose(f64(library.linear_bf16(x, w)), want, rtol=1e-5, atol=1e-4)
    x8 = rng.standard_normal((150, 70)).astype(ml_dtypes.float8_e4m3fn)
    w8 = rng.standard_normal((136, 70)).astype(ml_dtypes.float8_e4m3fn)
    want = f64(x8) @ f64(w8).T
    np.testing.assert_allclose(f64(library.linear_fp8(x8, w8)), want, rtol=1e-5, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_attention_written_with_graph_ops(library: Any) -> None:
    rng = np.random.default_rng(41)
    q = rng.standard_normal((2, 3, 37, 40), dtype=np.float32)
    k, v = rng.standard_normal((2, 2, 3, 45, 40), dtype=np.float32)
    s = f64(q) @ np.swapaxes(f64(k), -1, -2) * 0.125
    np.testing.assert_allclose(f64(library.scores(q, k)), s, rtol=1e-5, atol=1e-5)
    want = softmax(s) @ f64(v)
    np.testing.assert_allclose(f64(library.graph_attention(q, k, v)), want, rtol=1e-5, atol=1e-5)
    qb, kb, vb = (x.astype(ml_dtypes.bfloat16) for x in (q, k, v))
    s = f64(qb) @ np.swapaxes(f64(kb), -1, -2) / 8.0
    want = f64(softmax(s).astype(ml_dtypes.bfloat16)) @ f64(vb)  # bf16 probabilities
    out = f64(library.graph_attention_bf16(qb, kb, vb))
    np.testing.assert_allclose(out, want, rtol=2e-2, atol=2e-2)
    # a scale given at run time is the kernel's parameter
    for scale in (0.3, 0.05):
        s = f64(qb) @ np.swapaxes(f64(kb), -1, -2) * scale
        want = f64(softmax(s).astype(ml_dtypes.bfloat16)) @ f64(vb)
        out = f64(library.param_scaled_attention(qb, kb, vb, scale))
        np.testing.assert_allclose(out, want, rtol=2e-2, atol=2e-2)
    q3, k3, v3 = q[0], k[0], v[0]
    s = f64(q3) @ np.swapaxes(f64(k3), -1, -2) * 0.3
    s[..., np.triu_indices(37, 1, 45)[0], np.triu_indices(37, 1, 45)[1]] = -np.inf
    want = softmax(s) @ f64(v3)
    out = f64(library.param_scaled_flash(q3, k3, v3, 0.3))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_a_tile_kernel_loads_rows_of_its_column_block(library: Any) -> None:
    rng = np.random.default_rng(42)
    a = rng.standard_normal((300, 70), dtype=np.float32)
    b = rng.standard_normal((270, 70), dtype=np.float32)
    want = f64(a) @ f64(b).T
    np.testing.assert_allclose(f64(library.tile_nt(a, b)), want, rtol=1e-5, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_transposes_that_no_product_reads_in_place(library: Any) -> None:
    rng = np.random.default_rng(43)
    x = rng.standard_normal((2, 130, 75), dtype=np.float32)  # past a 64 x 64 block
    y = rng.standard_normal((2, 75, 130), dtype=np.float32)
    want = np.swapaxes(f64(x), -1, -2) + f64(y)
    np.testing.assert_array_equal(f64(library.transposed_sum(x, y)), want.astype(np.float32))
    xb = rng.standard_normal((67, 150)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(f64(library.transposed_bf16(xb)), 2 * f64(xb).T)
    np.testing.assert_array_equal(library.tile_transpose(x[0]), x[0].T)


@pytest.mark.execute
@needs_gxx
def test_new_axes_on_values_in_memory_broadcast_where_they_are_read(library: Any) -> None:
    rng = np.random.default_rng(44)
    x = rng.standard_normal((2, 37, 45), dtype=np.float32)
    s, t = rng.standard_normal((2, 37), dtype=np.float32)
    c = rng.standard_normal(45, dtype=np.float32)
    want = f64(x) * f64(s)[:, None] - f64(c)[None, :]
    np.testing.assert_allclose(f64(library.row_scaled(x, s, c)), want, rtol=1e-6, atol=1e-6)
    norm = np.sqrt((f64(x[0]) ** 2).sum(-1))[:, None]
    np.testing.assert_allclose(f64(library.unit_rows(x[0])), f64(x[0]) / norm, rtol=1e-5)
    want = f64(s)[:, None] * f64(c)[None, :]
    np.testing.assert_allclose(f64(library.outer(s, c)), want, rtol=1e-6, atol=1e-7)
    w = rng.standard_normal((45, 29), dtype=np.float32)
    want = (f64(x[0]) @ f64(w)) * f64(s)[:, None]
    out = f64(library.scaled_rows_matmul(x[0], w, s))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
    # the sums come after the product: a kernel after both reads them
    want = (f64(x[0]) @ f64(w)) * f64(x[1]).sum(-1)[:, None]
    out = f64(library.product_by_later_sums(x[0], w, x[1]))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
    t = np.abs(t) + 0.5
    want = softmax(f64(x[0]) / f64(t)[:, None])
    np.testing.assert_allclose(f64(library.tempered_softmax(x[0], t)), want, atol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_reductions_over_the_rows(library: Any) -> None:
    rng = np.random.default_rng(45)
    x = rng.standard_normal((137, 75), dtype=np.float32)  # past 64 x 64 blocks
    np.testing.assert_allclose(f64(library.column_sums(x)), f64(x).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(f64(library.column_maxes(x)), 2 * f64(x).max(0))
    xb = rng.standard_normal((2, 37, 75)).astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(f64(library.column_means(xb)), f64(xb).mean(1), atol=1e-6)
    want = softmax(f64(x).T).T
    np.testing.assert_allclose(f64(library.column_softmax(x)), want, rtol=1e-5, atol=1e-7)


@pytest.mark.execute
@needs_gxx
def test_reductions_over_any_axis(library: Any) -> None:
    rng = np.random.default_rng(52)
    x = rng.standard_normal((5, 37, 75), dtype=np.float32)
    want = f64(x).sum(0)
    np.testing.assert_allclose(f64(library.outer_axis_sums(x)), want, rtol=1e-5, atol=1e-5)
    xb = rng.standard_normal((3, 37, 5, 19)).astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(f64(library.middle_axis_means(xb)), f64(xb).mean(1), atol=1e-6)
    want = f64(x[0]) - f64(x[0]).mean(0, keepdims=True)
    np.testing.assert_allclose(f64(library.centered_columns(x[0])), want, atol=1e-6)
    want = np.moveaxis(softmax(np.moveaxis(f64(x), 0, -1)), -1, 0)
    np.testing.assert_allclose(f64(library.outer_axis_softmax(x)), want, rtol=1e-5, atol=1e-7)


@pytest.mark.execute
@needs_gxx
def test_dropout_draws_one_mask_on_every_backend(library: Any) -> None:
    """Each backend draws the reference's mask, element by element, wherever the op is
    computed: alone, as a product's or a softmax's epilogue, before a transpose."""
    rng = np.random.default_rng(56)
    x = rng.standard_normal((2, 37, 75), dtype=np.float32)
    for p, seed in ((0.3, 12345), (0.3, 2**40 + 3), (0.75, -2), (0.0, 1)):
        np.testing.assert_array_equal(library.dropped(x, p, seed), dropout(x, p, seed))
    y = rng.standard_normal((37, 75), dtype=np.float32)
    want = f64(x[0]) + f64(dropout(y * 2, 0.25, 11))
    np.testing.assert_allclose(f64(library.dropped_residual(x[0], y)), want, rtol=1e-6, atol=1e-6)
    a = np.abs(x[0, :, :50])  # positive: relu keeps every value
    b = np.abs(rng.standard_normal((50, 60), dtype=np.float32))
    want = dropout((f64(a) @ f64(b)).astype(np.float32), 0.5, 99)
    got = library.dropped_product(a, b, 99)
    np.testing.assert_array_equal(got == 0, want == 0)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    want = dropout(softmax(f64(x[0])).astype(np.float32), 0.1, 4)
    got = library.dropped_softmax(x[0], 4)
    np.testing.assert_array_equal(got == 0, want == 0)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_array_equal(library.dropped_then_swapped(y), dropout(y, 0.2, 5).T)


@pytest.mark.execute
@needs_gxx
def test_absolute_values_and_elementwise_extremes(library: Any) -> None:
    rng = np.random.default_rng(54)
    x = rng.standard_normal((37, 75), dtype=np.float32) * 4
    np.testing.assert_array_equal(library.leaky(x), np.maximum(x, x * np.float32(0.1)))
    xb = x.astype(ml_dtypes.bfloat16)
    lo = rng.standard_normal(75, dtype=np.float32)
    want = np.minimum(np.maximum(f64(xb), f64(lo)), 6.0)
    np.testing.assert_array_equal(f64(library.clipped(xb, lo)), want)
    want = np.clip(f64(xb), 0.0, 6.0) + np.maximum(f64(xb), f64(lo))
    np.testing.assert_allclose(f64(library.relu6(xb, lo)), want, rtol=1e-6)
    np.testing.assert_array_equal(library.amax(x), np.abs(x).max(-1))
    for s in (0.25, 3.0):  # the scalar's maximum, computed by the kernel
        want = f64(x) * max(s, 1.0) + np.minimum(f64(x), 0.5)
        np.testing.assert_allclose(f64(library.floored(x, s)), want, rtol=1e-6, atol=1e-6)
    scale = 448.0 / np.maximum(np.abs(f64(x)).max(-1, keepdims=True), 1e-12)
    want = f64((f64(x) * scale).astype(np.float32).astype(ml_dtypes.float8_e4m3fn))
    # within one e4m3 step: the scale may be rounded once more in f32
    np.testing.assert_allclose(f64(library.scaled_fp8(x)), want, rtol=2**-3)
    np.testing.assert_array_equal(library.tile_clamp(x), np.abs(np.minimum(x, 2)))


@pytest.mark.execute
@needs_gxx
def test_where_picks_by_a_comparison(library: Any) -> None:
    rng = np.random.default_rng(57)
    x = rng.standard_normal((37, 75), dtype=np.float32) * 4
    x[3, :3] = (np.nan, np.inf, -np.inf)  # NaN > 0 is false: 0.01 * NaN
    want = np.where(f64(x) > 0, f64(x), 0.01 * f64(x))
    np.testing.assert_allclose(f64(library.leaky_where(x)), want, rtol=1e-6)
    s = rng.standard_normal((3, 37, 75), dtype=np.float32)
    m = np.where(rng.random((37, 75)) < 0.4, 0.0, 1.0).astype(np.float32)
    m[:, 0] = 1.0  # no row masked whole
    want = softmax(np.where(m == 0, -np.inf, f64(s)))
    np.testing.assert_allclose(f64(library.masked_scores(s, m)), want, rtol=1e-5, atol=1e-7)
    for t in (-0.5, 1.25):
        want = (f64(x) >= t).sum(-1)
        np.testing.assert_array_equal(f64(library.count_at_least(x, t)), want)
    xb = rng.standard_normal((37, 75), dtype=np.float32).astype(ml_dtypes.bfloat16)
    b = rng.random(75, dtype=np.float32)  # a mask of [C] read by a kernel over [R, C]
    want = np.where(f64(b) < 0.5, f64(xb) * 2, f64(b))
    np.testing.assert_array_equal(f64(library.column_gate(xb, b)), want)
    a = rng.standard_normal((37, 70), dtype=np.float32)
    w = rng.standard_normal((70, 45), dtype=np.float32)
    want = np.maximum(f64(a) @ f64(w), 0.0)
    np.testing.assert_allclose(f64(library.product_relu(a, w)), want, rtol=1e-4, atol=1e-4)
    y = x.copy()
    y[::3] = rng.standard_normal((13, 75), dtype=np.float32)
    want = np.where(x != y, f64(y) - f64(x), -1.0)
    np.testing.assert_allclose(f64(library.tile_where(x, y)), want, rtol=1e-6)


def test_masks_join_with_and_or_not(library: Any) -> None:
    """``and``, ``or`` and ``not`` of masks, elementwise, also of a mask held as floats
    between kernels (``b < 0.5`` over [C], read by a kernel over [R, C]) and in a tile
    kernel; ``or`` binds looser than ``and``, and ``not`` than a comparison."""
    rng = np.random.default_rng(58)
    x = rng.standard_normal((37, 75), dtype=np.float32) * 2
    for lo in (-0.5, 0.25):
        hold = (f64(x) > lo) & (f64(x) < 1.0) | ~(f64(x) > -2.0)
        want = np.where(hold, f64(x), 0.0)
        np.testing.assert_array_equal(f64(library.band_or_far(x, lo)), want)
    xb = rng.standard_normal((37, 75), dtype=np.float32).astype(ml_dtypes.bfloat16)
    b = rng.random(75, dtype=np.float32)
    want = np.where((f64(b) < 0.5) & (f64(xb) > 0), f64(xb), f64(b))
    np.testing.assert_array_equal(f64(library.gate_and_sign(xb, b)), want)
    y = rng.standard_normal((37, 75), dtype=np.float32)
    want = np.where((f64(x) > 0) & ~(f64(y) > f64(x)), f64(x), f64(y))
    np.testing.assert_array_equal(f64(library.tile_and_not(x, y)), want)


@pytest.mark.execute
@needs_gxx
def test_slices_of_the_last_axis_are_read_where_they_lie(library: Any) -> None:
    rng = np.random.default_rng(58)
    h = rng.standard_normal((37, 150), dtype=np.float32)
    a, b = f64(h[:, :75]), f64(h[:, 75:])
    want = a / (1 + np.exp(-a)) * b
    np.testing.assert_allclose(f64(library.swiglu_halves(h)), want, rtol=1e-5, atol=1e-6)
    want = want + f64(h[:, 3:4])  # C // 2 and "C/2" bound slices as C/2 does; 7 // 2 is 3
    got = f64(library.halves_as_numpy_writes_them(h))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    want = f64(h) + f64(h[1:2, :]) * f64(h[:, 3:4])  # one row, one column, broadcast
    np.testing.assert_allclose(f64(library.slices_broadcast(h)), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"C = 149 breaks C % 2 == 0 \(the slice 0:C/2"):
        library.halves_as_numpy_writes_them(h[:, :149].copy())
    x = rng.standard_normal((37, 70), dtype=np.float32).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((70, 90), dtype=np.float32).astype(ml_dtypes.bfloat16)
    p = f64(x) @ f64(w)
    want = p[:, :45] / (1 + np.exp(-p[:, :45])) * p[:, 45:]
    np.testing.assert_allclose(f64(library.fused_gate_up(x, w)), want, rtol=1e-4, atol=1e-4)
    x = rng.standard_normal((37, 70), dtype=np.float32)
    w = rng.standard_normal((45, 70), dtype=np.float32)
    want = f64(x)[:, 8:] @ f64(w)[:, 8:].T
    np.testing.assert_allclose(f64(library.sliced_operands(x, w)), want, rtol=1e-4, atol=1e-4)
    x = rng.standard_normal((2, 37, 75), dtype=np.float32)
    want = softmax(f64(x)[:, :, 8:])
    np.testing.assert_allclose(f64(library.sliced_softmax(x)), want, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(library.last_columns(x), x[..., -24:])
    with pytest.raises(ValueError, match=r"C = 20 breaks C >= 24 \(the slice C - 24:C"):
        library.last_columns(x[..., :20].copy())


@pytest.mark.execute
@needs_gxx
def test_slices_of_leading_axes_are_read_where_they_lie(library: Any) -> None:
    rng = np.random.default_rng(59)
    k = rng.standard_normal((2, 90, 40), dtype=np.float32)
    y = rng.standard_normal((2, 37, 40), dtype=np.float32)
    np.testing.assert_array_equal(library.cached_rows(k, y), k[:, :37] * np.float32(2) + y)
    with pytest.raises(ValueError, match=r"T = 37 breaks T <= S"):
        library.cached_rows(k[:, :30].copy(), y)
    q = rng.standard_normal((2, 37, 64), dtype=np.float32)
    k, v = rng.standard_normal((2, 2, 90, 64), dtype=np.float32)
    scores = f64(q) @ f64(k)[:, :37].transpose(0, 2, 1) / 8.0
    scores = np.where(np.tril(np.ones((37, 37), bool)), scores, -np.inf)
    want = softmax(scores) @ f64(v)[:, :37]
    got = f64(library.cache_prefix_attention(q, k, v))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    x = rng.standard_normal((41, 70), dtype=np.float32)
    w = rng.standard_normal((70, 50), dtype=np.float32)
    want = f64(x)[2:-2, 5:] @ f64(w)[5:, 1:-2]
    np.testing.assert_allclose(f64(library.inner_block_product(x, w)), want, rtol=1e-4, atol=1e-4)
    x = rng.standard_normal((3, 29, 75), dtype=np.float32)
    want = softmax(f64(x)[:, 1:])
    np.testing.assert_allclose(f64(library.later_rows_softmax(x)), want, rtol=1e-5, atol=1e-7)


@pytest.mark.execute
@needs_gxx
def test_an_integer_index_takes_one_element_without_its_axis(library: Any) -> None:
    rng = np.random.default_rng(61)
    h = rng.standard_normal((3, 29, 40), dtype=np.float32)
    w = rng.standard_normal((40, 50), dtype=np.float32)
    want = f64(h)[:, -1] @ f64(w)
    np.testing.assert_allclose(f64(library.last_token_logits(h, w)), want, rtol=1e-4, atol=1e-4)
    x = rng.standard_normal((2, 3, 29, 40), dtype=np.float32).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(f64(library.second_head(x)), f64(x)[:, 1] * 2)
    with pytest.raises(ValueError, match=r"H = 1 breaks H >= 2 \(the index 1 of a dim of H"):
        library.second_head(x[:, :1].copy())
    y = rng.standard_normal((29, 40), dtype=np.float32)
    np.testing.assert_array_equal(library.columns_on_a_new_axis(y), y[..., None, :4] * 2)


@pytest.mark.execute
@needs_gxx
def test_int_parameters_divide_as_floats(library: Any) -> None:
    x = np.random.default_rng(60).standard_normal((37, 75), dtype=np.float32)
    for n, m in ((3, 2), (7, -4)):  # C would give 1 and -1 for n / m
        want = f64(x) * (n / m) + n
        np.testing.assert_allclose(f64(library.int_ratio(x, n, m)), want, rtol=1e-6, atol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_minima_are_negated_maxima(library: Any) -> None:
    rng = np.random.default_rng(55)
    x = rng.standard_normal((3, 37, 75), dtype=np.float32)
    np.testing.assert_array_equal(library.column_mins(x), 2 * x.min(1))
    xb = x[0].astype(ml_dtypes.bfloat16)
    want = (f64(xb).max(-1) - f64(xb).min(-1)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(f64(library.row_range(xb)), f64(want))
    want = x[0] - x[0].min(1, keepdims=True)
    np.testing.assert_array_equal(library.tile_row_min(x[0]), want)


@pytest.mark.execute
@needs_gxx
def test_any_permutation(library: Any) -> None:
    rng = np.random.default_rng(53)
    x = rng.standard_normal((5, 37, 75), dtype=np.float32)
    np.testing.assert_array_equal(library.rotated(x), x.transpose(2, 0, 1))
    x4 = rng.standard_normal((3, 37, 5, 19), dtype=np.float32)
    np.testing.assert_array_equal(library.scrambled(x4), x4.transpose(2, 0, 3, 1) + 1)
    np.testing.assert_array_equal(library.pairs_swapped(x4), x4.transpose(1, 0, 3, 2))
    # a view of a tensor that its kernel also reads otherwise is copied first
    np.testing.assert_array_equal(library.permuted_twice(x), x.transpose(1, 0, 2) * 3)
    y = rng.standard_normal((37, 37, 75), dtype=np.float32)
    np.testing.assert_array_equal(library.permuted_beside(y), y.transpose(1, 0, 2) + y)
    flat = rng.standard_normal(37 * 75, dtype=np.float32)
    want = x[0].reshape(-1) + x[0].reshape(-1) * flat
    np.testing.assert_allclose(library.flattened_beside(x[0], flat), want, rtol=1e-6, atol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_scalars_computed_from_sizes(library: Any) -> None:
    rng = np.random.default_rng(46)
    a = rng.standard_normal((37, 150), dtype=np.float32)
    b = rng.standard_normal((150, 29), dtype=np.float32)
    want = f64(a) @ f64(b) / np.sqrt(150)
    out = f64(library.size_scaled_matmul(a, b))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    x = rng.standard_normal((37, 45), dtype=np.float32) * 8
    want = softmax(f64(x) / np.sqrt(45))
    np.testing.assert_allclose(f64(library.size_scaled_softmax(x)), want, atol=1e-6)
    y = rng.standard_normal((37, 45), dtype=np.float32) * 0.05
    t = 0.03 * 37  # read by two kernels, each computing it
    want = softmax(f64(x)) * t + np.exp(f64(y) * t)
    out = f64(library.shared_scalar(y, x, 0.03))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    q = rng.standard_normal((2, 37, 24), dtype=np.float32)
    k, v = rng.standard_normal((2, 2, 45, 24), dtype=np.float32)
    want = softmax(f64(q) @ np.swapaxes(f64(k), -1, -2) / np.sqrt(24)) @ f64(v)
    out = f64(library.size_scaled_attention(q, k, v))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    want = ((f64(x) - f64(y)) ** 2).mean(axis=-1)  # the size read by its name, C
    np.testing.assert_allclose(f64(library.mean_squares(x, y)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_reshapes_read_the_tensor_with_the_new_dims(library: Any) -> None:
    rng = np.random.default_rng(47)
    x = rng.standard_normal((37, 48), dtype=np.float32)
    np.testing.assert_array_equal(library.split_heads(x), x.reshape(37, 3, 16))
    want = softmax(f64(x).reshape(37, 12, 4))
    np.testing.assert_allclose(f64(library.grouped_softmax(x)), want, atol=1e-6)
    x3 = rng.standard_normal((2, 37, 48), dtype=np.float32)
    np.testing.assert_array_equal(library.merged_rows(x3), x3.reshape(74, 48) * 2)
    w = rng.standard_normal((48, 29), dtype=np.float32)
    want = f64(x3).reshape(74, 48) @ f64(w)
    np.testing.assert_allclose(f64(library.merged_matmul(x3, w)), want, rtol=1e-5, atol=1e-5)
    want = want * f64(x3).reshape(74, 48).sum(-1)[:, None]  # read twice: copied once
    np.testing.assert_allclose(f64(library.reshaped_twice(x3, w)), want, rtol=1e-5, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_transposes_that_keep_the_last_axis_read_rows_where_they_lie(library: Any) -> None:
    rng = np.random.default_rng(48)
    x = rng.standard_normal((37, 48), dtype=np.float32)
    w = rng.standard_normal((48, 48), dtype=np.float32)
    want = (f64(x) @ f64(w)).reshape(37, 4, 12).transpose(1, 0, 2)
    np.testing.assert_allclose(f64(library.split_heads_t(x, w)), want, rtol=1e-5, atol=1e-5)
    xb = rng.standard_normal((2, 37, 3, 24)).astype(ml_dtypes.bfloat16)
    y = rng.standard_normal((2, 3, 37, 24), dtype=np.float32)
    want = f64(xb).transpose(0, 2, 1, 3) * 2 + f64(y)
    np.testing.assert_allclose(f64(library.heads_first(xb, y)), want, rtol=1e-6, atol=1e-6)
    x4 = rng.standard_normal((2, 3, 37, 24), dtype=np.float32)
    np.testing.assert_array_equal(library.rows_last(x4), np.maximum(x4.transpose(2, 0, 1, 3), 0))


@pytest.mark.execute
@needs_gxx
def test_multi_head_attention_from_one_activation(library: Any) -> None:
    """The heads are split with a reshape and a transpose, attended with graph ops, and
    merged back: projections, one flash_attention that reads and writes the heads where
    they lie, the output product. The head dim, ``C/4`` = 12, is known at run time only
    and gets a head-dim tile of 128, whose columns past 12 are the next heads': the
    kernel masks them."""
    rng = np.random.default_rng(49)
    x = rng.standard_normal((37, 48), dtype=np.float32)
    wq, wk, wv, wo = rng.standard_normal((4, 48, 48), dtype=np.float32) * 0.2

    def heads(t: np.ndarray) -> np.ndarray:
        return t.reshape(37, 4, 12).transpose(1, 0, 2)

    q, k, v = (heads(f64(x) @ f64(w)) for w in (wq, wk, wv))
    o = softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(12)) @ v
    want = o.transpose(1, 0, 2).reshape(37, 48) @ f64(wo) + f64(x)
    out = f64(library.multi_head(x, wq, wk, wv, wo))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_attention_reads_and_writes_heads_where_they_lie(library: Any) -> None:
    """q, k and v are heads of ``[B, S, H, 64]`` tensors, and the result, scaled by an
    epilogue, goes back to that layout: the attention kernel loads and stores the heads'
    rows in place."""
    rng = np.random.default_rng(56)
    x, y = rng.standard_normal((2, 2, 37, 3, 64)).astype(ml_dtypes.bfloat16)
    q, kv = (f64(t).transpose(0, 2, 1, 3) for t in (x, y))
    s = q @ np.swapaxes(kv, -1, -2) / 8
    s[..., np.triu_indices(37, 1)[0], np.triu_indices(37, 1)[1]] = -np.inf
    # the kernel rounds the probabilities to bf16 for the product, and its result
    want = (softmax(s) @ kv).transpose(0, 2, 1, 3) * 0.5
    out = f64(library.heads_attention(x, y))
    np.testing.assert_allclose(out, want, rtol=2e-2, atol=2e-2)


@pytest.mark.execute
@needs_gxx
def test_products_with_a_vector(library: Any) -> None:
    """A vector operand of ``@`` is one column or one row, as in numpy: a matrix times a
    vector is the row sums of the products (in f32 for bf16 operands), a vector times a
    matrix the product of one row. Each was an error ("needs matrices")."""
    rng = np.random.default_rng(62)
    a, x = rng.standard_normal((37, 301), dtype=np.float32), rng.standard_normal(301)
    x = x.astype(np.float32)
    np.testing.assert_allclose(f64(library.matrix_vector(a, x)), f64(a) @ f64(x), rtol=1e-4,
                               atol=1e-4)  # fmt: skip
    a = rng.standard_normal((2, 37, 301)).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal(301).astype(ml_dtypes.bfloat16)
    out = f64(library.matrix_vector_bf16(a, x))
    np.testing.assert_allclose(out, f64(a) @ f64(x), rtol=1e-4, atol=1e-4)
    x = rng.standard_normal(301).astype(np.float32)
    w = rng.standard_normal((301, 45)).astype(np.float32)
    out = f64(library.vector_matrix(x, w))
    np.testing.assert_allclose(out, f64(x) @ f64(w) + 1, rtol=1e-4, atol=1e-4)
    x, y = (rng.standard_normal(1001).astype(ml_dtypes.bfloat16) for _ in range(2))
    np.testing.assert_allclose(f64(library.vector_vector(x, y)), f64(x) @ f64(y), rtol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_a_reshape_infers_the_dim_given_as_minus_one(library: Any) -> None:
    """``reshape(-1, "C")`` as in numpy: the rest of the elements, a guard where it must
    divide at run time (``C/4`` here). -1 was an error."""
    rng = np.random.default_rng(63)
    x = rng.standard_normal((2, 37, 44), dtype=np.float32)
    w = rng.standard_normal((44, 29), dtype=np.float32)
    y = softmax(f64(x).reshape(2, 37, 11, 4)).reshape(-1, 44)
    out = f64(library.rest_inferred(x, w))
    np.testing.assert_allclose(out, (y @ f64(w)).reshape(-1), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="reshape: C/4 is a whole dim"):
        x, w = (rng.standard_normal(shape, dtype=np.float32) for shape in ((2, 37, 45), (45, 29)))
        library.rest_inferred(x, w)


@pytest.mark.execute
@needs_gxx
def test_products_read_heads_where_they_lie(library: Any) -> None:
    """A product's operand split into heads (``[B, S, H*D]`` as ``[B, H, S, D]``, or by
    ``split_qkv``) is read from the tensor it permutes, each head's rows at column
    ``D*h``: no kernel copies the heads out first. Heads of 40 and of 11 end inside a
    tile, which is masked there."""
    rng = np.random.default_rng(64)
    x, y = (rng.standard_normal((2, 37, 128)).astype(ml_dtypes.bfloat16) for _ in range(2))
    q, k = (f64(t).reshape(2, 37, 2, 64).transpose(0, 2, 1, 3) for t in (x, y))
    out = f64(library.heads_scores(x, y))
    np.testing.assert_allclose(out, q @ np.swapaxes(k, -1, -2), rtol=1e-4, atol=1e-3)
    p = rng.standard_normal((2, 2, 37, 37), dtype=np.float32)
    y = rng.standard_normal((2, 37, 80), dtype=np.float32)
    want = f64(p) @ f64(y).reshape(2, 37, 2, 40).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(f64(library.heads_values(p, y)), want, rtol=1e-4, atol=1e-4)
    # split_qkv's q @ k.T: test_split_qkv_read_by_other_ops


@pytest.mark.execute
@needs_gxx
def test_a_batch_dim_of_one_is_broadcast(library: Any) -> None:
    """``[B, M, K] @ [1, K, N]``: every program reads the one matrix of ``w``. Its index
    was the program's, so programs past the first read past the tensor."""
    rng = np.random.default_rng(65)
    a = rng.standard_normal((3, 37, 20), dtype=np.float32)
    w = rng.standard_normal((1, 20, 29), dtype=np.float32)
    np.testing.assert_allclose(f64(library.broadcast_batch(a, w)), f64(a) @ f64(w), rtol=1e-4,
                               atol=1e-4)  # fmt: skip


@pytest.mark.execute
@needs_gxx
def test_a_function_calls_the_files_other_functions(library: Any) -> None:
    """A graph function calls another as model code calls a helper: the callee's body
    runs on the caller's values, its sizes are the caller's dims (``E`` is ``C``, ``N``
    is ``B*S``), a default fills a parameter left out, and its ops fuse with the
    caller's. A call was an error ("unknown name"). The callee's ``E/4`` is guarded in
    the caller: ``C`` must be a multiple of 4."""
    rng = np.random.default_rng(66)

    def norm(x: np.ndarray, eps: float) -> np.ndarray:
        g = x.reshape(x.shape[0], -1, 4)
        return (g / np.sqrt((g * g).mean(-1, keepdims=True) + eps)).reshape(x.shape)

    def silu(z: np.ndarray) -> np.ndarray:
        return z / (1 + np.exp(-z))

    x = rng.standard_normal((2, 37, 44), dtype=np.float32)
    wg, wu = (rng.standard_normal((44, 70), dtype=np.float32) / 7 for _ in range(2))
    wd = rng.standard_normal((70, 44), dtype=np.float32) / 8
    h = norm(f64(x).reshape(-1, 44), 1e-5)
    y = (silu(h @ f64(wg)) * (h @ f64(wu))) @ f64(wd)
    want = f64(x) + norm(y, 1e-3).reshape(x.shape)
    out = f64(library.calls_helpers(x, wg, wu, wd))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(f64(library.grouped_norm(x[0])), norm(f64(x[0]), 1e-5),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    with pytest.raises(ValueError, match="reshape: C/4 is a whole dim"):
        narrow = (np.ascontiguousarray(a) for a in (x[..., :42], wg[:42], wu[:42], wd[:, :42]))
        library.calls_helpers(*narrow)


@pytest.mark.execute
@needs_gxx
def test_attention_with_fewer_key_and_value_heads(library: Any) -> None:
    """Grouped-query attention (Llama's, Mistral's): each k and v head serves a group of
    q heads, head ``h`` the group ``h // (H/G)``; multi-query attention, one k and v head
    for all. Both were errors ("batch dims differ")."""
    rng = np.random.default_rng(67)
    q = rng.standard_normal((2, 4, 37, 64)).astype(ml_dtypes.bfloat16)
    k, v = (rng.standard_normal((2, 2, 37, 64)).astype(ml_dtypes.bfloat16) for _ in range(2))
    kr, vr = (np.repeat(f64(t), 2, axis=1) for t in (k, v))
    s = f64(q) @ np.swapaxes(kr, -1, -2) / 8
    s[..., np.triu_indices(37, 1)[0], np.triu_indices(37, 1)[1]] = -np.inf
    out = f64(library.grouped_attention(q, k, v))
    np.testing.assert_allclose(out, softmax(s) @ vr, rtol=2e-2, atol=2e-2)
    q = rng.standard_normal((2, 3, 45, 64), dtype=np.float32)
    k, v = (rng.standard_normal((2, 1, 45, 64), dtype=np.float32) for _ in range(2))
    want = softmax(f64(q) @ np.swapaxes(f64(k), -1, -2) / 8) @ f64(v)
    np.testing.assert_allclose(f64(library.multi_query(q, k, v)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_a_llama_block_with_grouped_query_attention(library: Any) -> None:
    """Llama's block: RMSNorms, rotary q and k, two k and v heads for four q heads, the
    heads merged back, a SwiGLU MLP. The attention kernel reads v where the projection
    wrote it and stores its result where the merge puts it."""
    rng = np.random.default_rng(68)
    b, s, c = 2, 37, 256

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    x = rng.standard_normal((b, s, c), dtype=np.float32)
    wn1, wn2 = ((1 + 0.1 * rng.standard_normal(c)).astype(np.float32) for _ in range(2))
    wq, wk, wv, wo = weight(c, c), weight(c, 128), weight(c, 128), weight(c, c)
    wg, wu, wd = weight(c, 512), weight(c, 512), weight(512, c)
    angle = np.arange(s)[:, None] * 10000.0 ** (-np.arange(32) / 32)
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)

    def heads(t: np.ndarray, n: int) -> np.ndarray:
        return t.reshape(b, s, n, 64).transpose(0, 2, 1, 3)

    h = rmsnorm(f64(x), f64(wn1), 1e-5)
    q = rotary(heads(h @ f64(wq), 4), f64(cos), f64(sin))
    k = np.repeat(rotary(heads(h @ f64(wk), 2), f64(cos), f64(sin)), 2, axis=1)
    v = np.repeat(heads(h @ f64(wv), 2), 2, axis=1)
    scores = q @ np.swapaxes(k, -1, -2) / 8
    scores[..., np.triu_indices(s, 1)[0], np.triu_indices(s, 1)[1]] = -np.inf
    x1 = f64(x) + (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(b, s, c) @ f64(wo)
    h = rmsnorm(x1, f64(wn2), 1e-5)
    want = x1 + (h @ f64(wg) / (1 + np.exp(-(h @ f64(wg)))) * (h @ f64(wu))) @ f64(wd)
    out = library.llama_block(x, wn1, wq, wk, wv, wo, cos, sin, wn2, wg, wu, wd)
    np.testing.assert_allclose(f64(out), want, rtol=1e-4, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_reductions_over_several_adjacent_axes(library: Any) -> None:
    """``axis=(1, 2)`` reduces both axes, as in numpy: a row kernel over them merged (a
    view), or over their transpose when they are not last; ``keepdims`` keeps a 1 for
    each. A bf16 sum adds f32 terms (it was an error: the row kernel summed in bf16)."""
    rng = np.random.default_rng(69)
    x = rng.standard_normal((2, 5, 7, 33), dtype=np.float32)
    np.testing.assert_allclose(f64(library.spatial_mean(x)), f64(x).mean(axis=(1, 2)),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    y = rng.standard_normal((2, 37, 45), dtype=np.float32)
    out = f64(library.tail_max(y))
    np.testing.assert_array_equal(out, f64(y).max(axis=(1, 2), keepdims=True))
    z = rng.standard_normal((2, 37, 45)).astype(ml_dtypes.bfloat16)
    want = f64(z).sum(axis=(1, 2)) - f64(z).min(axis=(1, 2))
    np.testing.assert_allclose(f64(library.tail_range_bf16(z)), want, rtol=1e-5, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_tile_concat_of_rows_whose_widths_are_sums(library: Any) -> None:
    """Whole rows of widths ``C`` and ``D`` joined into rows of ``C+D``. The C++ indexed
    the joined tile with ``i * C + D`` for ``i * (C + D)``: most of the result was
    wrong on the CPU, every other backend right."""
    rng = np.random.default_rng(71)
    a = rng.standard_normal((37, 19), dtype=np.float32)
    b = rng.standard_normal((37, 45), dtype=np.float32)
    np.testing.assert_array_equal(library.tile_cat(a, b), np.concatenate([a, b], axis=1))
    y = rng.standard_normal((37, 21), dtype=np.float32)
    np.testing.assert_array_equal(library.tile_cat_wider(a, y), np.concatenate([a, 2 * y], 1))


@pytest.mark.execute
@needs_gxx
def test_reductions_over_axes_apart(library: Any) -> None:
    """``axis=(0, 2)`` reduces both, as in numpy, whatever their order: one run of
    adjacent axes at a time, the last first (it was an error that said to transpose
    them). Of ``[A, B, C, D]`` neither run is last, so both are column reductions."""
    rng = np.random.default_rng(70)
    x = rng.standard_normal((3, 5, 37), dtype=np.float32)
    np.testing.assert_allclose(f64(library.apart_sum(x)), f64(x).sum(axis=(0, 2)),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    y = rng.standard_normal((3, 5, 7, 33), dtype=np.float32)
    out = f64(library.apart_max_keep(y))
    np.testing.assert_array_equal(out, f64(y).max(axis=(0, 2), keepdims=True))
    np.testing.assert_allclose(f64(library.apart_mean(y)), f64(y).mean(axis=(0, 2)),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    z = rng.standard_normal((3, 5, 37)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(f64(library.apart_min_bf16(z)), f64(z).min(axis=(0, 2)))


@pytest.mark.execute
@needs_gxx
def test_a_result_named_in_the_source(library: Any) -> None:
    """``y = ...; return y``: the kernel writes the entry's result, whatever the source
    calls it. The entry point passed a ``y`` it did not declare, and did not compile."""
    x = np.random.default_rng(61).standard_normal((37, 45), dtype=np.float32)
    np.testing.assert_allclose(f64(library.named_result(x)), 2 * f64(x) + 1, rtol=1e-6)


def _split(qkv: np.ndarray, heads: int) -> list[np.ndarray]:
    """``split_qkv`` by its definition: thirds of the last axis, each ``[..., S, heads,
    D]`` with the heads moved in front."""
    c = qkv.shape[-1] // 3
    shape = (*qkv.shape[:-1], heads, c // heads)
    return [np.moveaxis(qkv[..., i * c : (i + 1) * c].reshape(shape), -2, -3)
            for i in range(3)]  # fmt: skip


@pytest.mark.execute
@needs_gxx
def test_attention_reads_split_qkv_where_it_lies(library: Any) -> None:
    """``split_qkv``'s q, k and v are the projection's columns ``[0, C)``, ``[C, 2C)`` and
    ``[2C, 3C)``, each ``[S, H, D]`` with its heads moved in front, as GPT-2's code splits
    them; the attention kernel reads them from the projection."""
    rng = np.random.default_rng(58)
    x = rng.standard_normal((45, 128), dtype=np.float32)
    w = (rng.standard_normal((128, 384)) / np.sqrt(128)).astype(np.float32)
    q, k, v = _split(f64(x) @ f64(w), 2)
    s = q @ np.swapaxes(k, -1, -2) / 8
    s[..., np.triu_indices(45, 1)[0], np.triu_indices(45, 1)[1]] = -np.inf
    want = (softmax(s) @ v).transpose(1, 0, 2).reshape(45, 128)
    out = f64(library.fused_qkv_attention(x, w))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    qkv = rng.standard_normal((2, 37, 384)).astype(ml_dtypes.bfloat16)
    q, k, v = _split(f64(qkv), 4)
    want = softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(32)) @ v
    out = f64(library.split_attention_bf16(qkv))
    np.testing.assert_allclose(out, want, rtol=2e-2, atol=2e-2)
    # a head dim known at run time only (C/9), 40 here, under a head-dim tile of 128
    qkv = rng.standard_normal((2, 37, 360)).astype(ml_dtypes.bfloat16)
    q, k, v = _split(f64(qkv), 3)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(40)
    s[..., np.triu_indices(37, 1)[0], np.triu_indices(37, 1)[1]] = -np.inf
    want = (softmax(s) @ v).transpose(0, 2, 1, 3).reshape(2, 37, 120)
    out = f64(library.split_attention(qkv))
    np.testing.assert_allclose(out, want, rtol=2e-2, atol=2e-2)


@pytest.mark.execute
@needs_gxx
def test_split_qkv_read_by_other_ops(library: Any) -> None:
    """``split_qkv``'s results are views of the projection for any reader: an elementwise
    op or a rotary embedding loads its rows where they lie (GPT-NeoX rotates q and k
    after splitting them), and so does a product; a result returned is copied out. Each
    of these was an error."""
    rng = np.random.default_rng(60)
    qkv = rng.standard_normal((45, 384), dtype=np.float32)
    q, k, v = _split(f64(qkv), 2)
    want = softmax(q * 0.5 @ np.swapaxes(k, -1, -2) / 8) @ v
    out = f64(library.split_scaled_attention(qkv))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    # bf16 heads of 20: copied exactly, the copy's rows masked at each head's end
    qkv = rng.standard_normal((2, 37, 240)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(f64(library.split_keys(qkv)), _split(f64(qkv), 4)[1])
    # rotary q and k, causal, the heads merged back
    qkv = rng.standard_normal((2, 37, 192), dtype=np.float32)
    angle = np.arange(37)[:, None] * 10000.0 ** (-np.arange(16) / 16)
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    q, k, v = _split(f64(qkv), 2)

    def rotate(x: np.ndarray) -> np.ndarray:
        x1, x2 = x[..., :16], x[..., 16:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    s = rotate(q) @ np.swapaxes(rotate(k), -1, -2) / np.sqrt(32)
    s[..., np.triu_indices(37, 1)[0], np.triu_indices(37, 1)[1]] = -np.inf
    want = (softmax(s) @ v).transpose(0, 2, 1, 3).reshape(2, 37, 64)
    out = f64(library.split_rotary_attention(qkv, cos, sin))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    # a width known at run time only: heads of 11
    qkv = rng.standard_normal((29, 99), dtype=np.float32)
    q, k, _ = _split(f64(qkv), 3)
    out = f64(library.split_scores(qkv))
    np.testing.assert_allclose(out, q @ np.swapaxes(k, -1, -2), rtol=1e-4, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_a_gpt2_block_written_as_model_code(library: Any) -> None:
    """GPT-2's block: layernorms, products with their biases, ``split_qkv`` read by a
    causal attention, the heads merged back, a GELU MLP and two residuals."""
    rng = np.random.default_rng(59)
    b, s, c = 2, 37, 128

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    def vector(n: int, around: float = 0.0) -> np.ndarray:
        return (around + 0.1 * rng.standard_normal(n)).astype(np.float32)

    x = rng.standard_normal((b, s, c), dtype=np.float32)
    ln1_w, ln1_b, ln2_w, ln2_b = vector(c, 1.0), vector(c), vector(c, 1.0), vector(c)
    w_qkv, b_qkv, w_o, b_o = weight(c, 3 * c), vector(3 * c), weight(c, c), vector(c)
    w_fc, b_fc, w_proj, b_proj = weight(c, 4 * c), vector(4 * c), weight(4 * c, c), vector(c)

    qkv = layernorm(x, ln1_w, ln1_b, 1e-5) @ f64(w_qkv) + f64(b_qkv)
    q, k, v = (qkv[..., i * c : (i + 1) * c].reshape(b, s, 2, 64).transpose(0, 2, 1, 3)
               for i in range(3))  # fmt: skip
    scores = q @ np.swapaxes(k, -1, -2) / 8
    scores[..., np.triu_indices(s, 1)[0], np.triu_indices(s, 1)[1]] = -np.inf
    a = (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(b, s, c)
    x1 = f64(x) + a @ f64(w_o) + f64(b_o)
    h = layernorm(x1, ln2_w, ln2_b, 1e-5)
    want = x1 + gelu(h @ f64(w_fc) + f64(b_fc)) @ f64(w_proj) + f64(b_proj)
    weights = (ln1_w, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_w, ln2_b, w_fc, b_fc, w_proj, b_proj)
    out = library.gpt2_block(x, *weights)
    np.testing.assert_allclose(f64(out), want, rtol=1e-4, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_row_kernels_over_a_vector(library: Any) -> None:
    rng = np.random.default_rng(50)
    x, w = rng.standard_normal((2, 1000), dtype=np.float32)
    want = softmax(f64(x) * 2)
    np.testing.assert_allclose(f64(library.vector_softmax(x)), want, rtol=1e-5, atol=1e-7)
    top = library.vector_max(x)
    assert top.shape == ()
    assert float(top) == f64(x).max()
    want = rmsnorm(x[None], w, 1e-6)[0] + 1
    np.testing.assert_allclose(f64(library.vector_norm(x, w)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_a_decoder_block_written_as_model_code(library: Any) -> None:
    """``examples/decoder_block.tsr``: its residual ``x = x + ...`` rebinds a parameter's
    name to a buffer that a later kernel reads (that buffer and the parameter had one
    name in the generated code, which did not compile)."""
    rng = np.random.default_rng(55)
    s, c, f = 19, 128, 96

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    x = rng.standard_normal((s, c), dtype=np.float32)
    norm1, norm2 = (1 + 0.1 * rng.standard_normal((2, c))).astype(np.float32)
    wq, wk, wv, wo = (weight(c, c) for _ in range(4))
    w1, w3, w2 = weight(c, f), weight(c, f), weight(f, c)

    def heads(t: np.ndarray) -> np.ndarray:
        return t.reshape(s, c // 64, 64).transpose(1, 0, 2)

    h = rmsnorm(x, norm1, 1e-6)
    q, k, v = (heads(h @ f64(w)) for w in (wq, wk, wv))
    a = softmax(q @ k.transpose(0, 2, 1) / 8) @ v
    x1 = f64(x) + a.transpose(1, 0, 2).reshape(s, c) @ f64(wo)
    h = rmsnorm(x1, norm2, 1e-6)
    g = h @ f64(w1)
    want = x1 + (g / (1 + np.exp(-g)) * (h @ f64(w3))) @ f64(w2)
    out = library.decoder_block(x, norm1, wq, wk, wv, wo, norm2, w1, w3, w2)
    np.testing.assert_allclose(f64(out), want, rtol=1e-4, atol=1e-4)


@pytest.mark.execute
@needs_gxx
def test_a_parameter_returned_as_it_is_is_copied(library: Any) -> None:
    x = np.random.default_rng(54).standard_normal((37, 45), dtype=np.float32)
    out = library.returned_as_is(x)
    assert not np.shares_memory(out, x)
    np.testing.assert_array_equal(out, x)


@pytest.mark.execute
@needs_gxx
def test_softmax_and_norms_written_out(library: Any) -> None:
    rng = np.random.default_rng(53)
    x = rng.standard_normal((2, 19, 45), dtype=np.float32) * 4
    w, b = rng.standard_normal((2, 45), dtype=np.float32)
    np.testing.assert_allclose(f64(library.softmax_written_out(x)), softmax(f64(x)), atol=1e-6)
    out = f64(library.llama_rmsnorm(x, w))
    np.testing.assert_allclose(out, rmsnorm(x, w, 1e-6), rtol=1e-5, atol=1e-5)
    out = f64(library.layernorm_written_out(x[0], w, b))
    np.testing.assert_allclose(out, layernorm(x[0], w, b, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.execute
@needs_gxx
def test_elementwise_ops_on_0d_tensors(library: Any) -> None:
    rng = np.random.default_rng(52)
    x, y = rng.standard_normal((2, 1000), dtype=np.float32)
    checks = {
        "vector_length": np.sqrt((f64(x) ** 2).sum()),
        "mean_squared_error": ((f64(x) - f64(y)) ** 2).mean(),
        "cosine_similarity": f64(x) @ f64(y) / (np.linalg.norm(f64(x)) * np.linalg.norm(f64(y))),
    }
    for name, want in checks.items():
        got = getattr(library, name)(*((x,) if name == "vector_length" else (x, y)))
        assert got.shape == (), name
        np.testing.assert_allclose(float(got), want, rtol=1e-5, err_msg=name)
    want = f64(x) / np.abs(f64(x)).max()
    np.testing.assert_allclose(f64(library.absmax_scaled(x)), want, rtol=1e-6, atol=1e-7)
    m = rng.standard_normal((37, 45), dtype=np.float32)
    s = np.asarray(rng.standard_normal(), dtype=np.float32)
    want = f64(m) * f64(s) + 1  # near 0 where m * s is near -1: an absolute tolerance too
    np.testing.assert_allclose(f64(library.times_a_0d(m, s)), want, rtol=1e-6, atol=1e-6)


@pytest.mark.execute
@needs_gxx
def test_norms_without_weight_or_bias(library: Any) -> None:
    rng = np.random.default_rng(51)
    x = rng.standard_normal((2, 21, 53), dtype=np.float32)
    w, b = rng.standard_normal((2, 53), dtype=np.float32)
    ones, zeros = np.ones(53, np.float32), np.zeros(53, np.float32)
    want = (
        layernorm(x, ones, zeros, 1e-5)
        + 2 * layernorm(x, w, zeros, 1e-5)
        + 4 * layernorm(x, ones, b, 1e-5)
        + 8 * rmsnorm(x, ones, 1e-6)
    )
    out = f64(library.plain_norms(x, w, b))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
