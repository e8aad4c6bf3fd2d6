"""Write ``docs/ops.md`` from the operation registry.

The rules' docstrings are the documentation, so the reference cannot drift
from what the compiler checks; ``tests/test_docs.py`` compares the file with
this output. Run ``python -m tessera.transpiler.graph.opdocs`` after
changing an operation.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ...files import write_file
from . import loss_scale, optim, quant  # noqa: F401  (they register their graph ops)
from .graph_ops import COMPARISONS, GRAPH_OPS
from .opcall import OpSpec
from .tile_ops import TILE_DIMS

__all__ = ["render_ops_doc"]

_OPERATORS = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "pow": "**",
    **{kind: symbol for symbol, kind in COMPARISONS.items()},
}  # fmt: skip
#: How the ops of masks are written: Python's words, and numpy's operators.
_WORDS = {"logical_and": ("a and b", "a & b", "logical_and(a, b)"),
          "logical_or": ("a or b", "a | b", "logical_or(a, b)"),
          "logical_not": ("not x", "~x", "logical_not(x)"),
          "logical_xor": ("a ^ b", "logical_xor(a, b)"), "neg": ("-x",)}  # fmt: skip

_INTRO = """\
# Operations

Generated from the operation registry (`tessera/transpiler/graph/graph_ops.py`,
`tile_ops.py`) by `python -m tessera.transpiler.graph.opdocs`; a test keeps it current.

Graph operations work on whole tensors in graph functions; the compiler fuses them into
kernels. Tile operations work on the tiles of one program instance, in tile kernels (a
function that calls `tile.context()`). Arithmetic and comparison operators work in both.
Using one kind where the other belongs is an error that says so.

A comparison of tensors or tiles is a mask, which `where` (`tile.where`) and `cast` read:
`where(x > 0.0, x, 0.01 * x)`. A mask is not a number: arithmetic and reductions on one are
errors that say to cast it (`sum(cast(x > t, f32))` counts), and no parameter or result
is one. A kernel computes a mask where it reads it; one that a kernel over a larger shape
reads (`where(b < 0.5, x, y)` with `b` of `[C]` and `x` of `[R, C]`) is kept between the
two kernels as the floats 1.0 and 0.0.

The unary math, `clamp` and `clip`, `pow`, `square`, `reciprocal`, `sign`, `isnan`, `isinf`,
`isfinite`, the reductions (with `var`, `std`, `argmax` and `argmin`), the softmaxes and
`logsumexp` are methods too, as in NumPy and PyTorch: `x.sum(axis=0)` is `sum(x, axis=0)`,
`x.abs().max()` is `max(abs(x))`, `x.var(axis=-1)` is `var(x, axis=-1)`; on a tile,
`t.exp()` and `t.max(axis=1)` are the tile operations of those names. So are `x.T` (the
last two axes swapped), `x.to(dtype)` and NumPy's `x.astype(dtype)` (a cast),
`x.reshape(dims)` and PyTorch's `x.view(dims)`, and the array vocabulary `squeeze`,
`unsqueeze`, `flatten`, `broadcast_to`, PyTorch's `x.expand(*sizes)`, `tril`, `triu`,
`any` and `all`.

`zeros`, `ones`, `full` and `arange` take a shape or bounds, not a tensor: each element
is computed where a kernel reads it (its index), so a fill or a range costs no memory
unless it is returned. `concat` and `stack` take a list or tuple of tensors
(`concat([a, b], axis=-1)`). Every op takes PyTorch's `dim=` for `axis=` and
`keepdim=` for `keepdims=`, as PyTorch's own functions take numpy's names too:
`x.sum(dim=-1, keepdim=True)`. `pow(a, b)` and numpy's `power(a, b)` are `a ** b`.

