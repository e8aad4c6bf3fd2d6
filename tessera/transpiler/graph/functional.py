"""PyTorch's ``torch.nn.functional`` and ``torch`` names, with PyTorch's signatures:
``linear``, ``bmm``, ``scaled_dot_product_attention``, ``layer_norm``, ``rms_norm``,
``normalize``, ``cosine_similarity``, ``outer``, ``gather``, ``repeat_interleave`` and
``pad`` (the activations are in ``activations``, the losses in ``losses``).

Model code ported from PyTorch calls these (``F.linear(x, w, b)`` written ``linear(x,
w, b)``, as every op here is a builtin). Each is a composition, as ``array_ops``' are:
its rule checks the call with PyTorch's argument names and layouts, then emits the ops
that Tessera has (``x @ w.T``, ``flash_attention``, ``layernorm``, ``rmsnorm``, the
reductions) through their own rules, so that fusion, every backend and autodiff treat
it as those ops written out.
"""

from __future__ import annotations

import math

from .array_ops import _as_dtype, _reshaped, _zeros, indices_of, shape_argument
from .dims import Dim
from .dtypes import F32, DType
from .graph_ops import (
    _as_scalar,
    _call_as,
    _float_input,
    _then,
    attention_inputs,
    attention_scale,
    broadcast,
    is_mask,
    register,
)
from .ir import Value
from .opcall import OpCall, P
from .types import ScalarType, TensorType, dims_text
from .values import Const, DimValue, Ev

__all__: list[str] = []


def _passed(call: OpCall, name: str) -> Ev | Const:
    """The argument as the user wrote it, so that its span and text go on to the op it
    becomes; the parameter's default where it was left out."""
    return call.ev(name) if call.given(name) else call.raw(name)


def _product(call: OpCall, a: str, other: str, b: Value) -> Value:
    """``a @ b`` by the product's rule, ``b`` being the argument ``other`` or its view,
    once the caller has checked the shapes; the dtypes are checked here, so that the
    error names the arguments as the user wrote them."""
    x = call.tensor(a)
    if x.type.dtype != b.type.dtype:
        raise call.error(
            f"{call.ev(a).text} is {x.type.dtype}, {call.ev(other).text} is {b.type.dtype}: "
            f"one dtype for both, e.g. cast({call.ev(other).text}, {x.type.dtype})",
            at=other,
        )
    return _then(call, "matmul", call.ev(a), b)


# ----------------------------------------------------------------------- products


