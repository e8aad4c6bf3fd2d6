"""Elementwise kernels that write several results: a chain whose intermediate the
function also returns, or a later kernel reads, is one kernel that stores each value
where it computes it, and ``fused_adam`` is one kernel that writes the parameter and
both moments (and the f32 master). Every target, against float64 (and
``torch.optim.AdamW``), on ragged sizes with the outputs poisoned first; the launch
counts are the compiled module's, which were larger when a kernel wrote one value.
On an ``OptimizerState`` that kernel writes the donated state's own arrays on every
target, the SIMT kernels through one pointer per tensor: one launch a step, no copy.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.runtime import optstate, telemetry
from tessera.runtime.entry import Entry

from .conftest import ROOT
from .everywhere import EVERY_TARGET, every_target_beyond, load_everywhere
from .gpusim import DeviceArray, simulated_cupy, use_simulator
from .reference import f64
from .test_cuda import needs_gxx
from .test_loader import _loader_module

pytestmark = pytest.mark.execute

BF16 = ml_dtypes.bfloat16
#: Ragged sizes: multiples of no tile any schedule picks.
R, C, N = 37, 53, 1031

SOURCE = """\
def pair(x: Tensor["R", "C", f32], y: Tensor["R", "C", f32]
         ) -> tuple[Tensor["R", "C", f32], Tensor["R", "C", f32]]:
    a = x * y
    b = exp(a) + 1.0
    return a, b

def rows_too(x: Tensor["R", "C", f32], y: Tensor["R", "C", f32]
             ) -> tuple[Tensor["R", "C", bf16], Tensor["R", f32]]:
    a = x * y
    b = cast(tanh(a) * y, bf16)
    return b, sum(a * 0.5, axis=-1) + max(a, axis=-1)

def three(x: Tensor["N", f32], bias: Tensor["N", f32]
          ) -> tuple[Tensor["N", f32], Tensor["N", f32], Tensor["N", f32]]:
    h = x + bias
    s = sigmoid(h)
    return s, h * s, h

def product_kept(x: Tensor["R", "C", f32], w: Tensor["C", "C", f32]
                 ) -> tuple[Tensor["R", "C", f32], Tensor["R", "C", f32]]:
    h = x @ w
    return h, relu(h)
"""

#: Launches per function: one kernel for each chain of elementwise ops however many
#: of its values are results; a product's kernel still writes one value.
LAUNCHES = {"pair": 1, "rows_too": 3, "three": 1, "product_kept": 2}


def _launches(program: tessera.Program, name: str) -> int:
    meta = program.ir("meta")
    return len(next(f for f in meta["functions"] if f["name"] == name)["kernels"])


def _poisoned(*likes: tuple[tuple[int, ...], Any]) -> tuple[np.ndarray, ...]:
    return tuple(np.full(shape, np.nan).astype(dtype) for shape, dtype in likes)


def test_a_chain_with_a_returned_intermediate_is_one_kernel() -> None:
    """The graph and the schedule: one group, one launch writing both values."""
    program = tessera.compile(SOURCE, filename="program.tsr", target="cpu")
    assert {name: _launches(program, name) for name in LAUNCHES} == LAUNCHES
    sched = program.inspect_ir("sched")
    assert "reads %x, %y  writes %a, %b" in sched, sched
    # the intermediate a later kernel reads is a buffer of the plan, written by the first
    assert "buffer %a : tensor<[R, C], f32>" in sched, sched


@pytest.mark.parametrize(("target", "arch"), every_target_beyond("cpu", "opencl", "sm_80"))
def test_several_results_of_one_kernel_match_float64(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib: Any = load_everywhere(SOURCE, target, arch, monkeypatch)
    rng = np.random.default_rng(11)
    x, y = (rng.standard_normal((R, C)).astype(np.float32) for _ in range(2))
    a = f64(x) * f64(y)

    out = _poisoned(((R, C), np.float32), ((R, C), np.float32))
    lib.pair(x, y, out=out)
    np.testing.assert_allclose(out[0], a, rtol=1e-6)
    np.testing.assert_allclose(out[1], np.exp(a) + 1.0, rtol=1e-5)

    out = _poisoned(((R, C), BF16), ((R,), np.float32))
    lib.rows_too(x, y, out=out)
    np.testing.assert_allclose(f64(out[0]), np.tanh(a) * f64(y), rtol=1e-2, atol=1e-2)
    want = (a * 0.5).sum(axis=-1) + a.max(axis=-1)
    np.testing.assert_allclose(out[1], want, rtol=1e-5, atol=1e-5)

    v, bias = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    h = f64(v) + f64(bias)
    s = 1.0 / (1.0 + np.exp(-h))
    out = _poisoned(*(((N,), np.float32),) * 3)
    lib.three(v, bias, out=out)
    for have, want in zip(out, (s, h * s, h), strict=True):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)

    w = rng.standard_normal((C, C)).astype(np.float32)
    out = _poisoned(((R, C), np.float32), ((R, C), np.float32))
    lib.product_kept(x, w, out=out)
    hw = f64(x) @ f64(w)
    np.testing.assert_allclose(out[0], hw, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[1], np.maximum(hw, 0.0), rtol=1e-4, atol=1e-4)


#: The example's AdamW steps on a state (the f32 parameter's, and the bf16 one's with an
#: f32 master), and the step on tensors of one's own, whose results are poisoned first.
ADAM = (ROOT / "examples/optimizer_step.tsr").read_text(encoding="utf-8") + """

