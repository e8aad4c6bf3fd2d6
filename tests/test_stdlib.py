"""The standard library, written in .tsr: every kernel type-checks and schedules."""

from __future__ import annotations

from pathlib import Path

import pytest

import tessera
from tessera.transpiler.graph.ir import walk

from .conftest import ROOT

pytestmark = pytest.mark.unit

STDLIB = sorted((ROOT / "tessera" / "stdlib").glob("*.tsr"))
#: Each kernel, what it works like, and its grid.
EXPECTED = {
    "attention_dkdv": ("attention", ["ceil(T/64)", "BH"]),
    "attention_dq": ("attention", ["ceil(S/64)", "BH"]),
    "attention_stats": ("attention", ["ceil(S/128)", "BH"]),
    "decode_attention": ("attention", ["ceil(R/128)", "N"]),
    "decode_partial": ("attention", ["ceil(R/128)", "N"]),
    "decode_partial_lse": ("attention", ["ceil(R/128)", "N"]),
    "elementwise": ("reduction", ["ceil(R/4)"]),
    "flash_attention": ("attention", ["ceil(S/128)", "BH"]),
    "fused_adam": ("elementwise", ["ceil(N/1024)"]),
    "fused_adam_master": ("elementwise", ["ceil(N/1024)"]),
    "gemm": ("gemm", ["ceil(N/128)", "ceil(M/128)"]),
    "gemm_dequant": ("gemm", ["ceil(N/64)", "ceil(M/128)"]),
    "gemm_dequant_grouped": ("gemm", ["ceil(N/64)", "ceil(M/128)"]),
    "gemm_i8": ("gemm", ["ceil(N/64)", "ceil(M/128)"]),
    "gemm_nt": ("gemm", ["ceil(N/128)", "ceil(M/128)"]),
    "layernorm": ("reduction", ["ceil(R/4)"]),
    "layernorm_grad": ("reduction", ["ceil(R/4)"]),
    "log_softmax": ("reduction", ["ceil(R/4)"]),
    "log_softmax_grad": ("reduction", ["ceil(R/4)"]),
    "norm_param_grad": ("columns", ["ceil(C/32)"]),
    "pad": ("reduction", ["ceil(R/4)"]),
    "logsumexp": ("reduction", ["ceil(R/4)"]),
    "rmsnorm": ("reduction", ["ceil(R/4)"]),
    "rmsnorm_grad": ("reduction", ["ceil(R/4)"]),
    "rotary_embedding": ("reduction", ["ceil(S/4)"]),
    "put_along_axis": ("reduction", ["ceil(R/4)"]),
    "row_max": ("reduction", ["ceil(R/4)"]),
    "row_mean": ("reduction", ["ceil(R/4)"]),
    "row_sum": ("reduction", ["ceil(R/4)"]),
    "scatter_add": ("reduction", ["ceil(R/4)"]),
    "softmax": ("reduction", ["ceil(R/4)"]),
    "softmax_grad": ("reduction", ["ceil(R/4)"]),
    "take_along_axis": ("reduction", ["ceil(R/4)"]),
    "transpose": ("layout", ["ceil(M/64)", "ceil(N/64)"]),
}


def test_the_library_is_complete() -> None:
    assert [p.stem for p in STDLIB] == sorted(EXPECTED)


@pytest.mark.parametrize("path", STDLIB, ids=[p.stem for p in STDLIB])
def test_kernel_type_checks_as_a_tile_kernel(path: Path) -> None:
    program = tessera.compile_file(path, target="cuda")
    (function,) = program.ir("graph").functions
    assert (function.name, function.kind) == (path.stem, "tile")
    assert not program.diagnostics
    (host,) = program.ir("sched").programs
    (launch,) = host.launches
    assert [str(g) for g in launch.grid] == EXPECTED[path.stem][1]


def test_gemm_walks_k_in_blocks_of_both_operands() -> None:
    (function,) = tessera.compile_file(ROOT / "tessera/stdlib/gemm.tsr").ir("graph").functions
    loads = [op for op in walk(function.body) if op.kind == "tile.load"]
    assert [dict(op.attrs) for op in loads] == [
        {"rows": "program", "cols": "block"},
        {"rows": "block", "cols": "program"},
    ]
    assert [str(op.result.type) for op in loads] == [
        "tile<[T.m, T.k], bf16>",
        "tile<[T.k, T.n], bf16>",
    ]


def test_fused_adam_updates_its_arguments_in_place() -> None:
    path = ROOT / "tessera/stdlib/fused_adam.tsr"
    (function,) = tessera.compile_file(path).ir("graph").functions
    stores = [op for op in function.body.ops if op.kind == "tile.store"]
    assert [op.operands[0].name for op in stores] == ["exp_avg", "exp_avg_sq", "param"]
    assert all(op.effects == ("write",) for op in stores)


def tile_errors(body: str, params: str = "x: Tensor['R', 'C', f32]") -> list[str]:
    text = f"@kernel\ndef f({params}):\n    T = tile.context()\n" + "".join(
        f"    {line}\n" for line in body.splitlines()
    )
    with pytest.raises(tessera.CompileError) as info:
        tessera.compile(text)
    return [d.message for d in info.value.diagnostics]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("t = tile.load(x)", "tile.load: needs rows= (a tile size such as T.m)"),
        ("t = tile.split(tile.load(x, rows=T.m), 1, axis=1)",
         "tile.split: parts must be 2 to 64, not 1"),
        ("a, b = tile.split(tile.load(x, rows=T.m), 9223372036854775807, axis=1)",
         "tile.split: parts must be 2 to 64, not 9223372036854775807"),
        ("t = tile.max(tile.load(x, rows=T.m), axis=2)", "tile.max: axis 2 is out of range"),
        ("a = tile.load(x, rows=T.m)\nt = tile.concat((a, a[:, None]), axis=1)",
         "tile.concat: joins tile<[T.m, C], f32> with tile<[T.m, 1, C], f32>"),
        ("tile.store(x, tile.zeros((T.m, T.n), f32), cols=T.m)",
         "tile.store: the tile is [T.m, T.n]"),
        ("t = tile.exp(tile.load(y, rows=T.m))", "tile.exp: needs a floating-point tile"),
    ],
)  # fmt: skip
def test_tile_op_errors(body: str, message: str) -> None:
    params = "x: Tensor['R', 'C', f32], y: Tensor['R', 'C', i8]"
    found = tile_errors(body, params)
    assert len(found) == 1 and found[0].startswith(message), found
