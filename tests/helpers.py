"""Small helpers shared by the tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
