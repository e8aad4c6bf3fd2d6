"""Fusion: group a graph function's operations into kernels.

Greedy, in program order, the way epilogue fusion works in CUTLASS and
Triton-based compilers:

- A matmul, an attention, a reduction (softmax, norms, sum/max/mean), a
  norm's column sums (``norm_param_grad``, a kernel over blocks of columns), a
  state update or a collective starts a kernel.
- An elementwise op (arithmetic, activations, casts, dropout, views) joins
  the kernel of the value it consumes when that value has no other user and
  the op does not broadcast it to a larger shape: a matmul's bias,
  activation, residual add and final cast become its epilogue.
- A value that several ops read, or one twice (``y * sigmoid(y)``, ``y * y``), or that
  the function also returns, is read by its elementwise readers where its kernel
  computes it: they join that kernel, which keeps it in registers. The others (a
  reduction, a product, an op that broadcasts it, the caller) read it from memory, so
  its kernel writes it too. Only a kernel of elementwise ops alone writes several values
  (``a = x * y; return a, exp(a) + 1.0`` is one kernel, and so is ``fused_adam``, which
  writes the parameter and both moments), each of the shape the kernel computes over,
  stored where the kernel stores its last value. Any other kernel writes one value:
  where another of its values has to be written, ``fuse`` groups again with that value's
  readers starting after it, until no such kernel writes two.
- A reduction with ``keepdims=True`` takes numbers and scalars after it, but an op that
  reads another tensor starts the next kernel: the kept axis is stored as without it.
- A reduction or a transpose whose input comes from a chain of elementwise ops joins
  that chain as its prologue (``softmax(x * scale)`` is one kernel). A transpose's
  result takes an epilogue too: ``relu(x * 2.0).T + y`` is one kernel.
- A call of a tile kernel of the file (``tile_call``) starts a kernel, which runs the
  tile kernel; elementwise ops after it become its epilogue, applied to the tile it
  returns before the store, as after a product. Its operands are read from memory: no
  prologue computes them.
- Otherwise elementwise ops start a kernel of their own, and the following
  elementwise ops chain onto it.
- A new axis on a value that is in memory (``s[:, None]`` of a parameter, or of an
  earlier kernel's result) is a view: it joins the kernel of the one elementwise op
  that reads it, which loads the value there as broadcast along the new axis.
- A transpose that keeps the last axis (``[S, H, D]`` as ``[H, S, D]``) is a view of the
  same kind: the elementwise op that reads it loads the operand's rows where they lie,
  and so do an attention that reads it as q, k or v (heads split from ``[S, H*D]``) and
  a product that reads it as an operand (``q @ k.T`` of split heads).
  Each of ``split_qkv``'s three results is such a view of a block of the projection's
  columns. One that no such op reads alone is an elementwise kernel that copies.
- A reshape of a value in memory is a view too, and joins the kernel of its one reader
  of any kind: that kernel reads the tensor with the new dims. A returned reshape of a
  kernel's result joins that kernel, which writes the result with the new dims.
- A scalar computed from sizes, numbers and scalar parameters (``1 / sqrt(float(D))``)
  is computed again by every kernel whose elementwise ops read it: each such op gets its
  own copy of the computation, which joins the op's kernel as a view does. A few scalar
  instructions per program cost less than a launch, and no backend then needs code
  outside its kernels.

An op joins a kernel only if all its other inputs come from earlier kernels,
so the kernels stay in a data-flow order. Effects are never reordered: ops
keep their program order inside and across kernels. A tile kernel is already
one kernel.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from .graph_ops import DRAWN, ELEMENTWISE_MATH, retyping_view, rows_permuted
from .ir import Block, Function, GraphModule, Group, Op, Value, new_value
from .rewrite import map_functions, remove_dead
from .types import ScalarType, TensorType

__all__ = ["fuse", "op_class", "kernel_order", "CACHE_VIEWS"]

#: A cache's ``K`` and ``V`` (``cache.K``, and the splits ``flash_attention(q, cache)``
#: reads): views of the caller's arrays, which the kernel that reads them loads where
#: they lie (``tile.build``).
CACHE_VIEWS = ("kvcache.k", "kvcache.v")

_ANCHORS = {
    "matmul": "gemm",
    "flash_attention": "attention",
    "attention_stats": "attention",
    "attention_dq": "attention",
    "attention_dkdv": "attention",
    "norm_param_grad": "columns",
    "kvcache.append": "state",
    "kvcache.advance": "state",
    "kvcache.visible": "state",
    "kvcache.lengths": "state",
    "all_reduce": "collective",
    "all_gather": "collective",
    "reduce_scatter": "collective",
    "all_to_all": "collective",
    "transpose": "layout",
    "tile_call": "tile_call",
}
_REDUCTIONS = {
    "softmax", "softmax_safe", "log_softmax", "logsumexp_safe", "layernorm", "layernorm_safe",
    "rmsnorm", "rmsnorm_safe", "sum", "max", "mean", "take_along_axis",
    "put_along_axis", "scatter_add", "pad", "softmax_grad",
    "log_softmax_grad", "layernorm_grad", "rmsnorm_grad",
}  # fmt: skip
_ELEMENTWISE = {
    *ELEMENTWISE_MATH, *DRAWN, "expand_dims", "reshape", "rotary_embedding", *CACHE_VIEWS,
}  # fmt: skip
#: Elementwise ops that a library row kernel computes: it loads its first operand
#: through a prologue, and its other operands (rotary's cos and sin) from memory.
_LIBRARY_ROWS = {"rotary_embedding"}
#: Kernels that accept an elementwise epilogue.
_TAKES_EPILOGUE = {"gemm", "attention", "reduction", "elementwise", "layout", "tile_call"}


def _reads_another_tensor(op: Op, k: int, kernel_of: dict[int, int]) -> bool:
    """Whether ``op`` reads a tensor that kernel ``k`` does not compute."""
    return any(isinstance(v.type, TensorType) and kernel_of.get(v.id) != k for v in op.operands)


def _widens(op: Op, via: Value) -> bool:
    """Whether ``op`` broadcasts ``via`` to a larger shape (``x - mean(x, keepdims=True)``):
    a kernel computes its ops on tiles of its own result's shape, so such an op starts
    the next kernel, which reads ``via`` from memory."""
    dims = getattr(via.type, "dims", None)
    return bool(op.results) and dims is not None and op.results[0].type.dims != dims


def op_class(op: Op) -> str:
    if _is_scalar(op):
        return "host"
    if rows_permuted(op):
        return "elementwise"
    if op.kind in _REDUCTIONS:
        return "reduction"
    if op.kind in _ELEMENTWISE:
        return "elementwise"
    return _ANCHORS.get(op.kind, "other")


def _is_scalar(op: Op) -> bool:
    return bool(op.results) and all(isinstance(r.type, ScalarType) for r in op.results)


def _pure_scalar(op: Op) -> bool:
    """Whether ``op`` computes a scalar that a kernel may compute again where it is read."""
    return _is_scalar(op) and not op.effects and not op.regions


def _scalars_per_reader(block: Block) -> Block:
    """Give each elementwise op its own copy of the scalar computations it reads, placed
    right before it, so that each copy can join that op's kernel."""
    producer: dict[int, Op] = {}
    ops: list[Op] = []

    def copy(value: Value) -> Value:
        op = producer.get(value.id)
        if op is None:  # a parameter, or a scalar with effects: read as it is
            return value
        operands = tuple(copy(v) for v in op.operands)
        results = tuple(new_value(r.type, r.name, r.span) for r in op.results)
        ops.append(replace(op, operands=operands, results=results))
        return results[op.results.index(value)]

    for op in block.ops:
        if _pure_scalar(op):
            producer.update((r.id, op) for r in op.results)
        elif op_class(op) == "elementwise" and any(v.id in producer for v in op.operands):
            op = replace(op, operands=tuple(copy(v) for v in op.operands))
        ops.append(op)
    return remove_dead(Block(block.args, tuple(ops), block.yields))


