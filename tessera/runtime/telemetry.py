"""What a run of generated code tells about itself: NVTX ranges and a metrics log.

Two switches, off by default, read from the environment when the runtime is first
imported and set from Python with ``configure``:

- ``TESSERA_NVTX=1`` (``configure(nvtx=True)``): each launch runs inside an NVTX range
  (``launch:KERNEL``; on the CPU, where one call of the C entry runs every kernel of the
  function, ``launch:tessera_F``), and the copies between the host and a device inside
  ``copy:F``, so that Nsight Systems shows them on the timeline. The ranges go through
  the NVTX library found on the machine (``libnvToolsExt``, or CUDA 13's
  ``libnvtx3interop``); without one there are no ranges, and a warning says so once.
- ``TESSERA_METRICS=PATH`` (``configure(metrics=PATH)``, or a function that takes each
  record): one JSON line per launch, appended to ``PATH``: the function, the kernel, the
  sizes, the wall time in seconds, and where the metadata's roofline gives them
  (``analysis``), the FLOPs and bytes and the achieved FLOP/s and bytes/s.

While either is on, every call takes the full path (not the prepared fast paths of
``tessera.runtime.plan`` and ``cpu_ext``), and a metrics log waits for each launch to
finish before it takes the time: the log measures kernels, and it costs their overlap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..transpiler.graph.dims import parse_dim

__all__ = ["STATE", "configure", "from_environment", "launched", "copying", "nvtx_library"]

Record = dict[str, Any]


class _State:
    """The switches: ``on`` is read by every call, so it is one attribute."""

    def __init__(self) -> None:
        self.on = False
        self.sink: Callable[[Record], None] | None = None
        self.nvtx: tuple[Any, Any] | None = None


STATE = _State()


def configure(
    metrics: str | os.PathLike[str] | Callable[[Record], None] | None = None, nvtx: bool = False
) -> None:
    """Set both switches (see the module's docstring); ``configure()`` turns both off."""
    if isinstance(metrics, str | os.PathLike):
        metrics = _JsonLines(Path(metrics))
    STATE.sink = metrics
    STATE.nvtx = nvtx_library() if nvtx else None
    if nvtx and STATE.nvtx is None:
        warnings.warn(
            "NVTX ranges were asked for, but no NVTX library (libnvToolsExt, "
            "libnvtx3interop) is installed: there are none",
            RuntimeWarning,
            stacklevel=2,
        )
    STATE.on = STATE.sink is not None or STATE.nvtx is not None


def from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """``configure``'s arguments as ``TESSERA_METRICS`` and ``TESSERA_NVTX`` give them."""
    return {"metrics": environ.get("TESSERA_METRICS") or None,
            "nvtx": environ.get("TESSERA_NVTX", "0") not in ("", "0")}  # fmt: skip


@functools.cache
def nvtx_library() -> tuple[Any, Any] | None:
    """``nvtxRangePushA`` and ``nvtxRangePop`` of the first NVTX library found, or None."""
    names = [ctypes.util.find_library("nvToolsExt"), "libnvToolsExt.so.1",
             ctypes.util.find_library("nvtx3interop"), "libnvtx3interop.so.1"]  # fmt: skip
    for name in filter(None, names):
        try:
            library = ctypes.CDLL(name)
            push, pop = library.nvtxRangePushA, library.nvtxRangePop
        except (OSError, AttributeError):
            continue
        push.argtypes, push.restype, pop.argtypes, pop.restype = (
            [ctypes.c_char_p],
            ctypes.c_int,
            [],
            ctypes.c_int,
        )
        return push, pop
    return None


class _JsonLines:
    """A metrics file: each record one line, appended and flushed whole, so that two
    threads or processes logging to one file do not interleave within a line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, record: Record) -> None:
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with self._lock:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                os.write(descriptor, line)
            finally:
                os.close(descriptor)


def launched(
    meta: Mapping[str, Any], function: str, kernel: str, kernels: Iterable[str],
    sizes: Mapping[str, int], finish: Callable[[], Any] | None, run: Callable[..., Any],
    *args: Any, **kwargs: Any,
) -> None:  # fmt: skip
    """``run(*args, **kwargs)``: the launch of ``kernel`` by ``function`` of the module
    ``meta`` describes. With telemetry on, it runs inside its NVTX range and is timed
    until ``finish`` returns (until ``run`` does, where ``finish`` is None); its FLOPs
    and bytes are those of the ``kernels`` it runs, from the metadata's roofline at
    ``sizes``."""
    if not STATE.on:
        run(*args, **kwargs)
        return
    with _Range(f"launch:{kernel}"):
        start = time.perf_counter()
        run(*args, **kwargs)
        if finish is not None and STATE.sink is not None:
            finish()
        seconds = time.perf_counter() - start
    if STATE.sink is not None:
        STATE.sink(_record(meta, function, kernel, tuple(kernels), sizes, seconds))


def copying(function: str) -> Any:
    """The NVTX range of ``function``'s copies between the host and a device (a context
    manager that does nothing while NVTX is off)."""
    return _Range(f"copy:{function}")


class _Range:
    """An NVTX range, pushed on entry and popped on exit, when NVTX is on."""

    def __init__(self, name: str) -> None:
        self.nvtx = STATE.nvtx
        self.name = name

    def __enter__(self) -> None:
        if self.nvtx is not None:
            self.nvtx[0](self.name.encode())

    def __exit__(self, *_: object) -> None:
        if self.nvtx is not None:
            self.nvtx[1]()


def _record(
    meta: Mapping[str, Any], function: str, kernel: str, kernels: tuple[str, ...],
    sizes: Mapping[str, int], seconds: float,
) -> Record:  # fmt: skip
    record: Record = {"target": meta.get("target"), "function": function, "kernel": kernel,
                      "sizes": dict(sizes), "seconds": seconds}  # fmt: skip
    roofline = _rooflines(id(meta), meta)
    if all(k in roofline for k in kernels):
        for key, per_s in (("flops", "flop_per_s"), ("bytes", "bytes_per_s")):
            total = sum(float(roofline[k][key].value(sizes)) for k in kernels)
            record[key] = total
            record[per_s] = total / seconds if seconds > 0 else None
    return record


_ROOFLINES: dict[int, tuple[Mapping[str, Any], dict[str, Any]]] = {}


def _rooflines(key: int, meta: Mapping[str, Any]) -> dict[str, Any]:
    """Each kernel's FLOPs and bytes as parsed expressions of the sizes, parsed once per
    module (kept with the metadata, so that an id is not reused while it is kept)."""
    kept = _ROOFLINES.get(key)
    if kept is None or kept[0] is not meta:
        parsed = {a["kernel"]: {k: parse_dim(a["roofline"][k]) for k in ("flops", "bytes")}
                  for a in meta.get("analysis", ()) if "roofline" in a}  # fmt: skip
        kept = _ROOFLINES[key] = (meta, parsed)
    return kept[1]


configure(**from_environment(os.environ))
