"""A function's own gradient rule (``@custom_vjp``, ``@custom_jvp``), ``checkpoint`` and
the ``remat=`` policies: each gradient against PyTorch autograd in float64 and against
finite differences, on ragged sizes, from one module of ``autodiff_rules.tsr`` built
once; the memory plan's saved bytes per policy; a rule whose signature does not match
its function is an error at the rule's line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tessera

from .everywhere import EVERY_TARGET, load_everywhere
from .test_autodiff import assert_finite_differences, assert_one_error, built_unoptimized
from .test_cuda import needs_gxx

torch = pytest.importorskip("torch")
F = torch.nn.functional

RULES_FILE = Path(__file__).with_name("autodiff_rules.tsr")
R, C, D, H = 7, 13, 6, 10


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return built_unoptimized(RULES_FILE, tmp_path_factory)


def _random(rng: np.random.Generator, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _as64(*arrays: np.ndarray) -> list[Any]:
    return [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]


def _close(have: Any, want: Any) -> None:
    np.testing.assert_allclose(have, want.detach().numpy(), rtol=1e-4, atol=1e-4)


def _scaled(x: Any, w: Any) -> Any:
    return torch.tanh(x) * w


def _block(x: Any, w: Any) -> Any:
    return F.gelu(x * w, approximate="tanh") * torch.sigmoid(x) + _scaled(x, w)


def _mlp(x: Any, w1: Any, b1: Any, w2: Any, target: Any) -> Any:
    return -(target * F.log_softmax(F.gelu(x @ w1 + b1, approximate="tanh") @ w2, -1)).sum()


#: Functions differentiated by @custom_vjp, @custom_jvp or through checkpoint(...), the
#: shapes of their inputs, and the same function in PyTorch.
CASES = {
    "scaled": (((R, C), (C,)), _scaled),
    "soft": (((R, C),), lambda x: F.softmax(x, -1)),
    "checkpointed": (((R, C), (C,)), lambda x, w: _block(torch.tanh(x), w) * x),
    "mlp_everything": (((R, D), (D, H), (H,), (H, C), (R, C)), _mlp),
    "mlp_matmuls": (((R, D), (D, H), (H,), (H, C), (R, C)), _mlp),
    "mlp_nothing": (((R, D), (D, H), (H,), (H, C), (R, C)), _mlp),
}


@needs_gxx
@pytest.mark.parametrize("name", sorted(CASES))
def test_vjp_by_the_functions_rule_matches_torch(lib: Any, name: str) -> None:
    shapes, reference = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name))
    inputs = dict(zip("abcdefgh", _random(rng, *shapes), strict=False))
    out = getattr(lib, name)(*inputs.values())
    (g,) = _random(rng, out.shape)
    grads = getattr(lib, f"{name}_vjp")(*inputs.values(), g)
    grads = grads if isinstance(grads, tuple) else (grads,)
    tensors = _as64(*inputs.values())
    expected = reference(*tensors)
    _close(out, expected)
    expected.backward(torch.tensor(g, dtype=torch.float64))
    for have, t in zip(grads, tensors, strict=True):
        _close(have, t.grad)
    f = getattr(lib, name)
    assert_finite_differences(f, inputs, dict(zip(inputs, grads, strict=True)), (g,), rng)


@needs_gxx
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.func imports torch.jit
@pytest.mark.parametrize("name", ["scaled", "soft"])
def test_jvp_by_the_functions_rule_matches_torch(lib: Any, name: str) -> None:
    shapes, reference = CASES[name]
    rng = np.random.default_rng(7)
    inputs, tangents = _random(rng, *shapes), _random(rng, *shapes)
    values, tangent = getattr(lib, f"{name}_jvp")(*inputs, *tangents)
    as64 = [torch.tensor(a, dtype=torch.float64) for a in (*inputs, *tangents)]
    want = torch.func.jvp(reference, tuple(as64[: len(inputs)]), tuple(as64[len(inputs) :]))
    _close(values, want[0])
    _close(tangent, want[1])


@needs_gxx
def test_the_rule_not_the_ops_gives_the_gradient(lib: Any) -> None:
    """``clip``'s rule passes the cotangent straight through, where ``clamp``'s own rule
    would zero it outside [-0.5, 0.5]; ``grad`` of a caller uses the rules of all three
    functions it calls."""
    rng = np.random.default_rng(3)
    x, w = _random(rng, (R, C), (C,))
    (g,) = _random(rng, (R, C))
    assert np.array_equal(lib.clip_vjp(x, g), g)
    value, dx, dw = lib.rules_step(x, w)
    tx, tw = _as64(x, w)
    through = tx + (torch.clamp(tx, -0.5, 0.5) - tx).detach()
    expected = (F.softmax(torch.tanh(through) * tw, -1) * tx).sum()
    expected.backward()
    _close(value, expected)
    _close(dx, tx.grad)
    _close(dw, tw.grad)


@needs_gxx
def test_a_gradient_with_remat_in_a_training_step(lib: Any) -> None:
    rng = np.random.default_rng(4)
    inputs = _random(rng, *CASES["mlp_nothing"][0])
    dw1, dw2 = lib.mlp_step(*inputs)
    tensors = _as64(*inputs)
    _mlp(*tensors).backward()
    _close(dw1, tensors[1].grad)
    _close(dw2, tensors[3].grad)


def _saved(plan: str, function: str) -> str:
    block = plan[plan.index(f"host @{function} ") :]
    return re.search(r"saved for the backward .*  bytes (.*)", block).group(1)


def test_the_memory_plan_shows_what_each_policy_saves() -> None:
    """With the sizes fixed, the bytes the backward pass reads of the forward's values:
    all its activations, the products only, none; a checkpoint keeps its input only."""
    sizes = {"R": R, "C": C, "D": D, "H": H}
    plan = str(tessera.compile_file(RULES_FILE, target="cpu", defines=sizes).inspect_ir("sched"))
    saved = {f: int(_saved(plan, f"{f}_vjp")) for f in ("mlp_everything", "mlp_matmuls",
                                                        "mlp_nothing", "checkpointed")}  # fmt: skip
    assert saved == {
        "mlp_everything": 4 * (R * C + 2 * R * H),  # gelu's input and output, log_softmax's
        "mlp_matmuls": 4 * (R * C + R * H),  # the two products
        "mlp_nothing": 0,
        "checkpointed": 4 * R * C,  # tanh(x), the checkpoint's input
    }


#: A function, a rule that does not fit it, the rule's line (1-based) and the error.
_F = "def f(x: Tensor['R', 'C', f32], w: Tensor['C', f32]) -> Tensor['R', 'C', f32]:\n"
BAD = {
    "too few parameters": (
        f"@custom_vjp(rule)\n{_F}    return x * w\n\n"
        "def rule(x: Tensor['R', 'C', f32], g: Tensor['R', 'C', f32]) -> Tensor['R', 'C', f32]:\n"
        "    return g\n",
        5,
        "the rule 'rule' takes 2 positional parameters; 'f' gives it 3: x, w, the "
        "cotangent of the result",
    ),
    "wrong shape": (
        f"@custom_vjp(rule)\n{_F}    return x * w\n\n"
        "def rule(x: Tensor['R', 'C', f32], w: Tensor['C', f32],\n"
        "         g: Tensor['C', 'R', f32]) -> tuple[Tensor['R', 'C', f32], Tensor['C', f32]]:\n"
        "    return g.T, sum(g, axis=1)\n",
        6,
        "parameter 'g' (the cotangent of the result) is [C, R] f32; 'f' gives [R, C] f32",
    ),
    "wrong dtype": (
        f"@custom_vjp(rule)\n{_F}    return x * w\n\n"
        "def rule(x: Tensor['R', 'C', f32], w: Tensor['C', f16], g: Tensor['R', 'C', f32]\n"
        "         ) -> tuple[Tensor['R', 'C', f32], Tensor['C', f32]]:\n"
        "    return g, sum(g, axis=0)\n",
        5,
        "parameter 'w' (w) is [C] f16; 'f' gives [C] f32",
    ),
    "too few results": (
        f"@custom_vjp(rule)\n{_F}    return x * w\n\n"
        "def rule(x: Tensor['R', 'C', f32], w: Tensor['C', f32], g: Tensor['R', 'C', f32]\n"
        "         ) -> Tensor['R', 'C', f32]:\n"
        "    return g\n",
        6,
        "the rule 'rule' returns 1 values; it gives 2: the cotangent of 'x', the cotangent "
        "of 'w'",
    ),
    "jvp result": (
        f"@custom_jvp(rule)\n{_F}    return x * w\n\n"
        "def rule(x: Tensor['R', 'C', f32], w: Tensor['C', f32], tx: Tensor['R', 'C', f32],\n"
        "         tw: Tensor['C', f32]) -> Tensor['C', f32]:\n"
        "    return tw\n",
        6,
        "its result for the tangent of the result is [C] f32; 'f' gives [R, C] f32",
    ),
    "not a function": (
        f"@custom_vjp(rul)\n{_F}    return x * w\n\n"
        "def rule(x: Tensor['R', 'C', f32]) -> Tensor['R', 'C', f32]:\n    return x\n",
        1,
        "'rul' is not another function of this file; did you mean 'rule'?",
    ),
    "not linear": (
        "@custom_jvp(rule)\ndef f(x: Tensor['R', 'C', f32]) -> Tensor['R', 'C', f32]:\n"
        "    return x * x\n\n"
        "def rule(x: Tensor['R', 'C', f32], t: Tensor['R', 'C', f32]) -> Tensor['R', 'C', f32]:\n"
        "    return x * t * t\n\n"
        "def g(x: Tensor['R', 'C', f32]) -> Tensor['R', 'C', f32]:\n"
        "    return grad(total)(x)\n\n"
        "def total(x: Tensor['R', 'C', f32]) -> Tensor[f32]:\n    return sum(f(x), axis=None)\n",
        6,
        "the rule 'rule' is not linear in its tangents: mul of a value computed from them",
    ),
    "two rules": (
        f"@custom_vjp(rule)\n@custom_jvp(rule)\n{_F}    return x * w\n\n"
        "def rule(x: Tensor['R', 'C', f32]) -> Tensor['R', 'C', f32]:\n    return x\n",
        2,
        "'f' has two gradient rules: give @custom_vjp or @custom_jvp, not both",
    ),
    "no rule named": (
        f"@custom_vjp\n{_F}    return x * w\n",
        1,
        "@custom_vjp takes the function that is the rule, by name: @custom_vjp(f_rule)",
    ),
    "checkpoint of a value": (
        f"{_F}    return checkpoint(x)(w)\n",
        2,
        "checkpoint() takes one function of this file",
    ),
    "unknown policy": (
        f"@autodiff(remat='some')\n{_F}    return x * w\n",
        1,
        "remat= is one of 'everything', 'save_matmuls', 'nothing', not 'some'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_rule_that_does_not_fit_is_an_error_at_its_line(case: str) -> None:
    assert_one_error(*BAD[case])


ELSEWHERE = """\
@custom_vjp(scaled_rule)
def scaled(x: Tensor["R", "C", f32], w: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return tanh(x) * w

def scaled_rule(x: Tensor["R", "C", f32], w: Tensor["C", f32], g: Tensor["R", "C", f32]
                ) -> tuple[Tensor["R", "C", f32], Tensor["C", f32]]:
    t = tanh(x)
    return g * w * (1.0 - t * t), sum(g * t, axis=0)

def block(x: Tensor["R", "C", f32], w: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return gelu(scaled(x, w)) * x

@autodiff(remat="save_matmuls")
def layer(x: Tensor["R", "C", f32], w: Tensor["C", f32]) -> Tensor["R", "C", f32]:
    return checkpoint(block)(x, w) * sigmoid(x)
"""


@pytest.mark.parametrize(
    ("target", "arch"), [p for p in EVERY_TARGET if p.id in ("opencl", "sm_80")]
)
def test_rules_on_the_other_targets(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(5)
    x, w, g = _random(rng, (37, 23), (23,), (37, 23))
    dx, dw = load_everywhere(ELSEWHERE, target, arch, monkeypatch).layer_vjp(x, w, g)
    tx, tw = _as64(x, w)
    out = F.gelu(_scaled(tx, tw), approximate="tanh") * tx * torch.sigmoid(tx)
    out.backward(torch.tensor(g, dtype=torch.float64))
    _close(dx, tx.grad)
    _close(dw, tw.grad)
