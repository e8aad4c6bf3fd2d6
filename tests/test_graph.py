"""The Graph IR: dims, types, guards, effects, passes, fusion and the verifier."""

from __future__ import annotations

import re
from dataclasses import replace
from fractions import Fraction

import pytest

import tessera
from tessera.transpiler.frontend.diagnostics import Diagnostics
from tessera.transpiler.graph.dims import Dim, DimSyntaxError, parse_dim
from tessera.transpiler.graph.dtypes import DTYPES, promote
from tessera.transpiler.graph.ir import Block, Function, GraphModule, Op
from tessera.transpiler.graph.not_yet import NOT_YET
from tessera.transpiler.graph.passes import GRAPH_PASSES, PassError, run_graph_passes
from tessera.transpiler.graph.printer import value_names
from tessera.transpiler.graph.sema import analyze
from tessera.transpiler.graph.verify import VerifyError, verify
from tessera.transpiler.options import Options
from tessera.transpiler.schedule.ir import param_name

from .conftest import SEEDS
from .helpers import parse_ok

pytestmark = pytest.mark.unit


def graph(text: str, **options: object) -> GraphModule:
    """The Graph IR after all passes."""
    return tessera.compile(text, filename="g.tsr", **options).ir("graph")


def analysed(text: str) -> GraphModule:
    """The Graph IR straight out of semantic analysis, before any pass."""
    diags = Diagnostics()
    module = analyze(parse_ok(text), Options(), diags)
    assert not diags.error_count, [d.render() for d in diags.items]
    return module


def kinds(module: GraphModule, function: int = 0) -> list[str]:
    return [op.kind for op in module.functions[function].body.ops]


# ------------------------------------------------------------------------- dims


@pytest.mark.parametrize(
    ("text", "canonical"),
    [("B*H", "B*H"), ("H*B", "B*H"), ("(B*H)/H", "B"), ("S/2", "S/2"), ("2*S+1", "2*S + 1"),
     ("S - 1", "S - 1"), ("-S + 2*S", "S"), ("E/heads", "E/heads"), ("64", "64")],
)  # fmt: skip
def test_dims_have_one_canonical_form(text: str, canonical: str) -> None:
    assert str(parse_dim(text)) == canonical
    assert parse_dim(canonical) == parse_dim(text)


def test_dim_algebra() -> None:
    b, h = Dim.sym("B"), Dim.sym("H")
    assert b * h == h * b
    assert (b * h) / h == b
    assert (b + 1) * 2 == b * 2 + 2
    assert parse_dim("S/2").is_integral is False and parse_dim("2*S").is_integral
    assert parse_dim("B*H").substitute({"B": 4, "H": 8}).constant == 32
    assert parse_dim("64").constant == 64 and parse_dim("S").constant is None


def test_a_spelled_constant_is_its_value_and_keeps_its_spelling_through_arithmetic() -> None:
    """A size fixed by a caller (``Dim.named``) equals, hashes and prints as its number;
    arithmetic of constants keeps the spelling (``D/2``, ``4*D``), a result with a
    symbol in it does not need one, and substituting a name gives the spelled dim."""
    d = Dim.named(64, Dim.sym("D"))
    assert d == Dim.const(64) and hash(d) == hash(Dim.const(64)) and str(d) == "64"
    assert (d / 2).spelled == parse_dim("D/2") and (d / 2).constant == 32
    assert (Dim.const(4) * d).spelled == parse_dim("4*D") and (d - d).spelled is None
    assert (Dim.sym("S") * d).spelled is None and (d + 0) is d
    assert parse_dim("D/2").substitute({"D": d}).spelled == parse_dim("D/2")
    assert Dim.sym("D").substitute({"D": d}).spelled == Dim.sym("D")


@pytest.mark.parametrize(
    ("text", "values", "value"),
    [("S", {"S": 5}, 5), ("S/2", {"S": 6}, 3), ("S/2", {"S": 5}, Fraction(5, 2)),
     ("B*H*S", {"B": 2, "H": 3, "S": 7}, 42), ("E/heads", {"E": 96, "heads": 12}, 8),
     ("2*S - 3", {"S": 4}, 5), ("(B*H)/H + S/3", {"B": 4, "H": 9, "S": 2}, Fraction(14, 3))],
)  # fmt: skip
def test_a_dim_has_the_value_its_substitution_has(
    text: str, values: dict[str, int], value: int | Fraction
) -> None:
    dim = parse_dim(text)
    assert dim.value(values) == value and dim.substitute(values) == Dim.const(value)


@pytest.mark.parametrize(
    ("text", "offset"), [("", 0), ("S$", 1), ("S/0", 1), ("(S", 0), ("S +", 3), ("1.5", 1)]
)
def test_bad_dims_point_at_the_problem(text: str, offset: int) -> None:
    with pytest.raises(DimSyntaxError) as info:
        parse_dim(text)
    assert info.value.offset == offset


def test_promotion() -> None:
    f32, bf16, f16, i8 = (DTYPES[n] for n in ("f32", "bf16", "f16", "i8"))
    assert promote(bf16, f32) is f32
    assert promote(bf16, f16) is f32
    assert promote(i8, bf16) is bf16
    assert promote(bf16, bf16) is bf16


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("10.0 ** 400", "the result is too large for a number"),
        ("7 ** 7 ** 7", "the exponent 823543 is too large for a compile-time number"),
        ("1 / 0", "division by zero"),
        ("(-8) ** 0.5", "the result is not a real number"),
        ("2 @ 3", "'@' multiplies matrices, not numbers"),
        ("int(INF)", "int(inf) is not a finite number"),
        ("float(10 ** 400)", "float(10000000000000000...) is not a finite number"),
        ("log(0.0)", "log(0.0) has no finite value"),
        ("sqrt(-1)", "sqrt(-1) has no finite value"),
        ("exp(1000.0)", "exp(1000.0) has no finite value"),
    ],
)
def test_compile_time_arithmetic_errors(expression: str, message: str) -> None:
    with pytest.raises(tessera.CompileError) as info:
        tessera.compile(f"x = {expression}\n")
    assert [d.message for d in info.value.diagnostics] == [message]


@pytest.mark.parametrize(
    "scale",
    ["1.0 / 8", "rsqrt(64.0)", "1 / sqrt(64)", "tanh(0.0) + 0.125", "sigmoid(-1000.0) + 0.125"],
)
def test_compile_time_arithmetic_folds(scale: str) -> None:
    module = graph(f"scale = {scale}\n@kernel\ndef f(x: Tensor['N', f32]):\n    return x * scale\n")
    (mul,) = module.functions[0].body.ops
    assert dict(mul.attrs) == {"b": 0.125}


