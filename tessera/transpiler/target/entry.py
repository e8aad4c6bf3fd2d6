"""A graph function's entry as every backend exposes it: parameters, sizes, guards.

An entry takes the function's tensors and scalars in ``.tsr`` order, then its
result (``out``), then every size symbol in order of first appearance in the
tensors' dims. The metadata (``--emit meta``) describes it the same way for
every target, so that one argument checker serves all runtimes.
"""

from __future__ import annotations

from typing import Any

from ..graph.ir import RESULT, walk
from ..graph.types import TensorType
from ..tile.ir import TileProgram

__all__ = ["symbols", "entry_params", "returns", "written", "signature_meta"]


def symbols(types: list[Any]) -> tuple[str, ...]:
    """Size symbols in order of first appearance in the tensors' dims."""
    found: dict[str, None] = {}
    for t in types:
        for dim in getattr(t, "dims", ()):
            for monomial, _ in dim.terms:
                for name, _ in monomial:
                    found.setdefault(name, None)
    return tuple(found)


def entry_params(program: TileProgram) -> list[tuple[str, Any]]:
    """The entry's parameters by name and type: the function's inputs, then its result."""
    by_name: dict[str, Any] = {}
    for kernel in program.kernels:
        for p in kernel.params:
            by_name.setdefault(p.name, p.type)
    names = [n.removeprefix("%") for n in program.host.inputs]
    if returns(program):
        names.append(RESULT)
    declared = dict(zip(names, program.host.types, strict=False))
    return [(n, declared.get(n, by_name.get(n))) for n in names if n in by_name]


def returns(program: TileProgram) -> bool:
    """Whether the function declares a result, which its entry takes last, as ``out``."""
    return program.host.result is not None and program.host.kind != "declaration"


def written(program: TileProgram, name: str) -> bool:
    """Whether a kernel of the program stores into the parameter ``name``."""
    return any(
        op.kind == "store" and op.operands[0].name == name
        for kernel in program.kernels
        for op in walk(kernel.body)
    )


def signature_meta(program: TileProgram) -> dict[str, Any]:
    """The entry's parameters, sizes, result and guards, as the metadata holds them."""
    params = []
    defaults = {n.removeprefix("%"): v for n, v in program.host.defaults}
    result = RESULT if returns(program) else None
    for name, t in entry_params(program):
        if isinstance(t, TensorType):
            io = "out" if name == result else "inout" if written(program, name) else "in"
            params.append({"name": name, "kind": "tensor", "dtype": t.dtype.name,
                           "dims": [str(d) for d in t.dims], "io": io})  # fmt: skip
        else:
            params.append({"name": name, "kind": "scalar", "type": t.kind})
            if name in defaults:
                params[-1]["default"] = defaults[name]
    return {
        "name": program.host.function,
        "params": params,
        "dims": list(symbols([t for _, t in entry_params(program)])),
        "result": result,
        "guards": [{"kind": g.kind, "left": str(g.left), "right": str(g.right),
                    "reason": g.reason} for g in program.host.guards],
    }  # fmt: skip
