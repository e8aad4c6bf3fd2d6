"""Fuzz tier: random and mutated sources give a result or a diagnostic, never a traceback.

Whatever parses must also survive the round trip through the canonical printer,
so every accepted mutant doubles as a printer test.
"""

from __future__ import annotations

import re
import signal
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tessera
from tessera.transpiler.frontend import ast
from tessera.transpiler.frontend.printer import print_module
from tessera.transpiler.frontend.source import SourceReadError, decode_source
from tessera.transpiler.options import Options
from tessera.transpiler.pipeline import Program

from .conftest import EXAMPLES, ROOT, SEEDS
from .helpers import parse_ok, parse_text

pytestmark = pytest.mark.fuzz


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``--fuzz-shards N``: each test N times, each drawing its share of the examples."""
    shards = metafunc.config.getoption("--fuzz-shards")
    if shards > 1:
        metafunc.parametrize("fuzz_shard", range(shards), indirect=True)


@pytest.fixture(autouse=True)
def fuzz_shard(request: pytest.FixtureRequest) -> int:
    """The shard a case belongs to (0 without ``--fuzz-shards``); each draws at random."""
    return int(getattr(request, "param", 0))


LIBRARY = sorted((ROOT / "tessera" / "stdlib").glob("*.tsr"))
CORPUS = [p.read_text(encoding="utf-8") for p in EXAMPLES + SEEDS + LIBRARY]
#: Every target and arch a mutant is compiled for, one drawn per case.
TARGETS = [("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", "gfx90a"), ("cpu", "native"),
           ("opencl", "generic")]  # fmt: skip
#: A case that runs longer than this is a hang.
HANG_SECONDS = 60
VOCAB = [
    "def", "return", "if", "elif", "else", "for", "in", "with", "as", "from", "import",
    "pass", "and", "or", "not", "is", "None", "True", "False", "while", "break", "lambda",
    "x", "y", "Tensor", "tile", "kernel", "f32", "bf16", '"S"', '"B*H"', "0", "7", "1.5",
    "1e-5", "(", ")", "[", "]", "{", "}", ":", ",", ";", ".", "=", "+=", "+", "-", "*",
    "/", "//", "%", "@", "**", "->", "==", "<", "!=", "...", "\n", "\n    ", "\n\t",
    "\n        ", "#c\n", "\\\n", '"', "'", '"""', "$", "é", "\x00", "\r\n", "?", "!",
    "INF", "int", "float", "400", "@kernel\ndef f(x: Tensor['N', f32]):\n    return ",
]  # fmt: skip
TOKEN = re.compile(r"\w+|\s+|.", re.S)


def check(text: str, target: str = "cuda", arch: str | None = None) -> None:
    """The property: whatever parses round-trips through the canonical printer, and the
    whole pipeline ends in a result or in located diagnostics, never in a traceback
    (nor a hang: a case has HANG_SECONDS)."""
    signal.signal(signal.SIGALRM, _hang)
    signal.alarm(HANG_SECONDS)
    try:
        _check(text, target, arch)
    finally:
        signal.alarm(0)


def _hang(signum: int, frame: object) -> None:
    raise TimeoutError(f"the compiler ran for over {HANG_SECONDS} s on this input")


def _check(text: str, target: str, arch: str | None) -> None:
    module, diags = parse_text(text, "fuzz.tsr")
    if module is not None and not diags.error_count:
        printed = print_module(module)
        again, _ = parse_text(printed, "printed.tsr")
        assert again == module, printed
        assert print_module(again) == printed
    try:
        assert tessera.compile(text, filename="fuzz.tsr", target=target, arch=arch).source
    except tessera.StageNotImplemented as exc:  # a kernel this backend does not lower yet
        assert "does not lower" in str(exc)
    except tessera.CompileError as exc:
        assert exc.diagnostics
        last_line = text.count("\n") + 2
        for diagnostic in exc.diagnostics:
            if diagnostic.span is not None:
                assert 1 <= diagnostic.span.line <= last_line
        assert str(exc)


def test_lone_carriage_returns_do_not_count_as_lines() -> None:
    """A file with lone CRs and a form feed: the error at its end is on its last line
    (line ends were counted as Python's splitlines counts them, which put it three lines
    past the end; found by --fuzz-long)."""
    text = "\x0c\r# a comment\n\r# another\n\n@kernel\n"
    check(text + 'def f(x: Tensor["N", f32]) -> Tensor["N", f32]:\n', "cpu", None)


#: What an extreme-number mutation puts in place of a number.
EXTREMES = ["0", "-1", "0.0", "-0.0", "1e308", "1e-320", "9223372036854775807",
            "9223372036854775808", "99999999999999999999999", "2**63", "0x10", "1_000"]  # fmt: skip