def adamw_tensors(w: Tensor["N", f32], dw: Tensor["N", f32], m: Tensor["N", f32],
                  v: Tensor["N", f32], lr: float, step: int
                  ) -> tuple[Tensor["N", f32], Tensor["N", f32], Tensor["N", f32]]:
    return fused_adam(w, dw, m, v, lr=lr, step=step, weight_decay=0.01)
"""
LR, STEPS = 0.02, 3


def test_the_adamw_step_is_one_kernel() -> None:
    program = tessera.compile(ADAM, filename="adam.tsr", target="cpu")
    for name in ("adamw", "adamw_bf16", "adamw_tensors"):
        assert _launches(program, name) == 1, name


def _never(*_: Any) -> None:
    raise AssertionError("the state was copied, not written in place")


#: The example with a step whose state ``t`` reads too: ``t`` reads ``state.m`` and is
#: read by what the new ``m`` is not computed from, so that state is computed apart.
LATER = ADAM + """
def adamw_read(w: Tensor["N", f32], dw: Tensor["N", f32], state: OptimizerState[w],
               lr: float, step: int) -> tuple[Tensor["N", f32], OptimizerState[w]]:
    t = state.m * 2.0
    w, state = fused_adam(w, dw, state, lr=lr, step=step, weight_decay=0.01)
    return w + t, state
"""


@pytest.mark.parametrize("target", ["cpu", "cuda", "hip", "opencl", "sycl"])
def test_the_state_is_written_in_place_where_nothing_reads_it_after(target: str) -> None:
    """The schedule says which results go into the donated state's memory: all of a
    state's, on every target, where every op that reads the old state computes the
    new; ``adamw_read``'s state is computed apart and copied."""
    sched = tessera.compile(LATER, filename="adam.tsr", target=target).inspect_ir("sched")
    blocks = {b.split(" ", 1)[0]: b for b in sched.split("host @")[1:]}
    assert "in place %2 into %state_m, %6 into %state_v" in blocks["adamw"], blocks["adamw"]
    assert "in place %23 into %state_master, %3 into %state_m" in blocks["adamw_bf16"]
    assert "in place" not in blocks["adamw_read"], blocks["adamw_read"]


def _parameters(source: str, kernel: str) -> list[str]:
    """The parameters of the kernel function ``kernel`` as the source declares them."""
    head = re.search(rf"\b{kernel}\(([^)]*)\)\s*\{{", source)
    assert head is not None, kernel
    return [" ".join(p.split()) for p in head.group(1).split(",")]