def test_math_of_a_number_in_a_function_folds() -> None:
    module = graph(
        "@kernel\ndef f(x: Tensor['N', f32]):\n    return x * sqrt(float(x.shape[0] * 0 + 4))\n"
    )
    (mul,) = module.functions[0].body.ops
    assert dict(mul.attrs) == {"b": 2.0}


# ----------------------------------------------------------- types and guards


def test_matmul_accumulates_in_f32_and_rounds_at_the_return() -> None:
    module = graph(
        "@kernel\ndef f(A: Tensor['M', 'K', bf16], B: Tensor['K', 'N', bf16])"
        " -> Tensor['M', 'N', bf16 @accum(f32)]:\n    return A @ B\n"
    )
    matmul, cast = module.functions[0].body.ops
    assert str(matmul.result.type) == "tensor<[M, N], f32>"
    assert (cast.kind, str(cast.result.type)) == ("cast", "tensor<[M, N], bf16>")


def test_symbol_against_constant_becomes_a_guard() -> None:
    module = graph(
        "@kernel\ndef f(A: Tensor['M', 'K', f32], B: Tensor[64, 'N', f32])"
        " -> Tensor['M', 'N', f32]:\n    return A @ B\n"
    )
    (guard,) = module.functions[0].guards
    assert str(guard) == "K == 64" and guard.reason.startswith("@: inner dimension")
    assert guard.span.line == 3


def test_fractional_dims_and_split_qkv_give_divisibility_guards() -> None:
    module = graph(
        "@kernel\ndef f(x: Tensor['S', 'C', f32], y: Tensor['S/2', f32], *, heads: int)"
        " -> Tensor['S', 'C', f32]:\n    q, k, v = split_qkv(x, heads=heads)\n    return x\n"
    )
    assert [str(g) for g in module.functions[0].guards] == [
        "S % 2 == 0",
        "C % 3*heads == 0",
    ]


def test_defines_specialise_dims() -> None:
    module = graph(
        "@kernel\ndef f(x: Tensor['S', 'D', f32]) -> Tensor['S', 'D', f32]:\n"
        "    return softmax(x)\n",
        defines={"D": 64},
    )
    assert str(module.functions[0].params[0].value.type) == "tensor<[S, 64], f32>"


def test_dropout_records_an_rng_effect_that_survives_passes() -> None:
    module = graph(
        "@kernel\ndef f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n"
        "    y = dropout(x, 0.1, seed=1)\n    return x\n"
    )
    op, copy = module.functions[0].body.ops  # the unread dropout, and x returned as a copy
    assert (op.kind, op.effects) == ("dropout", ("rng",))
    assert (copy.kind, copy.operands) == ("reshape", (module.functions[0].params[0].value,))


def test_effects_pin_operations_in_program_order() -> None:
    module = graph(
        "@kernel\ndef f(x: Tensor['N', f32], c: KVCache['B', 'H', 'S', 'D', bf16],"
        " k: Tensor['B', 'H', 'S', 'D', bf16]) -> Tensor['N', f32]:\n"
        "    a = dropout(x, 0.1, seed=1)\n    c2 = c.append(k, k)\n"
        "    with mesh(axes={'dp': 2}):\n        s = all_reduce(x, op='max')\n"
        "    b = dropout(x, 0.2, seed=2)\n    return x\n"
    )
    ops = module.functions[0].body.ops
    assert [(op.kind, op.effects) for op in ops] == [
        ("dropout", ("rng",)),
        ("kvcache.append", ("state",)),
        ("kvcache.advance", ("state",)),
        ("all_reduce", ("collective",)),
        ("dropout", ("rng",)),
        ("reshape", ()),  # x returned: a copy
    ]
    assert [g.kind for g in module.functions[0].groups] == [
        "elementwise", "state", "state", "collective", "elementwise", "elementwise",
    ]  # fmt: skip


def test_effects_inside_loops_and_branches_are_kept() -> None:
    """A loop or branch that yields nothing but stores is itself a store: dead-code removal
    keeps it, at every depth."""
    module = graph(
        "@kernel\ndef f(x: Tensor['M', 'K', f32], y: Tensor['M', 'K', f32], *, flag: bool):\n"
        "    T = tile.context()\n"
        "    for kb in tile.range_n(x.shape[1], T.k):\n"
        "        tile.store(y, tile.load(x, rows=T.m, cols=kb), rows=T.m, cols=kb)\n"
        "    if flag:\n"
        "        for kb in tile.range_n(x.shape[1], T.k):\n"
        "            if flag:\n"
        "                tile.store(y, tile.load(x, rows=T.m, cols=kb), rows=T.m, cols=kb)\n"
    )
    loop, branch = module.functions[0].body.ops
    assert [op.kind for op in loop.regions[0].ops] == ["tile.load", "tile.store"]
    (inner,) = branch.regions[0].ops
    (inner_branch,) = inner.regions[0].ops
    assert [op.kind for op in inner_branch.regions[0].ops] == ["tile.load", "tile.store"]


def test_autodiff_adds_the_backward_function_without_a_warning() -> None:
    program = tessera.compile(
        "@jit @autodiff\ndef f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return x\n"
    )
    assert program.diagnostics == ()
    assert [f.name for f in program.ir("graph").functions] == ["f", "f_vjp"]


#: A program that asks for every feature that does nothing yet, and where it warns.
NOT_YET_PROGRAM = """\
@autodiff @verify.numerics(stable=True)
@kernel
def f(x: Tensor["R", "C", bf16 @stochastic_round], y: Tensor["R", "C", fp8_e4m3 @saturate],
      z: Tensor["R", "C", f32 @loss_scale(1024)], w: Tensor["R", "C", bf16 @accum(bf16)],
      c: KVCache["B", "H", "S", "D", bf16] @rolling_window @device(gpu) @paged @checkpointable
      ) -> Tensor["R", "C", f32]:
    with device(gpu), prefetch(x):
        y = x + z
    return y

@kernel
def g(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    T = tile.context()
    return tile.load(x, rows=T.m, vector=T.vector, prefetch=2)
"""
NOT_YET_WARNINGS = [
    (5, 60, "@device"), (5, 73, "@paged"),
    (5, 80, "@checkpointable"), (7, 10, "with device(...)"),
    (7, 23, "with prefetch(...)"), (14, 42, "tile.load: vector="), (14, 61, "tile.load: prefetch="),
]  # fmt: skip


def test_every_feature_without_effect_warns_at_its_line() -> None:
    """Policies, decorators, ``with`` items and load hints that change nothing yet each say
    so where the program asks for them, with what happens instead; none is an error."""
    program = tessera.compile(NOT_YET_PROGRAM, filename="w.tsr", target="cpu")
    got = [(d.span.line, d.span.column, d.message) for d in program.diagnostics]
    features = [feature.split(": ")[-1] for _, _, feature in NOT_YET_WARNINGS]
    assert got == [
        (line, column, f"{shown} is accepted but has no effect yet: {NOT_YET[feature]}")
        for (line, column, shown), feature in zip(NOT_YET_WARNINGS, features, strict=True)
    ]
    assert set(features) == set(NOT_YET)