#: What a dim string becomes: sizes that are always 0, negative or divide by zero.
ZERO_DIMS = ['"S-S"', '"0*S"', '"S%1"', '"S/0"', '"S%0"', '"-S"', '"0"', '"S-S+1"']
#: Characters that end or splice lines for a C compiler but not for Tessera, or not alike.
STRAYS = ["\r", "\\", "\\\n", "\t", "\f", "\v", "\u2028", "*/", "/*", "\x00"]
_NUMBER = re.compile(r"\b\d+(?:\.\d*)?(?:e-?\d+)?\b")
_DIM = re.compile(r'"[A-Za-z_][^"\n]*"')


@st.composite
def mutants(draw: st.DrawFn) -> str:
    """An example, seed snippet or library kernel, mutated one to four times: lines or
    tokens deleted, duplicated, swapped or inserted, a number made extreme, a dim made
    zero, an indentation changed, a stray control character or backslash put in."""
    text = draw(st.sampled_from(CORPUS))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "insert", "number", "dim",
                                   "indent", "stray"]))  # fmt: skip
        if op in ("number", "dim"):
            found = list((_NUMBER if op == "number" else _DIM).finditer(text))
            if found:
                m = draw(st.sampled_from(found))
                new = draw(st.sampled_from(EXTREMES if op == "number" else ZERO_DIMS))
                text = text[: m.start()] + new + text[m.end() :]
            continue
        if op == "stray":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from(STRAYS)) + text[at:]
            continue
        unit = "line" if op == "indent" else draw(st.sampled_from(["line", "token"]))
        parts = text.split("\n") if unit == "line" else TOKEN.findall(text)
        if len(parts) < 2:
            break
        i = draw(st.integers(0, len(parts) - 1))
        j = draw(st.integers(0, len(parts) - 1))
        if op == "delete":
            del parts[i]
        elif op == "duplicate":
            parts.insert(i, parts[i])
        elif op == "swap":
            parts[i], parts[j] = parts[j], parts[i]
        elif op == "indent":
            parts[i] = draw(st.sampled_from(["", " ", "    ", "\t", "        "])) + parts[i].lstrip(
                " \t"
            )
        else:
            parts.insert(i, draw(st.sampled_from(VOCAB)))
        text = ("\n" if unit == "line" else "").join(parts)
    return text


token_soup = st.lists(
    st.tuples(st.sampled_from(VOCAB), st.sampled_from(["", " "])), max_size=60
).map(lambda pairs: "".join(a + b for a, b in pairs))


_atoms = st.sampled_from(["x", "y", "T.m", "0", "2", "1.5", '"s"', "None", "True", "-INF", "..."])
_binary = st.sampled_from(["+", "-", "*", "/", "//", "%", "@", "**", "<", "==", "and", "or"])
#: Random expressions with every compound operand parenthesised: whatever the
#: printer drops or keeps, the reparsed tree must be the same.
expressions = st.recursive(
    _atoms,
    lambda inner: st.one_of(
        st.tuples(inner, _binary, inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["-", "+", "not "]), inner).map(lambda t: f"({t[0]}{t[1]})"),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
        st.lists(inner, max_size=3).map(lambda a: f"f({', '.join(a)})"),
        st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}, :, None]"),
        st.tuples(inner, inner).map(lambda t: f"({t[0]}, {t[1]})"),
        inner.map(lambda e: f"({e}).attr"),
    ),
    max_leaves=12,
)


@given(expressions)
def test_random_expressions_round_trip(expression: str) -> None:
    text = f"y = {expression}\n"
    parse_ok(text)  # the generator writes only valid syntax
    check(text)


DIMS = ['"M"', '"N"', '"K"', "64", '"B*H"', '"S/2"', "1", '"x y"', '""', '"S-1"', "D"]
DTYPE_NAMES = ["f32", "bf16", "f16", "tf32", "i8", "i4", "fp8_e4m3", "float", "bfloat"]
POLICIES = ["@accum(f32)", "@accum(bf16)", "@saturate", "@stochastic_round", "@loss_scale(0)"]
OPS = ["matmul", "relu", "softmax", "layernorm", "cast", "transpose", "reshape", "dropout"]


def _nodes(tree: ast.Node) -> list[ast.Node]:
    found: list[ast.Node] = []

    def visit(value: object) -> None:
        if isinstance(value, ast.Node):
            found.append(value)
            for name in value.__dataclass_fields__:
                if name != "span":
                    visit(getattr(value, name))
        elif isinstance(value, tuple):
            for item in value:
                visit(item)

    visit(tree)
    return found


