"""The Tile IR: lowering, each tile pass at work, and the interpreter against float64.

The interpreter runs the tile program of every example and standard-library
kernel on every target's lowering, with ragged sizes and poisoned outputs.
The pass tests look at structure (which ops, in which order, with which
attributes), not at substrings of the dump.
"""

from __future__ import annotations

import dataclasses
import math
import re

import ml_dtypes
import numpy as np
import pytest

import tessera
from tessera.transpiler.frontend.diagnostics import Diagnostics
from tessera.transpiler.graph.ir import Block, Op, walk
from tessera.transpiler.schedule.hardware import hardware_for
from tessera.transpiler.tile.build import tile_module
from tessera.transpiler.tile.interpret import TileRuntimeError, run_function
from tessera.transpiler.tile.ir import SharedType, TileKernel, TileModule
from tessera.transpiler.tile.passes import TILE_PASSES
from tessera.transpiler.tile.rewrite import rewrite
from tessera.transpiler.tile.smem import SW128_ALIGN
from tessera.transpiler.tile.verify import TileVerifyError, verify_kernel

from .conftest import FIXED_HEAD_DIM, ROOT
from .reference import BF16, CASES, Case, K, M, N, attention, f64, simulated, tf32

CONFIGS = [("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", "gfx90a"), ("cpu", "native"),
           ("opencl", "generic")]  # fmt: skip

GEMM = """\
@kernel
def mm(A: Tensor["M", "K", bf16], B: Tensor["K", "N", bf16]) -> Tensor["M", "N", f32]:
    return A @ B
"""

SOFTMAX = """\
@kernel
def f(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return softmax(x)
"""

ATTENTION = """\
@kernel
def attn(q: Tensor["BH", "S", "D", bf16], k: Tensor["BH", "S", "D", bf16],
         v: Tensor["BH", "S", "D", bf16]) -> Tensor["BH", "S", "D", bf16]:
    return ops.flash_attention(q, k, v, causal=False)
"""


def kernel(src: str, target: str = "cuda", arch: str | None = None, **defines: int) -> TileKernel:
    program = tessera.compile(src, target=target, arch=arch, defines=defines)
    (tile_program,) = program.ir("tile").programs
    (k,) = tile_program.kernels
    return k


def ops_of(block: Block, kind: str) -> list[Op]:
    return [op for op in walk(block) if op.kind == kind]


def loop(k: TileKernel) -> Op:
    (op,) = ops_of(k.body, "for")
    return op


def stdlib_gemm(target: str) -> tuple[TileModule, TileKernel]:
    """The library gemm's Tile IR module and its one kernel."""
    case = next(c for c in CASES if c.id == "gemm:gemm")
    module = tessera.compile_file(ROOT / case.path, target=target).ir("tile")
    (k,) = module.programs[0].kernels
    return module, k


def with_kernel(module: TileModule, k: TileKernel) -> TileModule:
    """``module`` with its one program's kernels replaced by ``k``."""
    (program,) = [p for p in module.programs if p.host.function == k.function]
    return dataclasses.replace(module, programs=(dataclasses.replace(program, kernels=(k,)),))


def gemm_inputs() -> dict:
    return next(c for c in CASES if c.id == "gemm:gemm").make(np.random.default_rng(0))


# -- the interpreter against the float64 reference ---------------------------------


def _run(case: Case, target: str, arch: str, seed: int = 0) -> tuple[dict, dict]:
    inputs = case.make(np.random.default_rng(seed))
    expected = case.reference({k: np.copy(v) for k, v in inputs.items()})
    defines = FIXED_HEAD_DIM.get((target, case.path))
    program = tessera.compile_file(ROOT / case.path, target=target, arch=arch, defines=defines)
    got = run_function(program.ir("tile"), case.function, inputs)
    return got, expected