@pytest.mark.parametrize(
    ("target", "arch"),
    [("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", "gfx90a"), ("opencl", None), ("sycl", None)],
)
def test_a_simt_kernel_takes_the_donated_state_as_one_pointer(
    target: str, arch: str | None
) -> None:
    """A SIMT kernel's pointers are ``restrict``: the old state and the new are one
    parameter, the result's, read and written (the runtime passes the state's own
    array as the result, or a copy of it); the metadata says which input each such
    result updates. The CPU kernel takes both, unqualified, and reads the input."""
    program = tessera.compile(LATER, filename="adam.tsr", target=target, arch=arch)
    meta = {f["name"]: f for f in program.ir("meta")["functions"]}
    updated = {
        "adamw": {"out1": "state_m", "out2": "state_v"},
        "adamw_bf16": {"out1": "state_master", "out2": "state_m", "out3": "state_v"},
    }
    for name, pairs in updated.items():
        f = meta[name]
        assert {p["name"]: p["updates"] for p in f["params"] if "updates" in p} == pairs
        assert [s.get("in_place") for s in f["states"]] == [None, True]
        ((launch),) = f["launches"]
        assert not set(pairs.values()) & set(launch["args"]), launch["args"]
        params = _parameters(program.source, launch["kernel"])
        for result in pairs:
            (declared,) = [p for p in params if p.split()[-1] == result]
            assert "const" not in declared and "*" in declared, declared
        assert not [p for p in params if p.split()[-1].startswith("state_")], params
    read = meta["adamw_read"]
    assert not any("updates" in p for p in read["params"]) and "in_place" not in str(read)
    cpu = tessera.compile(LATER, filename="adam.tsr", target="cpu")
    (f,) = [f for f in cpu.ir("meta")["functions"] if f["name"] == "adamw"]
    assert not any("updates" in p for p in f["params"])
    params = _parameters(cpu.source, "adamw_program")
    assert "const float* state_m" in params and "float* out1" in params, params


def _torch_adamw(param: np.ndarray) -> tuple[Any, Any]:
    """A float64 copy of ``param`` and ``torch.optim.AdamW`` over it, with the example's
    weight decay."""
    import torch

    tp = torch.tensor(f64(param), requires_grad=True)
    return tp, torch.optim.AdamW([tp], lr=LR, weight_decay=0.01)


def _torch_step(tp: Any, optimizer: Any, grad: np.ndarray) -> tuple[np.ndarray, ...]:
    """One step of ``optimizer`` with ``grad``: the parameter and both moments after it."""
    import torch

    tp.grad = torch.tensor(f64(grad))
    optimizer.step()
    moments = optimizer.state[tp]
    return tp.detach().numpy(), moments["exp_avg"].numpy(), moments["exp_avg_sq"].numpy()


