"""How deeply a program may nest, and the Python recursion the compiler needs for it.

The passes over the AST (analysis, evaluation, printing, fingerprints) recurse once per
level of nesting, a few Python frames at a time (a call is evaluated, its arguments
bound, each evaluated). So the parser refuses a program nested deeper than
``MAX_DEPTH`` at the place where it gets too deep, and the pipeline runs its stages with
a recursion limit that covers the deepest program it accepts. A flat chain such as
``a + b + ... + z`` is a left-deep tree, one level per term, so the limit allows long
ones; the later IRs are flat lists of operations and do not recurse on it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["MAX_DEPTH", "recursion_headroom"]

#: Levels of nested expressions and blocks, counted from the top of the file.
MAX_DEPTH = 500
#: Python frames per level in the deepest-recursing pass, and frames around them.
_FRAMES_PER_LEVEL = 10
_BASE_FRAMES = 1000
_NEEDED = MAX_DEPTH * _FRAMES_PER_LEVEL + _BASE_FRAMES

_lock = threading.Lock()
_users = 0
_saved = 0


@contextmanager
def recursion_headroom() -> Iterator[None]:
    """Raise Python's recursion limit to what the deepest accepted program needs while
    any compilation runs (the limit is the process's, so concurrent compilations share
    one raise, and the last one out restores the caller's limit)."""
    global _users, _saved
    with _lock:
        if _users == 0:
            _saved = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_saved, _NEEDED))
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                sys.setrecursionlimit(_saved)
