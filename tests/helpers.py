"""Small helpers shared by the tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.transpiler.frontend import ast
from tessera.transpiler.frontend.diagnostics import Diagnostics, Severity
from tessera.transpiler.frontend.parser import parse
from tessera.transpiler.frontend.printer import print_module
from tessera.transpiler.frontend.source import SourceFile

#: The location and message of a rendered diagnostic or note.
HEADLINE = re.compile(r"^(?:\S+:\d+:\d+: |\S+: )?(?:error|warning|note): .*$", re.M)


def parse_text(text: str, name: str = "test.tsr") -> tuple[ast.Module | None, Diagnostics]:
    diags = Diagnostics()
    return parse(SourceFile(name, text), diags), diags


def parse_ok(text: str) -> ast.Module:
    module, diags = parse_text(text)
    errors = [d.render() for d in diags.items if d.severity is Severity.ERROR]
    assert not errors, "\n".join(errors)
    assert module is not None
    return module


def canonical(text: str) -> str:
    return print_module(parse_ok(text))


def assert_round_trip(text: str) -> str:
    """Parse, print, parse again: equal ASTs, and printing is a fixed point."""
    first = parse_ok(text)
    printed = print_module(first)
    second = parse_ok(printed)
    assert second == first, f"round trip changed the AST; printed form:\n{printed}"
    assert print_module(second) == printed
    return printed


#: A branch that reduces: its result would have to outlive the branch in registers.
BRANCH_WITH_STATEMENTS = """\
@kernel
def normalize_if(x: Tensor["R", "C", f32], *, flag: bool) -> Tensor["R", "C", f32]:
    T = tile.context()
    rows = tile.load(x, rows=T.m)
    if flag:
        rows = rows / tile.sum(rows, axis=1)[:, None]
    return rows
