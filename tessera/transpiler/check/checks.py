"""Every check of ``tesserac check`` on every kernel of a module."""

from __future__ import annotations

from ..tile.ir import TileModule
from .banks import THRESHOLD, lint_banks
from .findings import Finding
from .races import find_races

__all__ = ["Finding", "check_module", "THRESHOLD"]


def check_module(module: TileModule, bank_threshold: int = THRESHOLD) -> list[Finding]:
    """Every finding of every check on every kernel of ``module``, kernel by kernel."""
    findings: list[Finding] = []
    for program in module.programs:
        for kernel in program.kernels:
            findings += find_races(kernel)
            findings += lint_banks(kernel, bank_threshold)
    return findings
