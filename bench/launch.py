"""Benchmark: the host's time per call of a Tessera function, against the library's own
op on the same arrays and against a bare launch.

What a call costs the host beyond its kernels: the argument checks, the results'
allocation, the launches. Each case is a small function called back to back (tiny
arrays, so the kernels cost little), timed as the wall time of ``--calls`` calls
divided by their number, median of ``--runs`` runs after ``--warmup``, its peers
interleaved with it run by run:

- ``tessera``: the call as a user writes it, ``lib.f(a, b)`` (the launch path of
  ``docs/runtime.md``; on the CPU, once the module is warm);
- ``full checks``: the same call with its inputs by name and a preallocated ``out=``
  (the fast paths take ``out=``, not keyword inputs), which takes the checks and
  launches every call took before the fast path;
- ``numpy`` / ``torch``: the library's own op on the same arrays;
- ``bare``: the lower bound, the function's kernels called with the arguments
  prepared once: on the CPU its C entry through ctypes, on the GPU one
  ``cuLaunchKernel`` per kernel from prepared parameter blocks.

CPU (the default): numpy arrays, peers numpy and torch (CPU). GPU (``--gpu``): torch
CUDA tensors, the peer torch; the calls are enqueued without a synchronization inside
the timing (one after each run), so the figure is the host's time, as long as the GPU
keeps up. Each GPU case also checks its result against torch in float64 and records
the relative error, and records whether the fast path took the call. A case that
fails records its error in the JSON and the run goes on. Results go to
``bench/results/launch.json`` under ``cpu`` or ``gpu`` (the other key is kept).

The GPU measurement, from the repository root on a machine with an NVIDIA GPU,
CuPy and torch with CUDA:

    PYTHONPATH=$PWD python3 bench/launch.py --gpu --out "${OUT:-bench/results}/launch.json"

(about two minutes: NVRTC builds, nvcc for the host launcher's program, then the runs;
the JSON keeps whatever the file at --out held under ``cpu``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout, without an install

import numpy as np  # noqa: E402

import tessera  # noqa: E402
from tessera.cli.main import main as cli_main  # noqa: E402
from tessera.files import write_file  # noqa: E402
from tessera.runtime.cpu import WARM_CALLS  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "launch.json"

SOURCE = """\
@kernel
def add(a: Tensor["M", "N", {t}], b: Tensor["M", "N", {t}]) -> Tensor["M", "N", {t}]:
    return a + b

@kernel
def sum7(a: Tensor["M", "N", {t}], b: Tensor["M", "N", {t}], c: Tensor["M", "N", {t}],
         d: Tensor["M", "N", {t}], e: Tensor["M", "N", {t}], f: Tensor["M", "N", {t}],
         g: Tensor["M", "N", {t}]) -> Tensor["M", "N", {t}]:
    return a + b + c + d + e + f + g

@kernel
def matmul(a: Tensor["M", "K", {t}], b: Tensor["K", "N", {t}]) -> Tensor["M", "N", {t}]:
    return a @ b
