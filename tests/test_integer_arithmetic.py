"""Integer and floor arithmetic as NumPy and PyTorch define it, on every target.

``/`` is true division (``7 / 2`` is 3.5, an f32 even of two integer tensors); an integer
tensor with a float number or a float scalar gives f32 (``i * 0.5``); ``//`` rounds the
quotient toward minus infinity and ``%`` gives the remainder the divisor's sign, for
integers (a zero divisor gives 0) and floats (NaN or infinity). Before, ``/`` of two
integer tensors truncated toward zero, and ``//`` and ``%`` of tensors were refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.transpiler.target.nvrtc import build

from .everywhere import EVERY_TARGET, load_everywhere
from .test_cuda import needs_nvrtc
from .test_sycl import check_syntax, needs_sycl_headers

SOURCE = """\
@kernel
def floor_parts(x: Tensor["M", "N", i32], y: Tensor["M", "N", i32]
                ) -> tuple[Tensor["M", "N", i32], Tensor["M", "N", i32]]:
    return x // y, x % y

@kernel
def true_division(x: Tensor["M", "N", i32], y: Tensor["M", "N", i32], s: float
                  ) -> tuple[Tensor["M", "N", f32], Tensor["M", "N", f32]]:
    return x / y, x * s + 0.5

@kernel
def float_floor_parts(x: Tensor["M", "N", f32], y: Tensor["M", "N", f32]
                      ) -> tuple[Tensor["M", "N", f32], Tensor["M", "N", f32]]:
    return x // y, x % y

@kernel
def block_and_offset(i: Tensor["N", i32]) -> tuple[Tensor["N", i32], Tensor["N", i32]]:
    return i // 8, i % 8
"""


@pytest.mark.execute
@pytest.mark.parametrize(("target", "arch"), EVERY_TARGET)
def test_division_floor_division_and_remainder_are_numpys(
    target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    lib = load_everywhere(SOURCE, target, arch, monkeypatch)
    rng = np.random.default_rng(11)
    x = rng.integers(-1000, 1000, (37, 29)).astype(np.int32)
    y = rng.integers(-9, 10, (37, 29)).astype(np.int32)  # zeros included
    xf = (rng.standard_normal((37, 29)) * 10).astype(np.float32)
    yf = rng.standard_normal((37, 29)).astype(np.float32)
    yf[0, :5], xf[1, :3], yf[2, :4] = 0.0, -0.0, np.inf
    i = np.arange(-20, 53, dtype=np.int32)

    def poisoned(shape: tuple[int, ...], dtype: type) -> np.ndarray:
        return np.full(shape, -77 if dtype is np.int32 else np.nan, dtype)

    with np.errstate(divide="ignore", invalid="ignore"):
        cases = [
            ("floor_parts", (x, y), (np.floor_divide(x, y), np.mod(x, y))),
            (
                "true_division",
                (x, y, 0.25),
                (
                    x.astype(np.float32) / y.astype(np.float32),
                    x.astype(np.float32) * np.float32(0.25) + np.float32(0.5),
                ),
            ),
            ("float_floor_parts", (xf, yf), (np.floor_divide(xf, yf), np.mod(xf, yf))),
            ("block_and_offset", (i,), (i // 8, i % 8)),
        ]
    for name, args, wants in cases:
        outs = tuple(poisoned(w.shape, w.dtype.type) for w in wants)
        getattr(lib, name)(*args, out=outs)
        for index, (have, want) in enumerate(zip(outs, wants, strict=True)):
            np.testing.assert_array_equal(have, want, err_msg=f"{name}, result {index}")


def test_floor_division_of_int_parameters_is_refused_at_its_line() -> None:
    source = """\
@kernel
def f(x: Tensor["N", f32], n: int) -> Tensor["N", f32]:
    return x * float(n // 2)
"""
    with pytest.raises(tessera.CompileError) as error:
        tessera.compile(source, "scalar.tsr", target="cpu")
    assert "scalar.tsr:3:22: error: '//' of int parameters" in str(error.value)


@pytest.mark.compile
@needs_nvrtc
def test_the_floor_helpers_build_with_nvrtc() -> None:
    program = tessera.compile(SOURCE, "floor.tsr", target="cuda", arch="sm_80")
    assert "tsr_floordiv_int(" in program.source and "tsr_mod(" in program.source
    build(program.source, "sm_80", list(program.ir("meta")["build"]["options"]))


@pytest.mark.compile
@pytest.mark.exhaustive
@needs_sycl_headers
def test_the_floor_helpers_parse_as_sycl_warning_free(tmp_path: Path) -> None:
    check_syntax(
        {"floor_parts": tessera.compile(SOURCE, "floor.tsr", target="sycl").source}, tmp_path
    )
