"""Twin kernels: a kernel whose Tile IR another kernel of the file has (a function's
launches lowered again inside each function that calls it) takes the other's passes,
code and estimates instead of being compiled again (``tile/shape_key.py``). The output
must be exactly what compiling each kernel on its own gives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import tessera.transpiler.tile.build as tile_build
from tessera import compile as compile_source
from tessera import compile_file
from tessera.transpiler.frontend.source import SourceFile, Span
from tessera.transpiler.tile.shape_key import content_key

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TARGETS = ("cpu", "cuda", "opencl", "hip", "sycl")

#: Two functions that call one helper: its product is lowered three times, the same.
CALLERS = """
@kernel
def helper(x: Tensor["N", "D", f32], w: Tensor["D", "D", f32]) -> Tensor["N", "D", f32]:
    return gelu(x @ w)


@kernel
def first(x: Tensor["N", "D", f32], w: Tensor["D", "D", f32]) -> Tensor["N", "D", f32]:
    return softmax(helper(x, w), axis=-1)


@kernel
def second(x: Tensor["N", "D", f32], w: Tensor["D", "D", f32]) -> Tensor["N", "D", f32]:
    return log_softmax(helper(x, w), axis=-1)
"""


def _kernels(program) -> list:
    return [k for p in program.ir("tile").programs for k in p.kernels]


def _outputs(program) -> tuple[str, str]:
    return program.inspect_ir("target"), program.inspect_ir("meta")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("source", ["decode.tsr", "CALLERS"])
def test_twins_change_nothing_in_the_output(
    source: str, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file's source and metadata with twins found are byte for byte those of a
    compilation that finds none; and the files do have twins."""

    def compiled():
        if source == "CALLERS":
            return compile_source(CALLERS, target=target)
        return compile_file(EXAMPLES / source, target=target)

    program = compiled()
    twins = [k for k in _kernels(program) if k.twin is not None]
    assert twins, "the file should have twin kernels"
    names = {k.name for k in _kernels(program)}
    assert all(k.twin in names and k.twin != k.name for k in twins)
    with_twins = _outputs(program)
    monkeypatch.setattr(tile_build, "find_twins", lambda kernels: {})
    alone = compiled()
    assert not any(k.twin for k in _kernels(alone))
    assert _outputs(alone) == with_twins


def test_the_callers_products_are_twins() -> None:
    """``first``'s and ``second``'s products (``helper``'s, with its GELU) are one
    content; their second kernels (a softmax, a log-softmax) and ``helper``'s own
    kernel (which writes the function's result, not an intermediate) are not."""
    kernels = {k.name: k for k in _kernels(compile_source(CALLERS, target="cuda"))}
    assert {n: k.twin for n, k in kernels.items() if k.twin} == {"second_k0": "first_k0"}
    assert kernels["second_k0"].body is kernels["first_k0"].body


def test_a_line_or_a_name_makes_a_different_content() -> None:
    """What a kernel prints from its IR is its content: the ``.tsr`` line an op
    cites, a value's name. Its own name, function and launch are not, and neither
    are its values' ids."""
    kernel = _kernels(compile_source(CALLERS, target="cuda"))[0]
    key = content_key(kernel)
    renamed = dataclasses.replace(kernel, name="other", function="other", launch="k9")
    assert content_key(renamed) == key

    op = next(op for op in kernel.body.ops if op.span is not None)
    span = op.span
    moved = Span(span.source, span.line + 1, span.column, span.end_line + 1, span.end_column)
    assert content_key(_with_op(kernel, op, dataclasses.replace(op, span=moved))) != key
    elsewhere = Span(SourceFile("other.tsr", span.source.text), *_place(span))
    assert content_key(_with_op(kernel, op, dataclasses.replace(op, span=elsewhere))) != key

    param = kernel.params[0]
    named = dataclasses.replace(param, name=f"{param.name}_2")
    assert content_key(dataclasses.replace(kernel, params=(named, *kernel.params[1:]))) != key


def _place(span: Span) -> tuple[int, int, int, int]:
    return span.line, span.column, span.end_line, span.end_column


def _with_op(kernel, old, new):
    ops = tuple(new if op is old else op for op in kernel.body.ops)
    return dataclasses.replace(kernel, body=dataclasses.replace(kernel.body, ops=ops))
