"""Grouped-query attention with head counts that are sizes: ``q [B, H, S, D]``,
``k, v [B, G, S, D]``.

Query head ``h`` attends with key and value head ``h // (H / G)``; ``H % G == 0`` is a
guard, checked at each call. The numbers are checked against a float64 reference that
repeats each k and v head ``H / G`` times, at ``H = 8, G = 2`` and at ``G = 1``
(multi-query attention), with a sequence length that is not a multiple of the tile, on
the CPU, on OpenCL, and for CUDA (sm_80, sm_90a) and HIP on the simulated GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera

from .everywhere import EVERY_TARGET, load_everywhere
from .reference import attention

SOURCE = """\
@kernel
def gqa(q: Tensor["B", "H", "S", "D", f32], k: Tensor["B", "G", "S", "D", f32],
        v: Tensor["B", "G", "S", "D", f32]) -> Tensor["B", "H", "S", "D", f32]:
    return ops.flash_attention(q, k, v, causal=True)
"""


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_each_query_head_reads_its_groups_keys(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = load_everywhere(SOURCE, target, arch, monkeypatch)
    rng = np.random.default_rng(11)
    for heads, groups, length in [(8, 2, 37), (4, 1, 70)]:
        q = rng.standard_normal((2, heads, length, 24)).astype(np.float32)
        k, v = (rng.standard_normal((2, groups, length, 24)).astype(np.float32) for _ in "kv")
        out = np.full(q.shape, np.nan, np.float32)
        lib.gqa(q, k, v, out=out)
        repeat = heads // groups
        want = attention(q, np.repeat(k, repeat, axis=1), np.repeat(v, repeat, axis=1), True)
        assert not np.isnan(out).any(), "some outputs were never written"
        error = np.abs(out - want).max() / np.abs(want).max()
        assert error < 1e-5, f"H={heads} G={groups}: relative error {error:.2e}"


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET[:3])
def test_heads_that_groups_do_not_divide_are_refused_at_the_call(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = load_everywhere(SOURCE, target, arch, monkeypatch)
    q = np.ones((1, 6, 5, 8), np.float32)
    k = np.ones((1, 4, 5, 8), np.float32)
    with pytest.raises(
        ValueError,
        match=r"gqa\(\): H = 6 breaks H % G == 0 with G = 4 \(ops\.flash_attention: "
        r"grouped-query attention: q's heads are a multiple of k's and v's\)",
    ):
        lib.gqa(q, k, k)


def test_the_guard_is_in_the_graph() -> None:
    graph = tessera.compile(SOURCE, filename="gqa.tsr", target="cpu").inspect_ir("graph")
    assert "guard H % G == 0" in graph
    assert "reshape %q {shape = (B, G, H/G, S, D)}" in graph


def test_heads_known_to_differ_without_dividing_are_an_error() -> None:
    source = SOURCE.replace('"H"', "6").replace('"G"', "4")
    with pytest.raises(tessera.CompileError, match="6 heads are not a multiple of 4"):
        tessera.compile(source, filename="gqa.tsr", target="cpu")
