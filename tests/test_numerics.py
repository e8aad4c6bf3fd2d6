"""The semantics of ``docs/numerics.md``, checked bit for bit on every target (the CPU,
OpenCL on PoCL, CUDA and HIP on the simulated GPU) against a NumPy and ml_dtypes
emulation: the targets agree with the emulation, so they agree with one another."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.transpiler.frontend.diagnostics import CompileError

from .everywhere import EVERY_TARGET, load_everywhere

FP8 = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}

SOURCE = """\
@kernel
def chain_bf16(a: Tensor["R", "C", bf16], b: Tensor["R", "C", bf16]) -> Tensor["R", "C", bf16]:
    return a * b + a

@kernel
def chain_e5m2(a: Tensor["R", "C", fp8_e5m2],
               b: Tensor["R", "C", fp8_e5m2]) -> Tensor["R", "C", fp8_e5m2]:
    return (a - b) * b

@kernel
def e4m3(x: Tensor["R", "C", f32]) -> Tensor["R", "C", fp8_e4m3 @saturate]:
    return cast(x, fp8_e4m3)

@kernel
def e5m2(x: Tensor["R", "C", f32]) -> Tensor["R", "C", fp8_e5m2 @saturate]:
    return x.to(fp8_e5m2)

@kernel
def int8(x: Tensor["R", "C", f32]) -> Tensor["R", "C", i8 @saturate]:
    return cast(x, i8)

@kernel
def product(a: Tensor["R", "C", fp8_e4m3],
            b: Tensor["R", "C", fp8_e4m3]) -> Tensor["R", "C", fp8_e4m3 @saturate]:
    return a * b

@kernel
def gemm(x: Tensor["R", "K", f32],
         w: Tensor["K", "C", f32]) -> Tensor["R", "C", fp8_e5m2 @accum(f32) @saturate]:
    return x @ w

