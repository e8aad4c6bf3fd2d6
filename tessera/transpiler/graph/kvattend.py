"""``flash_attention(q, cache)`` in a graph function: attention over a ``KVCache``.

The same computation as ``tessera.decode_attention`` (``tessera.runtime.kvcache``), on
the device and in the function's launches:

1. ``kvcache.visible`` (a kernel of the compiler's own, ``tile.kvcache``) reads the
   cache's lengths, which an append earlier in the function has grown, and writes how
   many keys of its split each query row sees: ``seen [B*H*P, G*n, 1]``, as
   ``KVCache.visible`` and ``decode_attention`` compute it on the host (causal, and
   clipped to the rolling window).
2. ``kvcache.k`` and ``kvcache.v`` are the cache's ``K`` and ``V`` read where they lie,
   as ``[B*H*P, S_max/P, D]``: each program's split of one (batch row, key head).
3. A graph function of the library, instantiated for the call (``attend_source``),
   stacks the ``G`` query heads of a key head into rows (``[B, H, G*n, D]``, as ``q``
   lies), copies them for each split, calls the standard library's
   ``decode_partial_lse`` tile kernel (``decode_attention``'s split-K loop, one online
   softmax per split, which returns each split's log-sum-exp and output side by side)
   and weighs the splits' partial outputs by ``exp(lse - logsumexp(lse))``: the
   softmax over all the keys. With one split a row, ``decode_partial`` returns the
   output alone.

Its ops are inlined into the caller's, so that fusion and the later stages see them as
any others; they carry the span of the call.
"""

from __future__ import annotations

import hashlib
import math
from importlib import resources
from typing import Any

from ..frontend import ast
from ..frontend.kept_parse import parse_library_file
from ..frontend.source import Span
from .dims import Dim
from .dtypes import I32
from .ir import Guard
from .kvcache import flat_names, rolling_window
from .opcall import SemanticError
from .types import KVCacheType, TensorType

__all__ = ["AttendCall", "check_attend", "splits_of", "library_module", "length_guards"]

#: Keys a split reads at least, and the programs the splits aim for: the choice of
#: ``tessera.decode_attention`` (``runtime.kvcache._splits``), made here when ``S_max``
#: is a number; a cache whose ``S_max`` is a size is read in one split a row.
_MIN_SPLIT = 256
_PROGRAMS = 64


class AttendCall:
    """One ``flash_attention(q, cache, causal=..., scale=...)``, checked: the dims of the
    instance (``B``, ``H`` key heads, ``G`` query heads a key head, ``n`` query rows,
    ``D``, ``P`` splits of ``C`` keys) and its numbers."""

    def __init__(self, q: TensorType, cache: KVCacheType, causal: bool, scale: float) -> None:
        assert cache.dims is not None
        self.q, self.cache, self.causal, self.scale = q, cache, causal, scale
        self.batch, self.heads, self.s_max, self.dim = cache.dims
        self.rows = q.dims[2]
        q_heads = q.dims[1].constant
        heads = self.heads.constant
        self.group = 1 if q.dims[1] == self.heads else q_heads // heads  # checked
        self.splits = splits_of(self.heads, self.batch, self.s_max)
        self.chunk = self.s_max / self.splits
        self.programs = self.batch * self.heads * Dim.const(self.splits)
        self.stacked = self.rows * Dim.const(self.group)
        self.window = rolling_window(cache)

    def attrs(self) -> tuple[tuple[str, Any], ...]:
        """The attributes of the ``kvcache.visible`` op."""
        return (
            ("rows", self.rows), ("causal", self.causal), ("splits", self.splits),
            ("chunk", self.chunk), ("window", self.window),
        )  # fmt: skip

    def split_type(self) -> TensorType:
        """``K`` or ``V`` as the splits read it: ``[B*H*P, S_max/P, D]``."""
        assert self.cache.dtype is not None
        return TensorType((self.programs, self.chunk, self.dim), self.cache.dtype)

    def seen_type(self) -> TensorType:
        return TensorType((self.programs, self.stacked, Dim.const(1)), I32)