def _is_view(op: Op) -> bool:
    return op.kind in ("expand_dims", "reshape", *CACHE_VIEWS) or rows_permuted(op)


def _placed_with_reader(op: Op, reader_count: dict[int, int]) -> bool:
    """A view, or a scalar computation, that joins the kernel of its one reader (which
    may read it twice: ``v * v``)."""
    placed = _is_view(op) or _pure_scalar(op)
    return placed and all(reader_count.get(r.id) == 1 for r in op.results)


def _read_in_place(reader: Op, view: Op) -> bool:
    """Whether ``reader``'s kernel loads the view's tiles where they lie: attention reads
    its q, k and v, and a product its operands, through a row permutation (heads split
    from ``[S, H*D]`` as ``[H, S, D]``, or by ``split_qkv``), a block of whole rows at a
    time."""
    operands = {"flash_attention": 3, "matmul": 2}.get(reader.kind, 0)
    return rows_permuted(view) and view.result in reader.operands[:operands]


def _stored_in_place(kernel: _Kernel, op: Op, ops: tuple[Op, ...]) -> bool:
    """Whether an attention kernel writes its result through ``op``, a row permutation of
    it (heads merged back from ``[H, S, D]`` as ``[S, H, D]``), where nothing else reads
    the result: the kernel stores each block of rows where it lies in the permuted
    tensor, which then needs no copy."""
    return (
        kernel.kind == "attention"
        and op.kind == "transpose"
        and rows_permuted(op)
        and ops[kernel.ops[-1]].results == (op.operands[0],)
    )


