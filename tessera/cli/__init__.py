"""The ``tesserac`` command.

``main`` imports the compiler only once the collector's first generation is raised
(``process_settings.few_collections``): loading the compiler's modules allocates as
a compilation does, and pays the same needless collections.

``command``, what the ``tesserac`` script and ``python -m tessera`` run, ends the
process as soon as ``main`` returns and what it printed is flushed, without Python's
teardown: freeing every object of a compilation one by one, and the whole-heap
collection before it, took 10 to 20 ms of a large file's run, and nothing of the
process is read again. Whatever Tessera opens it closes before ``main`` returns (its
files, temporary folders and tuning threads are all in ``with`` blocks); the exit
status is ``main``'s.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, NoReturn

from ..transpiler.process_settings import few_collections

__all__ = ["build_parser", "command", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run ``tesserac`` with ``argv`` (the command line's arguments when None); the exit
    status."""
    with few_collections():
        from .main import main as run

        return run(argv)


def command() -> NoReturn:
    """``tesserac`` as a process: ``main`` on the command line, then exit."""
    status = main()
    for stream in (sys.stdout, sys.stderr):
        # a closed pipe (``| head``) has nothing more to take
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


def __getattr__(name: str) -> Any:
    if name == "build_parser":
        from .main import build_parser

        return build_parser
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
