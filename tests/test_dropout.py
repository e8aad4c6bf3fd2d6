"""Dropout's mask: Philox4x32-10 of each element's row-major position under the seed.

The reference generator is checked against Random123's known answers; the tile
interpreter and the CPU backend draw its masks exactly (every other backend is checked
against it in ``test_library_kernels``); and the masks behave as masks should: about
``p`` of the elements dropped, the rest scaled by ``1/(1-p)``, another seed another mask.
"""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest

import tessera
from tessera.transpiler.tile.interpret import run_function

from .reference import dropout, philox4x32

SOURCE = """\
@kernel
def dropped(x: Tensor["B", "R", "C", f32], p: float, seed: int) -> Tensor["B", "R", "C", f32]:
    return dropout(x, p, seed=seed)
"""


@pytest.mark.parametrize(
    "counter, key, block",
    [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((2**32 - 1,) * 4, (2**32 - 1,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_the_reference_generator_gives_random123s_known_answers(
    counter: tuple[int, int, int, int], key: tuple[int, int], block: tuple[int, ...]
) -> None:
    assert philox4x32(counter, key) == block


def test_the_interpreter_draws_the_reference_mask() -> None:
    program = tessera.compile(SOURCE, "dropout.tsr", target="cpu")
    x = np.random.default_rng(1).standard_normal((2, 37, 75), dtype=np.float32)
    out = run_function(program.ir("tile"), "dropped", {"x": x, "p": 0.3, "seed": 77})["out"]
    np.testing.assert_array_equal(out, dropout(x, 0.3, 77))


@pytest.fixture(scope="module")
def dropped(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield tessera.compile(SOURCE, "dropout.tsr", target="cpu").load().dropped


@pytest.mark.execute
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_about_p_of_the_elements_are_dropped_and_the_rest_scaled(dropped: Any, p: float) -> None:
    x = np.random.default_rng(2).uniform(1.0, 2.0, (4, 300, 500)).astype(np.float32)
    out = dropped(x, p, 2024)
    kept = out != 0
    n = x.size
    assert abs((n - kept.sum()) / n - p) < 5 * np.sqrt(p * (1 - p) / n)  # five sigmas
    scale = np.float32(1.0) / (np.float32(1.0) - np.float32(p))
    np.testing.assert_array_equal(out[kept], x[kept] * scale)
    # neighbours are independent: as often both kept as chance says
    both = (kept[..., 1:] & kept[..., :-1]).mean()
    assert abs(both - (1 - p) ** 2) < 5 * np.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / n)


@pytest.mark.execute
def test_another_seed_draws_another_mask_and_the_same_seed_the_same(dropped: Any) -> None:
    x = np.random.default_rng(3).uniform(1.0, 2.0, (2, 64, 100)).astype(np.float32)
    first, again = dropped(x, 0.5, 1), dropped(x, 0.5, 1)
    np.testing.assert_array_equal(first, again)
    for seed in (2, 2**32 + 1, -1):
        agree = ((dropped(x, 0.5, seed) != 0) == (first != 0)).mean()
        assert 0.45 < agree < 0.55  # independent masks agree half the time
