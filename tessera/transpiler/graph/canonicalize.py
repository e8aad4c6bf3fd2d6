"""Canonical forms, so later passes match one shape of each pattern.

- A constant operand of a commutative op goes on the right: ``2 * x`` is ``x * 2``.
- Subtracting a constant is adding its negation: ``x - 1`` is ``x + -1``.
- A reduction or a softmax over another axis than the last runs on rows. ``x`` is viewed
  as ``[O, K, I]`` (``O`` the axes before the reduced one, ``K`` the reduced one, ``I``
  those after it, each merged: a reshape is a view, no copy), the last two are swapped,
  and the library's row kernel reduces ``[O, I, K]``: ``sum(x, axis=0)`` of a matrix (a
  bias gradient, a column mean) is the row sum of ``x``'s transpose. The result is
  reshaped to the dims asked for, ``keepdims`` included; a softmax's is swapped back.
  Each swap is a kernel of its own, a pass over memory; a transpose the user wrote there
  cancels it (``simplify``).
- A transpose by a permutation that no kernel computes is one that does, between
  reshapes: axes that stay next to each other, in order, are merged first, so
  ``transpose(x, (2, 0, 1))`` of ``[A, B, C]`` is the swap of ``[A*B, C]``. What remains
  is at most a permutation that keeps the last axis, a swap of the last two, and another
  that keeps the last axis.
- A row kernel's op on a vector (``softmax(v)``, ``sum(v)`` of a ``[N]`` tensor) is the op
  on the one row of ``v`` reshaped to ``[1, N]``, reshaped back: a reshape is a view, so
  the row kernel reads ``v`` where it lies. Elementwise ops that compute ``v`` and nothing
  else are computed on rows of their operands instead, so that they stay the row
  kernel's prologue (``softmax(v * 2.0)``).
- A product with a vector operand is made of matrix ops. A matrix times a vector
  (``[M, K] @ [K]``) is the row sums of the elementwise products, in the accumulation
  dtype (``sum(cast(a, f32) * cast(x, f32), axis=-1)``): a row kernel reads the matrix
  once, where a product would compute a tile of columns for one. A vector times a
  matrix (``[K] @ [K, N]``) is the product of its one row, ``[1, K]``, reshaped back.
- A reshape that splits one axis of a transpose that keeps the last axis is a transpose
  of the operand reshaped (``[B, H, S, D]`` of ``[B, S, H, D]`` split into ``[B, G, R, S,
  D]`` is ``[B, S, G, R, D]`` permuted): the reshape is then a view of a tensor in
  memory, and the permutation one that a kernel reads where the rows lie, where a
  reshape of the permuted view would have been a copy. Grouped-query attention splits
  the heads of q, k and v so. It merges those of its result, and a transpose that keeps
  the last axis of that merge is the merge of attention's result transposed, which the
  attention kernel stores where the permutation puts it.
- An elementwise op on a 0-d tensor (``sqrt(sum(v * v))``, ``v / max(abs(v))``) reads it
  as ``[1]``, reshaped (a view), and gives ``[1]``, reshaped back where its own result is
  0-d: the kernel that computes the 0-d value takes the op as its epilogue, or the next
  kernel loads the value broadcast, as it does a kept axis.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ..frontend.source import Span
from .dims import Dim
from .dtypes import DType
from .graph_ops import (
    DRAWN,
    ELEMENTWISE_MATH,
    has_transpose_kernel,
    last_two_swapped,
    rows_permuted,
)
from .ir import Block, Function, GraphModule, Op, Value, new_value
from .rewrite import Rewriter, map_functions, reader_counts
from .types import ScalarType

#: Row kernels that drop the last axis, and those that keep every axis.
_ROW_REDUCTIONS = ("sum", "max", "mean", "logsumexp_safe")
_ROW_MAPS = ("softmax", "softmax_safe", "log_softmax")
_NORMS = ("layernorm", "layernorm_safe", "rmsnorm", "rmsnorm_safe")
#: Ops computed on each element alone; dropout's mask is drawn from the element's
#: row-major position, which is 0 in ``[1]`` as in a 0-d tensor.
_ELEMENTWISE = ELEMENTWISE_MATH | DRAWN

__all__ = ["canonicalize"]

_COMMUTATIVE = ("add", "mul")


def _rule(op: Op, producers: dict[int, Op]) -> Op | Value | None:
    attrs = dict(op.attrs)
    if op.kind in _COMMUTATIVE and _const(attrs.get("a")):
        attrs["b"] = attrs.pop("a")
        return replace(op, attrs=tuple(attrs.items()))
    if op.kind == "sub" and _const(attrs.get("b")):
        attrs["b"] = -attrs["b"]
        return replace(op, kind="add", attrs=tuple(attrs.items()))
    return None


def _const(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _product(dims: Iterable[Dim]) -> Dim:
    first, *rest = dims
    for d in rest:
        first = first * d
    return first


def _reshaped(ops: list[Op], x: Value, dims: tuple[Dim, ...], span: Span) -> Value:
    if dims == x.type.dims:
        return x
    out = new_value(x.type.with_(dims=dims), None, span)
    ops.append(Op("reshape", (x,), (out,), (("shape", dims),), span=span))
    return out


def _transposed(ops: list[Op], x: Value, perm: tuple[int, ...], span: Span) -> Value:
    out = new_value(x.type.with_(dims=tuple(x.type.dims[i] for i in perm)), None, span)
    ops.append(Op("transpose", (x,), (out,), (("perm", perm),), span=span))
    return out


def _reshaped_into(ops: list[Op], last: Op, dims: tuple[Dim, ...], result: Value) -> None:
    """Append ``last``, whose result has ``dims``, so that ``result`` holds it: ``last``
    gives ``result`` itself when the dims agree, else a reshape of ``last`` does."""
    if dims == result.type.dims:
        ops.append(replace(last, results=(result,)))
        return
    out = new_value(result.type.with_(dims=dims), None, last.span)
    ops.append(replace(last, results=(out,)))
    ops.append(Op("reshape", (out,), (result,), (("shape", result.type.dims),), span=last.span))


def _over_rows(function: Function) -> Function:
    """Reductions and softmaxes over another axis than the last as row kernels' ops on
    a swap of the operand viewed as ``[O, K, I]`` (the module's third rule)."""
    ops: list[Op] = []
    for op in function.body.ops:
        x = op.operands[0] if op.operands else None
        if (
            op.kind not in (*_ROW_REDUCTIONS, *_ROW_MAPS) or x is None or x.type.rank < 2
            or op.attr("axis") == x.type.rank - 1
        ):  # fmt: skip
            ops.append(op)
            continue
        axis, dims = op.attr("axis"), x.type.dims
        outer = (_product(dims[:axis]),) if axis else ()
        view = (*outer, dims[axis], _product(dims[axis + 1 :]))
        swap = last_two_swapped(len(view))
        rows = _transposed(ops, _reshaped(ops, x, view, op.span), swap, op.span)
        attrs = {**dict(op.attrs), "axis": len(view) - 1}
        if op.kind in _ROW_REDUCTIONS:
            attrs["keepdims"] = False
            reduced = replace(op, operands=(rows,), attrs=tuple(attrs.items()))
            _reshaped_into(ops, reduced, rows.type.dims[:-1], op.result)
            continue
        mapped = new_value(rows.type.with_(dtype=op.result.type.dtype), None, op.span)
        ops.append(replace(op, operands=(rows,), results=(mapped,), attrs=tuple(attrs.items())))
        back = Op("transpose", (mapped,), (), (("perm", swap),), span=op.span)
        _reshaped_into(ops, back, view, op.result)
    return replace(function, body=Block(function.body.args, tuple(ops), function.body.yields))


def _runs(perm: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The operand's axes in runs that ``perm`` keeps next to each other and in order,
    in the order ``perm`` puts them."""
    runs = [[perm[0]]]
    for axis in perm[1:]:
        if axis == runs[-1][-1] + 1:
            runs[-1].append(axis)
        else:
            runs.append([axis])
    return [tuple(run) for run in runs]


def _with_kernels(perm: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Permutations that each have a kernel and together make ``perm``: one that brings
    the axis ``perm`` puts last to the second-to-last place (keeping the last), the swap
    of the last two, and one that puts the others where ``perm`` does (keeping the last)."""
    if has_transpose_kernel(perm):
        return [perm]
    last, rank = perm[-1], len(perm)
    others = [a for a in perm if a not in (last, rank - 1)]
    before = (*others, last, rank - 1)
    swapped = (*others, rank - 1, last)
    after = tuple(swapped.index(a) for a in perm)
    identity = tuple(range(rank))
    return [p for p in (before, last_two_swapped(rank), after) if p != identity]


def _transposes(function: Function) -> Function:
    """Transposes that no kernel computes as ones that do, between reshapes (the
    module's fourth rule)."""
    ops: list[Op] = []
    for op in function.body.ops:
        if op.kind != "transpose" or has_transpose_kernel(op.attr("perm")):
            ops.append(op)
            continue
        x = op.operands[0]
        runs = _runs(op.attr("perm"))
        order = sorted(runs)  # the runs as they lie in x
        merged = tuple(_product(x.type.dims[a] for a in run) for run in order)
        steps = _with_kernels(tuple(order.index(run) for run in runs))
        value = _reshaped(ops, x, merged, op.span)
        for perm in steps[:-1]:
            value = _transposed(ops, value, perm, op.span)
        last = Op("transpose", (value,), (), (("perm", steps[-1]),), span=op.span)
        _reshaped_into(ops, last, tuple(value.type.dims[i] for i in steps[-1]), op.result)
    return replace(function, body=Block(function.body.args, tuple(ops), function.body.yields))


def _of_vectors(function: Function) -> Function:
    """Row kernels' ops on a vector as ops on its one row (the module's last rule)."""
    ops: list[Op] = []
    producers = {r.id: op for op in function.body.ops for r in op.results}
    readers = reader_counts(function.body)
    for op in function.body.ops:
        x = op.operands[0] if op.operands else None
        if op.kind not in (*_ROW_REDUCTIONS, *_ROW_MAPS, *_NORMS) or x is None or x.type.rank != 1:
            ops.append(op)
            continue
        row = (Dim.const(1), x.type.dims[0])
        matrix = _as_row(x, row, ops, producers, readers, op.span, {})
        result = op.result.type
        if op.kind not in _ROW_REDUCTIONS:
            dims = row
        else:
            dims = (row[0], Dim.const(1)) if op.attr("keepdims") else row[:1]
        rows = new_value(result.with_(dims=dims), None, op.span)
        attrs = op.attrs
        if op.attr("axis") is not None:
            attrs = tuple({**dict(op.attrs), "axis": 1}.items())
        ops.append(replace(op, operands=(matrix, *op.operands[1:]), results=(rows,), attrs=attrs))
        ops.append(Op("reshape", (rows,), op.results, (("shape", result.dims),), span=op.span))
    return replace(function, body=Block(function.body.args, tuple(ops), function.body.yields))


def _as_row(
    value: Value, row: tuple[Dim, Dim], ops: list[Op], producers: dict[int, Op],
    readers: dict[int, int], span: Span | None, done: dict[int, Value],
) -> Value:  # fmt: skip
    """``value``, a vector, as its one row: the elementwise ops that compute it and
    nothing else computed again on rows of their operands (``softmax(v * 2.0)``'s
    product), so that the row kernel computes them where it loads, else a reshape. The
    ops on the vector, now unread, go in ``simplify``. A vector that one op reads twice
    (``d * d``) becomes a row once, in ``done``: two views of one tensor in a kernel would
    make fusion copy it."""
    op = producers.get(value.id)
    if value.id in done:
        return done[value.id]
    if (
        op is None or op.kind not in ELEMENTWISE_MATH or op.effects or readers.get(value.id) != 1
        or any(not isinstance(v.type, ScalarType) and v.type.dims != value.type.dims
               for v in op.operands)
    ):  # fmt: skip
        out = new_value(value.type.with_(dims=row), None, span)
        ops.append(Op("reshape", (value,), (out,), (("shape", row),), span=span))
        done[value.id] = out
        return out
    operands = tuple(
        v if isinstance(v.type, ScalarType)
        else _as_row(v, row, ops, producers, readers, span, done)
        for v in op.operands
    )  # fmt: skip
    out = new_value(op.result.type.with_(dims=row), op.result.name, op.span)
    ops.append(replace(op, operands=operands, results=(out,)))
    done[value.id] = out
    return out


def _vector_products(function: Function) -> Function:
    """Products with a vector operand as ops on matrices (the module's first rule)."""
    ops: list[Op] = []
    for op in function.body.ops:
        if op.kind != "matmul" or min(v.type.rank for v in op.operands) > 1:
            ops.append(op)
            continue
        a, b = op.operands
        result = op.result.type
        if not a.type.dtype.is_float:
            # an integer product is exact only in its library kernel: a vector is a matrix
            # of one row (on the left) or one column (on the right)
            dims = list(result.dims)
            if b.type.rank == 1:
                b = _reshaped(ops, b, (*b.type.dims, Dim.const(1)), op.span)
                dims.append(Dim.const(1))
            if a.type.rank == 1:
                a = _reshaped(ops, a, (Dim.const(1), *a.type.dims), op.span)
                dims.insert(len(dims) - 1, Dim.const(1))
            _reshaped_into(ops, replace(op, operands=(a, b)), tuple(dims), op.result)
            continue
        if b.type.rank > 1:  # a vector times a matrix: the product of its one row
            row = _reshaped(ops, a, (Dim.const(1), *a.type.dims), op.span)
            dims = (*result.dims[:-1], Dim.const(1), result.dims[-1])
            _reshaped_into(ops, replace(op, operands=(row, b)), dims, op.result)
            continue
        # the row sums of the products: the vector first, so that the kernel of the
        # matrix's cast is the latest one the product can join
        b, a = (_cast(ops, v, result.dtype, op.span) for v in (b, a))
        products = new_value(a.type, None, op.span)
        ops.append(Op("mul", (a, b), (products,), span=op.span))
        axis = (("axis", a.type.rank - 1), ("keepdims", False))
        ops.append(Op("sum", (products,), op.results, axis, span=op.span))
    return replace(function, body=Block(function.body.args, tuple(ops), function.body.yields))


def _reshapes_outside(function: Function) -> Function:
    """Reshapes that split or merge an axis moved to the far side of the row
    permutations beside them (the module's second rule)."""
    producers = {r.id: op for op in function.body.ops for r in op.results}
    ops: list[Op] = []
    for op in function.body.ops:
        inner = producers.get(op.operands[0].id) if op.operands else None
        attention = (
            inner is not None
            and inner.operands
            and (getattr(producers.get(inner.operands[0].id), "kind", None) == "flash_attention")
        )
        if inner is None or not (
            (op.kind == "reshape" and rows_permuted(inner) and _split_first(op, inner, ops))
            or (op.kind == "transpose" and rows_permuted(op) and attention
                and inner.kind == "reshape"
                and _merge_after(op, inner, ops))
        ):  # fmt: skip
            ops.append(op)
    return replace(function, body=Block(function.body.args, tuple(ops), function.body.yields))


def _split_first(op: Op, permuted: Op, ops: list[Op]) -> bool:
    """``op``, a reshape that splits axis ``j`` of ``permuted``'s result, as the split of
    the axis it comes from, permuted; False where ``op`` splits no one axis."""
    j = _split_axis(permuted.result.type.dims, op.result.type.dims)
    if j is None or permuted.kind != "transpose":
        return False
    y, perm = permuted.operands[0], permuted.attr("perm")
    at, dims = perm[j], op.result.type.dims
    split = (*y.type.dims[:at], dims[j], dims[j + 1], *y.type.dims[at + 1 :])
    moved = tuple(a for i, p in enumerate(perm) for a in _moved(p, at, i == j))
    ops.append(Op("transpose", (_reshaped(ops, y, split, op.span),), op.results,
                  (("perm", moved),), span=op.span))  # fmt: skip
    return True


def _merge_after(op: Op, merged: Op, ops: list[Op]) -> bool:
    """``op``, a row permutation of ``merged``, a reshape that merges axes ``i`` and
    ``i + 1``, as the permutation of both axes, merged; False where ``merged`` merges
    no two axes."""
    x = merged.operands[0]
    i = _split_axis(merged.result.type.dims, x.type.dims)
    if i is None:
        return False
    moved = tuple(a for p in op.attr("perm") for a in _moved(p, i, p == i))
    permuted = _transposed(ops, x, moved, op.span)
    ops.append(Op("reshape", (permuted,), op.results, (("shape", op.result.type.dims),),
                  span=op.span))  # fmt: skip
    return True


def _moved(axis: int, split: int, both: bool) -> tuple[int, ...]:
    """Where ``axis`` goes once axis ``split`` is two: both halves, or one axis, shifted
    past the split."""
    return (split, split + 1) if both else (axis + (axis > split),)


def _split_axis(whole: tuple[Dim, ...], split: tuple[Dim, ...]) -> int | None:
    """The axis ``j`` of ``whole`` that ``split`` has as two, ``split[j] * split[j + 1]``,
    with every other axis the same; not the last axis (the rows' elements). None if
    ``split`` is no such reshape of ``whole``."""
    if len(split) != len(whole) + 1:
        return None
    for j in range(len(whole) - 1):
        if (
            whole[:j] == split[:j]
            and whole[j + 1 :] == split[j + 2 :]
            and split[j] * split[j + 1] == whole[j]
        ):
            return j
    return None


def _cast(ops: list[Op], x: Value, dtype: DType, span: Span | None) -> Value:
    if x.type.dtype == dtype:
        return x
    out = new_value(x.type.with_(dtype=dtype), None, span)
    ops.append(Op("cast", (x,), (out,), (("dtype", dtype),), span=span))
    return out


def _zero_d_as_one(function: Function) -> Function:
    """Elementwise ops on a 0-d tensor as ops on its one element, ``[1]`` (the module's
    last rule): numpy broadcasting gives the same result, and kernels have no tile of
    rank 0. A new axis on a 0-d tensor is a reshape."""
    ops: list[Op] = []
    for op in function.body.ops:
        if op.kind == "expand_dims" and _zero_d(op.operands[0]):  # s[None]: a reshape
            ops.append(replace(op, kind="reshape", attrs=(("shape", op.result.type.dims),)))
            continue
        if op.kind not in _ELEMENTWISE or not any(_zero_d(v) for v in op.operands):
            ops.append(op)
            continue
        one = (Dim.const(1),)
        operands = tuple(_reshaped(ops, v, one, op.span) if _zero_d(v) else v for v in op.operands)
        _reshaped_into(ops, replace(op, operands=operands), op.result.type.dims or one, op.result)
    return replace(function, body=Block(function.body.args, tuple(ops), function.body.yields))


def _zero_d(value: Value) -> bool:
    return not isinstance(value.type, ScalarType) and value.type.rank == 0


def canonicalize(module: GraphModule) -> GraphModule:
    return map_functions(
        module,
        lambda f: Rewriter(_rule).function(
            _zero_d_as_one(
                _of_vectors(_over_rows(_transposes(_reshapes_outside(_vector_products(f)))))
            )
        ),
    )