@kernel
def explicit(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return cast(cast(x, fp8_e4m3, saturate=True), f32) + cast(cast(x, i8, saturate=True), f32)

@kernel
def unsaturated(x: Tensor["R", "C", f32]) -> Tensor["R", "C", fp8_e4m3]:
    return cast(x, fp8_e4m3)

@kernel
def tile_cast(x: Tensor["R", "C", f32]) -> Tensor["R", "C", fp8_e5m2]:
    T = tile.context()
    return tile.cast(tile.load(x, rows=T.m), fp8_e5m2, saturate=True)

@kernel
def sr_bf16(x: Tensor["R", "C", f32],
            step: int) -> Tensor["R", "C", bf16 @stochastic_round(seed=step)]:
    return cast(x, bf16)

@kernel
def sr_f16(x: Tensor["R", "C", f32], step: int) -> Tensor["R", "C", f16 @stochastic_round(step)]:
    return x.to(f16)

@kernel
def sr_e4m3(x: Tensor["R", "C", f32],
            step: int) -> Tensor["R", "C", fp8_e4m3 @stochastic_round(seed=step) @saturate]:
    return cast(x, fp8_e4m3)

@kernel
def sr_e5m2(x: Tensor["R", "C", f32],
            step: int) -> Tensor["R", "C", fp8_e5m2 @stochastic_round(seed=step)]:
    return cast(x, fp8_e5m2)

@kernel
def acc_bf16(x: Tensor["R", "K", bf16 @accum(bf16)],
             w: Tensor["K", "C", bf16]) -> Tensor["R", "C", bf16]:
    return x @ w

@kernel
def acc_f16(x: Tensor["R", "K", f16 @accum(f16)],
            w: Tensor["K", "C", f16]) -> Tensor["R", "C", f16]:
    return x @ w

@kernel
def sr_gemm(x: Tensor["R", "K", f32],
            w: Tensor["K", "C", f32]) -> Tensor["R", "C", bf16 @stochastic_round(seed=5)]:
    return x @ w
"""

#: Rows per group of ``tests/test_quant.py``'s per-group scales.
GROUP = 4

QUANTIZING = f"""\
@kernel
def per_tensor(w: Tensor["K", "N", f32], s: Tensor[1, f32]) -> Tensor["K", "N", i8]:
    return quantize(w, s, i8)

@kernel
def per_column(w: Tensor["K", "N", f32], s: Tensor["N", f32]) -> Tensor["K", "N", fp8_e4m3]:
    return quantize(w, s, fp8_e4m3)

@kernel
def per_group(w: Tensor["K", "N", f32], s: Tensor["K/{GROUP}", "N", f32],
              z: Tensor["K/{GROUP}", "N", f32]) -> Tensor["K", "N", i8]:
    return quantize(w, s, i8, zero_point=z, group={GROUP})

@kernel
def per_group_e5m2(w: Tensor["K", "N", f32],
                   s: Tensor["K/{GROUP}", "N", f32]) -> Tensor["K", "N", fp8_e5m2]:
    return quantize(w, s, fp8_e5m2, group={GROUP})

@kernel
def back_per_group(q: Tensor["K", "N", i8], s: Tensor["K/{GROUP}", "N", f32],
                   z: Tensor["K/{GROUP}", "N", f32]) -> Tensor["K", "N", f32]:
    return dequantize(q, s, zero_point=z, group={GROUP})

@kernel
def back_per_column(q: Tensor["K", "N", fp8_e4m3], s: Tensor["N", f32]) -> Tensor["K", "N", bf16]:
    return dequantize(q, s, dtype=bf16)

@kernel
def i4_per_group(w: Tensor["K", "N", f32], s: Tensor["K/{GROUP}", "N", f32],
                 z: Tensor["K/{GROUP}", "N", f32]) -> Tensor["K", "N", i4]:
    return quantize(w, s, i4, zero_point=z, group={GROUP})

@kernel
def i4_per_column(w: Tensor["K", "N", f32], s: Tensor["N", f32]) -> Tensor["K", "N", i4]:
    return quantize(w, s, i4)

@kernel
def i4_back_per_group(q: Tensor["K", "N", i4], s: Tensor["K/{GROUP}", "N", f32],
                      z: Tensor["K/{GROUP}", "N", f32]) -> Tensor["K", "N", f32]:
    return dequantize(q, s, zero_point=z, group={GROUP})

@kernel
def i4_back_per_column(q: Tensor["K", "N", i4], s: Tensor["N", f32]) -> Tensor["K", "N", bf16]:
    return dequantize(q, s, dtype=bf16)

"""

#: Both programs, built once per target for the tests of this file, ``test_quant.py``
#: and ``test_quant_i4.py``.
PROGRAM = SOURCE + "\n" + QUANTIZING

#: Columns per row of the test matrices: not a multiple of any tile.
COLUMNS = 13


def _narrowing_values() -> np.ndarray:
    """Floats that test every narrowing: each fp8 value of both formats, the midpoints
    between neighbours and the floats on either side of them, values just past each
    format's largest and far past it, the infinities, NaN (whose sign no target keeps
    alike: ``docs/numerics.md``), and i8's edges."""
    parts = []
    for np_type in FP8.values():
        finite = np.arange(256, dtype=np.uint8).view(np_type).astype(np.float64)
        # zero once, as +0 (np.unique keeps either zero, by the machine's sort); -values
        # below gives -0
        finite = np.unique(finite[np.isfinite(finite)]) + 0.0
        mid = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)
        largest = finite.max()
        parts += [finite, mid, np.nextafter(mid, np.float32(-np.inf)),
                  np.nextafter(mid, np.float32(np.inf)),
                  largest * np.array([1.03, 1.07, 1.5, 4.0])]  # fmt: skip
    parts.append(np.array([127.4, 127.6, 128.0, 128.9, 300.0, 1e30, np.inf]))
    values = np.concatenate(parts)
    return np.concatenate([values, -values, [np.nan]]).astype(np.float32)


