"""A graph function calls the file's own tile kernels, as PyTorch code calls a Triton
kernel: each call is a ``tile_call`` op, a launch of the kernel typed for its arguments,
with the kernel's own schedule, whose elementwise neighbours after it become its
epilogue; the kernel stays an entry point of its own too (docs/tile-kernels.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tessera
from tessera.transpiler.frontend.diagnostics import CompileError

from .everywhere import every_target_beyond, load_everywhere
from .reference import BF16, f64
from .test_cpu import COMPILERS, STRICT

SOURCE = """\
@kernel
def scaled_softmax(x: Tensor["R", "C", f32], scale: float) -> Tensor["R", "C", f32]:
    T = tile.context()
    rows = tile.load(x, rows=T.m) * scale
    e = tile.exp(rows - tile.max(rows, axis=1)[:, None])
    return e / tile.sum(e, axis=1)[:, None]

def model(x: Tensor["R", "C", f32], w: Tensor["C", "D", f32], s: float) -> Tensor["R", "D", f32]:
    return scaled_softmax(x, s) @ w

@kernel
def linear(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32],
           bias: Tensor["N", f32]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(a.shape[1], T.k):
        acc += tile.dot(tile.load(a, rows=T.m, cols=kb), tile.load(b, kb, cols=T.n))
    return acc + tile.load(bias, cols=T.n)[None, :]

def mlp(x: Tensor["B", "E", f32], w1: Tensor["E", "H", f32], b1: Tensor["H", f32],
        w2: Tensor["H", "O", f32], b2: Tensor["O", f32]) -> Tensor["B", "O", f32]:
    return linear(relu(linear(x, w1, b1)), w2, b2)

def row_stats(x: Tensor["B", "E", f32], w: Tensor["E", "H", f32], b: Tensor["H", f32],
              r: Tensor["B", "H", f32]) -> Tensor["B", f32]:
    return sum(tanh(linear(x, w, b) * 2.0 + r), axis=1)

@kernel
def shifted(x: Tensor["R", "C", f32], scale: float, *, shift: float = 0.5,
            flip: bool = False) -> Tensor["R", "C", f32]:
    T = tile.context()
    t = tile.load(x, rows=T.m) * scale + shift
    if flip:
        t = 0.0 - t
    return t

def scalars(x: Tensor["R", "C", f32], s: float, f: bool) -> Tensor["R", "C", f32]:
    return shifted(x, s) + shifted(x, 3.0, flip=True, shift=s) + shifted(x, 2, flip=f)

