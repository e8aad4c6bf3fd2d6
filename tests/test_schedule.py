"""The Schedule IR: explicit, space and heuristic schedules, diagnostics, memory plan."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

import tessera
from tessera.transpiler.graph.dims import Dim
from tessera.transpiler.graph.dtypes import DTYPES
from tessera.transpiler.graph.types import TensorType
from tessera.transpiler.schedule.hardware import covers, hardware_for
from tessera.transpiler.schedule.ir import Buffer, HostProgram, ScheduleModule
from tessera.transpiler.schedule.verify import ScheduleVerifyError, verify_schedule

pytestmark = pytest.mark.unit

GEMM = (
    "def f(A: Tensor['M', 'K', bf16], B: Tensor['K', 'N', bf16])"
    " -> Tensor['M', 'N', bf16 @accum(f32)]:\n    return A @ B\n"
)


def program(
    text: str, target: str = "cuda", arch: str | None = None, **options: object
) -> HostProgram:
    module = tessera.compile(text, filename="s.tsr", target=target, arch=arch, **options)
    return module.ir("sched").programs[0]


def errors(text: str, target: str = "cuda", arch: str | None = None) -> list[str]:
    with pytest.raises(tessera.CompileError) as info:
        program(text, target, arch)
    return [d.message for d in info.value.diagnostics]


def test_explicit_schedule_is_honoured() -> None:
    text = "@kernel.schedule(Schedule(block=(64, 128), k=32, warps=8, stages=2))\n" + GEMM
    launch = program(text).launches[0]
    assert (launch.source, launch.tiles) == ("explicit", (("BM", 64), ("BN", 128), ("BK", 32)))
    assert (launch.warps, launch.stages, launch.threads) == (8, 2, 256)
    assert launch.smem_bytes == 2 * (64 * 32 + 32 * 128) * 2


@pytest.mark.parametrize(
    ("schedule", "arch", "message"),
    [
        ("block=(256, 256), k=64, warps=16, stages=4", "sm_90a",
         "block (256, 256) needs 256 KiB of shared memory; sm_90a allows 227 KiB"),
        ("block=(256, 256), k=32, warps=4, stages=2", "sm_80",
         "block (256, 256) with 4 warps keeps 512 accumulators in each thread; "
         "sm_80 has 255 registers per thread"),
        ("block=(64, 64), warps=32, stages=2", "sm_80", None),
        ("block=(100, 64), warps=4", "sm_80",
         "block (100, 64) is not a multiple of the mma.sync.m16n8k16 tile (16 x 8) on sm_80"),
    ],
)  # fmt: skip
def test_impossible_schedules_are_diagnostics(
    schedule: str, arch: str, message: str | None
) -> None:
    text = f"@kernel.schedule(Schedule({schedule}))\n" + GEMM
    if message is None:  # 32 warps = 1024 threads: the limit, so it is allowed
        assert program(text, arch=arch).launches[0].threads == 1024
        return
    assert errors(text, arch=arch) == [f"schedule for 'f' cannot run: {message}"]


def test_stdlib_op_with_schedule_is_honoured() -> None:
    text = (
        "from tessera.stdlib import flash_attention_2\n"
        "small = Schedule(block=(64, 32), warps=4, stages=2)\n"
        "attend = flash_attention_2.with_schedule(small)\n"
        "@kernel\ndef f(q: Tensor['S', 64, bf16], k: Tensor['S', 64, bf16],"
        " v: Tensor['S', 64, bf16]) -> Tensor['S', 64, bf16]:\n"
        "    return attend(q, k, v, causal=True)\n"
    )
    launch = program(text).launches[0]
    assert (launch.template, launch.source) == ("flash_attention", "explicit")
    assert (launch.tile("BM"), launch.tile("BN"), launch.tile("BD")) == (64, 32, 64)


def test_an_impossible_op_schedule_is_reported_at_the_call() -> None:
    text = (
        "from tessera.stdlib import flash_attention_2\n"
        "huge = Schedule(block=(512, 512), warps=4)\n"
        "@kernel\ndef f(q: Tensor['S', 64, bf16], k: Tensor['S', 64, bf16],"
        " v: Tensor['S', 64, bf16]) -> Tensor['S', 64, bf16]:\n"
        "    return flash_attention_2.with_schedule(huge)(q, k, v)\n"
    )
    with pytest.raises(tessera.CompileError) as info:
        program(text)
    assert {d.span.line for d in info.value.diagnostics} == {5}


def test_a_space_skips_what_does_not_fit() -> None:
    text = "@kernel.autotune(space=dict(BM=[256, 128], BN=[256, 128], warps=[4]))\n" + GEMM
    launch = program(text).launches[0]
    assert launch.source == "space"
    assert (launch.tile("BM"), launch.tile("BN")) == (128, 128)


def test_a_space_where_nothing_fits_falls_back_with_a_warning() -> None:
    text = "@kernel.autotune(space=dict(BM=[512], BN=[512], warps=[4]))\n" + GEMM
    result = tessera.compile(text, filename="s.tsr", target="cuda")
    launch = result.ir("sched").programs[0].launches[0]
    assert launch.source == "heuristic"
    (warning,) = result.diagnostics
    assert warning.message.startswith("no schedule in the space of 'f' fits sm_80 (")


def test_known_sizes_choose_smaller_tiles_for_small_problems() -> None:
    big = program("@kernel\n" + GEMM, defines={"M": 8192, "N": 8192, "K": 4096}).launches[0]
    skinny = program("@kernel\n" + GEMM, defines={"M": 64, "N": 4096, "K": 4096}).launches[0]
    assert (big.tile("BM"), big.tile("BN")) == (128, 128)
    assert (skinny.tile("BM"), skinny.tile("BN")) == (64, 64)


def test_split_k_for_few_tiles_and_a_long_reduction() -> None:
    # 256 x 256 in 64 x 64 tiles is 16 programs on 108 SMs: K splits min(8, 108 // 16,
    # 16384 // (4 * 32)) = 6 ways at most, rounded down to a power of two.
    launch = program("@kernel\n" + GEMM, defines={"M": 256, "N": 256, "K": 16384}).launches[0]
    assert (launch.tile("BM"), launch.tile("BN"), launch.split_k) == (64, 64, 4)
    assert [str(g) for g in launch.grid] == ["4", "4", "4"]
    assert program("@kernel\n" + GEMM).launches[0].split_k == 1


def test_intermediates_share_slots_when_lifetimes_allow() -> None:
    text = (
        "@kernel\ndef chain(x: Tensor['T', 'D', bf16], w: Tensor['D', 'D', bf16])"
        " -> Tensor['T', 'D', bf16]:\n"
        "    a = cast(x @ w, bf16)\n    b = cast(a @ w, bf16)\n    c = cast(b @ w, bf16)\n"
        "    return cast(c @ w, bf16)\n"
    )
    p = program(text)
    assert [(b.name, b.slot, b.first, b.last) for b in p.buffers] == [
        ("%a", 0, 0, 1),
        ("%b", 1, 1, 2),
        ("%c", 0, 2, 3),
    ]
    assert str(p.buffers[0].bytes) == "2*D*T"


def test_symbolic_head_dim_is_guarded() -> None:
    text = (
        "@kernel\ndef f(q: Tensor['S', 'D', bf16], k: Tensor['S', 'D', bf16],"
        " v: Tensor['S', 'D', bf16]) -> Tensor['S', 'D', bf16]:\n"
        "    return ops.flash_attention(q, k, v)\n"
    )
    assert [str(g) for g in program(text).guards] == ["D <= 128"]
    fixed = program(text, defines={"D": 64})
    assert fixed.guards == () and fixed.launches[0].tile("BD") == 64


def test_every_target_gets_a_schedule() -> None:
    for target, arch in [("cuda", "sm_80"), ("cuda", "sm_90a"), ("hip", "gfx90a"),
                         ("hip", "gfx942"), ("cpu", "native"), ("opencl", "generic")]:  # fmt: skip
        launch = program("@kernel\n" + GEMM, target, arch).launches[0]
        hw = hardware_for(target, arch)
        assert launch.threads == (launch.warps * hw.lanes if hw.kind == "gpu" else 1)
        assert launch.smem_bytes <= hw.smem_bytes


def test_a_declaration_launches_nothing() -> None:
    p = program("@kernel\ndef f(x: Tensor['N', f32]) -> Tensor['N', f32]:\n    ...\n")
    assert (p.kind, p.launches) == ("declaration", ())


def test_verifier_rejects_overlapping_buffers_in_one_slot() -> None:
    text = (
        "@kernel\ndef g(x: Tensor['T', 'D', bf16], w: Tensor['D', 'D', bf16])"
        " -> Tensor['T', 'D', bf16]:\n    a = cast(x @ w, bf16)\n    return cast(a @ w, bf16)\n"
    )
    good = program(text)
    t = TensorType((Dim.sym("T"), Dim.sym("D")), DTYPES["bf16"])
    twin = Buffer("%z", t, good.buffers[0].bytes, 0, 0, 1)
    bad = replace(good, buffers=(*good.buffers, twin))
    module = ScheduleModule("s.tsr", "cuda", "sm_80", (bad,))
    with pytest.raises(ScheduleVerifyError, match="share slot 0"):
        verify_schedule(module, {"g": 2}, hardware_for("cuda", "sm_80"))


def test_a_product_reduced_to_a_vector_in_one_tile_kernel_is_an_error() -> None:
    """The programs cover the result's axes; a 1-D result leaves the product's columns
    to no program, which used to crash the scheduler."""
    text = """\
