"""Stand-ins for files that are not regular (devices, FIFOs) in tests of writers.

No test may write to a real device: ``-o /dev/null`` run as root once replaced
the node. A FIFO in ``tmp_path`` is a real non-regular file; a regular file that
``os.stat`` calls a character device stands in for ``/dev/null``.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest


class FifoReader:
    """Reads a FIFO to its end in a thread: its writer blocks until someone reads."""

    def __init__(self, fifo: Path) -> None:
        self.fifo = fifo
        self.got: list[bytes] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with open(self.fifo, "rb") as handle:
            self.got.append(handle.read())

    def text(self) -> str | None:
        """What came through (None if the writer never opened the FIFO), waiting 10 s."""
        self.thread.join(10)
        return self.got[0].decode("utf-8") if self.got else None


def make_fifo(path: Path) -> FifoReader:
    os.mkfifo(path)
    return FifoReader(path)


def stat_as_device(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Make ``os.stat`` say that ``path`` (a regular file in ``tmp_path``) is a character
    device, as ``/dev/null`` is; ``monkeypatch.undo()`` ends it."""
    real_stat = os.stat

    def fake_stat(name: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        result = real_stat(name, *args, **kwargs)
        if os.fspath(name) != str(path):
            return result
        return os.stat_result((stat.S_IFCHR | 0o666, *tuple(result)[1:]))

    monkeypatch.setattr(os, "stat", fake_stat)