@kernel
def add_bias(x: Tensor["R", "C", f32], b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    T = tile.context()
    return tile.load(x, rows=T.m) + tile.load(b)[None, :]

def guarded(x: Tensor["N", "C", f32], b: Tensor["E", f32]) -> Tensor["N", "C", f32]:
    return add_bias(x, b)

@kernel
def row_sum(x: Tensor["B", "R", "C", f32]) -> Tensor["B", "R", f32]:
    T = tile.context()
    return tile.sum(tile.load(x, rows=T.m), axis=1)

def row_sums(x: Tensor["B", "R", "C", f32], b: Tensor["R", f32]) -> Tensor["B", "R", f32]:
    return row_sum(x) * 2.0 + b

@kernel
def times(x: Tensor["R", "C", f32], n: int) -> Tensor["R", "C", f32]:
    T = tile.context()
    return tile.load(x, rows=T.m) * float(n)

def int_scalars(x: Tensor["R", "C", f32], k: int) -> Tensor["R", "C", f32]:
    return times(x, 3) + times(x, n=k)

def residual(x: Tensor["R", "C", f32]) -> Tensor["R", "C", bf16]:
    return cast(scaled_softmax(x * 2.0, scale=0.5) + x, bf16)
"""


def _poisoned(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    return np.full(shape, np.nan, dtype=dtype)


def _check(
    fn: Any, args: tuple, want: np.ndarray, rtol: float = 1e-5, dtype: Any = np.float32
) -> None:
    """``fn`` on ``args`` into a result of ``dtype`` poisoned first, against the float64
    ``want``."""
    out = _poisoned(want.shape, dtype)
    fn(*args, out=out)
    got = f64(out)
    assert not np.isnan(got).any(), "some outputs were never written"
    error = np.abs(got - want).max() / np.abs(want).max()
    assert error < rtol, f"relative error {error:.2e}"


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _shifted(x: np.ndarray, scale: float, shift: float = 0.5, flip: bool = False) -> np.ndarray:
    y = f64(x) * scale + shift
    return -y if flip else y


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), every_target_beyond("cpu", "opencl", "sm_80"))
def test_graph_functions_call_tile_kernels(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib: Any = load_everywhere(SOURCE, target, arch, monkeypatch)
    rng = np.random.default_rng(17)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    R, C, D = 37, 53, 29
    x, w = rand(R, C), rand(C, D)
    _check(lib.model, (x, w, 0.7), _softmax(f64(x) * 0.7) @ f64(w))
    _check(lib.scaled_softmax, (x, 0.7), _softmax(f64(x) * 0.7))  # still an entry point

    # one kernel with a K loop, called twice with other shapes, the first with an epilogue
    B, E, H, O = 19, 45, 70, 21
    x, w1, b1, w2, b2 = rand(B, E), rand(E, H), rand(H), rand(H, O), rand(O)
    hidden = np.maximum(f64(x) @ f64(w1) + f64(b1), 0.0)
    _check(lib.mlp, (x, w1, b1, w2, b2), hidden @ f64(w2) + f64(b2), rtol=1e-4)

    # the result's epilogue (a number and a tensor), then a reduction of it
    r = rand(B, H)
    want = np.tanh((f64(x) @ f64(w1) + f64(b1)) * 2.0 + f64(r)).sum(axis=1)
    _check(lib.row_stats, (x, w1, b1, r), want, rtol=1e-4)

    # scalars: run-time and constant, positional and keyword-only, defaults
    x = rand(R, C)
    for flag in (False, True):
        want = _shifted(x, 0.3) + _shifted(x, 3.0, 0.3, True) + _shifted(x, 2.0, flip=flag)
        _check(lib.scalars, (x, 0.3, flag), want)

    # an int scalar, a number and the caller's
    _check(lib.int_scalars, (x, 5), f64(x) * 8.0)

    # a kernel of one value per row, over a batch, with an epilogue that loads a vector
    x3, b = rand(3, R, C), rand(R)
    _check(lib.row_sum, (x3,), f64(x3).sum(axis=2))
    _check(lib.row_sums, (x3, b), f64(x3).sum(axis=2) * 2.0 + f64(b))

    # an argument computed by a kernel before, and an epilogue that reads a tensor and
    # casts to bf16
    want = _softmax(f64(x) * 2.0 * 0.5) + f64(x)
    _check(lib.residual, (x,), want, rtol=1e-2, dtype=BF16)

    # the sizes a guard checks agree at run time
    b = rand(C)
    _check(lib.guarded, (x, b), f64(x) + f64(b))
    with pytest.raises(ValueError, match=r"E = 52 breaks E == C = 53 \(add_bias\(\): 'b' shape\)"):
        lib.guarded(x, rand(C - 1), out=_poisoned((R, C)))


@pytest.mark.unit
def test_a_call_is_one_op_and_a_launch_with_an_epilogue() -> None:
    program = tessera.compile(SOURCE, filename="calls.tsr", target="cpu")
    graph = program.inspect_ir("graph")
    mlp = graph[graph.index("func @mlp") :]
    assert re.search(r"kernel k0 tile_call \{\n.*tile_call %x, %w1, %b1 \{kernel = linear, "
                     r"params = \(a, b, bias\), constants = \(\)\}.*\n.*relu", mlp)  # fmt: skip
    scalars = graph[graph.index("func @scalars") :]
    assert "params = (x, shift), constants = ((scale, 3.0), (flip, true))" in scalars
    assert "params = (x, flip), constants = ((scale, 2.0), (shift, 0.5))" in scalars
    tile = program.inspect_ir("tile")
    assert "kernel @mlp_k0 (tile_call, the tile kernel linear)" in tile
    assert "launch k0 of mlp: the tile kernel linear" in program.source


SCHEDULED = """\
@kernel.schedule(Schedule(block=(64, 64), k=16, warps=4))
def product(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(a.shape[1], T.k):
        acc += tile.dot(tile.load(a, rows=T.m, cols=kb), tile.load(b, kb, cols=T.n))
    return acc

@kernel.autotune(space=dict(BM=[8, 16], warps=[1, 2]))
def double(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    T = tile.context()
    return tile.load(x, rows=T.m) * 2.0

def both(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return double(product(a, b))

@kernel
def plain(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    T = tile.context()
    return tile.load(x, rows=T.m) * 2.0

def calls_plain(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return plain(x)
"""


def _launch_lines(sched: str, function: str) -> list[str]:
    """Where each of ``function``'s launches takes its schedule from, and its tiles."""
    host = sched[sched.index(f"host @{function} ") :]
    host = host[: host.index("\n}")]
    return [line.split("  schedule")[-1] for line in host.splitlines()
            if "schedule" in line or "tiles" in line]  # fmt: skip


@pytest.mark.unit
@pytest.mark.parametrize(("target", "arch"), [("cpu", None), ("cuda", "sm_80")])
def test_a_call_takes_the_kernels_own_schedule(target: str, arch: str | None) -> None:
    sched = tessera.compile(SCHEDULED, filename="s.tsr", target=target, arch=arch).inspect_ir(
        "sched"
    )
    both = _launch_lines(sched, "both")
    product, double = _launch_lines(sched, "product"), _launch_lines(sched, "double")
    assert both[: len(product)] == product and "explicit" in product[0]
    assert both[len(product) :] == double and "space" in double[0]
    assert _launch_lines(sched, "calls_plain") == _launch_lines(sched, "plain")


@pytest.mark.compile
@pytest.mark.parametrize("compiler", COMPILERS)
def test_generated_cpp_compiles_warning_free(compiler: str, tmp_path: Path) -> None:
    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    cpp = tmp_path / "k.cpp"
    cpp.write_text(tessera.compile(SOURCE + SCHEDULED, filename="c.tsr", target="cpu").source)
    done = subprocess.run([compiler, *STRICT, *COMPILERS[compiler], str(cpp)],
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_generated_cuda_compiles_warning_free(arch: str, tmp_path: Path) -> None:
    from .test_cuda import _nvcc, needs_nvcc

    if needs_nvcc.args[0]:
        pytest.skip(needs_nvcc.kwargs["reason"])
    _nvcc("c.tsr", arch, tmp_path, SOURCE + SCHEDULED)


@pytest.mark.compile
@pytest.mark.exhaustive  # hipcc takes minutes of a core
def test_generated_hip_compiles_warning_free(tmp_path: Path) -> None:
    from .test_hip import HIPCC, _hipcc_warning_free

    if HIPCC is None:
        pytest.skip("needs hipcc")
    source = tessera.compile(SOURCE + SCHEDULED, filename="c.tsr", target="hip", arch="gfx90a")
    _hipcc_warning_free(source.source, tmp_path)


KERNEL = """\
@kernel
def add_bias(x: Tensor["R", "C", f32], b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    T = tile.context()
    return tile.load(x, rows=T.m) + tile.load(b)[None, :]

"""


def _errors(source: str) -> list[str]:
    with pytest.raises(CompileError) as info:
        tessera.compile(source, filename="e.tsr", target="cpu")
    return [f"{d.span.line}:{d.span.column}: {d.message}" for d in info.value.diagnostics]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("caller", "message"),
    [
        (
            'def f(x: Tensor["N", 16, f32], b: Tensor[8, f32]) -> Tensor["N", 16, f32]:\n'
            "    return add_bias(x, b)\n",
            "7:24: add_bias(): 'b' is [C] f32, given [8] f32",
        ),
        (
            'def f(x: Tensor["N", 16, f32], b: Tensor[16, bf16]) -> Tensor["N", 16, f32]:\n'
            "    return add_bias(x, b)\n",
            "7:24: add_bias(): 'b' is [C] f32, given [16] bf16",
        ),
        (
            "def f(x: Tensor[16, f32], b: Tensor[16, f32]) -> Tensor[16, f32]:\n"
            "    return add_bias(x, b)\n",
            "7:21: add_bias(): 'x' is [R, C] f32, given [16] f32",
        ),
        (
            "@kernel\n"
            'def pair(x: Tensor["R", "C", f32], y: Tensor["C", "R", f32]) -> Tensor["R", f32]:\n'
            "    T = tile.context()\n"
            "    return tile.sum(tile.load(x, rows=T.m), axis=1)\n\n"
            'def f(x: Tensor["N", "M", f32]) -> Tensor["N", f32]:\n'
            "    return pair(x, x)\n",
            "12:20: pair(): one tensor is passed as 'x' and as 'y', which the kernel declares "
            "with other dims; pass a copy as one",
        ),
    ],
    ids=["size", "dtype", "rank", "one-tensor-twice"],
)
def test_arguments_that_do_not_fit_are_errors_at_the_call(caller: str, message: str) -> None:
    assert _errors(KERNEL + caller) == [message]


@pytest.mark.unit
def test_a_kernel_that_returns_nothing_is_not_called() -> None:
    source = """\
@kernel
def fill(x: Tensor["N", f32], y: Tensor["N", f32]):
    T = tile.context()
    tile.store(y, tile.load(x, rows=T.m) * 2.0)

def f(x: Tensor["N", f32], y: Tensor["N", f32]) -> Tensor["N", f32]:
    fill(x, y)
    return y + 1.0
"""
    (error,) = _errors(source)
    assert error.startswith("7:5: fill() is a tile kernel that returns nothing: called from a "
                            "graph function it would store into its arguments")  # fmt: skip
    assert "declare the result ('-> Tensor[...]')" in error


@pytest.mark.unit
def test_a_kernel_that_stores_into_an_argument_is_not_called() -> None:
    source = """\
@kernel
def both(x: Tensor["N", f32], y: Tensor["N", f32]) -> Tensor["N", f32]:
    T = tile.context()
    t = tile.load(x, rows=T.m)
    tile.store(y, t * 2.0)
    return t

def f(x: Tensor["N", f32], y: Tensor["N", f32]) -> Tensor["N", f32]:
    return both(x, y) + y
"""
    (error,) = _errors(source)
    assert error.startswith("9:12: both() stores into its argument 'y': called from a graph "
                            "function it would change a graph value in place")  # fmt: skip


@pytest.mark.unit
def test_a_call_of_a_kernel_with_an_error_says_so_at_the_call() -> None:
    source = """\
def model(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return bad(x) + 1.0

@kernel
def bad(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    T = tile.context()
    return tile.load(x, rows=T.m) * undefined_name
"""
    assert _errors(source) == [
        "2:12: bad() has an error: unknown name 'undefined_name'",
        "7:37: unknown name 'undefined_name'",
    ]


@pytest.mark.unit
def test_a_tile_kernel_calls_no_function() -> None:
    source = KERNEL + """\
@kernel
def twice(x: Tensor["R", "C", f32], b: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    T = tile.context()
    return add_bias(x, b) * 2.0
"""
    (error,) = _errors(source)
    assert error.startswith(
        "9:12: add_bias() is another tile kernel, called from a tile kernel: a tile "
        "kernel's body is one program of its launch"
    )
    assert "call both from a graph function" in error


DIFFERENTIATED = """\
@kernel
def square(x: Tensor["N", f32]) -> Tensor["N", f32]:
    T = tile.context()
    t = tile.load(x, rows=T.m)
    return t * t

@autodiff
def loss(x: Tensor["N", f32]) -> Tensor[f32]:
    return sum(square(x) * 3.0)
"""


@pytest.mark.unit
def test_differentiating_a_tile_kernel_needs_its_rule() -> None:
    (error,) = _errors(DIFFERENTIATED)
    assert error.startswith("9:16: cannot differentiate square(): it is a tile kernel")
    assert "@custom_vjp(square_vjp) on the kernel" in error


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), every_target_beyond("cpu", "opencl", "sm_80"))
def test_a_tile_kernel_with_a_custom_vjp_is_differentiated_by_it(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rule = (
        'def square_vjp(x: Tensor["N", f32], g: Tensor["N", f32]) -> Tensor["N", f32]:\n'
        "    return 2.0 * x * g\n\n"
    )
    source = rule + DIFFERENTIATED.replace("@kernel\n", "@kernel\n@custom_vjp(square_vjp)\n")
    lib: Any = load_everywhere(source, target, arch, monkeypatch)
    x = np.random.default_rng(3).standard_normal(1001).astype(np.float32)
    _check(lib.loss, (x,), np.array(3.0 * (f64(x) ** 2).sum()))
    _check(lib.loss_vjp, (x, np.array(0.5, dtype=np.float32)), 6.0 * f64(x) * 0.5)


@pytest.mark.unit
def test_a_schedule_that_cannot_run_is_said_once() -> None:
    """The kernel's schedule serves its calls too: its problem is reported at the
    decorator once, not once a launch."""
    source = SCHEDULED.replace("block=(64, 64)", "block=(16, 32)")
    with pytest.raises(CompileError) as info:
        tessera.compile(source, filename="s.tsr", target="hip", arch="gfx90a")
    (error,) = info.value.diagnostics
    assert error.message.startswith("schedule for 'product' cannot run: block (16, 32)")
    assert error.span.line == 1