@pytest.mark.parametrize(("target", "arch"), CONFIGS, ids=[f"{t}-{a}" for t, a in CONFIGS])
@pytest.mark.parametrize("case", simulated(CASES))
def test_tile_program_matches_float64_reference(case: Case, target: str, arch: str) -> None:
    got, expected = _run(case, target, arch)
    for name, want in expected.items():
        have = f64(got[name])
        assert have.shape == want.shape
        assert not np.isnan(have).any(), f"{name}: some outputs were never written"
        error = np.abs(have - want).max() / np.abs(want).max()
        assert error < case.rtol, f"{name}: relative error {error:.2e}"


def test_poisoned_outputs_would_be_caught() -> None:
    """The poison is real: an output the program does not write stays NaN."""
    module, k = stdlib_gemm("cpu")
    body = dataclasses.replace(k.body, ops=tuple(op for op in k.body.ops if op.kind != "store"))
    out = run_function(with_kernel(module, dataclasses.replace(k, body=body)), "gemm",
                       gemm_inputs())["out"]  # fmt: skip
    assert np.isnan(f64(out)).all()


# -- legalization ------------------------------------------------------------------


def test_legalize_fuses_the_accumulation_into_an_mma() -> None:
    hw = hardware_for("cuda", "sm_80")
    before = _unpassed(GEMM)
    (add,) = [op for op in ops_of(loop(before).regions[0], "add")]
    (dot,) = ops_of(before.body, "dot")
    assert dot.result in add.operands
    after = TILE_PASSES[0].run(before, hw)
    assert ops_of(after.body, "dot") == [] and ops_of(after.body, "add") == []
    (mma,) = ops_of(after.body, "mma")
    assert mma.results == add.results
    assert mma.operands[:2] == dot.operands and mma.operands[2] in loop(after).regions[0].args


