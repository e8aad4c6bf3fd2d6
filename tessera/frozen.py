"""``@frozen``: immutable value classes that cost one compiled method, not six.

``@dataclass(frozen=True)`` writes ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` for each class as Python text and compiles it when
the class is defined. The compiler has about 150 such classes, and compiling their
methods was a third of every ``tesserac`` run. Only ``__init__`` depends on a class's
fields in a way that needs compiling; the other five are the same function for every
class, reading the field names kept on the class. So ``@frozen`` has ``dataclasses``
write ``__init__`` alone and shares the rest:

- equality and hashing compare the tuple of the fields that take part in comparison
  (``field(compare=False)`` leaves one out), between instances of the same class only,
  exactly as ``dataclasses`` does;
- ``repr`` is ``Name(field=value, ...)`` over the fields with ``repr=True``;
- a field is set once, by ``__init__``: assigning or deleting it afterwards raises
  ``dataclasses.FrozenInstanceError``. (``object.__setattr__`` in ``__post_init__`` still
  sets a derived field, as with a frozen dataclass.) Checking that costs each field of
  each instance a Python call (a compilation makes tens of thousands of IR nodes), so it
  is one of the checks that run where ``TESSERA_CHECKS=1`` (``tessera/checks.py``).

A class is still a dataclass: ``fields``, ``replace`` and ``asdict`` work on it. A
method the class body defines itself is kept, as ``dataclasses`` keeps it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, overload

from . import checks

__all__ = ["frozen"]

T = TypeVar("T", bound=type)


@overload
def frozen(cls: T, /) -> T: ...


@overload
def frozen(*, eq: bool = True) -> Callable[[T], T]: ...


def frozen(cls: Any = None, /, *, eq: bool = True) -> Any:
    """Make ``cls`` an immutable dataclass (``eq=False``: compared by identity)."""

    def make(cls: T) -> T:
        cls = dataclasses.dataclass(cls, eq=False, repr=False)
        fields = dataclasses.fields(cls)
        own = cls.__dict__
        if "__repr__" not in own:
            cls._frozen_shown = tuple(f.name for f in fields if f.repr)
            cls.__repr__ = _repr
        if eq:
            cls._frozen_key = _key(f.name for f in fields if f.compare)
            if "__eq__" not in own:
                cls.__eq__ = _eq
            if own.get("__hash__") is None:  # none of its own, as dataclasses decides
                cls.__hash__ = _hash
        if checks.ENABLED:
            cls.__setattr__ = _set_once
            cls.__delattr__ = _no_delete
        return cls

    return make if cls is None else make(cls)


def _key(names: Any) -> Callable[[Any], tuple[Any, ...]]:
    """The tuple of an instance's compared fields (a tuple even for one field, so that
    a NaN field equals itself as it does in ``dataclasses``' tuples)."""
    names = tuple(names)
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        get = attrgetter(names[0])
        return lambda self: (get(self),)
    return lambda self: ()


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        key = self.__class__._frozen_key
        return key(self) == key(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(self.__class__._frozen_key(self))


def _repr(self: Any) -> str:
    cls = type(self)
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in cls._frozen_shown)
    return f"{cls.__qualname__}({shown})"


def _set_once(self: Any, name: str, value: Any) -> None:
    if name in self.__dict__:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _no_delete(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
