"""A product by a dequantized weight becomes one kernel that dequantizes in its main loop.

``x @ dequantize(q, scale, group=G, dtype=x.dtype)`` is, after semantic analysis, the
elementwise math of ``dequantize`` (``graph.quant``) and a ``matmul``: fused as they
are, one kernel writes the whole weight in ``x``'s dtype (two or four times the bytes
of an i8 or packed i4 weight) and the product reads it back. A W8A16 or W4A16 linear
layer is bound by reading its weight, so that temporary costs more than the product.
The chain

    %r = reshape %q {shape = (K/G, G, N)}            (with group=G only)
    %s' = reshape %scale {shape = (K/G, 1, N)}        (with group=G only)
    %z' = reshape %zero_point {shape = (K/G, 1, N)}   (with a zero point and group=G)
    %w = cast %r {dtype = f32}                        (%q itself without a group)
    %w = sub %w, %z'                                  (with a zero point)
    %d = mul %w, %s'
    %d = cast %d {dtype = x's}                        (unless x is f32)
    %b = reshape %d {shape = (K, N)}                  (with group=G only)
    %y = matmul %x, %b

becomes ``%y = tile_call %x, %q, %scale[, %zero_point]`` of the standard library's
``gemm_dequant_grouped`` (a scale per group of rows) or ``gemm_dequant`` (one per
column), which load a block of ``q`` at a time, dequantize it with the same
operations (so with the same bits) and multiply it into an f32 accumulator. Where
``q`` is i8 or a packed i4 of shape ``[K, N]``, ``scale`` (and the zero point) is f32
``[K/G, N]`` or ``[N]``, ``x`` is ``[M, K]`` or has batch dims before them, the product
accumulates in f32 and no other op reads an intermediate (and ``x``'s K is the weight's
own dim, not one that a guard checks equal at run time). The elementwise ops after
the product (a bias, an activation, a cast) stay its epilogue, as after a ``matmul``.
Anything else (a weight with batch dims, a per-tensor or per-row scale, an fp8 weight,
``x @ dequantize(...).T``, a 16-bit accumulation) keeps the two kernels: the same
result, with the temporary.
"""

from __future__ import annotations

from .dims import Dim
from .ir import Function, GraphModule, Op, TileCallee, Value
from .library import stdlib_kernel
from .rewrite import Rewriter, map_functions, use_counts
from .types import TensorType, in_memory

__all__ = ["dequantized_products"]

#: The weights' dtypes whose dequantization a product takes in.
_WEIGHTS = ("i8", "i4")
#: The activations' (and the dequantized weight's) dtypes.
_ACTIVATIONS = ("bf16", "f16", "f32")
#: The most bytes of a row of activations that one step of the grouped kernel loads (its
#: group's columns): the GPUs stage a block of rows of that many bytes for each of their
#: pipeline's stages, which fits gfx90a's 64 KiB of LDS and sm_80's shared memory up to
#: 256 (a group of 128 in bf16 or f16, 64 in f32).
_GROUP_BYTES = 256


def dequantized_products(module: GraphModule) -> GraphModule:
    return map_functions(module, _function)


def _function(function: Function) -> Function:
    if function.kind == "tile":
        return function
    uses = use_counts(function.body)
    return Rewriter(lambda op, producers: _product(op, producers, uses)).function(function)


class _Chain:
    """Walks a value back through the ops that give it, each with one use."""

    def __init__(self, producers: dict[int, Op], uses: dict[int, int]) -> None:
        self.producers, self.uses = producers, uses

    def op(self, value: Value, kind: str) -> Op | None:
        """The op of ``kind`` that gives ``value``, which nothing else reads."""
        found = self.producers.get(value.id)
        ok = found is not None and found.kind == kind and self.uses.get(value.id) == 1
        return found if ok else None

    def reshaped(self, value: Value, dims: tuple[Dim, ...]) -> Value | None:
        """What ``value`` is a reshape of, to ``dims``: the tensor ``dequantize`` groups."""
        op = self.op(value, "reshape")
        if op is None or op.result.type.dims != dims:
            return None
        return op.operands[0]


