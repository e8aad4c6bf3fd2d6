"""The graph passes, in order, each verified after it runs."""

from __future__ import annotations

from collections.abc import Callable

from .attention import recognize_attention
from .canonicalize import canonicalize
from .dequantized import dequantized_products
from .fusion import fuse
from .int8_products import int8_products
from .ir import GraphModule
from .rows import recognize_rows
from .saturate import saturate_results
from .simplify import simplify
from .verify import VerifyError, verify

__all__ = ["GRAPH_PASSES", "run_graph_passes", "PassError"]

GraphPass = Callable[[GraphModule], GraphModule]

#: (name, pass) in the order they run.
GRAPH_PASSES: list[tuple[str, GraphPass]] = [
    ("saturate", saturate_results),
    ("rows", recognize_rows),
    ("canonicalize", canonicalize),
    ("simplify", simplify),
    ("attention", recognize_attention),
    ("dequantized", dequantized_products),
    ("int8_products", int8_products),
    ("fuse", fuse),
]


class PassError(AssertionError):
    """The IR failed verification after a pass: a compiler bug."""


def run_graph_passes(module: GraphModule) -> GraphModule:
    _check(module, "semantic analysis")
    for name, graph_pass in GRAPH_PASSES:
        module = graph_pass(module)
        _check(module, name)
    return module


def _check(module: GraphModule, after: str) -> None:
    try:
        verify(module)
    except VerifyError as exc:
        raise PassError(f"the Graph IR is invalid after {after}: {exc}") from exc
