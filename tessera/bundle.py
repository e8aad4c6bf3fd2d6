"""Ahead-of-time bundles: a ``.tsr`` file compiled for the CPU and for CUDA arches, in
one directory that loads without the compiler (``tessera.runtime.bundle``).

A bundle (``NAME.tsrpkg``) holds the source, the Graph IR and its SHA-256, the schedule
cache the compile used, and per target its generated file, its metadata (JSON, and the
kernels' YAML), and its binary: the CPU shared object (g++; the module image of
``tsr.h``'s CPU implementation, ``tessera.runtime.c_abi``) and a cubin per CUDA arch
(NVRTC, where it is installed). ``bundle.json`` says where each part is. The same
inputs and tools give the same bytes (``tessera.packs``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .runtime.c_abi import cpu_module_source
from .runtime.cpu import build
from .runtime.kernel_yaml import dump
from .transpiler.frontend.source import read_source
from .transpiler.pipeline import StageNotImplemented, compile
from .transpiler.target.kernel_records import kernel_records
from .transpiler.target.simt_host import host_source

__all__ = ["FORMAT", "bundle_files"]

#: The layout of ``bundle.json`` and the directory; ``load_bundle`` refuses another.
FORMAT = 1


def bundle_files(
    path: str | Path,
    arches: Iterable[str],
    *,
    cpu_arch: str | None = None,
    defines: Mapping[str, int] | Iterable[str] | None = None,
    schedule_cache: str | Path | None = None,
) -> tuple[dict[str, bytes], list[str]]:
    """The files of the bundle of the ``.tsr`` file ``path`` for the CPU (``cpu_arch``,
    default ``native``) and each CUDA arch of ``arches``, and the warnings of the build
    (an arch without a cubin where NVRTC is missing). Raises what compiling raises
    (``CompileError``, ``OptionsError``), and ``BuildError`` when g++ fails."""
    source = read_source(path)
    name = Path(source.name).stem
    cache = None if schedule_cache is None else str(schedule_cache)
    settings = {"defines": defines, "schedule_cache": cache}
    files: dict[str, bytes] = {f"source/{name}.tsr": Path(path).read_bytes()}
    if cache is not None:
        files["schedules.json"] = Path(cache).read_bytes()
    cpu = compile(source.text, f"{name}.tsr", target="cpu", arch=cpu_arch, **settings)
    graph = cpu.inspect_ir("graph").encode()
    files["graph.txt"] = graph
    meta = cpu.ir("meta")
    text = cpu_module_source(cpu.source, meta)  # loadable from C too (tsr.h)
    library = build(text, meta["build"]["flags"], meta["build"]["compiler"]).read_bytes()
    info: dict[str, Any] = {
        "format": FORMAT,
        "source": f"source/{name}.tsr",
        "tesserac": meta["provenance"]["tesserac"],
        "graph": "graph.txt",
        "graph_sha256": hashlib.sha256(graph).hexdigest(),
        "schedule_cache": "schedules.json" if cache is not None else None,
        "cpu": _part(files, f"cpu/{name}", ".cpp", cpu, meta, (".so", library), text),
        "cuda": {},
    }
    warnings = []
    for arch in arches:
        program = compile(source.text, f"{name}.tsr", target="cuda", arch=arch, **settings)
        meta = program.ir("meta")
        try:
            binary: tuple[str, bytes] | None = (".cubin", program.ir("cubin").cubin)
        except StageNotImplemented as exc:
            binary = None
            warnings.append(f"no cubin for {arch}: {exc}")
        text = program.source + host_source(meta)
        info["cuda"][arch] = _part(files, f"cuda/{arch}/{name}", ".cu", program, meta, binary,
                                   text)  # fmt: skip
    files["bundle.json"] = (json.dumps(info, indent=2, sort_keys=True) + "\n").encode()
    return files, warnings


def _part(
    files: dict[str, bytes], stem: str, suffix: str, program: Any, meta: Mapping[str, Any],
    binary: tuple[str, bytes] | None, text: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Add one target's files under ``stem``; its entry of ``bundle.json``."""
    part = {"arch": meta["arch"], "source": stem + suffix, "meta": f"{stem}.json",
            "kernels": f"{stem}.yaml", "binary": None}  # fmt: skip
    files[part["source"]] = (program.source if text is None else text).encode()
    files[part["meta"]] = (json.dumps(meta, indent=2) + "\n").encode()
    files[part["kernels"]] = dump(kernel_records(program.ir("tile"), meta)).encode()
    if binary is not None:
        part["binary"] = stem + binary[0]
        files[part["binary"]] = binary[1]
    return part
