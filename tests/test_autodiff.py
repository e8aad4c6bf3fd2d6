"""Reverse mode: each ``F_vjp`` of ``autodiff_cases.tsr`` against PyTorch autograd in
float64, and against finite differences of ``F`` itself, so that the check does not
trust torch alone. One module holds every case and is built once.

Inputs are random normals of ragged sizes (no size a multiple of any tile), results are
compared in float64 with the tolerance of f32 arithmetic.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tessera
from tessera.runtime import cpu
from tessera.transpiler.graph.autodiff import CONSTANT_OPS, NO_GRADIENT, VJP_RULES
from tessera.transpiler.graph.graph_ops import GRAPH_OPS
from tessera.transpiler.graph.ir import walk

from .builds import assert_cpu_builds_warning_free, assert_gpu_builds_warning_free
from .everywhere import EVERY_TARGET, every_target_beyond, load_everywhere
from .test_cpu import COMPILERS
from .test_cuda import NVCC, _nvcc, needs_gxx
from .test_hip import HIPCC, _hipcc_warning_free

torch = pytest.importorskip("torch")
F = torch.nn.functional

CASES_FILE = Path(__file__).with_name("autodiff_cases.tsr")
SIZES = {"R": 7, "C": 13, "M": 5, "K": 11, "N": 9, "B": 3, "D": 6, "H": 10, "Q": 18}


def _layernorm(x: Any, w: Any = None, b: Any = None) -> Any:
    return F.layer_norm(x, x.shape[-1:], w, b, eps=1e-5)


def _rmsnorm(x: Any, w: Any) -> Any:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def _mlp(x: Any, w1: Any, b1: Any, w2: Any) -> Any:
    return F.gelu(x @ w1 + b1, approximate="tanh") @ w2


def _unary(x: Any) -> Any:
    a = torch.exp(x * 0.5) + torch.log(x * x + 1) + torch.sqrt(x * x + 2)
    a = a + torch.rsqrt(x * x + 0.5)
    a = a + torch.tanh(x) + torch.sigmoid(x) - x**3 + x.abs() * 0.5
    return a + torch.sin(x) * torch.cos(x * 2)


def _unary_math(x: Any) -> Any:
    a = torch.tan(x * 0.5) + torch.exp2(x) + torch.log2(x * x + 0.5) + torch.log1p(x * x)
    return a + torch.expm1(x) + torch.erf(x)


def _unary_compositions(x: Any) -> Any:
    a = F.softplus(x * 15) + F.softplus(x, beta=2.0) + F.leaky_relu(x, 0.1) + F.elu(x * 3, 0.5)
    b = x.square() + (x * x + 1).reciprocal() + x.clip(-0.5) + torch.ones_like(x) * x
    return a + b + torch.full_like(x, 2.0) + torch.where(x.isfinite(), x, torch.zeros_like(x))


def _fused_qkv(x: Any) -> Any:
    q, k, v = x.reshape(x.shape[0], 3, 2, -1).permute(1, 2, 0, 3)
    return F.scaled_dot_product_attention(q, k, v) + q * 0.5


def _strided(x: Any, w: Any) -> Any:
    a, b = x.chunk(2, dim=-1)
    return torch.where((a > 0) & ~(b > 0.5), a * b, x[:, ::2] - x[:, 1::2]) @ w + x[:, -1:]


#: Each case: its function, its inputs ((name, shape) in parameter order; a shape of
#: strings, "i32:" before an integer one, "ixC:" before indices in [0, C)), and the same
#: function in PyTorch.
CASES: dict[str, tuple[tuple[tuple[str, str], ...], Callable[..., Any]]] = {
    "arith": (
        (("x", "RC"), ("y", "RC"), ("w", "C"), ("b", "R1")),
        lambda x, y, w, b: (x * w + b) / (y * y + 1) - x + 2 * y,
    ),
    "unary": ((("x", "RC"),), _unary),
    "unary_math": ((("x", "RC"),), _unary_math),
    "unary_compositions": ((("x", "RC"),), _unary_compositions),
    "variance": (
        (("x", "RC"),),
        lambda x: (
            x.var(-1, keepdim=True, correction=0) + torch.logsumexp(x * 2, -1, keepdim=True),
            x.std(0),
        ),
    ),
    "remainder": (
        (("x", "RC"), ("y", "RC")),
        lambda x, y: torch.remainder(x * 3 + 20, y * y + 5) + x,
    ),
    "activations": (
        (("x", "RC"),),
        lambda x: F.gelu(x, approximate="tanh")
        + F.silu(x) * 2
        + F.relu(x) * 3
        + x
        + F.gelu(x) * 0.5,
    ),
    "extremes": (
        (("x", "RC"), ("y", "RC")),
        lambda x, y: torch.maximum(x, y)
        + torch.clamp(x, max=0.25)
        + torch.where(x > 0, x * y, y)
        + torch.clamp(y, -0.5, 0.5),
    ),
    "product": ((("a", "MK"), ("b", "KN")), lambda a, b: a @ b),
    "product_nt": ((("a", "MK"), ("b", "NK")), lambda a, b: a @ b.T),
    "batched": ((("a", "BMK"), ("b", "KN")), lambda a, b: a @ b),
    "vector_matrix": (
        (("v", "K"), ("b", "KN"), ("a", "MK")),
        lambda v, b, a: (v @ b, a @ v),
    ),
    "reductions": (
        (("x", "RC"),),
        lambda x: x.sum(0) + (x * x).mean(0) * 2 + x.amax(0) - x.amin(0),
    ),
    "row_reductions": (
        (("x", "RC"),),
        lambda x: x.sum(-1, keepdim=True)
        + (x * 2).amax(-1, keepdim=True)
        + x.mean(-1, keepdim=True),
    ),
    "total": ((("x", "RC"), ("w", "C")), lambda x, w: (x * w).sum() + x.mean()),
    "softmaxes": (
        (("x", "RC"), ("y", "RC")),
        lambda x, y: F.softmax(x, -1) * y + F.log_softmax(x * 2, -1) + F.softmax(y, 0),
    ),
    "logsumexp_rows": ((("x", "RC"),), lambda x: torch.logsumexp(x, -1)),
    "norms": (
        (("x", "RC"), ("w", "C"), ("b", "C"), ("v", "C")),
        lambda x, w, b, v: _layernorm(x, w, b) + _rmsnorm(x * 2, v) + _layernorm(x * 0.5),
    ),
    "layout": (
        (("x", "RC"), ("y", "CR")),
        lambda x, y: x.T * y + x.reshape(13, 7) + x.T,
    ),
    "restricted": (
        (("x", "RC"), ("w", "CN"), ("labels", "i32:RN")),
        lambda x, w, labels: torch.tanh(x @ w) * labels,
    ),
    "attention": (
        (("q", "BMD"), ("k", "BND"), ("v", "BND")),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    ),
    "causal_attention": (
        (("q", "BMD"), ("k", "BND"), ("v", "BND")),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
    ),
    "grouped_attention": (
        (("q", "14ND"), ("k", "12ND"), ("v", "12ND")),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    ),
    "cross_entropy": (
        (("logits", "RC"), ("labels", "ixC:R1")),
        lambda x, labels: -torch.take_along_dim(F.log_softmax(x, -1), labels.long(), -1).sum() / 7,
    ),
    "gather_rows": (
        (("x", "RC"), ("rows", "ixR:KC")),
        lambda x, rows: torch.take_along_dim(x * 2, rows.long(), 0),
    ),
    "slices": (
        (("x", "RC"), ("y", "BRC")),
        lambda x, y: (x[2:6, 3:7] * torch.tanh(x[1:5, -4:]), y[1:3, :, 4][:, :, None] * 2),
    ),
    "fused_qkv": ((("x", "RQ"),), lambda x: _fused_qkv(x)),
    "strided": ((("x", "RD"), ("w", "33")), lambda x, w: _strided(x, w)),
    "scattered": (
        (("x", "RC"), ("idx", "ixC:RK"), ("v", "RK")),
        lambda x, idx, v: (x * 2).scatter_add(-1, idx.long(), torch.tanh(v)),
    ),
    "mlp_loss": (
        (("x", "RD"), ("w1", "DH"), ("b1", "H"), ("w2", "HC"), ("target", "RC")),
        lambda x, w1, b1, w2, t: -(t * F.log_softmax(_mlp(x, w1, b1, w2), -1)).sum() / 7,
    ),
    "shapes": (
        (("x", "RC"), ("b", "C")),
        lambda x, b: (x.unsqueeze(1).flatten(1) * b.broadcast_to(x.shape)).unsqueeze(0).squeeze(0)
        + b.expand(x.shape[0], -1) * x,
    ),
    "joins": (
        (("x", "RC"), ("y", "R3"), ("z", "2C")),
        lambda x, y, z: (
            torch.cat([x * x, y], -1),
            torch.stack([torch.cat((x, z)), torch.cat((z * 2, x))]),
        ),
    ),
    "triangles": (
        (("x", "RC"), ("s", "RR")),
        lambda x, s: (
            x.tril() * x + x.triu(2),
            torch.softmax(torch.where(torch.ones_like(s).tril() > 0, s, -math.inf), -1),
        ),
    ),
    "gathers": (
        (("w", "CR"), ("ids", "ixC:R3"), ("x", "RC"), ("y", "ixC:R")),
        lambda w, ids, x, y: (
            w[ids.long()] * 2,
            F.cross_entropy(x, y.long(), label_smoothing=0.2),
            F.cross_entropy(x * 3, y.long(), reduction="none"),
        ),
    ),
    "einsums": (
        (("a", "BMK"), ("b", "BKN"), ("v", "N")),
        lambda a, b, v: (
            torch.einsum("bij,bjk->bik", a, b),
            torch.einsum("bij,k->bjik", a, v),
            torch.einsum("bij->j", a),
        ),
    ),
    "running_sums": (
        (("x", "RC"),),
        lambda x: (x.cumsum(-1) * x, x.cumsum(0)),
    ),
}

#: The parameters each ``F_vjp`` differentiates, where not every float tensor.
WRT = {"restricted": ("w",)}


def _shape(spec: str) -> tuple[int, ...]:
    spec = spec.split(":")[-1]
    return tuple(int(c) if c.isdigit() else SIZES[c] for c in spec)


def _inputs(name: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    made = {}
    for param, spec in CASES[name][0]:
        if spec.startswith("ix"):  # indices into the size after "ix", repeats included
            made[param] = rng.integers(0, SIZES[spec[2]], _shape(spec)).astype(np.int32)
        elif spec.startswith("i32:"):
            made[param] = rng.integers(-2, 3, _shape(spec)).astype(np.int32)
        else:
            made[param] = rng.standard_normal(_shape(spec)).astype(np.float32)
    return made


def built_unoptimized(source: Path | str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The functions of the file ``source`` (or of the source text) for the CPU, built
    without optimization: the sizes are tiny, and g++ builds the module in a tenth of the
    time it takes at -O3."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        if isinstance(source, Path):
            program = tessera.compile_file(source, target="cpu")
        else:
            program = tessera.compile(source, filename="program.tsr", target="cpu")
        meta = program.ir("meta")
        flags = ["-O0" if f == "-O3" else f for f in meta["build"]["flags"]]
        return cpu.load(program.source, meta, flags)


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Every case, built once."""
    return built_unoptimized(CASES_FILE, tmp_path_factory)