def test_a_policy_in_a_tuple_result_applies_to_its_value() -> None:
    program = tessera.compile(
        "@kernel\ndef f(x: Tensor['N', f32]) -> (Tensor['N', f32], "
        "Tensor['N', bf16 @stochastic_round]):\n    return x, cast(x, bf16)\n"
    )
    assert program.diagnostics == ()
    assert "stochastic_cast" in [op.kind for op in program.ir("graph").functions[0].body.ops]


def test_a_function_called_twice_warns_once() -> None:
    program = tessera.compile(
        "def h(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    with device(gpu):\n"
        "        y = x * 2.0\n    return y\n\n"
        "@kernel\ndef f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    return h(h(x))\n"
    )
    assert [(d.span.line, d.message.split(" is ")[0]) for d in program.diagnostics] == [
        (2, "with device(...)")
    ]


def test_unused_pure_result_is_a_warning() -> None:
    program = tessera.compile(
        "@kernel\ndef f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    relu(x)\n    return x\n"
    )
    assert [d.message for d in program.diagnostics] == ["the result of 'relu' is not used"]


def test_tile_kernel_carries_loop_values_through_the_loop() -> None:
    module = graph((SEEDS[0].parent.parent.parent / "examples" / "attention.tsr").read_text())
    kernel = module.functions[1]
    assert kernel.kind == "tile"
    loop = next(op for op in kernel.body.ops if op.kind == "tile.for")
    assert [v.name for v in loop.results] == ["acc", "m", "l"]
    region = loop.regions[0]
    assert str(region.args[0].type) == "block<T.n of S>"
    assert [op.kind for op in region.ops if op.kind == "if"] == ["if"]


@pytest.mark.parametrize("seed", ["seed002_flash_attention", "seed004_schedule_inheritance"])
def test_complete_seed_programs_type_check(seed: str) -> None:
    path = next(p for p in SEEDS if p.stem == seed)
    assert tessera.compile_file(path).ir("graph").functions


# -------------------------------------------------------------------- schedules


def schedule_of(text: str) -> str:
    return str(graph(text).functions[0].schedule)


KERNEL = "def f(x: Tensor['M', 'N', f32]):\n    return relu(x)\n"


def test_inheritance_resolves_to_a_point() -> None:
    text = (
        "base = Schedule(block=(128, 128), k=32, warps=8, stages=3)\n"
        f"@kernel.schedule(base.with_block(64, 64).with_warps(4))\n{KERNEL}"
    )
    assert schedule_of(text) == ("Schedule(block_m=64, block_n=64, block_k=32, warps=4, stages=3)")


def test_space_forms_agree() -> None:
    chained = schedule_of(
        "@kernel.schedule(Schedule().block(m=[64, 128], n=[64, 128]) .warps([4, 8]))\n" + KERNEL
    )
    autotune = schedule_of(
        "@kernel.autotune(space=dict(BM=[64, 128], BN=[64, 128], warps=[4, 8]))\n" + KERNEL
    )
    assert chained == autotune == ("Schedule(block_m=[64, 128], block_n=[64, 128], warps=[4, 8])")


def test_printed_schedule_is_valid_input() -> None:
    printed = "Schedule(block_m=64, block_n=128, block_k=32, warps=4, stages=2, swizzle='xor')"
    assert schedule_of(f"@kernel.schedule({printed})\n{KERNEL}") == printed


@pytest.mark.parametrize(
    ("decorators", "message"),
    [
        ("@kernel.schedule(Schedule(warps=3))", "warps is a power of two up to 32, not 3"),
        ("@kernel.schedule(Schedule(stages=0))", "stages takes positive integers, not 0"),
        (
            "@kernel.schedule(Schedule(swizzle='zigzag'))",
            "swizzle is 'xor' or 'none', not 'zigzag'",
        ),
        ("@kernel.schedule(Schedule().with_block(64))", "with_block() takes two sizes"),
        ("@kernel.autotune(space=dict(BQ=[64]))", "the autotune space has no knob 'BQ'"),
        (
            "@kernel.schedule(Schedule(warps=4))\n@kernel.autotune(space=dict(BM=[64]))",
            "a kernel has one schedule",
        ),
    ],
)
def test_bad_schedules(decorators: str, message: str) -> None:
    with pytest.raises(tessera.CompileError) as info:
        tessera.compile(f"{decorators}\n{KERNEL}")
    assert [d.message[: len(message)] for d in info.value.diagnostics] == [message]


# ----------------------------------------------------------------------- passes


def test_pass_order() -> None:
    assert [name for name, _ in GRAPH_PASSES] == [
        "saturate",
        "rows",
        "canonicalize",
        "simplify",
        "attention",
        "dequantized",
        "int8_products",
        "fuse",
    ]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # x itself, which the function returns as a copy: a reshape to its own dims
        ("x * 1.0", ["reshape"]),
        ("1.0 * x + 0.0", ["reshape"]),
        ("x / 1", ["reshape"]),
        ("transpose(transpose(x))", ["reshape"]),
        # a product that no kernel computes: a copy, then a swap of [B*A, C]
        (
            "transpose(transpose(x, (1, 0, 2)), (2, 0, 1))",
            ["transpose", "reshape", "transpose", "reshape"],
        ),
        # two transposes with kernels stay two where their product has none
        ("transpose(x, (1, 0, 2)).T", ["transpose", "transpose"]),
        (
            "transpose(x, (1, 0, 2)) @ transpose(x, (1, 0, 2)).T",
            ["transpose", "transpose", "matmul"],
        ),
        ("cast(x, f32)", ["reshape"]),
        ("cast(cast(x, f32), bf16)", ["cast"]),
        ("x * 2.0", ["mul"]),
        ("x.to(bf16)", ["cast"]),
        ("x.to(f32)", ["reshape"]),
        ("x @ x.T", ["matmul"]),
        ("sum(x, axis=1)", ["transpose", "sum"]),
        ("sum(x.T, axis=1)", ["sum"]),
        ("sum(x, axis=1, keepdims=True)", ["transpose", "sum", "reshape"]),
        ("max(x, axis=0)", ["reshape", "transpose", "max", "reshape"]),
        # the swap of [A*B, C] and the one back cancel, and so do the reshapes between
        ("max(transpose(x, (2, 0, 1)), axis=0)", ["reshape", "max", "reshape"]),
        ("sum(reshape(reshape(x, ('A*B', 'C')), ('A', 'B', 'C')), axis=1)", ["transpose", "sum"]),
        ("softmax(x, axis=1)", ["transpose", "softmax", "transpose"]),
    ],
)
def test_simplification(body: str, expected: list[str]) -> None:
    text = f"@kernel\ndef f(x: Tensor['A', 'B', 'C', f32]):\n    return {body}\n"
    assert kinds(graph(text)) == expected


