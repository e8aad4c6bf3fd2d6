"""Attention written with graph ops becomes ``flash_attention``.

``softmax(q @ k.T * scale) @ v`` computes an ``S x T`` score matrix, writes it, reads it
back for the softmax, writes the probabilities and reads them again for the second
product: three kernels, and ``S * T`` floats through memory twice. ``flash_attention``
computes the same thing in one kernel that never holds more than a block of scores
(an online softmax). So the chain

    %s = matmul %q, %k {trans_b = true}      (q @ k.T, folded by ``simplify``)
    %t = mul %s {b = c} | div %s {b = c}     (optional: the scale, a positive constant,
                                              a float parameter (mul only), or 1/sqrt
                                              of q's head dim, as ``rsqrt(float(D))``
                                              or ``sqrt(float(D))``)
    %p = softmax %t {axis = -1} | softmax_safe %t {axis = -1}
    %p = cast %p {dtype = v's}               (optional: bf16 probabilities for bf16 v)
    %o = matmul %p, %v

becomes ``%o = flash_attention %q, %k, %v {scale = c}`` (no scale: the op's default,
``1/sqrt(D)``; a parameter: its last operand) with ``%o``'s type, where each
intermediate has no other use, ``q``, ``k`` and ``v`` have one dtype and the same batch
dims, ``v``'s head dim is ``q``'s, and the scores accumulate in f32. The online softmax
subtracts each row's running maximum, as ``softmax_safe`` does: where the plain
``softmax`` would overflow, this one does not. Masked attention has no graph form to
recognize; ``flash_attention(q, k, v, causal=True)`` says it.
"""

from __future__ import annotations

from dataclasses import replace

from .dims import Dim
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
    if scores is None or not scores.attr("trans_b"):
        return None
    q, k = scores.operands
    scale = _scale(scaled, producers, q.type.dims[-1]) if scaled else (("scale", 1.0),)
    if scale is None:
        return None
    given = (scaled.operands[1],) if scale == (("scale", "scalar"),) else ()
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
    return replace(op, kind="flash_attention", operands=(q, k, v, *given),
                   attrs=(("causal", False), *scale))  # fmt: skip


def _scale(op: Op, producers: dict[int, Op], head_dim: Dim) -> tuple | None:
    """The ``scale`` attribute of a ``mul`` or ``div`` of the scores: a positive constant,
    ``"scalar"`` for a product by a float parameter (the op's last operand), or none at
    all for ``1/sqrt(head_dim)`` computed at run time (the op's default); None when the
    op is none of those."""
    attrs = dict(op.attrs)
    if op.kind == "div" and "a" in attrs:  # c / scores
        return None
    value = attrs.get("b", attrs.get("a"))  # c * scores, as scores * c
    if len(op.operands) == 2 and value == "scalar":
        root = producers.get(op.operands[1].id)
        if root is None and op.kind == "mul":  # a parameter, which the kernel takes
            return (("scale", "scalar"),)
        size = producers.get(root.operands[0].id) if root is not None and root.operands else None
        wanted = {"mul": "rsqrt", "div": "sqrt"}[op.kind]
        default = (
            root is not None and root.kind == wanted
            and size is not None and size.kind == "dim_to_float"
            and size.attr("dim") == head_dim
        )  # fmt: skip
        return () if default else None
    if len(op.operands) != 1 or not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    if value <= 0:
        return None
    return (("scale", float(value) if op.kind == "mul" else 1.0 / value),)
