"""Benchmark: the CUDA backend against cuBLAS and torch SDPA on one GPU, in one process.

Kernels: GEMM (``C = A @ B``, row-major, output in the input dtype) in bf16 and f16
at 4096 and 8192 against ``torch.matmul`` (cuBLAS); fp8 e4m3 as cuBLAS takes it, ``C =
A @ W.T`` with ``W`` stored ``[N, K]``, against ``torch._scaled_mm`` with unit scales on
the same memory; attention forward in bf16, B4 H16, S from 1k
to 16k, D 64 and 128, causal and not, against torch ``scaled_dot_product_attention``
on its flash backend. Tessera's kernels get torch tensors where they lie (no copies).

Each case checks Tessera's output against the peer's first (the relative error is
recorded, not asserted), then times both interleaved with CUDA events, median of
several runs after warm-up, two ways: ``queue`` calls launched back to back (the GPU's
time per call, as in a model's forward pass, where the host runs ahead: ``ratio``),
and one call alone, waited for (the host's work for the call included: ``call_ratio``).
A case Tessera cannot compile or run is recorded with the message. Results go to
``bench/results/gpu.json`` with the device's name.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tessera
from tessera.files import write_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "gpu.json"

GEMM = """\
{decorator}
def gemm(A: Tensor["M", "K", {dtype}], B: Tensor[{b}, {dtype}]) -> Tensor["M", "N", {out}]:
    return {product}
"""

ATTENTION = """\
@kernel
def attention(q: Tensor["B", "H", "S", "D", bf16], k: Tensor["B", "H", "S", "D", bf16],
              v: Tensor["B", "H", "S", "D", bf16]) -> Tensor["B", "H", "S", "D", bf16]:
    return ops.flash_attention(q, k, v, causal={causal})