@pytest.mark.parametrize(
    ("method", "function"),
    [
        ("x.abs().sum(axis=0)", "sum(abs(x), axis=0)"),
        ("x.max(axis=-1, keepdims=True)", "max(x, axis=-1, keepdims=True)"),
        ("x.softmax()", "softmax(x)"),
        ("x.exp().mean()", "mean(exp(x))"),
        ("x.clamp(max=1.0)", "minimum(x, 1.0)"),
        ("x.pow(3) + 1.0", "x ** 3 + 1.0"),
        ("x.astype(bf16)", "x.to(bf16)"),
        ("x.view(-1)", "x.reshape(-1)"),
    ],
)
def test_a_method_is_the_op_of_its_name(method: str, function: str) -> None:
    def ir(body: str) -> str:
        text = f"@kernel\ndef f(x: Tensor['A', 'B', f32]):\n    return {body}\n"
        return re.sub(r"// \d+:\d+", "", tessera.compile(text).inspect_ir("graph"))

    assert ir(method) == ir(function)


@pytest.mark.parametrize(
    ("spelled", "indexed"),
    [
        (
            "B, S, E = x.shape\n    return x.reshape(B * S, E)",
            "x.reshape(x.shape[0] * x.shape[1], x.shape[2])",
        ),
        ("_, _, E = x.shape\n    return x.reshape(-1, E)", "x.reshape(-1, x.shape[-1])"),
        (
            "B, S = x.shape[:2]\n    return x.reshape(B * S, -1)",
            "x.reshape(x.shape[0] * x.shape[1], -1)",
        ),
        (
            "S, E = x.shape[1:]\n    return x.reshape(-1, S * E)",
            "x.reshape(-1, x.shape[1] * x.shape[2])",
        ),
        ("(E,) = x.shape[::-1][:1]\n    return x.reshape(-1, E)", "x.reshape(-1, x.shape[2])"),
    ],
)
def test_a_shape_unpacks_and_slices_as_a_tuple(spelled: str, indexed: str) -> None:
    """``B, S, E = x.shape`` and ``x.shape[1:]`` give the sizes Python's tuple would, the
    same graph as indexing the shape one size at a time."""

    def ir(body: str) -> str:
        text = f"@kernel\ndef f(x: Tensor['A', 'B', 'C', f32]):\n    {body}\n"
        return re.sub(r"// \d+:\d+", "", tessera.compile(text).inspect_ir("graph"))

    assert ir(spelled) == ir(f"return {indexed}")


@pytest.mark.parametrize(
    ("looped", "written_out"),
    [
        ("for i in range(3):\n        x = relu(x @ w) + x", "x = relu(x @ w) + x\n" * 3),
        (
            "for i in range(1, 7, 2):\n        x = x * float(i)",
            "x = x * 1.0\nx = x * 3.0\nx = x * 5.0\n",
        ),
        (
            "for i in range(L):\n        for j in range(i):\n            x = x + w[j]",
            "x = x + w[0]\nx = x + w[0]\nx = x + w[1]\n",
        ),
        ("for i in range(0):\n        x = exp(x)", ""),
    ],
)
def test_a_loop_in_a_graph_function_is_unrolled(looped: str, written_out: str) -> None:
    """A loop over a range known at compile time (a layer count) runs its body once per
    number, as a Python trace would: the same graph as the body written out."""

    def ir(body: str) -> str:
        text = (
            "L = 3\n@kernel\ndef f(x: Tensor['A', 'A', f32], w: Tensor['A', 'A', f32]):\n"
            f"    {body}\n    return x\n"
        )
        return re.sub(r"(//|at) \d+:\d+", "", tessera.compile(text).inspect_ir("graph"))

    assert ir(looped) == ir(written_out.replace("\n", "\n    "))


def test_a_loop_over_range_in_a_tile_kernel_is_unrolled() -> None:
    """In a tile kernel too, ``range(...)`` of numbers unrolls (a Horner polynomial);
    ``tile.range_n`` stays the loop over blocks."""

    def ir(body: str) -> str:
        text = (
            "@kernel\ndef f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n"
            "    T = tile.context()\n    v = tile.load(x, rows=T.m)\n"
            f"    acc = tile.zeros((T.m,), f32)\n    {body}\n    return acc\n"
        )
        return re.sub(r"(//|at) \d+:\d+", "", tessera.compile(text).inspect_ir("graph"))

    looped = ir("for i in range(3):\n        acc = acc * v + float(i)")
    assert looped == ir("acc = acc * v + 0.0\n    acc = acc * v + 1.0\n    acc = acc * v + 2.0")
    assert "tile.for" not in looped


