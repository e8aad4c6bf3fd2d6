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

from dataclasses import replace

from ..frontend.diagnostics import Diagnostics
from ..frontend.source import Span
from .dims import Dim
from .graph_ops import ELEMENTWISE_MATH
from .ir import Function, GraphModule, Op, Value, new_value
from .opcall import SemanticError
from .types import TensorType

__all__ = ["distribute"]

#: ops that keep every dim and act on each element alone
_ELEMENTWISE = ELEMENTWISE_MATH | {"dropout"}
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


def _whole(value: Value) -> Layout:
    rank = value.type.rank if isinstance(value.type, TensorType) else 0
    return (None,) * rank, ()


class _Distributor:
    def __init__(self, function: Function) -> None:
        self.f = function
        self.layouts: dict[int, Layout] = {}
        self.renamed: dict[int, Value] = {}
        self.ops: list[Op] = []
        for param, spec in zip(function.params, function.shards, strict=False):
            if spec:
                self.layouts[param.value.id] = (tuple(spec), ())

    def layout(self, value: Value) -> Layout:
        return self.layouts.get(value.id) or _whole(value)

    def run(self) -> Function:
        for op in self.f.body.ops:
            self._op(op)
        yields = tuple(
            self._complete(self.renamed.get(v.id, v), self.f.body.ops[-1].span if
                           self.f.body.ops else self.f.span)
            for v in self.f.body.yields
        )  # fmt: skip
        body = replace(self.f.body, ops=tuple(self.ops), yields=yields)
        return replace(self.f, body=body)

    def _complete(self, value: Value, span: Span | None) -> Value:
        """``value``, or the all-reduce that completes it where it is partial."""
        dims, partial = self.layout(value)
        for axis, how in partial:
            result = new_value(value.type, None, span)
            self.ops.append(Op(
                "all_reduce", (value,), (result,),
                (("axis", axis), ("op", how), ("inserted", True)), ("collective",), span=span,
            ))  # fmt: skip
            self.layouts[result.id] = (dims, ())
            value = result
        return value

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
        if op.kind == "reshape" and op.result.type.dims == op.operands[0].type.dims:
            return [(ins[0][0], ())]  # a copy
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
