"""Generated source through clang-format, in the style checked in beside the templates.

A project that formats its sources with clang-format can check in a kernel as its
formatter would leave it (``tesserac --emit target --format``). The style is the
emitter's own layout, so formatting moves little, and a formatted file is stable: a
second clang-format run leaves it as it is. clang-format changes only white space
(the style sorts no includes), so the formatted file is the same program.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["STYLE", "FormatError", "clang_format", "formatted"]

#: The checked-in style (clang-format 14 or newer reads it by ``--style=file:PATH``).
STYLE = Path(__file__).resolve().parents[2] / "templates" / "clang-format.yaml"
#: The file name clang-format is told each target's source has, which picks its language.
_ASSUMED = {"cuda": "kernel.cu", "hip": "kernel.hip", "cpu": "kernel.cpp",
            "opencl": "kernel.cl", "sycl": "kernel.sycl.cpp"}  # fmt: skip
_TIMEOUT_S = 60


class FormatError(Exception):
    """clang-format is installed but did not format the source."""


def clang_format() -> str | None:
    """The clang-format on the PATH, or None."""
    return shutil.which("clang-format")


def formatted(text: str, target: str, tool: str) -> str:
    """``text``, a ``target``'s generated source, as ``tool`` (a clang-format) formats it
    in the checked-in style."""
    try:
        done = subprocess.run(
            [tool, f"--style=file:{STYLE}", f"--assume-filename={_ASSUMED[target]}"],
            input=text, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FormatError(f"{tool} did not run: {exc}") from exc
    if done.returncode != 0:
        raise FormatError(f"{tool} failed: {done.stderr.strip()}")
    return done.stdout
