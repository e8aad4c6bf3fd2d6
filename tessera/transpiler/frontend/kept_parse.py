"""Parsed library files kept between runs.

Every compilation that fuses a matmul, a norm or a softmax instantiates kernels of
``tessera/stdlib``, and parsing them again in each process took a tenth of its time.
Their trees are pickled into the private cache folder instead, each under a key made
of its text and of everything that decides how it parses (the grammar and the
front end's own source), so an edit to either parses anew. A pickle is loaded as
code: only a folder that belongs to the user alone is used (``private_cache_dir``),
and a file that does not load is parsed again and rewritten.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
import sys
from importlib import resources
from pathlib import Path

from ...cachedir import keep, private_cache_dir
from . import ast
from .diagnostics import Diagnostics
from .parser import parse
from .source import SourceFile

__all__ = ["parse_library_file"]


@functools.cache
def _front_end_digest() -> bytes:
    """What the trees depend on besides their own text: the grammar, the front end's
    modules (node classes, builder) and the Python that pickles them."""
    digest = hashlib.sha256(sys.version.encode())
    digest.update(resources.files("tessera.grammar").joinpath("tessera.lark").read_bytes())
    for module in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(module.name.encode() + b"\0" + module.read_bytes())
    return digest.digest()


def parse_library_file(name: str, text: str) -> ast.Module:
    """The tree of the library file ``name`` (which must parse without a finding),
    from the cache where it holds this text's tree."""
    key = hashlib.sha256(_front_end_digest() + text.encode()).hexdigest()
    folder = private_cache_dir("library")
    path = folder / (name.replace("/", "_") + ".pickle") if folder else None
    if path is not None:
        try:
            with path.open("rb") as stream:
                kept_key, module = pickle.load(stream)
            if kept_key == key and isinstance(module, ast.Module):
                return module
        except Exception:  # absent, damaged or from another version: parsed anew
            pass
    diags = Diagnostics()
    module = parse(SourceFile(name, text), diags)
    assert module is not None and not diags.items, f"{name} does not parse"
    if path is not None:
        keep(path, pickle.dumps((key, module), protocol=pickle.HIGHEST_PROTOCOL))
    return module