@kernel
def row_sums(A: Tensor["M", "K", bf16], B: Tensor["K", "N", bf16]) -> Tensor["M", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(A.shape[1], T.k):
        acc += tile.dot(tile.load(A, rows=T.m, cols=kb), tile.load(B, kb, cols=T.n))
    return tile.sum(acc, axis=1)
"""
    (message,) = errors(text)
    assert message.startswith("'row_sums' computes a tile.dot but its result is 1-D")


@pytest.mark.parametrize("arch, dtype, warps", [("sm_80", "f32", 8), ("sm_80", "bf16", 4),
                                                ("sm_90a", "f32", 8)])  # fmt: skip
def test_f32_operands_on_sm_80_spread_a_product_over_more_warps(
    arch: str, dtype: str, warps: int
) -> None:
    """Their fragments take twice the registers: 128 accumulators a thread spilled."""
    text = GEMM.replace("bf16 @accum(f32)", dtype).replace("bf16", dtype)
    (launch,) = program("@kernel\n" + text, arch=arch).launches
    assert (launch.tile("BM"), launch.tile("BN"), launch.warps) == (128, 128, warps)


@pytest.mark.parametrize("target", ["cpu", "opencl", "cuda"])
@pytest.mark.parametrize(
    ("size", "body"),
    [
        ("T.n", "    return tile.sum(tile.load(x, rows=T.m, cols=T.n), axis=1)\n"),
        ("T.k", "    acc = tile.zeros((T.m,), f32)\n"
                "    for kb in tile.range_n(x.shape[-1], T.n):\n"
                "        acc = acc + tile.sum(tile.load(x, rows=T.m, cols=T.k), axis=1)\n"
                "    return acc\n"),
    ],
)  # fmt: skip
def test_a_tile_size_the_schedule_does_not_size_is_an_error(
    size: str, body: str, target: str
) -> None:
    """A row kernel's schedule sizes its row blocks, and the step of a loop, only:
    ``cols=T.n`` there reached the generated code as the name ``T.n`` (which did not
    build), and with a value it would have summed the first block of each row only, of a
    width the target picks. (A loop that steps by ``T.k`` gets a step: ``test_cpu``.)"""
    text = (
        '@kernel\ndef f(x: Tensor["R", "C", f32]) -> Tensor["R", f32]:\n'
        "    T = tile.context()\n" + body
    )
    (message,) = errors(text, target)
    assert message.startswith(f"{size} has no size in 'f': the schedule sizes it only as ")
    assert message.endswith("Load the whole axis instead (cols= left out)")


@pytest.mark.parametrize(
    ("rows", "cols", "warps", "covered"),
    [
        (128, 128, (1, 1), True),
        (128, 128, (2, 4), True),  # warp parts 64 x 32: 4 x 4 of m16n8
        (64, 16, (1, 1), True),
        (64, 16, (1, 4), False),  # warp parts 64 x 4: narrower than n8
        (40, 64, (1, 1), False),  # 40 rows: not whole m16 tiles
        (48, 64, (2, 1), False),  # warp parts of 24 rows
    ],
)
def test_an_instructions_tiles_cover_a_tile_only_in_whole_tiles_per_warp(
    rows: int, cols: int, warps: tuple[int, int], covered: bool
) -> None:
    """The one coverage rule that the schedule's resources, legalization and the SIMT
    lowering share (m16n8, mma.sync's tile)."""
    assert covers((16, 8, 16), rows, cols, warps) is covered


BACKWARD_ATTENTION = """\
@autodiff
def attend(q: Tensor["B", "H", "S", "D", f32], k: Tensor["B", "H", "S", "D", f32],
           v: Tensor["B", "H", "S", "D", f32]) -> Tensor["B", "H", "S", "D", f32]:
    return flash_attention(q, k, v, causal=True)
"""


def test_cpu_attention_backward_kernels_take_square_blocks() -> None:
    """On the CPU the backward kernels step 128 keys (or queries) at a time, as many as
    a program owns, where the forward kernel steps 256: causal attention's half-masked
    diagonal blocks are then half as large."""
    sched = tessera.compile(BACKWARD_ATTENTION, "attend.tsr", target="cpu").inspect_ir("sched")
    tiles = dict(re.findall(r"template (\w+)\n\s+tiles (BM=\d+ BN=\d+)", sched))
    assert tiles["flash_attention"] == "BM=128 BN=256"
    for name in ("attention_stats", "attention_dq", "attention_dkdv"):
        assert tiles[name] == "BM=128 BN=128", name