@register("linear", P("input"), P("weight"), P("bias", None))
def _linear(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.linear``: ``input @ weight.T + bias``, the weight in
    PyTorch's ``[out_features, in_features]`` layout and ``bias`` (optional) ``[out_features]``.
    ``input`` is ``[..., in_features]`` (leading batch dims, or one vector), the result
    ``[..., out_features]``. The product reads the weight where it lies, with no transposed
    copy (as ``a @ b.T`` does), and the bias is added in the product's epilogue. The result
    has the input's dtype, as PyTorch's: a bf16 or f16 product is summed in f32 and
    rounded once, after the bias (``@`` itself gives the f32 sum). Its gradient is the
    product's and the sum's."""
    x = _float_input(call, "input")
    if x.type.rank < 1:
        raise call.error(f"'input' needs at least 1 dim; {call.shape_of('input')}", at="input")
    weight = call.tensor("weight")
    if weight.type.rank != 2:
        raise call.error(
            f"'weight' must be [out_features, in_features], as PyTorch's; "
            f"{call.shape_of('weight')}",
            at="weight",
        )
    out_features, in_features = weight.type.dims
    call.same_dim(
        x.type.dims[-1], in_features,
        lambda: f"in_features differ: {call.shape_of('input')}, {call.shape_of('weight')} "
        "(PyTorch's layout: weight is [out_features, in_features])",
        f"in_features {x.type.dims[-1]} == {in_features}", ("input", "weight"),
    )  # fmt: skip
    if not call.left_out("bias"):
        b = call.tensor("bias")
        if b.type.rank != 1:
            raise call.error(
                f"'bias' must be [out_features] = [{out_features}]; {call.shape_of('bias')}",
                at="bias", notes=call.notes_for("bias"),
            )  # fmt: skip
        call.same_dim(
            b.type.dims[0], out_features,
            lambda: f"'bias' must be [out_features] = [{out_features}]; "
            f"{call.shape_of('bias')}",
            f"bias size {b.type.dims[0]} == out_features {out_features}", ("weight", "bias"),
        )  # fmt: skip
    y = _product(call, "input", "weight", _then(call, "transpose", call.ev("weight")))
    y = y if call.left_out("bias") else _then(call, "add", y, call.ev("bias"))
    return _as_input(call, x, y)


def _as_input(call: OpCall, x: Value, y: Value) -> Value:
    """The product ``y`` in its input's dtype, as PyTorch's ``linear`` and ``bmm`` give
    it: summed (and its bias added) in the accumulation dtype, rounded once to bf16 or
    f16, so that ``linear(linear(x, w1), w2)`` chains in bf16 as it does in PyTorch."""
    return y if y.type.dtype == x.type.dtype else _then(call, "cast", y, x.type.dtype)


@register("bmm", P("input"), P("mat2"))
def _bmm(call: OpCall) -> object:
    """PyTorch's ``torch.bmm``: the batched product ``[B, M, K] @ [B, K, N] -> [B, M, N]``,
    of two 3-d tensors with one batch size (no broadcasting, as PyTorch's); ``input @
    mat2`` where those hold, in the inputs' dtype as ``linear``'s result. Its gradient is
    ``@``'s."""
    a, b = call.tensor("input"), call.tensor("mat2")
    for name, value in (("input", a), ("mat2", b)):
        if value.type.rank != 3:
            raise call.error(
                f"'{name}' must be a 3-d tensor [B, M, K], as PyTorch's; {call.shape_of(name)}"
                " (a product of other ranks is a @ b, which broadcasts batch dims)",
                at=name,
            )
    (batch, _, inner), (batch2, inner2, _) = a.type.dims, b.type.dims
    call.same_dim(
        batch, batch2,
        lambda: f"batch sizes differ: {call.shape_of('input')}, {call.shape_of('mat2')}",
        "bmm batch", ("input", "mat2"),
    )  # fmt: skip
    call.same_dim(
        inner, inner2,
        lambda: f"inner dimensions differ: {call.shape_of('input')}, {call.shape_of('mat2')}",
        f"inner dimension {inner} == {inner2}", ("input", "mat2"),
    )  # fmt: skip
    return _as_input(call, a, _product(call, "input", "mat2", b))


# ---------------------------------------------------------------------- attention


@register(
    "scaled_dot_product_attention", P("query"), P("key"), P("value"), P("attn_mask", None),
    P("dropout_p", 0.0), P("is_causal", False), P("scale", None, keyword_only=True),
    P("enable_gqa", False, keyword_only=True),
)  # fmt: skip
def _scaled_dot_product_attention(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.scaled_dot_product_attention``, in its layout
    ``[..., L, D]`` of queries and ``[..., S, D]`` of keys and values:
    ``flash_attention(query, key, value, causal=is_causal, dropout=dropout_p,
    scale=scale)``, with that op's checks, kernels and gradient. ``is_causal`` aligns
    the mask at the top-left corner, as PyTorch's; ``scale`` defaults to ``1/sqrt(D)``.
    Keys and values with fewer heads than the queries are grouped-query attention with
    or without ``enable_gqa`` (PyTorch's needs it True). Dropout draws from Tessera's
    generator, not PyTorch's.

    ``attn_mask`` is PyTorch's too, of any shape of 2 dims or more that broadcasts to
    the scores ``[..., L, S]`` without widening them (``[L, S]``, a padding mask ``[B,
    1, 1, S]``, ``[B, H, L, S]``): a mask (a comparison, such as ``keep > 0.5`` or
    ``arange(S) < lengths[:, None, None, None]``) whose true elements take part
    in the attention, or a float tensor of the queries' dtype added to the scaled
    scores (an ALiBi bias; ``-inf`` masks). Integer masks are refused, as PyTorch's are
    (write ``m != 0``), and so are floats of another dtype (cast them). The attention is
    then written out, ``softmax(q @ k.transpose(-2, -1) * scale + mask) @ v``
    (``where(mask, scores, -inf)`` for a mask), each k and v head read by its group of
    q heads, scores and softmax in f32, and its gradient is that of those ops (a float
    mask's too, summed over the dims it broadcasts along, as PyTorch's). A query whose
    every score is ``-inf`` (a bool mask's row all false, or a float mask's all
    ``-inf``) gets zeros, and passes no gradient, as PyTorch 2.13 gives on the CPU in
    its math path and its default path alike, not NaN; a row of finite large negatives
    (``finfo.min``) is not empty: its softmax is taken (uniform, where the negatives
    swamp the scores), as PyTorch's. With ``attn_mask``, ``is_causal=True`` is an
    error, as in PyTorch's math path (its CPU kernel applies both instead: pass ``mask &
    (arange(L)[:, None] >= arange(S))`` for that); and so is a ``dropout_p`` other than
    0, whose dropout would have no seed (write ``dropout(weights, p, seed=s)`` of the
    attention weights out)."""
    for name in ("query", "key", "value"):
        if is_mask(call.raw(name)):
            raise call.error(
                f"{call.ev(name).text} is a mask (a comparison): attention reads floats, and "
                f"only attn_mask takes a mask; cast({call.ev(name).text}, f32) makes it 1.0 "
                "and 0.0",
                at=name,
            )
    if not call.left_out("attn_mask"):
        return _masked_attention(call)
    call.const("enable_gqa", bool)  # checked, and nothing to do: groups are found anyway
    return _then(
        call, "flash_attention", call.ev("query"), call.ev("key"), call.ev("value"),
        causal=_passed(call, "is_causal"), dropout=_passed(call, "dropout_p"),
        scale=_passed(call, "scale"),
    )  # fmt: skip


def _masked_attention(call: OpCall) -> Value:
    """``scaled_dot_product_attention`` with ``attn_mask``, as graph ops: the scores, the
    mask applied, a softmax that gives zeros where a row has no key left, the product
    with the values; grouped heads as views, as ``flash_attention``'s."""
    attention = _call_as(
        call, "flash_attention", call.ev("query"), call.ev("key"), call.ev("value"),
        scale=_passed(call, "scale"),
    )  # fmt: skip
    q, k, v, _ = attention_inputs(attention)
    scale = attention_scale(attention)
    call.const("enable_gqa", bool)
    if call.const("is_causal", bool):
        raise call.error(
            "attn_mask with is_causal=True is an error, as in PyTorch: pass one of them "
            "(a causal mask and another: attn_mask=mask & (arange(L)[:, None] >= arange(S)))",
            at="is_causal",
        )
    dropout = call.raw("dropout_p")
    if not (isinstance(dropout, Const) and dropout.value in (0, 0.0)):
        call.scalar("dropout_p", "float")  # a number or a float parameter, else that error
        raise call.error(
            "dropout_p with attn_mask is not taken: its dropout would have no seed; write "
            "it out, dropout(softmax(where(mask, q @ k.transpose(-2, -1) * scale, -inf), "
            "dim=-1), p, seed=s) @ v",
            at="dropout_p",
        )
    query, value = call.tensor("query"), call.tensor("value")
    rows = (*query.type.dims[:-1], call.tensor("key").type.dims[-2])  # [..., H, L, S]
    mask = _attention_mask(call, query, rows)
    scores = _then(call, "matmul", q, _then(call, "transpose", k))  # f32
    if scale is None:
        head = query.type.dims[-1]
        scale = (
            1.0 / math.sqrt(head.constant)
            if head.constant is not None
            else _then(call, "rsqrt", _size(call, head))
        )
    scores = _reshaped(call, _then(call, "mul", scores, scale), rows)
    # a query that the mask leaves no key (a row all false, or all -inf: the scores
    # themselves are finite) gets zeros, as PyTorch's: the softmax of its row is taken
    # of zeros instead, so that neither it nor its gradient is NaN. Found from the mask,
    # which is often smaller than the scores ([B, 1, 1, S]), not from them
    if is_mask(mask):
        scores = _then(call, "where", mask, scores, -math.inf)
        live = _then(call, "any", mask, -1, True)
    else:
        scores = _then(call, "add", scores, mask)
        live = _then(call, "greater", _then(call, "max", mask, -1, True), -math.inf)
    weights = _then(call, "softmax_safe", _then(call, "where", live, scores, 0.0), -1)
    weights = _then(call, "where", live, weights, 0.0)
    if weights.type.dtype != value.type.dtype:
        weights = _then(call, "cast", weights, value.type.dtype)
    o = _then(call, "matmul", _reshaped(call, weights, (*q.type.dims[:-1], rows[-1])), v)
    o = _reshaped(call, o, (*query.type.dims[:-1], value.type.dims[-1]))
    return _as_input(call, query, o)


def _attention_mask(call: OpCall, query: Value, rows: tuple[Dim, ...]) -> Value:
    """``attn_mask``, checked: a mask, or floats of the queries' dtype, whose dims
    broadcast to the scores' ``rows`` without widening them, as PyTorch requires."""
    mask = call.tensor("attn_mask")
    dtype = mask.type.dtype
    if not is_mask(mask) and dtype != query.type.dtype:
        text = call.ev("attn_mask").text
        hint = f"cast({text}, {query.type.dtype})" if dtype.is_float else f"{text} != 0"
        raise call.error(
            f"attn_mask must be a mask (a comparison, true where a key takes part) or "
            f"floats of the query's dtype ({query.type.dtype}) added to the scores, as "
            f"PyTorch's; {text} is {dtype}: write {hint}",
            at="attn_mask",
        )
    dims = mask.type.dims

    def mismatch() -> str:
        return (
            f"attn_mask must broadcast to the scores [..., L, S] = {dims_text(rows)}; "
            f"{call.shape_of('attn_mask')}"
        )

    if not 2 <= len(dims) <= len(rows):
        raise call.error(mismatch(), at="attn_mask")
    for axis, (want, got) in enumerate(zip(rows[-len(dims) :], dims, strict=True)):
        if got != Dim.const(1):
            call.same_dim(want, got, mismatch, f"attn_mask dim {axis}", ("attn_mask",))
    return mask


def _size(call: OpCall, dim: Dim) -> Value:
    """A size known only at run time, as a float scalar (``float(D)``)."""
    return call.emit("dim_to_float", (), ScalarType("float"), attrs=(("dim", dim),))


# ---------------------------------------------------------------- normalisations


def _normalized_last(call: OpCall, x: Value) -> None:
    """``normalized_shape`` names ``x``'s last dim and no other: Tessera's norms reduce
    one axis, so a shape of more dims is refused with what to write instead."""
    if x.type.rank < 1:
        raise call.error(f"'input' needs at least 1 dim; {call.shape_of('input')}", at="input")
    dims = shape_argument(call, "normalized_shape")
    if len(dims) != 1:
        raise call.error(
            f"normalized_shape {dims_text(dims)} names {len(dims)} dims; only the last dim is "
            f"normalised here: reshape {call.ev('input').text} to merge them into one "
            "(and the weight too), or pass x.shape[-1:]",
            at="normalized_shape",
        )
    last = x.type.dims[-1]
    call.same_dim(
        dims[0], last,
        lambda: f"normalized_shape {dims_text(dims)} is not the last dim of "
        f"{call.shape_of('input')}",
        f"normalized_shape {dims[0]} == {last}", ("input",),
    )  # fmt: skip


def _machine_eps(dtype: DType) -> float:
    """``torch.finfo(dtype).eps``: the distance from 1.0 to the next float of ``dtype``,
    ``2**-mantissa`` (f32: 1.19e-7, bf16: 0.0078, f16: 0.00098)."""
    return 2.0**-dtype.mantissa


@register(
    "layer_norm", P("input"), P("normalized_shape"), P("weight", None), P("bias", None),
    P("eps", 1e-5),
)  # fmt: skip
def _layer_norm(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.layer_norm``: ``layernorm(input, weight, bias,
    eps=eps)``, over the last dim, which ``normalized_shape`` must name: an integer, a
    size, a tuple of one (``(D,)``), or ``x.shape[-1:]``. A shape of more dims is
    refused (reshape to merge them). ``weight`` and ``bias`` are ``[D]``. Its gradient
    is ``layernorm``'s."""
    x = _float_input(call, "input")
    _normalized_last(call, x)
    return _then(
        call, "layernorm", call.ev("input"), _passed(call, "weight"), _passed(call, "bias"),
        eps=_passed(call, "eps"),
    )  # fmt: skip


@register("rms_norm", P("input"), P("normalized_shape"), P("weight", None), P("eps", None))
def _rms_norm(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.rms_norm``: ``rmsnorm(input, weight, eps=eps)``,
    ``x / sqrt(mean(x**2) + eps) * weight`` over the last dim, which ``normalized_shape``
    names as ``layer_norm``'s does. ``eps`` defaults to PyTorch's, the machine epsilon
    of the input's dtype (``torch.finfo(dtype).eps``: 1.19e-7 for f32, 0.0078 for bf16,
    0.00098 for f16), not ``rmsnorm``'s 1e-6. Its gradient is ``rmsnorm``'s."""
    x = _float_input(call, "input")
    _normalized_last(call, x)
    eps = Const(_machine_eps(x.type.dtype)) if call.left_out("eps") else call.ev("eps")
    return _then(call, "rmsnorm", call.ev("input"), _passed(call, "weight"), eps=eps)


@register("normalize", P("input"), P("p", 2.0), P("dim", 1), P("eps", 1e-12))
def _normalize(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.normalize``: ``input`` divided by its ``p``-norm
    along ``dim``, ``x / max(sum(abs(x)**p, dim)**(1/p), eps)``; ``p`` is a positive
    number, 2 by default, and ``dim`` is 1 by default, as PyTorch's (write ``dim=-1``
    for the last axis). Float inputs; same shape and dtype. Its gradient is that of the
    ops it is made of."""
    x = _float_input(call, "input")
    dim = call.axis("dim", x.type.rank)
    p = call.number("p")
    if not 0 < p < math.inf:
        raise call.error(f"p must be a positive number, not {p}", at="p")
    eps = call.number("eps")
    if p == 2.0:  # ``norm``'s, whose gradient at a zero vector is 0, as PyTorch's
        norm = _then(call, "norm", x, None, dim, True)
    else:
        total = _then(call, "sum", _then(call, "pow", _then(call, "abs", x), p), dim, True)
        norm = _then(call, "pow", total, 1.0 / p)
    return _then(call, "div", x, _then(call, "maximum", norm, eps))


@register("cosine_similarity", P("x1"), P("x2"), P("dim", 1), P("eps", 1e-8))
def _cosine_similarity(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.cosine_similarity``: ``sum(x1 / max(||x1||, eps)
    * x2 / max(||x2||, eps), dim)``, the cosine of the angle between the vectors along
    ``dim`` (default 1, as PyTorch's; ``dim=-1`` for the last axis), each 2-norm clamped
    to at least ``eps`` before the division, as PyTorch 2's (so that a zero vector gives
    0, not NaN). ``x1`` and ``x2`` broadcast; the result drops ``dim``. Float inputs.
    Its gradient is that of the ops it is made of, PyTorch's wherever a norm is at
    least ``eps``; below it, the division's alone (as ``normalize``'s), where PyTorch's
    also flows through the norm as if it were not clamped."""
    a, b = _float_input(call, "x1"), _float_input(call, "x2")
    dims = broadcast(call, "x1", "x2", a.type.dims, b.type.dims)
    axis = call.axis("dim", len(dims))
    eps = call.number("eps")
    unit = []
    for name, value in (("x1", a), ("x2", b)):
        v = call.ev(name) if value.type.dims == dims else _then(call, "broadcast_to", value, dims)
        norm = _then(call, "maximum", _then(call, "norm", v, None, axis, True), eps)
        unit.append(_then(call, "div", v, norm))
    return _then(call, "sum", _then(call, "mul", *unit), axis)


# ---------------------------------------------------------------- tensor algebra


@register("outer", P("input"), P("vec2"))
def _outer(call: OpCall) -> object:
    """The outer product of two vectors, as PyTorch's ``torch.outer`` (numpy's
    ``outer``): ``out[i, j] = input[i] * vec2[j]``, ``[N] x [M] -> [N, M]``, the two
    broadcast against each other (``input[:, None] * vec2[None, :]``), computed where
    the product is read. Vectors only, as PyTorch's (numpy's flattens others: write
    ``outer(x.flatten(), y.flatten())``). The dtype is the wider of the two. Its gradient
    is the product's."""
    vectors = [call.tensor(name) for name in ("input", "vec2")]
    for name, v in zip(("input", "vec2"), vectors, strict=True):
        if v.type.rank != 1:
            raise call.error(
                f"'{name}' must be a vector, as PyTorch's; {call.shape_of(name)} (numpy's "
                f"outer flattens it: write {call.ev(name).text}.flatten())",
                at=name,
            )
    one = Dim.const(1)
    column = _reshaped(call, vectors[0], (vectors[0].type.dims[0], one))
    row = _reshaped(call, vectors[1], (one, vectors[1].type.dims[0]))
    return _then(call, "mul", column, row)


@register("gather", P("input"), P("dim"), P("index"), P("sparse_grad", False, keyword_only=True))
def _gather(call: OpCall) -> object:
    """PyTorch's ``torch.gather`` (and ``x.gather(dim, index)``): ``out[i][j] =
    input[i][index[i][j]]`` for ``dim=1``, the elements of ``input`` picked along ``dim``
    by an integer tensor ``index`` of ``input``'s rank; the result has ``index``'s shape.
    On the other dims ``index`` is at most ``input``'s size, as PyTorch's: where it is
    smaller, the gather reads the leading block of ``input`` (a slice, checked when the
    function is called where a size is symbolic). It is numpy's ``take_along_axis(input,
    index, axis=dim)``, with its checks (an index parameter out of range is a
    ``ValueError`` before the launch; a computed one is clamped) and its gradient
    (``scatter_add``, dense: ``sparse_grad=True`` is taken and changes nothing). An
    integer ``input`` is gathered as f32 and cast back (exact below 2**24)."""
    x, index = call.tensor("input"), call.tensor("index")
    call.const("sparse_grad", bool)
    if index.type.dtype.kind != "int":
        raise call.error(
            f"'index' must be an integer tensor; {call.ev('index').text} is {index.type.dtype}",
            at="index",
        )
    if index.type.rank != x.type.rank:
        raise call.error(
            f"'index' must have input's rank; {call.shape_of('input')}, {call.shape_of('index')}",
            at="index",
        )
    axis = call.axis("dim", max(x.type.rank, 1))
    dims = list(x.type.dims)
    for k, (have, want) in enumerate(zip(x.type.dims, index.type.dims, strict=True)):
        if k == axis or have == want:
            continue
        if have.constant is not None and want.constant is not None:
            if want.constant > have.constant:
                raise call.error(
                    f"'index' is larger than input on dim {k}: {call.shape_of('input')}, "
                    f"{call.shape_of('index')}",
                    at="index",
                )
        else:
            reason = f"{call.shown}: index size {want} <= input size {have} on dim {k}"
            call.emitter.guard("at_most", want, have, reason, call.span)
        dims[k] = want
    source = _as_dtype(call, x, F32) if not x.type.dtype.is_float else x
    if dims != list(x.type.dims):
        attrs = (("perm", tuple(range(x.type.rank))), ("starts", (Dim.const(0),) * x.type.rank))
        block = TensorType(tuple(dims), source.type.dtype)
        source = call.emit("slice", (source,), block, attrs=attrs)
    written = call.ev("input")  # errors name the input as the user wrote it
    picked = _then(call, "take_along_axis", Ev(source, written.span, written.text),
                   call.ev("index"), axis)  # fmt: skip
    return _as_dtype(call, picked, x.type.dtype)


@register(
    "repeat_interleave", P("input"), P("repeats"), P("dim", None),
    P("output_size", None, keyword_only=True),
)  # fmt: skip
def _repeat_interleave(call: OpCall) -> object:
    """PyTorch's ``torch.repeat_interleave`` (and ``x.repeat_interleave(n, dim=)``) with
    an integer count: each element repeated ``repeats`` times along ``dim``, in place
    (``[a, b]`` twice is ``[a, a, b, b]``); without ``dim``, of the input flattened, as
    PyTorch's. ``k.repeat_interleave(H // G, dim=1)`` expands grouped-query keys ``[B, G,
    S, D]`` to ``H`` heads. ``repeats`` is a positive integer or a size; a tensor of
    counts is not taken. It is a broadcast along a new axis after ``dim`` and a reshape
    merging the two: the copies are written once, by the elementwise kernel of the ops
    before them (a reshape of a broadcast is no view), and its gradient sums each
    element's copies. ``output_size``, if given, is checked."""
    x = call.tensor("input")
    if isinstance(call.raw("repeats"), Value) and isinstance(call.raw("repeats").type, TensorType):
        raise call.error(
            "'repeats' must be an integer (a count for every element); a tensor of counts "
            f"is not taken: {call.ev('repeats').text} is a tensor",
            at="repeats",
        )
    count = call.dim("repeats")
    if count.constant is not None and count.constant < 1:
        raise call.error(f"'repeats' must be positive, not {count}", at="repeats")
    if call.left_out("dim"):
        x = _reshaped(call, x, (math.prod(x.type.dims, start=Dim.const(1)),))
        axis = 0
    else:
        axis = call.axis("dim", max(x.type.rank, 1))
    if x.type.rank == 0:
        raise call.error(f"'dim' names no axis of a 0-d tensor; {call.shape_of('input')}",
                         at="dim")  # fmt: skip
    dims = x.type.dims
    result = (*dims[:axis], dims[axis] * count, *dims[axis + 1 :])
    if not call.left_out("output_size"):
        call.same_dim(
            call.dim("output_size"), result[axis],
            lambda: f"output_size {call.ev('output_size').text} is not {result[axis]}",
            "repeat_interleave output_size", ("input",),
        )  # fmt: skip
    spread = (*dims[: axis + 1], Dim.const(1), *dims[axis + 1 :])
    wide = (*dims[: axis + 1], count, *dims[axis + 1 :])
    copies = _then(call, "broadcast_to", _reshaped(call, x, spread), wide)
    return _reshaped(call, copies, result)


@register("pad", P("input"), P("pad"), P("mode", "constant"), P("value", None))
def _pad(call: OpCall) -> object:
    """PyTorch's ``torch.nn.functional.pad`` in ``"constant"`` mode: ``input`` with
    ``value`` (default 0) added around it, ``pad`` giving the counts in PyTorch's
    order, from the last dim backwards: ``(left, right)`` pads the last dim, ``(left,
    right, top, bottom)`` the last two, and so on (numpy's ``pad`` takes them the other
    way round). The counts are integers at least 0 (PyTorch's negative ones crop: slice
    instead); ``"reflect"``, ``"replicate"`` and ``"circular"`` are not taken. Each
    padded dim is one pass of the library's ``pad`` kernel (the input's elements written
    into zeros), and ``value`` is set in the new elements where a kernel reads them; the
    dtype is the input's (integers exact below 2**24). Its gradient is a slice."""
    x = call.tensor("input")
    mode = call.const("mode", str)
    if mode != "constant":
        raise call.error(
            f"mode {mode!r} is not taken; only 'constant' (the default) pads here", at="mode"
        )
    counts = call.const("pad", tuple, list)
    if len(counts) % 2 or not all(type(c) is int for c in counts):
        raise call.error(
            f"'pad' holds pairs of integers, (left, right) for each dim from the last; "
            f"{call.ev('pad').text} is not",
            at="pad",
        )
    if len(counts) // 2 > x.type.rank:
        raise call.error(f"'pad' pads {len(counts) // 2} dims; {call.shape_of('input')}", at="pad")
    if any(c < 0 for c in counts):
        raise call.error(
            f"'pad' {tuple(counts)} has a negative count, which PyTorch crops by: slice "
            "the input instead",
            at="pad",
        )
    value = 0.0 if call.left_out("value") else call.number("value")
    out = _as_dtype(call, x, F32)
    for k in range(len(counts) // 2):
        before, after = counts[2 * k], counts[2 * k + 1]
        if before or after:
            out = _padded_axis(call, out, x.type.rank - 1 - k, before, after, value)
    return _as_dtype(call, out, x.type.dtype)


def _padded_axis(call: OpCall, x: Value, axis: int, before: int, after: int, value: float) -> Value:
    """``x`` (f32) with ``before`` and ``after`` elements of ``value`` around ``axis``: the
    library's ``pad`` of ``x`` seen as rows whose columns are ``axis`` and the axes after
    it, then ``value`` where the new elements lie."""
    dims = x.type.dims
    inner = math.prod(dims[axis + 1 :], start=Dim.const(1))
    rows = math.prod(dims[:axis], start=Dim.const(1))
    size = dims[axis] + before + after
    like = _zeros(call, (Dim.const(1), size * inner))  # gives the kernel its row length
    flat = _reshaped(call, x, (rows, dims[axis] * inner))
    padded = call.emit("pad", (flat, like), TensorType((rows, size * inner), F32),
                       attrs=(("start", inner * before),))  # fmt: skip
    out = _reshaped(call, padded, (*dims[:axis], size, *dims[axis + 1 :]))
    if value == 0.0:
        return out
    index = indices_of(call, out.type.dims, axis)
    end = _as_scalar(DimValue(dims[axis] + before), call)
    inside = _then(call, "logical_and", _then(call, "greater_equal", index, float(before)),
                   _then(call, "less", index, end))  # fmt: skip
    return _then(call, "where", inside, out, value)