def _product(op: Op, producers: dict[int, Op], uses: dict[int, int]) -> Op | None:
    if op.kind != "matmul" or op.attr("trans_b") or op.attr("schedule") is not None:
        return None
    x, b = op.operands
    out = op.result.type
    chain = _Chain(producers, uses)
    if out.dtype.name != "f32" or x.type.dtype.name not in _ACTIVATIONS or b.type.rank != 2:
        return None
    k, n = b.type.dims
    if x.type.rank < 2 or x.type.dims[-1] != k:  # a K that a guard checks: no one size
        return None
    grouped = chain.op(b, "reshape")
    dequantized = grouped.operands[0] if grouped is not None else b
    rounded = chain.op(dequantized, "cast")
    if rounded is not None and rounded.attr("saturate"):
        return None
    scaled = rounded.operands[0] if rounded is not None else dequantized
    if scaled.type.dtype.name != "f32":
        return None
    mul = chain.op(scaled, "mul")
    if mul is None or len(mul.operands) != 2:
        return None
    wide, scale = mul.operands
    sub = chain.op(wide, "sub")
    zero_point = None
    if sub is not None and len(sub.operands) == 2:
        wide, zero_point = sub.operands
    widened = chain.op(wide, "cast")
    if widened is None or widened.result.type.dtype.name != "f32":
        return None
    q = widened.operands[0]
    if grouped is not None:
        found = _grouped(chain, q, scale, zero_point, k, n, x.type.dtype.bits // 8)
        if found is None:
            return None
        q, scale, zero_point = found
    elif not all(t is None or _f32(t, (n,)) for t in (scale, zero_point)):
        return None
    if q.type.dims != (k, n) or q.type.dtype.name not in _WEIGHTS:
        return None
    return _call(op, x, q, scale, zero_point, grouped is not None)


def _grouped(
    chain: _Chain, q: Value, scale: Value, zero_point: Value | None, k: Dim, n: Dim,
    width: int,
) -> tuple[Value, Value, Value | None] | None:  # fmt: skip
    """The weight, its scales and its zero points as ``dequantize(..., group=G)`` reads
    them, where ``q``, ``scale`` and ``zero_point`` are their views in groups; None where
    a group of activations of ``width`` bytes each is more than a step takes."""
    rows = q.type.dims[0] if q.type.rank == 3 else None
    size = q.type.dims[1].constant if rows is not None else None
    if size is None or size * width > _GROUP_BYTES:
        return None
    group = q.type.dims[1]
    weight = chain.reshaped(q, (rows, group, n))
    if weight is None or weight.type.dims != (k, n):
        return None
    tensors = []
    for v in (scale, zero_point):
        source = None if v is None else chain.reshaped(v, (rows, Dim.const(1), n))
        if v is not None and (source is None or not _f32(source, (rows, n))):
            return None
        tensors.append(source)
    return weight, tensors[0], tensors[1]


def _f32(v: Value, dims: tuple[Dim, ...]) -> bool:
    t = v.type
    return isinstance(t, TensorType) and t.dtype.name == "f32" and t.dims == dims


def _call(op: Op, x: Value, q: Value, scale: Value, zero_point: Value | None, grouped: bool) -> Op:
    """The ``tile_call`` of the library kernel that computes ``op`` from the weight,
    typed for these operands as a graph op's kernel is (``stdlib_kernel``). A kernel
    without a zero point has its parameter typed as the scales, bound to nothing, and
    leaves it unread (``with_zero_point=False``)."""
    template = "gemm_dequant_grouped" if grouped else "gemm_dequant"
    tensors = (x, q, scale, zero_point if zero_point is not None else scale)
    operands = tuple(in_memory(v.type) for v in tensors)
    names = ("a", "q", "scale", "zero_point")
    function = stdlib_kernel(template, operands, (in_memory(op.result.type),), op.span, names)
    given = (x, q, scale) if zero_point is None else (x, q, scale, zero_point)
    constants = (("with_zero_point", zero_point is not None),)
    if zero_point is None:
        constants += (("zero_point", None),)
    attrs = (
        ("kernel", TileCallee(template, function)), ("params", names[: len(given)]),
        ("constants", constants),
    )  # fmt: skip
    return Op("tile_call", given, op.results, attrs, span=op.span, backward=op.backward)