@dataclass
class _Kernel:
    kind: str
    ops: list[int] = field(default_factory=list)
    #: the index of the op that the kernel is built around (a product, a reduction), whose
    #: prologue values its epilogue cannot read; None for elementwise ops alone
    anchor: int | None = None
    #: whether one of its ops keeps a reduced axis (``keepdims``)
    keeps_dims: bool = False

    def add(self, indices: Iterable[int], ops: tuple[Op, ...]) -> None:
        """Take in ops by index, kept in program order. Ops mostly come in order, so
        that this costs a constant time each and fusing a long program stays linear."""
        for i in indices:
            insort(self.ops, i)
            self.keeps_dims |= bool(ops[i].attr("keepdims"))


def _takes_epilogue(kernel: _Kernel, ops: tuple[Op, ...]) -> bool:
    """Whether elementwise ops may follow the kernel's anchor: a transpose's result is
    one tile like a product's, but a kernel that writes its result through a row
    permutation (``_stored_in_place``) has its last op stored, and one whose anchor
    has several results (a tile kernel's ``return a, b``) stores them as they are."""
    last = ops[kernel.ops[-1]]
    if kernel.anchor is not None and last is not ops[kernel.anchor] and rows_permuted(last):
        return False
    if kernel.anchor is not None and len(ops[kernel.anchor].results) > 1:
        return False
    return kernel.kind in _TAKES_EPILOGUE


def _fuse_function(function: Function) -> Function:
    if function.kind == "tile":
        ops = function.body.ops
        return replace(function, groups=(Group("k0", "tile", tuple(range(len(ops)))),))
    function = replace(function, body=_scalars_per_reader(_results_copied(function)))
    ops = function.body.ops
    if not ops:
        return function
    uses: dict[int, int] = {}
    readers: dict[int, set[int]] = {}
    for index, op in enumerate(ops):
        for v in op.operands:
            uses[v.id] = uses.get(v.id, 0) + 1
            readers.setdefault(v.id, set()).add(index)
    for v in function.body.yields:
        uses[v.id] = uses.get(v.id, 0) + 1
        readers.setdefault(v.id, set()).add(-1)
    shared = {
        v for v, at in readers.items()
        if uses[v] > 1 and any(i >= 0 and op_class(ops[i]) == "elementwise" for i in at)
    }  # fmt: skip
    while True:
        kernels = _kernels(ops, uses, readers, shared)
        escaped = _escaped(kernels, ops, readers)
        unshared = escaped & shared | _shared_above(escaped - shared, kernels, ops, shared)
        if not unshared:
            break
        shared -= unshared
    groups = tuple(Group(f"k{i}", k.kind, tuple(k.ops)) for i, k in enumerate(kernels))
    return replace(function, groups=groups)


