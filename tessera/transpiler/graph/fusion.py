"""Fusion: group a graph function's operations into kernels.

Greedy, in program order, the way epilogue fusion works in CUTLASS and
Triton-based compilers:

- A matmul, an attention, a reduction (softmax, norms, sum/max/mean), a
  state update or a collective starts a kernel.
- An elementwise op (arithmetic, activations, casts, dropout, views) joins
  the kernel of the value it consumes when that value has no other user and
  the op does not broadcast it to a larger shape: a matmul's bias,
  activation, residual add and final cast become its epilogue.
- A reduction whose input comes from a chain of elementwise ops joins that
  chain as its prologue (``softmax(x * scale)`` is one kernel).
- Otherwise elementwise ops start a kernel of their own, and the following
  elementwise ops chain onto it.
- A new axis on a value that is in memory (``s[:, None]`` of a parameter, or of an
  earlier kernel's result) is a view: it joins the kernel of the one op that reads it,
  which loads the value there as broadcast along the new axis.

An op joins a kernel only if all its other inputs come from earlier kernels,
so the kernels stay in a data-flow order. Effects are never reordered: ops
keep their program order inside and across kernels. A tile kernel is already
one kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .ir import Function, GraphModule, Group, Op, Value
from .rewrite import map_functions
from .types import ScalarType

__all__ = ["fuse", "op_class", "kernel_order"]

_ANCHORS = {
    "matmul": "gemm",
    "flash_attention": "attention",
    "kvcache.append": "state",
    "all_reduce": "collective",
    "transpose": "layout",
    "split_qkv": "layout",
}
_REDUCTIONS = {
    "softmax", "softmax_safe", "logsumexp_safe", "layernorm", "layernorm_safe",
    "rmsnorm", "rmsnorm_safe", "sum", "max", "mean",
}  # fmt: skip
_ELEMENTWISE = {
    "add", "sub", "mul", "div", "pow", "neg", "exp", "log", "sqrt", "rsqrt", "tanh",
    "sigmoid", "gelu", "silu", "relu", "cast", "dropout", "expand_dims", "reshape",
    "rotary_embedding", "kvcache.k", "kvcache.v",
}  # fmt: skip
#: Kernels that accept an elementwise epilogue.
_TAKES_EPILOGUE = {"gemm", "attention", "reduction", "elementwise"}


def _widens(op: Op, via: Value) -> bool:
    """Whether ``op`` broadcasts ``via`` to a larger shape (``x - mean(x, keepdims=True)``):
    a kernel computes its ops on tiles of its own result's shape, so such an op starts
    the next kernel, which reads ``via`` from memory."""
    dims = getattr(via.type, "dims", None)
    return bool(op.results) and dims is not None and op.results[0].type.dims != dims


def op_class(op: Op) -> str:
    if all(isinstance(r.type, ScalarType) for r in op.results) and op.results:
        return "host"
    if op.kind in _REDUCTIONS:
        return "reduction"
    if op.kind in _ELEMENTWISE:
        return "elementwise"
    return _ANCHORS.get(op.kind, "other")


@dataclass
class _Kernel:
    kind: str
    ops: list[int] = field(default_factory=list)


def _fuse_function(function: Function) -> Function:
    ops = function.body.ops
    if function.kind == "tile":
        return replace(function, groups=(Group("k0", "tile", tuple(range(len(ops)))),))
    if not ops:
        return function
    uses: dict[int, int] = {}
    for op in ops:
        for v in op.operands:
            uses[v.id] = uses.get(v.id, 0) + 1
    for v in function.body.yields:
        uses[v.id] = uses.get(v.id, 0) + 1
    kernels: list[_Kernel] = []
    kernel_of: dict[int, int] = {}  # value id -> kernel index
    views: dict[int, int] = {}  # value id -> index of the view op that gives it

    def can_join(k: int, op: Op, via: int) -> bool:
        return all(kernel_of.get(v.id, -1) <= k for v in op.operands if v.id != via)

    for index, op in enumerate(ops):
        if op.kind == "expand_dims" and uses.get(op.result.id) == 1:
            views[op.result.id] = index  # placed with its reader
            continue
        cls = op_class(op)
        viewed = [views.pop(v.id) for v in op.operands if v.id in views]
        if cls != "elementwise":  # only an elementwise op loads a view where it reads it
            for i in viewed:
                kernels.append(_Kernel("elementwise", [i]))
                kernel_of[ops[i].result.id] = len(kernels) - 1
            viewed = []
        target = None
        if cls in ("elementwise", "reduction"):
            for v in sorted(op.operands, key=lambda v: -kernel_of.get(v.id, -1)):
                k = kernel_of.get(v.id)
                if k is None or uses.get(v.id) != 1 or not can_join(k, op, v.id):
                    continue
                if cls == "elementwise" and _widens(op, v):
                    continue
                if cls == "elementwise" and kernels[k].kind in _TAKES_EPILOGUE:
                    target = k
                elif cls == "reduction" and kernels[k].kind == "elementwise":
                    target = k
                    kernels[k].kind = "reduction"
                break
        sources = {kernel_of.get(ops[i].operands[0].id) for i in viewed}
        if target is not None and target in sources:
            target = None  # the viewed value is this kernel's own: it reads it from memory
        if target is None:
            kernels.append(_Kernel(cls if cls != "other" else op.kind))
            target = len(kernels) - 1
        kernels[target].ops = sorted((*kernels[target].ops, *viewed, index))
        for result in op.results:
            kernel_of[result.id] = target
    kernels += [_Kernel("elementwise", [i]) for i in views.values()]  # returned as they are
    groups = tuple(Group(f"k{i}", k.kind, tuple(k.ops)) for i, k in enumerate(kernels))
    return replace(function, groups=groups)


def kernel_order(ops: list[Op]) -> list[Op]:
    """A group's ops in the order its kernel computes them: program order, but a view
    (an ``expand_dims`` the group loads) right before the op that reads it, so that it
    is in that op's prologue or epilogue, whichever side of the anchor the reader is."""
    readers = {v.id: op for op in ops for v in op.operands}
    views = {
        id(op) for op in ops
        if op.kind == "expand_dims" and readers.get(op.result.id, op).kind != "expand_dims"
    }  # fmt: skip
    ordered = [op for op in ops if id(op) not in views]
    for op in ops:
        if id(op) in views:
            ordered.insert(ordered.index(readers[op.result.id]), op)
    return ordered


def fuse(module: GraphModule) -> GraphModule:
    return map_functions(module, _fuse_function)
