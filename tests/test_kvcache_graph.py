"""``cache.append(k, v)`` in a compiled graph function, on every target.

The compiled append writes into the caller's ``tessera.KVCache`` in place and hands
the same object back; the reference is the Python ``KVCache.append`` on a copy of the
cache, which must agree exactly (an append copies values, it computes nothing). The
caches are poisoned first: every slot no append writes holds a sentinel that must
survive, so a store into a wrong slot (or a wrong row's, or past a row's end) fails.
Batch rows hold different lengths, the head dims are ragged, and the rolling windows
wrap, several times over.
"""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.runtime.cpu import WARM_CALLS
from tessera.runtime.kvcache import KVCache

from .builds import assert_cpu_builds_warning_free, assert_gpu_builds_warning_free
from .everywhere import every_target_beyond, load_everywhere
from .test_cpu import COMPILERS
from .test_cuda import needs_gxx

#: An append of T positions, then another of the same keys and values swapped, so that
#: the second's slots follow the first's (the lengths the first left) within one call.
STEP = """\
@kernel
def step(cache: KVCache["B", "H", {s_max}, "D", {dtype}]{window},
         k: Tensor["B", "H", "T", "D", {dtype}], v: Tensor["B", "H", "T", "D", {dtype}]
         ) -> (Tensor["B", "H", "T", "D", {dtype}],
               KVCache["B", "H", {s_max}, "D", {dtype}]{window}):
    c = cache.append(k, v)
    return k * 2.0, c.append(v, k)
"""
SENTINEL = -7.0


def _source(s_max: int, window: int | None, dtype: str = "f32") -> str:
    ring = f" @rolling_window({window})" if window is not None else ""
    return STEP.format(s_max=s_max, window=ring, dtype=dtype)


def _poisoned(batch: int, heads: int, s_max: int, dim: int, lengths: list[int],
              window: int | None, dtype: object = np.float32) -> KVCache:  # fmt: skip
    cache = KVCache.zeros(batch, heads, s_max, dim, dtype, window=window)
    cache.K[...] = SENTINEL
    cache.V[...] = -SENTINEL
    cache.lengths[:] = lengths
    return cache


def _copy(cache: KVCache) -> KVCache:
    return KVCache(cache.K.copy(), cache.V.copy(), cache.lengths.copy(), window=cache.window)