def _shared_above(
    escaped: set[int], kernels: list[_Kernel], ops: tuple[Op, ...], shared: set[int]
) -> set[int]:
    """The shared values through which ``escaped`` values joined their kernels: each is
    then written, so that what reads it starts a kernel of its own (``t = g / d`` joins
    the kernel of the shared ``d``, and a sum, or the caller, reads ``t``)."""
    producer = {r.id: op for op in ops for r in op.results}
    kernel_of = {r.id: k for k, kernel in enumerate(kernels) for i in kernel.ops
                 for r in ops[i].results}  # fmt: skip
    found: set[int] = set()
    todo = list(escaped)
    while todo:
        op = producer.get(todo.pop())
        if op is None:
            continue
        for v in op.operands:
            same = kernel_of.get(v.id) == kernel_of.get(op.results[0].id)
            if v.id in shared and same:
                found.add(v.id)
            elif same:
                todo.append(v.id)
    return found


def _results_copied(function: Function) -> Block:
    """The body, where the function returns a tensor parameter as it is (``return x``,
    ``x * 1.0`` once ``simplify`` is done, ``transpose(x, (0, 1))``), or returns a value
    a second time (``return y, y``), with a copy of it returned instead: a reshape to its
    own dims, which is a kernel of its own. Each result is then written by one kernel
    into memory of its own: the caller gets results it owns, as from any other function,
    and the function a kernel for each."""
    body = _scalar_views_computed(function.body)
    taken = {p.value.id for p in function.params}
    ops, yields = list(body.ops), []
    for v in body.yields:
        if v.id in taken and isinstance(v.type, TensorType):
            copy = new_value(v.type, None, v.span)
            ops.append(Op("reshape", (v,), (copy,), (("shape", v.type.dims),), span=v.span))
            v = copy
        taken.add(v.id)
        yields.append(v)
    return Block(body.args, tuple(ops), tuple(yields))


def _scalar_views_computed(body: Block) -> Block:
    """The body, where a 0-d result is a reshape of a value that other ops read too (a
    loss that its gradient reads): the reshape reads ``value * 1.0`` instead, an
    elementwise kernel of its own that writes the result with no dims, as a kernel
    writes the 0-d view of any value it computes."""
    readers: dict[int, int] = {}
    for op in body.ops:
        for v in op.operands:
            readers[v.id] = readers.get(v.id, 0) + 1
    returned = {v.id for v in body.yields if isinstance(v.type, TensorType) and not v.type.dims}
    ops: list[Op] = []
    for op in body.ops:
        if op.kind == "reshape" and op.result.id in returned and readers[op.operands[0].id] > 1:
            source = op.operands[0]
            copy = new_value(TensorType(source.type.dims, source.type.dtype), None, op.span)
            ops.append(Op("mul", (source,), (copy,), (("b", 1.0),), span=op.span))
            op = replace(op, operands=(copy,))
        ops.append(op)
    return Block(body.args, tuple(ops), body.yields)


def _escaped(kernels: list[_Kernel], ops: tuple[Op, ...], readers: dict[int, set[int]]) -> set[int]:
    """Values that a kernel computes and another kernel, or the function, reads, but
    that the kernel cannot write: all but its last value, unless it is a kernel of
    elementwise ops alone (``_writes_several``), which writes any of its values of the
    shape it computes over."""
    found = set()
    for kernel in kernels:
        inside = set(kernel.ops)
        last = ops[kernel.ops[-1]]
        written = last.results[0].id if last.results else None
        several = _writes_several(kernel, ops)
        for i in kernel.ops:
            for r in ops[i].results:
                if r.id == written or readers.get(r.id, set()) <= inside:
                    continue
                if not (several and _written_beside(ops[i], r, last)):
                    found.add(r.id)
    return found


#: Ops whose results an elementwise kernel computes tile by tile where it stores its
#: result (the library's ``elementwise`` kernel's prologue), so that it may store any.
_COMPUTED = ELEMENTWISE_MATH | DRAWN


