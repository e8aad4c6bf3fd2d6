"""Softmax, log-softmax and the norms written with graph ops become the library's row ops.

Model code often spells these out: Llama's RMSNorm is ``x * rsqrt(mean(x ** 2, axis=-1,
keepdims=True) + eps) * w``, and a softmax ported from NumPy is ``e / sum(e, ...)`` of
``e = exp(x - max(x, ...))``. Written so, each reduction is a kernel and every
elementwise op that broadcasts its result back starts another: a softmax is four kernels
that read each row three times. The library's row ops read a row once. So, with ``R``
the last axis and every reduction over it with ``keepdims=True``:

    softmax_safe:  e = exp(x - max(x)); e / sum(e)
    softmax:       e = exp(x); e / sum(e)
    log_softmax:   d - log(sum(exp(d))), d = x - max(x) or x; x - logsumexp_safe(x)
    rmsnorm:       x * rsqrt(v) | rsqrt(v) * x | x / sqrt(v),  v = mean(x * x | x ** 2) + eps
    layernorm:     the same of d = x - mean(x): d * rsqrt(mean(d * d) + eps), ...
    weight, bias:  a norm without weight times a weight ``[N]`` (either side), a layernorm
                   with a weight and no bias plus a bias ``[N]``

A part written twice (``exp(x) / sum(exp(x))``, ``(x - mu) / sqrt(mean((x - mu) ** 2) +
eps)``) matches as the same part. ``eps`` is a positive constant, either side of the
``+``. Every value in between must have no reader outside the pattern, and ``x`` must be
f32: the library ops compute in f32, which is what these ops compute on f32 operands,
but not on bf16 ones, which they round after each op.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir import Function, GraphModule, Op, Value
from .rewrite import Rewriter, map_functions, use_counts

__all__ = ["recognize_rows"]

_NORMS = ("rmsnorm", "layernorm")


def recognize_rows(module: GraphModule) -> GraphModule:
    return map_functions(module, _function)


def _function(function: Function) -> Function:
    uses = use_counts(function.body)
    return Rewriter(lambda op, producers: _row_op(op, _Graph(producers, uses))).function(function)


@dataclass
class _Graph:
    producers: dict[int, Op]
    uses: dict[int, int]

    def op(self, value: Value, *kinds: str) -> Op | None:
        """The op of one of ``kinds`` that gives ``value``."""
        found = self.producers.get(value.id)
        return found if found is not None and found.kind in kinds else None

    def row(self, value: Value, kind: str) -> Op | None:
        """The reduction of ``kind`` over the last axis, keeping it, that gives ``value``."""
        found = self.op(value, kind)
        if found is None or not found.attr("keepdims"):
            return None
        return found if found.attr("axis") == found.operands[0].type.rank - 1 else None

    def centred(self, value: Value, kind: str) -> tuple[Op, Op] | None:
        """The ``sub`` and the row reduction of ``kind`` of ``value = x - kind(x)``."""
        sub = self.op(value, "sub")
        if sub is None or len(sub.operands) != 2:
            return None
        reduced = self.row(sub.operands[1], kind)
        ok = reduced is not None and reduced.operands[0] is sub.operands[0]
        return (sub, reduced) if ok else None

    def same(self, a: Value, b: Value) -> bool:
        """Whether ``a`` and ``b`` are one value, or the same ops of the same values."""
        if a is b:
            return True
        pa, pb = self.producers.get(a.id), self.producers.get(b.id)
        return (
            pa is not None and pb is not None and not pa.effects and not pb.effects
            and (pa.kind, pa.attrs, len(pa.operands)) == (pb.kind, pb.attrs, len(pb.operands))
            and all(self.same(x, y) for x, y in zip(pa.operands, pb.operands, strict=True))
        )  # fmt: skip

    def closed(self, ops: list[Op], last: Op) -> bool:
        """Whether every value that ``ops`` give, but ``last``'s, is read only by them."""
        inside: dict[int, int] = {}
        for op in ops:
            for v in op.operands:
                inside[v.id] = inside.get(v.id, 0) + 1
        given = {r.id for op in ops for r in op.results if op is not last}
        return all(inside.get(v, 0) == self.uses.get(v, 0) for v in given)


def _row_op(op: Op, g: _Graph) -> Op | None:
    for match in (_softmax, _log_softmax, _normalized, _folded):
        found = match(op, g)
        if found is not None:
            return found
    return None


def _f32(value: Value) -> bool:
    return getattr(value.type, "dtype", None) is not None and value.type.dtype.name == "f32"


def _softmax(op: Op, g: _Graph) -> Op | None:
    """``e / sum(e)`` of ``e = exp(x - max(x))`` or ``e = exp(x)``."""
    if op.kind != "div" or len(op.operands) != 2:
        return None
    e, s = op.operands
    total = g.row(s, "sum")
    exp = g.op(e, "exp")
    if total is None or exp is None or not g.same(total.operands[0], e):
        return None
    pattern = [op, total, exp, g.producers[total.operands[0].id]]
    x, kind = exp.operands[0], "softmax"
    centred = g.centred(x, "max")
    if centred is not None:
        x, kind = centred[0].operands[0], "softmax_safe"
        pattern += centred
    if not _f32(x) or not g.closed(_with_copies(pattern, g), op):
        return None
    return Op(kind, (x,), op.results, (("axis", x.type.rank - 1),), span=op.span)