@pytest.mark.parametrize(("target", "arch"), every_target_beyond("cpu", "opencl", "sm_80"))
def test_the_one_kernel_adamw_step_matches_torch(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several steps against ``torch.optim.AdamW`` in float64: an f32 parameter with its
    moments as tensors (results poisoned first) and as an ``OptimizerState``, and a bf16
    parameter with an f32 master state (AdamW on the master, the parameter its rounding
    to bf16). Each call is one launch, and the kernel writes the state's own arrays:
    nothing is copied into them, on any target."""
    pytest.importorskip("torch")
    lib: Any = load_everywhere(ADAM, target, arch, monkeypatch)
    monkeypatch.setattr(optstate, "_assign", _never)
    monkeypatch.setattr(Entry, "_copy", _never)
    launches: list[str] = []
    if target != "sycl":  # a simulated SYCL file's launches have no metrics
        telemetry.configure(metrics=lambda record: launches.append(record["function"]))
    rng = np.random.default_rng(5)
    w = rng.standard_normal(N).astype(np.float32)
    m, v = np.zeros_like(w), np.zeros_like(w)
    ws, state = w.copy(), tessera.OptimizerState.init(w)
    wb = w.astype(BF16)
    master = tessera.OptimizerState.init(wb, fp32_master=True)
    arrays = [*state.arrays(), *master.arrays()]
    torches = [_torch_adamw(w), _torch_adamw(w), _torch_adamw(master.master)]
    try:
        for step in range(1, STEPS + 1):
            grad = rng.standard_normal(N).astype(np.float32)
            out = _poisoned(*(((N,), np.float32),) * 3)
            lib.adamw_tensors(w, grad, m, v, LR, step, out=out)
            w, m, v = out
            ws, same = lib.adamw(ws, grad, state, LR, step)
            assert same is state
            gb = grad.astype(BF16)
            wb, same = lib.adamw_bf16(wb, gb, master, LR, step)
            assert same is master
            now = [*state.arrays(), *master.arrays()]
            assert all(a is b for a, b in zip(arrays, now, strict=True))
            got = [(w, m, v), (ws, state.m, state.v), master.arrays()]
            for (tp, optimizer), have, g in zip(torches, got, (grad, grad, gb), strict=True):
                want = _torch_step(tp, optimizer, g)
                for name, a, b in zip(("param", "m", "v"), have, want, strict=True):
                    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6,
                                               err_msg=f"{step} {name}")  # fmt: skip
            np.testing.assert_array_equal(wb, master.master.astype(BF16))
    finally:
        telemetry.configure()
    if target != "sycl":
        assert launches == ["adamw_tensors", "adamw", "adamw_bf16"] * STEPS, launches


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_a_state_that_cannot_be_written_in_place_is_copied(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the kernel may not write over the state (another op reads the old moment),
    the new state is computed apart and copied into it; where the caller passes the
    state's arrays as inputs but not as the results (the entry's own call), the results
    are fresh arrays that start as the inputs' copies, and the inputs keep their values."""
    torch = pytest.importorskip("torch")
    lib: Any = load_everywhere(LATER, target, arch, monkeypatch)
    rng = np.random.default_rng(8)
    w = rng.standard_normal(N).astype(np.float32)
    state = tessera.OptimizerState.init(w)
    tp, optimizer = _torch_adamw(w)
    for step in range(1, STEPS + 1):
        grad = rng.standard_normal(N).astype(np.float32)
        t = 2.0 * f64(state.m)
        w, same = lib.adamw_read(w, grad, state, LR, step)
        assert same is state
        want = _torch_step(tp, optimizer, grad)
        np.testing.assert_allclose(w, want[0] + t, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state.m, want[1], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state.v, want[2], rtol=1e-5, atol=1e-6)
        tp.data.copy_(torch.from_numpy(f64(w)))  # the next step starts from w + t
    given = [a.copy() for a in state.arrays()]
    grad = rng.standard_normal(N).astype(np.float32)
    new_w, new_m, new_v = lib.adamw._call(w, grad, *state.arrays(), LR, STEPS + 1)
    for a, b in zip(state.arrays(), given, strict=True):
        np.testing.assert_array_equal(a, b)  # the inputs, not donated, are as they were
    want = _torch_step(tp, optimizer, grad)
    for name, a, b in zip(("param", "m", "v"), (new_w, new_m, new_v), want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


@needs_gxx
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_gpu_arrays_of_a_state_are_written_in_place_on_the_fast_path(
    arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Device arrays: each step is one launch through the driver (the fast path), whose
    kernel writes the state's own arrays, and nothing is copied. The entry's call with
    fresh results takes the full path, which copies the state into them first."""
    pytest.importorskip("torch")
    use_simulator(monkeypatch, simulated_cupy(arch))
    adamw = tessera.compile(ADAM, filename="adam.tsr", target="cuda", arch=arch).load().adamw
    launches = adamw._launches
    driver, calls = launches._launch, []
    monkeypatch.setattr(launches, "_launch", lambda *a: calls.append(a[0]) or driver(*a))
    monkeypatch.setattr(optstate, "_assign", _never)
    rng = np.random.default_rng(12)
    w = rng.standard_normal(N).astype(np.float32)
    state = tessera.OptimizerState(*(DeviceArray(np.zeros(N, np.float32)) for _ in range(2)))
    arrays = [a.data for a in state.arrays()]
    tp, optimizer = _torch_adamw(w)
    wd = DeviceArray(w.copy())
    with monkeypatch.context() as inside:
        inside.setattr(Entry, "_copy", _never)
        for step in range(1, STEPS + 1):
            grad = rng.standard_normal(N).astype(np.float32)
            wd, same = adamw(wd, DeviceArray(grad), state, LR, step)
            assert same is state and all(
                a.data is b for a, b in zip(state.arrays(), arrays, strict=True)
            )
            want = _torch_step(tp, optimizer, grad)
            for name, a, b in zip(("param", "m", "v"), (wd, *state.arrays()), want, strict=True):
                np.testing.assert_allclose(a.data, b, rtol=1e-5, atol=1e-6, err_msg=name)
    assert len(calls) == STEPS, calls
    given = [a.data.copy() for a in state.arrays()]
    grad = rng.standard_normal(N).astype(np.float32)
    new = adamw._call(wd, DeviceArray(grad), *state.arrays(), LR, STEPS + 1)
    assert len(calls) == STEPS  # a fresh result, to fill first: the full path
    for a, b in zip(state.arrays(), given, strict=True):
        np.testing.assert_array_equal(a.data, b)
    want = _torch_step(tp, optimizer, grad)
    for name, a, b in zip(("param", "m", "v"), new, want, strict=True):
        np.testing.assert_allclose(a.data, b, rtol=1e-5, atol=1e-6, err_msg=name)


@needs_gxx
def test_the_cupy_loader_updates_a_state_passed_as_its_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader module a project checks in: the state's arrays passed as the results'
    ``out`` are updated in place, each passed to the kernel once (its pointers are
    ``restrict``); without them the results start as the state's copies, which keeps
    its values. Against ``torch.optim.AdamW`` on the simulated GPU."""
    pytest.importorskip("torch")
    cupy = simulated_cupy("sm_80")
    use_simulator(monkeypatch, cupy)
    program = tessera.compile(ADAM, filename="adam.tsr", target="cuda", arch="sm_80")
    loader = _loader_module(program, tmp_path, cupy, monkeypatch)
    launch = loader._launch

    def distinct(name: str, grid: Any, threads: int, smem: int, args: tuple) -> None:
        arrays = [a.data.ctypes.data for a in args if isinstance(a, DeviceArray)]
        assert len(set(arrays)) == len(arrays), f"{name}: an array passed twice"
        launch(name, grid, threads, smem, args)

    monkeypatch.setattr(loader, "_launch", distinct)
    rng = np.random.default_rng(13)
    w = rng.standard_normal(N).astype(np.float32)
    m, v = (DeviceArray(np.zeros(N, np.float32)) for _ in range(2))
    arrays = (m.data, v.data)
    tp, optimizer = _torch_adamw(w)
    wd = DeviceArray(w.copy())
    for step in range(1, STEPS + 1):
        grad = rng.standard_normal(N).astype(np.float32)
        wd, m2, v2 = loader.adamw(wd, DeviceArray(grad), m, v, LR, step, out=(None, m, v))
        assert m2 is m and v2 is v and (m.data, v.data) == arrays
        want = _torch_step(tp, optimizer, grad)
        for name, a, b in zip(("param", "m", "v"), (wd, m, v), want, strict=True):
            np.testing.assert_allclose(a.data, b, rtol=1e-5, atol=1e-6, err_msg=name)
    given = (m.data.copy(), v.data.copy())
    grad = rng.standard_normal(N).astype(np.float32)
    new = loader.adamw(wd, DeviceArray(grad), m, v, LR, STEPS + 1)
    np.testing.assert_array_equal(m.data, given[0])
    np.testing.assert_array_equal(v.data, given[1])
    want = _torch_step(tp, optimizer, grad)
    for name, a, b in zip(("param", "m", "v"), new, want, strict=True):
        np.testing.assert_allclose(a.data, b, rtol=1e-5, atol=1e-6, err_msg=name)
