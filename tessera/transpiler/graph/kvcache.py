"""The type rules of ``KVCache.append``: what a program may append to a cache.

``cache.append(k, v)`` takes ``k`` and ``v`` ``[B, H, n, D]`` of the cache's ``B``, ``H``
and ``D`` and its dtype. Where ``n`` and the cache's ``S_max`` are known, an append that
can never fit (``n > S_max`` without ``@rolling_window``, ``n`` past the window with it)
is an error at the call, not a write out of bounds at run time; the run-time cache
(``tessera.runtime.kvcache``) checks the lengths it holds before each write.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..frontend.source import Span
from .dims import Dim
from .ir import Guard, Op, Value
from .opcall import SemanticError
from .types import KVCacheType, TensorType

__all__ = [
    "check_append", "rolling_window", "flat_names", "cache_param",
    "room_guard",
]  # fmt: skip


def flat_names(name: str) -> tuple[str, str, str]:
    """The names of the tensors of the cache parameter ``name`` at a compiled entry:
    ``tessera.KVCache``'s ``K``, ``V`` and ``lengths`` (``tile.kvcache``)."""
    return f"{name}_k", f"{name}_v", f"{name}_lengths"


def cache_param(ops: Iterable[Op], value: Value) -> tuple[Value, Dim]:
    """The cache parameter whose arrays ``value`` is (an append writes in place, so every
    cache of a function is one of its parameters), and how many positions the appends
    that made ``value`` from it add (``ops``: the function's, in order)."""
    made = {r.id: op for op in ops for r in op.results}
    appended = Dim.const(0)
    while value.id in made:
        op = made[value.id]
        if op.kind == "kvcache.advance":
            appended = appended + op.attr("n")
        value = op.operands[0]
    return value, appended


def room_guard(cache: Value, appended: Dim, span: Span) -> Guard:
    """The run-time check that an append into ``cache`` (a parameter without a rolling
    window) fits: each row's length, plus the ``appended`` positions of this and the
    function's earlier appends into it, is at most ``S_max``. The lengths are a tensor's
    values, so it is a guard on them: they lie in ``[0, S_max - appended + 1)``."""
    s_max = cache.type.dims[2]
    return Guard(
        "indices", Dim.const(0), s_max - appended + Dim.const(1),
        f"KVCache.append: a row's length and the {appended} positions appended must fit "
        f"S_max = {s_max}; declare @rolling_window(W) to keep the last positions instead",
        span, tensor=flat_names(cache.name)[2],
    )  # fmt: skip


def rolling_window(cache: KVCacheType) -> int | None:
    """The ``W`` of ``@rolling_window(W)``, 0 for a window without a size, None without
    the policy."""
    for policy in cache.policies:
        if policy == "@rolling_window":
            return 0
        if policy.startswith("@rolling_window("):
            size = policy.removeprefix("@rolling_window(").removesuffix(")")
            return int(size) if size.isdigit() else 0
    return None


def check_append(cache: KVCacheType, operands: list[tuple[str, TensorType, Span]]) -> None:
    """Raise ``SemanticError`` at the offending argument unless ``operands`` (``k`` and
    ``v``: their text, type and span) can be appended to a cache of type ``cache``."""
    if cache.dims is None or cache.dtype is None:
        raise SemanticError(
            "KVCache.append writes the cache's arrays, which need its shape: declare it "
            'as KVCache["B", "H", "S_max", "D_h", bf16]',
            operands[0][2],
        )
    batch, heads, s_max, dim = cache.dims
    for text, t, span in operands:
        if t.rank != 4 or (t.dims[0], t.dims[1], t.dims[3]) != (batch, heads, dim):
            raise SemanticError(
                f"KVCache.append: {text} must be [B, H, n, D] of the cache's [{batch}, {heads}, "
                f"{s_max}, {dim}], not [{', '.join(map(str, t.dims))}]",
                span,
            )
        if t.dtype != cache.dtype:
            raise SemanticError(
                f"KVCache.append: {text} is {t.dtype} but the cache holds {cache.dtype}", span
            )
    (_, k, k_span), (_, v, v_span) = operands
    if k.dims[2] != v.dims[2]:
        raise SemanticError(
            f"KVCache.append: k appends {k.dims[2]} positions but v {v.dims[2]}", v_span
        )
    n, window = k.dims[2].constant, rolling_window(cache)
    if window is not None and s_max.constant is not None and window > s_max.constant:
        raise SemanticError(
            f"KVCache.append: the window of {window} positions is larger than the cache's "
            f"S_max = {s_max}",
            k_span,
        )
    if window == 0:
        raise SemanticError(
            "KVCache.append: a compiled append keeps a ring of W positions: give the "
            "window's size, @rolling_window(W)",
            k_span,
        )
    room = window if window else s_max.constant
    if n is not None and room is not None and n > room:
        where = f"the cache's window of {window}" if window else f"a cache of S_max = {room}"
        hint = "" if window is not None else "; declare @rolling_window to keep the last positions"
        raise SemanticError(f"KVCache.append: {n} positions never fit {where}{hint}", k_span)