"""

Timer = Callable[[], None]


#: The clocks a run may time with: wall time, or the CPU time of the calling thread,
#: which a machine whose cores other processes share does not inflate (every call of the
#: CPU cases runs on the calling thread: their grids are one program).
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def timed(peers: dict[str, Timer | None], runs: int, warmup: int, calls: int,
          sync: Callable[[], None], clock: Callable[[], float] = time.perf_counter,
          ) -> dict[str, float | None]:  # fmt: skip
    """Median seconds per call of each peer (None where it is absent), interleaved."""
    times: dict[str, list[float]] = {name: [] for name in peers}
    for run in range(warmup + runs):
        for name, peer in peers.items():
            if peer is None:
                continue
            sync()
            start = clock()
            for _ in range(calls):
                peer()
            elapsed = clock() - start
            sync()
            if run >= warmup:
                times[name].append(elapsed / calls)
    return {name: statistics.median(t) if t else None for name, t in times.items()}


def ratios(seconds: dict[str, float | None]) -> dict[str, Any]:
    """Microseconds per call, and each peer's time over Tessera's (above 1: Tessera's
    call costs the host less)."""
    ours = seconds["tessera"]
    peers = {k: v for k, v in seconds.items() if k != "tessera"}
    return {
        "us_per_call": {k: v and round(v * 1e6, 2) for k, v in seconds.items()},
        "peer_over_tessera": {k: v and ours and round(v / ours, 3) for k, v in peers.items()},
    }


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()[:2000]


def _by_name(function: Any, inputs: tuple[Any, ...]) -> dict[str, Any]:
    """A call's inputs by their parameters' names: such a call takes the full checks."""
    names = [p["name"] for p in function.meta["params"] if p.get("io") != "out"]
    return dict(zip(names, inputs, strict=True))


# -- CPU -------------------------------------------------------------------------------


def _cpu_bare(function: Any, arrays: list[np.ndarray], sizes: list[int]) -> Timer:
    """The C entry with its addresses prepared: the call without any check."""
    entry = function._entry
    args = [a.ctypes.data for a in arrays] + sizes
    return lambda: entry(*args)


def cpu_cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the machine
        torch = None
    lib = tessera.compile(SOURCE.format(t="f32"), "launch.tsr", target="cpu").load()
    rng = np.random.default_rng(0)
    warm = np.ones((1, 1), np.float32)
    for _ in range(WARM_CALLS):  # the module's C calls are built at the last of these
        lib.add(warm, warm, out=warm)
    cases = []
    n = 4
    x = [rng.standard_normal((n, n), dtype=np.float32) for _ in range(7)]
    out = np.empty((n, n), np.float32)
    t = [torch.from_numpy(a) for a in x] if torch else None
    specs = {
        "add 4x4 f32 (3 tensor arguments)": (
            lambda: lib.add(x[0], x[1]), lambda: lib.add(**_by_name(lib.add, x[:2]), out=out),
            lambda: np.add(x[0], x[1]), t and (lambda: torch.add(t[0], t[1])),
            _cpu_bare(lib.add, [x[0], x[1], out], [n, n])),
        "sum of 7 4x4 f32 (8 tensor arguments)": (
            lambda: lib.sum7(*x), lambda: lib.sum7(**_by_name(lib.sum7, x), out=out),
            lambda: x[0] + x[1] + x[2] + x[3] + x[4] + x[5] + x[6],
            t and (lambda: t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6]),
            _cpu_bare(lib.sum7, [*x, out], [n, n])),
        "matmul 4x4 f32 (a tiny product)": (
            lambda: lib.matmul(x[0], x[1]),
            lambda: lib.matmul(**_by_name(lib.matmul, x[:2]), out=out),
            lambda: np.matmul(x[0], x[1]), t and (lambda: torch.matmul(t[0], t[1])),
            _cpu_bare(lib.matmul, [x[0], x[1], out], [n, n, n])),
    }  # fmt: skip
    for case, (ours, full, numpy_op, torch_op, bare) in specs.items():
        try:
            seconds = timed({"tessera": ours, "full checks": full, "numpy": numpy_op,
                             "torch": torch_op, "bare": bare},
                            args.runs, args.warmup, args.calls, lambda: None,
                            CLOCKS[args.clock])  # fmt: skip
            cases.append({"case": case, **ratios(seconds)})
        except Exception as exc:
            cases.append({"case": case, "error": _error(exc)})
        print(json.dumps(cases[-1]))
    return cases


# -- GPU -------------------------------------------------------------------------------


def _gpu_bare(function: Any, values: list[Any]) -> Timer | None:
    """One ``cuLaunchKernel`` per kernel of ``function`` from parameter blocks of its own,
    filled once with ``values`` (the tensors' addresses, then the sizes): the launches
    alone. Tensor maps are copied as the function's last call encoded them (of the same
    inputs). None for a function with intermediate buffers."""
    launches = getattr(function, "_launches", None)
    if launches is None or launches._buffers:
        return None
    sizes = values[launches._first_size :]
    prepared, kept = [], []
    for launch in launches._launches:
        fills = iter(launch.fills)
        slots = []
        for slot in launch.slots:
            if isinstance(slot, ctypes.Array):  # a tensor map
                slots.append(type(slot).from_buffer_copy(slot))
                continue
            _, _, index = next(fills)
            slots.append(type(slot)(values[index]))
        params = (ctypes.c_void_p * max(1, len(slots)))(*map(ctypes.addressof, slots))
        kept.append(slots)
        grid = [-(-(int(e) if e.isdigit() else sizes[launches._symbols.index(e)]) // b)
                for e, b in launch.grid]  # fmt: skip
        grid += [1] * (3 - len(grid))
        prepared.append((launch.handle, *grid, launch.threads, 1, 1, launch.smem, 0, params,
                         None))  # fmt: skip
    launch_kernel = launches._launch

    def bare() -> None:
        for call in prepared:
            launch_kernel(*call)

    bare.kept = kept  # the slots the parameter blocks point into
    return bare


def gpu_cases(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"error": "torch sees no CUDA device"}
    capability = "{}{}".format(*torch.cuda.get_device_capability())
    arch = args.arch or ("sm_90a" if capability == "90" else f"sm_{capability}")
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "arch": arch,
                              "torch": torch.__version__, "cases": []}  # fmt: skip
    sync = torch.cuda.synchronize
    rng = np.random.default_rng(0)

    def check(have: Any, want: Any) -> float:
        have, want = have.double(), want.double()
        return float((have - want).abs().max() / max(float(want.abs().max()), 1e-30))

    libs: dict[str, Any] = {}
    for t in ("f32", "bf16"):
        try:
            libs[t] = tessera.compile(SOURCE.format(t=t), "launch.tsr", target="cuda",
                                      arch=arch).load()  # fmt: skip
        except Exception as exc:
            report["cases"].append({"case": f"compile and load {t}", "error": _error(exc)})
            traceback.print_exc()
    n = 64

    def tensors(count: int, dtype: Any, shape: tuple[int, ...] = (n, n)) -> list[Any]:
        return [torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
                .to("cuda").to(dtype) for _ in range(count)]  # fmt: skip

    specs: dict[str, Callable[[], tuple[Any, ...]]] = {}
    if "f32" in libs:
        lib = libs["f32"]

        def add() -> tuple[Any, ...]:
            a, b = tensors(2, torch.float32)
            out = torch.empty_like(a)
            return (lib.add, (a, b), out, lambda: torch.add(a, b), a + b,
                    [a.data_ptr(), b.data_ptr(), out.data_ptr(), n, n])  # fmt: skip

        def sum7() -> tuple[Any, ...]:
            x = tensors(7, torch.float32)
            out = torch.empty_like(x[0])
            chain = lambda: x[0] + x[1] + x[2] + x[3] + x[4] + x[5] + x[6]  # noqa: E731
            return (lib.sum7, tuple(x), out, chain, sum(x),
                    [*(v.data_ptr() for v in x), out.data_ptr(), n, n])  # fmt: skip

        specs[f"add {n}x{n} f32 (3 tensor arguments)"] = add
        specs[f"sum of 7 {n}x{n} f32 (8 tensor arguments)"] = sum7
    if "bf16" in libs:
        lib16 = libs["bf16"]

        def matmul() -> tuple[Any, ...]:
            a, b = tensors(2, torch.bfloat16, (128, 128))
            out = torch.empty_like(a)
            return (lib16.matmul, (a, b), out, lambda: torch.matmul(a, b),
                    a.double() @ b.double(),
                    [a.data_ptr(), b.data_ptr(), out.data_ptr(), 128, 128, 128])  # fmt: skip

        specs["matmul 128x128x128 bf16"] = matmul

    def mlp() -> tuple[Any, ...]:
        """examples/mlp.tsr: two launches and an intermediate (on sm_90a, TMA tensor maps
        of the inputs and of the intermediate); its result against the full path's."""
        function = tessera.compile_file(ROOT / "examples/mlp.tsr", target="cuda",
                                        arch=arch).load().mlp  # fmt: skip
        t, d, f = 70, 48, 70
        (x,) = tensors(1, torch.bfloat16, (t, d))
        w_in, w_out = (w / 8 for w in tensors(2, torch.bfloat16, (d, f)))
        w_out = w_out.reshape(f, d)
        (b_in,), (b_out,) = tensors(1, torch.float32, (f,)), tensors(1, torch.float32, (d,))
        inputs = (x, w_in, b_in, w_out, b_out)
        out = torch.empty_like(x)
        function(*inputs, out=out)

        def torch_op() -> Any:
            h = torch.nn.functional.gelu(x.float() @ w_in.float() + b_in).bfloat16()
            return (x.float() + h.float() @ w_out.float() + b_out).bfloat16()

        return (function, inputs, out, torch_op, out.clone(), [])

    specs["mlp T70 D48 F70 bf16 (5 inputs, 2 launches, an intermediate)"] = mlp
    for case, make in specs.items():
        row: dict[str, Any] = {"case": case}
        try:
            function, inputs, out, torch_op, want, bare_values = make()
            result = function(*inputs)
            sync()
            row["relative_error"] = check(result, want)
            row["fast_path"] = any(p is not None for p in getattr(function, "_paths", {}).values())
            peers: dict[str, Timer | None] = {
                "tessera": lambda f=function, i=inputs: f(*i),
                "full checks": lambda f=function, i=inputs, o=out: f(**_by_name(f, i), out=o),
                "torch": torch_op,
                "bare": _gpu_bare(function, bare_values),
            }
            row.update(ratios(timed(peers, args.runs, args.warmup, args.calls, sync)))
        except Exception as exc:
            row["error"] = _error(exc)
            traceback.print_exc()
        report["cases"].append(row)
        print(json.dumps(row))
    report["cases"].append(host_launcher(arch, args.calls))
    print(json.dumps(report["cases"][-1]))
    return report


