"""A kernel's content as a hashable key, up to its name and its values' identities.

A file whose graph functions call one another (``step`` calling ``qkv``) lowers the
callee's launches again inside each caller: ``examples/decode.tsr`` has 65 kernels, 29
of them the same Tile IR as an earlier one under another name, down to the ``.tsr``
lines they cite. Such a kernel is its twin's ``twin``: the tile passes, the emitter and
the estimates run once for the two, and the output is byte for byte what compiling
each alone gives (``tests/test_twins.py``).

Two kernels have equal keys when every field of every IR object in them is equal,
compared structurally, except three: the kernel's name, function and launch, which the
caller prints itself (``TileKernel.name`` becomes the emitted kernel's name); and the
values, which are compared by where they stand, not by their ids. So that code that
orders values by id (creation order) orders both kernels' values alike, the key also
holds the order of the ids. Fields that equality leaves out (spans, a tile type's tile
names, the name a constant dim is spelled by) are part of the key: they print as
comments and names. Each span's source file is compared by identity, as it is one
object per file in a compilation.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Hashable
from enum import Enum
from fractions import Fraction
from typing import Any

from ..frontend.source import SourceFile, Span
from ..graph.dims import Dim
from ..graph.dtypes import DType
from ..graph.ir import Value
from .ir import TileKernel

__all__ = ["as_twin", "content_key", "find_twins"]

#: The fields of a kernel that its callers print themselves, outside the kernel's code,
#: and the twin that this key finds.
_NAMING = frozenset({"name", "function", "launch", "twin"})
#: Classes whose equality compares everything they hold, with no value inside.
_STRUCTURAL = frozenset({DType, str, int, float, bool, Fraction, type(None)})


class _Key:
    """One kernel's walk: values numbered in the order the walk meets them."""

    def __init__(self) -> None:
        self.values: dict[int, int] = {}
        #: How many times the walk has met a value, to tell a part that holds none.
        self.met = 0
        #: The keys of the parts that hold no value, by identity (types, accesses: the
        #: IR shares them between many values and ops).
        self.parts: dict[int, Hashable] = {}
        self.fields: dict[type, tuple[str, ...]] = {}

    def of(self, x: Any) -> Hashable:
        kind = type(x)
        if kind in _STRUCTURAL or isinstance(x, Enum):
            return x
        if kind is Dim:  # a constant's spelling prints, though equality leaves it out
            return x if x.written is None else (x, x.spelled)
        if kind is Value:
            self.met += 1
            seen = self.values.get(x.id)
            if seen is not None:
                return ("value", seen)
            self.values[x.id] = len(self.values)
            return ("value", len(self.values) - 1, x.name, self.of(x.type), self.of(x.span))
        if kind is Span:
            return (id(x.source), x.line, x.column, x.end_line, x.end_column)
        known = self.parts.get(id(x))
        if known is not None:
            return known
        met = self.met
        key = self._compound(x)
        if self.met == met:
            self.parts[id(x)] = key
        return key

    def _compound(self, x: Any) -> Hashable:
        if isinstance(x, tuple | list):
            if all(type(item) in _STRUCTURAL for item in x):
                return tuple(x)
            return tuple(self.of(item) for item in x)
        if isinstance(x, dict):
            return ("dict", tuple((self.of(k), self.of(v)) for k, v in x.items()))
        if isinstance(x, frozenset | set):
            return ("set", frozenset(self.of(item) for item in x))
        if dataclasses.is_dataclass(x) and not isinstance(x, SourceFile):
            names = self.fields.get(type(x))
            if names is None:
                names = tuple(f.name for f in dataclasses.fields(x))
                self.fields[type(x)] = names
            return (type(x), tuple(self.of(getattr(x, name)) for name in names))
        hash(x)  # anything else is compared as it compares itself (identity at most)
        return (type(x), x)


def find_twins(kernels: list[TileKernel]) -> dict[str, str]:
    """For each kernel whose content an earlier one of ``kernels`` has, that one's
    name, by the kernel's. The key walk costs about a tenth of emitting a kernel, so it
    is skipped for a kernel that differs from all others in what a glance shows."""
    glances = [_glance(k) for k in kernels]
    seen = Counter(glances)
    first: dict[Hashable, str] = {}
    twins: dict[str, str] = {}
    for kernel, glance in zip(kernels, glances, strict=True):
        if seen[glance] > 1:
            name = first.setdefault(content_key(kernel), kernel.name)
            if name != kernel.name:
                twins[kernel.name] = name
    return twins


def as_twin(done: TileKernel, kernel: TileKernel) -> TileKernel:
    """``done`` (what the passes made of ``kernel``'s twin) as ``kernel``'s own: its
    name, function, launch and line, and ``twin`` naming the kernel it is a copy of.
    The two share their values, which are immutable and compared by identity within a
    kernel only."""
    return dataclasses.replace(
        done, name=kernel.name, function=kernel.function, launch=kernel.launch,
        span=kernel.span, twin=done.name,
    )  # fmt: skip


def _glance(kernel: TileKernel) -> Hashable:
    return (kernel.template, kernel.kind, kernel.tiles, kernel.threads,
            tuple(p.name for p in kernel.params), len(kernel.body.ops))  # fmt: skip


def content_key(kernel: TileKernel) -> Hashable:
    """The key of ``kernel``'s content (see the module's documentation)."""
    walk = _Key()
    fields = tuple(
        walk.of(getattr(kernel, f.name))
        for f in dataclasses.fields(kernel)
        if f.name not in _NAMING
    )
    ids = list(walk.values)
    order = tuple(sorted(range(len(ids)), key=ids.__getitem__))
    return fields, order
