"""A progress bar on standard error that stays quiet when nobody watches.

On a terminal it redraws one line; in a log (CI, a pipe) it writes a line
each time the phase changes, so that a log stays short and still shows where
a long run got to.
"""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["ProgressBar"]

WIDTH = 24


class ProgressBar:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.phase: str | None = None

    def __call__(self, what: str, done: int, total: int) -> None:
        if self.live:
            filled = WIDTH * done // max(1, total)
            bar = "#" * filled + "." * (WIDTH - filled)
            self.stream.write(f"\r\033[K{what} [{bar}] {done}/{total}")
            self.stream.flush()
        elif what != self.phase:
            self.stream.write(f"{what}\n")
        self.phase = what

    def close(self) -> None:
        """End the redrawn line, so that what follows starts on its own."""
        if self.live and self.phase is not None:
            self.stream.write("\n")
            self.stream.flush()
        self.phase = None