def _tuple(x: Any) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _vjp(lib: Any, name: str, inputs: dict, cotangents: tuple) -> tuple[np.ndarray, ...]:
    return _tuple(getattr(lib, f"{name}_vjp")(*inputs.values(), *cotangents))


@needs_gxx
@pytest.mark.parametrize("name", sorted(CASES))
def test_vjp_matches_torch_and_finite_differences(lib: Any, name: str) -> None:
    # seeded by the name, so that a case added does not change the others' inputs
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    inputs = _inputs(name, rng)
    outputs = _tuple(getattr(lib, name)(*inputs.values()))
    cotangents = tuple(rng.standard_normal(o.shape).astype(np.float32) for o in outputs)
    grads = _vjp(lib, name, inputs, cotangents)
    wrt = WRT.get(name, [n for n, v in inputs.items() if v.dtype == np.float32])
    assert len(grads) == len(wrt)

    tensors = {n: torch.tensor(v, dtype=torch.float64, requires_grad=n in wrt)
               for n, v in inputs.items()}  # fmt: skip
    expected = _tuple(CASES[name][1](*tensors.values()))
    for have, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(have, want.detach().numpy(), rtol=1e-4, atol=1e-4)
    torch.autograd.backward(expected, [torch.tensor(c, dtype=torch.float64) for c in cotangents])
    for param, grad in zip(wrt, grads, strict=True):
        assert grad.shape == inputs[param].shape and grad.dtype == np.float32
        np.testing.assert_allclose(grad, tensors[param].grad.numpy(), rtol=1e-4, atol=1e-4)

    assert_finite_differences(getattr(lib, name), inputs, dict(zip(wrt, grads, strict=True)),
                              cotangents, rng)  # fmt: skip


