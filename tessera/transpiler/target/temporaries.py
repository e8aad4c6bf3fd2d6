"""What generated code calls the values the ``.tsr`` source leaves unnamed.

A value the source assigns keeps the source's name (``mean_square``). A value the
source computes inside an expression (``tile.rsqrt(mean_square + eps)``) has none, and
is called after what it holds: after its op and the names of its operands
(``mean_square_eps``, then ``rsqrt_mean_square_eps``), after the conventional name of
a common pattern (``sum_sq``, ``row_max``, ``row_mean``, ``log_sum_exp``), or after the
role it plays in the op that reads it (``row_index`` of a causal mask, ``out_tile`` of
a store into ``out``). Only where none of these fits does the emitter fall back to its
generic letter (``v``, ``t``, ``s``).

This module says which name a value *wants*; the emitter's ``Namer`` makes it legal and
unique, so a wanted name that a keyword, a C library function, a helper of the tile
headers or an earlier value holds gets a numeric suffix there.
"""

from __future__ import annotations

import re

from ..graph.ir import Block, Op, Value, walk
from ..graph.types import ScalarType, TileType
from .naming import C_KEYWORDS, C_LIBRARY

__all__ = ["Temporaries"]

#: Ops whose result holds the same elements as their operand, seen another way: a
#: value they make is named after what it views.
_VIEWS = frozenset({"expand_dims", "cast", "mask_edge", "broadcast", "reshape", "squeeze"})
#: Reductions along one axis of a tile.
_REDUCTIONS = frozenset({"sum", "max", "min", "mean", "prod"})
#: How the names of a binary op's two operands are joined (``variance_plus_bias``); a
#: sum with a scalar is written as the two names alone (``mean_square_eps``), as a
#: reader says "plus epsilon" without the "plus".
_JOINS = {"add": "plus", "sub": "minus", "mul": "times", "div": "over", "pow": "pow"}
#: The name of a binary op's result whose operands have no short name.
_RESULTS = {"add": "total", "sub": "diff", "mul": "product", "div": "quotient", "pow": "power"}
#: The end of a unary op's generic name (``exp_val``), where its operand has none.
_GENERIC = "_val"
#: Operands that an op's signature names, by the op and the operand's position: an
#: unnamed operand is called after its role there.
_ROLES = {"mask_causal": {1: "row_index", 2: "col_index"}}
#: The longest name composed of its operands' names; a longer one is shortened to its
#: op's word, as a name that reads like the whole expression no longer helps.
MAX_COMPOSED = 24


def _base(name: str) -> str:
    """A source name without the version the SSA form gives each assignment
    (``acc.1`` is ``acc``), as an operand's name reads in a composed name."""
    return re.sub(r"\W", "_", name.split(".")[0]).strip("_")