def test_a_product_reads_a_transposed_operand_where_it_lies() -> None:
    text = (
        "@kernel\ndef f(x: Tensor['M', 'K', f32], w: Tensor['N', 'K', f32]):\n    return x @ w.T\n"
    )
    function = graph(text).functions[0]
    (matmul,) = function.body.ops
    assert [p.value for p in function.params] == list(matmul.operands)
    assert matmul.attr("trans_b") is True
    assert [str(d) for d in matmul.result.type.dims] == ["M", "N"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("return softmax_safe(q @ k.T * 0.125, axis=-1) @ v", ["flash_attention"]),
        ("return softmax(q @ k.T / 8.0) @ v", ["flash_attention"]),
        ("return softmax(q @ k.T) @ v", ["flash_attention"]),
        ("return cast(softmax(qb @ kb.T * 0.125), bf16) @ vb", ["flash_attention"]),
        # 1/sqrt of the head dim, at run time: the op's own default scale
        ("return softmax(q @ k.T / sqrt(float(q.shape[-1]))) @ v", ["flash_attention"]),
        ("return softmax(rsqrt(k.shape[2]) * (q @ k.T)) @ v", ["flash_attention"]),
        # a float parameter: the kernel takes it; divided by one, or computed: as written
        ("return softmax(t * (q @ k.T)) @ v", ["flash_attention"]),
        ("return softmax(q @ k.T / t) @ v", ["matmul", "div", "softmax", "matmul"]),
        ("return softmax(q @ k.T * (t * 2.0)) @ v", ["matmul", "mul", "mul", "softmax", "matmul"]),
        # a negative scale, scores kept, probabilities kept, b not transposed: as written
        ("return softmax(q @ k.T * -1.0) @ v", ["matmul", "mul", "softmax", "matmul"]),
        ("s = q @ k.T\n    return softmax(s) @ v + s", ["matmul", "softmax", "matmul", "add"]),
        ("p = softmax(q @ k.T)\n    return p @ v + p", ["matmul", "softmax", "matmul", "add"]),
        ("return softmax(q @ v) @ k", ["matmul", "softmax", "matmul"]),
        # 1/sqrt of another size (the batch) or of twice the head dim, and sqrt where
        # rsqrt is meant
        (
            "return softmax(q @ k.T / sqrt(float(q.shape[0]))) @ v",
            ["matmul", "dim_to_float", "sqrt", "div", "softmax", "matmul"],
        ),
        (
            "return softmax(q @ k.T * rsqrt(float(q.shape[2]) * 2.0)) @ v",
            ["matmul", "dim_to_float", "mul", "rsqrt", "mul", "softmax", "matmul"],
        ),
        (
            "return softmax(q @ k.T * sqrt(float(q.shape[2]))) @ v",
            ["matmul", "dim_to_float", "sqrt", "mul", "softmax", "matmul"],
        ),
    ],
)
def test_attention_written_with_graph_ops_is_flash_attention(body: str, expected: list[str]):
    # square [N, N] operands, so that every misuse of the pattern type-checks
    text = (
        "@kernel\ndef f(q: Tensor['B', 'N', 'N', f32], k: Tensor['B', 'N', 'N', f32],\n"
        "      v: Tensor['B', 'N', 'N', f32], qb: Tensor['B', 'N', 'N', bf16],\n"
        "      kb: Tensor['B', 'N', 'N', bf16], vb: Tensor['B', 'N', 'N', bf16], t: float):\n"
        f"    {body}\n"
    )
    function = graph(text).functions[0]
    assert kinds(graph(text)) == expected
    for op in function.body.ops:
        if op.kind == "flash_attention":
            scaled = "*" in body or "/" in body
            scale = {} if "sqrt" in body else {"scale": 0.125 if scaled else 1.0}
            if "t *" in body:
                scale = {"scale": "scalar"}
                assert op.operands[-1] == function.params[-1].value
            assert dict(op.attrs) == {"causal": False, **scale}
            assert str(op.result.type) == "tensor<[B, N, N], f32>"


def test_a_dim_string_in_a_call_takes_the_sizes_fixed_on_the_command_line() -> None:
    text = (
        "@kernel\ndef f(x: Tensor['S', 'H*D', f32]) -> Tensor['S', 'H', 'D', f32]:\n"
        "    return reshape(x, ('S', 'H', 'D'))\n"
    )
    (reshape,) = graph(text, defines={"H": 4, "D": 16}).functions[0].body.ops
    assert str(reshape.result.type) == "tensor<[S, 4, 16], f32>"


def test_a_lossy_cast_chain_is_kept() -> None:
    text = "@kernel\ndef f(x: Tensor['N', f32]):\n    return cast(cast(x, bf16), f32)\n"
    assert kinds(graph(text)) == ["cast", "cast"]


def test_canonical_constant_is_on_the_right() -> None:
    module = graph("@kernel\ndef f(x: Tensor['N', f32]):\n    return 2.0 * x - 1.0\n")
    mul, add = module.functions[0].body.ops
    assert dict(mul.attrs) == {"b": 2.0}
    assert (add.kind, dict(add.attrs)) == ("add", {"b": -1.0})


def groups(text: str) -> list[tuple[str, list[str]]]:
    function = graph(text).functions[0]
    return [(g.kind, [function.body.ops[i].kind for i in g.ops]) for g in function.groups]


def test_matmul_epilogue_is_one_kernel() -> None:
    text = (
        "@kernel\ndef f(A: Tensor['M', 'K', bf16], B: Tensor['K', 'N', bf16],\n"
        "      bias: Tensor['N', f32]) -> Tensor['M', 'N', bf16 @accum(f32)]:\n"
        "    return gelu(matmul(A, B) + bias)\n"
    )
    assert groups(text) == [("gemm", ["matmul", "add", "gelu", "cast"])]


def test_softmax_safe_is_one_kernel_with_its_prologue() -> None:
    text = "@kernel\ndef f(x: Tensor['R', 'C', f32]):\n    return softmax_safe(x * 0.5)\n"
    assert groups(text) == [("reduction", ["mul", "softmax_safe"])]


def test_two_matmul_mlp_is_two_kernels() -> None:
    path = SEEDS[0].parent.parent.parent / "examples" / "mlp.tsr"
    function = graph(path.read_text()).functions[1]
    assert [g.kind for g in function.groups] == ["gemm", "gemm"]


def test_an_intermediate_that_only_elementwise_ops_read_is_fused_into_them() -> None:
    text = (
        "@kernel\ndef f(A: Tensor['M', 'K', f32], B: Tensor['K', 'N', f32]):\n"
        "    y = A @ B\n    return relu(y) + y\n"
    )
    assert groups(text) == [("gemm", ["matmul", "relu", "add"])]


@pytest.mark.parametrize(
    "body, expected",
    [
        # two chains from memory that one op joins: one kernel, where the first chain's
        # result used to be written and read back
        ("    return exp(x) + relu(x)\n", [("elementwise", ["exp", "relu", "add"])]),
        (
            "    return where(x > 0.0, x, 0.01 * x)\n",
            [("elementwise", ["greater", "mul", "where"])],
        ),
        # masks joined with and / or / not: one kernel
        (
            "    return where(x > 0.0 and x < 1.0 or not x > -2.0, x, 0.0)\n",
            [
                (
                    "elementwise",
                    [
                        "greater",
                        "less",
                        "logical_and",
                        "greater",
                        "logical_not",
                        "logical_or",
                        "where",
                    ],
                )
            ],
        ),
        # and then a reduction's prologue
        (
            "    return sum(cast(x > 0.0, f32) * exp(x), axis=-1)\n",
            [("reduction", ["greater", "cast", "exp", "mul", "sum"])],
        ),
        # a chain at a smaller shape is computed once, and read by the larger kernel
        (
            "    return where(b < 0.5, x, 0.0)\n",
            [("elementwise", ["less"]), ("elementwise", ["where"])],
        ),
        # a chain whose value something else reads too stays a kernel of its own
        (
            "    y = exp(x)\n    return (y + relu(x)) @ y\n",
            [("elementwise", ["exp"]), ("elementwise", ["relu", "add"]), ("gemm", ["matmul"])],
        ),
    ],
)
def test_chains_that_one_elementwise_op_joins_are_one_kernel(
    body: str, expected: list[tuple[str, list[str]]]
) -> None:
    text = "@kernel\ndef f(x: Tensor['R', 'R', f32], b: Tensor['R', f32]):\n" + body
    assert groups(text) == expected