def length_guards(call: AttendCall, cache: str, appended: Dim, span: Span) -> list[Guard]:
    """The run-time checks of the lengths of the cache parameter ``cache``, which the
    function's appends before the call grow by ``appended``, that ``decode_attention``
    makes (``KVCache.visible``): each row holds the ``n`` queries' positions, and causal
    rows over a window that has wrapped come one at a time (where ``n`` is a number).
    They are guards on the lengths' values (``Guard.indices``): the entry checks them
    before any launch."""
    lengths = flat_names(cache)[2]
    guards = []
    fewest = call.rows - appended
    counted = "" if appended == Dim.const(0) else f", counting the {appended} appended before it"
    if fewest.constant is None or fewest.constant > 0:
        guards.append(Guard(
            "indices", fewest, Dim.const(ast.INT64_MAX),
            f"flash_attention: each row of the cache must hold the {call.rows} queries' "
            f"positions{counted} (append their keys first)",
            span, tensor=lengths,
        ))  # fmt: skip
    rows = call.rows.constant
    # (for ``n`` a size, the lengths alone cannot say: ``kvcache.visible`` shows such
    # rows no key, ``cexpr.kv_visible``)
    if call.window is not None and call.causal and rows is not None and rows > 1:
        guards.append(Guard(
            "indices", Dim.const(0), Dim.const(call.window) - appended + Dim.const(1),
            f"flash_attention: causal attention over a rolling window of {call.window} that "
            f"has wrapped takes one query row at a time, not {call.rows}",
            span, tensor=lengths,
        ))  # fmt: skip
    return guards


def check_attend(q: Any, cache: KVCacheType, spans: tuple[Span, Span], text: str) -> None:
    """Raise ``SemanticError`` at ``q`` or at the cache (``spans``) unless ``q`` (its
    ``text``) can attend to a cache of type ``cache``: ``[B, H_q, n, D]`` of the cache's
    ``B``, ``D`` and dtype, ``H_q`` a multiple of its ``H``, both numbers unless equal."""
    q_span, cache_span = spans
    if cache.dims is None or cache.dtype is None:
        raise SemanticError(
            "flash_attention over a KVCache reads the cache's arrays, which need its shape: "
            'declare it as KVCache["B", "H", "S_max", "D_h", bf16]',
            cache_span,
        )
    batch, heads, _, dim = cache.dims
    shown = f"[{', '.join(map(str, cache.dims))}]"
    if not isinstance(q, TensorType):
        raise SemanticError(
            f"flash_attention: {text} must be a tensor [B, H_q, n, D] of the cache's {shown}",
            q_span,
        )
    if q.rank != 4 or (q.dims[0], q.dims[3]) != (batch, dim):
        raise SemanticError(
            f"flash_attention: {text} must be [B, H_q, n, D] of the cache's {shown}, not "
            f"[{', '.join(map(str, q.dims))}]",
            q_span,
        )
    if q.dtype != cache.dtype:
        raise SemanticError(
            f"flash_attention: {text} is {q.dtype} but the cache holds {cache.dtype}", q_span
        )
    q_heads = q.dims[1]
    if q_heads != heads:
        if q_heads.constant is None or heads.constant is None:
            raise SemanticError(
                f"flash_attention: {text} has {q_heads} heads and the cache {heads}: grouped "
                "query heads need both as numbers, or the same size",
                q_span,
            )
        if q_heads.constant % heads.constant:
            raise SemanticError(
                f"flash_attention: {text}'s {q_heads} heads are not a multiple of the "
                f"cache's {heads}",
                q_span,
            )
    window = rolling_window(cache)
    if window == 0:
        raise SemanticError(
            "flash_attention over a KVCache with a rolling window needs the window's size: "
            "@rolling_window(W)",
            cache_span,
        )