class Temporaries:
    """The wanted names of one kernel's values, computed from its ops once each."""

    def __init__(self, body: Block, params: tuple[Value, ...] = ()) -> None:
        self.producers: dict[int, Op] = {r.id: op for op in walk(body) for r in op.results}
        #: Each value's readers, with the position it has among their operands.
        self.readers: dict[int, list[tuple[Op, int]]] = {}
        for op in walk(body):
            for i, v in enumerate(op.operands):
                self.readers.setdefault(v.id, []).append((op, i))
        #: Names the source gives (values and parameters): a composed name that would
        #: take one of them keeps clear of it, so the source's names are the ones kept.
        self.source = {_base(v.name) for v in (*params, *_values(body)) if v.name}
        self.memo: dict[int, str | None] = {}
        # In program order, so that each value's operands are named before it is: a name
        # composed from a chain of a thousand ops recurses one level, not a thousand.
        for op in walk(body):
            for r in op.results:
                self.wanted(r)

    def wanted(self, v: Value) -> str | None:
        """The name ``v`` should have: the source's, else one composed from what it
        holds; None where nothing better than the emitter's generic letter is known."""
        if v.name:
            return v.name
        if v.id not in self.memo:
            self.memo[v.id] = None  # (a cycle through a loop's values names nothing)
            name = self._composed(v)
            if name is not None and name in self.source:
                name = f"{name}_tmp"
            self.memo[v.id] = name
        return self.memo[v.id]

    # -- composing ---------------------------------------------------------------------

    def _short(self, v: Value) -> str | None:
        """``v``'s name as part of another's: its base; None where ``v`` has only an
        op's generic word (``total``, ``gelu_val``), which says nothing more there."""
        name = self.wanted(self._seen_through(v))
        if name is None or name in _RESULTS.values() or name.endswith(_GENERIC):
            return None
        return _base(name) or None

    def _seen_through(self, v: Value) -> Value:
        """``v``, or the value it views."""
        op = self.producers.get(v.id)
        while op is not None and op.kind in _VIEWS and op.operands and not v.name:
            v = op.operands[0]
            op = self.producers.get(v.id)
        return v

    def _composed(self, v: Value) -> str | None:
        op = self.producers.get(v.id)
        if op is None:
            return self._from_readers(v)
        if op.kind in _VIEWS:
            # a tile converted for its store is the stored tile (``out_tile``)
            name = self._from_readers(v) or self._view(op)
            return name if name is None or len(name) <= MAX_COMPOSED else None
        name = self._from_producer(op)
        if name is not None and len(name) > MAX_COMPOSED:
            name = self._word(op)
        return name or self._from_readers(v) or self._generic(op)

    def _from_readers(self, v: Value) -> str | None:
        """A name from the one op that reads ``v``: its role there, or the tile of the
        tensor it is stored into (``out_tile``)."""
        readers = self.readers.get(v.id, [])
        if len(readers) != 1:
            return None
        op, position = readers[0]
        if position in _ROLES.get(op.kind, {}):
            return _ROLES[op.kind][position]
        if op.kind == "store" and position == 1 and op.operands[0].name:
            return f"{_base(op.operands[0].name)}_tile"
        return None

    def _word(self, op: Op) -> str | None:
        """The name an op's result has when its operands' names are too long to join."""
        if op.kind in _RESULTS:
            return _RESULTS[op.kind]
        if len(op.operands) == 1 and op.kind not in _VIEWS:
            return f"{op.kind}{_GENERIC}"
        return None

    def _from_producer(self, op: Op) -> str | None:
        kind = op.kind
        tiles = [v for v in op.operands if isinstance(v.type, TileType)]
        scalars = [v for v in op.operands if isinstance(v.type, ScalarType)]
        if kind in _REDUCTIONS and len(tiles) == 1:
            return self._reduction(op, tiles[0])
        if kind in _JOINS:
            return self._binary(op, tiles, scalars)
        if kind == "transpose" and tiles:
            return self._view(op)
        if kind in ("dot", "mma"):
            return "dot"
        if kind == "load" and op.operands and op.operands[0].name:
            return f"{_base(op.operands[0].name)}_tile"
        if kind == "read" and op.operands and op.operands[0].name:
            return re.sub(r"_smem(_\d+)?$", "", _base(op.operands[0].name)) or None
        if kind == "dim_to_float":
            dim = re.sub(r"\W+", "_", str(op.attr("dim"))).strip("_")
            return f"float_{dim}" if dim else None
        if kind == "where":
            return "selected"
        if kind == "iota":
            return None  # a role in its reader, or nothing: ``indices`` says no more
        if kind == "full":
            return "zeros" if op.attr("value") == 0 else "filled"
        if len(op.operands) == 1 and len(tiles) + len(scalars) == 1:
            return self._unary(op, op.operands[0])
        return None

    @staticmethod
    def _generic(op: Op) -> str | None:
        """Any other op's result (``gather``, ``less``, ``concat``) by the op's name, but
        not one that a keyword or a C function has (``const``), nor control flow's."""
        if op.regions or op.kind in C_KEYWORDS or op.kind in C_LIBRARY:
            return None
        return op.kind if re.fullmatch(r"[a-z][a-z0-9_]*", op.kind) else None

    def _view(self, op: Op) -> str | None:
        """A view that the code holds apart from what it views: a cast after its dtype
        (``normed_bf16``), a masked tile as masked, a transpose as ``_t``, another by the
        viewed name."""
        viewed = self.wanted(self._seen_through(op.operands[0])) if op.operands else None
        short = _base(viewed) if viewed else None  # (a generic word too: ``product_masked``)
        if not short:
            return None
        if op.kind == "transpose":
            return f"{short}_t"
        if op.kind == "cast" and op.attr("dtype") is not None:
            return f"{short}_{op.attr('dtype')}"
        return f"{short}_masked" if op.kind == "mask_edge" else short

    def _reduction(self, op: Op, x: Value) -> str:
        """``sum_sq`` and ``sum_exp`` by their usual names; else ``row_max`` along a
        row (the last axis), ``col_sum`` down a column, ``max_all`` of the rest."""
        inner = self.producers.get(self._seen_through(x).id)
        if op.kind == "sum" and inner is not None:
            if inner.kind == "mul" and len({v.id for v in inner.operands}) == 1:
                return "sum_sq"
            if inner.kind == "exp":
                return "sum_exp"
        rank = len(getattr(x.type, "dims", ()))
        axis = op.attr("axis")
        if isinstance(axis, int) and rank == 2:
            return f"{'row' if axis in (1, -1) else 'col'}_{op.kind}"
        return f"{op.kind}_all"

    def _binary(self, op: Op, tiles: list[Value], scalars: list[Value]) -> str | None:
        kind = op.kind
        if kind == "mul" and len(op.operands) == 2 and op.operands[0] is op.operands[1]:
            short = self._short(op.operands[0])
            return f"{short}_sq" if short else "sq"
        names = [self._short(v) for v in op.operands]
        summed = self.producers.get(self._seen_through(op.operands[0]).id)
        if kind == "div" and summed is not None and summed.kind == "sum" and not tiles[1:]:
            # a sum over a count (a scalar): its mean
            mean = {"row_sum": "row_mean", "col_sum": "col_mean", "sum_sq": "mean_sq"}
            return mean.get(self._reduction(summed, summed.operands[0]), "mean")
        if len(op.operands) == 2 and all(names):
            a, b = names
            first_scalar = [isinstance(v.type, ScalarType) for v in op.operands] == [True, False]
            if (kind == "add" and first_scalar) or (kind == "mul" and scalars and not first_scalar):
                a, b = b, a  # the tile first in a sum (``var_eps``), last in a product
            if kind == "add" and scalars:
                return f"{a}_{b}"
            return f"{a}_{_JOINS[kind]}_{b}"
        if len(op.operands) == 1 and names[0] and kind in ("mul", "div"):
            return f"scaled_{names[0]}"  # by a constant
        return _RESULTS[kind]

    def _unary(self, op: Op, x: Value) -> str:
        short = self._short(x)
        return f"{op.kind}_{short}" if short else f"{op.kind}{_GENERIC}"


def _values(block: Block) -> list[Value]:
    """Every value ``block`` defines: its ops' results and its regions' arguments."""
    values = list(block.args)
    for op in walk(block):
        values.extend(op.results)
        for region in op.regions:
            values.extend(region.args)
    return values