def _writes_several(kernel: _Kernel, ops: tuple[Op, ...]) -> bool:
    """Whether ``kernel`` may write several values: a kernel of elementwise ops alone
    (the library's ``elementwise`` kernel, all prologue), whose last op computes a
    tensor; its views and scalar computations are read where they lie."""
    if kernel.kind != "elementwise" or kernel.anchor is not None:
        return False
    last = ops[kernel.ops[-1]]
    if last.kind not in _COMPUTED or not isinstance(last.results[0].type, TensorType):
        return False
    return all(
        ops[i].kind in _COMPUTED or _is_view(ops[i]) or _pure_scalar(ops[i]) for i in kernel.ops
    )


def _written_beside(op: Op, value: Value, last: Op) -> bool:
    """Whether a kernel of elementwise ops that ends with ``last`` can write ``value``,
    a result of its ``op``, beside ``last``'s: a tensor that it computes tile by tile
    over the same shape, so that each of its tiles lies where the result's does."""
    t, out = value.type, last.results[0].type
    return op.kind in _COMPUTED and isinstance(t, TensorType) and t.dims == out.dims


def _kernels(
    ops: tuple[Op, ...], uses: dict[int, int], readers: dict[int, set[int]], shared: set[int]
) -> list[_Kernel]:
    """The kernels of the greedy pass. An op joins the kernel of an operand that nothing
    else reads, or, being elementwise, of one in ``shared``: read by several ops, or
    returned too, whose elementwise readers then compute in the kernel that computes it
    (``y * sigmoid(y)``)."""
    reader_count = {v: len(at) for v, at in readers.items()}
    kernels: list[_Kernel] = []
    kernel_of: dict[int, int] = {}  # value id -> kernel index
    produced = {r.id: i for i, op in enumerate(ops) for r in op.results}
    #: value id -> indices of the ops that give it and go with its reader (a view, or a
    #: scalar computation with the ops it reads)
    views: dict[int, list[int]] = {}

    def can_join(k: int, op: Op, via: int) -> bool:
        return all(kernel_of.get(v.id, -1) <= k for v in op.operands if v.id != via)

    def own_kernel(indices: list[int]) -> None:
        last = ops[indices[-1]]
        kernels.append(_Kernel("host" if _is_scalar(last) else "elementwise"))
        kernels[-1].add(indices, ops)
        for i in indices:
            kernel_of.update((r.id, len(kernels) - 1) for r in ops[i].results)

    for index, op in enumerate(ops):
        given = [views.pop(v.id) for v in op.operands if v.id in views]
        if op.kind == "reshape":  # it reads its operand from memory: a view is stored first
            for indices in given:
                own_kernel(indices)
            given = []
        viewed = sorted(i for indices in given for i in indices)
        source = kernel_of.get(op.operands[0].id) if op.operands else None
        if (
            source is not None
            and uses[op.operands[0].id] == 1
            and _stored_in_place(kernels[source], op, ops)
        ):
            kernels[source].add((index,), ops)
            kernel_of[op.result.id] = source
            continue
        if _placed_with_reader(op, reader_count):
            views[op.result.id] = [*viewed, index]
            continue
        cls = op_class(op)
        if cls != "elementwise":  # only an elementwise op loads other views where it reads them
            kept = [
                g for g in given
                if ops[g[-1]].kind in ("reshape", *CACHE_VIEWS) or _read_in_place(op, ops[g[-1]])
            ]  # fmt: skip
            for indices in [g for g in given if g not in kept]:
                own_kernel(indices)
            viewed = sorted({i for g in kept for i in g})
        elif op.kind in _LIBRARY_ROWS:  # its tables are read from memory as they lie
            tables = {v.id for v in op.operands[1:]}
            for indices in [g for g in given if ops[g[-1]].results[0].id in tables]:
                own_kernel(indices)
                viewed = [i for i in viewed if i not in indices]
        target = None
        if cls in ("elementwise", "reduction") or op.kind == "transpose":
            # a row kernel computes a prologue where it loads its first operand only (a
            # norm's weight, a gather's or a scatter's indices are read from memory)
            joinable = op.operands if cls == "elementwise" else op.operands[:1]
            for v in sorted(joinable, key=lambda v: -kernel_of.get(v.id, -1)):
                k = kernel_of.get(v.id)
                alone = uses.get(v.id) == 1 or (
                    cls == "elementwise"
                    and v.id in shared
                    and (readers[v.id] == {index} or not _a_prologue(op, ops, readers))
                )
                if k is None or not alone or not can_join(k, op, v.id):
                    continue
                if cls == "elementwise" and _widens(op, v):
                    continue
                if cls == "elementwise" and _takes_epilogue(kernels[k], ops):
                    # a kept axis is stored as without it, and an epilogue's tensors are
                    # loaded as the result's tile: a reduction with keepdims takes numbers
                    # and scalars after it, and an op reading another tensor starts the
                    # next kernel; so does one that reads a value of the prologue
                    # (``d / sqrt(mean(d * d))``), which the epilogue no longer has
                    kept = kernels[k].keeps_dims
                    anchor = kernels[k].anchor
                    prologue = anchor is not None and any(
                        kernel_of.get(w.id) == k and produced[w.id] < anchor for w in op.operands
                    )
                    if not prologue and not (kept and _reads_another_tensor(op, k, kernel_of)):
                        target = k
                elif (
                    cls in ("reduction", "layout")
                    and kernels[k].kind == "elementwise"
                    and _feeds_only(kernels[k], ops, readers, index)
                ):
                    target = k
                    kernels[k].kind = cls
                    kernels[k].anchor = index
                break
        sources = [kernel_of.get(v.id, -1) for i in viewed for v in ops[i].operands]
        if target is not None and any(k >= target for k in sources):
            # the viewed value is this kernel's own, or a later kernel's: the op reads it
            # from memory, so it must start a kernel after both
            target = None
        if target is not None and cls == "elementwise":
            for j in _chains_absorbed(op, target, kernels, kernel_of, ops, uses, readers, index):
                kernels[target].add(kernels[j].ops, ops)
                for i in kernels[j].ops:
                    kernel_of.update((r.id, target) for r in ops[i].results)
                kernels[j].ops = []
        if target is None:
            kernels.append(_Kernel(cls if cls != "other" else op.kind))
            if cls != "elementwise":
                kernels[-1].anchor = index
            target = len(kernels) - 1
        kernels[target].add((*viewed, index), ops)
        for i in (*viewed, index):  # a view's too: ``_read_before`` asks where it is read
            kernel_of.update((r.id, target) for r in ops[i].results)
    for indices in views.values():  # returned as they are
        last = ops[indices[-1]]
        source = kernel_of.get(last.operands[0].id) if last.operands else None
        joins = source is not None and uses[last.operands[0].id] == 1
        if last.kind == "reshape" and joins and _takes_epilogue(kernels[source], ops):
            # its kernel writes the result reshaped
            kernels[source].add((indices[-1],), ops)
        else:
            own_kernel(indices)
    return _shared_views_copied([k for k in kernels if k.ops], ops)