@pytest.mark.parametrize(
    ("target", "arch", "inst", "operands"),
    [("cuda", "sm_80", "mma.sync.bf16", "shared"), ("cuda", "sm_90a", "wgmma.bf16", "shared"),
     ("hip", "gfx90a", "mfma_f32_32x32x8bf16_1k", "shared"),
     ("cpu", "native", "simd.fma", "registers"), ("opencl", "generic", "fma", "shared")],
)  # fmt: skip
def test_legalize_picks_the_targets_matrix_instruction(
    target: str, arch: str, inst: str, operands: str
) -> None:
    k = kernel(GEMM, target, arch)
    (mma,) = ops_of(k.body, "mma")
    plan = mma.attr("mma")
    assert (plan.inst, plan.operands) == (inst, operands)
    rows, cols = (d.constant for d in mma.result.type.dims)
    wm, wn = plan.warps
    assert plan.warp_tile == (rows // wm, cols // wn)
    assert plan.warp_tile[0] >= plan.shape[0] and plan.warp_tile[1] >= plan.shape[1]


# -- edge masking --------------------------------------------------------------------


def _masks(k: TileKernel, kind: str) -> list[tuple[bool, ...]]:
    return [tuple(a.masked for a in op.attr("at").axes) for op in ops_of(k.body, kind)]


def test_edge_masks_follow_the_sizes() -> None:
    ragged = kernel(GEMM, "cpu")
    assert _masks(ragged, "store") == [(True, True)]
    assert all(all(m) for m in _masks(ragged, "copy"))
    exact = kernel(GEMM, "cpu", M=256, N=256, K=1024)
    assert _masks(exact, "store") == [(False, False)]
    assert not any(any(m) for m in _masks(exact, "copy"))


def test_edge_mask_guards_the_online_softmax_against_padded_keys() -> None:
    k = kernel(ATTENTION, "cuda")
    body = loop(k).regions[0]
    (mask,) = ops_of(body, "mask_edge")
    (online,) = ops_of(body, "softmax_online")
    assert online.operands == mask.results
    assert (mask.attr("axis"), mask.attr("fill")) == (1, -math.inf)
    assert str(mask.attr("extent")) == "S"
    assert ops_of(kernel(ATTENTION, "cuda", S=256).body, "mask_edge") == []


def test_padded_rows_alone_need_no_fill() -> None:
    """Rows past the edge are never stored, so a row-wise softmax needs no mask_edge."""
    k = kernel(SOFTMAX, "cuda")
    assert ops_of(k.body, "mask_edge") == []
    assert _masks(k, "load") == [(True, False)]


def test_verifier_rejects_an_unmasked_ragged_access() -> None:
    k = kernel(GEMM, "cpu")
    store = ops_of(k.body, "store")[0]
    at = store.attr("at")
    unmasked = dataclasses.replace(at, axes=tuple(dataclasses.replace(a, masked=False)
                                                  for a in at.axes))  # fmt: skip
    bad = dataclasses.replace(store, attrs=(("at", unmasked),))
    body = dataclasses.replace(k.body, ops=tuple(bad if op is store else op for op in k.body.ops))
    with pytest.raises(TileVerifyError, match="unmasked"):
        verify_kernel(dataclasses.replace(k, body=body), hardware_for("cpu", "native"), "edge")


def test_interpreter_traps_an_unmasked_access_past_the_edge() -> None:
    module, k = stdlib_gemm("cpu")

    def unmask(op: Op) -> list[Op]:
        at = op.attr("at")
        if at is None:
            return [op]
        axes = tuple(dataclasses.replace(a, masked=False) for a in at.axes)
        attrs = tuple((n, dataclasses.replace(at, axes=axes) if n == "at" else v)
                      for n, v in op.attrs)  # fmt: skip
        return [dataclasses.replace(op, attrs=attrs)]

    broken = dataclasses.replace(k, body=rewrite(k.body, unmask))
    with pytest.raises(TileRuntimeError, match="unmasked access"):
        run_function(with_kernel(module, broken), "gemm", gemm_inputs())


# -- staging and pipelining ------------------------------------------------------------


def test_pipelining_on_sm80_prefetches_stages_minus_one_iterations() -> None:
    k = kernel(GEMM, "cuda", "sm_80")
    assert k.stages == 3
    allocs = ops_of(k.body, "alloc")
    assert [a.result.type.stages for a in allocs] == [3, 3]
    top = [op.kind for op in k.body.ops]
    first_loop = top.index("for")
    # the prologue: two iterations' copies (A and B), each group committed
    assert top[first_loop - 6 : first_loop] == ["copy", "copy", "commit"] * 2
    body = [op.kind for op in loop(k).regions[0].ops]
    assert body[:6] == ["wait", "barrier", "copy", "copy", "commit", "read"]
    (wait,) = ops_of(loop(k).regions[0], "wait")
    assert wait.attr("pending") == k.stages - 2
    copies = [op for op in loop(k).regions[0].ops if op.kind == "copy"]
    assert all(op.attr("async") == "cp.async" for op in copies)
    assert {str(op.attr("slot")) for op in copies} == {"(kb + 2) % 3"}
    reads = ops_of(loop(k).regions[0], "read")
    assert {str(op.attr("slot")) for op in reads} == {"(kb) % 3"}


def test_a_gemm_on_wgmma_leaves_one_batch_in_flight() -> None:
    """sm_90a's GEMM loop accumulates on wgmma and reads nothing else of the product: each
    batch runs into the next iteration, so the copies run stages - 2 iterations ahead
    (into the slot the batch before last read), and a wait_mma after the loop waits for
    the last. Attention, whose products feed the softmax, and sm_80 keep stages - 1."""
    k = kernel(GEMM, "cuda", "sm_90a")
    (mma,) = ops_of(k.body, "mma")
    assert mma.attr("mma").in_flight == 1
    body = loop(k).regions[0]
    (wait,) = ops_of(body, "wait")
    assert wait.attr("pending") == k.stages - 3
    assert all(str(c.attr("slot")) == f"(kb + {k.stages - 2}) % {k.stages}"
               for c in ops_of(body, "copy"))  # fmt: skip
    after = k.body.ops[k.body.ops.index(loop(k)) + 1]
    assert after.kind == "wait_mma" and after.attr("pending") == 0
    for src, arch in ((ATTENTION, "sm_90a"), (GEMM, "sm_80")):
        other = kernel(src, "cuda", arch)
        assert not ops_of(other.body, "wait_mma")
        assert all(op.attr("mma").in_flight == 0 for op in walk(other.body) if op.attr("mma"))


def test_without_async_copies_staging_is_synchronous() -> None:
    k = kernel(GEMM, "opencl")
    assert [a.result.type.stages for a in ops_of(k.body, "alloc")] == [1, 1]
    assert ops_of(k.body, "wait") == [] and ops_of(k.body, "commit") == []
    body = [op.kind for op in loop(k).regions[0].ops]
    # FMA reads its operands from shared memory at the product, so the next iteration's
    # copies wait for every thread's product: one barrier before them, one after.
    assert body[:5] == ["barrier", "copy", "copy", "barrier", "read"]


def test_operands_read_from_shared_memory_stay_there_until_the_product() -> None:
    """The query tile of attention is read by every iteration's product on a GPU, where
    products load their operands from shared memory as they run (fragments a k step at
    a time on mma.sync and MFMA), so its buffer must not give its bytes to the keys. The
    CPU reads it into registers once, before the loop."""
    for target, arch in (("opencl", None), ("cuda", "sm_90a"), ("cuda", "sm_80"), ("hip", None)):
        k = kernel(ATTENTION, target, arch)
        (read_q,) = [op for op in ops_of(k.body, "read") if op.result.name == "q_tile"]
        assert read_q not in k.body.ops and read_q in loop(k).regions[0].ops, target
        q, keys = (s for s in k.smem if s.buffer in ("q_tile_smem", "k_tile_smem"))
        assert q.offset + q.bytes <= keys.offset or keys.offset + keys.bytes <= q.offset, arch
    k = kernel(ATTENTION, "cpu")
    (read_q,) = [op for op in ops_of(k.body, "read") if op.result.name == "q_tile"]
    assert read_q in k.body.ops


def test_a_wrong_wait_count_is_caught_by_the_interpreter() -> None:
    """Waiting for one group too few reads a stage before its copy lands."""
    module, k = stdlib_gemm("cuda")

    def loosen(op: Op) -> list[Op]:
        if op.kind == "wait":
            return [dataclasses.replace(op, attrs=(("pending", op.attr("pending") + 1),))]
        return [op]

    broken = dataclasses.replace(k, body=rewrite(k.body, loosen))
    out = run_function(with_kernel(module, broken), "gemm", gemm_inputs())["out"]
    assert np.isnan(f64(out)).any()


# -- barriers ---------------------------------------------------------------------------


def test_cpu_programs_have_no_barriers() -> None:
    assert ops_of(kernel(GEMM, "cpu").body, "barrier") == []


def test_barriers_separate_writes_from_reads_of_each_buffer() -> None:
    """Along the loop body, twice round: a read never follows a write of its buffer,
    nor a copy a read of its buffer, without a barrier between."""
    k = kernel(ATTENTION, "hip")
    body = loop(k).regions[0].ops * 2
    written: set[int] = set()
    read: set[int] = set()
    for op in body:
        if op.kind == "barrier":
            written, read = set(), set()
        elif op.kind == "copy":
            assert op.operands[1].id not in read
            written.add(op.operands[1].id)
        elif op.kind == "read":
            assert op.operands[0].id not in written
            read.add(op.operands[0].id)
    assert ops_of(loop(k).regions[0], "barrier")


CAST_OPERANDS = """\
@kernel
def castdot(a: Tensor["M", "K", i8], b: Tensor["K", "N", i8]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(a.shape[-1], T.k):
        x = tile.cast(tile.load(a, rows=T.m, cols=kb), f32)
        y = tile.cast(tile.load(b, kb, cols=T.n), f32)
        acc += tile.dot(x, y)
    return acc
"""


def test_operands_cast_in_shared_memory_are_read_at_the_product() -> None:
    """A product of casts of staged tiles reads the buffers through the casts, so their
    reads move down to it, past the other operand's barrier: the next iteration's copies
    then wait for every thread's product (the barrier before them was missing, and a
    copy overwrote an operand another thread was still multiplying)."""
    for target, arch in (("opencl", None), ("cuda", "sm_80"), ("hip", None)):
        body = [op.kind for op in loop(kernel(CAST_OPERANDS, target, arch)).regions[0].ops]
        assert "barrier" not in body[body.index("read") : body.index("mma")], target
        assert body.index("barrier") < body.index("copy"), target


# -- shared-memory planning ------------------------------------------------------------


def test_a_block_too_big_for_shared_memory_is_an_error_at_its_loop() -> None:
    """A constant range_n block whose staged tiles do not fit (an internal error after
    the planner before): the loop's line, the bytes and the arch's limit."""
    source = CAST_OPERANDS.replace("range_n(a.shape[-1], T.k)", "range_n(a.shape[-1], 256)")
    for target, arch in (("cuda", "sm_80"), ("hip", "gfx90a")):
        with pytest.raises(tessera.CompileError) as caught:
            tessera.compile(source, "big.tsr", target=target, arch=arch)
        (error,) = caught.value.diagnostics
        limit = hardware_for(target, arch).smem_bytes
        need = int(re.search(r"stages ([\d,]+) bytes", error.message).group(1).replace(",", ""))
        assert error.span.line == 5 and need > limit, (target, error.message)
        assert f"than the {limit:,} a block has on {arch}" in error.message, target


def test_smem_plan_reuses_the_query_buffer_and_keeps_live_buffers_apart() -> None:
    """On the CPU the query tile goes into registers before the loop: its buffer is free
    for the keys."""
    k = kernel(ATTENTION, "cpu")
    slots = {s.buffer: s for s in k.smem}
    assert set(slots) == {"q_tile_smem", "k_tile_smem", "v_tile_smem"}
    k_, v_ = slots["k_tile_smem"], slots["v_tile_smem"]
    assert k_.offset + k_.bytes <= v_.offset or v_.offset + v_.bytes <= k_.offset
    assert slots["q_tile_smem"].offset == k_.offset  # q is read before k and v are used
    assert k.smem_bytes < sum(s.bytes for s in k.smem)
    assert all(s.offset % 128 == 0 for s in k.smem)
    for op in ops_of(k.body, "alloc"):
        t: SharedType = op.result.type
        assert slots[op.result.name].bytes >= t.bytes


def test_smem_layouts_per_target() -> None:
    assert {s.layout for s in kernel(GEMM, "cuda").smem} == {"xor"}
    assert {s.layout for s in kernel(GEMM, "cpu").smem} == {"row-major"}


@pytest.mark.parametrize("src", [GEMM, ATTENTION], ids=["gemm", "attention"])
def test_wgmma_operands_take_the_128_byte_swizzle_from_aligned_bases(src: str) -> None:
    """wgmma reads its shared operands in the 128-byte swizzle, whose 1024-byte repeat
    must start where a buffer does."""
    k = kernel(src, "cuda", "sm_90a")
    assert {s.layout for s in k.smem} == {"sw128"}
    assert all(s.offset % SW128_ALIGN == 0 for s in k.smem)


# -- the stage as a whole -------------------------------------------------------------


def test_a_group_without_a_tile_kernel_is_an_error_but_sched_still_works() -> None:
    src = (
        '@kernel\ndef f(a: Tensor["M", "K", i32],\n'
        '      b: Tensor["K", "N", i32]) -> Tensor["M", "N", i32]:\n'
        "    return a @ b\n"
    )
    program = tessera.compile(src, target="cuda", until="sched")
    assert "launch k0" in program.inspect_ir("sched")
    with pytest.raises(tessera.CompileError, match="a matmul of i32 operands has no tile kernel"):
        program.ir("tile")


@pytest.mark.parametrize(
    "src, messages",
    [
        (
            '@kernel\ndef f(a: Tensor["M", "K", i32],\n'
            '      b: Tensor["K", "N", i32]) -> Tensor["M", "N", i32]:\n'
            "    return a @ b\n",
            ["4:12: error: a matmul of i32 operands has no tile kernel yet", "cast the operands"],
        ),
        (
            '@kernel\ndef f(x: Tensor["N", f32]) -> Tensor["N", f32]:\n'
            "    y = x * 2.0\n"
            '    return all_reduce(y, op="sum")\n',
            ["4:12: error: all_reduce: a collective runs inside the function's 'with mesh(...)'"],
        ),
        (
            '@kernel\ndef f(q: Tensor["S", "D", f32], k: Tensor["S", "D", f32],\n'
            '      v: Tensor["S", "D", f32], s: float) -> Tensor["S", "D", f32]:\n'
            "    return flash_attention(q, k, v, scale=s * 0.5)\n",
            [
                "4:43: error: 'f': launch k0 is host-side work: a scalar computed for an op",
                "pass this one as a parameter",
            ],
        ),
        (
            '@kernel\ndef f(qkv: Tensor["S", "C", f32],\n'
            '      h: int) -> Tensor["h", "S", "C/(3*h)", f32]:\n'
            "    q, k, v = split_qkv(qkv, heads=h)\n"
            "    return flash_attention(q, k, v)\n",
            [
                "4:15: error: split_qkv needs a number of heads (heads=12)",
                "a launch takes sizes, not int parameters",
            ],
        ),
        (
            '@kernel\ndef f(q: Tensor["S", 32, f32], k: Tensor["S", 32, f32],\n'
            '      v: Tensor["S", 48, f32]) -> Tensor["S", 48, f32]:\n'
            "    return flash_attention(q, k, v)\n",
            [
                "4:12: error: flash_attention with a value head dim (48) other than the query's",
                "the kernel's head-dim tile serves q, k and v alike",
            ],
        ),
    ],
    ids=[
        "integer-matmul",
        "collective",
        "scalar-for-attention",
        "split-int-heads",
        "value-head-dim",
    ],
)
def test_what_no_kernel_runs_is_an_error_at_its_line_that_says_what_to_do(
    src: str, messages: list[str]
) -> None:
    with pytest.raises(tessera.CompileError) as caught:
        tessera.compile(src, target="cpu")
    for message in messages:
        assert message in str(caught.value)


def test_every_pass_keeps_the_kernel_valid() -> None:
    for target, arch in CONFIGS:
        hw = hardware_for(target, arch)
        k = kernel(ATTENTION, target, arch)
        for tile_pass in TILE_PASSES:
            verify_kernel(k, hw, tile_pass.name)


def _unpassed(src: str, target: str = "cuda") -> TileKernel:
    """The kernel as the lowering leaves it, before any tile pass."""
    program = tessera.compile(src, target=target, until="sched")
    module = tile_module(program.ir("graph"), program.ir("sched"), program.options,
                         Diagnostics(), until="lowering")  # fmt: skip
    (tp,) = module.programs
    (lowered,) = tp.kernels
    return lowered


# -- instantiation of the library for graph groups -------------------------------------

EPILOGUE = """\
@kernel
def f(A: Tensor["M", "K", {dtype}], B: Tensor["K", "N", {dtype}], bias: Tensor["N", f32],
      r: Tensor["M", "N", f32]) -> Tensor["M", "N", bf16 @accum(f32)]:
    return cast(silu(A @ B * 0.5 + bias) + r, bf16)
"""
DTYPES = {"f32": np.float32, "tf32": np.float32, "bf16": BF16, "f16": np.float16,
          "fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}  # fmt: skip


@pytest.mark.parametrize("config", [("cuda", "sm_80"), ("cuda", "sm_90a"), ("cpu", "native")],
                         ids=lambda c: "-".join(c))  # fmt: skip
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gemm_instantiates_for_each_input_dtype_with_its_epilogue(
    dtype: str, config: tuple[str, str]
) -> None:
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((M, K)) * 0.5).astype(DTYPES[dtype])
    b = (rng.standard_normal((K, N)) * 0.5).astype(DTYPES[dtype])
    bias, r = rng.standard_normal(N).astype(np.float32), rng.standard_normal((M, N))
    r = r.astype(np.float32)
    program = tessera.compile(EPILOGUE.format(dtype=dtype), target=config[0], arch=config[1])
    (k,) = program.ir("tile").programs[0].kernels
    assert k.template == "gemm"
    out = run_function(program.ir("tile"), "f", {"A": a, "B": b, "bias": bias, "r": r})["out"]
    if dtype == "tf32":  # tensor cores read f32 with a 10-bit mantissa
        a, b = tf32(a), tf32(b)
    z = f64(a) @ f64(b) * 0.5 + bias
    want = z / (1 + np.exp(-z)) + r
    have = f64(out)
    assert not np.isnan(have).any()
    assert np.abs(have - want).max() / np.abs(want).max() < 1e-2


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("head_dim", [64, 128, 100])
def test_attention_op_instantiates_for_head_dims_and_causality(head_dim: int, causal: bool) -> None:
    src = ATTENTION.replace("causal=False", f"causal={causal}")
    program = tessera.compile(src, target="cuda", arch="sm_90a")
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((3, 130, head_dim)).astype(BF16) for _ in range(3))
    out = run_function(program.ir("tile"), "attn", {"q": q, "k": k, "v": v})["out"]
    want = attention(q, k, v, causal=causal)
    assert np.abs(f64(out) - want).max() / np.abs(want).max() < 2e-2


