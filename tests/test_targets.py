"""One program, one result, on every target and under every schedule.

The schedule picks tile sizes per target: the CPU's row block is not OpenCL's, and a
head-dim tile is as wide as the widest head it serves (128 for a run-time ``D``). A
result must not follow them. Seed 004's FlashAttention scales its scores by
``tile.rsqrt(float(T.d))``: that read the tile's width, so a head dim of 64 under a
128-wide tile gave softmax(s / sqrt(128)) on the CPU and the simulated GPUs, and, where
``-D D=64`` made the tile 64 wide, the right answer. ``T.d`` read as a number is now the
head dim its tile spans, and the sizes the schedule picks outright (``T.m``, ``T.n``,
``T.k``, ``T.vector``) cannot be read as numbers at all (``tests/errors``).

Every example and library function has a reference case (``tests/reference.py``) that
``test_cpu``, ``test_opencl``, ``test_cuda`` and ``test_hip`` run on each target with
the same random inputs against the same float64 reference: the first test here keeps
that list whole.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from .conftest import ROOT, SOURCES
from .everywhere import EVERY_TARGET, every_target_beyond, load_everywhere
from .reference import CASES, attention, f64

#: Seed 004's FlashAttention, in f32, as the seed writes its scale.
SEED_ATTENTION = """\
@kernel
def flash_attention(q: Tensor["BH", "S", "D", f32], k: Tensor["BH", "S", "D", f32],
                    v: Tensor["BH", "S", "D", f32], *, causal: bool) -> Tensor["BH", "S", "D", f32]:
    T = tile.context()
    Qb = tile.load(q, rows=T.m, cols=T.d)
    acc = tile.zeros((T.m, T.d), f32)
    m = tile.full((T.m,), -INF)
    l = tile.zeros((T.m,), f32)
    for nblk in tile.range_n(k.shape, T.n, prefetch=2):
        Kb = tile.load(k, nblk, cols=T.d)
        Vb = tile.load(v, nblk, cols=T.d)
        S = tile.dot(Qb, tile.transpose(Kb)) * tile.rsqrt(float(T.d))
        if causal:
            tile.mask_causal(S, tile.row_index(), tile.col_index(nblk))
        P, m_c, l_c = tile.softmax_online(S)
        acc, m, l = tile.softmax_accumulate(acc, m, l, P, Vb, m_c, l_c)
    return acc / l[:, None]
"""

#: Reductions over every axis, as numpy's are without ``axis`` (which warns, here in
#: ``total``), at ragged sizes.
EVERY_AXIS = """\
@kernel
def total(x: Tensor["B", "R", "C", f32]) -> Tensor[f32]:
    return sum(x)

@kernel
def spread(x: Tensor["R", "C", f32]) -> Tensor[f32]:
    return x.max(axis=None) - min(x, axis=None)