"""


def run_sanitized(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``script`` in a Python process with AddressSanitizer and UBSan preloaded, so that
    every allocation, numpy's included, has redzones that a stray access hits; skips
    where g++ has no sanitizer libraries."""
    libraries = [subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True,
                                text=True).stdout.strip()
                 for name in ("libasan.so", "libubsan.so")]  # fmt: skip
    if not all(Path(p).is_absolute() and Path(p).exists() for p in libraries):
        pytest.skip("needs libasan and libubsan (g++)")
    env = {**os.environ, "LD_PRELOAD": " ".join(libraries),
           "ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "print_stacktrace=1"}  # fmt: skip
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip


#: A loop that only stores (it yields nothing): ``y = 2 x`` in column blocks of T.k.
STORE_IN_A_LOOP = """\
@kernel
def twice(x: Tensor["M", "K", f32], y: Tensor["M", "K", f32]):
    T = tile.context()
    for kb in tile.range_n(x.shape[1], T.k):
        tile.store(y, tile.load(x, rows=T.m, cols=kb) * 2.0, rows=T.m, cols=kb)
"""
#: Row sums in column blocks of T.k, a loop with no product to choose T.k. (The SIMT
#: targets do not reduce such blocks yet.)
COLUMN_BLOCKS = """\
@kernel
def row_sums(x: Tensor["M", "K", f32]) -> Tensor["M", f32]:
    T = tile.context()
    acc = tile.zeros((T.m,), f32)
    for kb in tile.range_n(x.shape[1], T.k):
        acc += tile.sum(tile.load(x, rows=T.m, cols=kb), axis=1)
    return acc
"""


def check_store_in_a_loop(target: str) -> None:
    """Runs ``STORE_IN_A_LOOP`` on ``target`` at a size that is no multiple of its tiles."""
    x = np.random.default_rng(7).standard_normal((37, 301)).astype(np.float32)
    y = np.full_like(x, np.nan)
    tessera.compile(STORE_IN_A_LOOP, target=target).load().twice(x, y)
    np.testing.assert_allclose(y, 2.0 * x.astype(np.float64), rtol=1e-6)


def check_column_blocks(target: str) -> None:
    """Runs ``COLUMN_BLOCKS`` on ``target`` at a size that is no multiple of its tiles."""
    x = np.random.default_rng(8).standard_normal((37, 301)).astype(np.float32)
    out = np.full(37, np.nan, np.float32)
    tessera.compile(COLUMN_BLOCKS, target=target).load().row_sums(x, out=out)
    np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


#: Loads, stores and casts of i8 and i32, as parameters, results and intermediates (in a
#: kernel and between two), and a product whose integer result leaves the mma's fragments.
INTEGERS = """\
@kernel
def to_i8(y: Tensor["R", "C", f32]) -> Tensor["R", "C", i8]:
    return cast(y, i8)

@kernel
def from_ints(x: Tensor["R", "C", i8], z: Tensor["R", "C", i32]) -> Tensor["R", "C", f32]:
    return cast(x, f32) * 0.5 + cast(z, f32)

@kernel
def through_i8(y: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return cast(cast(y, i8), f32) + y

@kernel
def between_kernels(y: Tensor["R", "C", f32]) -> Tensor["R", f32]:
    q = cast(y, i8)
    return cast(sum(q, axis=1), f32) + sum(cast(q, f32) * cast(q, f32), axis=1)

@kernel
def copy_i32(z: Tensor["R", "C", i32]) -> Tensor["R", "C", i32]:
    return z

@kernel
def product_i32(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]) -> Tensor["M", "N", i32]:
    return cast(matmul(a, b), i32)
"""


def _as_i8(y: np.ndarray) -> np.ndarray:
    """A float as an i8 converts: toward zero, then the low 8 bits."""
    return y.astype(np.int32).astype(np.int8)


def check_integers(lib: object) -> None:
    """Runs ``INTEGERS``' functions (``lib``: the loaded library) at a ragged size, on
    values that convert toward zero and past i8's range, outputs poisoned first."""
    rng = np.random.default_rng(11)
    y = (rng.standard_normal((37, 45)) * 150).astype(np.float32)
    x = rng.integers(-128, 128, (37, 45)).astype(np.int8)
    z = rng.integers(-(2**24), 2**24, (37, 45)).astype(np.int32)
    out_i8 = np.full(y.shape, 77, np.int8)
    lib.to_i8(y, out=out_i8)
    np.testing.assert_array_equal(out_i8, _as_i8(y))
    out = np.full(y.shape, np.nan, np.float32)
    lib.from_ints(x, z, out=out)
    np.testing.assert_allclose(out, x * 0.5 + z.astype(np.float64), rtol=1e-7)
    lib.through_i8(y, out=out)
    np.testing.assert_allclose(out, _as_i8(y) + y.astype(np.float64), rtol=1e-6)
    rows = np.full(37, np.nan, np.float32)
    lib.between_kernels(y, out=rows)
    q = _as_i8(y).astype(np.float64)
    np.testing.assert_allclose(rows, q.sum(axis=1) + (q * q).sum(axis=1), rtol=1e-6)
    out_i32 = np.full(z.shape, -7, np.int32)
    lib.copy_i32(z, out=out_i32)
    np.testing.assert_array_equal(out_i32, z)
    a = rng.integers(-8, 8, (37, 45)).astype(np.float32)
    b = rng.integers(-8, 8, (45, 29)).astype(np.float32)
    product = np.full((37, 29), -7, np.int32)
    lib.product_i32(a, b, out=product)
    np.testing.assert_array_equal(product, (a.astype(np.int64) @ b).astype(np.int32))


#: Functions of every kind of kernel, to run with sizes of 0.
ZERO_SIZES = """\
@kernel
def ew(x: Tensor["M", "N", f32]) -> Tensor["M", "N", f32]:
    return relu(x) * 2.0

@kernel
def rows(x: Tensor["M", "N", f32]) -> Tensor["M", f32]:
    return sum(x, axis=1)

@kernel
def sm(x: Tensor["M", "N", f32]) -> Tensor["M", "N", f32]:
    return softmax(x)

@kernel
def mm(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return matmul(a, b)

@kernel
def attn(q: Tensor["B", "S", "D", f32], k: Tensor["B", "S", "D", f32],
         v: Tensor["B", "S", "D", f32]) -> Tensor["B", "S", "D", f32]:
    return ops.flash_attention(q, k, v, causal=True)

@kernel
def tk(x: Tensor["M", f32]) -> Tensor["M", f32]:
    T = tile.context()
    return tile.load(x, rows=T.m) + 1.0
"""


def check_zero_sizes(lib: object) -> None:
    """Runs ``ZERO_SIZES``' functions (``lib``: the loaded library) with each size 0 in
    turn: empty results stay empty, and a product over an empty K is zeros."""
    rng = np.random.default_rng(5)
    for shape in [(0, 5), (5, 0), (0, 0)]:
        x = rng.standard_normal(shape).astype(np.float32)
        for name, want in (("ew", np.maximum(x, 0) * 2), ("rows", x.sum(axis=1)), ("sm", x)):
            out = np.full(want.shape, np.nan, np.float32)
            getattr(lib, name)(x, out=out)
            np.testing.assert_array_equal(out, want, err_msg=f"{name} of {shape}")
    for m, k, n in [(0, 3, 4), (3, 0, 4), (3, 4, 0), (0, 0, 0)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        out = np.full((m, n), np.nan, np.float32)
        lib.mm(a, b, out=out)
        np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-6)
    for shape in [(0, 7, 16), (2, 0, 16)]:
        q = rng.standard_normal(shape).astype(np.float32)
        out = np.full(shape, np.nan, np.float32)
        lib.attn(q, q, q, out=out)
        assert out.shape == shape
    out = np.full(0, np.nan, np.float32)
    lib.tk(np.zeros(0, np.float32), out=out)