def _run_steps(lib: object, cache: KVCache, steps: list[int], rng: np.random.Generator,
               dtype: object = np.float32) -> None:  # fmt: skip
    """Append ``steps`` positions at a time (each step two appends), against the Python
    cache's appends on a copy; the same cache object comes back every time."""
    want = _copy(cache)
    batch, heads, _, dim = cache.shape
    for rows in steps:
        k = rng.standard_normal((batch, heads, rows, dim)).astype(dtype)
        v = rng.standard_normal((batch, heads, rows, dim)).astype(dtype)
        doubled, returned = lib.step(cache, k, v)
        assert returned is cache, "the cache is donated: the call returns the object given"
        want.append(k, v).append(v, k)
        np.testing.assert_array_equal(doubled, (k.astype(np.float32) * 2).astype(dtype))
        assert cache.lengths.tolist() == want.lengths.tolist()
        np.testing.assert_array_equal(cache.K, want.K, err_msg=f"K after {rows} rows")
        np.testing.assert_array_equal(cache.V, want.V, err_msg=f"V after {rows} rows")


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), every_target_beyond("cpu", "opencl", "sm_80"))
def test_append_writes_the_callers_cache_in_place(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of different lengths, a ragged head dim, appends of several positions and of
    one; then a rolling window of 5 that wraps within an append and over many steps."""
    rng = np.random.default_rng(7)
    lib = load_everywhere(_source(23, None), target, arch, monkeypatch)
    cache = _poisoned(3, 2, 23, 13, [0, 5, 11], None)
    k_array = cache.K
    _run_steps(lib, cache, [3, 1, 2], rng)
    assert cache.K is k_array, "the arrays are written, not replaced"
    ring = load_everywhere(_source(7, 5), target, arch, monkeypatch)
    cache = _poisoned(2, 3, 7, 9, [0, 3], 5)
    _run_steps(ring, cache, [2, 1, 1, 2, 1], rng)
    assert cache.K[:, :, 5:].max() == SENTINEL, "slots past the window are never written"


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_append_into_a_half_precision_cache(dtype: str) -> None:
    numpy_dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}[dtype]
    lib = tessera.compile(_source(11, None, dtype), filename="step.tsr", target="cpu").load()
    cache = _poisoned(2, 1, 11, 6, [4, 1], None, numpy_dtype)
    _run_steps(lib, cache, [2, 1], np.random.default_rng(3), numpy_dtype)


@pytest.mark.execute
@needs_gxx
def test_appending_past_s_max_is_refused_before_anything_is_written() -> None:
    """The lengths' check runs in C on the call's fast path, which leaves a cache that
    does not fit to the full checks, and their message."""
    lib = tessera.compile(_source(8, None), filename="step.tsr", target="cpu").load()
    fits = np.ones((2, 1, 1, 3), np.float32)
    for _ in range(WARM_CALLS):  # the calls after which a library builds its fast paths
        lib.step(_poisoned(2, 1, 8, 3, [0, 0], None), fits, fits)
    assert lib.step._fast is not None
    cache = _poisoned(2, 1, 8, 3, [1, 5], None)
    before = _copy(cache)
    k = np.ones((2, 1, 2, 3), np.float32)
    message = (r"step\(\): row 1 of 'cache' holds 5 of S_max = 8 positions; 4 more do not "
               r"fit \(declare @rolling_window\(W\)")  # fmt: skip
    with pytest.raises(ValueError, match=message):
        lib.step(cache, k, k)
    for name in ("K", "V", "lengths"):
        np.testing.assert_array_equal(getattr(cache, name), getattr(before, name))


@pytest.mark.execute
@needs_gxx
@pytest.mark.parametrize(
    ("cache", "error", "message"),
    [
        (lambda: np.zeros((2, 1, 8, 3), np.float32), TypeError,
         r"'cache' must be a tessera.KVCache, not ndarray"),
        (lambda: KVCache.zeros(2, 1, 8, 3, window=4), ValueError,
         r"'cache' has window=4, and the function declares no @rolling_window"),
        (lambda: KVCache.zeros(2, 1, 9, 3), ValueError, r"'cache_k' has shape \(2, 1, 9, 3\)"),
        (lambda: KVCache.zeros(2, 1, 8, 3, np.float16), TypeError,
         r"'cache_k' is float16, the kernel takes f32"),
    ],
)  # fmt: skip
def test_a_wrong_cache_is_a_clear_error(cache: object, error: type, message: str) -> None:
    lib = tessera.compile(_source(8, None), filename="step.tsr", target="cpu").load()
    k = np.ones((2, 1, 1, 3), np.float32)
    with pytest.raises(error, match=message):
        lib.step(cache(), k, k)


def test_a_window_without_its_size_is_an_error_at_the_append() -> None:
    source = _source(8, None).replace("f32],\n", "f32] @rolling_window,\n", 1)
    with pytest.raises(tessera.CompileError) as caught:
        tessera.compile(source, filename="step.tsr").ir("graph")
    (error,) = caught.value.diagnostics
    assert (error.span.line, error.span.column) == (6, 22)
    assert re.search(r"give the window's size, @rolling_window\(W\)", error.message)


def test_appends_keep_their_order_as_two_launches_each() -> None:
    """Each append is a launch that writes the rows and one that grows the lengths after
    it (every program of the first reads them): four launches, in program order, with
    the elementwise kernel wherever fusion puts it."""
    tile = tessera.compile(_source(8, None), filename="step.tsr", target="cpu").ir("tile")
    (program,) = tile.programs
    states = [k.template for k in program.kernels if k.kind == "state"]
    assert states == ["kvcache_append", "kvcache_advance"] * 2


def test_an_append_into_a_cache_without_its_shape_is_an_error_at_the_append() -> None:
    source = (
        "@kernel\n"
        "def step(cache: KVCache, k: Tensor['B', 'H', 1, 'D', f32]) -> KVCache:\n"
        "    return cache.append(k, k)\n"
    )
    with pytest.raises(tessera.CompileError) as caught:
        assert tessera.compile(source, filename="step.tsr", target="cpu").source
    (error,) = caught.value.diagnostics
    assert (error.span.line, error.span.column) == (3, 25)
    assert "KVCache.append writes the cache's arrays, which need its shape" in error.message


@pytest.mark.execute
@needs_gxx
def test_a_call_of_a_function_of_an_optimizer_state_and_a_cache_is_refused() -> None:
    """Seed 004's signature takes both, and compiles; a Python call unpacks one kind of
    state object or the other, not both yet, and says so."""
    source = (
        "@kernel\n"
        "def step(w: Tensor['N', f32], state: OptimizerState[w],\n"
        "         cache: KVCache['B', 'H', 8, 'D', f32]) -> Tensor['N', f32]:\n"
        "    return w * 2.0\n"
    )
    lib = tessera.compile(source, filename="step.tsr", target="cpu").load()
    w = np.ones(4, np.float32)
    with pytest.raises(TypeError, match=r"step\(\) takes an OptimizerState and a KVCache"):
        lib.step(w, tessera.OptimizerState.init(w), KVCache.zeros(1, 1, 8, 2))


#: ``cache.lengths`` before and after an append in one call, and read as positions.
LENGTHS = """\
@kernel
def positions(x: Tensor["B", "D", f32], k: Tensor["B", "H", "T", "D", f32],
              cache: KVCache["B", "H", {s_max}, "D", f32], angles: Tensor[{s_max}, "D", f32]
              ) -> (Tensor["B", "D", f32], Tensor["B", i32], KVCache["B", "H", {s_max}, "D", f32]):
    before = cache.lengths
    cache = cache.append(k, k)
    return x * take(angles, cache.lengths - 1, axis=0), before * 1000 + cache.lengths, cache
"""


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), every_target_beyond("cpu", "opencl", "sm_80"))
def test_lengths_read_as_i32_in_program_order(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cache.lengths`` is each row's length as the launches before it left it: the
    append's own launches grow it between the two reads. The rows read as positions
    pick the angles of each row's last position."""
    rng = np.random.default_rng(11)
    lib = load_everywhere(LENGTHS.format(s_max=19), target, arch, monkeypatch)
    cache = _poisoned(3, 2, 19, 5, [0, 4, 15], None)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    k = rng.standard_normal((3, 2, 3, 5)).astype(np.float32)
    angles = rng.standard_normal((19, 5)).astype(np.float32)
    out = (np.full((3, 5), np.nan, np.float32), np.full(3, -1, np.int32))
    scaled, lengths, returned = lib.positions(x, k, cache, angles, out=out)
    assert returned is cache
    np.testing.assert_array_equal(lengths, [0 * 1000 + 3, 4 * 1000 + 7, 15 * 1000 + 18])
    np.testing.assert_array_equal(cache.lengths, [3, 7, 18])
    np.testing.assert_allclose(scaled, x * angles[[2, 6, 17]], rtol=1e-6)


@pytest.mark.parametrize(
    "body",
    [
        "    new = cache.append(k, k)\n    return cache.lengths, new\n",
        "    new = cache.append(k, k)\n    return cache.K[:, 0, 0, 0:1, 0] * 0 + 1, new\n",
        "    new = cache.append(k, k)\n    return new.lengths, cache.append(k, k)\n",
    ],
    ids=["lengths", "K", "append"],
)  # fmt: skip
def test_a_cache_read_after_an_append_wrote_it_is_an_error(body: str) -> None:
    """An append writes the cache's arrays in place, so the cache it was holds the new
    positions too: reading it as the old one would give the new values. The error says
    to use the cache the append returned."""
    source = (
        "@kernel\n"
        "def f(k: Tensor['B', 2, 3, 4, f32], cache: KVCache['B', 2, 16, 4, f32]\n"
        "      ) -> (Tensor['B', i32], KVCache['B', 2, 16, 4, f32]):\n" + body
    )
    with pytest.raises(tessera.CompileError) as caught:
        tessera.compile(source, filename="f.tsr", target="cpu").ir("graph")
    (error,) = caught.value.diagnostics
    assert error.span.line == 5, error
    assert (
        "'cache' was appended to at line 4, which writes the cache's arrays in place: use "
        "the cache that append returned"
    ) in error.message, error.message


@pytest.mark.compile
@pytest.mark.parametrize("compiler", COMPILERS)
def test_lengths_compile_warning_free_on_the_cpu(compiler: str, tmp_path: Path) -> None:
    assert_cpu_builds_warning_free(LENGTHS.format(s_max=19), "lengths.tsr", compiler, tmp_path)


@pytest.mark.compile
@pytest.mark.parametrize(("target", "arch"), [("cuda", "sm_80"), ("hip", "gfx90a")])
def test_lengths_compile_warning_free_on_the_gpus(target: str, arch: str, tmp_path: Path) -> None:
    """nvcc and hipcc, every warning an error."""
    assert_gpu_builds_warning_free(LENGTHS.format(s_max=19), "lengths.tsr", target, arch, tmp_path)
