"""Benchmark: W8A16 and W4A16 linear layers on the CPU, against PyTorch with the weight
already dequantized, in one process.

``examples/quant_linear.tsr``'s ``w8a16`` (the int8 weight widened in the product's main
loop), the graph-level ``x @ dequantize(q, scale, dtype=bf16)`` (one kernel that
dequantizes in the main loop, ``graph/dequantized.py``) and the same two steps as two
functions (the weight dequantized into a bf16 temporary, then the library's product), for
M = 1 and 16 rows of activations and N = K = 4096, against ``torch.matmul`` of bf16
activations by the weight dequantized to bf16 ahead of time, and the same in f32; and
``w4a16`` (the i4 weight, packed two to a byte with a scale per group of 32 rows,
unpacked and dequantized in the main loop) for M = 1, 4 and 16 against the same peers.
``--graph`` runs only the graph-level product against its two steps (W4A16 at M = 1, 2,
4, 8 and 16, W8A16 at 1 and 16, the hand-written tile kernel and torch beside them) and
updates its entry. Each case is timed interleaved with its peers, median
of several runs after a warm-up; the quantized weight's bytes over the time give the
bandwidth each reaches, beside this machine's copy bandwidth (numpy ``copyto`` of that
many bytes): for W4A16, the fraction of the packed weight's bandwidth that a kernel
bound by reading it would reach. And low-precision GEMM at 2048 against numpy's SGEMM
(``np.matmul`` of f32 copies) in the same run: a bf16 matmul with an f32 result on
``vdpbf16ps``, beside the same program built with ``-DTSR_PORTABLE_SUMS`` (the f32
micro-kernel, as before), and an int8 GEMM tile kernel on ``vpdpbusd`` beside its
portable build; ``--gemm`` runs only these and updates their entry. ``--w8a8`` times
the graph-level ``x @ w`` of int8s (the exact i32 product: the library's ``gemm_i8`` and
the join of its two parts, ``graph/int8_products.py``) and a W8A8 layer (that product
cast to f32 and scaled per row and per column, fused with the join) at 2048 against
numpy's SGEMM on f32 copies and the int8 tile kernel above, and updates its entry.
Results go to ``bench/results/quant.json``.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
from cpu import machine

import tessera
from tessera.files import write_file
from tessera.runtime import cpu as cpu_runtime

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "quant.json"
SIZE = 4096
RUNS = 7
GEMM = 2048


def _median_seconds(functions: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Each function's median time over ``RUNS`` interleaved runs, after one warm-up."""
    times: dict[str, list[float]] = {name: [] for name in functions}
    for f in functions.values():
        f()
    for _ in range(RUNS):
        for name, f in functions.items():
            time.sleep(0.2)  # OpenBLAS's and torch's threads stop spinning
            f()
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _case(
    m: int, ours: dict[str, Callable[[], object]], weight_bf16: torch.Tensor,
    weight_f32: torch.Tensor, weight_bytes: int, rng: np.random.Generator,
) -> dict[str, object]:  # fmt: skip
    """One size's timings of ``ours`` (each given the activations ``x``), beside torch's
    product by the weight dequantized ahead of time, in bf16 and in f32, and a copy of
    the quantized weight's bytes: the ratios, and the bandwidth each reaches reading
    those bytes."""
    x = rng.standard_normal((m, SIZE)).astype(ml_dtypes.bfloat16)
    x_bf16 = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    x_f32 = torch.from_numpy(x.astype(np.float32))
    source, target = np.empty(weight_bytes, np.uint8), np.empty(weight_bytes, np.uint8)
    seconds = _median_seconds({
        **{name: functools.partial(f, x) for name, f in ours.items()},
        "torch_bf16_dequantized": lambda: torch.matmul(x_bf16, weight_bf16),
        "torch_f32_dequantized": lambda: torch.matmul(x_f32, weight_f32),
        "copy_weight_bytes": lambda: np.copyto(target, source),
    })  # fmt: skip
    first = next(iter(ours))
    case = {
        "m": m, "n": SIZE, "k": SIZE,
        "ms": {k: round(v * 1e3, 3) for k, v in seconds.items()},
        "weight_gb_per_s": {k: round(weight_bytes / v / 1e9, 2) for k, v in seconds.items()},
        f"ratio_{first}_over_torch_bf16": round(
            seconds["torch_bf16_dequantized"] / seconds[first], 3),
        f"ratio_{first}_over_torch_f32": round(
            seconds["torch_f32_dequantized"] / seconds[first], 3),
        "fraction_of_copy_bandwidth": round(
            seconds["copy_weight_bytes"] / seconds[first], 3),
    }  # fmt: skip
    print(json.dumps(case))
    return case


