"""Roofline hints and register estimates in ``--emit meta`` (``analysis``).

The estimates are checked against ptxas's count in ``test_nvrtc.py`` (every example's
and library file's kernels); ``bench/registers.py`` reports the errors. Here, the terms
that the count alone would not show were lost.
"""

from __future__ import annotations

import pytest

import tessera
from tessera.transpiler.check.roofline import PEAKS, kernel_cost

from .conftest import ROOT

GEMM = """\
@kernel
def mm(a: Tensor["M", "K", bf16], b: Tensor["K", "N", bf16]) -> Tensor["M", "N", f32]:
    return matmul(a, b)

@kernel
def sm(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return softmax(x, axis=-1)
"""


def _analysis(target: str, arch: str | None, defines: dict | None = None) -> dict:
    program = tessera.compile(GEMM, "mm.tsr", target=target, arch=arch, defines=defines)
    return {entry["kernel"]: entry for entry in program.ir("meta")["analysis"]}


def test_a_product_is_compute_bound_and_a_softmax_memory_bound() -> None:
    found = _analysis("cuda", "sm_80")
    gemm, softmax = found["mm"]["roofline"], found["sm"]["roofline"]
    assert gemm["flops"] == "2*K*M*N"
    assert gemm["bytes"] == "2*K*M + 2*K*N + 4*M*N"
    assert gemm["at"] == {"K": 1024, "M": 1024, "N": 1024}
    assert gemm["intensity"] == pytest.approx(2 * 1024**3 / (8 * 1024**2), rel=1e-3)
    assert gemm["bound"] == "compute" and gemm["attainable_tflops"] == PEAKS["sm_80"].matrix_tflops
    assert softmax["bound"] == "memory" and softmax["intensity"] < 1
    assert softmax["peak_tflops"] == 19.5 and softmax["bandwidth_gbs"] == 2039
    assert softmax["ridge"] == pytest.approx(19.5e12 / 2039e9, abs=0.01)
    assert 0 < found["mm"]["registers_estimate"] <= 255


def test_the_sizes_given_decide_the_bound() -> None:
    """A product of 16 rows reads as much as it computes: memory-bound on an H100."""
    thin = _analysis("cuda", "sm_90a", {"M": 16, "K": 8192, "N": 8192})["mm"]["roofline"]
    flops, moved = 2 * 16 * 8192 * 8192, 2 * 16 * 8192 + 2 * 8192 * 8192 + 4 * 16 * 8192
    assert thin["at"] == {} and thin["intensity"] == pytest.approx(flops / moved, rel=1e-3)
    assert thin["bound"] == "memory"


def test_a_cpu_kernel_has_costs_but_no_peak() -> None:
    entry = _analysis("cpu", None)["mm"]
    assert "registers_estimate" not in entry
    assert entry["roofline"]["flops"] == "2*K*M*N" and entry["roofline"]["bound"] is None


def test_loops_multiply_their_body() -> None:
    """The library's attention: two products of S x S x D per (batch, head), the key loop
    counted whole."""
    program = tessera.compile_file(ROOT / "examples/attention.tsr", target="cuda", until="tile")
    kernel = program.ir("tile").programs[1].kernels[0]
    flops = kernel_cost(kernel).flops.value({"BH": 1, "S": 1024, "D": 128})
    products = 2 * 2 * 1024 * 1024 * 128
    assert products < flops < 1.1 * products


def _estimates(path: str, arch: str) -> dict[str, int]:
    program = tessera.compile_file(ROOT / path, target="cuda", arch=arch)
    return {e["kernel"]: e["registers_estimate"] for e in program.ir("meta")["analysis"]}


def test_a_warp_specialized_kernel_is_given_its_launch_bounds_share() -> None:
    """setmaxnreg hands registers between the warpgroups out of what the block got at
    launch, so ptxas allocates 65536 / 384 rounded down to 8 (168), whatever the
    consumers' tiles need (64 accumulators here)."""
    found = _estimates("examples/schedules.tsr", "sm_90a")
    assert found["gemm_bias_relu"] == 168
    assert found["gemm"] < 168  # the same product without a producer warpgroup


def test_an_operand_wgmma_cannot_read_costs_mma_sync_fragments() -> None:
    """w8a16's weights are widened from i8 in registers, so its product runs on
    mma.sync on sm_90a too: beside the 128 accumulators, b's fragments of the warp's
    256 columns (64 registers), which a descriptor read would not cost."""
    assert _estimates("examples/quant_linear.tsr", "sm_90a")["w8a16"] >= 128 + 64


def test_a_walk_keeps_the_loads_of_every_tensor_it_reads_in_flight() -> None:
    """rmsnorm's store walk reads x and the weight, a vector broadcast over the rows, and
    ptxas keeps an unrolled iteration's loads of both in flight (``add_rms``, which
    also reads the residual, gets 4 more)."""
    found = _estimates("examples/norms.tsr", "sm_80")
    assert found["rms"] == 28 + 4 + 4  # the row base, the statistic, the weight's loads
    assert found["add_rms"] == found["rms"] + 4


def test_a_gemm_epilogue_holds_its_rows_addresses_and_bounds() -> None:
    """The FMA GEMM's store: beside its 64 accumulators, each of the thread's 8 rows'
    64-bit address and bound (24), and where the columns are masked (``decoder_block``'s
    ``C`` columns, not ``decode``'s 256) each of its 8 columns' bound."""
    masked = _estimates("examples/decoder_block.tsr", "sm_80")["decoder_block_k1"]
    unmasked = _estimates("examples/decode.tsr", "sm_80")["project_k1"]
    assert unmasked == 32 + 64 + 24
    assert masked == unmasked + 8


def test_probabilities_a_16_bit_product_reads_are_held_packed() -> None:
    """attention's probabilities (128 x 32 over 256 threads, 16 words in f32) are packed
    two a register for the bf16 product with V: 8 words."""
    found = _estimates("examples/attention.tsr", "sm_80")
    # base, accumulator, m and l, the probabilities packed, their m and l, V's fragments
    assert found["attention"] == 32 + 64 + 4 + 8 + 4 + 32


def test_an_elementwise_loop_update_loads_what_it_reads_ahead() -> None:
    """norm_param_grad sums two [32, 16] tiles over row blocks (4 words each of 128
    threads): each iteration loads the thread's elements of the cotangent and of x (4
    each) and of the [16, 2] statistics (1) from shared memory ahead of the math."""
    found = _estimates("tessera/stdlib/norm_param_grad.tsr", "sm_80")
    assert found["norm_param_grad"] == 32 + 2 * 4 + 4 + 4 + 1