"""

#: The GEMM kernels timed side by side in each case, by variant: the heuristic's (on
#: sm_90a, one program per multiprocessor looping over the output tiles), and one
#: program per output tile.
GEMM_VARIANTS = {"default": "@kernel", "per-tile": "@kernel.schedule(Schedule(persistent=False))"}
#: The kinds of case, for ``--cases``.
KINDS = ("gemm", "attention")

#: Tessera's dtype name, torch's, and the output dtype (fp8 products write bf16).
GEMM_DTYPES = {"bf16": ("bfloat16", "bf16"), "f16": ("float16", "f16"),
               "fp8_e4m3": ("float8_e4m3fn", "bf16")}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="timed runs per kernel (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    parser.add_argument("--queue", type=int, default=10, help="calls per back-to-back run")
    parser.add_argument("--arch", default="sm_90a", help="the CUDA arch to compile for")
    parser.add_argument("--quick", action="store_true", help="one size of each kind")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--cases", nargs="+", choices=KINDS, default=list(KINDS),
                        help="the kinds of case to run (default: all)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench/gpu.py needs torch with CUDA")
        return 2
    if not torch.cuda.is_available():
        print("bench/gpu.py needs an NVIDIA GPU (torch sees none)")
        return 2

    bench = _Bench(torch, args.runs, args.warmup, args.queue, args.arch)
    report = {
        "device": torch.cuda.get_device_name(),
        "capability": "sm_{}{}".format(*torch.cuda.get_device_capability()),
        "arch": args.arch,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "runs": args.runs,
        "warmup": args.warmup,
        "queue": args.queue,
        "cases": bench.cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # The JSON is rewritten after every case, so that a run cut short (a hung kernel,
    # a lost machine) keeps what it measured. The figures most asked for (GEMM 8192,
    # attention at head dim 128 and long sequences) come first within their kind.
    sizes = [4096] if args.quick else [8192, 4096]
    seqs = [4096, 1024] if args.quick else [4096, 8192, 16384, 1024, 2048]
    runs = []
    if "gemm" in args.cases:
        runs += [lambda t=dtype, n=n: bench.gemm(t, n) for dtype in GEMM_DTYPES for n in sizes]
    if "attention" in args.cases:
        runs += [lambda s=s, d=d, c=causal: bench.attention(4, 16, s, d, c)
                 for d in (128, 64) for s in seqs for causal in (False, True)]  # fmt: skip
    for run in runs:
        run()
        write_file(args.out, json.dumps(report, indent=2) + "\n")
    _table(report)
    return 0


class _Bench:
    """The cases measured so far, and how to measure one."""

    def __init__(self, torch: Any, runs: int, warmup: int, queue: int, arch: str) -> None:
        self.torch, self.runs, self.warmup, self.queue = torch, runs, warmup, queue
        self.arch = arch
        self.cases: list[dict[str, Any]] = []
        self._loaded: dict[tuple[str, tuple[tuple[str, int], ...]], Any] = {}

    def _kernel(self, source: str, name: str, defines: dict[str, int]) -> Any:
        """The loaded function, compiled once per source and defines: the sizes of
        the cases that share them are bound at each call."""
        key = (source, tuple(sorted(defines.items())))
        if key not in self._loaded:
            program = tessera.compile(
                source, f"<bench {name}>", target="cuda", arch=self.arch, defines=defines
            )
            self._loaded[key] = getattr(program.load(), name)
        return self._loaded[key]

    def gemm(self, dtype: str, n: int) -> None:
        torch = self.torch
        torch_dtype, out = GEMM_DTYPES[dtype]
        case = {"kind": "gemm", "dtype": dtype, "M": n, "N": n, "K": n, "flop": 2 * n**3}
        a = torch.randn(n, n, device="cuda").to(getattr(torch, torch_dtype))
        b = torch.randn(n, n, device="cuda").to(getattr(torch, torch_dtype))
        layout = dict(b='"K", "N"', product="A @ B")
        if dtype.startswith("fp8"):
            # cuBLAS multiplies fp8 with B column-major only: W = B.T stored [N, K],
            # which Tessera reads as it lies in A @ W.T.
            one = torch.ones((), device="cuda")
            b = b.t().contiguous()
            case["layout"] = "A @ W.T"
            layout = dict(b='"N", "K"', product="A @ B.T")

            def peer() -> Any:
                return torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                                        out_dtype=torch.bfloat16)  # fmt: skip

        else:

            def peer() -> Any:
                return torch.matmul(a, b)

        sources = {variant: GEMM.format(decorator=decorator, dtype=dtype, out=out, **layout)
                   for variant, decorator in GEMM_VARIANTS.items()}  # fmt: skip
        self._measure(case, sources, "gemm", (a, b), peer)

    def attention(self, b: int, h: int, s: int, d: int, causal: bool) -> None:
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        flop = 4 * b * h * s * s * d // (2 if causal else 1)
        case = {"kind": "attention", "dtype": "bf16", "B": b, "H": h, "S": s, "D": d,
                "causal": causal, "flop": flop}  # fmt: skip
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in "qkv")

        def peer() -> Any:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return sdpa(q, k, v, is_causal=causal)

        source = ATTENTION.format(causal=causal)
        self._measure(case, {"default": source}, "attention", (q, k, v), peer, defines={"D": d})

    def _measure(
        self,
        case: dict[str, Any],
        sources: dict[str, str],
        name: str,
        inputs: tuple[Any, ...],
        peer: Callable[[], Any],
        defines: dict[str, int] | None = None,
    ) -> None:
        """Each variant's kernel against the peer: outputs compared, then all of them
        timed in turn in one run, so that every variant's ratio has the same peer."""
        torch = self.torch
        try:
            want = peer()
            torch.cuda.synchronize()
        except Exception as exc:  # recorded as each variant's error, and the others run
            failed = "".join(traceback.format_exception_only(exc)).strip()
            for variant in sources:
                self.cases.append({**case, "variant": variant, "error": f"the peer: {failed}"})
            print(f"{_label(case)}: the peer: {failed.splitlines()[0]}")
            return
        timed: list[tuple[dict[str, Any], Callable[[], Any]]] = []
        for variant, source in sources.items():
            this = {**case, "variant": variant}
            self.cases.append(this)
            try:
                ours = self._kernel(source, name, defines or {})
                out = ours(*inputs)
                torch.cuda.synchronize()
            except Exception as exc:  # a case that fails is recorded, and the others run
                this["error"] = "".join(traceback.format_exception_only(exc)).strip()
                print(f"{_label(this)}: {this['error'].splitlines()[0]}")
                continue
            diff = (out.float() - want.float()).norm() / want.float().norm()
            this["relative_error"] = float(diff)
            result = torch.empty_like(out)
            timed.append((this, lambda ours=ours, result=result: ours(*inputs, out=result)))
        if not timed:
            return
        queued, alone = _interleaved(torch, [fn for _, fn in timed] + [peer],
                                     self.runs, self.warmup, self.queue)  # fmt: skip
        peer_ms, peer_call = statistics.median(queued[-1]), statistics.median(alone[-1])
        for (this, _), q, a in zip(timed, queued[:-1], alone[:-1], strict=True):
            ours_ms, ours_call = statistics.median(q), statistics.median(a)
            this.update(
                tessera_ms=round(ours_ms, 4),
                peer_ms=round(peer_ms, 4),
                ratio=round(peer_ms / ours_ms, 3),
                tessera_tflops=round(this["flop"] / ours_ms / 1e9, 1),
                peer_tflops=round(this["flop"] / peer_ms / 1e9, 1),
                tessera_call_ms=round(ours_call, 4),
                peer_call_ms=round(peer_call, 4),
                call_ratio=round(peer_call / ours_call, 3),
            )
            print(f"{_label(this)}: ratio {this['ratio']}, one call {this['call_ratio']}"
                  f" (error {this['relative_error']:.1e})")  # fmt: skip


