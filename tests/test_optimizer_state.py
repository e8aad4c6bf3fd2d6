"""``OptimizerState[w] @fp32_master``: a bf16 parameter's f32 master and Adam moments as
one state, which a compiled training step takes as a ``tessera.OptimizerState`` and
updates in place (donated), against ``torch.optim.AdamW`` on the f32 master step for
step; the runtime's checks of a state, and the Graph IR the state gives.
"""

from __future__ import annotations

import re
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera import OptimizerState
from tessera.runtime import optstate
from tessera.runtime.entry import Entry
from tessera.transpiler.graph.printer import print_graph

from .conftest import ROOT
from .everywhere import EVERY_TARGET, every_target_beyond, load_everywhere
from .test_autodiff import built_unoptimized
from .test_cuda import needs_gxx
from .test_multi_result import _never

torch = pytest.importorskip("torch")

#: Ragged sizes (multiples of no tile), several steps, a decay large enough to matter.
R, D, C, STEPS, LR, DECAY = 37, 19, 23, 4, 0.02, 0.1
BF16 = ml_dtypes.bfloat16

TRAIN = """\
def loss(x: Tensor["R", "D", f32], w: Tensor["D", "C", bf16], t: Tensor["R", "C", f32]
         ) -> Tensor[f32]:
    return mean(tanh(x @ cast(w, f32)) * t, axis=None)

def train_step(x: Tensor["R", "D", f32], w: Tensor["D", "C", bf16], t: Tensor["R", "C", f32],
               state: OptimizerState[w] @fp32_master, lr: float, step: int
               ) -> tuple[Tensor[f32], Tensor["D", "C", bf16], Tensor["D", "C", bf16],
                          OptimizerState[w] @fp32_master]:
    value, dw = value_and_grad(loss, wrt="w")(x, w, t)
    w, state = fused_adam(w, dw, state, lr=lr, step=step, weight_decay=0.1)
    return value, dw, w, state
"""


def _torch_loss(x: np.ndarray, w: np.ndarray, t: np.ndarray) -> tuple[float, np.ndarray]:
    """The loss and its gradient in float64, at the bf16 parameter's values."""
    tw = torch.tensor(w.astype(np.float64), requires_grad=True)
    value = (torch.tanh(torch.tensor(x, dtype=torch.float64) @ tw)
             * torch.tensor(t, dtype=torch.float64)).mean()  # fmt: skip
    value.backward()
    return value.item(), tw.grad.numpy()


def _check_state(state: OptimizerState, tp: Any, optimizer: Any) -> None:
    moments = optimizer.state[tp]
    want = (tp.detach().numpy(), moments["exp_avg"].numpy(), moments["exp_avg_sq"].numpy())
    for name, have, ref in zip(("master", "m", "v"), state.arrays(), want, strict=True):
        np.testing.assert_allclose(have, ref, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), every_target_beyond("cpu", "opencl"))
