"""``tile.concat`` whose later piece is a tile held in registers (a product's
accumulator): each element of that piece sits in the thread that computed it, at a
column the concat shifts, so no thread holds what it must write. The SIMT backends
refuse such a kernel with a message, rather than write the thread's own element (which
gave wrong values); the CPU computes it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tessera

from .everywhere import EVERY_TARGET, load_everywhere

pytestmark = pytest.mark.execute

SOURCE = """\
@kernel
def joined(a: Tensor["M", "K", f32], b: Tensor["K", 16, f32]) -> Tensor["M", 17, f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(a.shape[-1], T.k):
        acc += tile.dot(tile.load(a, rows=T.m, cols=kb), tile.load(b, kb, cols=T.n))
    return tile.concat((tile.sum(acc, axis=1)[:, None], acc), axis=1)
"""


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_a_register_tile_after_the_first_piece_is_right_or_refused(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((37, 20)).astype(np.float32)
    b = rng.standard_normal((20, 16)).astype(np.float32)
    product = a.astype(np.float64) @ b
    want = np.concatenate([product.sum(1, keepdims=True), product], axis=1)
    if target != "cpu":
        with pytest.raises(tessera.StageNotImplemented, match="does not lower this tile kernel"):
            load_everywhere(SOURCE, target, arch, monkeypatch)
        return
    lib: Any = load_everywhere(SOURCE, target, arch, monkeypatch)
    poison = np.full(want.shape, np.nan, np.float32)
    np.testing.assert_allclose(lib.joined(a, b, out=poison), want, rtol=1e-5, atol=1e-5)