@pytest.mark.parametrize(
    "body, expected",
    [
        # read twice by one op, of a vector: one view of x, one kernel
        ("    return sum(v * v)\n", [("reduction", ["reshape", "mul", "sum", "reshape"])]),
        # a gelu written out reads y five times
        (
            "    y = x + 1.0\n    return 0.5 * y * (1.0 + tanh(0.79 * (y + 0.04 * y * y * y)))\n",
            [("elementwise", ["add", "mul", "mul", "mul", "mul", "add", "mul", "tanh", "add",
                              "mul"])],
        ),
        (
            "    y = x * 2.0\n    return sum(y * y, axis=-1)\n",
            [("reduction", ["mul", "mul", "sum"])],
        ),
        # a reduction reads y too: y is written, and the elementwise ops read it back
        (
            "    y = x * 2.0\n    return y - max(y, axis=-1, keepdims=True)\n",
            [("elementwise", ["mul"]), ("reduction", ["max"]), ("elementwise", ["sub"])],
        ),
        # a reduction reads y, which mul also reads: y's kernel computes z too, and
        # writes both
        (
            "    y = relu(x)\n    z = y * 2.0\n    return z + sum(y, axis=-1, keepdims=True)\n",
            [("elementwise", ["relu", "mul"]), ("reduction", ["sum"]),
             ("elementwise", ["add"])],
        ),
        # so does a chain whose intermediate is returned too
        (
            "    y = relu(x)\n    return y, exp(y) + 1.0\n",
            [("elementwise", ["relu", "exp", "add"])],
        ),
        # but a product writes one value: its epilogue is a kernel of its own
        (
            "    y = x @ x.T\n    return y, exp(y) + 1.0\n",
            [("gemm", ["matmul"]), ("elementwise", ["exp", "add"])],
        ),
        # and a value of another shape than the kernel's result is written by its own
        (
            "    s = v * 2.0\n    return s, x + s\n",
            [("elementwise", ["mul"]), ("elementwise", ["add"])],
        ),
        # the epilogue of the sum has no d, which its prologue computes: d is written
        (
            "    d = x - 1.0\n    return d / (sum(d * d, axis=-1, keepdims=True) + 1.0)\n",
            [("elementwise", ["add"]), ("reduction", ["mul", "sum", "add"]),
             ("elementwise", ["div"])],
        ),
        # the reader that widens s starts a kernel that reads s from memory, so the
        # other reader cannot compute in s's kernel either
        (
            "    s = sum(x, axis=-1, keepdims=True) * 2.0\n    return (x - s) * (s + 1.0)\n",
            [("reduction", ["sum", "mul"]), ("elementwise", ["sub"]), ("elementwise", ["add"]),
             ("elementwise", ["mul"])],
        ),
    ],
)  # fmt: skip
def test_a_value_read_twice_stays_in_its_kernel_unless_another_kernel_reads_it(
    body: str, expected: list
) -> None:
    text = "@kernel\ndef f(x: Tensor['M', 'N', f32], v: Tensor['N', f32]):\n" + body
    assert groups(text) == expected


def test_a_scalar_from_sizes_is_computed_by_each_kernel_that_reads_it() -> None:
    text = (
        "@kernel\ndef f(a: Tensor['M', 'K', f32], b: Tensor['K', 'N', f32], s: float):\n"
        "    t = s / sqrt(float(a.shape[1]))\n"
        "    y = (a @ b) * t\n"
        "    return softmax(y) + t\n"
    )
    scalar = ["dim_to_float", "sqrt", "div"]
    assert groups(text) == [
        ("gemm", ["matmul", *scalar, "mul"]),
        ("reduction", ["softmax", *scalar, "add"]),
    ]


def test_a_scalar_read_by_no_elementwise_op_is_host_work() -> None:
    text = (
        "@kernel\ndef f(q: Tensor['S', 'D', f32], k: Tensor['S', 'D', f32],\n"
        "      v: Tensor['S', 'D', f32], p: float):\n"
        "    return flash_attention(q, k, v, dropout=p * 0.5)\n"
    )
    assert groups(text) == [("host", ["mul"]), ("attention", ["flash_attention"])]


def test_a_reshape_read_once_joins_its_reader_and_one_read_twice_is_a_copy() -> None:
    head = "@kernel\ndef f(x: Tensor['B', 'S', 'C', f32], w: Tensor['C', 'N', f32]):\n"
    assert groups(head + "    return x.reshape('B*S', 'C') @ w\n") == [
        ("gemm", ["reshape", "matmul"])
    ]
    twice = "    r = x.reshape('B*S', 'C')\n    return (r @ w) * sum(r, axis=-1)[:, None]\n"
    assert groups(head + twice)[0] == ("elementwise", ["reshape"])


def test_a_transpose_that_keeps_the_last_axis_is_loaded_by_its_reader() -> None:
    text = (
        "@kernel\ndef f(x: Tensor['B', 'S', 'H', 'D', f32], y: Tensor['B', 'H', 'S', 'D', f32]):\n"
        "    return transpose(x, (0, 2, 1, 3)) * 2.0 + y\n"
    )
    assert groups(text) == [("elementwise", ["transpose", "mul", "add"])]


@pytest.mark.parametrize(
    ("d", "result", "want"),
    [
        # heads split from [S, H*D] and merged back: one attention kernel, no copies
        (64, "transpose(o, (1, 0, 2))",
         [("attention", ["reshape", "transpose", "reshape", "transpose", "flash_attention",
                         "transpose"])]),
        # an op after the merge starts the next kernel, which reads it in memory
        (64, "transpose(o, (1, 0, 2)) * 2.0",
         [("attention", ["reshape", "transpose", "reshape", "transpose", "flash_attention",
                         "transpose"]), ("elementwise", ["mul"])]),
        # a head dim under the head-dim tile (48): the kernel masks the rest of the tile
        (40, "transpose(o, (1, 0, 2))",
         [("attention", ["reshape", "transpose", "reshape", "transpose", "flash_attention",
                         "transpose"])]),
    ],
)  # fmt: skip
def test_attention_reads_and_writes_heads_where_they_lie(
    d: int, result: str, want: list[tuple[str, list[str]]]
) -> None:
    text = (
        f"@kernel\ndef f(x: Tensor['S', {4 * d}, f32], y: Tensor['S', {4 * d}, f32]):\n"
        f"    q = transpose(x.reshape('S', 4, {d}), (1, 0, 2))\n"
        f"    kv = transpose(y.reshape('S', 4, {d}), (1, 0, 2))\n"
        "    o = flash_attention(q, kv, kv)\n"
        f"    return {result}\n"
    )
    assert groups(text) == want


