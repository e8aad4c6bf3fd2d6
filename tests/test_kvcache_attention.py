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

import re

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.runtime.kvcache import KVCache, decode_attention
from tessera.transpiler.graph.dims import Dim
from tessera.transpiler.graph.kvattend import splits_of

from .everywhere import EVERY_TARGET, load_everywhere
from .test_cuda import needs_gxx
from .test_kvcache import History, _ragged, _random

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
    heads, three query rows: attend to the cache as it is, then append three positions
    and attend to them in one call."""
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


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_attention_over_a_bf16_cache(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scores and sums in f32, the weights rounded to bf16 before they multiply V
    (on the GPU targets, by the bf16 products), the result rounded to bf16: as
    ``decode_attention`` computes it."""
    lib = load_everywhere(_source(2, 6, 3, 512, 13, True, dtype="bf16"), target, arch,
                          monkeypatch)  # fmt: skip
    _run(lib, True, "bf16", np.random.default_rng(5))


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_attention_over_a_rolling_window_that_wraps(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window of 5 slots of 7 (the slots past it are never attended to: they hold
    values far off the rest, finite as the cache's contract asks), rows of different
    lengths, one query row a step appended and attended to in one call: row 1 wraps at
    the first step, row 0 at the fifth."""
    rng = np.random.default_rng(23)
    lib = load_everywhere(_source(1, 2, 1, 7, 13, True, window=5), target, arch, monkeypatch)
    cache = KVCache.zeros(2, 1, 7, 13, window=5)
    history = History(2)
    for b, length in enumerate([1, 5]):
        k, v = _random(rng, 1, length, 13), _random(rng, 1, length, 13)
        cache.K[b, :, :length], cache.V[b, :, :length] = k, v
        history.k[b] += list(np.moveaxis(k, 1, 0).astype(np.float64))
        history.v[b] += list(np.moveaxis(v, 1, 0).astype(np.float64))
    cache.lengths[:] = [1, 5]
    cache.K[:, :, 5:] = 1e4
    cache.V[:, :, 5:] = 1e4
    for _ in range(6):
        k, v = _random(rng, 2, 1, 1, 13), _random(rng, 2, 1, 1, 13)
        history.append(k, v)
        q = _random(rng, 2, 2, 1, 13)
        got, _ = lib.step(q, k, v, cache, out=_poisoned(q.shape, np.float32))
        _compare(got, cache, q, history.attention(q, True, 5), True, "f32",
                 f"lengths {cache.lengths.tolist()}")  # fmt: skip


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize(
    ("window", "lengths", "message"),
    [
        (None, [4, 2], r"attend\(\): row 1 of 'cache' holds 2 positions: flash_attention: each "
         r"row of the cache must hold the 3 queries' positions \(append their keys first\)"),
        (5, [5, 6], r"attend\(\): row 1 of 'cache' holds 6 positions: flash_attention: causal "
         r"attention over a rolling window of 5 that has wrapped takes one query row at a "
         r"time, not 3"),
    ],
)  # fmt: skip
def test_lengths_that_decode_attention_refuses_are_refused_before_the_launch(
    window: int | None, lengths: list[int], message: str
) -> None:
    """``decode_attention``'s checks, made on the lengths before anything runs; a step
    that appends its queries' positions first needs none for the first."""
    lib = tessera.compile(_source(1, 2, 3, 7, 5, True, window=window), filename="a.tsr",
                          target="cpu").load()  # fmt: skip
    cache = KVCache.zeros(2, 1, 7, 5, window=window)
    cache.lengths[:] = lengths
    q = np.ones((2, 2, 3, 5), np.float32)
    with pytest.raises(ValueError, match=message):
        lib.attend(q, cache)
    cache.lengths[:] = [0, 1] if window is None else [1, 2]
    k = np.ones((2, 1, 3, 5), np.float32)
    out, _ = lib.step(q, k, k, cache)
    assert not np.isnan(out).any()


ERROR_SOURCE = """\
@kernel
def attend(q: {q}, cache: KVCache["B", 2, 64, 16, f32]) -> Tensor["B", 4, 1, 16, f32]:
    return flash_attention({args})
"""


@pytest.mark.parametrize(
    ("q", "args", "column", "message"),
    [
        ('Tensor["B", 4, 1, 12, f32]', "q, cache", 28,
         r"flash_attention: q must be \[B, H_q, n, D\] of the cache's \[B, 2, 64, 16\], not "
         r"\[B, 4, 1, 12\]"),
        ('Tensor["B", 5, 1, 16, f32]', "q, cache", 28,
         r"flash_attention: q's 5 heads are not a multiple of the cache's 2"),
        ('Tensor["B", 4, 1, 16, bf16]', "q, cache", 28,
         r"flash_attention: q is bf16 but the cache holds f32"),
        ('Tensor["B", 4, 1, 16, f32]', "q, cache, cache", 12,
         r"flash_attention over a KVCache takes the queries and the cache"),
        ('Tensor["B", 4, 1, 16, f32]', "q, cache, dropout=0.1", 46,
         r"flash_attention over a KVCache attends without dropout"),
        ('Tensor["B", 4, 1, 16, f32]', "cache, q", 12,
         r"flash_attention over a KVCache takes the queries and the cache"),
    ],
)  # fmt: skip
def test_a_call_that_does_not_fit_the_cache_is_an_error_at_its_line(
    q: str, args: str, column: int, message: str
) -> None:
    source = ERROR_SOURCE.format(q=q, args=args)
    with pytest.raises(tessera.CompileError) as caught:
        tessera.compile(source, filename="attend.tsr").ir("graph")
    (error,) = caught.value.diagnostics
    assert (error.span.line, error.span.column) == (3, column)
    assert re.search(message, error.message), error.message


def test_a_head_dim_known_at_run_time_takes_a_scale() -> None:
    source = ERROR_SOURCE.format(q='Tensor["B", 4, 1, "D", f32]', args="q, cache").replace(
        '64, 16, f32]', '64, "D", f32]').replace('1, 16, f32]:', '1, "D", f32]:')  # fmt: skip
    with pytest.raises(tessera.CompileError, match=r"the head dim D is a size, so give scale="):
        tessera.compile(source, filename="attend.tsr").ir("graph")
    tessera.compile(source.replace("q, cache)", "q, cache, scale=0.25)"),
                    filename="attend.tsr").ir("graph")  # fmt: skip


READ = """\
@kernel
def read(cache: KVCache["B", "H", 8, 5, f32], w: Tensor[5, 3, f32]
         ) -> (Tensor["B", "H", 8, 5, f32], Tensor["B", "H", 8, 5, f32],
               Tensor["B", "H", 8, 3, f32]):
    return cache.K * 2.0, cache.V, cache.V @ w
"""


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_the_caches_keys_and_values_read_as_tensors(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cache.K`` and ``cache.V`` in an elementwise op, returned, and in a product."""
    rng = np.random.default_rng(3)
    lib = load_everywhere(READ, target, arch, monkeypatch)
    cache = KVCache.zeros(2, 3, 8, 5)
    cache.K[...], cache.V[...] = (_random(rng, 2, 3, 8, 5) for _ in range(2))
    w = _random(rng, 5, 3)
    out = (_poisoned((2, 3, 8, 5), np.float32), _poisoned((2, 3, 8, 5), np.float32),
           _poisoned((2, 3, 8, 3), np.float32))  # fmt: skip
    doubled, values, product = lib.read(cache, w, out=out)
    np.testing.assert_array_equal(doubled, cache.K * 2)
    np.testing.assert_array_equal(values, cache.V)
    want = cache.V.astype(np.float64) @ w
    np.testing.assert_allclose(product, want, rtol=1e-5, atol=1e-5)