def _log_softmax(op: Op, g: _Graph) -> Op | None:
    """``d - log(sum(exp(d)))`` of ``d = x - max(x)`` or ``d = x``, and
    ``x - logsumexp_safe(x)``: a classifier's loss as model code writes it."""
    if op.kind != "sub" or len(op.operands) != 2:
        return None
    d, lse = op.operands
    given = g.row(lse, "logsumexp_safe")
    if given is not None:
        pattern, x, part = [op, given], d, given.operands[0]
    else:
        log = g.op(lse, "log")
        total = g.row(log.operands[0], "sum") if log is not None else None
        exp = g.op(total.operands[0], "exp") if total is not None else None
        if exp is None:
            return None
        pattern, x, part = [op, log, total, exp], d, exp.operands[0]
        centred = g.centred(d, "max")
        if centred is not None:
            x = centred[0].operands[0]
            pattern += centred
    if not g.same(part, d) or not _f32(x) or not g.closed(_with_copies(pattern, g), op):
        return None
    return Op("log_softmax", (x,), op.results, (("axis", x.type.rank - 1),), span=op.span)


def _normalized(op: Op, g: _Graph) -> Op | None:
    """``n * rsqrt(mean(n * n) + eps)``, or ``n / sqrt(...)``: rmsnorm of ``n``, or the
    layernorm of ``x`` where ``n`` is ``x - mean(x)``."""
    if op.kind not in ("mul", "div") or len(op.operands) != 2:
        return None
    n, r = op.operands
    root = g.op(r, "rsqrt" if op.kind == "mul" else "sqrt")
    if root is None and op.kind == "mul":
        r, n = op.operands
        root = g.op(r, "rsqrt")
    shifted = g.op(root.operands[0], "add") if root is not None else None
    eps = _constant(shifted) if shifted is not None else None
    mean = g.row(shifted.operands[0], "mean") if eps is not None and eps > 0 else None
    square = g.op(mean.operands[0], "mul", "pow") if mean is not None else None
    if square is None or not _squares(square, n, g):
        return None
    pattern = [op, root, shifted, mean, square]
    x, kind = n, "rmsnorm"
    centred = g.centred(n, "mean")
    if centred is not None:
        x, kind = centred[0].operands[0], "layernorm"
        pattern += centred
    if not _f32(x) or not g.closed(_with_copies(pattern, g), op):
        return None
    attrs = (("eps", float(eps)), ("weight", False))
    if kind == "layernorm":
        attrs += (("bias", False),)
    return Op(kind, (x,), op.results, attrs, span=op.span)


def _squares(op: Op, n: Value, g: _Graph) -> bool:
    if op.kind == "pow":
        return len(op.operands) == 1 and op.attr("b") == 2 and g.same(op.operands[0], n)
    return len(op.operands) == 2 and all(g.same(v, n) for v in op.operands)


def _constant(op: Op) -> float | None:
    """The number an ``add`` of one tensor adds, on either side."""
    attrs = dict(op.attrs)
    value = attrs.get("b", attrs.get("a"))
    if len(op.operands) != 1 or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def _with_copies(pattern: list[Op], g: _Graph) -> list[Op]:
    """``pattern``, each op once, with the ops that compute a part it reads twice written
    twice: the producers of its operands that are not in it but give the same as an op
    that is, and theirs."""
    found: list[Op] = []
    for op in pattern:
        if all(op is not f for f in found):
            found.append(op)
    given = [r for op in found for r in op.results]
    work = list(found)
    while work:
        for v in work.pop().operands:
            p = g.producers.get(v.id)
            if p is None or any(p is f for f in found) or not any(g.same(v, w) for w in given):
                continue
            found.append(p)
            given += p.results
            work.append(p)
    return found


#: what an op folds into the norm that gives one operand: the norms it folds into,
#: whether they have their weight already, and the operand it adds
_FOLDS = {"mul": (_NORMS, False, "weight"), "add": (("layernorm",), True, "bias")}


def _folded(op: Op, g: _Graph) -> Op | None:
    """A norm without weight times a weight ``[N]``, or a layernorm with its weight and
    no bias plus a bias ``[N]``."""
    fold = _FOLDS.get(op.kind)
    if fold is None or len(op.operands) != 2:
        return None
    kinds, weighted, given = fold
    for y, p in (op.operands, reversed(op.operands)):
        norm = g.op(y, *kinds)
        if norm is None or norm.attr("weight") != weighted or norm.attr("bias"):
            continue
        x = norm.operands[0]
        if _f32(p) and p.type.dims == x.type.dims[-1:] and g.uses.get(y.id) == 1:
            attrs = {**dict(norm.attrs), given: True}
            return Op(norm.kind, (*norm.operands, p), op.results, tuple(attrs.items()),
                      span=op.span)  # fmt: skip
    return None
