"""Observability of a run: the metrics log (one JSON line per launch, with the
roofline's FLOPs and bytes) and the NVTX ranges, on the CPU and OpenCL runtimes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tessera
from tessera.runtime import telemetry
from tessera.runtime.opencl import OpenclUnavailable, _queue

from .gpusim import simulated_cupy, use_simulator
from .test_launch_path import SOURCE

#: The sizes of the calls.
M, N = 37, 45


@pytest.fixture(autouse=True)
def telemetry_off() -> Iterator[None]:
    yield
    telemetry.configure()


def _opencl() -> None:
    try:
        _queue()
    except OpenclUnavailable as exc:
        pytest.skip(f"needs pyopencl and an OpenCL platform (PoCL): {exc}")


def _load(target: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``test_launch_path``'s module (its functions up to ``matmul`` on the simulated GPU,
    as there), whose builds the runs share."""
    if target == "opencl":
        _opencl()
    source = SOURCE
    if target == "cuda":
        use_simulator(monkeypatch, simulated_cupy("sm_80"))
        source = SOURCE[: SOURCE.index("@kernel\ndef matmul")]
    return tessera.compile(source, "launch.tsr", target=target).load()


def _arguments() -> tuple[Any, ...]:
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((2, M, N)).astype(np.float32)
    return a, b, 0.5, rng.standard_normal(N).astype(np.float32)


@pytest.mark.execute
@pytest.mark.parametrize("target", ["cpu", "opencl", "cuda"])
def test_each_launch_is_a_json_line_with_its_flops_and_bytes(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = _load(target, monkeypatch)
    a, b, s, w = _arguments()
    log = tmp_path / "metrics.jsonl"
    lib.functions["scaled_sum"]._fast = lambda *_, **__: pytest.fail("telemetry: the full path")
    telemetry.configure(metrics=log)
    for _ in range(3):
        out = lib.scaled_sum(a, b, s, w)
    if target == "cpu":  # one call of the C entry runs the function's two kernels
        lib.column(np.ones(1, np.float32), np.ones((1, 1), np.float32))  # its guard: N == 1
    telemetry.configure()
    lib.functions["scaled_sum"]._fast = None
    lib.scaled_sum(a, b, s, w)  # not logged
    np.testing.assert_allclose(out, (a.astype(np.float64) + b) * s + w, rtol=1e-5, atol=1e-6)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    kernel = "tessera_scaled_sum" if target == "cpu" else "scaled_sum"
    assert len(records) == (4 if target == "cpu" else 3)
    for record in records[:3]:
        assert record["target"] == target
        assert (record["function"], record["kernel"]) == ("scaled_sum", kernel)
        assert record["sizes"] == {"M": M, "N": N} and record["seconds"] > 0
        assert (record["flops"], record["bytes"]) == (3 * M * N, 12 * M * N + 4 * N)
        assert record["flop_per_s"] == pytest.approx(record["flops"] / record["seconds"])
        assert record["bytes_per_s"] == pytest.approx(record["bytes"] / record["seconds"])
    if target == "cpu":
        assert (records[3]["kernel"], records[3]["flops"]) == ("tessera_column", 2)


@pytest.mark.execute
def test_launches_and_copies_are_nvtx_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    ranges: list[str] = []
    fake = (lambda name: ranges.append(name.decode()), lambda: ranges.append("pop"))
    monkeypatch.setattr(telemetry, "nvtx_library", lambda: fake)
    seen: list[dict[str, Any]] = []
    telemetry.configure(metrics=seen.append, nvtx=True)
    _load("cpu", monkeypatch).scaled_sum(*_arguments())
    assert ranges == ["launch:tessera_scaled_sum", "pop"]
    ranges.clear()
    _load("opencl", monkeypatch).scaled_sum(*_arguments())
    copies = ["copy:scaled_sum", "pop"]
    assert ranges == [*copies, "launch:scaled_sum", "pop", *copies]
    assert [r["target"] for r in seen] == ["cpu", "opencl"]


def test_the_switches_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert telemetry.from_environment({}) == {"metrics": None, "nvtx": False}
    given = {"TESSERA_METRICS": "m.jsonl", "TESSERA_NVTX": "1"}
    assert telemetry.from_environment(given) == {"metrics": "m.jsonl", "nvtx": True}
    monkeypatch.setattr(telemetry, "nvtx_library", lambda: None)
    with pytest.warns(RuntimeWarning, match="no NVTX library"):
        telemetry.configure(nvtx=True)
    assert not telemetry.STATE.on


def test_the_nvtx_library_takes_ranges_where_it_is_installed() -> None:
    library = telemetry.nvtx_library()
    if library is None:
        pytest.skip("needs an NVTX library (libnvToolsExt or CUDA's libnvtx3interop)")
    push, pop = library
    push(b"launch:test")
    pop()