def _before_and_after(src: str, name: str, target: str = "cuda") -> tuple[TileKernel, TileKernel]:
    """The kernel just before pass ``name`` and just after it."""
    names = [p.name for p in TILE_PASSES]
    previous = "lowering" if names.index(name) == 0 else names[names.index(name) - 1]
    program = tessera.compile(src, target=target, until="sched")
    (before,) = tile_module(program.ir("graph"), program.ir("sched"), program.options,
                            Diagnostics(), until=previous).programs[0].kernels  # fmt: skip
    hw = hardware_for(target, program.options.resolved_arch)
    after = next(p for p in TILE_PASSES if p.name == name).run(before, hw)
    return before, after


def _kinds(k: TileKernel) -> list[str]:
    return [op.kind for op in walk(k.body)]


def test_edge_mask_pass_before_and_after() -> None:
    before, after = _before_and_after(ATTENTION, "edge-mask")
    assert not any(any(m) for m in _masks(before, "load")) and "mask_edge" not in _kinds(before)
    assert all(any(m) for m in _masks(after, "load")) and _kinds(after).count("mask_edge") == 1


def test_stage_pass_before_and_after() -> None:
    before, after = _before_and_after(GEMM, "stage")
    assert {"alloc", "copy", "read"}.isdisjoint(_kinds(before))
    assert _kinds(before).count("load") == 2
    assert _kinds(after).count("load") == 0 and _kinds(after).count("read") == 2
    assert _kinds(after).count("alloc") == 2 and _kinds(after).count("copy") == 2 * 3


