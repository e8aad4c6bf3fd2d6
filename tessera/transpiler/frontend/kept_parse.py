"""Parsed files kept between runs: the library's, and the user's own.

Every compilation that fuses a matmul, a norm or a softmax instantiates kernels of
``tessera/stdlib``, and parsing them again in each process took a tenth of its time.
A user's file is compiled again and again as it is (for each target, each ``--emit``,
each build of a project that checks its generated sources in), and its parse, with the
parser's tables that only a parse needs loaded, took a tenth of a run too. So the
trees are pickled into the private cache folder, each under a key made of its text,
its name and everything that decides how it parses (the grammar, the front end's own
source, the Python), so that an edit to any of them parses anew. A file is kept only
where it parsed without a finding, so a kept tree stands for a parse that says
nothing. A pickle is loaded as code: only a folder that belongs to the user alone is
used (``private_cache_dir``), and a file that does not load is parsed again and
rewritten.

A user's tree points at the compilation's own ``SourceFile`` (its spans' ``source``):
the pickle holds a placeholder for it, which loading replaces with the file at hand,
so that the tree is the one a parse of that file gives.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from ...cachedir import keep, private_cache_dir
from . import ast
from .diagnostics import Diagnostics
from .source import SourceFile

__all__ = ["parse_library_file", "parse_kept"]

#: What a kept user's tree holds in place of its ``SourceFile``.
_THE_SOURCE = "source"


@functools.cache
def _front_end_digest() -> bytes:
    """What the trees depend on besides their own text: the grammar, the front end's
    modules (node classes, builder) and the Python that pickles them."""
    digest = hashlib.sha256(sys.version.encode())
    digest.update(resources.files("tessera.grammar").joinpath("tessera.lark").read_bytes())
    for module in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(module.name.encode() + b"\0" + module.read_bytes())
    return digest.digest()


def _key(name: str, text: str) -> bytes:
    key = hashlib.sha256(_front_end_digest() + name.encode() + b"\0" + text.encode())
    return key.hexdigest().encode()


def parse_library_file(name: str, text: str) -> ast.Module:
    """The tree of the library file ``name`` (which must parse without a finding),
    from the cache where it holds this text's tree."""
    source = SourceFile(name, text)
    diags = Diagnostics()
    module = parse_kept(source, diags, "library")
    assert module is not None and not diags.items, f"{name} does not parse"
    return module


def parse_kept(source: SourceFile, diags: Diagnostics, folder: str = "parsed") -> ast.Module | None:
    """``parse(source, diags)``, from the cache folder ``folder`` where it holds the
    tree of this name and text (kept there after a parse that found nothing)."""
    key = _key(source.name, source.text)
    kept = private_cache_dir(folder)
    path = (
        kept / (hashlib.sha256(source.name.encode()).hexdigest()[:24] + ".pickle") if kept else None
    )
    if path is not None:
        try:
            # the key first, so that another text kept under the name is not loaded
            with path.open("rb") as stream:
                if stream.readline() == key + b"\n":
                    module = _Unpickler(stream, source).load()
                    if isinstance(module, ast.Module):
                        return module
        except Exception:  # absent, damaged or from another version: parsed anew
            pass
    from .parser import parse  # the parser's tables load where a file is parsed

    findings = len(diags.items)
    module = parse(source, diags)
    if path is not None and module is not None and len(diags.items) == findings:
        stream = io.BytesIO(key + b"\n")
        stream.seek(0, io.SEEK_END)
        _Pickler(stream, source).dump(module)
        keep(path, stream.getvalue())
    return module


class _Pickler(pickle.Pickler):
    """Pickles a tree with its ``SourceFile`` as a placeholder."""

    def __init__(self, stream: io.BytesIO, source: SourceFile) -> None:
        super().__init__(stream, protocol=pickle.HIGHEST_PROTOCOL)
        self.source = source

    def persistent_id(self, obj: Any) -> str | None:
        return _THE_SOURCE if obj is self.source else None


class _Unpickler(pickle.Unpickler):
    """Loads a tree with the compilation's ``SourceFile`` for its placeholder."""

    def __init__(self, stream: Any, source: SourceFile) -> None:
        super().__init__(stream)
        self.source = source

    def persistent_load(self, pid: Any) -> SourceFile:
        if pid != _THE_SOURCE:
            raise pickle.UnpicklingError(f"unknown placeholder {pid!r}")
        return self.source