@kernel
def centered(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return x - mean(x, axis=None, keepdims=True)
"""


def _functions(path: str) -> list[str]:
    return re.findall(r"^def (\w+)\(", (ROOT / path).read_text(encoding="utf-8"), re.M)


#: Functions checked against numpy or PyTorch on every target by a test of their own
#: rather than by a reference case here.
CHECKED_ELSEWHERE = {
    ("examples/quant_linear.tsr", name): "tests/test_quant.py"
    for name in ("quantize_weights", "w8a16", "linear_per_group", "w8a8")
} | {
    ("examples/quant_linear.tsr", "quantize_i4"): "tests/test_quant_i4.py",
    ("examples/quant_linear.tsr", "w4a16"): "tests/test_quant_i4.py",
    ("examples/train_mlp.tsr", "loss"): "examples/train_mlp.py (make demo)",
    ("examples/train_mlp.tsr", "train_step"): "examples/train_mlp.py (make demo)",
    ("tessera/stdlib/put_along_axis.tsr", "put_along_axis"): "tests/test_scatter.py",
    # its two parts depend on the schedule's K blocks; their join is checked exactly
    ("tessera/stdlib/gemm_i8.tsr", "gemm_i8"): "tests/test_int8_matmul.py",
    ("tessera/stdlib/decode_attention.tsr", "decode_attention"): "tests/test_kvcache.py",
    ("tessera/stdlib/decode_partial.tsr", "decode_partial"): "tests/test_kvcache_attention.py",
    (
        "tessera/stdlib/decode_partial_lse.tsr",
        "decode_partial_lse",
    ): "tests/test_kvcache_attention.py",
    ("examples/decode.tsr", "project"): "tests/test_decode_example.py",
    ("examples/decode.tsr", "project_windowed"): "tests/test_decode_example.py",
    ("examples/decode.tsr", "qkv"): "tests/test_decode_example.py",
    ("examples/optimizer_step.tsr", "adamw"): "tests/test_multi_result.py",
    ("examples/optimizer_step.tsr", "adamw_bf16"): "tests/test_multi_result.py",
    ("examples/decode.tsr", "finish"): "tests/test_decode_example.py",
    ("examples/decode.tsr", "step"): "tests/test_decode_example.py",
    ("examples/decode.tsr", "step_windowed"): "tests/test_decode_example.py",
    ("tessera/stdlib/scatter_add.tsr", "scatter_add"): "tests/test_scatter.py",
}


def test_every_example_and_library_function_has_a_reference_case() -> None:
    covered = {(case.path, case.function) for case in CASES} | set(CHECKED_ELSEWHERE)
    missing = [f"{path}:{name}" for path in SOURCES for name in _functions(path)
               if (path, name) not in covered]  # fmt: skip
    assert not missing, f"functions that no target runs against a reference: {missing}"


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
@pytest.mark.parametrize(("head", "fixed"), [(64, False), (64, True), (40, False)],
                         ids=["D=64", "-D D=64", "D=40"])  # fmt: skip
def test_the_seeds_head_dim_scale_is_the_head_dims(
    target: str, arch: str | None, head: int, fixed: bool, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    """``tile.rsqrt(float(T.d))`` is ``1/sqrt(D)`` whatever width the schedule gives the
    head-dim tile: a run-time D of 64 and of 40 (ragged) under a 128-wide tile, and D
    fixed to the tile's width."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    lib = load_everywhere(SEED_ATTENTION, target, arch, monkeypatch, {"D": head} if fixed else None)
    rng = np.random.default_rng(head)
    q, k, v = (rng.standard_normal((3, 37, head)).astype(np.float32) for _ in range(3))
    out = np.full(q.shape, np.nan, np.float32)
    lib.flash_attention(q, k, v, causal=True, out=out)
    want = attention(q, k, v, causal=True)
    assert not np.isnan(out).any(), "some outputs were never written"
    error = np.abs(f64(out) - want).max() / np.abs(want).max()
    assert error < 1e-5, f"relative error {error:.2e}"


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_reductions_without_an_axis_reduce_every_axis(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``sum(x)``, ``max(x)``, ``min(x)`` and ``mean(x)`` as numpy computes them: to a 0-d
    result, or one of shape ``[1, 1]`` broadcast back with ``keepdims``."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    lib = load_everywhere(EVERY_AXIS, target, arch, monkeypatch)
    rng = np.random.default_rng(7)
    x3, x = rng.standard_normal((3, 37, 50)), rng.standard_normal((37, 50))
    for name, arg, want in (
        ("total", x3, f64(x3.astype(np.float32)).sum()),
        ("spread", x, np.float32(x.max()) - np.float32(x.min())),
        ("centered", x, f64(x.astype(np.float32)) - f64(x.astype(np.float32)).mean()),
    ):
        out = np.full(np.shape(want), np.nan, np.float32)
        getattr(lib, name)(arg.astype(np.float32), out=out)
        error = np.abs(f64(out) - want).max() / np.abs(want).max()
        assert error < 1e-5, f"{name}: relative error {error:.2e}"


#: A function that does not use all its parameters (yet): a scalar, an int and a tensor.
UNUSED_PARAMETERS = """\
@kernel
def scaled(x: Tensor["N", f32], s: float, y: Tensor["N", f32], n: int, *,
           eps: float = 1e-5) -> Tensor["N", f32]:
    return x * 2.0
"""


def test_a_name_in_a_comment_or_a_string_is_not_a_use() -> None:
    """Whether a parameter is named in a signature follows the names the code reads; a
    quoted ``.tsr`` line or a debug message cites names it may never read, which named
    the parameter and warned under -Wunused-parameter."""
    from tessera.transpiler.target.cexpr import names_used

    code = [
        "  // scaled.tsr:4: return x * 2.0  # y is for later",
        '  out[i] = x[i] * 2.0f;  /* eps: "unused" */',
        '  tsr_fail("index of s out of bounds: \\"n\\"", i);  // a "quoted" n',
    ]
    assert names_used(code) == {"out", "i", "x", "2", "0f", "tsr_fail"}


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), every_target_beyond("cpu", "opencl", "sycl"))
def test_unused_parameters_keep_their_place_in_the_signature(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A caller passes what the ``.tsr`` signature declares, used or not: an unused
    scalar was dropped from the entry, so ``scaled(x, 0.5, y, 3)`` was refused as four
    arguments for two."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    lib = load_everywhere(UNUSED_PARAMETERS, target, arch, monkeypatch)
    x, y = np.random.default_rng(5).standard_normal((2, 37)).astype(np.float32)
    out = np.full(37, np.nan, np.float32)
    lib.scaled(x, 0.5, y, 3, eps=1e-3, out=out)
    np.testing.assert_array_equal(out, x * np.float32(2.0))


#: Attention with head dims narrower than a matrix instruction's tile (MFMA's 32
#: columns): every product of the kernel then runs as an FMA loop.
NARROW_HEADS = """\
@kernel
def narrow(q: Tensor["B", "S", 16, f32], k: Tensor["B", "S", 16, f32],
           v: Tensor["B", "S", 16, f32]) -> Tensor["B", "S", 16, f32]:
    return flash_attention(q, k, v, causal=True)

@kernel
def narrow_bf16(q: Tensor["B", "S", 8, bf16], k: Tensor["B", "S", 8, bf16],
                v: Tensor["B", "S", 8, bf16]) -> Tensor["B", "S", 8, f32]:
    return cast(flash_attention(q, k, v), f32)
"""


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), every_target_beyond("cpu", "gfx90a"))
def test_attention_with_a_head_dim_narrower_than_the_matrix_instruction(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On HIP a head dim of 16 was refused ("a 128x16 product over 4x1 warps of
    mfma_f32_32x32x2f32"): MFMA's tiles do not cover it."""
    import ml_dtypes

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    lib = load_everywhere(NARROW_HEADS, target, arch, monkeypatch)
    rng = np.random.default_rng(16)
    for name, head, dtype, causal, tolerance in (
        ("narrow", 16, np.float32, True, 1e-5),
        ("narrow_bf16", 8, ml_dtypes.bfloat16, False, 2e-2),
    ):
        q, k, v = (rng.standard_normal((2, 37, head)).astype(dtype) for _ in range(3))
        out = np.full(q.shape, np.nan, np.float32)
        getattr(lib, name)(q, k, v, out=out)
        want = attention(f64(q), f64(k), f64(v), causal=causal)
        error = np.abs(f64(out) - want).max() / np.abs(want).max()
        assert error < tolerance, f"{name}: relative error {error:.2e}"


#: Rotary tables computed in the function, and cut from a table of whole rows (Hugging
#: Face's, whose halves repeat): the library kernel reads its tables from memory, so a
#: computed or sliced one is written first.
ROTARY_TABLES = """\
@kernel
def rope_angles(x: Tensor["S", "D", f32], angles: Tensor["S", "D/2", f32]) -> Tensor["S", "D", f32]:
    return rotary_embedding(x, cos(angles), sin(angles))

@kernel
def rope_halves(x: Tensor["S", "D", f32], cos_full: Tensor["S", "D", f32],
                sin_full: Tensor["S", "D", f32]) -> Tensor["S", "D", f32]:
    return rotary_embedding(x, cos_full[:, :D // 2], sin_full[:, :D // 2])
"""


def _rope(x: np.ndarray, c: np.ndarray, s: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    x1, x2 = f64(x[:, :half]), f64(x[:, half:])
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), every_target_beyond("cpu", "opencl"))
def test_rotary_tables_computed_or_sliced_in_the_function(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    lib = load_everywhere(ROTARY_TABLES, target, arch, monkeypatch)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((37, 24)).astype(np.float32)
    angles = (rng.standard_normal((37, 12)) * 3).astype(np.float32)
    c, s = np.cos(f64(angles)), np.sin(f64(angles))
    full = [np.concatenate([t, t], axis=-1).astype(np.float32) for t in (c, s)]
    for name, args in (("rope_angles", (x, angles)), ("rope_halves", (x, *full))):
        out = np.full(x.shape, np.nan, np.float32)
        getattr(lib, name)(*args, out=out)
        error = np.abs(f64(out) - _rope(x, c, s)).max()
        assert error < 1e-5, f"{name}: error {error:.2e}"