@pytest.mark.parametrize(
    ("result", "want"),
    [
        # read by one attention: the three are views, no kernel splits the projection
        ("flash_attention(q, k, v)",
         [("attention", ["split_qkv", "split_qkv", "split_qkv", "flash_attention"])]),
        # q scaled first: the scaling kernel loads q where it lies, attention k and v
        ("flash_attention(q * 0.5, k, v)",
         [("elementwise", ["split_qkv", "mul"]),
          ("attention", ["split_qkv", "split_qkv", "flash_attention"])]),
        # read by a product (of k transposed, which it reads in place): views too
        ("q @ transpose(k, (0, 2, 1))", [("gemm", ["split_qkv", "split_qkv", "matmul"])]),
        # returned: copied out
        ("k", [("elementwise", ["split_qkv"])]),
    ],
)  # fmt: skip
def test_split_qkv_gives_views_of_the_projection(
    result: str, want: list[tuple[str, list[str]]]
) -> None:
    text = (
        "@kernel\ndef f(qkv: Tensor['S', 384, f32]):\n"
        "    q, k, v = split_qkv(qkv, heads=2)\n"
        f"    return {result}\n"
    )
    assert groups(text) == want


def test_grouped_query_attention_reads_and_writes_heads_where_they_lie() -> None:
    """Four q heads, two k and v heads: q is split as [2, 2, S, 64] and k and v as
    [2, 1, S, 64], each a view of its projection through one permutation (the split
    moved before it), and the result is stored merged, where the product reads it."""
    text = (
        "@kernel\ndef f(x: Tensor['S', 256, f32], y: Tensor['S', 128, f32],\n"
        "      z: Tensor['S', 128, f32], w: Tensor[256, 256, f32]):\n"
        "    q = transpose(x.reshape('S', 4, 64), (1, 0, 2))\n"
        "    k = transpose(y.reshape('S', 2, 64), (1, 0, 2))\n"
        "    v = transpose(z.reshape('S', 2, 64), (1, 0, 2))\n"
        "    o = flash_attention(q, k, v)\n"
        "    return transpose(o, (1, 0, 2)).reshape('S', 256) @ w\n"
    )
    views = ["reshape", "transpose"] * 3
    assert groups(text) == [
        ("attention", [*views, "flash_attention", "transpose"]),
        ("gemm", ["reshape", "matmul"]),
    ]
    function = graph(text).functions[0]
    split = [op for op in function.body.ops if op.kind == "reshape"][:3]
    assert [str(op.result.type) for op in split] == [
        "tensor<[S, 2, 2, 64], f32>", "tensor<[S, 2, 1, 64], f32>", "tensor<[S, 2, 1, 64], f32>"
    ]  # fmt: skip


def test_a_transpose_kernel_computes_the_ops_around_it() -> None:
    text = (
        "@kernel\ndef f(x: Tensor['R', 'C', f32], y: Tensor['C', 'R', f32]):\n"
        "    return relu(x * 2.0).T + y\n"
    )
    assert groups(text) == [("layout", ["mul", "relu", "transpose", "add"])]


def test_the_elementwise_ops_before_a_vectors_softmax_are_its_prologue() -> None:
    text = (
        "@kernel\ndef f(v: Tensor['N', f32], b: Tensor['N', bf16], s: float):\n"
        "    return softmax(v * s + b)\n"
    )
    assert groups(text) == [
        ("reduction", ["reshape", "mul", "reshape", "add", "softmax", "reshape"])
    ]


def test_a_row_kernel_over_a_vector_is_one_kernel_over_its_one_row() -> None:
    text = "@kernel\ndef f(v: Tensor['N', f32]) -> Tensor[f32]:\n    return max(v, axis=0)\n"
    function = graph(text).functions[0]
    reshape, top, back = function.body.ops
    assert str(reshape.result.type) == "tensor<[1, N], f32>"
    assert (top.kind, top.attr("axis"), str(top.result.type)) == ("max", 1, "tensor<[1], f32>")
    assert str(back.result.type) == "tensor<[], f32>"
    assert groups(text) == [("reduction", ["reshape", "max", "reshape"])]


def test_a_tile_kernel_is_one_kernel() -> None:
    path = SEEDS[0].parent.parent.parent / "examples" / "attention.tsr"
    function = graph(path.read_text()).functions[1]
    assert [g.kind for g in function.groups] == ["tile"]


# --------------------------------------------------------------------- verifier


def _sample() -> GraphModule:
    return analysed(
        "@kernel\ndef f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n"
        "    y = relu(x)\n    return gelu(y)\n"
    )


def test_verifier_accepts_analysed_ir() -> None:
    verify(_sample())


def test_verifier_rejects_use_before_definition() -> None:
    module = _sample()
    function = module.functions[0]
    relu, gelu = function.body.ops
    broken = replace(function, body=Block((), (gelu, relu), function.body.yields))
    with pytest.raises(VerifyError, match="before it is defined"):
        verify(replace(module, functions=(broken,)))


def test_verifier_rejects_a_value_defined_twice() -> None:
    module = _sample()
    function = module.functions[0]
    relu, gelu = function.body.ops
    twin = Op("relu", relu.operands, relu.results)
    broken = replace(function, body=Block((), (relu, twin, gelu), function.body.yields))
    with pytest.raises(VerifyError, match="defined twice"):
        verify(replace(module, functions=(broken,)))


def test_a_pass_that_breaks_the_ir_is_reported_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    def drop_first_op(module: GraphModule) -> GraphModule:
        f: Function = module.functions[0]
        return replace(module, functions=(replace(f, body=replace(f.body, ops=f.body.ops[1:])),))

    monkeypatch.setattr("tessera.transpiler.graph.passes.GRAPH_PASSES", [("drop", drop_first_op)])
    with pytest.raises(PassError, match="invalid after drop"):
        run_graph_passes(_sample())


def test_scalar_defaults_are_kept_and_printed() -> None:
    src = """
@kernel
def scale(x: Tensor["N", f32], *, by: float = 2, shift: int = 3,
          on: bool = True) -> Tensor["N", f32]:
    return x * by
"""
    (function,) = graph(src).functions
    assert [p.default for p in function.params] == [None, 2.0, 3, True]
    assert isinstance(function.params[1].default, float)
    text = tessera.compile(src, filename="g.tsr").inspect_ir("graph")
    assert "param %by : float = 2.0 keyword-only" in text
    assert "param %on : bool = True keyword-only" in text


@pytest.mark.parametrize("size", ["N", "x.shape[1]", "float(N)"])
def test_a_size_in_arithmetic_with_a_float_tensor_is_read_as_a_float(size: str) -> None:
    text = f"@kernel\ndef f(x: Tensor['M', 'N', f32]):\n    return x / {size}\n"
    to_float, div = graph(text).functions[0].body.ops
    assert (to_float.kind, to_float.attr("dim")) == ("dim_to_float", Dim.sym("N"))
    assert (div.kind, div.operands[1]) == ("div", to_float.result)


