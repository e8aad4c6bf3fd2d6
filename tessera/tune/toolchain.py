"""Which toolchain a measurement belongs to, as one line of text.

A tuned schedule is only as good as the code it was measured with: another
``tesserac`` writes other code, another C++ compiler optimizes it otherwise,
and another CPU has other caches. The line names all three for the CPU
target, so that a record moves only between machines where it still holds.
"""

from __future__ import annotations

import functools
import platform
import subprocess

from .. import __version__

__all__ = ["toolchain"]


def toolchain(target: str) -> str:
    parts = [f"tesserac {__version__}"]
    if target == "cpu":
        parts += [_compiler("g++"), _cpu()]
    return ", ".join(parts)


@functools.cache
def _compiler(name: str) -> str:
    try:
        done = subprocess.run([name, "-dumpfullversion"], capture_output=True, text=True)
    except OSError:
        return f"{name} (not found)"
    return f"{name} {done.stdout.strip() or 'unknown'}"


@functools.cache
def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return " ".join(line.partition(":")[2].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()
