"""The key/value cache (``tessera.runtime.kvcache``) and decode attention over it.

The reference keeps its own history of every key and value appended, in float64, and
attends query position ``p`` to positions ``0..p`` (``p - W + 1 .. p`` with a window of
``W``), so it checks the cache's slots, lengths and ring as well as the kernels. Rows of
one batch hold different lengths; the head dim (40) and the lengths are not multiples
of any tile; some splits see no key at all. The kernels' outputs are poisoned by
``decode_attention``. The numbers also pin a CPU backend fix: a comparison of ``l[:, None]``
was written over ``l`` itself while the division after it still read ``l``.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.runtime.kvcache import (
    KVCache,
    decode_attention,
    decode_block,
    decode_library,
    decode_source,
)

from .everywhere import EVERY_TARGET, load_everywhere
from .test_cuda import needs_gxx


class History:
    """Every position appended to each batch row, in float64: the reference's cache."""

    def __init__(self, batch: int) -> None:
        self.k: list[list[np.ndarray]] = [[] for _ in range(batch)]
        self.v: list[list[np.ndarray]] = [[] for _ in range(batch)]

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        for b in range(len(self.k)):
            self.k[b] += list(np.moveaxis(k[b], 1, 0).astype(np.float64))
            self.v[b] += list(np.moveaxis(v[b], 1, 0).astype(np.float64))

    def attention(self, q: np.ndarray, causal: bool, window: int | None) -> np.ndarray:
        batch, q_heads, rows, dim = q.shape
        out = np.zeros(q.shape)
        for b in range(batch):
            keys, values = np.stack(self.k[b]), np.stack(self.v[b])  # [S, H, D]
            group = q_heads // keys.shape[1]
            for i in range(rows):
                last = len(keys) - rows + i if causal else len(keys) - 1
                first = 0 if window is None else max(0, last - window + 1)
                for h in range(q_heads):
                    k, v = keys[first : last + 1, h // group], values[first : last + 1, h // group]
                    s = k @ q[b, h, i].astype(np.float64) / np.sqrt(dim)
                    p = np.exp(s - s.max())
                    out[b, h, i] = p @ v / p.sum()
        return out


def _random(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert not np.isnan(got).any(), f"{what}: some outputs were never written"
    error = np.abs(got - want).max() / np.abs(want).max()
    assert error < 1e-5, f"{what}: relative error {error:.2e}"


def _ragged(rng: np.random.Generator, lengths: list[int], heads: int, s_max: int, dim: int):
    """A cache whose batch rows hold ``lengths`` positions, and its history."""
    cache = KVCache.zeros(len(lengths), heads, s_max, dim)
    history = History(len(lengths))
    for b, length in enumerate(lengths):
        k, v = _random(rng, heads, length, dim), _random(rng, heads, length, dim)
        cache.K[b, :, :length], cache.V[b, :, :length] = k, v
        history.k[b] += list(np.moveaxis(k, 1, 0).astype(np.float64))
        history.v[b] += list(np.moveaxis(v, 1, 0).astype(np.float64))
    cache.lengths[:] = lengths
    return cache, history


#: (lengths, S_max, head dim, (query rows, causal, splits) of each step, window steps).
FULL = ([37, 300], 600, 40, [(1, True, None), (5, True, 4), (3, False, 2), (1, True, 1)],
        [20, 1, 1, 1, 1, 1, 1, 1])  # fmt: skip
#: The same kinds of step, fewer and smaller, for the simulated GPUs (seconds a call).
SMALL = ([5, 70], 96, 24, [(3, True, 2)], [24, 1])


def _decode_cases(library: object, case: tuple = FULL) -> None:
    """Ragged rows, grouped heads, prefill and decode steps, several splits (some of
    which see no key), and a rolling window that wraps, against the float64 history."""
    rng = np.random.default_rng(39)
    lengths, s_max, dim, steps, window_steps = case
    heads, group = 2, 3
    cache, history = _ragged(rng, lengths, heads, s_max, dim)
    for rows, causal, splits in steps:
        k, v = _random(rng, 2, heads, rows, dim), _random(rng, 2, heads, rows, dim)
        cache.append(k, v)
        history.append(k, v)
        q = _random(rng, 2, heads * group, rows, dim)
        got = decode_attention(q, cache, causal=causal, splits=splits, library=library)
        _check(got, history.attention(q, causal, None), f"rows={rows} splits={splits}")
    window = 24
    ring = KVCache.zeros(1, 1, 32, 8, window=window)
    history = History(1)
    for rows in window_steps:  # the window of 24 wraps at the 25th position
        k, v = _random(rng, 1, 1, rows, 8), _random(rng, 1, 1, rows, 8)
        ring.append(k, v)
        history.append(k, v)
        q = _random(rng, 1, 2, rows, 8)
        got = decode_attention(q, ring, library=library)
        _check(got, history.attention(q, True, window), f"window, length {ring.lengths[0]}")


@pytest.mark.execute
@needs_gxx
def test_decode_attention_on_the_cpu() -> None:
    _decode_cases(decode_library("cpu", "f32"))


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize("block", [(16, 128), (32, 128)])
def test_decode_attention_in_the_cpu_blocks_for_few_query_rows(block: tuple[int, int]) -> None:
    """The blocks ``decode_attention`` picks on the CPU for a step's few query rows: the
    cases' 3 to 15 rows a key head leave most of a block's rows padding, which the
    kernel skips, and 128 keys a block leave the splits of 150 and 300 keys ragged."""
    _decode_cases(decode_library("cpu", "f32", block))


def test_decode_picks_the_smallest_cpu_block_that_holds_the_query_rows() -> None:
    assert decode_block("cpu", 4) == (16, 128)
    assert decode_block("cpu", 16) == (16, 128)
    assert decode_block("cpu", 17) == (32, 128)
    assert decode_block("cpu", 64) == (64, 128)
    assert decode_block("cpu", 65) is None  # prefill: the attention heuristic's blocks
    assert decode_block("opencl", 4) is None


#: OpenCL in the default tier; CUDA (sm_80, sm_90a) and HIP on the simulated GPU in the
#: exhaustive one (each simulated call takes seconds).
TARGETS = [
    EVERY_TARGET[1],
    *(pytest.param(*p.values, marks=[*p.marks, pytest.mark.exhaustive], id=p.id)
      for p in EVERY_TARGET[2:5]),
]  # fmt: skip


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), TARGETS)
def test_decode_attention_on_every_target(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    library = load_everywhere(decode_source("f32"), target, arch, monkeypatch)
    _decode_cases(library, FULL if target == "opencl" else SMALL)


def test_append_writes_in_place_and_wraps_a_window() -> None:
    cache = KVCache.zeros(2, 1, 6, 2, window=4)
    K, V = cache.K, cache.V
    for step in range(6):
        value = np.full((2, 1, 1, 2), step + 1, np.float32)
        assert cache.append(value, -value) is cache
    assert cache.K is K and cache.V is V, "the arrays are donated, not replaced"
    assert cache.lengths.tolist() == [6, 6]
    # positions 2..5 in slots 2, 3, 0, 1; slots 4 and 5 lie past the window, untouched
    assert cache.K[0, 0, :, 0].tolist() == [5, 6, 3, 4, 0, 0]
    assert cache.V[1, 0, :, 1].tolist() == [-5, -6, -3, -4, 0, 0]


def test_appending_past_s_max_is_refused_before_any_write() -> None:
    cache = KVCache.zeros(2, 1, 4, 2)
    cache.lengths[:] = [1, 3]
    k = np.ones((2, 1, 2, 2), np.float32)
    with pytest.raises(ValueError, match=r"row 1 holds 3 of S_max = 4 positions; 2 more do not"):
        cache.append(k, k)
    assert not cache.K.any() and cache.lengths.tolist() == [1, 3]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.append(np.ones((2, 2, 1, 3), np.float32), np.ones((2, 2, 1, 3))),
         r"k must be \[B, H, n, D\] = \[2, 1, n, 3\], not \[2, 2, 1, 3\] float32"),
        (lambda c: c.append(np.ones((2, 1, 1, 3), np.float32), np.ones((2, 1, 2, 3))),
         r"k and v differ"),
        (lambda c: KVCache(c.K, c.V[:, :, :2], c.lengths), r"V must have K's shape"),
        (lambda c: KVCache(c.K, c.V, c.lengths.astype(np.int32)), r"lengths must be an int64"),
        (lambda c: KVCache(c.K, c.V, np.array([0, 9])), r"lengths\[1\] = 9 is outside \[0, 8\]"),
        (lambda c: KVCache(c.K.astype(np.float64), c.V.astype(np.float64), c.lengths),
         r"dtype must be one of float32, float16, bfloat16"),
        (lambda c: decode_attention(np.ones((2, 2, 1, 3), np.float32), c),
         r"row 0 of the cache holds 0 positions, fewer than the 1 queries"),
        (lambda c: decode_attention(np.ones((2, 1, 1, 4), np.float32), c),
         r"q must be \[B, H_q, n, D\] = \[2, H_q, n, 3\]"),
        (lambda c: decode_attention(np.ones((2, 1, 1, 3), np.float16), c),
         r"q is float16 but the cache is float32"),
        (lambda c: decode_attention(np.ones((2, 1, 1, 3), np.float32), c, splits=3),
         r"splits = 3 must divide S_max = 8"),
    ],
)  # fmt: skip
def test_bad_input_is_a_clear_error(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(KVCache.zeros(2, 1, 8, 3))


def test_a_wrapped_window_takes_one_causal_query_row() -> None:
    cache = KVCache.zeros(1, 1, 4, 2, window=4)
    cache.lengths[:] = 5
    q = np.ones((1, 1, 2, 2), np.float32)
    with pytest.raises(ValueError, match=r"has wrapped its window of 4; causal attention"):
        decode_attention(q, cache)


APPEND = """\
@kernel
def step(cache: KVCache["B", "H", 16, "D", f32]{window}, k: Tensor["B", {heads}, {n}, "D", f32],
         v: Tensor["B", "H", {n}, "D", {dtype}]) -> KVCache["B", "H", 16, "D", f32]{window}:
    return cache.append(k, v)
"""


@pytest.mark.parametrize(
    ("edit", "column", "message"),
    [
        ({"n": 17}, 25, r"17 positions never fit a cache of S_max = 16; declare @rolling_window"),
        ({"n": 9, "window": " @rolling_window(8)"}, 25,
         r"9 positions never fit the cache's window of 8"),
        ({"heads": 2}, 25, r"k must be \[B, H, n, D\] of the cache's \[B, H, 16, D\], not "
         r"\[B, 2, 1, D\]"),
        ({"dtype": "bf16"}, 28, r"v is bf16 but the cache holds f32"),
    ],
)  # fmt: skip
def test_an_append_that_cannot_fit_is_an_error_at_its_line(
    edit: dict, column: int, message: str
) -> None:
    fields = {"window": "", "heads": '"H"', "n": 1, "dtype": "f32", **edit}
    with pytest.raises(tessera.CompileError) as caught:
        tessera.compile(APPEND.format(**fields), filename="step.tsr").ir("graph")
    (error,) = [d for d in caught.value.diagnostics if d.severity.name == "ERROR"]
    assert (error.span.line, error.span.column) == (4, column)
    assert error.message.startswith("KVCache.append: ")
    assert re.search(message, error.message), error.message


@pytest.mark.execute
@pytest.mark.exhaustive
@needs_gxx
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_half_precision_cache(dtype: str) -> None:
    """The kernel instantiated for a bf16 or f16 cache: scores and sums in f32, the
    weights rounded to the cache's dtype before they multiply V, as flash_attention's
    are; the result in the cache's dtype."""
    numpy_dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}[dtype]
    rng = np.random.default_rng(5)
    cache = KVCache.zeros(2, 2, 96, 40, numpy_dtype)
    history = History(2)
    k = rng.standard_normal((2, 2, 37, 40)).astype(numpy_dtype)
    v = rng.standard_normal((2, 2, 37, 40)).astype(numpy_dtype)
    cache.append(k, v)
    history.append(k, v)
    q = rng.standard_normal((2, 6, 3, 40)).astype(numpy_dtype)
    got = decode_attention(q, cache, splits=2, library=decode_library("cpu", dtype))
    assert got.dtype == numpy_dtype
    want = history.attention(q, True, None)
    error = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
    assert error < (1e-2 if dtype == "bf16" else 2e-3), f"{dtype}: relative error {error:.2e}"
