"""``x @ dequantize(q, scale, ...)`` in a graph function (``graph/dequantized.py``): one
kernel that dequantizes the i8 or packed i4 weight block by block in the product's main
loop, with no temporary of the weight's size; the same values as dequantize-then-multiply
(``docs/numerics.md``) on every target, at ragged sizes, per group and per column, with
and without zero points, for bf16, f16 and f32 activations; and the products it leaves to
the two kernels of before, which still give the same values."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera

from .everywhere import EVERY_TARGET, load_everywhere
from .reference import gelu
from .test_narrow_accum import accumulated
from .test_numerics import _bits, _run
from .test_quant_i4 import pack, unpack

pytestmark = pytest.mark.execute

BF16 = ml_dtypes.bfloat16
#: Rows of activations and columns of the weight, neither a multiple of a tile (N even:
#: a packed i4 row); K of the functions beyond ``FUSED``, five groups of 32; batches.
M, N, K, BATCH = 37, 78, 160, 3

#: Each function: its weight's dtype, its group (None: a scale per column), whether it
#: has zero points, the activations' dtype, the result's, and K: a multiple of the group,
#: but of no K block a schedule takes where the kernel steps by those (a scale per column).
FUSED = {
    "w4_groups": ("i4", 32, False, "bf16", "f32", 160),
    "w4_groups_zero": ("i4", 64, True, "bf16", "bf16", 192),
    "w8_groups": ("i8", 32, False, "f32", "f32", 96),
    "w8_groups_zero": ("i8", 16, True, "f16", "f16", 176),
    "w8_columns": ("i8", None, False, "f32", "f32", 150),
    "w4_columns_zero": ("i4", None, True, "bf16", "bf16", 150),
    "w4_columns_f16": ("i4", None, False, "f16", "f32", 70),
}
_NUMPY = {"bf16": BF16, "f16": np.float16, "f32": np.float32}


def _signature(
    name: str, weight: str, group: int | None, zero: bool, x: str, out: str, _: int
) -> str:
    """The source of a ``FUSED`` function: ``x @ dequantize(q, s, ...)`` and nothing else."""
    scale = f'"K/{group}", "N"' if group else '"N"'
    params = [f'x: Tensor["M", "K", {x}]', f'q: Tensor["K", "N", {weight}]',
              f"s: Tensor[{scale}, f32]"]  # fmt: skip
    keywords = ["zero_point=z"] if zero else []
    if zero:
        params.append(f"z: Tensor[{scale}, f32]")
    if group:
        keywords.append(f"group={group}")
    keywords.append(f"dtype={x}")
    return (
        f"@kernel\ndef {name}({', '.join(params)}) -> Tensor[\"M\", \"N\", {out}]:\n"
        f"    return x @ dequantize(q, s, {', '.join(keywords)})\n"
    )


SOURCE = "\n\n".join(_signature(name, *spec) for name, spec in FUSED.items()) + """

@kernel
def batched_epilogue(x: Tensor["B", "M", "K", bf16], q: Tensor["K", "N", i4],
                     s: Tensor["K/32", "N", f32],
                     bias: Tensor["N", f32]) -> Tensor["B", "M", "N", bf16]:
    return gelu(x @ dequantize(q, s, group=32, dtype=bf16) + bias)


@kernel
def two_steps(x: Tensor["M", "K", bf16], q: Tensor["K", "N", i4],
              s: Tensor["K/32", "N", f32]) -> Tensor["M", "N", f32]:
    w = dequantize(q, s, group=32, dtype=bf16)
    y = x @ w
    return y
"""

#: Products by a dequantized weight that keep the temporary: the weight's transpose (a
#: weight stored [N, K]), a per-row scale, a weight that is also returned, a 16-bit
#: accumulation, groups wider than a step of the kernel takes (256 bf16 columns of
#: activations: more bytes than the GPUs stage), and activations whose K is a number where
#: the weight's is a size (equal at run time, which the entry checks).
FALLBACK = """
@kernel
def known_k(x: Tensor["M", 160, f32], q: Tensor["K", "N", i8],
            s: Tensor["K/32", "N", f32]) -> Tensor["M", "N", f32]:
    return x @ dequantize(q, s, group=32)


@kernel
def wide_groups(x: Tensor["M", "K", bf16], q: Tensor["K", "N", i4],
                s: Tensor["K/256", "N", f32]) -> Tensor["M", "N", f32]:
    return x @ dequantize(q, s, group=256, dtype=bf16)


@kernel
def transposed(x: Tensor["M", "K", bf16], q: Tensor["N", "K", i8],
               s: Tensor["N", 1, f32]) -> Tensor["M", "N", f32]:
    return x @ dequantize(q, s, dtype=bf16).T


@kernel
def per_row(x: Tensor["M", "K", f32], q: Tensor["K", "N", i8],
            s: Tensor["K", 1, f32]) -> Tensor["M", "N", f32]:
    return x @ dequantize(q, s)


