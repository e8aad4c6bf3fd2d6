"""Distribution: the collectives that a mesh function's shard specs call for.

Each value of a mesh function's program has a layout: for each dim, the mesh axis it is
split over (or None), and the mesh axes over which it is *partial*, that is, over
which the values the devices hold must still be combined (with the reduction kept
beside the axis) to give the value the source means. Parameters take their layout
from their ``@shard`` specs. An op that contracts or reduces a split dim gives a
partial value: a matmul whose inner dim is split over ``tp`` (the row-parallel matmul
of a tensor-parallel MLP) leaves each device a partial sum over ``tp``, and
``transpose(x) @ dy`` with the batch split over ``dp`` (a data-parallel gradient) a
partial sum over ``dp``. Before any op reads a partial value, and before one is
returned, this pass inserts the ``all_reduce`` that completes it, so a program written
for one device gives the same result on the mesh. An op that this pass cannot place
on a split dim is an error at its line, never a silent per-shard result.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..frontend.diagnostics import Diagnostics
from ..frontend.source import Span
from .dims import Dim
from .graph_ops import DRAWN, ELEMENTWISE_MATH
from .ir import Function, GraphModule, Guard, Op, Value, new_value, walk
from .opcall import SemanticError
from .types import TensorType, dims_text, result_types

__all__ = ["distribute"]

#: ops that keep every dim and act on each element alone
_ELEMENTWISE = ELEMENTWISE_MATH | DRAWN
#: ops that read whole rows: the last dim must be whole on each device
_ROWS = {"softmax", "softmax_safe", "log_softmax", "logsumexp_safe", "layernorm",
         "layernorm_safe", "rmsnorm", "rmsnorm_safe"}  # fmt: skip
#: reductions over one axis, and how their partial results combine across devices
_REDUCTIONS = {"sum": "sum", "mean": "mean", "max": "max", "min": "min"}

Layout = tuple[tuple[str | None, ...], tuple[tuple[str, str], ...]]


def distribute(module: GraphModule, diags: Diagnostics) -> GraphModule:
    """Every mesh function with the collectives its layouts need; errors go to ``diags``."""
    functions = []
    for f in module.functions:
        if f.mesh is None or f.kind != "graph":
            functions.append(f)
            continue
        try:
            functions.append(_Distributor(f).run())
        except SemanticError as exc:
            diags.error(exc.message, exc.span, exc.notes)
            functions.append(f)
    return replace(module, functions=tuple(functions))


def _matching_group(source: tuple[Dim, ...], target: tuple[Dim, ...]) -> tuple[int, int] | None:
    """How many leading dims of ``source`` and of ``target`` have the same product, when
    one side's first dim is the product of the other side's first few (a merge or a
    split), or None."""
    for taken in range(1, len(source) + 1):
        for made in range(1, len(target) + 1):
            if (taken == 1 or made == 1) and math.prod(
                source[:taken], start=Dim.const(1)
            ) == math.prod(target[:made], start=Dim.const(1)):
                return taken, made
    return None


def _whole(value: Value) -> Layout:
    rank = value.type.rank if isinstance(value.type, TensorType) else 0
    return (None,) * rank, ()


class _Distributor:
    def __init__(self, function: Function) -> None:
        self.f = function
        self.layouts: dict[int, Layout] = {}
        self.renamed: dict[int, Value] = {}
        self.ops: list[Op] = []
        self.guards: list[Guard] = list(function.guards)
        params = len(function.params)
        for param, spec in zip(function.params, function.shards[:params], strict=False):
            if spec:
                self.layouts[param.value.id] = (tuple(spec), ())
        #: the result's spec per returned value (None: whole on every device)
        self.result_specs = list(function.shards[params:]) or [None] * len(function.body.yields)
        #: partial values not yet completed, in the order they were made
        self.pending: list[Value] = []
        self.needed = self._needed()

    def layout(self, value: Value) -> Layout:
        return self.layouts.get(value.id) or _whole(value)

    def run(self) -> Function:
        for op in self.f.body.ops:
            self._op(op)
        span = self.f.return_span or (self.f.body.ops[-1].span if self.f.body.ops else None)
        declared = result_types(self.f.result_type)
        yields = tuple(
            self._to_result(self.renamed.get(v.id, v), spec, want, span)
            for v, spec, want in zip(self.f.body.yields, self.result_specs, declared, strict=True)
        )
        body = replace(self.f.body, ops=tuple(self.ops), yields=yields)
        return replace(self.f, body=body, guards=tuple(self.guards))

    def _needed(self) -> set[int]:
        """The values whose partial sums some reader needs complete: any op but a
        reduction across devices, and a result that is not split along a dim."""
        needed = {v.id for op in walk(self.f.body) if op.kind not in ("all_reduce",
                  "reduce_scatter") for v in op.operands}  # fmt: skip
        for v, spec in zip(self.f.body.yields, self.result_specs, strict=False):
            if not any(spec or ()):
                needed.add(v.id)
        return needed

    def _insert(
        self, kind: str, operands: tuple[Value, ...], types: tuple[TensorType, ...],
        attrs: tuple, layouts: list[Layout], span: Span | None,
    ) -> tuple[Value, ...]:  # fmt: skip
        results = tuple(new_value(t, None, span) for t in types)
        self.ops.append(Op(kind, operands, results, (*attrs, ("inserted", True)),
                           ("collective",), span=span))  # fmt: skip
        for result, layout in zip(results, layouts, strict=True):
            self.layouts[result.id] = layout
        return results

    def _complete(self, value: Value, span: Span | None) -> Value:
        """``value``, or the all-reduce that completes it where it is partial. Every
        other pending partial sum over the same axis that is needed later is completed
        in the same all-reduce (a bucket of a data-parallel step's gradients, which the
        runtime splits into messages of at most the mesh's ``bucket_mb``)."""
        original = value
        dims, partial = self.layout(value)
        if len(partial) == 1:
            bucket = [value] + [
                p for p in self.pending
                if p is not value and self.layout(p)[1] == partial
                and p.type.dtype == value.type.dtype and p.id in self.needed
            ]  # fmt: skip
            ((axis, how),) = partial
            results = self._insert(
                "all_reduce", tuple(bucket), tuple(p.type for p in bucket),
                (("axis", axis), ("op", how)), [(self.layout(p)[0], ()) for p in bucket], span,
            )  # fmt: skip
            for p, result in zip(bucket, results, strict=True):
                self.renamed[p.id] = result  # later readers take the completed value
            self.pending = [p for p in self.pending if p.id not in self.renamed]
            return results[0]
        for axis, how in partial:
            (value,) = self._insert("all_reduce", (value,), (value.type,),
                                    (("axis", axis), ("op", how)), [(dims, ())], span)  # fmt: skip
        self.renamed[original.id] = value
        return value

    def _to_result(
        self, value: Value, spec: tuple | None, declared: object, span: Span | None
    ) -> Value:
        """``value`` in the layout its result's ``@shard`` spec declares: a partial sum
        over an axis that splits a dim of the result is reduce-scattered along that dim;
        other partial sums are all-reduced; a dim split where the result is whole is
        all-gathered. Then the per-device type must be the declared one. A value that
        already has the declared per-device type is returned as it is (once complete):
        what a program's own collectives made of it is what it means to return."""
        if (
            not isinstance(value.type, TensorType)
            or not isinstance(declared, TensorType)
            or value.type.dims == declared.dims
        ):
            return self._complete(value, span)
        want = tuple(spec) if spec else (None,) * value.type.rank
        dims, partial = self.layout(value)
        for axis, how in partial:
            if axis in want and dims[want.index(axis)] is None and len(partial) == 1:
                d = want.index(axis)
                value = self._regroup(value, "reduce_scatter", axis, d, how, span)
        value = self._complete(value, span)
        for d, axis in enumerate(self.layout(value)[0]):
            if axis is not None and want[d] != axis:
                value = self._regroup(value, "all_gather", axis, d, None, span)
        for d, (have, axis) in enumerate(zip(self.layout(value)[0], want, strict=True)):
            if have != axis:
                raise SemanticError(
                    f"dim {d} of the result is declared split over mesh axis '{axis}', but "
                    "every device holds all of it: compute it from split parameters, or "
                    "declare that dim whole (None)",
                    span,
                )
        self._check_dims(value.type, declared, span)
        return value

    def _regroup(
        self, value: Value, kind: str, axis: str, d: int, how: str | None, span: Span | None
    ) -> Value:
        """The ``reduce_scatter`` (``how`` its reduction) or ``all_gather`` of ``value``
        along dim ``d`` over ``axis``."""
        t: TensorType = value.type
        n = self.f.mesh.size(axis)
        dims, partial = self.layout(value)
        if kind == "all_gather":
            size, attrs = t.dims[d] * n, (("axis", axis), ("dim", d))
            layout = (tuple(None if i == d else a for i, a in enumerate(dims)), partial)
        else:
            if t.dims[d].constant is not None and t.dims[d].constant % n:
                raise SemanticError(
                    f"dim {d} of the result is {t.dims[d].constant}, which the {n} devices "
                    f"of mesh axis '{axis}' cannot split evenly",
                    span,
                )
            if t.dims[d].constant is None:
                why = f"the result's dim {d}, split over '{axis}'"
                self.guards.append(Guard("divisible", t.dims[d], Dim.const(n), why, span))
            size, attrs = t.dims[d] / n, (("axis", axis), ("dim", d), ("op", how))
            layout = (tuple(axis if i == d else a for i, a in enumerate(dims)),
                      tuple(p for p in partial if p[0] != axis))  # fmt: skip
        result = TensorType(tuple(size if i == d else x for i, x in enumerate(t.dims)), t.dtype)
        (value,) = self._insert(kind, (value,), (result,), attrs, [layout], span)
        return value

    def _check_dims(self, got: TensorType, declared: TensorType, span: Span | None) -> None:
        """The check of a returned value's dims that sema leaves to this pass on a mesh."""
        for have, want in zip(got.dims, declared.dims, strict=True):
            if have == want:
                continue
            if (have.constant is None) == (want.constant is None):
                raise SemanticError(
                    f"returns {dims_text(got.dims)} on each device, but the declared result "
                    f"is {dims_text(declared.dims)} on each device",
                    span,
                )
            self.guards.append(Guard("equal", have, want, "result shape", span))

    def _op(self, op: Op) -> None:
        if op.regions and any(any(d) or p for d, p in self.layouts.values()):
            # a loop body reads values of the function by name, which this pass does not
            # follow: it could not tell a partial sum from a whole one there
            raise SemanticError(
                f"a '{op.kind}' region in a function with split tensors is not supported yet",
                op.span,
            )
        consumed = set()
        if op.kind in ("all_reduce", "reduce_scatter"):
            consumed = set(op.attr("axis").split(","))
        self._check_seed(op)
        operands = []
        for v in op.operands:
            v = self.renamed.get(v.id, v)
            _, partial = self.layout(v)
            if any(axis not in consumed for axis, _ in partial):
                v = self._complete(v, op.span)
            operands.append(v)
        op = replace(op, operands=tuple(operands))
        self.ops.append(op)
        for result, layout in zip(op.results, self._results(op), strict=True):
            self.layouts[result.id] = layout
            if layout[1]:
                self.pending.append(result)

    def _check_seed(self, op: Op) -> None:
        """``grad`` seeds its backward pass with ``where(loss == loss, 1, 1)``: where the
        loss is a mean over a split dim, each device would differentiate its own mean,
        whose gradient the all-reduce would then sum ``n`` times over."""
        if op.kind != "equal" or op.operands[0] is not op.operands[1]:
            return
        for axis, how in self.layout(self.renamed.get(op.operands[0].id, op.operands[0]))[1]:
            if how == "mean":
                raise SemanticError(
                    f"grad of a mean over a dim split over mesh axis '{axis}': each device "
                    "would differentiate the mean of its own shard; differentiate the sum "
                    "(sum(e, axis=None)) and divide the gradient by the global count "
                    "outside grad (a size inside the function grad calls is the shard's)",
                    op.span,
                )

    # -- how each op's results are laid out ---------------------------------------------

    def _results(self, op: Op) -> list[Layout]:
        ins = [self.layout(v) for v in op.operands]
        tensors = [(v, lay) for v, lay in zip(op.operands, ins, strict=True)
                   if isinstance(v.type, TensorType)]  # fmt: skip
        split = any(a is not None for _, (dims, _) in tensors for a in dims)
        if op.kind == "all_reduce":
            dims, partial = ins[0]
            done = set(op.attr("axis").split(","))
            return [(dims, tuple(p for p in partial if p[0] not in done))]
        if op.kind in ("all_gather", "reduce_scatter", "all_to_all"):
            return [self._collective(op, ins[0])]
        if not split:
            return [_whole(r) for r in op.results]
        if op.kind == "matmul":
            return [self._matmul(op, ins[0][0], ins[1][0])]
        if op.kind == "transpose":
            perm = op.attr("perm")
            return [(tuple(ins[0][0][p] for p in perm), ())]
        if op.kind in _REDUCTIONS:
            return [self._reduction(op, ins[0][0])]
        if op.kind == "reshape":
            return [self._reshape(op, ins[0][0])]
        if op.kind in _ELEMENTWISE:
            return [self._elementwise(op, tensors)]
        if op.kind in _ROWS and ins[0][0][-1] is None:
            return [(ins[0][0], ())]
        if op.kind == "flash_attention":
            return [self._attention(op, [lay[0] for lay in ins[:3]])]
        axis = next(a for _, (dims, _) in tensors for a in dims if a is not None)
        raise SemanticError(
            f"{op.kind} on a tensor split over mesh axis '{axis}' is not supported: "
            f'all_gather(x, axis="{axis}", dim=...) it first',
            op.span,
        )

    def _collective(self, op: Op, layout: Layout) -> Layout:
        dims, partial = list(layout[0]), layout[1]
        axes = op.attr("axis").split(",")
        one = axes[0] if len(axes) == 1 else None
        if op.kind == "all_gather":
            d = op.attr("dim")
            dims[d] = None if dims[d] in axes else dims[d]
        elif op.kind == "reduce_scatter":
            dims[op.attr("dim")] = one
            partial = tuple(p for p in partial if p[0] not in axes)
        else:
            s, c = op.attr("split_dim"), op.attr("concat_dim")
            dims[c] = None if dims[c] in axes else dims[c]
            dims[s] = one
        return tuple(dims), partial

    @staticmethod
    def _matmul(op: Op, a: tuple, b: tuple) -> Layout:
        inner_a = a[-1] if len(a) > 1 else a[0]
        inner_b = b[-2] if len(b) > 1 else b[0]
        if inner_a != inner_b:
            split = inner_a or inner_b
            raise SemanticError(
                f"matmul: the inner dim is split over mesh axis '{split}' in one operand "
                "only; split both alike, or all_gather the split one",
                op.span,
            )
        rank = op.result.type.rank
        dims = (*a[:-2], *([a[-2]] if len(a) > 1 else []), *([b[-1]] if len(b) > 1 else []))
        dims = (None,) * (rank - len(dims)) + tuple(dims[-rank:] if rank else ())
        partial = ((inner_a, "sum"),) if inner_a is not None else ()
        return dims, partial

    @staticmethod
    def _reshape(op: Op, dims: tuple) -> Layout:
        """A reshape that keeps each split dim the first of the dims it merges with (or
        splits into): a device's block of rows stays a block of the merged dim (``[B_local,
        O]`` to ``[B_local * O]``, the flattening before a full reduction). Dims of 1 come
        and go freely; any other regrouping of a split dim would interleave the devices'
        blocks, an error at its line."""
        source, target = op.operands[0].type.dims, op.result.type.dims
        one = Dim.const(1)
        out: list[str | None] = [None] * len(target)
        i = j = 0
        while i < len(source) or j < len(target):
            if i < len(source) and source[i] == one and dims[i] is None:
                i += 1
                continue
            if j < len(target) and target[j] == one:
                j += 1
                continue
            group = _matching_group(source[i:], target[j:])
            if group is None:
                break
            taken, made = group
            axes = dims[i : i + taken]
            if any(a is not None for a in axes[1:]):
                break
            out[j] = axes[0]
            i, j = i + taken, j + made
        else:
            return tuple(out), ()
        axis = next(a for a in dims if a is not None)
        raise SemanticError(
            f"reshape: a dim split over mesh axis '{axis}' must stay the first of the dims "
            f'it merges with or splits into; all_gather(x, axis="{axis}", dim=...) it first',
            op.span,
        )

    @staticmethod
    def _attention(op: Op, layouts: list[tuple]) -> Layout:
        """Attention whose queries are split by rows (sequence parallel) or whose batch and
        heads are split alike in q, k and v: each device's rows need every key, so the
        keys' and values' sequence and all feature dims must be whole. A causal mask
        counts rows from the shard's first, so causal queries split by rows are refused."""
        q, k, v = layouts
        batch = q[:-2]
        if k[:-2] != batch or v[:-2] != batch or any(k[-2:]) or any(v[-2:]) or q[-1]:
            raise SemanticError(
                "flash_attention: split q by rows, or q, k and v alike by batch and heads; "
                "all_gather the keys and values over the axis that splits their sequence",
                op.span,
            )
        if q[-2] is not None and op.attr("causal"):
            raise SemanticError(
                f"flash_attention: causal queries split by rows over '{q[-2]}' would mask "
                "each shard as if its rows came first; split the batch or the heads instead",
                op.span,
            )
        return q, ()

    @staticmethod
    def _reduction(op: Op, dims: tuple) -> Layout:
        axis = op.attr("axis")
        keep = op.attr("keepdims")
        reduced = dims[axis]
        out = tuple(None if i == axis else d for i, d in enumerate(dims) if keep or i != axis)
        return out, (((reduced, _REDUCTIONS[op.kind]),) if reduced is not None else ())

    @staticmethod
    def _elementwise(op: Op, tensors: list[tuple[Value, Layout]]) -> Layout:
        """The operands' dims, aligned from the right as numpy broadcasts them: a dim split
        in one operand is split alike in every other that has it (not broadcast from 1),
        which per-device shapes alone cannot tell where the sizes happen to agree."""
        rank = op.result.type.rank
        dims: list[str | None] = [None] * rank
        for _, (operand_dims, _) in tensors:
            for i, axis in enumerate(operand_dims):
                j = rank - len(operand_dims) + i
                dims[j] = dims[j] or axis
        for value, (operand_dims, _) in tensors:
            for i, axis in enumerate(operand_dims):
                j = rank - len(operand_dims) + i
                if axis != dims[j] and value.type.dims[i] != Dim.const(1):
                    how = f"over '{axis}'" if axis else "whole"
                    raise SemanticError(
                        f"{op.kind}: dim {j} is split over '{dims[j]}' in one operand and "
                        f"{how} in another; split both alike, or all_gather the split one",
                        op.span,
                    )
        return tuple(dims), ()