def _interleaved(
    torch: Any, fns: list[Callable[[], Any]], runs: int, warmup: int, queue: int
) -> tuple[list[list[float]], list[list[float]]]:
    """Milliseconds per call of each function, taken in turn so that clocks and heat
    treat them alike, with CUDA events: the mean of ``queue`` calls launched back to back,
    and one call alone, from before its host work to its end on the GPU."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    queued: list[list[float]] = [[] for _ in fns]
    alone: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, q, a in zip(fns, queued, alone, strict=True):
            for calls, sink in ((queue, q), (1, a)):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    fn()
                end.record()
                end.synchronize()
                sink.append(start.elapsed_time(end) / calls)
    return queued, alone


def _label(case: dict[str, Any]) -> str:
    variant = "" if case.get("variant", "default") == "default" else f" {case['variant']}"
    if case["kind"] == "gemm":
        return f"gemm {case['dtype']} {case['M']}{variant}"
    causal = " causal" if case["causal"] else ""
    return f"attention B{case['B']} H{case['H']} S{case['S']} D{case['D']}{causal}{variant}"


def _table(report: dict[str, Any]) -> None:
    print(f"\n{report['device']} ({report['capability']}), Tessera {report['arch']}")
    print(f"{'case':<36} {'tessera':>10} {'peer':>10} {'ratio':>6} {'TFLOP/s':>8} "
          f"{'one call':>8} {'error':>8}")  # fmt: skip
    for c in report["cases"]:
        if "error" in c:
            print(f"{_label(c):<36} {'failed: ' + c['error'].splitlines()[0][:60]}")
            continue
        times = f"{c['tessera_ms']:>8.3f}ms {c['peer_ms']:>8.3f}ms {c['ratio']:>6.3f}"
        print(f"{_label(c):<36} {times} {c['tessera_tflops']:>8.1f} {c['call_ratio']:>8.3f} "
              f"{c['relative_error']:>8.1e}")  # fmt: skip
    variants = dict.fromkeys(c.get("variant", "default") for c in report["cases"])
    for variant in variants:
        for key in ("ratio", "call_ratio"):
            ratios = [c[key] for c in report["cases"]
                      if key in c and c.get("variant", "default") == variant]  # fmt: skip
            if ratios:
                geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
                print(f"geometric mean {key} (peer time / Tessera time), {variant} kernels: "
                      f"{geo:.3f}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