@kernel
def weight_kept(x: Tensor["M", "K", bf16], q: Tensor["K", "N", i4], s: Tensor["K/32", "N", f32]
                ) -> tuple[Tensor["M", "N", f32], Tensor["K", "N", bf16]]:
    w = dequantize(q, s, group=32, dtype=bf16)
    return x @ w, w


@kernel
def narrow(x: Tensor["M", "K", bf16 @accum(bf16)], q: Tensor["K", "N", i8],
           s: Tensor["N", f32]) -> Tensor["M", "N", bf16]:
    return x @ dequantize(q, s, dtype=bf16)
"""


def _weight(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random quantized values over the dtype's whole range, as int8."""
    bound = 8 if dtype == "i4" else 128
    return rng.integers(-bound, bound, shape).astype(np.int8)


def _dequantized(q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, dtype: Any,
                 group: int | None) -> np.ndarray:  # fmt: skip
    """``dequantize``'s result as docs/numerics.md defines it: ``(q - zero) * scale`` in
    f32, rounded to ``dtype``."""
    rows = (lambda a: np.repeat(a, group, axis=0)) if group else (lambda a: a)
    wide = q.astype(np.float32) - (0 if zero is None else rows(zero))
    return (wide * rows(scale)).astype(dtype)


def _inputs(
    rng: np.random.Generator, weight: str, group: int | None, zero: bool, x: str, k: int
) -> tuple[list[np.ndarray], np.ndarray]:
    """The arguments of a ``FUSED`` function, and the float64 reference of its product."""
    q = _weight(rng, weight, (k, N))
    shape = (k // group, N) if group else (N,)
    scale = (rng.random(shape) * 0.02 + 0.01).astype(np.float32)
    zeros = rng.integers(-3, 4, shape).astype(np.float32) if zero else None
    activations = rng.standard_normal((M, k)).astype(_NUMPY[x])
    w = _dequantized(q, scale, zeros, _NUMPY[x], group)
    want = activations.astype(np.float64) @ w.astype(np.float64)
    args = [activations, pack(q) if weight == "i4" else q, scale]
    return args + ([zeros] if zero else []), want


def _close(have: np.ndarray, want: np.ndarray, dtype: str) -> None:
    """Within the product's f32 accumulation, and the result's rounding to its dtype."""
    rtol = {"f32": 1e-5, "f16": 1e-3, "bf16": 8e-3}[dtype]
    scale = np.abs(want).max()
    np.testing.assert_allclose(have.astype(np.float64), want, rtol=rtol, atol=rtol * scale)


@pytest.fixture(scope="module")
def graphs() -> dict[str, str]:
    program = tessera.compile(SOURCE + FALLBACK, filename="q.tsr", target="cpu")
    return {"graph": program.inspect_ir("graph"), "sched": program.inspect_ir("sched")}


def _section(text: str, name: str) -> str:
    start = text.index(f"@{name} ")
    end = text.find("\n}", start)
    return text[start:end]


@pytest.mark.parametrize("name", [*FUSED, "batched_epilogue", "two_steps"])
def test_the_product_is_one_kernel_with_no_temporary(graphs: dict[str, str], name: str) -> None:
    """One launch of the library's dequantizing kernel, which reads the quantized
    weight; the memory plan has no buffer (the weight dequantized was one of K x N)."""
    sched = _section(graphs["sched"], name)
    assert sched.count("launch ") == 1, sched
    assert "buffer" not in sched, sched
    grouped = "columns" not in name
    template = "gemm_dequant_grouped" if grouped else "gemm_dequant"
    assert f"template {template}" in sched, sched
    assert "reads %x, %q, %s" in sched, sched
    graph = _section(graphs["graph"], name)
    assert "matmul" not in graph and "dequantize" not in graph, graph
    assert f"kernel = {template}" in graph, graph


def test_the_epilogue_stays_in_the_kernel(graphs: dict[str, str]) -> None:
    sched = _section(graphs["sched"], "batched_epilogue")
    assert "epilogue [add, gelu, cast]" in sched, sched
    assert "grid [ceil(N/256), ceil(M/256), B]" in sched, sched


@pytest.mark.parametrize(
    "name", ["transposed", "per_row", "weight_kept", "narrow", "wide_groups", "known_k"]
)
def test_other_products_keep_the_temporary(graphs: dict[str, str], name: str) -> None:
    """The forms the kernel does not take: the weight is dequantized first, as before."""
    sched = _section(graphs["sched"], name)
    assert "gemm_dequant" not in sched, sched
    assert "buffer" in sched or name == "weight_kept", sched
    assert "template gemm" in sched, sched


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_fused_products_match_dequantize_then_multiply(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = load_everywhere(SOURCE, target, arch, monkeypatch)
    rng = np.random.default_rng(8)
    for name, (weight, group, zero, x, out, k) in FUSED.items():
        args, want = _inputs(rng, weight, group, zero, x, k)
        have = _run(getattr(lib, name), _NUMPY[out], *args, shape=(M, N))
        _close(have, want, out)
    args, want = _inputs(rng, "i4", 32, False, "bf16", K)
    _close(_run(lib.two_steps, np.float32, *args, shape=(M, N)), want, "f32")
    # batched activations, a bias and an activation after the product, in its epilogue
    x = rng.standard_normal((BATCH, M, K)).astype(BF16)
    bias = rng.standard_normal(N).astype(np.float32)
    q, scale = args[1], args[2]
    w = _dequantized(unpack(q), scale, None, BF16, 32)
    want = gelu(x.astype(np.float64) @ w.astype(np.float64) + bias)
    have = _run(lib.batched_epilogue, BF16, x, q, scale, bias, shape=(BATCH, M, N))
    _close(have, want, "bf16")


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET[:2])
def test_the_products_left_as_they_were_give_the_same_values(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = load_everywhere(FALLBACK, target, arch, monkeypatch)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((M, K)).astype(BF16)
    q = _weight(rng, "i8", (N, K))
    scale = (rng.random((N, 1)) * 0.02 + 0.01).astype(np.float32)
    w = (q.astype(np.float32) * scale).astype(BF16).T
    want = x.astype(np.float64) @ w.astype(np.float64)
    _close(_run(lib.transposed, np.float32, x, q, scale, shape=(M, N)), want, "f32")

    x32 = rng.standard_normal((M, K)).astype(np.float32)
    q = _weight(rng, "i8", (K, N))
    rows = (rng.random((K, 1)) * 0.02 + 0.01).astype(np.float32)
    want = x32.astype(np.float64) @ (q.astype(np.float32) * rows).astype(np.float64)
    _close(_run(lib.per_row, np.float32, x32, q, rows, shape=(M, N)), want, "f32")
    groups = (rng.random((K // 32, N)) * 0.02 + 0.01).astype(np.float32)
    want = x32.astype(np.float64) @ _dequantized(q, groups, None, np.float32, 32)
    _close(_run(lib.known_k, np.float32, x32, q, groups, shape=(M, N)), want, "f32")

    q = _weight(rng, "i4", (K, N))
    groups = (rng.random((K // 32, N)) * 0.02 + 0.01).astype(np.float32)
    w = _dequantized(q, groups, None, BF16, 32)
    y = np.full((M, N), np.nan, np.float32)
    kept = np.full((K, N), np.nan, np.float32).astype(BF16)
    lib.weight_kept(x, pack(q), groups, out=(y, kept))
    np.testing.assert_array_equal(kept.view(np.uint16), w.view(np.uint16))
    _close(y, x.astype(np.float64) @ w.astype(np.float64), "f32")

    q = _weight(rng, "i4", (512, N))
    groups = (rng.random((2, N)) * 0.02 + 0.01).astype(np.float32)
    wide = rng.standard_normal((M, 512)).astype(BF16)
    w = _dequantized(q, groups, None, BF16, 256)
    want = wide.astype(np.float64) @ w.astype(np.float64)
    _close(_run(lib.wide_groups, np.float32, wide, pack(q), groups, shape=(M, N)), want, "f32")

    q = _weight(rng, "i8", (K, N))
    column = (rng.random(N) * 0.02 + 0.01).astype(np.float32)
    w = _dequantized(q, column, None, BF16, None)
    have = _run(lib.narrow, BF16, x, q, column, shape=(M, N))
    np.testing.assert_array_equal(_bits(have), _bits(accumulated(x, w, BF16)))


@pytest.mark.parametrize("name", ["w4_groups_zero", "w8_columns"])
def test_sizes_known_when_compiling_give_the_same_values(name: str) -> None:
    """With K and N fixed (``-D``), the group follows from numbers rather than sizes."""
    weight, group, zero, x, out, k = FUSED[name]
    program = tessera.compile(_signature(name, *FUSED[name]), filename="q.tsr", target="cpu",
                              defines={"K": k, "N": N})  # fmt: skip
    assert "buffer" not in program.inspect_ir("sched")
    args, want = _inputs(np.random.default_rng(10), weight, group, zero, x, k)
    _close(_run(getattr(program.load(), name), _NUMPY[out], *args, shape=(M, N)), want, out)


@pytest.mark.parametrize("name", [n for n, spec in FUSED.items() if spec[0] == "i4"])
def test_the_cpu_dequantizes_an_i4_weight_inside_the_product(name: str) -> None:
    """The library kernel's steps, with zero points or without, are the pattern that the
    CPU's product takes in (``tsr::mma_i4``, docs/cpu-backend.md): none is emitted."""
    source = tessera.compile(_signature(name, *FUSED[name]), filename="q.tsr",
                             target="cpu").source  # fmt: skip
    assert "tsr::mma_i4(" in source