@pytest.mark.parametrize(("target", "staged"), [("cuda", True), ("opencl", True), ("cpu", False)])
def test_a_transposed_block_goes_through_shared_memory_on_gpus(target: str, staged: bool):
    """A GPU program reads its block along the rows of ``x`` into shared memory, and
    writes the transposed rows from there: both sides of the copy are whole rows. The
    CPU reads the block where it lies."""
    src = '@kernel\ndef t(x: Tensor["M", "N", f32]) -> Tensor["N", "M", f32]:\n    return x.T\n'
    before, after = _before_and_after(src, "stage", target)
    assert _kinds(before) == ["load", "transpose", "store"]
    expected = ["alloc", "copy", "read", "transpose", "store"] if staged else _kinds(before)
    assert _kinds(after) == expected


def test_barrier_pass_before_and_after() -> None:
    before, after = _before_and_after(GEMM, "barriers")
    assert "barrier" not in _kinds(before)
    assert [k for k in _kinds(after) if k != "barrier"] == _kinds(before)
    assert _kinds(after).count("barrier") == 1


def test_smem_planning_pass_before_and_after() -> None:
    before, after = _before_and_after(GEMM, "plan-smem")
    assert before.smem == () and before.smem_bytes == 0
    assert [s.buffer for s in after.smem] == ["a_tile_smem", "b_tile_smem"]
    assert after.smem_bytes == sum(s.bytes for s in after.smem) == 2 * 3 * 128 * 32 * 2
    assert after.body == before.body


