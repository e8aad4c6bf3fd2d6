"""``python -m tessera`` and the ``tesserac`` script: ``tesserac`` as a process.

``command`` imports the compiler only once the collector's first generation is raised
(``process_settings.few_collections``): loading the compiler's modules allocates as a
compilation does, and pays the same needless collections. It ends the process as soon
as the command returns and what it printed is flushed, without Python's teardown:
freeing every object of a compilation one by one, and the whole-heap collection
before it, took 10 to 20 ms of a large file's run, and nothing of the process is read
again. Whatever Tessera opens it closes before the command returns (its files,
temporary folders and tuning threads are all in ``with`` blocks); the exit status is
the command's. In-process callers use ``tessera.cli.main``, which returns."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

from .transpiler.process_settings import few_collections


def command() -> NoReturn:
    """``tesserac`` on the command line, then exit with its status."""
    with few_collections():
        from .cli import main

        status = main()
    for stream in (sys.stdout, sys.stderr):
        # a closed pipe (``| head``) has nothing more to take
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    command()