def splits_of(heads: Dim, batch: Dim, s_max: Dim) -> int:
    """How many splits each row's ``S_max`` keys are cut into: as ``decode_attention``
    picks them by default (the largest divisor of ``S_max`` that gives at most 64
    programs and 256 keys a split), counting a batch that is a size as one row; one
    where ``S_max`` is a size."""
    if s_max.constant is None:
        return 1
    rows = (heads.constant or 1) * (batch.constant or 1)
    want = max(1, min(-(-_PROGRAMS // rows), s_max.constant // _MIN_SPLIT))
    return max(p for p in range(1, want + 1) if s_max.constant % p == 0)


def library_module(call: AttendCall) -> ast.Module:
    """The parsed library source of one call: the standard library's kernel for its
    splits (``decode_partial_lse``, or ``decode_partial`` for one) for the cache's
    dtype, parsed under its own file's name (so that the code cites
    ``decode_partial.tsr:LINE``), and ``attend(q, k, v, seen)``, which stacks ``q``'s
    grouped heads, runs the kernel over the splits and combines them."""
    dtype = str(call.cache.dtype)
    name = "decode_partial_lse" if call.splits > 1 else "decode_partial"
    text = resources.files("tessera.stdlib").joinpath(f"{name}.tsr").read_text("utf-8")
    modules = [parse_library_file(f"{name}.tsr", text.replace("bf16", dtype))]
    text = attend_source(call)
    modules.append(
        parse_library_file(f"kvattend_{hashlib.sha256(text.encode()).hexdigest()[:16]}", text)
    )
    return ast.Module(tuple(s for m in modules for s in m.body), span=modules[-1].span)


def attend_source(call: AttendCall) -> str:
    """The ``.tsr`` text of ``attend``, with the call's dims and numbers."""
    dtype = str(call.cache.dtype)
    b, h, d = (_dim(x) for x in (call.batch, call.heads, call.dim))
    n, q_heads, big_n, c, r = (
        _dim(x) for x in (call.rows, call.q.dims[1], call.programs, call.chunk, call.stacked)
    )
    p = call.splits
    lines = [f"grouped = q.reshape({big_n}, {r}, {d})"]
    if p > 1:  # each split's programs read their own copy of the rows
        joined = _dim(call.dim + Dim.const(1))
        lines = [
            f"grouped = broadcast_to(q.reshape({b}, {h}, 1, {r}, {d}), "
            f"({b}, {h}, {p}, {r}, {d})).reshape({big_n}, {r}, {d})",
            f"joined = decode_partial_lse(grouped, k, v, seen, scale={call.scale!r})"
            f".reshape({b}, {h}, {p}, {r}, {joined})",
            "lse = joined[..., :1]",
            "partial = joined[..., 1:]",
            # each split weighed by its share of the softmax's denominator
            "attended = sum(partial * exp(lse - logsumexp(lse, axis=2, keepdims=True)), axis=2)",
        ]
    else:
        lines.append(f"attended = decode_partial(grouped, k, v, seen, scale={call.scale!r})")
    lines.append(f"return cast(attended.reshape({b}, {q_heads}, {n}, {d}), {dtype})")
    body = "".join(f"    {line}\n" for line in lines)
    return (
        "@kernel\n"
        f"def attend(q: Tensor[{b}, {q_heads}, {n}, {d}, {dtype}], "
        f"k: Tensor[{big_n}, {c}, {d}, {dtype}], v: Tensor[{big_n}, {c}, {d}, {dtype}], "
        f"seen: Tensor[{big_n}, {r}, 1, i32]"
        f") -> Tensor[{b}, {q_heads}, {n}, {d}, {dtype}]:\n"
        f"{body}"
    )


def default_scale(dim: Dim, span: Span) -> float:
    """``1/sqrt(D)``, for a head dim that is a number."""
    if dim.constant is None:
        raise SemanticError(
            f"flash_attention over a KVCache scales the scores by a number: the head dim "
            f"{dim} is a size, so give scale= (e.g. scale=0.125 for 64)",
            span,
        )
    return 1.0 / math.sqrt(dim.constant)


def _dim(d: Dim) -> str:
    """A dim as ``.tsr`` source writes it: a number, or a quoted expression."""
    return str(d.constant) if d.constant is not None else f'"{d}"'