def assert_finite_differences(
    f: Callable[..., Any],
    inputs: dict[str, np.ndarray],
    grads: dict[str, np.ndarray],
    cotangents: tuple[np.ndarray, ...],
    rng: np.random.Generator,
) -> None:
    """``grads``, the cotangents of some of ``f``'s ``inputs`` given ``cotangents``, against
    finite differences of ``f`` itself along a random direction, in float64 from the f32
    inputs as rounded: <cotangent, f(x + h v) - f(x - h v)> against <grads, 2 h v>."""
    plus, minus = dict(inputs), dict(inputs)
    step = 0.0
    for param, grad in grads.items():
        v = rng.standard_normal(inputs[param].shape)
        plus[param] = (inputs[param] + 1e-3 * v).astype(np.float32)
        minus[param] = (inputs[param] - 1e-3 * v).astype(np.float32)
        step += np.sum(grad.astype(np.float64) * (plus[param] - minus[param].astype(np.float64)))
    ahead, behind = (_tuple(f(*x.values())) for x in (plus, minus))
    terms = [c.astype(np.float64) * (a.astype(np.float64) - b)
             for c, a, b in zip(cotangents, ahead, behind, strict=True)]  # fmt: skip
    change = sum(t.sum() for t in terms)
    # within 2% of the terms' magnitude: the sum may cancel, and an element that
    # crosses a kink (a maximum changing hands) is off by its step
    scale = 2e-2 * sum(np.abs(t).sum() for t in terms)
    assert math.isclose(change, step, abs_tol=scale), (change, step, scale)


