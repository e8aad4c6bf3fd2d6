"""``examples/decode.tsr``: a two-layer Llama-style model decoding with a KV cache.

The example is compiled once for the CPU; each layer keeps its own ``KVCache``. The
prompt (5 positions) goes through one prefill step, then 4 tokens one at a time, with
a cache that holds every position and with a rolling window of 6 that wraps on the 7th
position. A float64 numpy model of the same layers, with its own history of keys and
values (every position, attended through a sliding window where the cache has one),
is the reference for the hidden states after every step. Each step runs three ways:
the compiled ``step`` (``step_windowed``), the whole layer in one call; the compiled
``project`` (``project_windowed``), which appends to the cache itself, then
``tessera.decode_attention`` and ``finish``; and the Python-glued ``qkv`` then
``KVCache.append``. The three caches must agree exactly, and both layers' outputs
with the reference.
(The example's golden files and the toolchain sweeps over ``examples/`` compile it
for every target; tests/test_kvcache_graph.py runs the compiled append on each.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

import tessera
from tessera.runtime.kvcache import KVCache, decode_attention

from .conftest import ROOT
from .reference import rmsnorm, rotary
from .test_cuda import needs_gxx

# Two layers through prefill and decode steps, compiled once: the exhaustive tier's
# (make test-exhaustive); tests/test_kvcache.py checks the cache and the kernel in make test.
pytestmark = [pytest.mark.execute, pytest.mark.exhaustive, needs_gxx]

BATCH, WIDTH, HEADS, KV_HEADS, DIM, HIDDEN = 2, 256, 4, 2, 64, 512
EPS = 1e-5


@dataclass
class Layer:
    """One decoder layer's weights, f32, scaled by their fan-in."""

    rng: np.random.Generator
    weights: dict[str, np.ndarray] = field(init=False)

    def __post_init__(self) -> None:
        shapes = {"wq": (WIDTH, WIDTH), "wk": (WIDTH, KV_HEADS * DIM),
                  "wv": (WIDTH, KV_HEADS * DIM), "wo": (WIDTH, WIDTH), "wg": (WIDTH, HIDDEN),
                  "wu": (WIDTH, HIDDEN), "wd": (HIDDEN, WIDTH)}  # fmt: skip
        self.weights = {k: (self.rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
                        for k, s in shapes.items()}  # fmt: skip
        for name in ("norm1", "norm2"):
            self.weights[name] = (1 + 0.1 * self.rng.standard_normal(WIDTH)).astype(np.float32)


def _angles(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``[T, 32]`` of the rotary embedding at ``positions``."""
    angle = positions[:, None] * 10000.0 ** (-np.arange(DIM // 2) / (DIM // 2))
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """``[B, T, heads * 64]`` as ``[B, heads, T, 64]``."""
    return x.reshape(x.shape[0], x.shape[1], heads, DIM).transpose(0, 2, 1, 3)


class Reference:
    """The layer in float64, with every key and value it has seen."""

    def __init__(self, layer: Layer, window: int | None) -> None:
        self.w = {k: v.astype(np.float64) for k, v in layer.weights.items()}
        self.window = window
        self.k = np.zeros((BATCH, KV_HEADS, 0, DIM))
        self.v = np.zeros((BATCH, KV_HEADS, 0, DIM))

    def __call__(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        w = self.w
        h = rmsnorm(x, w["norm1"], EPS)
        q = rotary(_heads(h @ w["wq"], HEADS), cos, sin)
        self.k = np.concatenate((self.k, rotary(_heads(h @ w["wk"], KV_HEADS), cos, sin)), 2)
        self.v = np.concatenate((self.v, _heads(h @ w["wv"], KV_HEADS)), 2)
        rows, length = x.shape[1], self.k.shape[2]
        o = np.zeros(q.shape)
        for i in range(rows):
            last = length - rows + i
            first = 0 if self.window is None else max(0, last - self.window + 1)
            k = np.repeat(self.k[:, :, first : last + 1], HEADS // KV_HEADS, axis=1)
            v = np.repeat(self.v[:, :, first : last + 1], HEADS // KV_HEADS, axis=1)
            s = np.einsum("bhd,bhsd->bhs", q[:, :, i], k) / np.sqrt(DIM)
            p = np.exp(s - s.max(-1, keepdims=True))
            o[:, :, i] = np.einsum("bhs,bhsd->bhd", p / p.sum(-1, keepdims=True), v)
        x = x + o.transpose(0, 2, 1, 3).reshape(x.shape) @ w["wo"]
        h = rmsnorm(x, w["norm2"], EPS)
        gate = h @ w["wg"]
        return x + (gate / (1 + np.exp(-gate)) * (h @ w["wu"])) @ w["wd"]


@pytest.fixture(scope="module")
def lib() -> object:
    return tessera.compile_file(ROOT / "examples/decode.tsr", target="cpu").load()


@pytest.mark.parametrize(("s_max", "window", "splits"), [(16, None, 2), (6, 6, None)])
def test_prefill_then_decode_matches_numpy(
    lib: object, s_max: int, window: int | None, splits: int | None
) -> None:
    rng = np.random.default_rng(4)
    layers = [Layer(rng) for _ in range(2)]
    caches = [KVCache.zeros(BATCH, KV_HEADS, s_max, DIM, window=window) for _ in layers]
    glued = [KVCache.zeros(BATCH, KV_HEADS, s_max, DIM, window=window) for _ in layers]
    stepped = [KVCache.zeros(BATCH, KV_HEADS, s_max, DIM, window=window) for _ in layers]
    references = [Reference(layer, window) for layer in layers]
    project = lib.project if window is None else lib.project_windowed
    step = lib.step if window is None else lib.step_windowed
    position = 0
    for rows in [5, 1, 1, 1, 1]:  # the prompt, then one token at a time
        x = rng.standard_normal((BATCH, rows, WIDTH)).astype(np.float32)
        y = x.copy()  # the hidden states through the compiled steps
        cos, sin = _angles(np.arange(position, position + rows))
        want = x.astype(np.float64)
        for layer, cache, other, whole, reference in zip(
            layers, caches, glued, stepped, references, strict=True
        ):
            w = layer.weights
            weights = (w["norm1"], w["wq"], w["wk"], w["wv"], cos, sin)
            after = (w["wo"], w["norm2"], w["wg"], w["wu"], w["wd"])
            q, returned = project(x, *weights, cache)
            assert returned is cache
            _, k, v = lib.qkv(x, *weights)  # the same step glued from Python
            other.append(k, v)
            out = np.full(y.shape, np.nan, np.float32)
            y, returned = step(y, *weights, *after, whole, out=out)
            assert returned is whole
            for name in ("K", "V", "lengths"):
                np.testing.assert_array_equal(getattr(cache, name), getattr(other, name))
            o = decode_attention(q, cache, splits=splits)
            x = lib.finish(x, o, *after)
            want = reference(want, cos, sin)
        position += rows
        for got, how in ((x, "glued"), (y, "step")):
            assert not np.isnan(got).any(), f"position {position}, {how}: outputs left unwritten"
            error = np.abs(got - want).max() / np.abs(want).max()
            assert error < 1e-4, f"position {position}, {how}: relative error {error:.2e}"
    assert caches[0].lengths.tolist() == [position] * BATCH
    assert stepped[1].lengths.tolist() == [position] * BATCH
