"""The grammar, the AST builder and the canonical printer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.transpiler.frontend import ast
from tessera.transpiler.frontend.builder import Builder
from tessera.transpiler.frontend.parser import _parser

from .conftest import EXAMPLES, SEEDS
from .helpers import assert_round_trip, canonical, parse_ok, parse_text

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("path", SEEDS + EXAMPLES, ids=[p.name for p in SEEDS + EXAMPLES])
def test_file_parses_and_round_trips(path: Path) -> None:
    assert_round_trip(path.read_text(encoding="utf-8"))


def test_every_seed_snippet_is_present() -> None:
    """The seed documents' snippets (seed 004's five and seed 002's kernel)."""
    names = {p.stem for p in SEEDS}
    assert {
        "seed004_modeling",
        "seed004_kernel_autotune",
        "seed004_verify_numerics",
        "seed004_schedule_inheritance",
        "seed004_stdlib_import",
        "seed002_flash_attention",
    } <= names


# Each case: source, and its canonical form. Together they cover every
# construct the language reference lists.
CANONICAL = [
    (
        "several decorators on one line",
        "@jit @autodiff\ndef f(x):\n    return x\n",
        "@jit\n@autodiff\ndef f(x):\n    return x\n",
    ),
    (
        "keyword-only parameters",
        "def f(a: int, *, b: float = 0.5, c: bool):\n    pass\n",
        "def f(a: int, *, b: float = 0.5, c: bool):\n    pass\n",
    ),
    ("untyped default", "def f(a, b=2):\n  pass\n", "def f(a, b=2):\n    pass\n"),
    (
        "tensor type with policies",
        'def f(x: Tensor["B*H","S", 64, bf16 @accum(f32) @stochastic_round]) -> Tile:\n pass\n',
        'def f(x: Tensor["B*H", "S", 64, bf16 @accum(f32) @stochastic_round]) -> Tile:\n    pass\n',
    ),
    (
        "policies after brackets",
        'def f(c: KVCache["B", bf16] @rolling_window @device(gpu)):\n pass\n',
        'def f(c: KVCache["B", bf16] @rolling_window @device(gpu)):\n    pass\n',
    ),
    ("semicolons", "a = 1; b = 2;\n", "a = 1\nb = 2\n"),
    ("tuple targets", "q,k,v = split(x)\n", "q, k, v = split(x)\n"),
    ("one-element tuple", "m = full((T.m,), -INF)\n", "m = full((T.m,), -INF)\n"),
    (
        "slices and None",
        "y = l[:, None]\nz = x[1:2, ::3, ...]\n",
        "y = l[:, None]\nz = x[1:2, ::3, ...]\n",
    ),
    (
        "one-line bodies",
        "if causal: mask(S)\nfor i in r: acc += i\n",
        "if causal:\n    mask(S)\nfor i in r:\n    acc += i\n",
    ),
    (
        "elif chain",
        "if a:\n x = 1\nelif b:\n x = 2\nelse:\n x = 3\n",
        "if a:\n    x = 1\nelif b:\n    x = 2\nelse:\n    x = 3\n",
    ),
    (
        "with several items",
        'with device(gpu), prefetch(c, into="smem") as p:\n  pass\n',
        'with device(gpu), prefetch(c, into="smem") as p:\n    pass\n',
    ),
    (
        "return of a tuple",
        "def f():\n    return cast_like(y, x), cache\n",
        "def f():\n    return cast_like(y, x), cache\n",
    ),
    (
        "matmul operator and precedence",
        "y = (a @ b) @ c + d * (e - f) ** -2\n",
        "y = a @ b @ c + d * (e - f) ** -2\n",
    ),
    (
        "right operand keeps its parentheses",
        "y = a - (b - c)\nz = a / (b * c)\n",
        "y = a - (b - c)\nz = a / (b * c)\n",
    ),
    (
        "unary minus binds looser than power",
        "y = -x ** 2\nz = (-x) ** 2\n",
        "y = -x ** 2\nz = (-x) ** 2\n",
    ),
    (
        "boolean logic and comparisons",
        "ok = not a and (b or c) and 0 <= i < n and k not in s\n",
        "ok = not a and (b or c) and 0 <= i < n and k not in s\n",
    ),
    (
        "mask operators bind as in Python",
        "m = ((x > 0.0) & (y < 1.0)) | ~(x > y) ^ (x == y)\nk = (1 | 2) & 3\nn = x < (1 & 2)\n",
        "m = (x > 0.0) & (y < 1.0) | ~(x > y) ^ (x == y)\nk = (1 | 2) & 3\nn = x < 1 & 2\n",
    ),
    ("conditional expression", "s = 1.0 if causal else 0.5\n", "s = 1.0 if causal else 0.5\n"),
    (
        "method chain with spaces",
        "s = Schedule().block(m=[64,128]) .warps([4,8])\n",
        "s = Schedule().block(m=[64, 128]).warps([4, 8])\n",
    ),
    (
        "multi-line import with comments",
        "from tessera.stdlib import (\n    # kernels\n    softmax,  # safe\n"
        "    layernorm as ln,\n)\n",
        "from tessera.stdlib import softmax, layernorm as ln\n",
    ),
    ("plain import", "import tessera.stdlib as std\n", "import tessera.stdlib as std\n"),
    (
        "dict and list literals",
        "space = {\"BM\": [64, 128], 'BN': []}\n",
        'space = {"BM": [64, 128], "BN": []}\n',
    ),
    ("string escapes and concatenation", "s = 'a\"b' \"\\n\" '\\t'\n", 's = "a\\"b\\n\\t"\n'),
    (
        "numbers",
        "a = 1_000; b = 1.; c = .5; d = 1e-5; e = 2.5E3\n",
        "a = 1000\nb = 1.0\nc = 0.5\nd = 1e-5\ne = 2500.0\n",
    ),
    ("ellipsis body", "def f(x):\n    ...\n", "def f(x):\n    ...\n"),
    ("comments anywhere", "# top\nx = f(a,  # arg\n      b)  # end\n# tail", "x = f(a, b)\n"),
    ("line continuation", "x = a + \\\n    b\n", "x = a + b\n"),
    ("CRLF line endings", "def f(x):\r\n    return x\r\n", "def f(x):\n    return x\n"),
    (
        "tabs for indentation",
        "def f(x):\n\tif x:\n\t\treturn x\n\treturn x\n",
        "def f(x):\n    if x:\n        return x\n    return x\n",
    ),
    (
        "augmented assignment",
        "acc += a @ b\nx -= 1; y *= 2; z /= 3; w @= v\n",
        "acc += a @ b\nx -= 1\ny *= 2\nz /= 3\nw @= v\n",
    ),
    ("attribute of an integer", "x = (1).real\n", "x = (1).real\n"),
]


