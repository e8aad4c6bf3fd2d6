"""A product of int8 tensors becomes the library's exact int8 GEMM and an i32 join.

``a @ b`` of i8 operands is an i32 tensor: the exact sum of the products, as NumPy's
``a.astype(np.int32) @ b.astype(np.int32)`` and PyTorch's ``torch._int_mm`` give it
(sema refuses, or guards at run time, a K past ``INT8_MAX_K``, so it never wraps). A
tile holds its values as f32s, which are exact integers only below 2^24, and such a
sum reaches 2^14 * K; so

    %y = matmul %a, %b : i32

becomes

    %high, %low = tile_call %a, %b      (the standard library's gemm_i8)
    %y = join_i32 %high, %low           (high * 4096 + low, in i32)

``gemm_i8`` keeps the sum in two f32 accumulators that stay exact integers (docs/
numerics.md, W8A8) and ``join_i32`` adds them in integer arithmetic on every target. An
``f32(y)`` after it (a W8A8 layer's scales) is the exact sum rounded once to f32, and
fuses with the join into one elementwise kernel. Batch dims are the product's own; a
``[N, K]`` weight (``a @ b.T``) is transposed into ``[K, N]`` first.

Other i32 arithmetic (``a @ b + c``, a sum, a transpose) computes in f32, as every i32
op of a graph function does, exact below 2^24; a product's sums reach 2^14 * K, so a
product read by anything but a float cast or a reshape (a view) must have K at most
``I8_EXACT_ROWS``: an error at the reader's line where K is known, a run-time guard where
it is symbolic, never a rounded integer.
"""

from __future__ import annotations

from dataclasses import replace

from ..frontend.diagnostics import CompileError, Diagnostic, Note, Severity
from .dims import Dim
from .dtypes import F32, I8_EXACT_ROWS
from .ir import Block, Function, GraphModule, Guard, Op, TileCallee, Value, new_value, walk
from .library import stdlib_kernel
from .rewrite import map_functions
from .types import TensorType

__all__ = ["int8_products", "JOIN_RADIX"]

#: The weight of ``gemm_i8``'s high part: the sum is ``high * JOIN_RADIX + low``.
JOIN_RADIX = 4096


def int8_products(module: GraphModule) -> GraphModule:
    """Every ``i8 @ i8`` of the module's graph functions as ``gemm_i8`` and its join."""
    return map_functions(module, _function)


def _function(function: Function) -> Function:
    if function.kind == "tile":
        return function
    readers: dict[int, list[Op]] = {}
    for op in walk(function.body):
        for v in op.operands:
            readers.setdefault(v.id, []).append(op)
    guards = list(function.guards)
    for op in walk(function.body):
        if _int8(op):
            _check_readers(op, readers, guards)
    return replace(function, body=_block(function.body), guards=tuple(guards))


def _check_readers(op: Op, readers: dict[int, list[Op]], guards: list[Guard]) -> None:
    """Refuse, or guard at run time, i32 arithmetic in f32 on sums that it could round."""
    k = op.operands[0].type.dims[-1]
    reader = _integer_reader(op.result, readers)
    if reader is None or (k.constant is not None and k.constant <= I8_EXACT_ROWS):
        return
    why = (
        f"i32 arithmetic on an i8 product's result ({reader.kind} here) is computed in f32, "
        f"exact below 2^24, which the product's sums pass where K is over {I8_EXACT_ROWS}"
    )
    if k.constant is None:
        guard = Guard("at_most", k, Dim.const(I8_EXACT_ROWS), why, reader.span)
        if all((g.kind, g.left, g.right) != (guard.kind, k, guard.right) for g in guards):
            guards.append(guard)
        return
    note = Note(f"the product, of K = {k.constant}", op.span)
    message = f"{why}; cast the product to f32 first, as a W8A8 layer's scales do"
    raise CompileError((Diagnostic(Severity.ERROR, message, reader.span, (note,)),))


def _integer_reader(value: Value, readers: dict[int, list[Op]]) -> Op | None:
    """The first op that reads ``value`` (or a reshape of it) as an integer: anything but
    a cast to a float dtype and a reshape, which views it."""
    for reader in readers.get(value.id, ()):
        if reader.kind == "reshape":
            found = _integer_reader(reader.result, readers)
        elif reader.kind == "cast" and reader.result.type.dtype.is_float:
            found = None
        else:
            found = reader
        if found is not None:
            return found
    return None


def _block(block: Block) -> Block:
    ops: list[Op] = []
    for op in block.ops:
        op = replace(op, regions=tuple(_block(r) for r in op.regions))
        ops.extend(_product(op) if _int8(op) else (op,))
    return replace(block, ops=tuple(ops))


def _int8(op: Op) -> bool:
    """Whether ``op`` is a product of i8 matrices (canonicalization makes a vector
    operand one)."""
    return (
        op.kind == "matmul"
        and op.attr("schedule") is None
        and all(v.type.dtype.name == "i8" and v.type.rank >= 2 for v in op.operands)
    )


def _product(op: Op) -> list[Op]:
    """The ``tile_call`` of ``gemm_i8`` and the ``join_i32`` of its two parts; for
    ``a @ b.T``, after a transpose of ``b`` into ``[K, N]`` (a copy of its bytes, which the
    CPU's VNNI product takes as it takes any ``[K, N]`` operand)."""
    a, b = op.operands
    out = op.result.type
    part = TensorType(out.dims, F32)
    ops: list[Op] = []
    if op.attr("trans_b"):
        perm = (*range(b.type.rank - 2), b.type.rank - 1, b.type.rank - 2)
        dims = tuple(b.type.dims[i] for i in perm)
        b_kn = new_value(b.type.with_(dims=dims), None, op.span)
        ops.append(Op("transpose", (b,), (b_kn,), (("perm", perm),), span=op.span,
                      backward=op.backward))  # fmt: skip
        b = b_kn
    names = ("a", "b")
    function = stdlib_kernel("gemm_i8", (a.type, b.type), (part, part), op.span, names)
    high, low = (new_value(part, name, op.span) for name in ("high", "low"))
    attrs = (("kernel", TileCallee("gemm_i8", function)), ("params", names), ("constants", ()))
    ops.append(Op("tile_call", (a, b), (high, low), attrs, span=op.span, backward=op.backward))
    ops.append(Op("join_i32", (high, low), op.results, (("radix", JOIN_RADIX),), span=op.span,
                  backward=op.backward))  # fmt: skip
    return ops
