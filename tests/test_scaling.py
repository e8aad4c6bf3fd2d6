"""Compile time grows linearly with the program: counted here, in function calls and
set look-ups, not timed (``bench/compile_scaling.py`` times it)."""

from __future__ import annotations

import cProfile
import pstats

import pytest

import tessera
from tessera.transpiler.target.cexpr import MAX_INLINED_OPS
from tessera.transpiler.target.naming import Namer

pytestmark = pytest.mark.unit


def _chain(statements: int) -> str:
    lines = ["@kernel", 'def f(x: Tensor["N", f32]) -> Tensor["N", f32]:', "    y0 = x"]
    lines += [f"    y{i} = y{i - 1} * 1.0001 + {i % 7}.0" for i in range(1, statements + 1)]
    return "\n".join([*lines, f"    return y{statements}"]) + "\n"


def _calls(text: str, target: str) -> int:
    """The Python function calls of compiling ``text`` to target source."""
    assert tessera.compile(_chain(1), target=target).source  # imports, grammar tables: once
    profile = cProfile.Profile()
    profile.enable()
    assert tessera.compile(text, target=target).source
    profile.disable()
    return pstats.Stats(profile).total_calls  # type: ignore[attr-defined]


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_twice_the_statements_take_twice_the_calls(target: str) -> None:
    """Quadratic passes show as calls per statement that grow with the program (a
    kernel's ops searched for each op it takes in, each value's readers searched
    through every op)."""
    small, large = (_calls(_chain(n), target) for n in (300, 600))
    assert large < 2.2 * small, (small, large)


class _CountedSet(set):
    lookups = 0

    def __contains__(self, item: object) -> bool:
        _CountedSet.lookups += 1
        return super().__contains__(item)


def test_fresh_names_take_constant_time_each() -> None:
    namer = Namer()
    namer.used = _CountedSet(namer.used)
    names = [namer.fresh(None) for _ in range(3000)]
    assert names[:3] == ["t", "t_1", "t_2"] and len(set(names)) == 3000
    assert _CountedSet.lookups < 2 * 3000


def test_a_long_chain_is_written_in_bounded_expressions() -> None:
    """A chain of elementwise ops is computed in one loop, stored every so many ops: no
    line of the generated code holds the whole chain."""
    source = tessera.compile(_chain(5 * MAX_INLINED_OPS), target="cpu").source
    longest = max(source.splitlines(), key=len)
    assert longest.count("1.0001f") <= MAX_INLINED_OPS
