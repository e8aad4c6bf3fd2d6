"""The diagnostics engine: rendering, limits, and file-level problems."""

from __future__ import annotations

from pathlib import Path

import pytest

import tessera
from tessera.transpiler.frontend.diagnostics import ERROR_LIMIT, Diagnostics, Note, render
from tessera.transpiler.frontend.source import SourceFile, Span, decode_source

from .helpers import BRANCH_WITH_STATEMENTS, HEADLINE, parse_text

pytestmark = pytest.mark.unit


def test_render_has_line_caret_and_tildes() -> None:
    source = SourceFile("attn.tsr", "x = 1\n    S = tile.dot(Qb, Kb)\n")
    diags = Diagnostics()
    diags.error(
        "matmul: inner dimensions differ",
        Span(source, 2, 18, 2, 20),
        (Note("K declared here", Span(source, 1, 1, 1, 2)),),
    )
    assert render(diags.items) == (
        "attn.tsr:2:18: error: matmul: inner dimensions differ\n"
        "    S = tile.dot(Qb, Kb)\n"
        "                 ^~\n"
        "attn.tsr:1:1: note: K declared here\n"
        "x = 1\n"
        "^\n"
        "1 error generated."
    )


def test_warnings_render_but_do_not_count_as_errors() -> None:
    source = SourceFile("w.tsr", "x = 1\n")
    diags = Diagnostics()
    diags.warning("unused value", Span(source, 1, 1, 1, 2))
    diags.check()  # no error: does not raise
    assert diags.error_count == 0
    assert render(diags.items) == "w.tsr:1:1: warning: unused value\nx = 1\n^"


def test_caret_lines_up_under_tabs() -> None:
    source = SourceFile("t.tsr", "\tx = $\n")
    diags = Diagnostics()
    diags.error("bad", Span(source, 1, 6, 1, 7))
    assert render(diags.items).splitlines()[2] == "\t    ^"


def test_error_limit_stops_and_says_so() -> None:
    source = SourceFile("t.tsr", "x\n")
    diags = Diagnostics()
    for i in range(ERROR_LIMIT + 5):
        diags.error(f"error {i}", Span(source, 1, 1, 1, 2))
    assert diags.error_count == ERROR_LIMIT
    assert "too many errors" in diags.items[-1].notes[-1].message


def test_many_broken_definitions_are_each_reported() -> None:
    text = "".join(f"def f{i}(x)\n    return x\n\n" for i in range(5))
    _, diags = parse_text(text)
    assert [d.span.line for d in diags.items] == [1, 4, 7, 10, 13]


@pytest.mark.parametrize("text", ["", "\n\n   \n", "\t\n"])
def test_empty_file(text: str) -> None:
    _, diags = parse_text(text, "empty.tsr")
    assert [d.render() for d in diags.items] == [
        "empty.tsr: error: empty file: there is nothing to compile"
    ]


def test_file_with_only_comments() -> None:
    _, diags = parse_text("# nothing yet\n\n# still nothing\n", "c.tsr")
    assert [d.render() for d in diags.items] == [
        "c.tsr: error: file has no code, only comments and blank lines"
    ]


def test_missing_trailing_newline_is_fine() -> None:
    module, diags = parse_text("def f(x):\n    return x")
    assert module is not None and not diags.items


def test_bom_is_dropped() -> None:
    assert decode_source("b.tsr", b"\xef\xbb\xbfx = 1\n").text == "x = 1\n"


def test_compile_error_carries_diagnostics() -> None:
    with pytest.raises(tessera.CompileError) as info:
        tessera.compile("def f(x)\n    return x\n", filename="k.tsr")
    assert len(info.value.diagnostics) == 1
    assert HEADLINE.findall(str(info.value)) == [
        "k.tsr:1:9: error: expected ':' after the function signature"
    ]


def test_inspect_ir_of_a_kernel_not_lowered_yet_says_so() -> None:
    program = tessera.compile(BRANCH_WITH_STATEMENTS, filename="k.tsr", target="opencl")
    with pytest.raises(
        NotImplementedError, match=r"k\.tsr:1:1: 'normalize_if': the opencl backend"
    ):
        program.inspect_ir("target")
    with pytest.raises(tessera.OptionsError, match="'sched' stage depends on the target"):
        tessera.compile("x = 1\n").inspect_ir("sched")
    with pytest.raises(NotImplementedError):
        program.load()
    with pytest.raises(ValueError, match="unknown stage 'sass'"):
        program.inspect_ir("sass")


def test_every_diagnostic_names_its_file(tmp_path: Path) -> None:
    """Tools that sort or link diagnostics read ``file``: from ``compile_file`` it is
    the path given, for located and location-less diagnostics alike."""
    broken = tmp_path / "broken.tsr"
    broken.write_text("def f(x)\n    return x\n\ndef g(y)\n    return y\n")
    empty = tmp_path / "empty.tsr"
    empty.write_text("")
    for path in (broken, empty):
        with pytest.raises(tessera.CompileError) as info:
            tessera.compile_file(path)
        assert {d.file for d in info.value.diagnostics} == {str(path)}
