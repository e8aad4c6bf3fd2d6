"""The numpy and PyTorch vocabulary of elementwise math and statistics (``floor``, ``log1p``,
``softplus``, ``var``, ``argmax``, ``zeros_like``...), on every target against PyTorch in
float64.

One source holds a function per op; each target builds it once. Inputs are ragged
(37 x 203, no multiple of any tile) and cover each op's interesting ranges: negative
values, zeros of both signs, values around 0 where ``log1p`` and ``expm1`` differ from
their naive forms, large ones where ``softplus`` turns linear and ``exp2`` nears
overflow, and NaN and infinities for the classifiers. Outputs are poisoned with NaN
first (with a large number for integer results), so that an element never written
shows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tessera
from tessera.transpiler.target.nvrtc import build
from tessera.transpiler.tile.interpret import run_function

from .builds import assert_cpu_builds_warning_free, assert_gpu_builds_warning_free
from .everywhere import every_target_beyond, load_everywhere
from .test_autodiff import assert_one_error
from .test_cpu import COMPILERS
from .test_cuda import needs_nvrtc
from .test_sycl import check_syntax, needs_sycl_headers

torch = pytest.importorskip("torch")
F = torch.nn.functional

R, C = 37, 203

#: Each op: its function's body (of ``x``, ``[R, C]`` f32; the function is ``of_`` the
#: name, since a function of the op's name would hide the op), the result's shape in .tsr
#: and its dtype, the same in PyTorch of a float64 tensor, and which inputs it reads.
Case = tuple[str, str, Callable[[Any], Any], str]
CASES: dict[str, Case] = {
    "floor": ("floor(x)", '"R", "C", f32', torch.floor, "wide"),
    "ceil": ("ceil(x)", '"R", "C", f32', torch.ceil, "wide"),
    "exp2": ("exp2(x)", '"R", "C", f32', torch.exp2, "exponent"),
    "log2": ("log2(x)", '"R", "C", f32', torch.log2, "positive"),
    "log1p": ("log1p(x)", '"R", "C", f32', torch.log1p, "above_minus_one"),
    "expm1": ("expm1(x)", '"R", "C", f32', torch.expm1, "exponent"),
    "erf": ("erf(x)", '"R", "C", f32', torch.erf, "wide"),
    "gelu": ("gelu(x, approximate=\"none\")", '"R", "C", f32', F.gelu, "wide"),
    "gelu_tanh": ("x.gelu() + gelu(x, approximate=True)", '"R", "C", f32',
                  lambda x: F.gelu(x, approximate="tanh") * 2, "wide"),
    "tan": ("tan(x)", '"R", "C", f32', torch.tan, "angle"),
    "sign": ("sign(x)", '"R", "C", f32', lambda x: torch.from_numpy(np.sign(x.numpy())),
             "special"),  # NaN of NaN, as numpy's (PyTorch's sign gives 0)
    "softplus": ("softplus(x)", '"R", "C", f32', F.softplus, "wide"),
    "softplus_beta": (
        "softplus(x, beta=2.0, threshold=10.0)", '"R", "C", f32',
        lambda x: F.softplus(x, beta=2.0, threshold=10.0), "wide",
    ),
    "square": ("square(x)", '"R", "C", f32', torch.square, "wide"),
    "reciprocal": ("reciprocal(x)", '"R", "C", f32', torch.reciprocal, "wide"),
    "leaky_relu": ("leaky_relu(x, 0.2)", '"R", "C", f32', lambda x: F.leaky_relu(x, 0.2),
                   "special"),
    "elu": ("elu(x, alpha=1.5)", '"R", "C", f32', lambda x: F.elu(x, 1.5), "wide"),
    "isnan": ("cast(isnan(x), f32)", '"R", "C", f32', lambda x: x.isnan().double(), "special"),
    "isinf": ("cast(isinf(x), f32)", '"R", "C", f32', lambda x: x.isinf().double(), "special"),
    "isfinite": ("cast(isfinite(x), f32)", '"R", "C", f32', lambda x: x.isfinite().double(),
                 "special"),
    "clip": ("clip(x, -1.5, None) + x.clip(max=0.5) + clip(x, -0.25, 0.25)", '"R", "C", f32',
             lambda x: x.clip(-1.5) + x.clip(max=0.5) + x.clip(-0.25, 0.25), "special"),
    "logsumexp": ("logsumexp(x, axis=-1)", '"R", f32', lambda x: torch.logsumexp(x, -1),
                  "wide"),
    "logsumexp_infinite": ("logsumexp(x, axis=-1)", '"R", f32',
                           lambda x: torch.logsumexp(x, -1), "infinite_rows"),
    "logsumexp_columns": ("x.logsumexp(axis=0, keepdims=True)", '1, "C", f32',
                          lambda x: torch.logsumexp(x, 0, keepdim=True), "wide"),
    "var": ("var(x, axis=-1)", '"R", f32', lambda x: x.var(-1, correction=0), "offset"),
    "var_ddof": ("x.var(axis=0, ddof=1)", '"C", f32', lambda x: x.var(0), "offset"),
    "std": ("std(x, axis=-1, keepdims=True, ddof=1)", '"R", 1, f32',
            lambda x: x.std(-1, keepdim=True), "offset"),
    "std_all": ("std(x)", "f32", lambda x: x.std(correction=0), "offset"),
    "argmax": ("argmax(x, axis=-1)", '"R", i32', lambda x: x.argmax(-1), "ties"),
    "argmin": ("x.argmin(axis=0)", '"C", i32', lambda x: x.argmin(0), "ties"),
    "argmax_keep": ("argmax(x, axis=0, keepdims=True)", '1, "C", i32',
                    lambda x: x.argmax(0, keepdim=True), "ties"),
    "norm": ("x.norm(dim=-1, keepdim=True)", '"R", 1, f32',
             lambda x: torch.linalg.norm(x, dim=-1, keepdim=True), "wide"),
    "norm_orders": ("norm(x, 1, axis=0) + norm(x, inf, axis=0) + x.norm(p=2, dim=0)", '"C", f32',
                    lambda x: x.norm(1, 0) + x.abs().amax(0) + x.norm(2, 0), "wide"),
    "norm_all": ("norm(x)", "f32", torch.linalg.norm, "wide"),
    "zeros_like": ("zeros_like(x) + 1.0", '"R", "C", f32', lambda x: torch.zeros_like(x) + 1,
                   "special"),
    "ones_like": ("ones_like(x, dtype=i32)", '"R", "C", i32',
                  lambda x: torch.ones_like(x, dtype=torch.int32), "special"),
    "full_like": ("full_like(x, -2.5)", '"R", "C", f32', lambda x: torch.full_like(x, -2.5),
                  "special"),
}  # fmt: skip

SOURCE = "\n".join(
    f'def of_{name}(x: Tensor["R", "C", f32]) -> Tensor[{result}]:\n    return {body}\n'
    for name, (body, result, _, _) in CASES.items()
)


def _inputs(kind: str, rng: np.random.Generator) -> np.ndarray:
    """Inputs of ``[R, C]`` for one range of values."""
    normal = rng.standard_normal((R, C))
    if kind == "wide":  # negatives, around 0, and large both ways (softplus turns linear)
        x = normal * np.where(rng.random((R, C)) < 0.5, 1.0, 30.0)
        x.flat[:6] = [0.0, -0.0, 1e-4, -1e-4, 80.0, -80.0]
    elif kind == "exponent":  # expm1 near 0 and exp2 near f32's largest
        x = normal * np.where(rng.random((R, C)) < 0.5, 1e-3, 20.0)
        x.flat[:4] = [0.0, -0.0, 127.5, -140.0]
    elif kind == "positive":
        x = np.exp(normal * 8.0)
    elif kind == "above_minus_one":
        x = np.expm1(normal * 3.0)
        x.flat[:3] = [1e-7, -1e-7, 0.0]
    elif kind == "angle":  # away from the poles, where any rounding of x is amplified
        x = rng.uniform(-1.4, 1.4, (R, C)) + np.pi * rng.integers(-3, 4, (R, C))
    elif kind == "infinite_rows":  # rows of -inf, and rows holding inf or some -inf
        x = normal * 50.0
        x[::3] = -np.inf
        x[1::3, 7] = np.inf
        x[2::3, ::2] = -np.inf
    elif kind == "offset":  # a mean far from 0: a one-pass variance cancels
        x = 1000.0 + normal
    elif kind == "ties":  # repeated maxima and minima: the first one's index wins
        x = rng.integers(-3, 4, (R, C)).astype(np.float64)
    else:  # special: NaN, infinities and zeros of both signs among normals
        x = normal * 3.0
        specials = [np.nan, np.inf, -np.inf, 0.0, -0.0]
        picked = rng.random((R, C)) < 0.1
        x[picked] = rng.choice(specials, picked.sum())
    return x.astype(np.float32)


#: The targets: the CPU, OpenCL and CUDA on the simulated GPU here, the rest exhaustive.
TARGETS = [
    pytest.param(p.values, marks=p.marks, id=p.id)
    for p in every_target_beyond("cpu", "opencl", "sm_80")
]


@pytest.fixture(scope="module", params=TARGETS)
def built(request: pytest.FixtureRequest) -> Any:
    """Every op's function, built once for the target."""
    target, arch = request.param
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield load_everywhere(SOURCE, target, arch, monkeypatch)