def _chains_absorbed(
    op: Op, target: int, kernels: list[_Kernel], kernel_of: dict[int, int],
    ops: tuple[Op, ...], uses: dict[int, int], readers: dict[int, set[int]], index: int,
) -> list[int]:  # fmt: skip
    """The other kernels that elementwise ``op`` (at ``index``), joining elementwise
    kernel ``target``, takes in too: chains of elementwise ops on tensors in memory whose
    last value only ``op`` reads, at its own shape, and whose other values no kernel
    placed before ``op`` reads (a chain that writes several values moves later with
    them). ``exp(x) + relu(x)`` and ``where(x > 0.0, x, 0.1 * x)`` are then one kernel,
    not one per chain with the first chain's result stored."""
    if kernels[target].kind != "elementwise" or kernels[target].anchor is not None:
        return []
    absorbed = []
    for v in op.operands:
        j = kernel_of.get(v.id)
        if j is None or j == target or j in absorbed:
            continue
        kernel = kernels[j]
        alone = (
            kernel.kind == "elementwise"
            and kernel.anchor is None
            and ops[kernel.ops[-1]].results == (v,)
            and uses.get(v.id) == 1
            and not _widens(op, v)
            and not any(ops[i].effects for i in kernel.ops)
            and not _read_before(kernel, j, ops, readers, kernel_of, index)
        )
        if alone:
            absorbed.append(j)
    return absorbed


