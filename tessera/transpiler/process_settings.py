"""Process-wide settings that a compilation changes while it runs, and restores after.

Python's recursion limit and its cyclic garbage collector belong to the process, not to
one compilation, so two compilations at once (threads, or one inside another's
callback) share one change: the first in raises the setting, the last out restores the
caller's value.

- ``recursion_headroom``: the passes over the AST recurse once per level of nesting
  (``frontend/depth.py``), deeper than Python's default limit allows.
- ``few_collections``: a compilation allocates hundreds of thousands of small objects
  (IR nodes, dims, tuples) and frees almost none of them until it ends, so the
  collector's first generation, at its default threshold of 700 allocations, runs
  hundreds of times to find nearly nothing. Those runs cost a fifth of compiling a
  large file (``bench/compile.py``). A threshold of 50,000 keeps the collector for
  the cycles that do appear and removes nearly all of that time.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from .frontend.depth import RECURSION_NEEDED

__all__ = ["recursion_headroom", "few_collections"]

#: Allocations between two runs of the collector's first generation while compiling.
FIRST_GENERATION = 50_000


class _Shared:
    """One process setting: ``get`` and ``set`` it, ``raised`` gives its value while
    any compilation runs from the value the caller had."""

    def __init__(
        self, get: Callable[[], Any], set_: Callable[[Any], None], raised: Callable[[Any], Any]
    ) -> None:
        self.get, self.set, self.raised = get, set_, raised
        self.lock = threading.Lock()
        self.users = 0
        self.saved: Any = None

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self.lock:
            if self.users == 0:
                self.saved = self.get()
                self.set(self.raised(self.saved))
            self.users += 1
        try:
            yield
        finally:
            with self.lock:
                self.users -= 1
                if self.users == 0:
                    self.set(self.saved)


recursion_headroom: Callable[[], AbstractContextManager[None]] = _Shared(
    sys.getrecursionlimit, sys.setrecursionlimit, lambda saved: max(saved, RECURSION_NEEDED)
)
few_collections: Callable[[], AbstractContextManager[None]] = _Shared(
    gc.get_threshold,
    lambda thresholds: gc.set_threshold(*thresholds),
    lambda saved: (max(saved[0], FIRST_GENERATION), *saved[1:]),
)