def test_a_training_step_with_an_fp32_master_matches_torch_adamw(
    target: str,
    arch: str | None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Loss, gradient and AdamW in one compiled step: the state is updated in place, the
    bf16 parameter is the new master rounded to nearest even. torch's AdamW steps a
    float64 copy of the master with the step's own bf16 gradient (checked against the
    float64 gradient at bf16's precision), so the optimizer is compared step for step."""
    rng = np.random.default_rng(39)
    x, t = rng.standard_normal((R, D)), rng.standard_normal((R, C))
    x, t = x.astype(np.float32), t.astype(np.float32)
    w = rng.standard_normal((D, C)).astype(BF16)
    if target == "cpu":
        step_fn = built_unoptimized(TRAIN, tmp_path_factory).train_step
    else:
        step_fn = load_everywhere(TRAIN, target, arch, monkeypatch).train_step
    state = OptimizerState.init(w, fp32_master=True)
    arrays = state.arrays()
    # the kernel writes the state's own arrays (a SIMT kernel reads them through its
    # one pointer to each, a tile of symbolic width): nothing is copied into them
    monkeypatch.setattr(optstate, "_assign", _never)
    monkeypatch.setattr(Entry, "_copy", _never)
    np.testing.assert_array_equal(state.master, w.astype(np.float32))
    tp = torch.tensor(state.master, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.AdamW([tp], lr=LR, weight_decay=DECAY)
    for step in range(1, STEPS + 1):
        want_value, want_grad = _torch_loss(x, w, t)
        value, dw, w, returned = step_fn(x, w, t, state, LR, step)
        assert returned is state and all(
            a is b for a, b in zip(state.arrays(), arrays, strict=True)
        ), "the state is donated: the same object and arrays, updated"
        np.testing.assert_allclose(value, want_value, rtol=1e-5, atol=1e-6)
        assert dw.dtype == BF16
        np.testing.assert_allclose(dw.astype(np.float64), want_grad, rtol=1e-2, atol=1e-4)
        tp.grad = torch.tensor(dw.astype(np.float64))
        optimizer.step()
        _check_state(state, tp, optimizer)
        np.testing.assert_array_equal(w, state.master.astype(BF16))


ADAM = """\
@jit
def two_steps(w: Tensor["N", f32], g1: Tensor["N", f32], g2: Tensor["N", f32],
              state: OptimizerState[w], lr: float, step: int
              ) -> tuple[Tensor["N", f32], OptimizerState[w]]:
    w, state = fused_adam(w, g1, state, lr=lr, step=step, weight_decay=0.1)
    w, state = fused_adam(w, g2, state, lr=lr, step=step + 1, weight_decay=0.1)
    return w, state
"""


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), [p for p in EVERY_TARGET if p.id in ("cpu", "opencl")])
def test_two_updates_of_one_state_keep_their_order(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An f32 parameter's state (no master: the moments have its dtype), updated twice
    in one function: the second update reads the first's state, as two AdamW steps do."""
    rng = np.random.default_rng(5)
    n = 1031
    w = rng.standard_normal(n).astype(np.float32)
    step_fn = load_everywhere(ADAM, target, arch, monkeypatch).two_steps
    state = OptimizerState.init(w)
    assert not state.fp32_master and state.m.dtype == np.float32
    tp = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.AdamW([tp], lr=LR, weight_decay=DECAY)
    for step in (1, 3):
        grads = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
        w, returned = step_fn(w, *grads, state, LR, step)
        assert returned is state
        for grad in grads:
            tp.grad = torch.tensor(grad, dtype=torch.float64)
            optimizer.step()
        np.testing.assert_allclose(w, tp.detach().numpy(), rtol=1e-5, atol=1e-6)
        moments = optimizer.state[tp]
        np.testing.assert_allclose(state.m, moments["exp_avg"].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state.v, moments["exp_avg_sq"].numpy(), rtol=1e-5, atol=1e-6)


def test_the_graph_ir_passes_the_state_as_its_tensors() -> None:
    """The state's tensors are parameters and results of the Graph IR, named after it;
    the function says which make up the state. The updates are SSA: the second reads
    the first's results."""
    graph = print_graph(tessera.compile(ADAM, filename="adam.tsr").ir("graph"))
    params = re.findall(r"param %(\w+) :", graph)
    assert params == ["w", "g1", "g2", "state_m", "state_v", "lr", "step"]
    assert "  state param state : OptimizerState[w]\n" in graph
    assert "  state result 1..2 : OptimizerState[w]\n" in graph
    lib = tessera.compile(ADAM, filename="adam.tsr", target="cpu")
    meta = lib.ir("graph").functions[0].states
    assert [(s.name, s.param, s.count, s.result) for s in meta] == [
        ("state", "w", 2, None),
        ("", "w", 2, 1),
    ]


@needs_gxx
def test_the_entry_takes_and_checks_a_state(tmp_path_factory: pytest.TempPathFactory) -> None:
    step_fn = built_unoptimized(TRAIN, tmp_path_factory).train_step
    assert step_fn.__doc__.startswith(
        "train_step(x: f32[R, D], w: bf16[D, C], t: f32[R, C], "
        "state: OptimizerState[w] @fp32_master, lr: float, step: int"
    )
    x, t = np.ones((3, 4), np.float32), np.ones((3, 5), np.float32)
    w = np.ones((4, 5), BF16)
    cases = [
        (TypeError, r"'state' must be a tessera.OptimizerState \(OptimizerState\[w\] "
         r"@fp32_master\), not ndarray", np.ones((4, 5), np.float32)),
        (ValueError, r"'state' has no master copy, and the function declares OptimizerState"
         r"\[w\] @fp32_master: make it with OptimizerState.init\(w, fp32_master=True\)",
         OptimizerState(np.zeros((4, 5), BF16), np.zeros((4, 5), BF16))),
        (ValueError, r"'state': the state has shape \[4, 4\], but its parameter is \[4, 5\] "
         r"bfloat16", OptimizerState.init(np.ones((4, 4), BF16), fp32_master=True)),
    ]  # fmt: skip
    for error, message, state in cases:
        with pytest.raises(error, match=message):
            step_fn(x, w, t, state, LR, 1)
    state = OptimizerState.init(w, fp32_master=True)
    with pytest.raises(TypeError, match=r"takes no 'out'"):
        step_fn(x, w, t, state, LR, 1, out=(None,) * 6)
    with pytest.raises(TypeError, match=r"is missing state"):
        step_fn(x, w, t, lr=LR, step=1)
    value, _, _, returned = step_fn(x, w=w, t=t, state=state, lr=LR, step=1)
    assert returned is state and np.isfinite(value)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: OptimizerState(np.zeros(3, np.float32), np.zeros(4, np.float32)),
         r"m and v must have one shape and dtype"),
        (lambda: OptimizerState(np.zeros(3, np.int32), np.zeros(3, np.int32)),
         r"the moments must be float32 \(or the parameter's bfloat16, float16\), not int32"),
        (lambda: OptimizerState(np.zeros(3, np.float32), np.zeros(3, np.float32),
                                np.zeros(3, np.float64)),
         r"master must be float32 of the moments' shape \[3\], not \[3\] float64"),
        (lambda: OptimizerState(np.zeros(3, BF16), np.zeros(3, BF16), np.zeros(3, np.float32)),
         r"with a master copy the moments are float32, not bfloat16"),
        (lambda: OptimizerState([0.0], [0.0]), r"m must be an array, not list"),
    ],
)  # fmt: skip
def test_a_malformed_state_is_a_clear_error(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_init_makes_the_state_of_a_torch_parameter_on_its_device() -> None:
    w = torch.randn(5, 3, dtype=torch.bfloat16)
    state = OptimizerState.init(w, fp32_master=True)
    assert state.master.dtype == torch.float32 and state.m.dtype == torch.float32
    assert torch.equal(state.master, w.float()) and not state.v.any()
    state.check(w)
    plain = OptimizerState.init(w)
    assert plain.master is None and plain.m.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("source", "line", "message"),
    [
        ("def f(w: Tensor['N', bf16], s: OptimizerState[w]) -> Tensor['N', f32]:\n"
         "    return s.master\n", 2,
         r"OptimizerState\[w\] has no attribute 'master' \(it is declared without "
         r"@fp32_master\); it has m, v"),
        ("def f(w: Tensor['N', bf16], s: OptimizerState[w] @fp32_master) -> Tensor['N', bf16]:"
         "\n    return s\n", 2,
         r"returns OptimizerState\[w\] @fp32_master, but the declared result is "
         r"tensor<\[N\], bf16>"),
        ("def f(w: Tensor['N', bf16], s: OptimizerState[w] @fp32_master) -> Tensor['N', f32]:"
         "\n    return exp(s)\n", 2, r"exp takes tensors; an OptimizerState is updated by "
         "fused_adam"),
        ("def f(w: Tensor['N', bf16], s: OptimizerState[w], t: OptimizerState[w]\n"
         "      ) -> Tensor['N', bf16]:\n    return w\n", 1,
         r"'s' is the state of 'w' already: a parameter has one OptimizerState"),
        ("def f(w: Tensor['N', bf16], s: OptimizerState[w], s_m: Tensor['N', bf16]\n"
         "      ) -> Tensor['N', bf16]:\n    return w\n", 1,
         r"the state 's' passes its tensors as s_m, s_v, and a parameter is named 's_m'"),
        ("def f(w: Tensor['N', bf16], s: OptimizerState[w]) -> Tensor['N', bf16]:\n"
         "    q, t = fused_adam(w, w, s, s, lr=0.1, step=1)\n    return q\n", 2,
         r"fused_adam takes an OptimizerState as its third argument and no fourth"),
        ("def f(w: Tensor['N', f32], s: OptimizerState[w]) -> Tensor[f32]:\n"
         "    return sum(w * s.m, axis=None)\n\n"
         "def g(w: Tensor['N', f32], s: OptimizerState[w]) -> Tensor['N', f32]:\n"
         "    return grad(f, wrt='w')(w, s)\n", 5,
         r"passing an OptimizerState to another function is not supported yet"),
        ("@autodiff\ndef f(w: Tensor['N', f32], s: OptimizerState[w]) -> Tensor[f32]:\n"
         "    return sum(w * s.m, axis=None)\n", 1,
         r"@autodiff of 'f', which takes an OptimizerState: differentiate the loss"),
        ("def f(lr: float, s: OptimizerState[lr]) -> float:\n    return lr\n", 1,
         r"OptimizerState\[lr\]: 'lr' is float; an optimizer state belongs to a tensor"),
    ],
)  # fmt: skip
def test_a_wrong_state_is_an_error_at_its_line(source: str, line: int, message: str) -> None:
    with pytest.raises(tessera.CompileError) as caught:
        tessera.compile(source, filename="s.tsr").ir("graph")
    errors = [d for d in caught.value.diagnostics if d.severity.name == "ERROR"]
    assert len(errors) == 1, errors
    assert errors[0].span.line == line
    assert re.search(message, errors[0].message), errors[0].message


def test_the_seeds_state_types() -> None:
    """Seed 004's snippet names a parameter ``W`` that it does not declare: that is the
    one error, at ``W``. Declared, the snippet compiles; its storage policies warn that
    they do nothing yet."""
    seed = (ROOT / "tests/seeds/seed004_state_types.tsr").read_text()
    with pytest.raises(tessera.CompileError) as caught:
        tessera.compile(seed, filename="seed.tsr").ir("graph")
    (error,) = [d for d in caught.value.diagnostics if d.severity.name == "ERROR"]
    assert (error.span.line, error.span.column) == (3, 39)
    assert "'W' is not a parameter of 'decode_step'" in error.message
    declared = seed.replace("(cache:", '(W: Tensor["D", bf16], cache:')
    program = tessera.compile(declared, filename="seed.tsr")
    graph = program.ir("graph")
    assert [s.param for s in graph.functions[0].states] == ["W"]
    warned = {d.message.split(" ")[0] for d in program.diagnostics}
    assert {"@paged", "@checkpointable"} <= warned