def _a_prologue(op: Op, ops: tuple[Op, ...], readers: dict[int, set[int]]) -> bool:
    """Whether the one reader of elementwise ``op``'s result is a reduction (or a
    transpose) that loads it as its operand: ``op`` then starts a kernel that the reader
    takes in as its prologue (``sum(d * d)``), rather than join the kernel of a value
    it shares with other readers, which would write the result for the reduction."""
    if len(op.results) != 1 or len(readers.get(op.result.id, ())) != 1:
        return False
    (reader,) = readers[op.result.id]
    if reader < 0:
        return False
    after = ops[reader]
    prologue = op_class(after) == "reduction" or after.kind == "transpose"
    return prologue and after.operands[:1] == (op.result,)


def _feeds_only(
    kernel: _Kernel, ops: tuple[Op, ...], readers: dict[int, set[int]], index: int
) -> bool:
    """Whether the op at ``index`` is the only reader of ``kernel``'s values outside it:
    then it may take the kernel in as its prologue, which computes them where the op
    loads its operand and writes none of them. A kernel that writes values for others
    (``a`` of ``a = x * y; return a, sum(a * 0.5)``) stays a kernel of its own, and
    the reduction reads its operand from memory."""
    inside = {*kernel.ops, index}
    return all(readers.get(r.id, set()) <= inside for i in kernel.ops for r in ops[i].results)


def _read_before(
    kernel: _Kernel, k: int, ops: tuple[Op, ...], readers: dict[int, set[int]],
    kernel_of: dict[int, int], index: int,
) -> bool:  # fmt: skip
    """Whether an op before ``index`` that another kernel than ``kernel`` (the ``k``-th)
    computes reads one of its values: that kernel must then stay where it is."""
    for i in kernel.ops:
        for r in ops[i].results:
            for reader in readers.get(r.id, ()):
                if not 0 <= reader < index or reader in kernel.ops:
                    continue
                # a view or a scalar waiting for its reader is placed with it, later
                given = ops[reader].results
                placed = kernel_of.get(given[0].id, k) if given else None
                if placed != k:
                    return True
    return False


def _shared_views_copied(kernels: list[_Kernel], ops: tuple[Op, ...]) -> list[_Kernel]:
    """A kernel reads a tensor through a reshape or a transpose by taking it as a
    parameter of the view's dims, which serves no other read of the same tensor: such a
    view of a tensor that the kernel also reads otherwise (``x.reshape(...) + x``, or a
    second view of it) is a copy kernel of its own, just before. (``split_qkv``'s views
    read the projection with its own dims, and so may share it.)"""
    out = []
    for kernel in kernels:
        inside = {r.id for i in kernel.ops for r in ops[i].results}
        reads: dict[int, int] = {}
        for i in kernel.ops:
            for v in ops[i].operands:
                if v.id not in inside:
                    reads[v.id] = reads.get(v.id, 0) + 1
        copied = [
            i for i in kernel.ops
            if retyping_view(ops[i])
            and reads.get(ops[i].operands[0].id, 0) > 1
        ]  # fmt: skip
        out += [_Kernel("elementwise", [i]) for i in copied]
        kernel.ops = [i for i in kernel.ops if i not in copied]
        out.append(kernel)
    return out


def kernel_order(ops: list[Op]) -> list[Op]:
    """A group's ops in the order its kernel computes them: program order, but a view
    (an ``expand_dims``, a reshape or a row permutation of a tensor the group loads) or
    a scalar computation right before the op that reads it, so that it is in that op's
    prologue or epilogue, whichever side of the anchor the reader is."""
    read = {v.id for op in ops for v in op.operands}
    producer = {r.id: op for op in ops for r in op.results}
    placed = {
        id(op) for op in ops
        if (_is_view(op) or _pure_scalar(op)) and op.results[0].id in read
    }  # fmt: skip
    ordered: list[Op] = []

    def put(op: Op) -> None:
        for v in op.operands:
            given = producer.get(v.id)
            if given is not None and id(given) in placed:
                placed.discard(id(given))
                put(given)
        ordered.append(op)

    for op in [op for op in ops if id(op) not in placed]:
        put(op)
    return ordered


def fuse(module: GraphModule) -> GraphModule:
    return map_functions(module, _fuse_function)
