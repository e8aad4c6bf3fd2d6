"""``tesserac check``: the race checker and the bank-conflict linter on the Tile IR.

Each check must find a seeded defect (a barrier taken out of a lowered kernel, a
buffer's layout stripped of its padding or swizzle) and nothing in the examples and
the library. The linter's address model is compared with the address formula the
generated code computes (``simt_layout.smem_index``), evaluated lane by lane.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import pytest

import tessera
from tessera.cli.main import main
from tessera.transpiler.check.banks import BANKS, WORD, byte_address, degree, lint_banks, patterns
from tessera.transpiler.check.checks import check_module
from tessera.transpiler.check.races import find_races
from tessera.transpiler.graph.dims import Dim
from tessera.transpiler.graph.ir import Block
from tessera.transpiler.target.simt_layout import smem_index

from .conftest import FIXED_HEAD_DIM, ROOT, SOURCES
from .test_tile import CAST_OPERANDS

#: The GPU targets: the checks have nothing to say about a one-thread CPU program.
GPU_TARGETS = [("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", "gfx90a"), ("opencl", None)]


def _kernels(path: str, target: str, arch: str | None) -> list:
    module = tessera.compile_file(ROOT / path, target=target, arch=arch, until="tile").ir("tile")
    return [k for program in module.programs for k in program.kernels]


def _without_barriers(block: Block) -> Block:
    ops = tuple(
        replace(op, regions=tuple(_without_barriers(r) for r in op.regions))
        for op in block.ops
        if op.kind != "barrier"
    )
    return replace(block, ops=ops)


@pytest.mark.parametrize("target, arch", GPU_TARGETS, ids=lambda v: str(v))
def test_examples_and_library_have_no_findings(target: str, arch: str | None) -> None:
    found = []
    for path in SOURCES:
        defines = FIXED_HEAD_DIM.get((target, path))
        module = tessera.compile_file(
            ROOT / path, target=target, arch=arch, until="tile", defines=defines
        )
        found += [(path, f.diagnostic().render()) for f in check_module(module.ir("tile"))]
    assert found == []


@pytest.mark.parametrize(
    "path, target, arch",
    [("examples/attention.tsr", "cuda", "sm_80"), ("tessera/stdlib/gemm.tsr", "hip", "gfx90a"),
     ("tessera/stdlib/gemm.tsr", "opencl", None)],
)  # fmt: skip
def test_a_removed_barrier_is_a_race_at_both_lines(
    path: str, target: str, arch: str | None
) -> None:
    kernel = _kernels(path, target, arch)[0]
    assert find_races(kernel) == []
    races = find_races(replace(kernel, body=_without_barriers(kernel.body)))
    assert races, "a kernel without its barriers must race"
    for race in races:
        assert race.check == "race" and race.span is not None and race.other[1] is not None
        # Both accesses are a tile.load (of the library kernel the example instantiates):
        # its copy into shared memory and its read.
        for span in (race.span, race.other[1]):
            assert "tile.load" in span.source.text.splitlines()[span.line - 1]
    kinds = {(r.message.split()[1], r.other[0].split()[4]) for r in races}
    assert ("read", "write") in kinds  # read after write
    assert ("write", "read") in kinds  # write after read, carried around the loop


@pytest.mark.parametrize("target, arch", [("opencl", None), ("cuda", "sm_80"), ("hip", "gfx90a")])
def test_a_product_of_cast_operands_without_its_loop_barrier_races(
    target: str, arch: str | None
) -> None:
    """``tile.dot(tile.cast(tile.load(a)), tile.cast(tile.load(b)))`` in a K loop: the
    reads move down to the product with their casts, and the barrier at the top of the
    loop is all that keeps the next iteration's copies from overwriting an operand that
    other threads still multiply (the barrier pass once left it out)."""
    module = tessera.compile(CAST_OPERANDS, "castdot.tsr", target=target, arch=arch,
                             until="tile").ir("tile")  # fmt: skip
    kernel = module.programs[0].kernels[0]
    assert find_races(kernel) == []
    loop = next(op for op in kernel.body.ops if op.kind == "for")
    body = loop.regions[0]
    top = next(i for i, op in enumerate(body.ops) if op.kind == "barrier")
    assert [op.kind for op in body.ops[top:]].index("copy") > 0  # it orders the copies
    cut = replace(body, ops=body.ops[:top] + body.ops[top + 1 :])
    ops = tuple(replace(op, regions=(cut,)) if op is loop else op for op in kernel.body.ops)
    races = find_races(replace(kernel, body=replace(kernel.body, ops=ops)))
    kinds = {(r.message.split()[1], r.other[0].split()[4]) for r in races}
    assert ("write", "read") in kinds, "the next copy overwrites what the product reads"
    lines = {span.line for r in races for span in (r.span, r.other[1])}
    assert lines == {6, 7}  # the two staged loads, each a copy and a read


def test_a_read_before_its_async_copy_is_waited_for_races() -> None:
    kernel = _kernels("examples/attention.tsr", "cuda", "sm_80")[0]
    loop = next(op for op in kernel.body.ops if op.kind == "for")
    body = loop.regions[0]
    waitless = replace(body, ops=tuple(op for op in body.ops if op.kind != "wait"))
    ops = tuple(replace(op, regions=(waitless,)) if op is loop else op for op in kernel.body.ops)
    races = find_races(replace(kernel, body=replace(kernel.body, ops=ops)))
    assert any("asynchronous copy" in r.message for r in races)


def _barrier_in_branch(arms: int):
    """The OpenCL GEMM with the barrier of its loop moved into an ``if``: into its first
    arm only (``arms=1``, the other path has none) or into both."""
    kernel = _kernels("tessera/stdlib/gemm.tsr", "opencl", None)[0]
    loop = next(op for op in kernel.body.ops if op.kind == "for")
    body = loop.regions[0]
    barrier = next(op for op in body.ops if op.kind == "barrier")
    regions = (Block((), (barrier,)), Block((), (barrier,) if arms == 2 else ()))
    branch = tessera.transpiler.graph.ir.Op("if", (kernel.params[0],), (), regions=regions)
    ops = tuple(branch if op is barrier else op for op in body.ops)
    loop_ops = tuple(
        replace(op, regions=(replace(body, ops=ops),)) if op is loop else op
        for op in kernel.body.ops
    )
    return replace(kernel, body=replace(kernel.body, ops=loop_ops))


def test_a_barrier_on_one_path_only_orders_nothing() -> None:
    assert find_races(_barrier_in_branch(1))


def test_a_barrier_on_both_paths_orders_the_accesses() -> None:
    assert find_races(_barrier_in_branch(2)) == []


def test_a_global_tensor_written_and_read_elsewhere_races() -> None:
    """A kernel that stores its result and then loads the result one block further on
    reads what another program writes, in no order."""
    kernel = _kernels("tessera/stdlib/row_sum.tsr", "opencl", None)[0]
    assert find_races(kernel) == []
    store = next(op for op in kernel.body.ops if op.kind == "store")
    at = store.attr("at")
    moved = replace(at, axes=(replace(at.axes[0], offset=at.axes[0].offset + 4),))
    reread = tessera.transpiler.graph.ir.Op(
        "load", (store.operands[0],), (store.operands[1],), (("at", moved),), span=store.span
    )
    body = replace(kernel.body, ops=(*kernel.body.ops, reread))
    races = find_races(replace(kernel, body=body))
    assert [r.message.split("'")[1] for r in races] == ["out"]


@pytest.mark.parametrize("path", ["examples/mlp.tsr", "examples/attention.tsr"])
def test_a_layout_without_padding_or_swizzle_conflicts(path: str) -> None:
    kernel = _kernels(path, "cuda", "sm_80")[0]
    assert lint_banks(kernel) == []
    plain = replace(kernel, smem=tuple(replace(s, layout="row-major") for s in kernel.smem))
    conflicts = lint_banks(plain)
    assert conflicts and all(f.span is not None for f in conflicts)
    # Rows of 64 bytes (mlp's [128, 32] bf16) meet in one bank every other row: 4 ways;
    # rows of 128 bytes and more (attention's) every row: 8 ways.
    assert max(int(re.match(r"(\d+)-way", f.message)[1]) for f in conflicts) >= 4
    assert all("ldmatrix" in f.message for f in conflicts)


def _formula(layout: str, rows: int, cols: int, bits: int):
    """The generated code's element offset of ``(i, j)`` as a Python function: the C
    expression of ``smem_index``, whose operands are non-negative integers."""
    expr = smem_index(layout, (Dim.const(rows), Dim.const(cols)), bits, "0", "i", "j")
    return eval(f"lambda i, j: {expr.replace('/', '//')}")


def _simulated_degree(formula, bits: int, lanes, width: int) -> int:
    """The degree from the generated code's own address formula, evaluated per lane."""
    worst, step = 1, BANKS * WORD // max(width, WORD)
    for start in range(0, len(lanes), step):
        words: dict[int, set[int]] = {}
        for i, j in lanes[start : start + step]:
            address = formula(i, j) * bits // 8
            for word in range(address // WORD, (address + width - 1) // WORD + 1):
                words.setdefault(word % BANKS, set()).add(word)
        worst = max(worst, max(len(w) for w in words.values()))
    return worst


LAYOUTS = ["row-major", "padded +8", "xor", "sw128"]
SHAPES = [(8, 32), (16, 64), (8, 128), (16, 24), (64, 8)]


def test_the_linter_matches_a_simulation_of_the_address_formula() -> None:
    checked = set()
    for layout, (rows, cols), bits in itertools.product(LAYOUTS, SHAPES, (16, 32)):
        per_chunk = 128 // bits
        if layout == "sw128" and (cols % (1024 // bits) or rows % 8):
            continue
        if layout == "padded +8" and bits == 32:
            layout = "padded +4"
        formula = _formula(layout, rows, cols, bits)
        for i, j in itertools.product(range(rows), range(cols)):
            assert byte_address(layout, rows, cols, bits, i, j) == formula(i, j) * bits // 8
        for kind in ("copy", "ldmatrix", "grid"):
            if kind == "ldmatrix" and (bits != 16 or cols % per_chunk):
                continue
            for p in patterns(kind, rows, cols, bits):
                want = _simulated_degree(formula, bits, p.lanes, p.width)
                assert degree(layout, rows, cols, bits, p) == want, (layout, rows, cols, p)
                checked.add((layout, want))
    # The sweep sees conflict-free and conflicting layouts alike.
    assert {("xor", 1), ("row-major", 8), ("padded +8", 1)} <= checked


def test_check_command(tmp_path, capsys) -> None:
    assert main(["check", str(ROOT / "examples/attention.tsr"), "--target", "opencl"]) == 0
    assert "0 finding(s)" in capsys.readouterr().err
    code = main(["check", str(ROOT / "examples/mlp.tsr"), "--bank-threshold", "1"])
    err = capsys.readouterr().err
    assert code == 1
    assert re.search(r"gemm\.tsr:14:18: warning: bank-conflict: 2-way", err)
    missing = tmp_path / "missing.tsr"
    assert main(["check", str(missing)]) == 1
    with pytest.raises(SystemExit) as exit_:
        main(["check", str(ROOT / "examples/mlp.tsr"), "--bank-threshold", "0"])
    assert exit_.value.code == 2
