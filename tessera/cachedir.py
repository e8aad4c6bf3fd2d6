"""Where Tessera keeps what it can rebuild: parser tables, compiled templates, shared objects.

``$TESSERA_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/tessera``, else
``~/.cache/tessera``. Some of what is kept there is loaded as code (pickled parser
tables, template bytecode, shared objects), so a folder is only used when it belongs
to the user running Tessera and nobody else can write to it; otherwise everything is
rebuilt each time, which is slower but never unsafe.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

__all__ = ["cache_dir", "private_cache_dir", "keep"]


def cache_dir() -> Path:
    """The cache's root folder (it may not exist yet)."""
    if "TESSERA_CACHE_DIR" in os.environ:
        return Path(os.environ["TESSERA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tessera"


def private_cache_dir(name: str) -> Path | None:
    """The folder ``name`` under the cache, created for this user alone; None where it
    cannot be created or where another user could change what is in it."""
    path = cache_dir() / name
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        for folder in (path, path.parent):
            info = folder.stat()
            if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return None
    except OSError:
        return None
    return path


def keep(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` in a cache folder whole or not at all: a concurrent run
    reads the old file or the new one, never half of one. A failure leaves the cache as
    it was (what is kept can always be rebuilt)."""
    try:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except OSError:
        Path(temporary).unlink(missing_ok=True)
