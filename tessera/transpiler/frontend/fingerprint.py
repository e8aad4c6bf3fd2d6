"""A stable hash of what a kernel computes, for the schedule cache.

A tuned schedule is valid for as long as the kernel it was measured on stays
the same. "The same" means the canonical text of the function (comments,
blank lines and spacing do not count), with the module-level functions and
constants it names, transitively; its schedule decorators do not count,
because changing the space to search does not change what the kernel
computes. Editing another kernel of the file leaves the hash alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from typing import Any

from . import ast
from .printer import print_module

__all__ = ["fingerprints"]

#: Decorators that choose a schedule rather than say what the kernel computes.
_SCHEDULE_DECORATORS = ("kernel.schedule", "kernel.autotune")


def fingerprints(module: ast.Module) -> dict[str, str]:
    """Each function's fingerprint by name: 16 hex digits of a SHA-256."""
    defined: dict[str, ast.Stmt] = {}
    for stmt in module.body:
        for name in _defines(stmt):
            defined[name] = stmt
    result = {}
    for function in module.functions():
        parts = [_without_schedule(function)]
        seen = {function.name}
        pending = sorted((_names(function.body) | _names(function.params)) - seen)
        while pending:
            name = pending.pop(0)
            if name in seen or name not in defined:
                continue
            seen.add(name)
            stmt = defined[name]
            parts.append(_without_schedule(stmt) if isinstance(stmt, ast.FunctionDef) else stmt)
            pending += sorted(_names(stmt) - seen)
        text = print_module(ast.Module(tuple(parts), span=module.span))
        result[function.name] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return result


def _defines(stmt: ast.Stmt) -> list[str]:
    if isinstance(stmt, ast.FunctionDef):
        return [stmt.name]
    if isinstance(stmt, ast.Assign):
        return sorted(_names(stmt.target))
    return []


def _without_schedule(function: ast.FunctionDef) -> ast.FunctionDef:
    kept = tuple(d for d in function.decorators if d.name not in _SCHEDULE_DECORATORS)
    return dataclasses.replace(function, decorators=kept)


def _names(node: Any) -> set[str]:
    return {n.id for n in _nodes(node) if isinstance(n, ast.Name)}


def _nodes(node: Any) -> Iterator[Any]:
    """Every AST node under ``node`` (a node or a tuple of them)."""
    if isinstance(node, tuple):
        for item in node:
            yield from _nodes(item)
    elif isinstance(node, ast.Node):
        yield node
        for f in dataclasses.fields(node):
            if f.name != "span":
                yield from _nodes(getattr(node, f.name))