def _expected(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The case's input, and its reference rounded to f32 (which overflows where the
    result should), or its integer result."""
    _, _, reference, kind = CASES[name]
    x = _inputs(kind, np.random.default_rng(list(CASES).index(name)))
    want = reference(torch.tensor(x, dtype=torch.float64)).numpy()
    if not np.issubdtype(want.dtype, np.integer):
        with np.errstate(over="ignore"):
            want = want.astype(np.float32).astype(np.float64)
    return x, want


def _assert_matches(name: str, have: np.ndarray, want: np.ndarray) -> None:
    if np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(have, want)
        return
    assert not np.isnan(have[~np.isnan(want)]).any(), "some outputs were never written"
    # f32 arithmetic: a few ulps of each result (erf's and tan's libraries differ by a few)
    rtol = 2e-5 if CASES[name][3] == "angle" else 4e-6
    # GELU below about -3 is x times a tail (of erf, or of tanh) that 1 + erf and 1 + tanh
    # round away in f32, as PyTorch's own f32 GELU does; PoCL's tanh of -80 is 2 ulp
    # above -1, which leaves 80 * 1e-7 of the tail there
    atol = 1e-5 if name.startswith("gelu") else 1e-30
    np.testing.assert_allclose(have, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", list(CASES))
def test_op_matches_torch(built: Any, name: str) -> None:
    x, want = _expected(name)
    integer = np.issubdtype(want.dtype, np.integer)
    poison = np.full(want.shape, 12345 if integer else np.nan, np.int32 if integer else np.float32)
    _assert_matches(name, getattr(built, f"of_{name}")(x, out=poison), want)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's, of inf and NaN inputs
def test_the_tile_interpreter_computes_each_op() -> None:
    """The reference semantics of the Tile IR (``tile/interpret.py``), on the CPU's kernels,
    including the reductions along the first axis or over every axis, whose kernels read
    their input through a transposed or flattened view of another kernel's tensor."""
    module = tessera.compile(SOURCE, "ops.tsr", target="cpu", until="tile").ir("tile")
    for name in CASES:
        x, want = _expected(name)
        out = run_function(module, f"of_{name}", {"x": x})["out"]
        _assert_matches(name, out.reshape(want.shape), want)