def _matrix(values: np.ndarray) -> np.ndarray:
    """``values`` as rows of ``COLUMNS``, the last row padded with ones."""
    padded = np.ones(-(-len(values) // COLUMNS) * COLUMNS, values.dtype)
    padded[: len(values)] = values
    return padded.reshape(-1, COLUMNS)


def saturated(x: np.ndarray, dtype: str) -> np.ndarray:
    """The emulation: a saturating conversion of f32 ``x`` to ``dtype``."""
    if dtype == "i8":
        clamped = np.clip(np.nan_to_num(x, nan=0.0), -128, 127)
        return clamped.astype(np.int32).astype(np.int8)
    largest = float(ml_dtypes.finfo(FP8[dtype]).max)
    return np.clip(x, -largest, largest).astype(FP8[dtype])


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def _run(
    function: Callable[..., Any], dtype: Any, *args: np.ndarray, shape: tuple[int, ...] = ()
) -> np.ndarray:
    """``function``'s result (of ``shape``, else the first argument's rows by the last
    one's columns), written over two different poisons that must not show."""
    shape = shape or (*args[0].shape[:-1], args[-1].shape[-1])
    results = []
    for poison in (0x7F, 0x01):  # NaN in e4m3 and e5m2, and the smallest subnormal
        if np.dtype(dtype).itemsize == 1:
            out = np.full(shape, poison, np.uint8).view(dtype)
        else:
            out = np.full(shape, np.nan if poison == 0x7F else -7.0, dtype)
        function(*args, out=out)
        results.append(out)
    np.testing.assert_array_equal(_bits(results[0]), _bits(results[1]))
    return results[0]


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_saturating_conversions_are_bit_identical_everywhere(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each way of asking for saturation (a result's ``@saturate``, after a cast, after
    math in fp8, after a product accumulated in f32; ``cast(..., saturate=True)``;
    ``tile.cast``) gives the emulation's bits; without it, e4m3 overflows to NaN."""
    lib = load_everywhere(PROGRAM, target, arch, monkeypatch)
    x = _matrix(_narrowing_values())
    for name, dtype in (("e4m3", "fp8_e4m3"), ("e5m2", "fp8_e5m2"), ("int8", "i8")):
        want = saturated(x, dtype)
        np.testing.assert_array_equal(_bits(_run(getattr(lib, name), want.dtype, x)), _bits(want))
    want = saturated(x, "fp8_e5m2")
    np.testing.assert_array_equal(_bits(_run(lib.tile_cast, want.dtype, x)), _bits(want))
    want = x.astype(FP8["fp8_e4m3"])
    np.testing.assert_array_equal(_bits(_run(lib.unsaturated, want.dtype, x)), _bits(want))
    want = saturated(x, "fp8_e4m3").astype(np.float32) + saturated(x, "i8").astype(np.float32)
    np.testing.assert_array_equal(_run(lib.explicit, np.float32, x), want)

    e4m3 = FP8["fp8_e4m3"]
    a = saturated(np.nan_to_num(x), "fp8_e4m3")  # a NaN's sign after math is not specified
    b = np.roll(a, 1, axis=0)
    want = saturated(a.astype(np.float32) * b.astype(np.float32), "fp8_e4m3")
    np.testing.assert_array_equal(_bits(_run(lib.product, e4m3, a, b)), _bits(want))

    finite = np.nan_to_num(x[:40], posinf=1e30, neginf=-1e30)
    eye = np.eye(COLUMNS, dtype=np.float32)
    want = saturated(finite + np.float32(0), "fp8_e5m2")  # a sum from +0 makes -0 +0
    np.testing.assert_array_equal(_bits(_run(lib.gemm, want.dtype, finite, eye)), _bits(want))


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x: Tensor['N', f32]) -> Tensor['N', bf16 @saturate]:\n    return cast(x, bf16)\n",
         "1:48: error: @saturate applies to fp8_e4m3, fp8_e5m2, i8 and i4, not bf16"),
        ("def f(x: Tensor['N', f32]) -> Tensor['N', i32 @saturate]:\n    return cast(x, i32)\n",
         "1:47: error: @saturate applies to fp8_e4m3, fp8_e5m2, i8 and i4, not i32"),
        ("def f(x: Tensor['N', f32]) -> Tensor['N', f16]:\n"
         "    return cast(x, f16, saturate=True)\n",
         "2:34: error: cast: saturate=True applies to fp8_e4m3, fp8_e5m2, i8 and i4, not f16"),
        ("def f(x: Tensor['N', f32], s: bool) -> Tensor['N', i8]:\n"
         "    return cast(x, i8, saturate=s)\n",
         "2:33: error: cast: 'saturate' must be a bool known at compile time"),
        ("def f(x: Tensor['N', f32], s: float) -> Tensor['N', bf16 @stochastic_round(seed=s)]:\n"
         "    return cast(x, bf16)\n",
         "1:58: error: @stochastic_round's seed 's' names a float parameter of 'f': it takes a "
         "number or an int parameter"),
        ("def f(x: Tensor['N', f32]) -> Tensor['N', bf16 @stochastic_round(seed=t)]:\n"
         "    return cast(x, bf16)\n",
         "1:48: error: @stochastic_round's seed 't' names no parameter of 'f'"),
        ("def f(x: Tensor['N', f32]) -> Tensor['N', bf16 @stochastic_round(1, 2)]:\n"
         "    return cast(x, bf16)\n",
         "1:48: error: @stochastic_round takes one seed, a number or an int parameter"),
        ("def f(x: Tensor['N', 'C', bf16]) -> Tensor['N', 'C', bf16 @stochastic_round]:\n"
         "    return softmax(x)\n",
         "2:12: error: @stochastic_round cannot round softmax's result"),
        ("def f(x: Tensor['N', f32]) -> Tensor['N', bf16 @stochastic_round]:\n"
         "    T = tile.context()\n    return tile.cast(tile.load(x, rows=T.m), bf16)\n",
         "3:12: error: @stochastic_round cannot round a tile kernel's result"),
        ("def f(x: Tensor['N', 'K', bf16 @accum(f16)]) -> Tensor['N', bf16]:\n    return x\n",
         "1:32: error: @accum(f16) applies to f16 and fp8 values, not bf16: use @accum(f32)"),
        ("def f(x: Tensor['N', 'K', f16 @accum(bf16)]) -> Tensor['N', f16]:\n    return x\n",
         "1:31: error: @accum(bf16) on f16 would accumulate in less precision than the inputs"),
        ("def f(x: Tensor['N', 'K', bf16 @accum(bf16)]) -> Tensor['N', bf16]:\n"
         "    return sum(x, axis=1)\n",
         "2:16: error: sum: @accum(bf16) applies to products (matmul): sum accumulates in f32"),
        ("@autodiff\n"
         "def f(x: Tensor['N', f32]) -> tuple[Tensor[f32 @loss_scale(8)], Tensor[f32]]:\n"
         "    return sum(x, axis=None), sum(x, axis=None)\n",
         "2:31: error: @loss_scale: the results have different scales"),
        ("def f(x: Tensor['N', i8]) -> Tensor[1, f32]:\n    return all_finite(x)\n",
         "2:23: error: all_finite: 'x' must be a float tensor"),
    ],
)  # fmt: skip
def test_a_policy_where_it_cannot_apply_is_an_error_at_its_line(source: str, message: str) -> None:
    with pytest.raises(CompileError) as info:
        tessera.compile("@kernel\n" + source, filename="s.tsr", target="cpu")
    line, rest = message.split(":", 1)
    assert str(info.value).startswith(f"s.tsr:{int(line) + 1}:{rest}"), str(info.value)


