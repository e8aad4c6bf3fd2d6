"""A key/value cache for decoding, and attention over it (flash-decoding).

``KVCache`` is the Python side of ``KVCache["B", "H", "S_max", "D", dtype]``: three
arrays, ``K`` and ``V`` ``[B, H, S_max, D]`` and ``lengths`` ``[B]`` (the positions
written so far in each batch row), checked like any tensor argument. ``append`` writes
new keys and values into those arrays in place, the cache being donated rather than
copied, and refuses, before writing anything, an append that would pass ``S_max``. With
a rolling window of ``W`` positions, position ``p`` lives in slot ``p % W`` and the
cache keeps the last ``W`` positions.

``decode_attention(q, cache)`` runs the standard library's ``decode_attention`` tile
kernel (``tessera/stdlib/decode_attention.tsr``): the cache's keys are cut into splits
that programs read in parallel, each with an online softmax, and the splits' partial
outputs are weighed by their log-sum-exp. Query heads that share a key
head (grouped-query attention) are stacked into the rows of one program, so that each
key is read once per key head. ``docs/kv-cache.md`` describes both.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

import numpy as np

from .arguments import bound_arguments

__all__ = [
    "KVCache", "CacheSignature", "decode_attention", "decode_block", "decode_library",
    "decode_source",
]  # fmt: skip

#: Cache dtypes, by numpy name, and the Tessera dtype the kernel is instantiated for.
_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
#: Keys a split reads at least, so that a split's fixed cost stays small beside it.
_MIN_SPLIT = 256
#: Programs the splits aim for, at least: enough to keep every core of a CPU busy.
_PROGRAMS = 64
#: Row blocks of the CPU's kernel for the few query rows of a decode step: the smallest
#: that holds them all. The attention heuristic's 128-row block is built for prefill; of
#: it a decode step (one token of 4 query heads a key head, say) uses 4 rows, and the
#: scores' mask, the zeroed rows of the product and the end of each program ran over all
#: 128 (at 1k positions they cost more than the keys and values read). 128 keys a block:
#: at 16 rows, 128 keys measured 10-15% faster than 256 at 1k and 4k positions.
_CPU_BLOCKS = ((16, 128), (32, 128), (64, 128))


class KVCache:
    """The keys and values of ``B`` sequences: ``K`` and ``V`` ``[B, H, S_max, D]`` and
    ``lengths`` ``[B]`` (int64), the number of positions appended to each row.

    ``window``, when given, makes the cache a ring of the last ``window`` positions (the
    ``@rolling_window(W)`` policy): position ``p`` is stored in slot ``p % window``, and
    ``lengths`` keeps counting past it. ``KVCache.zeros`` makes an empty one; arrays of
    one's own are checked by the constructor.
    """

    def __init__(self, K: Any, V: Any, lengths: Any, *, window: int | None = None) -> None:
        self.K, self.V, self.lengths, self.window = K, V, lengths, window
        self.check()

    @classmethod
    def zeros(
        cls,
        batch: int,
        heads: int,
        s_max: int,
        head_dim: int,
        dtype: Any = np.float32,
        *,
        window: int | None = None,
    ) -> KVCache:
        """An empty cache. Its slots are zeros, not left uninitialized: attention weighs a
        slot past a row's length by 0, and 0 times a NaN left in memory would be NaN."""
        shape = (batch, heads, s_max, head_dim)
        lengths = np.zeros(batch, np.int64)
        return cls(np.zeros(shape, dtype), np.zeros(shape, dtype), lengths, window=window)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(B, H, S_max, D)``."""
        return tuple(self.K.shape)

    def check(self) -> None:
        """Raise ``ValueError`` unless the arrays make a cache: K and V of one 4-D shape and
        one dtype that the kernel takes, C-contiguous; lengths an int64 vector of ``B``
        entries in ``[0, S_max]`` (any non-negative count with a window)."""
        K, V, lengths = self.K, self.V, self.lengths
        if getattr(K, "ndim", None) != 4:
            raise ValueError(f"KVCache: K must be a 4-D array [B, H, S_max, D], not {_shown(K)}")
        if getattr(V, "shape", None) != K.shape or V.dtype != K.dtype:
            raise ValueError(f"KVCache: V must have K's shape and dtype: K is {_shown(K)}, "
                             f"V is {_shown(V)}")  # fmt: skip
        if K.dtype.name not in _DTYPES:
            raise ValueError(f"KVCache: the cache's dtype must be one of {', '.join(_DTYPES)}, "
                             f"not {K.dtype.name}")  # fmt: skip
        for name, array in (("K", K), ("V", V)):
            if not array.flags.c_contiguous:
                raise ValueError(f"KVCache: {name} must be C-contiguous")
        batch, _, s_max, _ = K.shape
        if getattr(lengths, "shape", None) != (batch,) or lengths.dtype != np.int64:
            raise ValueError(f"KVCache: lengths must be an int64 vector of B = {batch} entries, "
                             f"not {_shown(lengths)}")  # fmt: skip
        if self.window is not None and not 1 <= self.window <= s_max:
            raise ValueError(f"KVCache: window must be in [1, S_max = {s_max}], "
                             f"not {self.window}")  # fmt: skip
        top = math.inf if self.window is not None else s_max
        bad = [b for b, n in enumerate(lengths.tolist()) if not 0 <= n <= top]
        if bad:
            raise ValueError(f"KVCache: lengths[{bad[0]}] = {int(lengths[bad[0]])} is outside "
                             f"[0, {top}]")  # fmt: skip

    def append(self, k: Any, v: Any) -> KVCache:
        """Write ``k`` and ``v`` ``[B, H, n, D]`` after each row's last position, in place,
        and return the cache (the same object: its arrays are donated, not copied).

        Without a window, an append that would pass ``S_max`` raises ``ValueError`` before
        anything is written. With one, ``n`` may not exceed the window (the first rows of
        ``k`` would be overwritten by the last ones in the same append)."""
        self.check()
        batch, heads, s_max, dim = self.shape
        for name, x in (("k", k), ("v", v)):
            if (
                getattr(x, "ndim", None) != 4
                or x.shape[:2] != (batch, heads)
                or (x.shape[3] != dim)
            ):
                raise ValueError(f"KVCache.append: {name} must be [B, H, n, D] = [{batch}, "
                                 f"{heads}, n, {dim}], not {_shown(x)}")  # fmt: skip
        if k.shape != v.shape:
            raise ValueError(f"KVCache.append: k and v differ: {_shown(k)}, {_shown(v)}")
        n = k.shape[2]
        if self.window is None:
            over = [b for b, length in enumerate(self.lengths.tolist()) if length + n > s_max]
            if over:
                b = over[0]
                raise ValueError(
                    f"KVCache.append: row {b} holds {int(self.lengths[b])} of S_max = {s_max} "
                    f"positions; {n} more do not fit (declare @rolling_window to keep the last "
                    "positions instead)"
                )
        elif n > self.window:
            raise ValueError(f"KVCache.append: {n} positions at once exceed the window of "
                             f"{self.window}")  # fmt: skip
        ring = self.window or s_max
        for b, length in enumerate(self.lengths.tolist()):
            slots = np.arange(length, length + n) % ring
            self.K[b][:, slots] = k[b]
            self.V[b][:, slots] = v[b]
        self.lengths += n
        return self

    def visible(self, rows: int, causal: bool) -> np.ndarray:
        """``[B, rows]``: how many slots, from slot 0, each of the last ``rows`` positions
        may attend to. Causal, query ``i`` of ``rows`` (position ``length - rows + i``)
        sees the positions up to its own; a window that has wrapped keeps only the last
        ``window`` positions, all of which the last query sees, so it takes one query
        row at a time (its earlier rows' keys would have been overwritten)."""
        lengths = self.lengths.astype(np.int64)
        if (lengths < rows).any():
            b = int(np.argmax(lengths < rows))
            raise ValueError(f"decode_attention: row {b} of the cache holds {int(lengths[b])} "
                             f"positions, fewer than the {rows} queries (append their keys "
                             "first)")  # fmt: skip
        counts = (
            lengths[:, None] - (rows - 1 - np.arange(rows))[None, :]
            if causal
            else (np.broadcast_to(lengths[:, None], (len(lengths), rows)))
        )
        if self.window is not None:
            wrapped = lengths > self.window
            if causal and rows > 1 and wrapped.any():
                raise ValueError(
                    f"decode_attention: row {int(np.argmax(wrapped))} of the cache has wrapped "
                    f"its window of {self.window}; causal attention over it takes one query "
                    f"row at a time, not {rows}"
                )
            counts = np.minimum(counts, self.window)
        return counts


class CacheSignature:
    """The ``KVCache`` parameters of one compiled function (its metadata's ``caches``):
    the entry takes each as its three tensors ``<name>_k``, ``<name>_v`` and
    ``<name>_lengths``, which the function's appends write in place; a call takes a
    ``KVCache`` in their place and returns it (the same object, its arrays updated)
    where the function returns the cache."""

    def __init__(self, name: str, inputs: list[Mapping[str, Any]], meta: Mapping[str, Any]):
        self.name = name
        self.caches = {c["name"]: c for c in meta["caches"]}
        self.returns = meta["returns"]
        flat = {f"{c}_{field}": c for c in self.caches for field in ("k", "v", "lengths")}
        #: the inputs as the caller passes them: each cache as one input, where its K is
        self.inputs: list[Mapping[str, Any]] = []
        for p in inputs:
            cache = flat.get(p["name"])
            if cache is None:
                self.inputs.append(p)
            elif p["name"] == f"{cache}_k":
                self.inputs.append({**p, "name": cache, "kind": "cache"})

    def signature(self, items: Callable[[list[Mapping[str, Any]]], list[str]]) -> list[str]:
        """The inputs as the docstring shows them, a cache as its ``.tsr`` type."""
        shown = []
        for p in self.inputs:
            if p["kind"] != "cache":
                shown += [i for i in items([p]) if i != "*"]
                continue
            dims = ", ".join(p["dims"])
            window = self.caches[p["name"]]["window"]
            ring = f" @rolling_window({window})" if window is not None else ""
            shown.append(f"{p['name']}: KVCache[{dims}, {p['dtype']}]{ring}")
        first = next((i for i, p in enumerate(self.inputs) if p.get("keyword_only")), None)
        return shown if first is None else [*shown[:first], "*", *shown[first:]]

    def call(
        self, run: Callable[..., Any], flat: list[str], args: tuple, kwargs: dict, out: Any
    ) -> Any:
        """Check each cache argument, run the function on its arrays (``flat``: the names
        ``run`` takes by position), and put the cache back among the results where the
        function returns it."""
        values = bound_arguments(self.name, self.inputs, args, kwargs)
        given = {}
        for name, spec in self.caches.items():
            if name not in values:
                raise TypeError(f"{self.name}() is missing {name}")
            cache = values.pop(name)
            if not isinstance(cache, KVCache):
                raise TypeError(f"{self.name}(): '{name}' must be a tessera.KVCache, not "
                                f"{type(cache).__name__}")  # fmt: skip
            if cache.window != spec["window"]:
                declared = (f"@rolling_window({spec['window']})" if spec["window"] is not None
                            else "no @rolling_window")  # fmt: skip
                raise ValueError(f"{self.name}(): '{name}' has window={cache.window}, and the "
                                 f"function declares {declared}")  # fmt: skip
            # the entry checks the arrays against the declared dims and dtype, and the
            # guards the lengths: what KVCache.check would, in C on the fast path
            values.update({f"{name}_k": cache.K, f"{name}_v": cache.V,
                           f"{name}_lengths": cache.lengths})  # fmt: skip
            given[name] = cache
        by_position = []
        for key in flat:  # by position while they last: the fast path takes those
            if key not in values:
                break
            by_position.append(values.pop(key))
        done = run(*by_position, **values) if out is None else run(*by_position, **values, out=out)
        if not any(spec["returned"] for spec in self.caches.values()):
            return done
        computed = iter(done if isinstance(done, tuple) else () if done is None else (done,))
        returned = {i: given[name] for name, s in self.caches.items() for i in s["returned"]}
        results = [returned[i] if i in returned else next(computed) for i in range(self.returns)]
        return tuple(results) if len(results) > 1 else results[0]


def decode_source(dtype: str = "bf16", block: tuple[int, int] | None = None) -> str:
    """The standard library's decode kernel, instantiated for a cache of ``dtype``;
    with ``block`` (query rows, keys), scheduled in blocks of that size rather than the
    target's attention heuristic's."""
    text = resources.files("tessera.stdlib").joinpath("decode_attention.tsr").read_text("utf-8")
    text = text.replace("bf16", dtype)
    if block is not None:
        text = text.replace("\n@kernel\n", f"\n@kernel.schedule(Schedule(block={block}))\n", 1)
    return text


@functools.cache
def decode_library(
    target: str = "cpu", dtype: str = "f32", block: tuple[int, int] | None = None
) -> Any:
    """The decode kernel compiled for ``target``, a cache of ``dtype`` and ``block`` (as
    ``decode_source`` takes it), loaded (once per process)."""
    from ..transpiler.pipeline import compile as compile_source

    path = "tessera/stdlib/decode_attention.tsr"
    return compile_source(decode_source(dtype, block), filename=path, target=target).load()


def decode_block(target: str, rows: int) -> tuple[int, int] | None:
    """The block ``decode_attention`` schedules its kernel in for ``rows`` query rows a
    key head (``H_q / H`` times the queries): on the CPU, the smallest of
    ``_CPU_BLOCKS`` that holds them; else (and for more rows) the target's heuristic's
    (None)."""
    if target != "cpu":
        return None
    return next((block for block in _CPU_BLOCKS if rows <= block[0]), None)


def decode_attention(
    q: Any,
    cache: KVCache,
    *,
    causal: bool = True,
    scale: float | None = None,
    splits: int | None = None,
    target: str = "cpu",
    library: Any = None,
) -> Any:
    """``softmax(q @ K^T * scale) @ V`` of ``q [B, H_q, n, D]`` over the cache's keys, in
    the cache's dtype (accumulated in f32). ``H_q`` is a multiple of the cache's heads:
    query head ``h`` reads key head ``h // (H_q / H)``. ``causal`` masks each query's
    later positions, the queries being the last ``n`` appended; ``scale`` defaults to
    ``1/sqrt(D)``. ``splits`` (dividing ``S_max``) is how many programs share a row's
    keys; by default as many as keep the machine busy with at least 256 keys each.
    ``library`` is a loaded ``decode_library`` (for another target's loader), else the
    one for ``target`` in the block ``decode_block`` picks."""
    cache.check()
    batch, heads, s_max, dim = cache.shape
    if getattr(q, "ndim", None) != 4 or q.shape[0] != batch or q.shape[3] != dim:
        raise ValueError(f"decode_attention: q must be [B, H_q, n, D] = [{batch}, H_q, n, {dim}], "
                         f"not {_shown(q)}")  # fmt: skip
    if q.dtype != cache.K.dtype:
        raise ValueError(f"decode_attention: q is {q.dtype.name} but the cache is "
                         f"{cache.K.dtype.name}")  # fmt: skip
    q_heads, rows = q.shape[1], q.shape[2]
    if q_heads % heads:
        raise ValueError(f"decode_attention: q's {q_heads} heads are not a multiple of the "
                         f"cache's {heads}")  # fmt: skip
    group = q_heads // heads
    parts = _splits(splits, batch * heads, s_max)
    chunk = s_max // parts
    programs = batch * heads * parts
    stacked = group * rows  # the query rows that read one key head
    # q [B, H_kv * G, n, D] is [B, H_kv, G*n, D] as it lies; each split gets its copy.
    grouped = np.ascontiguousarray(q).reshape(batch, heads, 1, stacked, dim)
    grouped = np.ascontiguousarray(np.broadcast_to(grouped, (batch, heads, parts, stacked, dim)))
    counts = cache.visible(rows, causal)  # [B, n]
    starts = (np.arange(parts) * chunk)[None, None, :, None, None]
    seen = np.clip(counts[:, None, None, None, :] - starts, 0, chunk)
    seen = np.broadcast_to(seen, (batch, heads, parts, group, rows)).astype(np.int32)
    lib = library or decode_library(
        target, _DTYPES[cache.K.dtype.name], decode_block(target, stacked)
    )
    # Poisoned: a row that a launch leaves unwritten comes out NaN, never stale.
    partial = np.full((programs, stacked, dim), np.nan, np.float32)
    lse = np.full((programs, stacked, dim), np.nan, np.float32)
    lib.decode_attention(
        grouped.reshape(programs, stacked, dim), cache.K.reshape(programs, chunk, dim),
        cache.V.reshape(programs, chunk, dim), seen.reshape(programs, stacked, 1), partial,
        lse, scale=1.0 / math.sqrt(dim) if scale is None else float(scale),
    )  # fmt: skip
    shape = (batch * heads, parts, stacked, dim)
    out = _combine(partial.reshape(shape), lse.reshape(shape))
    out = out.reshape(batch, q_heads, rows, dim)
    return out if out.dtype == q.dtype else out.astype(q.dtype)


def _combine(partial: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """The splits' outputs ``[N, P, R, D]`` weighed by ``exp(lse - max lse)`` (a split that
    saw no key has ``lse = -INF``, weight 0): the softmax over all the keys. It reads
    ``P`` values a row and column, which the array library does in microseconds; as a
    graph function it took nine launches. ``lse`` repeats along ``D``, so the weights
    come from its first column: a 128th of the exponentials."""
    lse = lse[..., :1]
    weight = np.exp(lse - lse.max(axis=1, keepdims=True))
    return (partial * weight).sum(axis=1) / weight.sum(axis=1)


def _splits(splits: int | None, rows: int, s_max: int) -> int:
    """How many splits each row's keys are cut into: ``splits`` checked, else the largest
    divisor of ``S_max`` that gives at most ``_PROGRAMS`` programs and ``_MIN_SPLIT`` keys
    a split."""
    if splits is not None:
        if splits < 1 or s_max % splits:
            raise ValueError(f"decode_attention: splits = {splits} must divide S_max = {s_max}")
        return splits
    want = max(1, min(-(-_PROGRAMS // rows), s_max // _MIN_SPLIT))
    return max(p for p in range(1, want + 1) if s_max % p == 0)


def _shown(x: Any) -> str:
    """An argument as a message shows it: its shape and dtype, or its type."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{list(x.shape)} {x.dtype}"
    return type(x).__name__