#: ``x @ dequantize(...)`` in graph functions, W4A16 (a scale per group of 32 rows) and
#: W8A16 (a scale per column), and their two steps as functions of their own: the
#: weight dequantized into a bf16 temporary, then the library's product.
GRAPH_SOURCE = """
@kernel
def w4a16_graph(x: Tensor["M", "K", bf16], q: Tensor["K", "N", i4],
                s: Tensor["K/32", "N", f32]) -> Tensor["M", "N", f32]:
    return x @ dequantize(q, s, group=32, dtype=bf16)


@kernel
def w8a16_graph(x: Tensor["M", "K", bf16], q: Tensor["K", "N", i8],
                s: Tensor["N", f32]) -> Tensor["M", "N", f32]:
    return x @ dequantize(q, s, dtype=bf16)


@kernel
def dequantize_i4(q: Tensor["K", "N", i4], s: Tensor["K/32", "N", f32]) -> Tensor["K", "N", bf16]:
    return dequantize(q, s, group=32, dtype=bf16)


@kernel
def dequantize_i8(q: Tensor["K", "N", i8], s: Tensor["N", f32]) -> Tensor["K", "N", bf16]:
    return dequantize(q, s, dtype=bf16)


@kernel
def matmul(x: Tensor["M", "K", bf16], w: Tensor["K", "N", bf16]) -> Tensor["M", "N", f32]:
    return x @ w
"""


#: What the machine does to ``--graph``'s timings, recorded beside them.
GRAPH_NOISE = (
    "2 cores shared with other work (load_average: before and after). A descheduled "
    "OpenMP thread holds a call up by a scheduler slice (about 4 ms), so with two threads "
    "many medians are whole multiples of 4 ms, torch's too; the one-thread run "
    "(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1) is the one to read. Ratios compare "
    "functions timed interleaved in one process."
)


def _two_steps(dequantize: Callable[..., object], graph: Any, *weight: np.ndarray) -> Callable:
    """``x @ dequantize(...)`` as two calls: the weight into a bf16 temporary (allocated
    once, as the memory plan's buffer is), then the product."""
    temporary = np.empty((SIZE, SIZE), ml_dtypes.bfloat16)

    def run(x: np.ndarray, out: np.ndarray) -> None:
        dequantize(*weight, out=temporary)
        graph.matmul(x, temporary, out=out)

    return run


