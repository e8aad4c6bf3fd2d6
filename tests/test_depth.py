"""Deep nesting: a program nested past the limit gets one diagnostic at the place where
it gets too deep, wherever the nesting is (operators, brackets, calls, tuples,
subscripts, dim strings); anything within the limit compiles on every target, long flat
chains such as a 400-term sum included. Every pass recurses on what the limit counts."""

from __future__ import annotations

from pathlib import Path

import pytest

import tessera
from tessera.cli import main
from tessera.transpiler.frontend.depth import MAX_DEPTH

pytestmark = pytest.mark.unit

TARGETS = [("cpu", None), ("opencl", None), ("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", None)]


def _source(expression: str, dim: str = "N") -> str:
    return (
        f'@kernel\ndef f(x: Tensor["{dim}", f32]) -> Tensor["{dim}", f32]:\n'
        f"    return {expression}\n"
    )


#: Ways to nest ``n`` levels deep, each a whole expression of x.
NESTINGS = {
    "negation": lambda n: "-(" * n + "x" + ")" * n,
    "minus signs": lambda n: "-" * n + "x",
    "power": lambda n: "x ** " * n + "x",
    "sum": lambda n: " + ".join(["x"] * (n + 1)),
    "calls": lambda n: "relu(" * n + "x" + ")" * n,
    "keyword calls": lambda n: "where(x > 0.0, " * n + "x" + ", b=x)" * n,
    "subscripts": lambda n: "x" + "[:]" * n,
    "conditionals": lambda n: "x if True else " * n + "x",
    "tuples": lambda n: "x * " + "(" * (n // 2) + "2.0," + ")[0]," * (n // 2 - 1) + ")[0]",
    "not": lambda n: "x * (" + "not " * n + "False)",
}


@pytest.mark.parametrize("kind", NESTINGS)
def test_nesting_past_the_limit_is_a_diagnostic(kind: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "deep.tsr"
    path.write_text(_source(NESTINGS[kind](MAX_DEPTH + 50)))
    for target in ("cpu", "cuda"):
        assert main([str(path), "--target", target, "-o", str(tmp_path / "out")]) == 1
        err = capsys.readouterr().err
        assert "deep.tsr:3:" in err and "error: nested too deeply: more than 500 levels" in err
        assert "Traceback" not in err and "internal compiler error" not in err


@pytest.mark.parametrize("dim", ["(" * 600 + "S" + ")" * 600, "-" * 600 + "S"])
def test_a_dim_nested_past_the_limit_is_a_diagnostic(dim: str) -> None:
    with pytest.raises(tessera.CompileError) as info:
        tessera.compile(_source("x", dim), target="cpu")
    messages = [d.message for d in info.value.diagnostics]
    assert messages and all(m.endswith("nested too deeply: more than 500 levels") for m in messages)


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=[a or t for t, a in TARGETS])
@pytest.mark.parametrize("kind", ["negation", "power", "sum", "calls", "subscripts", "tuples"])
def test_nesting_within_the_limit_compiles(kind: str, target: str, arch: str | None) -> None:
    program = tessera.compile(
        _source(NESTINGS[kind](MAX_DEPTH - 10), "(" * 400 + "N" + ")" * 400),
        target=target,
        arch=arch,
    )
    assert program.source and program.inspect_ir("ast") and program.inspect_ir("graph")


def test_a_four_hundred_term_sum_compiles_and_runs_on_the_cpu(tmp_path: Path) -> None:
    """Ordinary code, nothing near the limit: a long flat chain is a left-deep tree."""
    np = pytest.importorskip("numpy")
    lib = tessera.compile(_source(" + ".join(["x"] * 400)), target="cpu").load()
    x = np.random.default_rng(1).standard_normal(37).astype(np.float32)
    out = np.full_like(x, np.nan)
    lib.f(x, out=out)
    np.testing.assert_allclose(out, 400 * x.astype(np.float64), rtol=1e-5)