def test_integer_inputs() -> None:
    """``floor`` and ``ceil`` of integers are the integers (numpy 2's, PyTorch's); ``sign``,
    ``square`` and ``abs`` keep the dtype; ``var`` of integers is a float; an integer is never NaN,
    and ``argmax`` picks among integers too."""
    source = """\
def f(n: Tensor["R", "C", i32]) -> Tensor["R", "C", i32]:
    return floor(n) + ceil(n) * 2 + sign(n) * 4 + square(n) + abs(n) * 3

def g(n: Tensor["R", "C", i32]) -> Tensor["R", f32]:
    return var(n, axis=-1) + cast(argmax(n, axis=-1), f32) + sum(cast(isnan(n), f32), axis=-1)
"""
    built = tessera.compile(source, filename="ints.tsr", target="cpu").load()
    n = np.random.default_rng(1).integers(-50, 50, (R, C)).astype(np.int32)
    np.testing.assert_array_equal(built.f(n), n + n * 2 + np.sign(n) * 4 + n * n + abs(n) * 3)
    want = np.var(n.astype(np.float64), axis=-1) + np.argmax(n, axis=-1)
    np.testing.assert_allclose(built.g(n), want, rtol=1e-5)


def test_argmax_carries_no_gradient() -> None:
    """An index is an integer: differentiated through, it contributes nothing, as in
    PyTorch, and the gradient flows through the rest."""
    source = """\
@autodiff
def f(x: Tensor["R", "C", f32]) -> Tensor["R", f32]:
    return cast(argmax(x, axis=1), f32) * x[:, 0] + var(x, axis=1)
"""
    built = tessera.compile(source, filename="grad.tsr", target="cpu").load()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((R, C)).astype(np.float32)
    g = rng.standard_normal(R).astype(np.float32)
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    (t.argmax(1).double() * t[:, 0] + t.var(1, correction=0)).backward(torch.tensor(g).double())
    np.testing.assert_allclose(built.f_vjp(x, g), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_steps_have_zero_gradient() -> None:
    """``floor``, ``ceil`` and ``sign`` pass no gradient back, as in PyTorch (finite
    differences across a step would see its jump: the check is against autograd)."""
    source = """\
@autodiff
def f(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return floor(x * 2.0) * x + ceil(x) + sign(x) * x + floor(x) * ceil(x)
"""
    built = tessera.compile(source, filename="steps.tsr", target="cpu").load()
    rng = np.random.default_rng(6)
    x, g = (rng.standard_normal((R, C)).astype(np.float32) * 3 for _ in range(2))
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y = torch.floor(t * 2) * t + torch.ceil(t) + torch.sign(t) * t + torch.floor(t) * torch.ceil(t)
    y.backward(torch.tensor(g, dtype=torch.float64))
    np.testing.assert_allclose(built.f_vjp(x, g), t.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_norm_gradient_against_torch_with_a_zero_row() -> None:
    """``norm``'s gradient, against autograd and a central difference: a zero row gets
    0, as PyTorch's (sqrt's infinite slope there would make it NaN)."""
    source = """\
@autodiff
def f(x: Tensor["R", "C", f32]) -> Tensor["R", f32]:
    return x.norm(dim=-1) + norm(x, 1, axis=-1) * 0.5
"""
    built = tessera.compile(source, filename="norm.tsr", target="cpu").load()
    rng = np.random.default_rng(8)
    x, g = rng.standard_normal((R, C)).astype(np.float32), rng.standard_normal(R).astype(np.float32)
    x[3] = 0.0
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    (torch.linalg.norm(t, dim=-1) + t.abs().sum(-1) * 0.5).backward(torch.tensor(g).double())
    have = built.f_vjp(x, g)
    np.testing.assert_allclose(have, t.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert not np.isnan(have).any() and np.all(have[3] == g[3] * 0.5 * np.sign(0.0))
    step = np.zeros_like(x)
    step[5, 7] = 1e-2
    slope = (built.f(x + step) - built.f(x - step)).astype(np.float64) @ g / 2e-2
    np.testing.assert_allclose(slope, have[5, 7], rtol=2e-2)


def test_argmax_of_nan() -> None:
    """NaN is the largest value for ``argmax`` and the smallest for ``argmin``... as numpy and
    PyTorch have it: the first NaN of a row is both its argmax and its argmin."""
    source = """\
def f(x: Tensor["R", "C", f32]) -> Tensor["R", i32]:
    return argmax(x, axis=-1) + argmin(x, axis=-1) * 1000
"""
    built = tessera.compile(source, filename="nan.tsr", target="cpu").load()
    x = np.random.default_rng(2).standard_normal((R, C)).astype(np.float32)
    x[3, [17, 40]] = np.nan
    x[5, :] = np.nan
    x[6, 0] = np.nan
    x[7, 9] = np.inf
    x[7, 11] = -np.inf
    want = np.argmax(x, axis=-1) + np.argmin(x, axis=-1) * 1000
    np.testing.assert_array_equal(built.f(x), want)


BAD = {
    "exp2 of an integer": (
        "def f(n: Tensor['N', i32]) -> Tensor['N', f32]:\n    return exp2(n)\n",
        2, "exp2: needs a floating-point input; n is i32",
    ),
    "softplus beta": (
        "def f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return softplus(x, beta=0.0)\n",
        2, "softplus: 'beta' must be positive, not 0.0",
    ),
    "ddof": (
        "def f(x: Tensor[4, 3, f32]) -> Tensor[4, f32]:\n    return var(x, axis=1, ddof=3)\n",
        2, "var: ddof=3 leaves 0 degrees of freedom",
    ),
    "torch's correction": (
        "def f(x: Tensor[4, 3, f32]) -> Tensor[4, f32]:\n"
        "    return var(x, axis=1, correction=1)\n",
        2, "did you mean 'ddof'?",
    ),
    "fill value": (
        "def f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return full_like(x, x)\n",
        2, "full_like: 'fill_value' must be a number or a scalar parameter",
    ),
    "mask result": (
        "def f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return isnan(x)\n",
        2, "returns bool, but the declared result is f32; convert it with cast(..., f32)",
    ),
    "square of a mask": (
        "def f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return square(x > 0.0)\n",
        2, "square: x > 0.0 is a mask (a comparison)",
    ),
    "tile sum of a mask": (
        "@kernel\ndef f(x: Tensor['R', 'C', f32]) -> Tensor['R', f32]:\n"
        "    T = tile.context()\n"
        "    return tile.sum(tile.load(x, rows=T.m) > 0.0, axis=1)\n",
        4, "which only tile.where() and tile.cast() read: tile.where(tile.load(x, rows=T.m) "
        "> 0.0, a, b) picks a or b",
    ),
    "norm order": (
        "def f(x: Tensor['N', f32]) -> Tensor[f32]:\n    return norm(x, 3)\n",
        2, "norm: ord=3 is not a vector norm it computes: 2 (the default), 1 or inf",
    ),
    "argmax of a tuple": (
        "def f(x: Tensor[4, 3, f32]) -> Tensor[f32]:\n    return argmax(x, axis=(0, 1))\n",
        2, "argmax: 'axis' must be an integer",
    ),
    "clip without bounds": (
        "def f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return clip(x, None, None)\n",
        2, "clip: needs a bound: clip(x, min, max)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_an_error_at_its_line(case: str) -> None:
    assert_one_error(*BAD[case])


@pytest.mark.compile
@pytest.mark.parametrize("compiler", COMPILERS)
def test_cpu_code_compiles_warning_free(compiler: str, tmp_path: Path) -> None:
    assert_cpu_builds_warning_free(SOURCE, "ops.tsr", compiler, tmp_path)


@pytest.mark.compile
@pytest.mark.parametrize(("target", "arch"), [("cuda", "sm_80"), ("cuda", "sm_90a"),
                                              ("hip", "gfx90a")])  # fmt: skip
def test_gpu_code_compiles_warning_free(target: str, arch: str, tmp_path: Path) -> None:
    """nvcc and hipcc, every warning an error."""
    assert_gpu_builds_warning_free(SOURCE, "ops.tsr", target, arch, tmp_path)


@pytest.mark.compile
@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvrtc_builds_the_cuda_code(arch: str) -> None:
    """NVRTC, as the runtime builds the file, with the metadata's options: a warning in
    ptxas's report is a failure too."""
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
    """The elementwise compositions are one elementwise kernel with the unary math; a
    variance over rows two row reductions (the mean, then the squares' with the
    deviations computed as they load); logsumexp the library's one row kernel; argmax a
    row maximum and a row reduction of the key."""
    elementwise = """\
def f(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    a = softplus(x) + leaky_relu(x) + elu(x) + sign(x) + clip(x, -1.0, 1.0) + square(x)
    b = reciprocal(x) + floor(x) + log1p(x) + erf(x) + cast(isnan(x), f32) + ones_like(x)
    return a + b + full_like(x, 2.0)
"""
    assert _kernels(elementwise) == ["elementwise"]
    rows = 'def f(x: Tensor["R", "C", f32]) -> Tensor["R", {}]:\n    return {}\n'
    assert _kernels(rows.format("f32", "logsumexp(x)")) == ["reduction"]
    assert _kernels(rows.format("i32", "argmax(x, axis=-1)")) == ["reduction", "reduction"]
    for moment in ("var(x, axis=-1)", "std(x, axis=-1, ddof=1)"):  # the mean, the squares'
        assert _kernels(rows.format("f32", moment)) == ["reduction", "reduction"]
