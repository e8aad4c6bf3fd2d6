"""``flash_attention(q, cache)`` in a compiled graph function, on every target.

The compiled attention must agree with ``tessera.decode_attention`` on a copy of the
cache (the same kernel and splits: to rounding) and with the float64 reference, which
keeps its own history of every key and value appended (``test_kvcache.History``).
Batch rows hold different lengths, one of which leaves a split with no key; the head
dim (13) is no multiple of a tile or of 4; query heads are grouped (6 over 2); a rolling
window wraps; ``step`` appends and attends in one call, as a decoding step does. The
outputs are poisoned first.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera.runtime.kvcache import KVCache, decode_attention
from tessera.transpiler.graph.dims import Dim
from tessera.transpiler.graph.kvattend import splits_of

from .everywhere import EVERY_TARGET, load_everywhere
from .test_kvcache import _ragged, _random

SOURCE = """\
@kernel
def attend(q: Tensor["B", {q_heads}, {rows}, {dim}, {dtype}],
           cache: KVCache["B", {heads}, {s_max}, {dim}, {dtype}]{window}
           ) -> Tensor["B", {q_heads}, {rows}, {dim}, {dtype}]:
    return flash_attention(q, cache, causal={causal})


@kernel
def step(q: Tensor["B", {q_heads}, {rows}, {dim}, {dtype}],
         k: Tensor["B", {heads}, {rows}, {dim}, {dtype}],
         v: Tensor["B", {heads}, {rows}, {dim}, {dtype}],
         cache: KVCache["B", {heads}, {s_max}, {dim}, {dtype}]{window}
         ) -> (Tensor["B", {q_heads}, {rows}, {dim}, {dtype}],
               KVCache["B", {heads}, {s_max}, {dim}, {dtype}]{window}):
    cache = cache.append(k, v)
    return flash_attention(q, cache, causal={causal}), cache
"""
#: The dtypes of the cache, and the error each allows against the float64 reference
#: and against ``decode_attention`` (relative to the largest output).
DTYPES = {"f32": (np.float32, 1e-5, 1e-6), "bf16": (ml_dtypes.bfloat16, 2e-2, 1e-2)}


def _source(heads: int, q_heads: int, rows: int, s_max: int, dim: int, causal: bool,
            window: int | None = None, dtype: str = "f32") -> str:  # fmt: skip
    ring = f" @rolling_window({window})" if window is not None else ""
    return SOURCE.format(heads=heads, q_heads=q_heads, rows=rows, s_max=s_max, dim=dim,
                         causal=causal, window=ring, dtype=dtype)  # fmt: skip


def _copy(cache: KVCache) -> KVCache:
    return KVCache(cache.K.copy(), cache.V.copy(), cache.lengths.copy(), window=cache.window)


def _compare(got: np.ndarray, cache: KVCache, q: np.ndarray, want: np.ndarray, causal: bool,
             dtype: str, what: str) -> None:  # fmt: skip
    """``got`` against ``decode_attention`` over ``cache`` (as the compiled call left it)
    and against the float64 ``want``."""
    _, reference, peer = DTYPES[dtype]
    assert not np.isnan(got.astype(np.float32)).any(), f"{what}: outputs left unwritten"
    splits = splits_of(Dim.const(cache.shape[1]), Dim.const(cache.shape[0]),
                       Dim.const(cache.shape[2]))  # fmt: skip
    runtime = decode_attention(q, _copy(cache), causal=causal, splits=splits)
    scale = np.abs(want).max()
    error = np.abs(got.astype(np.float64) - runtime.astype(np.float64)).max() / scale
    assert error < peer, f"{what}: {error:.2e} from tessera.decode_attention"
    error = np.abs(got.astype(np.float64) - want).max() / scale
    assert error < reference, f"{what}: {error:.2e} from the float64 reference"


def _poisoned(shape: tuple[int, ...], dtype: object) -> np.ndarray:
    return np.full(shape, np.nan, dtype)


def _run(lib: object, causal: bool, dtype: str, rng: np.random.Generator) -> None:
    """Ragged rows over two splits of 256 keys (row 0 leaves the second empty), grouped
    heads: attend to the cache as it is (one query row, not causal, and three rows,
    causal), then append three positions and attend to them in one call."""
    numpy_dtype = DTYPES[dtype][0]
    heads, q_heads, rows, dim = 2, 6, 3, 13
    cache, history = _ragged(rng, [5, 300], heads, 512, dim)
    cache.K[...] = cache.K.astype(numpy_dtype).astype(np.float32)  # what the cache holds
    cache.V[...] = cache.V.astype(numpy_dtype).astype(np.float32)
    history.k = [[k.astype(numpy_dtype).astype(np.float64) for k in row] for row in history.k]
    history.v = [[v.astype(numpy_dtype).astype(np.float64) for v in row] for row in history.v]
    cache = KVCache(cache.K.astype(numpy_dtype), cache.V.astype(numpy_dtype), cache.lengths)
    q = _random(rng, 2, q_heads, rows, dim).astype(numpy_dtype)
    got = lib.attend(q, cache, out=_poisoned(q.shape, numpy_dtype))
    _compare(got, cache, q, history.attention(q, causal, None), causal, dtype,
             f"{dtype} attend")  # fmt: skip
    k, v = (_random(rng, 2, heads, rows, dim).astype(numpy_dtype) for _ in range(2))
    history.append(k, v)
    q = _random(rng, 2, q_heads, rows, dim).astype(numpy_dtype)
    before = cache.lengths.copy()
    got, returned = lib.step(q, k, v, cache, out=_poisoned(q.shape, numpy_dtype))
    assert returned is cache and cache.lengths.tolist() == (before + rows).tolist()
    _compare(got, cache, q, history.attention(q, causal, None), causal, dtype,
             f"{dtype} step")  # fmt: skip


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_attention_over_a_cache_in_a_compiled_function(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(11)
    for causal in (True, False):
        lib = load_everywhere(_source(2, 6, 3, 512, 13, causal), target, arch, monkeypatch)
        _run(lib, causal, "f32", rng)
