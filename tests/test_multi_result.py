"""Elementwise kernels that write several results: a chain whose intermediate the
function also returns, or a later kernel reads, is one kernel that stores each value
where it computes it, and ``fused_adam`` is one kernel that writes the parameter and
both moments (and the f32 master). Every target, against float64 (and
``torch.optim.AdamW``), on ragged sizes with the outputs poisoned first; the launch
counts are the compiled module's, which were larger when a kernel wrote one value.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.runtime import optstate

from .conftest import ROOT
from .everywhere import every_target_beyond, load_everywhere
from .reference import f64

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


def _never(target: Any, source: Any) -> None:
    raise AssertionError("the state was copied, not written in place")


def test_the_cpu_kernel_writes_the_state_in_place_where_nothing_reads_it_after() -> None:
    """The schedule says which results go into the donated state's memory: all of a
    state's, on the CPU, where every op that reads the old state computes the new;
    ``t`` reads ``state.m`` and is read by what the new ``m`` is not computed from, so
    that state is computed apart and copied (the GPU emitters never write it in place)."""
    later = ADAM + """
def adamw_read(w: Tensor["N", f32], dw: Tensor["N", f32], state: OptimizerState[w],
               lr: float, step: int) -> tuple[Tensor["N", f32], OptimizerState[w]]:
    t = state.m * 2.0
    w, state = fused_adam(w, dw, state, lr=lr, step=step)
    return w + t, state
"""
    sched = tessera.compile(later, filename="adam.tsr", target="cpu").inspect_ir("sched")
    blocks = {b.split(" ", 1)[0]: b for b in sched.split("host @")[1:]}
    assert "in place %2 into %state_m, %6 into %state_v" in blocks["adamw"], blocks["adamw"]
    assert "in place %23 into %state_master, %3 into %state_m" in blocks["adamw_bf16"]
    assert "in place" not in blocks["adamw_read"], blocks["adamw_read"]
    gpu = tessera.compile(later, filename="adam.tsr", target="cuda").inspect_ir("sched")
    assert "in place" not in gpu


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
    to bf16)."""
    pytest.importorskip("torch")
    lib: Any = load_everywhere(ADAM, target, arch, monkeypatch)
    if target == "cpu":  # the kernel writes the state in place: nothing is copied into it
        monkeypatch.setattr(optstate, "_assign", _never)
    rng = np.random.default_rng(5)
    w = rng.standard_normal(N).astype(np.float32)
    m, v = np.zeros_like(w), np.zeros_like(w)
    ws, state = w.copy(), tessera.OptimizerState.init(w)
    wb = w.astype(BF16)
    master = tessera.OptimizerState.init(wb, fp32_master=True)
    torches = [_torch_adamw(w), _torch_adamw(w), _torch_adamw(master.master)]
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
        got = [(w, m, v), (ws, state.m, state.v), master.arrays()]
        for (tp, optimizer), have, g in zip(torches, got, (grad, grad, gb), strict=True):
            want = _torch_step(tp, optimizer, g)
            for name, a, b in zip(("param", "m", "v"), have, want, strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{step} {name}")
        np.testing.assert_array_equal(wb, master.master.astype(BF16))
