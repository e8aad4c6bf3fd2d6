"""Attention written with graph ops becomes ``flash_attention``.

``softmax(q @ k.T * scale) @ v`` computes an ``S x T`` score matrix, writes it, reads it
back for the softmax, writes the probabilities and reads them again for the second
product: three kernels, and ``S * T`` floats through memory twice. ``flash_attention``
computes the same thing in one kernel that never holds more than a block of scores
(an online softmax). So the chain

    %s = matmul %q, %k {trans_b = true}      (q @ k.T, folded by ``simplify``)
    %t = mul %s {b = c} | div %s {b = c}     (optional: the scale, a positive constant)
    %p = softmax %t {axis = -1} | softmax_safe %t {axis = -1}
    %p = cast %p {dtype = v's}               (optional: bf16 probabilities for bf16 v)
    %o = matmul %p, %v

becomes ``%o = flash_attention %q, %k, %v {scale = c}`` with ``%o``'s type, where each
intermediate has no other use, ``q``, ``k`` and ``v`` have one dtype and the same batch
dims, ``v``'s head dim is ``q``'s, and the scores accumulate in f32. The online softmax
subtracts each row's running maximum, as ``softmax_safe`` does: where the plain
``softmax`` would overflow, this one does not. Masked attention has no graph form to
recognize; ``flash_attention(q, k, v, causal=True)`` says it.
"""

from __future__ import annotations

from dataclasses import replace

from .ir import Function, GraphModule, Op, Value
from .rewrite import Rewriter, map_functions, use_counts

__all__ = ["recognize_attention"]

_SOFTMAX = ("softmax", "softmax_safe")


def recognize_attention(module: GraphModule) -> GraphModule:
    return map_functions(module, _function)


def _function(function: Function) -> Function:
    uses = use_counts(function.body)
    return Rewriter(lambda op, producers: _attention(op, producers, uses)).function(function)


def _attention(op: Op, producers: dict[int, Op], uses: dict[int, int]) -> Op | None:
    if op.kind != "matmul" or op.attr("trans_b"):
        return None
    probabilities, v = op.operands

    def single(value: Value, *kinds: str) -> Op | None:
        """The op of one of ``kinds`` that gives ``value``, which nothing else uses."""
        found = producers.get(value.id)
        ok = found is not None and found.kind in kinds and uses.get(value.id) == 1
        return found if ok else None

    cast = single(probabilities, "cast")
    softmax = single(cast.operands[0] if cast else probabilities, *_SOFTMAX)
    if softmax is None or softmax.attr("axis") != softmax.result.type.rank - 1:
        return None
    scaled = single(softmax.operands[0], "mul", "div")
    scores = single(scaled.operands[0] if scaled else softmax.operands[0], "matmul")
    scale = _scale(scaled) if scaled else 1.0
    if scores is None or not scores.attr("trans_b") or scale is None:
        return None
    q, k = scores.operands
    tq, tk, tv = q.type, k.type, v.type
    fits = (
        tq.dtype == tk.dtype == tv.dtype
        and probabilities.type.dtype == tv.dtype  # after the cast, if there is one
        and scores.result.type.dtype.name == "f32"
        and tq.dims[:-2] == tk.dims[:-2] == tv.dims[:-2]
        and tq.dims[-1] == tv.dims[-1]
    )  # fmt: skip
    if not fits:
        return None
    return replace(op, kind="flash_attention", operands=(q, k, v),
                   attrs=(("causal", False), ("scale", scale)))  # fmt: skip


def _scale(op: Op) -> float | None:
    """The positive constant a ``mul`` or ``div`` of the scores scales them by."""
    value = op.attr("b")
    if len(op.operands) != 1 or "a" in dict(op.attrs) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, bool) or value <= 0:
        return None
    return float(value) if op.kind == "mul" else 1.0 / value