@pytest.mark.parametrize(
    "expr", ["transpose(x, (0, 1)) + 1.0", "transpose(v, (0,)) + 1.0", "transpose(sum(v), ())"]
)
def test_a_transpose_that_moves_no_axis_is_its_operand(expr: str) -> None:
    text = f"@kernel\ndef f(x: Tensor['M', 'N', f32], v: Tensor['N', f32]):\n    return {expr}\n"
    assert "transpose" not in kinds(graph(text))


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("sqrt(sum(v * v))", [("reduction", ["reshape", "mul", "sum", "sqrt", "reshape"])]),
        ("v / max(abs(v))", [("reduction", ["reshape", "abs", "max"]), ("elementwise", ["div"])]),
        ("x * s + 1.0", [("elementwise", ["reshape", "mul", "add"])]),
        ("sum(v)[None] * v", [("reduction", ["reshape", "sum"]), ("elementwise", ["mul"])]),
    ],
)
def test_elementwise_ops_on_a_0d_tensor_compute_on_its_one_element(
    expr: str, expected: list
) -> None:
    text = (
        "@kernel\ndef f(x: Tensor['M', 'N', f32], v: Tensor['N', f32], s: Tensor[f32]):\n"
        f"    return {expr}\n"
    )
    assert groups(text) == expected


ROWS = "@kernel\ndef f(x: Tensor['M', 'N', f32], w: Tensor['N', f32], b: Tensor['N', f32],\n"


@pytest.mark.parametrize(
    "body, kind, attrs",
    [
        (
            "    e = exp(x - max(x, axis=-1, keepdims=True))\n"
            "    return e / sum(e, axis=-1, keepdims=True)\n",
            "softmax_safe", {"axis": 1},
        ),
        ("    return exp(x) / sum(exp(x), axis=-1, keepdims=True)\n", "softmax", {"axis": 1}),
        (
            "    d = x - max(x, axis=-1, keepdims=True)\n"
            "    return d - log(sum(exp(d), axis=-1, keepdims=True))\n",
            "log_softmax", {"axis": 1},
        ),
        (
            "    m = max(x, axis=-1, keepdims=True)\n"
            "    return x - m - log(sum(exp(x - m), axis=-1, keepdims=True))\n",
            "log_softmax", {"axis": 1},
        ),
        ("    return x - log(sum(exp(x), axis=-1, keepdims=True))\n", "log_softmax", {"axis": 1}),
        (
            "    return x - logsumexp_safe(x, axis=-1, keepdims=True)\n",
            "log_softmax", {"axis": 1},
        ),
        (  # Llama's RMSNorm
            "    return w * (x * rsqrt(mean(x ** 2, axis=-1, keepdims=True) + 1e-6))\n",
            "rmsnorm", {"eps": 1e-6, "weight": True},
        ),
        (
            "    return x / sqrt(1e-6 + mean(x * x, axis=-1, keepdims=True))\n",
            "rmsnorm", {"eps": 1e-6, "weight": False},
        ),
        (
            "    d = x - mean(x, axis=-1, keepdims=True)\n"
            "    return d * rsqrt(mean(d * d, axis=-1, keepdims=True) + 1e-5) * w + b\n",
            "layernorm", {"eps": 1e-5, "weight": True, "bias": True},
        ),
        (
            "    m = mean(x, axis=-1, keepdims=True)\n"
            "    return (x - m) / sqrt(mean((x - m) ** 2, axis=-1, keepdims=True) + 1e-5) * w\n",
            "layernorm", {"eps": 1e-5, "weight": True, "bias": False},
        ),
    ],
)  # fmt: skip
def test_softmax_and_norms_written_out_are_the_library_ops(
    body: str, kind: str, attrs: dict
) -> None:
    function = graph(ROWS + "      eps: float, y: Tensor['M', 'N', bf16]):\n" + body).functions[0]
    (op,) = function.body.ops
    assert (op.kind, dict(op.attrs)) == (kind, attrs)


@pytest.mark.parametrize(
    "body",
    [
        # e is read by another op too
        "    e = exp(x - max(x, axis=-1, keepdims=True))\n"
        "    return e / sum(e, axis=-1, keepdims=True) + e\n",
        # bf16 ops round after each op; the library's compute in f32
        "    e = exp(y)\n    return e / sum(e, axis=-1, keepdims=True)\n",
        # over the rows' axis, not along them
        "    e = exp(x)\n    return e / sum(e, axis=0, keepdims=True)\n",
        # eps is a parameter, not a constant
        "    return x * rsqrt(mean(x * x, axis=-1, keepdims=True) + eps)\n",
        # eps outside the root
        "    return x / (sqrt(mean(x * x, axis=-1, keepdims=True)) + 1e-6)\n",
        # the mean of other squares
        "    return x * rsqrt(mean(x * w, axis=-1, keepdims=True) + 1e-6)\n",
        # the log of the sum of another tensor's exp
        "    return x - log(sum(exp(x * 2.0), axis=-1, keepdims=True))\n",
        # the shifted rows are read outside too
        "    d = x - max(x, axis=-1, keepdims=True)\n"
        "    return d - log(sum(exp(d), axis=-1, keepdims=True)) + d\n",
        # the log of a sum, not of a sum of exp
        "    return x - log(sum(x, axis=-1, keepdims=True))\n",
        # bf16
        "    return y - logsumexp_safe(y, axis=-1, keepdims=True)\n",
    ],
)
def test_what_only_looks_like_a_softmax_or_a_norm_stays_as_written(body: str) -> None:
    found = kinds(graph(ROWS + "      eps: float, y: Tensor['M', 'N', bf16]):\n" + body))
    assert not {"softmax", "softmax_safe", "log_softmax", "rmsnorm", "layernorm"} & set(found)


def test_kernels_take_every_value_by_a_name_of_its_own() -> None:
    """A kernel takes ``%h.1`` as ``h_1`` and ``%0`` as ``t0``: the printer leaves those
    names to the values that have them."""
    text = (
        "@kernel\ndef f(x: Tensor['N', f32], h_1: Tensor['N', f32], t0: Tensor['N', f32]):\n"
        "    h = x * 2.0\n    h = h - max(h, keepdims=True) + h_1\n"
        "    h = h * sum(h, keepdims=True)\n    return h + t0\n"
    )
    function = graph(text).functions[0]
    printed = list(value_names(function).values())
    assert len({param_name(p) for p in printed}) == len(printed)
    assert "%h.1" not in printed and "%0" not in printed
