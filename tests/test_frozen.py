"""``@frozen`` behaves as ``@dataclass(frozen=True)`` wherever the compiler can tell."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

import tessera
from tessera.frozen import frozen


def _pair(eq: bool = True) -> tuple[type, type]:
    """The same class body made by ``@frozen`` and by ``@dataclass(frozen=True)``."""

    def body() -> dict:
        return {
            "__annotations__": {"a": "int", "b": "float", "tag": "str", "items": "tuple"},
            "b": 0.5,
            "tag": dataclasses.field(default="t", compare=False, repr=False),
            "items": dataclasses.field(default_factory=tuple),
        }

    ours = frozen(eq=eq)(type("Point", (), body()))
    theirs = dataclasses.dataclass(frozen=True, eq=eq)(type("Point", (), body()))
    return ours, theirs


@pytest.mark.parametrize("eq", [True, False])
def test_equality_hash_and_repr_match_dataclasses(eq: bool) -> None:
    ours, theirs = _pair(eq)
    cases = [((1,), {}), ((1, 2.0), {}), ((1, 2.0, "x"), {}), ((1,), {"items": (3, 4)})]
    cases += [((1, math.nan), {}), ((2,), {"tag": "y"})]
    for args_a, kw_a in cases:
        for args_b, kw_b in cases:
            a, b = ours(*args_a, **kw_a), ours(*args_b, **kw_b)
            x, y = theirs(*args_a, **kw_a), theirs(*args_b, **kw_b)
            assert (a == b) == (x == y), (args_a, kw_a, args_b, kw_b)
            assert (a == a) == (x == x)  # a NaN field equals itself, as in a tuple
            if eq:
                assert hash(a) == hash(x)
        assert repr(ours(*args_a, **kw_a)) == repr(theirs(*args_a, **kw_a))
    assert ours(1) != theirs(1) and ours(1) != (1, 0.5, ())


def test_fields_are_set_once() -> None:
    ours, _ = _pair()
    p = ours(1)
    for name in ("a", "tag", "items"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(p, name, 2)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(p, name)
    assert dataclasses.replace(p, a=5).a == 5 and p.a == 1
    assert [f.name for f in dataclasses.fields(p)] == ["a", "b", "tag", "items"]


def test_a_class_keeps_the_methods_it_defines() -> None:
    @frozen
    class Named:
        name: str

        def __repr__(self) -> str:
            return f"<{self.name}>"

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Named) and self.name.lower() == other.name.lower()

        def __hash__(self) -> int:
            return hash(self.name.lower())

    assert repr(Named("A")) == "<A>"
    assert Named("A") == Named("a") and hash(Named("A")) == hash(Named("a"))


def test_post_init_sets_a_derived_field() -> None:
    @frozen
    class Box:
        w: int
        area: int = dataclasses.field(init=False)

        def __post_init__(self) -> None:
            object.__setattr__(self, "area", self.w * self.w)

    assert Box(3).area == 9 and Box(3) == Box(3)


def test_the_package_defines_its_value_classes_with_frozen() -> None:
    """Each ``@dataclass(frozen=True)`` costs every run the compiling of five methods
    more than ``@frozen`` does (tessera/frozen.py)."""
    package = Path(tessera.__file__).parent
    slow = [
        f"{path.relative_to(package.parent)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if line.lstrip().startswith("@dataclass(frozen=True")
    ]
    assert not slow, f"use @frozen (tessera/frozen.py) at {', '.join(slow)}"


def test_the_suite_checks_immutability() -> None:
    """tests/conftest.py turns the checks on before the package is imported."""
    from tessera import checks

    assert checks.ENABLED