@needs_gxx
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.func imports torch.jit
@pytest.mark.parametrize(
    "name", ["arith", "norms", "product", "softmaxes", "unary_math", "unary_compositions"]
)
def test_jvp_matches_torch(lib: Any, name: str) -> None:
    """``F_jvp``: ``F``'s results, then their tangents along one tangent per input."""
    rng = np.random.default_rng(len(name))
    inputs = _inputs(name, rng)
    tangents = [rng.standard_normal(v.shape).astype(np.float32) for v in inputs.values()]
    have = getattr(lib, f"{name}_jvp")(*inputs.values(), *tangents)
    as64 = [torch.tensor(v, dtype=torch.float64) for v in (*inputs.values(), *tangents)]
    values, jv = torch.func.jvp(CASES[name][1], tuple(as64[: len(inputs)]),
                                tuple(as64[len(inputs) :]))  # fmt: skip
    for got, want in zip(have, (values, jv), strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


@needs_gxx
def test_dropout_replays_its_mask_in_the_backward_pass(lib: Any) -> None:
    """The gradient of ``dropout(2 x)`` is 2 g where the element was kept (scaled by
    1/(1-p)), 0 where it was dropped: the same mask, drawn again from the seed."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((SIZES["R"], SIZES["C"])).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    out = lib.dropped(x, seed=41)
    kept = out != 0
    assert 0 < kept.sum() < kept.size
    grad = lib.dropped_vjp(x, g, seed=41)
    np.testing.assert_allclose(grad, np.where(kept, g * 2 / 0.75, 0), rtol=1e-6)
    assert not np.array_equal(lib.dropped_vjp(x, g, seed=42) != 0, kept)


@needs_gxx
def test_a_training_step_takes_its_gradients_in_the_same_function(lib: Any) -> None:
    """``value_and_grad`` and ``grad`` inside a graph function: the loss, the gradients
    named by ``wrt=`` and an SGD update, against PyTorch."""
    rng = np.random.default_rng(11)
    r, d, c = SIZES["R"], SIZES["D"], SIZES["C"]
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((r, d), (d, c), (c,)))
    target = rng.random((r, c)).astype(np.float32)
    loss, new_w, new_b = lib.train_step(x, w, b, target, 0.1)
    tw, tb = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (w, b))
    tx, tt = (torch.tensor(v, dtype=torch.float64) for v in (x, target))
    expected = -(tt * F.log_softmax(tx @ tw + tb, -1)).sum() / 7
    expected.backward()
    assert loss.shape == () and math.isclose(loss, expected.item(), rel_tol=1e-5)
    np.testing.assert_allclose(new_w, (tw - 0.1 * tw.grad).detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_b, (tb - 0.1 * tb.grad).detach().numpy(), rtol=1e-5, atol=1e-6)
    dw = lib.weight_grad(x, w, b, target)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-4, atol=1e-6)


@needs_gxx
def test_a_scalar_result_that_other_ops_read_is_written(lib: Any) -> None:
    """A 0-d result that another kernel reads too (a loss, which its gradient reads) is
    written by a kernel of its own."""
    x = np.random.default_rng(2).standard_normal((SIZES["R"], SIZES["C"])).astype(np.float32)
    total, scaled = lib.total_and_scaled(x)
    assert total.shape == () and math.isclose(total, x.astype(np.float64).sum(), rel_tol=1e-5)
    np.testing.assert_allclose(scaled, x * total, rtol=1e-6)


#: Functions that cannot be differentiated, the line (1-based) and text of the error.
BAD = {
    "tile kernel": (
        "@autodiff\ndef f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    T = tile.context()\n"
        "    return tile.load(x, rows=T.m)\n",
        1,
        "'f' is a tile function",
    ),
    "integer result": (
        "@autodiff\ndef f(x: Tensor['N', i32]) -> Tensor['N', i32]:\n    return x + x\n",
        2,
        "its result is tensor<[N], i32>, which has no gradient",
    ),
    "not a parameter": (
        "@autodiff(wrt=('w',))\ndef f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n"
        "    return x * 2.0\n",
        1,
        "wrt= names 'w', which is not a parameter of 'f'",
    ),
    "jvp not a bool": (
        "@autodiff(jvp=1)\ndef f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return x * 2.0\n",
        1,
        "jvp= is True or False",
    ),
    "integer parameter": (
        "@autodiff(wrt=('n',))\ndef f(x: Tensor['N', f32], n: Tensor['N', i32]) -> "
        "Tensor['N', f32]:\n    return x * cast(n, f32)\n",
        1,
        "only floating-point tensors have gradients; leave 'n' out of wrt=",
    ),
    "no rule": (
        "@autodiff\ndef f(x: Tensor['R', 'C', f32]) -> Tensor['R', 2, f32]:\n"
        "    y = round(x * 2.0)\n    return y[:, 1:3]\n",
        3,
        "cannot differentiate round: its derivative is zero wherever it exists",
    ),
    "grad of a tensor": (
        "def g(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return x * x\n\n"
        "def f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return grad(g)(x)\n",
        5,
        "grad() differentiates a function of one scalar result",
    ),
    "grad wrt": (
        "def g(x: Tensor['N', f32]) -> Tensor[f32]:\n    return sum(x, axis=None)\n\n"
        "def f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return grad(g, wrt='y')(x)\n",
        5,
        "wrt= names 'y', which is not a parameter of 'g'",
    ),
}


#: Graph ops whose rules emit other ops, and those ops: each has a rule or a reason.
COMPOSITE = {
    "cast_like": ("cast",), "clamp": ("maximum", "minimum"), "min": ("neg", "max"),
    "residual": ("add", "dropout"), "fused_adam": ("add", "sub", "mul", "div", "sqrt"),
    "quantize": ("div", "round", "maximum", "minimum", "cast"), "dequantize": ("cast", "mul"),
    "clip": ("where", "maximum", "minimum"), "softplus": ("where", "log1p", "exp", "minimum"),
    "leaky_relu": ("where", "mul"), "elu": ("where", "expm1", "minimum", "mul"),
    "square": ("mul",), "reciprocal": ("div",), "sign": ("where", "mul"),
    "isnan": ("not_equal",), "isinf": ("equal", "abs"), "isfinite": ("less", "abs"),
    "zeros_like": ("where", "cast"), "ones_like": ("where", "cast"),
    "full_like": ("where", "cast"), "logsumexp": ("logsumexp_safe",),
    "var": ("mean", "sub", "mul", "sum", "div", "cast"), "std": ("mean", "sub", "mul", "sum",
    "div", "cast", "sqrt"),
    "norm": ("mul", "sum", "sqrt", "abs", "max", "cast", "not_equal", "where"),
    "argmax": ("index_along", "max", "neg", "where", "add", "sub", "cast", "reshape"),
    "argmin": ("index_along", "max", "neg", "where", "add", "sub", "cast", "reshape"),
    "squeeze": ("reshape",), "unsqueeze": ("expand_dims",), "expand_dims": ("expand_dims",),
    "flatten": ("reshape",), "broadcast_to": ("index_along", "equal", "where", "logical_and"),
    "expand": ("index_along", "equal", "where", "logical_and"),
    "zeros": ("index_along", "reshape", "cast"), "ones": ("index_along", "add", "cast"),
    "full": ("index_along", "add", "cast"), "arange": ("index_along", "mul", "add", "cast"),
    **{join: ("index_along", "cast", "reshape", "pad", "add", "not_equal", "expand_dims")
       for join in ("concat", "concatenate", "cat", "stack")},
    "tril": ("index_along", "sub", "less_equal", "where"),
    "triu": ("index_along", "sub", "greater_equal", "where"),
    "take": ("reshape", "index_along", "equal", "where", "take_along_axis"),
    "embedding": ("reshape", "index_along", "equal", "where", "take_along_axis"),
    "cross_entropy": ("cast", "log_softmax", "not_equal", "where", "reshape", "take_along_axis",
                      "neg", "mean", "add", "mul", "sum", "div"),
    "einsum": ("sum", "transpose", "reshape", "mul", "matmul"),
    "cumsum": ("reshape", "cast", "transpose", "index_along", "sub", "greater_equal", "where",
               "matmul"),
    "any": ("not_equal", "cast", "max", "greater"), "all": ("not_equal", "cast", "neg", "max",
    "greater"),
    "linear": ("transpose", "matmul", "add"), "bmm": ("matmul",),
    "scaled_dot_product_attention": ("flash_attention", "reshape"),
    "layer_norm": ("layernorm",), "rms_norm": ("rmsnorm",),
    "normalize": ("mul", "sum", "sqrt", "abs", "pow", "maximum", "div"),
    "mse_loss": ("sub", "mul", "mean", "sum"),
    "logical_xor": ("logical_and", "logical_or", "logical_not"),
    "relu6": ("maximum", "minimum"), "hardtanh": ("maximum", "minimum"),
    "hardsigmoid": ("add", "maximum", "minimum", "div"),
    "hardswish": ("add", "maximum", "minimum", "div", "mul"),
    "mish": ("mul", "tanh", "where", "log1p", "exp", "minimum"),
    "logsigmoid": ("abs", "neg", "exp", "log1p", "minimum", "sub"),
    "softsign": ("abs", "add", "div"), "selu": ("where", "expm1", "minimum", "mul"),
    "celu": ("where", "expm1", "minimum", "div", "mul"),
    "glu": ("slice", "reshape", "sigmoid", "mul"),
    "cosine_similarity": ("index_along", "equal", "where", "mul", "sum", "sqrt", "abs", "max",
                          "cast", "not_equal", "maximum", "div"),
    "outer": ("reshape", "mul"),
    "gather": ("take_along_axis", "transpose", "reshape", "slice", "cast"),
    "repeat_interleave": ("reshape", "index_along", "equal", "where"),
    "pad": ("cast", "index_along", "reshape", "pad", "dim_to_float", "where"),
    **{loss: ("sub", "abs", "mul", "div", "where", "mean", "sum", "index_along", "equal")
       for loss in ("l1_loss", "smooth_l1_loss", "huber_loss")},
    "binary_cross_entropy": ("log", "log1p", "neg", "maximum", "sub", "mul", "add", "mean",
                             "sum"),
    "binary_cross_entropy_with_logits": ("abs", "neg", "exp", "log1p", "minimum", "sub",
                                         "mul", "add", "mean", "sum"),
    "nll_loss": ("where", "reshape", "take_along_axis", "cast", "neg", "index_along", "mul", "sum",
                 "div"),
}  # fmt: skip
#: The ops that analysis emits beside the graph ops (views of a tensor's elements) and
#: the library ops that the gradients are made of.
EMITTED = ("slice", "expand_dims", "pad", "softmax_grad", "log_softmax_grad", "layernorm_grad",
           "rmsnorm_grad", "norm_param_grad", "attention_stats", "attention_dq",
           "attention_dkdv")  # fmt: skip


def test_every_graph_op_has_a_gradient_rule_or_says_why_not() -> None:
    """A graph op added without a rule fails here: it either has one, gives no gradient
    (a comparison), is made of ops that have one, or says why it has none."""
    ops = [k for k, spec in GRAPH_OPS.items() if spec.level != "tile"]
    for kind in (*ops, *EMITTED):
        parts = COMPOSITE.get(kind, (kind,))
        known = (*VJP_RULES, *CONSTANT_OPS, *NO_GRADIENT)
        assert all(p in known for p in parts), f"{kind} has no gradient rule and no reason"
    assert not set(NO_GRADIENT) & set(VJP_RULES)


@pytest.mark.parametrize("case", sorted(BAD))
def test_what_cannot_be_differentiated_is_an_error_at_its_line(case: str) -> None:
    assert_one_error(*BAD[case])


def assert_one_error(source: str, line: int, message: str) -> None:
    """Compiling ``source`` gives one error, at ``line``, whose message has ``message``."""
    with pytest.raises(tessera.CompileError) as caught:
        tessera.compile(source, filename="bad.tsr", until="graph")
    (error,) = [d for d in caught.value.diagnostics if d.severity.name == "ERROR"]
    assert error.span.line == line and message in error.message, error.message


#: One case on the other targets: a product, GELU, a row kernel and a reduction.
ELSEWHERE = """\
@autodiff(wrt=("w", "b"))
def layer(x: Tensor["R", "D", f32], w: Tensor["D", "C", f32], b: Tensor["C", f32],
          t: Tensor["R", "C", f32]) -> Tensor["R", f32]:
    return sum(t * log_softmax(gelu(x @ w + b), axis=-1), axis=-1)

@autodiff
def labelled(z: Tensor["R", "C", f32], labels: Tensor["R", 1, i32]) -> Tensor[f32]:
    return -sum(take_along_axis(log_softmax(z, axis=-1), labels, axis=-1), axis=None)

@autodiff
def sliced(h: Tensor["R", "C", f32]) -> Tensor[2, "R", 3, f32]:
    q, k, v = split_qkv(h[:, 2:20], heads=2)
    return softmax(q) * tanh(k) + v * h[:, -3:]
"""


@pytest.mark.parametrize(
    ("target", "arch"), [p for p in EVERY_TARGET if p.id in ("opencl", "sm_80")]
)
def test_vjp_on_the_other_targets(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(3)
    r, d, c = 37, 19, 23
    x, w, b, t, g = (rng.standard_normal(s).astype(np.float32)
                     for s in ((r, d), (d, c), (c,), (r, c), (r,)))  # fmt: skip
    built = load_everywhere(ELSEWHERE, target, arch, monkeypatch)
    dw, db = built.layer_vjp(x, w, b, t, g)
    tw, tb = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (w, b))
    tx, tt = (torch.tensor(v, dtype=torch.float64) for v in (x, t))
    out = (tt * F.log_softmax(F.gelu(tx @ tw + tb, approximate="tanh"), -1)).sum(-1)
    out.backward(torch.tensor(g, dtype=torch.float64))
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, tb.grad.numpy(), rtol=1e-4, atol=1e-4)
    # cross-entropy from integer labels: the gather's gradient is a scatter
    labels = rng.integers(0, c, (r, 1)).astype(np.int32)
    dz = built.labelled_vjp(t, labels, np.array(1.5, dtype=np.float32))
    tz = torch.tensor(t, dtype=torch.float64, requires_grad=True)
    picked = torch.take_along_dim(F.log_softmax(tz, -1), torch.tensor(labels).long(), -1)
    (-picked.sum() * 1.5).backward()
    np.testing.assert_allclose(dz, tz.grad.numpy(), rtol=1e-4, atol=1e-4)
    # slices and split_qkv (the cotangent written into zeros by the pad kernel), and the
    # one-pass row kernel of a softmax's gradient
    g = rng.standard_normal((2, r, 3)).astype(np.float32)
    dh = built.sliced_vjp(t, g)
    th = torch.tensor(t, dtype=torch.float64, requires_grad=True)
    q, k, v = th[:, 2:20].reshape(r, 3, 2, 3).permute(1, 2, 0, 3)
    out = torch.softmax(q, -1) * torch.tanh(k) + v * th[:, -3:]
    out.backward(torch.tensor(g, dtype=torch.float64))
    np.testing.assert_allclose(dh, th.grad.numpy(), rtol=1e-4, atol=1e-4)


#: The library's one-pass row kernels of the gradients of log-softmax and the norms, with
#: and without the weight: rows and columns that are multiples of no tile.
ROW_GRADIENTS = """\
@autodiff
def normed(x: Tensor["R", "C", f32], w: Tensor["C", f32], b: Tensor["C", f32],
           v: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return layernorm(x, w, b) + rmsnorm(x, v) * 2.0

@autodiff
def bare(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return layernorm(x) * 0.5 + rmsnorm(x)

@autodiff
def shifted(x: Tensor["B", "S", "C", f32], w: Tensor["C", f32],
            b: Tensor["C", f32]) -> Tensor["B", "S", "C", f32]:
    return layernorm(x, None, b) + layernorm(x * 2.0, w) * 0.5

@autodiff
def log_probs(z: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return log_softmax(z * 3.0, axis=-1)
"""


@pytest.mark.parametrize(("target", "arch"), every_target_beyond("cpu", "opencl"))
def test_row_gradient_kernels_match_torch_and_finite_differences(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``layernorm_grad``, ``rmsnorm_grad`` and ``log_softmax_grad`` give the inputs'
    cotangents, and with a weight or a bias each row's statistics, from which
    ``norm_param_grad`` gives the weights' and the biases' (with a weight and a bias,
    either alone, or neither; rows of a batch, 3 x 13; 37 rows of 203 or 75 columns: more
    than one block of rows, the last one ragged, on every target; and 5 rows, fewer
    than one step of ``norm_param_grad``'s), into outputs poisoned with NaN first."""
    graph = tessera.compile(ROW_GRADIENTS, filename="rows.tsr", until="graph").ir("graph")
    kinds = {op.kind for f in graph.functions for op in walk(f.body)}
    assert {"layernorm_grad", "rmsnorm_grad", "log_softmax_grad", "norm_param_grad"} <= kinds
    built = load_everywhere(ROW_GRADIENTS, target, arch, monkeypatch)
    rng = np.random.default_rng(5)
    for r, c in ((37, 203), (37, 75), (5, 75)):
        _check_row_gradients(built, rng, r, c)


def _check_row_gradients(built: Any, rng: np.random.Generator, r: int, c: int) -> None:
    """``ROW_GRADIENTS``' functions at ``r`` rows of ``c`` columns against torch in
    float64 and finite differences."""
    x, g = (rng.standard_normal((r, c)).astype(np.float32) * 2 for _ in range(2))
    w, b, v = (rng.standard_normal(c).astype(np.float32) for _ in range(3))
    tensors = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True)
               for n, a in {"x": x, "w": w, "b": b, "v": v}.items()}  # fmt: skip
    tx, tw, tb, tv = tensors.values()
    x3, g3 = (rng.standard_normal((3, 13, c)).astype(np.float32) * 2 for _ in range(2))
    t3 = torch.tensor(x3, dtype=torch.float64, requires_grad=True)
    cases = {
        "normed": ((x, w, b, v), _layernorm(tx, tw, tb) + _rmsnorm(tx, tv) * 2, tensors, g),
        "bare": ((x,), _layernorm(tx) * 0.5 + _rmsnorm(tx, 1.0), {"x": tx}, g),
        "shifted": ((x3, w, b), _layernorm(t3, None, tb) + _layernorm(t3 * 2, tw) * 0.5,
                    {"x": t3, "w": tw, "b": tb}, g3),
        "log_probs": ((x,), F.log_softmax(tx * 3, -1), {"x": tx}, g),
    }  # fmt: skip
    for name, (inputs, expected, wrt, cot) in cases.items():
        for t in (*tensors.values(), t3):
            t.grad = None
        out = tuple(np.full(a.shape, np.nan, np.float32) for a in inputs)
        grads = _tuple(
            getattr(built, f"{name}_vjp")(*inputs, cot, out=out[0] if len(out) == 1 else out)
        )
        expected.backward(torch.tensor(cot, dtype=torch.float64))
        for have, param in zip(grads, wrt.values(), strict=True):
            np.testing.assert_allclose(have, param.grad.numpy(), rtol=1e-4, atol=1e-4)
        named = dict(zip(["x", "w", "b", "v"], inputs, strict=False))
        assert_finite_differences(getattr(built, name), named, dict(zip(named, grads, strict=True)),
                                  (cot,), rng)  # fmt: skip


@pytest.mark.compile
@pytest.mark.parametrize("compiler", COMPILERS)
def test_row_gradients_cpu_code_compiles_warning_free(compiler: str, tmp_path: Path) -> None:
    assert_cpu_builds_warning_free(ROW_GRADIENTS, "rows.tsr", compiler, tmp_path)


@pytest.mark.compile
@pytest.mark.parametrize(("target", "arch"), [("cuda", "sm_80"), ("cuda", "sm_90a"),
                                              ("hip", "gfx90a")])  # fmt: skip
def test_row_gradients_gpu_code_compiles_warning_free(
    target: str, arch: str, tmp_path: Path
) -> None:
    """nvcc and hipcc, every warning an error: the norms' kernels of two results and
    ``norm_param_grad`` among them."""
    assert_gpu_builds_warning_free(ROW_GRADIENTS, "rows.tsr", target, arch, tmp_path)


def test_a_backward_kernel_that_no_schedule_fits_is_an_error_at_its_line() -> None:
    """At a head dim known only at run time, the head-dim tile is the widest, and the
    backward kernels hold two of them: gfx90a's 64 KiB of shared memory fit none."""
    source = ATTENTION.replace("16, f32", '"D", f32')
    with pytest.raises(tessera.CompileError) as caught:
        tessera.compile(source, filename="bad.tsr", target="hip", arch="gfx90a", until="sched")
    first = caught.value.diagnostics[0]
    assert first.span.line == 4 and "attention_stats fits the 65,536 bytes" in first.message


ATTENTION = """\
@autodiff
def attend(q: Tensor[1, 4, "S", 16, f32], k: Tensor[1, 2, "S", 16, f32],
           v: Tensor[1, 2, "S", 16, f32]) -> Tensor[1, 4, "S", 16, f32]:
    return flash_attention(q, k, v, causal=True)
"""


@pytest.mark.parametrize(
    ("target", "arch"),
    [pytest.param(*p.values, marks=[*p.marks, pytest.mark.exhaustive], id=p.id)
     if p.id == "opencl" else p
     for p in EVERY_TARGET if p.id in ("opencl", "sm_80")],
)  # fmt: skip
def test_attention_vjp_on_the_other_targets(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Causal grouped-query attention's gradients by the FlashAttention-2 backward
    kernels, at a length that is not a multiple of the tile (the CPU runs the other
    cases of attention)."""
    built = load_everywhere(ATTENTION, target, arch, monkeypatch)
    rng = np.random.default_rng(4)
    qkv = [rng.standard_normal((1, n, 37, 16)).astype(np.float32) for n in (4, 2, 2, 4)]
    grads = built.attend_vjp(*qkv)
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in qkv[:3])
    out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
    out.backward(torch.tensor(qkv[3], dtype=torch.float64))
    for have, want in zip(grads, (tq, tk, tv), strict=True):
        np.testing.assert_allclose(have, want.grad.numpy(), rtol=1e-4, atol=1e-4)


LONG_ATTENTION = """\
@autodiff
def attend(q: Tensor[1, 2, "S", 64, f32], k: Tensor[1, 2, "S", 64, f32],
           v: Tensor[1, 2, "S", 64, f32]) -> Tensor[1, 2, "S", 64, f32]:
    return flash_attention(q, k, v)

@autodiff
def attend_causal(q: Tensor[1, 2, "S", 64, f32], k: Tensor[1, 2, "S", 64, f32],
                  v: Tensor[1, 2, "S", 64, f32]) -> Tensor[1, 2, "S", 64, f32]:
    return flash_attention(q, k, v, causal=True)
"""


@pytest.mark.parametrize("seq", [77, 700])
def test_attention_vjp_over_many_blocks_on_the_cpu(seq: int) -> None:
    """Sequences of several blocks of queries and keys, ragged at the end: the causal
    backward skips the blocks that the mask empties (for the keys' gradients, the query
    blocks before a program's first key), which must not change the gradients."""
    lib = tessera.compile(LONG_ATTENTION, "long_attention.tsr", target="cpu").load()
    rng = np.random.default_rng(seq)
    qkvg = [rng.standard_normal((1, 2, seq, 64)).astype(np.float32) for _ in range(4)]
    for causal, fn in ((False, lib.attend_vjp), (True, lib.attend_causal_vjp)):
        grads = fn(*qkvg)
        tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in qkvg[:3])
        out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        out.backward(torch.tensor(qkvg[3], dtype=torch.float64))
        for have, want in zip(grads, (tq, tk, tv), strict=True):
            np.testing.assert_allclose(have, want.grad.numpy(), rtol=1e-4, atol=2e-4)


CROSS_ATTENTION = """\
@autodiff
def cross(q: Tensor["B", "M", 32, f32], k: Tensor["B", "N", 32, f32],
          v: Tensor["B", "N", 32, f32]) -> Tensor["B", "M", 32, f32]:
    return flash_attention(q, k, v)
"""


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_attention_vjp_with_more_keys_than_queries(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keys' and values' gradients are computed by programs that own blocks of keys:
    with keys over several blocks and queries in one, each key gets its gradients (the
    grid followed the queries, and left the keys past them unwritten); and the other
    way round. Results poisoned first."""
    built = load_everywhere(CROSS_ATTENTION, target, arch, monkeypatch)
    rng = np.random.default_rng(9)
    for queries, keys in ((40, 300), (300, 40)):
        q, g = (rng.standard_normal((2, queries, 32)).astype(np.float32) for _ in range(2))
        k, v = (rng.standard_normal((2, keys, 32)).astype(np.float32) for _ in range(2))
        out = tuple(np.full(a.shape, np.nan, np.float32) for a in (q, k, v))
        built.cross_vjp(q, k, v, g, out=out)
        tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
        F.scaled_dot_product_attention(tq, tk, tv).backward(torch.tensor(g, dtype=torch.float64))
        for have, want in zip(out, (tq, tk, tv), strict=True):
            np.testing.assert_allclose(have, want.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.exhaustive
@pytest.mark.parametrize(("target", "arch"), [("cuda", "sm_80"), ("cuda", "sm_90a"),
                                              ("hip", "gfx90a")])  # fmt: skip
def test_attention_backward_compiles_warning_free(target: str, arch: str, tmp_path: Path) -> None:
    """The backward kernels at head dim 64 through nvcc and hipcc, every warning an
    error."""
    source = ATTENTION.replace("16, f32", "64, f32")
    if target == "cuda":
        if NVCC is None:
            pytest.skip("needs nvcc (the CUDA toolkit)")
        _nvcc("attend.tsr", arch, tmp_path, source)
    else:
        if HIPCC is None:
            pytest.skip("needs hipcc (apt-get install hipcc)")
        _hipcc_warning_free(tessera.compile(source, "attend.tsr", target="hip").source, tmp_path)


def test_mean_absolute_error_differentiates() -> None:
    """The gradient of ``mean(abs(x - t))``: the difference is read by the mean's kernel
    (through a view) and by the gradient's, so the fusion keeps it in a kernel of its own
    before both, rather than in the gradient's kernel after the mean (a kernel reading a
    later kernel's value)."""
    source = (
        '@autodiff(wrt="x")\n'
        'def f(x: Tensor["N", "D", f32], t: Tensor["N", "D", f32]) -> Tensor[f32]:\n'
        "    return mean(abs(x - t))\n"
    )
    lib: Any = tessera.compile(source, "l1.tsr", target="cpu").load()
    rng = np.random.default_rng(8)
    x, t = (rng.standard_normal((5, 7)).astype(np.float32) for _ in range(2))
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    F.l1_loss(tx, torch.tensor(t, dtype=torch.float64)).backward()
    np.testing.assert_allclose(lib.f_vjp(x, t, np.ones((), np.float32)), tx.grad.numpy(), rtol=1e-5)