@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_each_ops_result_is_rounded_to_its_dtype_everywhere(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Elementwise math on bf16 and fp8 values rounds each op's result to the dtype, on
    the GPU targets as on the CPU, so the results agree bit for bit (a chain computed in
    f32 and rounded once differs in about a third of the elements)."""
    lib = load_everywhere(PROGRAM, target, arch, monkeypatch)
    rng = np.random.default_rng(39)
    for name, np_type in (("chain_bf16", ml_dtypes.bfloat16), ("chain_e5m2", FP8["fp8_e5m2"])):
        a, b = (rng.standard_normal((67, COLUMNS)).astype(np_type) for _ in range(2))
        fa, fb = a.astype(np.float32), b.astype(np.float32)
        if name == "chain_bf16":
            want = ((fa * fb).astype(np_type).astype(np.float32) + fa).astype(np_type)
        else:
            want = ((fa - fb).astype(np_type).astype(np.float32) * fb).astype(np_type)
        np.testing.assert_array_equal(_bits(_run(getattr(lib, name), np_type, a, b)), _bits(want))


def test_a_saturated_result_marks_the_conversion_that_produces_it() -> None:
    """In a tile kernel too: the ``tile.cast`` returned, or the one semantic analysis adds
    after f32 math; a parameter returned as it is has no conversion to mark."""
    program = tessera.compile(
        "@kernel\n"
        "def t(x: Tensor['R', 'C', f32]) -> Tensor['R', 'C', fp8_e5m2 @saturate]:\n"
        "    T = tile.context()\n"
        "    return tile.cast(tile.load(x, rows=T.m), fp8_e5m2)\n\n"
        "@kernel\n"
        "def u(x: Tensor['R', 'C', f32]) -> Tensor['R', 'C', fp8_e5m2 @saturate]:\n"
        "    T = tile.context()\n"
        "    return tile.load(x, rows=T.m) * 2.0\n\n"
        "@kernel\n"
        "def v(x: Tensor['R', 'C', i8 @saturate]) -> Tensor['R', 'C', i8 @saturate]:\n"
        "    return x\n",
        filename="t.tsr",
        target="cpu",
    )
    casts = [line.split("//")[-1].strip() for line in program.inspect_ir("tile").splitlines()
             if " cast " in line and "saturate = true" in line]  # fmt: skip
    assert casts == ["4:12", "9:12"]
