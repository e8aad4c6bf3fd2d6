"""The CUDA backend's output built with NVRTC: the PTX, the cubin and ptxas's report.

These are what a reviewer reads next to the ``.cu`` file (``--emit ptx``, ``--emit
cubin``) and what says whether a schedule fits the machine (``--emit meta
--resources``: registers, shared memory, spills and stack frame per kernel). NVRTC is
the compiler CuPy's ``RawModule`` uses, so the numbers are those of the code that runs,
and the file is built exactly as it is written, with the options the metadata records.
NVRTC comes from pip (``cuda-bindings`` and ``nvidia-cuda-nvrtc``); without it these
dumps say so in one line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from ...frozen import frozen

__all__ = [
    "CudaBinary",
    "NvrtcError",
    "NvrtcUnavailable",
    "Resources",
    "build",
    "parse_report",
    "with_resources",
]


class NvrtcUnavailable(RuntimeError):
    """NVRTC is not installed; the message says which packages provide it."""


class NvrtcError(RuntimeError):
    """NVRTC rejected the generated file: a compiler bug; the message is NVRTC's log."""


@frozen
class Resources:
    """What ptxas gave one kernel: registers per thread, static shared memory, named
    barriers, and the local memory that a schedule too large for the registers costs."""

    registers: int
    shared_bytes: int
    barriers: int
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int


@frozen
class CudaBinary:
    """One NVRTC build of a generated file, kept whole: the PTX and the cubin are dumps
    of the same build whose report gives the resources."""

    arch: str
    #: "NVRTC 13.0": the numbers below depend on it.
    compiler: str
    ptx: str
    cubin: bytes
    #: ptxas's verbose log, the source of ``resources``
    report: str
    resources: Mapping[str, Resources]


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_report(log: str) -> dict[str, Resources]:
    """Each kernel's resources from ptxas's ``-v`` log: a block per entry function, from
    its "Compiling entry function" line to the next. A kernel with no barriers or no
    shared memory has those fields left out of its "Used" line; they are 0."""
    blocks = re.split(r"(?=ptxas info\s*: Compiling entry function)", log)
    found = {}
    for block in blocks:
        entry = _ENTRY.search(block)
        if entry is None:
            continue
        frame, used = _FRAME.search(block), _USED.search(block)
        if frame is None or used is None:
            raise NvrtcError(f"ptxas's report for '{entry.group(1)}' is incomplete:\n{block}")
        barriers, smem = _BARRIERS.search(block), _SMEM.search(block)
        found[entry.group(1)] = Resources(
            registers=int(used.group(1)),
            shared_bytes=int(smem.group(1)) if smem else 0,
            barriers=int(barriers.group(1)) if barriers else 0,
            stack_frame_bytes=int(frame.group(1)),
            spill_store_bytes=int(frame.group(2)),
            spill_load_bytes=int(frame.group(3)),
        )
    return found


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        raise NvrtcUnavailable(
            "PTX, cubin and resource reports need NVRTC: pip install cuda-bindings "
            "'nvidia-cuda-nvrtc==13.0.*' (the NVRTC that matches your ptxas)"
        ) from None
    return nvrtc


def _ok(nvrtc: Any, result: tuple[Any, ...], what: str) -> tuple[Any, ...]:
    """The values of an NVRTC call's result, after its status."""
    if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f"NVRTC failed {what}: {result[0]}")
    return result[1:]


def _read(nvrtc: Any, program: Any, size: Any, get: Any, what: str) -> bytes:
    """One of a program's outputs: the log, the PTX (text ending in a NUL) or the cubin.
    NVRTC writes into the buffer it is given, so that is a bytearray: a bytes object of
    one byte is Python's shared singleton, which the write would change for everyone."""
    (n,) = _ok(nvrtc, size(program), f"sizing the {what}")
    data = bytearray(n)
    _ok(nvrtc, get(program, data), f"reading the {what}")
    return bytes(data)


def build(source: str, arch: str, options: Sequence[str], name: str = "kernels.cu") -> CudaBinary:
    """Compile ``source`` for ``arch`` (``sm_80``, ``sm_90a``) with NVRTC, the
    metadata's build options and ptxas's verbose report."""
    nvrtc = _nvrtc()
    (program,) = _ok(nvrtc, nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []),
                     "creating the program")  # fmt: skip
    try:
        flags = [f.encode() for f in (*options, f"-arch={arch}", "--ptxas-options=-v")]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(flags), flags)
        log = _read(nvrtc, program, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog,
                    "log").rstrip(b"\0").decode()  # fmt: skip
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(f"NVRTC could not compile the generated {name}:\n{log}")
        ptx = _read(nvrtc, program, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX, "PTX")
        cubin = _read(nvrtc, program, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN, "cubin")
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    major, minor = _ok(nvrtc, nvrtc.nvrtcVersion(), "to give its version")
    return CudaBinary(
        arch=arch,
        compiler=f"NVRTC {major}.{minor}",
        ptx=ptx.rstrip(b"\0").decode(),
        cubin=cubin,
        report=log,
        resources=parse_report(log),
    )


def with_resources(meta: Mapping[str, Any], binary: CudaBinary) -> dict[str, Any]:
    """The metadata with a ``resources`` entry: the compiler, and per kernel what ptxas
    gave it. Every kernel a launch names must be in the report."""
    kernels = {launch["kernel"] for f in meta["functions"] for launch in f["launches"]}
    missing = sorted(kernels - set(binary.resources))
    if missing:
        raise NvrtcError(f"ptxas reported no resources for {', '.join(missing)}")
    report = {name: asdict(binary.resources[name]) for name in sorted(kernels)}
    return {**meta, "resources": {"compiler": binary.compiler, "kernels": report}}