def _swap(tree: object, target: ast.Node, new: ast.Node) -> object:
    """``tree`` with the node ``target`` (by identity) replaced by ``new``."""
    if tree is target:
        return new
    if isinstance(tree, tuple):
        return tuple(_swap(item, target, new) for item in tree)
    if isinstance(tree, ast.Node):
        changes = {
            name: _swap(getattr(tree, name), target, new)
            for name in tree.__dataclass_fields__
            if name != "span"
        }
        return replace(tree, **changes)
    return tree


@st.composite
def semantic_mutants(draw: st.DrawFn) -> str:
    """A valid example with its meaning broken: arguments swapped or dropped, dims,
    dtypes and policies altered, one operation called in place of another."""
    module = parse_ok(draw(st.sampled_from(CORPUS[: len(EXAMPLES)])))
    for _ in range(draw(st.integers(1, 3))):
        nodes = _nodes(module)
        calls = [n for n in nodes if isinstance(n, ast.Call)]
        types = [n for n in nodes if isinstance(n, ast.TypeExpr) and n.args]
        kind = draw(st.sampled_from(["swap args", "drop arg", "dim", "dtype", "policy", "op"]))
        if kind in ("swap args", "drop arg", "op") and calls:
            call = draw(st.sampled_from(calls))
            args = list(call.args)
            if kind == "swap args" and len(args) >= 2:
                i, j = draw(st.permutations(range(len(args))))[:2]
                args[i], args[j] = args[j], args[i]
                new = replace(call, args=tuple(args))
            elif kind == "drop arg" and args:
                new = replace(call, args=tuple(args[1:]))
            else:
                new = replace(call, func=ast.Name(draw(st.sampled_from(OPS)), span=call.span))
            module = _swap(module, call, new)
        elif types:
            node = draw(st.sampled_from(types))
            pool = {"dim": DIMS, "dtype": DTYPE_NAMES}.get(kind, POLICIES)
            text = draw(st.sampled_from(pool))
            args = list(node.args)
            last = args[-1]
            if kind == "dim":
                args[draw(st.integers(0, len(args) - 1))] = _dim_node(text, node.span)
            elif kind == "dtype":
                args[-1] = ast.TypeExpr(text, span=node.span)
            elif isinstance(last, ast.TypeExpr):
                policy = parse_ok(f"def f(x: Tensor[f32 {text}]):\n    pass\n")
                extra = policy.body[0].params[0].annotation.args[0].policies
                args[-1] = replace(last, policies=last.policies + extra)
            module = _swap(module, node, replace(node, args=tuple(args)))
    return print_module(module)


def _dim_node(text: str, span: object) -> ast.Node:
    if text.startswith('"'):
        return ast.StrLit(text.strip('"'), span=span)
    if text.isdigit():
        return ast.IntLit(int(text), span=span)
    return ast.TypeExpr(text, span=span)


@given(semantic_mutants(), st.sampled_from(TARGETS))
def test_semantic_mutations(text: str, target: tuple[str, str]) -> None:
    check(text, *target)


@given(token_soup)
def test_token_soup(text: str) -> None:
    check(text)


@given(mutants(), st.sampled_from(TARGETS))
def test_mutated_examples(text: str, target: tuple[str, str]) -> None:
    check(text, *target)


@given(st.text(max_size=200))
def test_arbitrary_text(text: str) -> None:
    check(text)


@given(st.binary(max_size=200))
def test_arbitrary_bytes(data: bytes) -> None:
    try:
        source = decode_source("fuzz.tsr", data)
    except SourceReadError as exc:
        assert exc.span is not None and exc.span.line >= 1
        return
    try:
        Program(source, Options())
    except tessera.CompileError as exc:
        assert exc.diagnostics


#: Found by --fuzz-long: a weight loaded as f32 and cast to bf16 for the product was
#: staged at the width of the first load (bf16), so sm_90a's tiles asked for 320 KiB of
#: shared memory and the compiler stopped with an internal error.
WIDENED_IN_THE_LOOP = """\
@kernel
def w8a16(x: Tensor["M", "K", bf16], w: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(x.shape[-1], T.k):
        b = tile.cast(tile.load(w, kb, cols=T.n), bf16)
        acc += tile.dot(tile.load(x, rows=T.m, cols=kb), b)
    return acc
"""


@pytest.mark.parametrize(("target", "arch"), TARGETS, ids=lambda v: v)
def test_a_tile_widened_in_the_loop_is_staged_at_its_own_width(target: str, arch: str) -> None:
    check(WIDENED_IN_THE_LOOP, target, arch)
