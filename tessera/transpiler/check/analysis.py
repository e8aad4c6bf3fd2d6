"""Each kernel's estimates, as ``--emit meta`` holds them under ``analysis``."""

from __future__ import annotations

import copy
from typing import Any

from ..options import Options
from ..schedule.hardware import hardware_for
from ..tile.ir import TileModule
from .registers import estimate_registers
from .roofline import roofline

__all__ = ["kernel_analysis"]


def kernel_analysis(module: TileModule, options: Options) -> list[dict[str, Any]]:
    """Per kernel: its estimated registers per thread (GPUs) and its roofline hint."""
    hw = hardware_for(module.target, module.arch)
    defines = dict(options.defines)
    found: dict[str, dict[str, Any]] = {}
    for program in module.programs:
        for kernel in program.kernels:
            if kernel.twin in found:  # the same content: the same estimates
                found[kernel.name] = copy.deepcopy(found[kernel.twin]) | {"kernel": kernel.name}
                continue
            entry: dict[str, Any] = {"kernel": kernel.name}
            if hw.kind == "gpu":
                entry["registers_estimate"] = estimate_registers(kernel, hw)
            entry["roofline"] = roofline(kernel, module.arch, defines)
            found[kernel.name] = entry
    return list(found.values())
