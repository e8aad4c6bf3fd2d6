"""The kernels of ``cache.append(k, v)`` in a graph function: the cache written in place.

A ``KVCache["B", "H", "S_max", "D", dtype]`` parameter ``cache`` is three tensors at
the entry (``target.entry``): ``cache_k`` and ``cache_v`` ``[B, H, S_max, D]`` and
``cache_lengths`` ``[B]`` (int64), the arrays of a ``tessera.KVCache``. An append is two
launches, in program order:

``kvcache.append``   one program per new position and (batch row, head): it reads the
                     row's length, computes the slot ``(length + i) % ring`` (``ring``
                     the window's ``W``, else ``S_max``) and stores that row of ``k`` and
                     ``v`` there, into the caller's arrays
``kvcache.advance``  one program per batch row: ``lengths[b] += n``

``flash_attention(q, cache)`` (``graph.kvattend``) reads the lengths in one launch:

``kvcache.visible``  one program per stacked query row and (batch row, key head and
                     split): how many keys of its split the row sees, ``seen [B*H*P,
                     G*n, 1]``, from the row's length as the launches before it left
                     it (``cexpr.kv_visible``)

``cache.lengths`` is a launch of its own too:

``kvcache.lengths``  one program per batch row: ``out[b] = i32(lengths[b])``

The lengths grow in a launch of their own because every program of the append reads
them: a program that added to them while another still read them would race. The slot
is taken modulo the ring whatever the lengths hold, so no store is ever out of bounds;
the runtime refuses an append past ``S_max`` without a window before the launch
(``tessera.runtime.kvcache``).
"""

from __future__ import annotations

from ..graph.dims import Dim
from ..graph.dtypes import I64
from ..graph.ir import Block, Function, Op, Value, new_value
from ..graph.kvcache import cache_param, flat_names, rolling_window
from ..graph.types import KVCacheType, TensorType, TileType
from ..schedule.ir import Launch
from .ir import Access, Axis, GridAxis, TileKernel
from .lower import INDEX

__all__ = ["cache_kernel", "flat_types"]

_ONE = Dim.const(1)
_ZERO = Dim.const(0)


def flat_types(t: KVCacheType) -> tuple[TensorType, TensorType, TensorType]:
    """The types of a cache's ``K``, ``V`` and ``lengths``."""
    assert t.dims is not None and t.dtype is not None, "checked by the append's analysis"
    cache = TensorType(t.dims, t.dtype)
    return cache, cache, TensorType((t.dims[0],), I64)


def cache_kernel(
    function: Function, op: Op, launch: Launch, name: str, tensors: dict[int, Value]
) -> TileKernel:
    """The kernel of ``op`` (``kvcache.append``, ``kvcache.advance``,
    ``kvcache.visible`` or ``kvcache.lengths``); ``tensors`` are the kernel parameters
    of the group's other operands (``k`` and ``v``) and of the result it writes
    (``seen``, the lengths read), by value id."""
    cache, _ = cache_param(function.body.ops, op.operands[0])
    t = cache.type
    assert isinstance(t, KVCacheType) and cache.name is not None
    k_type, v_type, lengths_type = flat_types(t)
    k_cache, v_cache, lengths = (
        new_value(ty, n)
        for ty, n in zip((k_type, v_type, lengths_type), flat_names(cache.name), strict=True)
    )
    sizes: tuple[tuple[str, int], ...] = ()
    if op.kind == "kvcache.visible":
        seen = tensors[op.result.id]
        programs, stacked, _ = seen.type.dims
        grid = (GridAxis("pid_m", stacked), GridAxis("pid_b0", t.dims[0]),
                GridAxis("pid_b1", programs / t.dims[0]))  # fmt: skip
        where = (("batch", "pid_b0"), ("program", "pid_b1"), ("row", "pid_m"),
                 ("programs", programs / t.dims[0]), ("stacked", stacked),
                 *op.attrs)  # fmt: skip
        body = (Op("kv_visible", (seen, lengths), (), where, ("write",), span=op.span),)
        params = (seen, lengths)
    elif op.kind == "kvcache.lengths":
        out = tensors[op.result.id]
        grid = (GridAxis("pid_m", t.dims[0]),)
        body = (Op("kv_lengths", (out, lengths), (), (("pid", "pid_m"),), ("write",),
                   span=op.span),)  # fmt: skip
        params = (out, lengths)
    elif op.kind == "kvcache.advance":
        grid = (GridAxis("pid_m", t.dims[0]),)
        body = (Op("kv_advance", (lengths,), (), (("pid", "pid_m"), ("n", op.attr("n"))),
                   ("write",), span=op.span),)  # fmt: skip
        params: tuple[Value, ...] = (lengths,)
    else:
        k, v = (tensors[x.id] for x in op.operands[1:])
        batch, heads, s_max, dim = t.dims
        if dim.constant is not None:  # the head dim by its name, as a library kernel's
            dim, sizes = Dim.named(dim.constant, Dim.sym("D")), (("D", dim.constant),)
        window = rolling_window(t)
        grid = (GridAxis("pid_m", k.type.dims[2]), GridAxis("pid_b0", batch),
                GridAxis("pid_b1", heads))  # fmt: skip
        slot = new_value(INDEX, "slot")
        ring = Dim.const(window) if window else s_max
        where = (("batch", "pid_b0"), ("row", "pid_m"), ("ring", ring))
        body_ops = [Op("kv_slot", (lengths,), (slot,), where, span=op.span)]
        row = TileType((_ONE, dim), t.dtype)
        for new, stored in ((k, k_cache), (v, v_cache)):
            read = new_value(row, f"{new.name}_row")
            body_ops.append(
                Op(
                    "load",
                    (new,),
                    (read,),
                    (("at", _rows(new, Dim.sym("pid_m"), dim)),),
                    span=op.span,
                )
            )
            at = _rows(stored, Dim.sym(slot.name), dim)
            body_ops.append(
                Op("store", (stored, read), (), (("at", at),), ("write",), span=op.span)
            )
        body = tuple(body_ops)
        params = (k_cache, v_cache, lengths, k, v)
    return TileKernel(
        name, function.name, launch.name, "state", _TEMPLATES[op.kind], params, grid,
        (("T.m", 1),), launch.threads, launch.warps, 1, launch.vector, "none",
        Block((), body), span=op.span, sizes=sizes,
    )  # fmt: skip


_TEMPLATES = {
    "kvcache.append": "kvcache_append", "kvcache.advance": "kvcache_advance",
    "kvcache.visible": "kvcache_visible", "kvcache.lengths": "kvcache_lengths",
}  # fmt: skip


def _rows(tensor: Value, row: Dim, width: Dim) -> Access:
    """One row of ``[B, H, rows, D]``: batch row ``pid_b0``, head ``pid_b1``, ``row``, and
    every column, ``width`` of them (``D``, spelled so where it is a number)."""
    dims = tensor.type.dims
    return Access((
        Axis(Dim.sym("pid_b0"), _ONE, dims[0], index=True),
        Axis(Dim.sym("pid_b1"), _ONE, dims[1], index=True),
        Axis(row, _ONE, dims[2]),
        Axis(_ZERO, width, width),
    ))  # fmt: skip