def _w8a16_weight(lib: Any, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A 4096 x 4096 int8 weight quantized with one scale per output channel."""
    w = rng.standard_normal((SIZE, SIZE)).astype(np.float32)
    scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    q = np.zeros((SIZE, SIZE), np.int8)
    lib.quantize_weights(w, scale, out=q)
    return q, scale


def _w4a16_weight(lib: Any, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A 4096 x 4096 weight packed in i4, one scale per group of 32 rows."""
    w = rng.standard_normal((SIZE, SIZE)).astype(np.float32)
    scale = (np.abs(w).reshape(SIZE // 32, 32, SIZE).max(axis=1) / 7).astype(np.float32)
    return lib.quantize_i4(w, scale), scale


def _w8a16(lib: Any, graph: Any, rng: np.random.Generator) -> list[dict[str, object]]:
    """W8A16: one scale per output channel."""
    q, scale = _w8a16_weight(lib, rng)
    weight = torch.from_numpy(q.astype(np.float32) * scale)
    two_steps = _two_steps(graph.dequantize_i8, graph, q, scale)
    cases = []
    for m in (1, 16):
        out = np.empty((m, SIZE), np.float32)
        ours = {
            "tessera_w8a16": lambda x, out=out: lib.w8a16(x, q, scale, out=out),
            "tessera_graph_x_at_dequantize": lambda x, out=out: graph.w8a16_graph(
                x, q, scale, out=out),
            "tessera_dequantize_then_matmul": lambda x, out=out: two_steps(x, out),
        }  # fmt: skip
        cases.append(_case(m, ours, weight.to(torch.bfloat16), weight, q.nbytes, rng))
    return cases


def _w4a16(lib: Any, rng: np.random.Generator) -> list[dict[str, object]]:
    """W4A16: the weight packed two to a byte, one scale per group of 32 rows."""
    packed, scale = _w4a16_weight(lib, rng)
    nibbles = np.stack([packed & 15, packed >> 4], axis=-1).reshape(SIZE, SIZE)
    q = ((nibbles.astype(np.int8) ^ 8) - 8).astype(np.float32)
    weight = torch.from_numpy(q * np.repeat(scale, 32, axis=0))
    cases = []
    for m in (1, 4, 16):
        out = np.empty((m, SIZE), np.float32)
        ours = {"tessera_w4a16": lambda x, out=out: lib.w4a16(x, packed, scale, out=out)}
        cases.append(_case(m, ours, weight.to(torch.bfloat16), weight, packed.nbytes, rng))
    return cases


#: bf16 GEMM (an f32 result), and int8 GEMM as a tile kernel: each K block of 512's product
#: added to the accumulator (``acc += tile.dot(...)``, the usual main loop), and the same
#: loop written as a dot per block cast and added (the form that ran on vpdpbusd first).
GEMM_SOURCE = """
@kernel
def gemm_bf16(a: Tensor["M", "K", bf16], b: Tensor["K", "N", bf16]) -> Tensor["M", "N", f32]:
    return a @ b


@kernel
def gemm_i8(x: Tensor["M", "K", i8], w: Tensor["K", "N", i8]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(x.shape[-1], 512):
        acc += tile.dot(tile.load(x, rows=T.m, cols=kb), tile.load(w, kb, cols=T.n))
    return acc


@kernel
def gemm_i8_dot_then_add(x: Tensor["M", "K", i8], w: Tensor["K", "N", i8]) -> Tensor["M", "N", f32]:
    T = tile.context()
    acc = tile.zeros((T.m, T.n), f32)
    for kb in tile.range_n(x.shape[-1], 512):
        acc += tile.cast(tile.dot(tile.load(x, rows=T.m, cols=kb), tile.load(w, kb, cols=T.n)),
                         f32)
    return acc
"""


def _gemm(rng: np.random.Generator) -> dict[str, object]:
    """bf16 and int8 GEMM 2048 against numpy's SGEMM on f32 copies of the operands, as
    FLOP rates (a multiply-add is two) and their ratios; the builds with
    ``-DTSR_PORTABLE_SUMS`` are the rates before vdpbf16ps and vpdpbusd."""
    program = tessera.compile(GEMM_SOURCE, filename="gemm.tsr", target="cpu")
    meta = program.ir("meta")
    flags = list(meta["build"]["flags"])
    fast = cpu_runtime.load(program.source, meta, flags)
    portable = cpu_runtime.load(program.source, meta, [*flags, "-DTSR_PORTABLE_SUMS"])
    a = rng.standard_normal((GEMM, GEMM)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((GEMM, GEMM)).astype(ml_dtypes.bfloat16)
    x = rng.integers(-128, 128, (GEMM, GEMM), dtype=np.int8)
    w = rng.integers(-128, 128, (GEMM, GEMM), dtype=np.int8)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    out = np.empty((GEMM, GEMM), np.float32)
    seconds = _median_seconds({
        "tessera_bf16_vdpbf16ps": lambda: fast.gemm_bf16(a, b, out=out),
        "tessera_bf16_portable_sums": lambda: portable.gemm_bf16(a, b, out=out),
        "tessera_i8_vpdpbusd": lambda: fast.gemm_i8(x, w, out=out),
        "tessera_i8_vpdpbusd_dot_then_add": lambda: fast.gemm_i8_dot_then_add(x, w, out=out),
        "tessera_i8_portable_sums": lambda: portable.gemm_i8(x, w, out=out),
        "numpy_sgemm_f32": lambda: np.matmul(a32, b32),
    })  # fmt: skip
    return _against_numpy_sgemm(seconds, result="f32")


#: The graph-level int8 product (exact, i32) and a W8A8 layer after it.
W8A8_SOURCE = """
@jit
def int_mm(x: Tensor["M", "K", i8], w: Tensor["K", "N", i8]) -> Tensor["M", "N", i32]:
    return x @ w


@jit
def w8a8(x: Tensor["M", "K", i8], w: Tensor["K", "N", i8], x_scale: Tensor["M", f32],
         w_scale: Tensor["N", f32]) -> Tensor["M", "N", f32]:
    return cast(x @ w, f32) * x_scale[:, None] * w_scale[None, :]
"""


def _w8a8(rng: np.random.Generator) -> dict[str, object]:
    """The graph-level int8 product and W8A8 layer at 2048 against numpy's SGEMM on f32
    copies, beside the int8 tile kernel of ``GEMM_SOURCE`` (one f32 accumulator, exact
    only below 2^24: the main loop's speed without the exact parts), as FLOP rates."""
    graph = tessera.compile(W8A8_SOURCE, filename="w8a8.tsr", target="cpu").load()
    tile = tessera.compile(GEMM_SOURCE, filename="gemm.tsr", target="cpu").load()
    x = rng.integers(-128, 128, (GEMM, GEMM), dtype=np.int8)
    w = rng.integers(-128, 128, (GEMM, GEMM), dtype=np.int8)
    xs = rng.uniform(0.001, 0.01, GEMM).astype(np.float32)
    ws = rng.uniform(0.001, 0.01, GEMM).astype(np.float32)
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    exact = (x.astype(np.float64) @ w.astype(np.float64)).astype(np.int64)  # < 2^53: exact
    acc, out = np.empty((GEMM, GEMM), np.int32), np.empty((GEMM, GEMM), np.float32)
    assert np.array_equal(graph.int_mm(x, w, out=acc), exact)
    scaled = exact.astype(np.float32) * xs[:, None] * ws[None, :]
    assert np.array_equal(graph.w8a8(x, w, xs, ws, out=out), scaled)
    seconds = _median_seconds({
        "tessera_graph_i8_matmul_i32": lambda: graph.int_mm(x, w, out=acc),
        "tessera_graph_w8a8_scaled_f32": lambda: graph.w8a8(x, w, xs, ws, out=out),
        "tessera_tile_i8_one_f32_accumulator": lambda: tile.gemm_i8(x, w, out=out),
        "numpy_sgemm_f32": lambda: np.matmul(x32, w32),
    })  # fmt: skip
    return _against_numpy_sgemm(seconds)


def _against_numpy_sgemm(seconds: dict[str, float], **fields: str) -> dict[str, object]:
    """A GEMM-at-``GEMM`` case: each timing in ms, as a FLOP rate, and as a ratio over
    numpy's SGEMM of the same run (printed too)."""
    flops = 2.0 * GEMM**3
    numpy = seconds["numpy_sgemm_f32"]
    case = {
        "m": GEMM, "n": GEMM, "k": GEMM, **fields,
        "ms": {k: round(v * 1e3, 2) for k, v in seconds.items()},
        "gflop_per_s": {k: round(flops / v / 1e9, 1) for k, v in seconds.items()},
        "ratio_over_numpy_sgemm": {
            k: round(numpy / v, 3) for k, v in seconds.items() if k != "numpy_sgemm_f32"},
    }  # fmt: skip
    print(json.dumps(case))
    return case


def _graph_case(
    m: int, fused: Callable[..., Any], two_steps: Callable[..., None], tile: Callable[..., Any],
    q: np.ndarray, scale: np.ndarray, weight: torch.Tensor, rng: np.random.Generator,
) -> dict[str, object]:  # fmt: skip
    """One size: the graph-level product (one kernel), its two steps, the hand-written
    tile kernel and torch's product by the bf16 ``weight``, once checked to agree."""
    out = np.empty((m, SIZE), np.float32)
    x = rng.standard_normal((m, SIZE)).astype(ml_dtypes.bfloat16)
    x_bf16 = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    one = fused(x, q, scale)
    two_steps(x, out)
    assert np.allclose(one, out, rtol=1e-4, atol=1e-4 * np.abs(out).max())
    seconds = _median_seconds({
        "graph_x_at_dequantize": lambda: fused(x, q, scale, out=out),
        "dequantize_then_matmul": lambda: two_steps(x, out),
        "tile_kernel": lambda: tile(x, q, scale, out=out),
        "torch_bf16_dequantized": lambda: torch.matmul(x_bf16, weight),
    })  # fmt: skip
    return {
        "m": m, "n": SIZE, "k": SIZE,
        "ms": {k: round(v * 1e3, 3) for k, v in seconds.items()},
        "weight_gb_per_s": {k: round(q.nbytes / v / 1e9, 2) for k, v in seconds.items()},
        "ratio_two_steps_over_one_kernel": round(
            seconds["dequantize_then_matmul"] / seconds["graph_x_at_dequantize"], 3),
    }  # fmt: skip


def _graph_level(lib: Any, graph: Any, rng: np.random.Generator) -> dict[str, object]:
    """The graph-level ``x @ dequantize(...)`` (one kernel) against its two steps (the
    temporary, then the product), the hand-written tile kernel and torch beside them; the
    ratio is the two steps' time over the one kernel's."""
    found: dict[str, object] = {}
    for name, (make, dequantize, tile, fused, sizes) in {
        "w4a16_group_32": (_w4a16_weight, graph.dequantize_i4, lib.w4a16, graph.w4a16_graph,
                           (1, 2, 4, 8, 16)),
        "w8a16_per_column": (_w8a16_weight, graph.dequantize_i8, lib.w8a16, graph.w8a16_graph,
                             (1, 16)),
    }.items():  # fmt: skip
        q, scale = make(lib, rng)
        weight = np.empty((SIZE, SIZE), ml_dtypes.bfloat16)
        dequantize(q, scale, out=weight)
        weight_bf16 = torch.from_numpy(weight.astype(np.float32)).to(torch.bfloat16)
        two_steps = _two_steps(dequantize, graph, q, scale)
        found[name] = []
        for m in sizes:
            case = _graph_case(m, fused, two_steps, tile, q, scale, weight_bf16, rng)
            print(json.dumps({name: case}))
            found[name].append(case)
    return found


def main() -> None:
    if "--graph" in sys.argv[1:]:
        load_before = os.getloadavg()[0]
        result = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        lib = tessera.compile_file(ROOT / "examples" / "quant_linear.tsr", target="cpu").load()
        graph = tessera.compile(GRAPH_SOURCE, filename="graph.tsr", target="cpu").load()
        threads = os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))
        result[f"graph_level_{threads}_threads"] = {
            **_graph_level(lib, graph, np.random.default_rng(0)), "runs": RUNS,
            "machine": machine(load_before), "noise": GRAPH_NOISE}  # fmt: skip
        write_file(RESULTS, json.dumps(result, indent=2) + "\n")
        return
    if "--w8a8" in sys.argv[1:]:
        load_before = os.getloadavg()[0]
        result = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        threads = os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))
        result[f"graph_w8a8_{threads}_threads"] = {
            **_w8a8(np.random.default_rng(0)), "runs": RUNS,
            "machine": machine(load_before), "noise": GRAPH_NOISE}  # fmt: skip
        write_file(RESULTS, json.dumps(result, indent=2) + "\n")
        return
    if "--gemm" in sys.argv[1:]:
        load_before = os.getloadavg()[0]
        result = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        # OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 gives the rates of one core each, which
        # other work on a shared machine disturbs less than OpenBLAS's threads.
        threads = os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))
        result[f"low_precision_gemm_{threads}_threads"] = {
            **_gemm(np.random.default_rng(0)), "machine": machine(load_before)}  # fmt: skip
        write_file(RESULTS, json.dumps(result, indent=2) + "\n")
        return
    lib = tessera.compile_file(ROOT / "examples" / "quant_linear.tsr", target="cpu").load()
    graph = tessera.compile(GRAPH_SOURCE, filename="graph.tsr", target="cpu").load()
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()[0]  # other work on the machine stretches every timing
    w8a16 = _w8a16(lib, graph, rng)
    w4a16 = _w4a16(lib, rng)
    gemm = _gemm(rng)
    result = {
        "machine": machine(load_before),
        "runs": RUNS,
        "w8a16": w8a16,
        "w4a16": w4a16,
        f"low_precision_gemm_{os.cpu_count()}_threads": gemm,
    }  # fmt: skip
    write_file(RESULTS, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
