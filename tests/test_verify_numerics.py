"""``@verify.numerics``: interval analysis over the Graph IR, with findings at the
user's line, and the library's stable kernels passing."""

from __future__ import annotations

import pytest

import tessera

from .conftest import ROOT

BOUNDED = "@verify.numerics(stable=True, bounded=[-100, 100])\n"
PER_PARAM = '@verify.numerics(stable=True, bounded={"x": [-100, 100], "q": [-100, 100], ' \
    '"k": [-100, 100], "v": [-100, 100]})\n'  # fmt: skip


def _findings(source: str) -> list[tuple[int, str]]:
    program = tessera.compile(source, filename="n.tsr", until="graph")
    return [(d.span.line, d.message) for d in program.diagnostics]


def _function(body: str, decorator: str = BOUNDED) -> str:
    return (decorator + '@kernel\ndef f(x: Tensor["R", "C", f32], w: Tensor["C", f32], '
            'b: Tensor["C", f32]) -> Tensor["R", "C", f32]:\n' + body)  # fmt: skip


def test_exp_of_a_wide_range_may_overflow_at_its_line() -> None:
    found = _findings(_function("    y = x * 2.0\n    return tanh(exp(y))\n"))
    assert len(found) == 1 and found[0][0] == 5
    assert "exp may overflow f32: its argument can reach 200 (range [-200, 200]" in found[0][1]
    assert "inputs in [-100, 100]" in found[0][1]
    assert _findings(_function("    return tanh(exp(x * 0.5))\n", "")) == []  # not asked for


def test_subtracting_the_maximum_proves_exp_and_its_sum_safe() -> None:
    body = ("    e = exp(x - max(x, axis=-1)[:, None])\n"
            "    return e / sum(e, axis=-1)[:, None]\n")  # fmt: skip
    assert _findings(_function(body)) == []
    assert _findings(_function("    return softmax_safe(x) + softmax(x)\n")) == []


def test_a_division_by_a_range_containing_zero() -> None:
    found = _findings(_function("    return tanh(x / (x - 1.0))\n"))
    assert [line for line, _ in found] == [4]
    assert "div divides by a range that contains zero: [-101, 99]" in found[0][1]
    assert _findings(_function("    return tanh(x / (x * x + 1.0))\n")) == []


def test_floor_division_and_remainder_are_bounded_by_their_divisor() -> None:
    """``x % 3`` lies in [0, 3] and ``x // 3`` in [-34, 33] for x in [-100, 100]: inside
    the declared range, where an unknown op would have made it [-inf, inf]."""
    assert _findings(_function("    return x % 3.0 + x // 3.0 - x % -2.0\n")) == []
    found = _findings(_function("    return x // 0.5\n"))
    assert len(found) == 1 and "may reach [-200, 200]" in found[0][1], found


def test_increasing_functions_map_the_ends_of_their_ranges() -> None:
    """``floor``, ``ceil``, ``erf``, ``expm1``, ``log2`` and ``log1p`` of a range are the
    functions of its ends, inside their domains; outside (``log1p`` of a range reaching
    -1), the result is unbounded and the declared range cannot be cleared."""
    body = ("    return ceil(x * 0.5) + floor(x * 0.25) + erf(x) + expm1(x * 0.01)"
            " + log2(x * x + 1.0)\n")  # fmt: skip
    assert _findings(_function(body)) == []
    assert _findings(_function("    return log1p(x * 0.001) + exp2(x * 0.01)\n")) == []
    found = _findings(_function("    return log1p(x)\n"))
    assert len(found) == 1 and "may reach [-inf, inf]" in found[0][1], found


def test_cancellation_when_stable() -> None:
    body = ("    v = mean(x * x, axis=-1) - mean(x, axis=-1) * mean(x, axis=-1)\n"
            "    return tanh(x - mean(x, axis=-1)[:, None] + v[:, None])\n")  # fmt: skip
    found = _findings(_function(body))
    assert [line for line, _ in found] == [4]
    assert "catastrophic cancellation" in found[0][1] and "[0, 1e+04]" in found[0][1]
    relaxed = BOUNDED.replace("stable=True, ", "")
    assert _findings(_function(body, relaxed)) == []


def test_the_result_must_stay_in_the_declared_range() -> None:
    found = _findings(_function("    return x * 2.0\n"))
    assert found == [(1, "@verify.numerics: the result of 'f' may reach [-200, 200], "
                      "outside the declared [-100, 100]")]  # fmt: skip
    assert _findings(_function("    return tanh(x) * 100.0\n")) == []


def test_the_library_graph_ops_pass() -> None:
    source = PER_PARAM + """@kernel
def g(x: Tensor["R", "C", f32], w: Tensor["C", f32], b: Tensor["C", f32],
      q: Tensor["B", "H", "S", "D", bf16], k: Tensor["B", "H", "S", "D", bf16],
      v: Tensor["B", "H", "S", "D", bf16]) -> Tensor["R", "C", f32]:
    a = ops.flash_attention(q, k, v, causal=True)
    return softmax(x, axis=-1) + layernorm(x, w, b) + log_softmax(x)
"""
    assert _findings(source) == []


@pytest.mark.parametrize("name", ["softmax", "layernorm", "flash_attention", "log_softmax",
                                  "logsumexp", "rmsnorm"])  # fmt: skip
def test_the_library_kernels_pass(name: str) -> None:
    text = (ROOT / "tessera/stdlib" / f"{name}.tsr").read_text()
    assert _findings(text.replace("@kernel\n", PER_PARAM + "@kernel\n", 1)) == []


def test_a_softmax_without_its_maximum_overflows() -> None:
    """The library softmax with the maximum's subtraction taken out: the seeded defect."""
    text = (ROOT / "tessera/stdlib/softmax.tsr").read_text()
    unsafe = text.replace("rows - tile.max(rows, axis=1)[:, None]", "rows")
    assert unsafe != text
    found = _findings(unsafe.replace("@kernel\n", PER_PARAM + "@kernel\n", 1))
    assert [m.split(":")[1].strip() for _, m in found] == ["exp may overflow f32"]
    line = next(i for i, t in enumerate(unsafe.splitlines(), 1) if "tile.exp" in t)
    assert found[0][0] == line + PER_PARAM.count("\n")