@pytest.mark.parametrize(("source", "expected"), [c[1:] for c in CANONICAL],
                         ids=[c[0] for c in CANONICAL])  # fmt: skip
def test_canonical_form(source: str, expected: str) -> None:
    assert canonical(source) == expected
    assert_round_trip(source)


def test_top_level_functions_are_separated_by_two_blank_lines() -> None:
    text = canonical("x = 1\ndef f():\n    pass\ndef g():\n    pass\ny = 2\n")
    assert text == "x = 1\n\n\ndef f():\n    pass\n\n\ndef g():\n    pass\n\n\ny = 2\n"


def test_spans_point_at_the_source() -> None:
    module = parse_ok(
        '@kernel\ndef f(x: Tensor["N", f32]) -> Tensor["N", f32]:\n    return relu(x)\n'
    )
    func = module.body[0]
    assert isinstance(func, ast.FunctionDef)
    assert (func.span.line, func.span.column, func.span.end_line) == (1, 1, 3)
    param = func.params[0]
    assert (param.span.line, param.span.column, param.span.end_column) == (2, 7, 26)
    ret = func.body[0]
    assert isinstance(ret, ast.Return) and isinstance(ret.value, ast.Call)
    assert (ret.value.span.line, ret.value.span.column, ret.value.span.end_column) == (3, 12, 19)


def test_ast_nodes_are_frozen_and_compare_without_spans() -> None:
    a = parse_ok("x = a + b\n")
    b = parse_ok("\n\nx   =   a+b  # same tree, other place\n")
    assert a == b
    assert a.body[0].span.line != b.body[0].span.line
    with pytest.raises(AttributeError):
        a.body[0].target = None  # type: ignore[misc]


def test_elif_is_a_nested_if() -> None:
    module = parse_ok("if a:\n    x = 1\nelif b:\n    x = 2\n")
    outer = module.body[0]
    assert isinstance(outer, ast.If) and isinstance(outer.orelse[0], ast.If)
    assert outer.orelse[0].orelse == ()


def test_keywords_are_reserved_everywhere() -> None:
    """`x = def` must not quietly parse `def` as a variable."""
    _, diags = parse_text("x = def\n")
    assert diags.error_count == 1


def test_type_arguments_keep_their_kinds() -> None:
    module = parse_ok('def f(x: Tensor["B", 64, D, bf16 @accum(f32)]):\n    pass\n')
    annotation = module.body[0].params[0].annotation
    kinds = [type(a).__name__ for a in annotation.args]
    assert kinds == ["StrLit", "IntLit", "TypeExpr", "TypeExpr"]
    dtype = annotation.args[3]
    assert dtype.name == "bf16" and dtype.policies[0].name == "accum"


def test_every_grammar_rule_has_a_builder_method() -> None:
    """Lark would otherwise hand a raw tree to the next stage."""
    lark = _parser()[0]
    # A '?rule' alternative of one symbol is inlined and never calls the builder.
    names = {
        r.alias or r.origin.name
        for r in lark.rules
        if r.alias or not (r.options.expand1 and len(r.expansion) == 1)
    }
    missing = {str(n) for n in names if not str(n).startswith("_")} - set(dir(Builder))
    assert not missing