PyTorch's `torch.nn.functional` names are builtins with PyTorch's signatures and layouts,
`F.` left off: `linear(x, weight, bias)` (the weight `[out_features, in_features]`, read
in place), `bmm`, `scaled_dot_product_attention` (`flash_attention`; with `attn_mask`, a
mask or an additive one, the attention written out as PyTorch's math), `layer_norm` and
`rms_norm` (over the last dim, `normalized_shape` naming it), `normalize`,
`cosine_similarity`, `pad` (constant mode, the counts from the last dim backwards), the
losses (`mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss`, `binary_cross_entropy`,
`binary_cross_entropy_with_logits`, `nll_loss`, `cross_entropy`), `embedding`,
`softmax(x, dim=-1)`, `log_softmax`, the activations (`relu`, `relu6`, `hardtanh`,
`hardsigmoid`, `hardswish`, `silu`, `mish`, `softplus`, `logsigmoid`, `softsign`,
`leaky_relu`, `elu`, `selu`, `celu`, `glu`, and `gelu`, whose default is the tanh
approximation: PyTorch's `approximate="none"` is the exact one), and `torch`'s `outer`,
`gather(x, dim, index)` and `repeat_interleave(x, n, dim=)` (methods too:
`x.gather(1, idx)`, `k.repeat_interleave(2, dim=1)`). numpy's and PyTorch's
`logical_and`, `logical_or`, `logical_not` and `logical_xor` are the ops of masks.

Shapes are written with symbolic dims: `[M, K]`. When two dims must be equal and are
different names, or different numbers, it is an error; when one is a name and the other a
number, the compiler records a guard that the generated host code checks at run time.
"""

_VALUES = """\
## Values and attributes

| expression | meaning |
|---|---|
| `x.shape` | the dims of a tensor or tile; `x.shape[i]` is one size, `x.shape[1:]` a \
slice of them, and `B, S, E = x.shape` unpacks them as a tuple does |
| `x.dtype` | its dtype |
| `x.T` | `transpose(x)` (`tile.transpose` for a tile) |
| `x.transpose(2, 0, 1)`, `x.transpose((2, 0, 1))`, `x.permute(2, 0, 1)` | \
`transpose(x, (2, 0, 1))`: the whole permutation, as NumPy's `transpose` and PyTorch's \
`permute` take it |
| `x.transpose(1, 2)` | two axes swapped, as PyTorch's `transpose` swaps them (on a matrix, \
NumPy's reading of two axes is the same swap) |
| `x.to(dtype)`, `x.astype(dtype)` | `cast(x, dtype)` (`tile.cast` for a tile), as in \
PyTorch and Triton, and NumPy |
| `x.float()`, `x.half()`, `x.bfloat16()`, `x.int()` | PyTorch's casts: to f32, f16, bf16 \
and i32 |
| `x.ndim` | the rank, a number |
| `len(x)` | the first size of a tensor, as Python's `len` of an array (the count of a \
shape, tuple or list) |
| `amax`, `amin` (functions and methods) | `max` and `min`, as NumPy and PyTorch call them too |
| `d ** 0.5`, `d * 0.5` of a size `d` | a float, as a Python int with a float is \
(`q @ k.T / d ** 0.5`); a size with integers stays a size |
| `x.t()` | a matrix's transpose (PyTorch's: a tensor of rank 3 or more is an error) |
| `x.matmul(w)`, `x.mm(w)` | `x @ w` |
| `split(x, 3, axis=-1)`, `split(x, [5, 9], axis=1)` | NumPy's `split`: a tuple of three \
equal sections (a size that 3 does not divide is an error, or a guard where it is \
symbolic), or of the parts between the indices given; each part a view, as a slice is |
| `chunk(x, 2, dim=-1)`, `x.chunk(2, dim=-1)` | PyTorch's `chunk`: parts of `ceil(n / 2)` \
elements, the last one smaller (`a, b = (x @ w).chunk(2, dim=-1)`, a gated MLP's halves); \
a symbolic size must divide |
| `x.split(64, dim=-1)`, `x.split([3, 5], dim=1)` | PyTorch's `Tensor.split`: parts of 64 \
elements (of a size the compiler knows), or of the sizes listed, which add up to the axis |
| `x[:, None]` | a new axis of size 1 (for broadcasting); `...` stands for the axes not named |
| `x[:, a:b]` | elements `[a, b)` of a tensor's axis, on any axes of a tensor of two or more, \
as in NumPy (a negative bound counts from the end; sizes may be bounds: `h[..., :F]`, \
`k[:, :T]`, `h[:, :C // 2]`, `h[:, "C/2":]`, where a size's `//` is exact: a call whose `C` \
is odd is refused, never rounded); a view that the kernels reading it read where it lies. \
A vector's slice is its one row's. A tile is not sliced (`tile.split` cuts one) |
| `x[:, a:b:k]`, `x[:, ::2]`, `x[:, 1::2]` | every `k`-th element of `[a, b)`, from `a`, as in \
NumPy (`k` a positive integer): the elements as `[n/k, k]` groups and one column of them, \
views again. Where the count is symbolic it must be whole: `x[:, 1::2]` of an even `D` takes \
`D/2`; of an odd `D` (NumPy's `(D - 1) / 2`), the call is refused, never rounded. A slice \
of a slice is one view |
| `x[:, i]` | element `i` along an axis, without the axis (`h[:, -1]`: the last position): the \
slice `i:i+1`, copied, reshaped |
| `cache.K`, `cache.V` | the key and value tensors of a `KVCache[B, H, S_max, D_h, dtype]`, \
all `S_max` slots, as the appends before them left them; the kernel that reads them reads \
the caller's arrays where they lie |
| `flash_attention(q, cache, causal=...)` | attention of `q [B, H_q, n, D]` over the \
positions the cache holds, as `tessera.decode_attention` computes it \
([kv-cache.md](kv-cache.md#flash_attentionq-cache-in-a-compiled-function)) |
| `cache.append(k, v)` | the cache with `k` and `v` appended, written in place into the \
caller's arrays: a state effect, two launches in program order \
([kv-cache.md](kv-cache.md#in-tsr-source)) |
| `float(n)`, `int(n)` | a number or a size as a scalar; `float(n)` of an `int` parameter \
too. `n / m` of ints is a float, as in Python |
| `INF`, `NAN`, `inf`, `nan` | infinity and not-a-number (`-inf` for masks); Python's \
`float("-inf")` too. `np.inf` or `math.inf` is an error that says to write `inf` |
| `Schedule(block=..., k=..., warps=..., stages=...)` | a schedule for `@kernel.schedule` \
(also `vector=`, `swizzle=`, `persistent=`); `with_block(...)`, `with_warps(...)`, ... \
derive variants |
| `op.with_schedule(s)` | a standard-library op with an explicit schedule |
"""


def _entry(spec: OpSpec) -> str:
    return f"### `{spec.signature()}`\n\n{spec.doc}\n"


def render_ops_doc() -> str:
    graph = [s for s in GRAPH_OPS.values() if s.level == "graph"]
    tile = [s for s in GRAPH_OPS.values() if s.level == "tile"]
    anywhere = [s for s in GRAPH_OPS.values() if s.level == "any"]
    parts = [_INTRO, "## Arithmetic, comparisons and logic (graph functions and tile kernels)\n"]
    for spec in anywhere:
        spellings = _WORDS.get(spec.name) or (f"a {_OPERATORS[spec.name]} b",)
        written = ", ".join(f"`{text}`" for text in spellings)
        parts.append(f"### {written} ({spec.name})\n\n{spec.doc}\n")
    parts.append("## Graph operations\n")
    parts += [_entry(s) for s in graph]
    parts.append("## Tile operations\n")
    dims = "\n".join(f"- `T.{name}`: {what}" for name, what in TILE_DIMS.items())
    parts.append(
        "### `tile.context()`\n\nThe tile sizes of the running program instance, as "
        f"symbolic sizes that the schedule fixes:\n\n{dims}\n"
    )
    parts += [_entry(s) for s in tile]
    parts.append(_VALUES)
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    """Write the reference to the path given (``docs/ops.md`` by default)."""
    parser = argparse.ArgumentParser(
        prog="python -m tessera.transpiler.graph.opdocs",
        description="Write the operation reference from the operation registry.",
    )
    parser.add_argument(
        "output", nargs="?", type=Path, default=Path("docs/ops.md"), help="default: docs/ops.md"
    )
    write_file(parser.parse_args(argv).output, render_ops_doc())


if __name__ == "__main__":
    main()