def host_launcher(arch: str, calls: int) -> dict[str, Any]:
    """mlp (examples/mlp.tsr: two launches, an intermediate, on sm_90a TMA maps and
    196 KiB of shared memory) called from C++ through the host launcher of the file
    tesserac writes, built with nvcc (``tests/host_launcher/mlp_main.cpp``): its
    statuses, its result against the Python runtime's on the same inputs, and the host's
    time per call of ``calls`` calls back to back."""
    import torch

    row: dict[str, Any] = {"case": "mlp T70 D48 F136 through the C++ host launcher (nvcc)"}
    nvcc = shutil.which("nvcc") or next(
        (str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))), None
    )
    if nvcc is None:
        row["skipped"] = "no nvcc"
        return row
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            kernels, program = work / "mlp.cu", work / "main.cpp"
            status = cli_main([str(ROOT / "examples/mlp.tsr"), "-o", str(kernels), "--arch", arch])
            if status != 0:
                return {**row, "error": f"tesserac exited {status}"}
            program.write_text((ROOT / "tests/host_launcher/mlp_main.cpp").read_text())
            number = arch.removeprefix("sm_")
            done = subprocess.run(
                [nvcc, "-std=c++17", f"-gencode=arch=compute_{number},code=sm_{number}",
                 str(kernels), str(program), "-o", str(work / "mlp_host")],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                return {**row, "error": f"nvcc failed: {done.stderr[-1500:]}"}
            rng = np.random.default_rng(7)
            T, D, F = 70, 48, 136
            inputs = [rng.standard_normal((T, D)), rng.standard_normal((D, F)) / 8,
                      rng.standard_normal(F), rng.standard_normal((F, D)) / 8,
                      rng.standard_normal(D)]  # fmt: skip
            tensors = [torch.from_numpy(a.astype(np.float32)).to("cuda") for a in inputs]
            for i in (0, 1, 3):
                tensors[i] = tensors[i].to(torch.bfloat16)
            for name, t in zip(("x", "W_in", "b_in", "W_out", "b_out"), tensors, strict=True):
                raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
                (work / name).write_bytes(raw.cpu().numpy().tobytes())
            command = [str(work / "mlp_host"), str(work), *map(str, (T, D, F, calls))]
            ran = subprocess.run(command, capture_output=True, text=True, check=False)
            if ran.returncode != 0:
                return {**row, "error": f"exit {ran.returncode}: {ran.stderr[-1500:]}"}
            need, *statuses, per_call = ran.stdout.split()
            cases = ("workspace too small", "workspace given", "no workspace", "negative size")
            row["workspace_bytes"] = int(need)
            row["statuses"] = dict(zip(cases, map(int, statuses), strict=True))
            row["statuses_as_documented"] = list(map(int, statuses)) == [2, 0, 0, 1]
            row["us_per_call"] = float(per_call)
            have = np.frombuffer((work / "out").read_bytes(), np.int16).reshape(T, D)
            mlp = tessera.compile_file(ROOT / "examples/mlp.tsr", target="cuda", arch=arch).load()
            want = mlp.mlp(*tensors).view(torch.int16).cpu().numpy()
            row["same_bits_as_the_python_runtime"] = bool(np.array_equal(have, want))
    except Exception as exc:
        row["error"] = _error(exc)
        traceback.print_exc()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="GPU measurement (repository root, a machine with an NVIDIA GPU, CuPy and "
        'torch with CUDA): PYTHONPATH=$PWD python3 bench/launch.py --gpu --out "${OUT:-'
        'bench/results}/launch.json"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--gpu", action="store_true", help="torch CUDA tensors on the GPU")
    parser.add_argument("--arch", help="the CUDA arch (default: the GPU's; sm_90a on sm_90)")
    parser.add_argument("--runs", type=int, default=9, help="timed runs (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--clock", choices=CLOCKS, default="wall",
                        help="CPU cases: wall time, or the calling thread's CPU time")  # fmt: skip
    args = parser.parse_args(argv)
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    common = {"python": platform.python_version(), "machine": platform.machine(),
              "numpy": np.__version__, "runs": args.runs, "warmup": args.warmup,
              "calls": args.calls, "clock": "wall" if args.gpu else args.clock}  # fmt: skip
    if args.gpu:
        try:
            report = {**common, **gpu_cases(args)}
        except Exception as exc:
            traceback.print_exc()
            report = {**common, "error": _error(exc)}
        previous["gpu"] = report
    else:
        previous["cpu"] = {**common, "cases": cpu_cases(args)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_file(args.out, json.dumps(previous, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