def test_causal_bound_pass_before_and_after() -> None:
    causal = ATTENTION.replace("causal=False", "causal=True")
    before, after = _before_and_after(causal, "causal-bound")
    assert loop(before).attr("stop") is None
    (row_index,) = [op for op in ops_of(loop(after).regions[0], "iota")
                    if "pid_m" in op.attr("offset").symbols()]  # fmt: skip
    rows = row_index.result.type.dims[0]
    assert loop(after).attr("stop") == row_index.attr("offset") + rows
    _, plain = _before_and_after(ATTENTION, "causal-bound")
    assert loop(plain).attr("stop") is None


KEYS_OWNED = """\
@kernel
def key_grad(q: Tensor["BH", "S", "D", f32], k: Tensor["BH", "S", "D", f32],
             lse: Tensor["BH", "S", 1, f32]) -> Tensor["BH", "S", "D", f32]:
    T = tile.context()
    k_tile = tile.load(k, rows=T.m, cols=T.d)
    acc = tile.zeros((T.m, T.d), f32)
    for mblk in tile.range_n(q.shape, T.n):
        q_tile = tile.load(q, mblk, cols=T.d)
        s = tile.dot(q_tile, tile.transpose(k_tile))
        tile.mask_causal(s, tile.col_index(mblk), tile.row_index())
        acc += tile.dot(tile.transpose(tile.exp(s - tile.load(lse, mblk))), q_tile)
    return acc
"""


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_causal_bound_starts_key_owned_loops_on_the_cpu(target: str) -> None:
    """A loop over query blocks (the keys' gradients) starts at the program's first key
    on the CPU; the GPU targets, whose pipelines copy the first block ahead, keep 0."""
    before, after = _before_and_after(KEYS_OWNED, "causal-bound", target)
    assert loop(before).attr("start") is None and loop(after).attr("stop") is None
    (first_key,) = [op for op in ops_of(loop(after).regions[0], "iota")
                    if "pid_m" in op.attr("offset").symbols()]  # fmt: skip
    want = first_key.attr("offset") if target == "cpu" else None
    assert loop(after).attr("start") == want


def test_unnamed_operands_get_buffers_of_their_own() -> None:
    """Two loads with no names feeding one dot: two buffers, two places in the plan."""
    k = kernel("""\
@kernel
def inline_dot(A: Tensor["M", "K", bf16], B: Tensor["K", "N", bf16]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(A.shape[1], T.k):
        acc += tile.dot(tile.load(A, rows=T.m, cols=kb), tile.load(B, kb, cols=T.n))
    return acc
""")
    assert [s.buffer for s in k.smem] == ["operand_smem", "operand_smem_1"]
