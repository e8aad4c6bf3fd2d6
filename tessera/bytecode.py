"""Tessera's own modules compiled once, where Python keeps no bytecode of them.

A compilation imports about 120 of Tessera's modules, 0.9 MB of Python. Python
normally keeps each one's bytecode in ``__pycache__``; where it may not write there
(``PYTHONDONTWRITEBYTECODE``, as development checkouts and containers often set, or
a read-only install) and no bytecode was installed, every ``tesserac`` process
compiled them all again from their text: about 0.2 s, half of a run.

``install()`` (run by ``import tessera``) adds an import finder for ``tessera.*``
modules that only steps in there: it leaves a module whose ``__pycache__`` bytecode
exists, or that Python may write, to Python. Otherwise it keeps the compiled code in
the private cache folder (``cachedir.private_cache_dir``, the user's own; the code is
loaded as code), in a file named after the module and its path, stamped with a digest
of the Python's bytecode version, the optimization level, Tessera's version and the
module's source, so it serves only that very text, and is compiled anew (and
rewritten, atomically) when it is missing, damaged or stale. Nothing is kept where
there is no such folder; a module then compiles as before.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType
from typing import TYPE_CHECKING

from . import __version__

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["install", "compiled"]

_DIGEST = 32  # bytes of a sha256


def compiled(source: bytes, path: str, kept: Path) -> CodeType:
    """The code of ``source`` (the text of the file ``path``): from ``kept`` where that
    holds this text's code compiled by this Python and this Tessera, and arrived
    whole; else compiled, and written to ``kept`` for the next process."""
    import marshal  # here and below: imported when needed, not by ``import tessera``

    from .cachedir import keep

    what = (importlib.util.MAGIC_NUMBER, b"%d" % sys.flags.optimize, __version__.encode())
    stamp = _digest(b"\0".join((*what, path.encode(), source)))
    try:
        data = kept.read_bytes()
        body = data[2 * _DIGEST :]
        if data[:_DIGEST] == stamp and data[_DIGEST : 2 * _DIGEST] == _digest(body):
            code = marshal.loads(body)
            if isinstance(code, CodeType):
                return code
    except (OSError, ValueError, EOFError, TypeError):  # absent or damaged: compiled anew
        pass
    code = compile(source, path, "exec", dont_inherit=True)
    body = marshal.dumps(code)
    keep(kept, stamp + _digest(body) + body)
    return code


def _digest(data: bytes) -> bytes:
    import hashlib

    return hashlib.sha256(data).digest()


class _KeptLoader(importlib.machinery.SourceFileLoader):
    """Python's loader of a source file, but for where its code comes from."""

    folder: Path

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        name = _digest(path.encode()).hex()[:16]
        kept = self.folder / f"{fullname}.{name}.{sys.implementation.cache_tag}.code"
        return compiled(self.get_data(path), path, kept)


class _Finder:
    """Finds ``tessera.*`` modules as Python does, and hands those whose bytecode
    Python neither has nor may write to ``_KeptLoader``."""

    def __init__(self) -> None:
        self.folder: Path | bool | None = False  # False: not looked for yet

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("tessera.") or not sys.dont_write_bytecode:
            return None
        if sys.implementation.cache_tag is None:  # a Python that keeps no bytecode at all
            return None
        if fullname == "tessera.cachedir":  # needed to find the folder: Python's alone
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader:
            return spec
        if os.path.exists(importlib.util.cache_from_source(spec.origin)):
            return spec  # Python's own bytecode, installed with the module
        if self.folder is False:
            from .cachedir import private_cache_dir

            self.folder = private_cache_dir("bytecode")
        if self.folder is None:
            return spec
        loader = _KeptLoader(fullname, spec.origin)
        loader.folder = self.folder
        spec.loader = loader
        return spec


def install() -> None:
    """Put the finder before Python's own (once per process)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
