"""A call's checks, prepared once per function: the launch path of the common case.

``Entry.__call__`` checks an argument by its metadata, with messages that name the
parameter, the dim and the sizes: tens of microseconds in Python, more than a small
kernel takes. Most calls pass every input by position, as the arrays the function
takes, and let it allocate its results. For those, the checks reduce to a few
comparisons per tensor, and ``fast_path`` writes them out once per function as a
small Python function (as ``dataclasses`` writes ``__init__``): the arity, for each
tensor its library's type, dtype and contiguity (the backend's test), and its shape,
whose dims bind the size symbols or must equal them; then the results' allocation and
the backend's call, with every tensor as its address. Interpreted from the metadata
instead, the same checks took three times as long.

The fast path returns ``MISSED`` as soon as anything differs from what it expects
(another kind of array, a wrong shape, a numpy scalar for an int): the caller then
takes the full path, which raises the error with its message, or runs the call as it
always did. So a fast path never decides that a call is wrong; it only recognizes
right ones quickly. A function whose checks do not reduce so (a dim that is an
expression of sizes, a keyword-only parameter) has no fast path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..frozen import frozen

__all__ = ["Backend", "fast_path"]


@frozen
class Backend:
    """What a backend's fast path does with tensors, as Python source.

    ``accepts(x, dtypes, written)`` is a condition that holds when the argument named
    ``x`` is a tensor of the backend's kind with one of the dtypes the name ``dtypes``
    holds (a tuple), C-contiguous, and writable if ``written``; ``dtypes(dtype)`` gives
    that tuple for a parameter of numpy dtype ``dtype``. ``address(x)`` is a tensor's
    address as the call passes it. ``allocate(shape, dtype)`` makes a result of that
    shape and dtype (the value ``result_dtype`` gives for the numpy dtype);
    ``call(arguments)`` runs the kernels, the arguments being the tensors' addresses and
    the scalars in parameter order, then the sizes.
    ``names`` are the names these expressions use; ``shape(x)`` is a tensor's shape
    (after ``accepts`` held), ``result_address(r)`` a result's address (``address``,
    unless the results are of another kind than the inputs).
    """

    accepts: Callable[[str, str, bool], str]
    address: Callable[[str], str]
    dtypes: Callable[[np.dtype], tuple[Any, ...]]
    allocate: Callable[[str, str], str]
    result_dtype: Callable[[np.dtype], Any]
    call: Callable[[str], str]
    names: Mapping[str, Any]
    shape: Callable[[str], str] = "{}.shape".format
    result_address: Callable[[str], str] | None = None


#: The Python type a scalar argument has on the fast path; any other (a numpy scalar, an
#: int for a float) takes the full path, which converts or refuses it.
_SCALAR_TYPES = {"int": int, "float": float, "bool": bool}


def fast_path(
    meta: Mapping[str, Any], backend: Backend, dtype: Callable[[str], np.dtype],
    guards: Callable[[dict[str, int], dict[str, Any]], None], missed: object,
) -> Callable[..., Any] | None:  # fmt: skip
    """The fast path of the function ``meta`` describes (see the module's docstring),
    or None where its checks do not reduce to a plan. ``guards(sizes, values)`` checks
    the guards, raising as the full path does."""
    symbols = {name: f"s{i}" for i, name in enumerate(meta["dims"])}
    names: dict[str, Any] = {**backend.names, "MISSED": missed, "guards": guards}
    inputs = [p for p in meta["params"] if p.get("io") != "out"]
    if any(p.get("keyword_only") for p in inputs):
        return None
    arg = {p["name"]: f"a{i}" for i, p in enumerate(inputs)}
    lines = [f"if len(args) != {len(inputs)}:", "    return MISSED"]
    if inputs:
        lines.append(f"{', '.join(arg.values())}{',' if len(inputs) == 1 else ''} = args")
    bound: set[str] = set()
    has_tensor = False
    for p in inputs:
        x = arg[p["name"]]
        if p["kind"] == "scalar":
            names[f"{x}_type"] = _SCALAR_TYPES[p["type"]]
            lines += [f"if type({x}) is not {x}_type:", "    return MISSED"]
            continue
        has_tensor = True
        names[f"{x}_dtypes"] = backend.dtypes(dtype(p["dtype"]))
        if not names[f"{x}_dtypes"]:
            return None  # a dtype the backend's library lacks
        test = backend.accepts(x, f"{x}_dtypes", p["io"] != "in")
        lines += [f"if not ({test}):", "    return MISSED"]
        dims = []
        for text in p["dims"]:
            if text in symbols and text not in bound:
                bound.add(text)
                dims.append(("bind", symbols[text]))
            elif text in symbols or text.isdigit():
                dims.append(("equal", symbols.get(text, text)))
            else:
                return None  # a dim that is an expression of sizes
        if all(kind == "equal" for kind, _ in dims):  # one comparison of tuples
            lines += [f"if {backend.shape(x)} != {_tuple([d for _, d in dims])}:",
                      "    return MISSED"]  # fmt: skip
            continue
        lines += [f"{x}_shape = {backend.shape(x)}", f"if len({x}_shape) != {len(dims)}:",
                  "    return MISSED"]  # fmt: skip
        targets = [d if kind == "bind" else f"{x}_{i}" for i, (kind, d) in enumerate(dims)]
        lines.append(f"{', '.join(targets)}{',' if len(targets) == 1 else ''} = {x}_shape")
        for i, (kind, want) in enumerate(dims):
            if kind == "equal":
                lines += [f"if {x}_{i} != {want}:", "    return MISSED"]
    if not has_tensor or set(symbols) - bound:
        return None  # a size only a scalar gives, or no tensor to place the results by
    if meta["guards"]:
        lines.append(
            f"guards({{{', '.join(f'{n!r}: {s}' for n, s in symbols.items())}}}, "
            f"{{{', '.join(f'{n!r}: {x}' for n, x in arg.items())}}})"
        )
    spans = {p["name"]: (backend.address(arg[p["name"]]), _nbytes(p, symbols, dtype))
             for p in inputs if p["kind"] == "tensor"}  # fmt: skip
    placed = _results(meta, backend, dtype, symbols, arg, names, spans)
    if None in placed:
        return None  # a result whose shape is an expression of sizes, or a dtype it lacks
    lines += placed
    arguments = [arg[p["name"]] if p["kind"] == "scalar" or p.get("io") == "out"
                 else backend.address(arg[p["name"]]) for p in meta["params"]]  # fmt: skip
    lines.append(backend.call(", ".join([*arguments, *symbols.values()])))
    results = [f"r{r}" for r in range(len(meta["results"]))]
    lines.append(f"return {_returned(results)}")
    text = "def fast(*args, out=None):\n" + "".join(f"    {line}\n" for line in lines)
    exec(compile(text, f"<fast path of {meta['name']}>", "exec"), names)
    fast = names["fast"]
    fast.source = text
    return fast


def _results(
    meta: Mapping[str, Any], backend: Backend, dtype: Callable[[str], np.dtype],
    symbols: Mapping[str, str], arg: dict[str, str], names: dict[str, Any],
    spans: Mapping[str, tuple[str, str]],
) -> list[str | None]:  # fmt: skip
    """The lines that place the results ``r0``, ``r1``, ... and their addresses ``r0_p``,
    ...: allocated, or with ``out`` the caller's tensors (one, or a tuple of one per
    result, None where one is allocated), each checked as an input is and for the
    result's shape, and left to the full path where it lies over an input's memory
    (``spans``: each tensor input's address and bytes by name), which computes it apart
    and copies it; ``None`` among them where no plan reduces so. A result that updates
    an input (the metadata's ``updates``: the kernel reads the input from the result's
    memory) is that input's own tensor, as a donated state's call passes it; the full
    path copies the input into any other, and into one it allocates."""
    by_name = {p["name"]: p for p in meta["params"]}
    results = [f"r{r}" for r in range(len(meta["results"]))]
    result_address = backend.result_address or backend.address
    indent = "    ".__add__
    allocated: list[str] = []
    given: list[str] = []
    for r, name in zip(results, meta["results"], strict=True):
        p = by_name[name]
        if not all(text in symbols or text.isdigit() for text in p["dims"]):
            return [None]
        shape = _tuple([symbols.get(text, text) for text in p["dims"]])
        names[f"{r}_dtype"] = backend.result_dtype(dtype(p["dtype"]))
        names[f"{r}_dtypes"] = backend.dtypes(dtype(p["dtype"]))
        if names[f"{r}_dtype"] is None:
            return [None]
        arg[name] = f"{r}_p"
        made = [f"{r} = {backend.allocate(shape, f'{r}_dtype')}", f"{r}_p = {result_address(r)}"]
        if "updates" in p:
            made = ["return MISSED"]  # to be filled with the input's copy first
        allocated += made
        checks = [f"if not ({backend.accepts(r, f'{r}_dtypes', True)}):", "    return MISSED",
                  f"if {backend.shape(r)} != {shape}:", "    return MISSED",
                  f"{r}_p = {backend.address(r)}"]  # fmt: skip
        if "updates" in p:
            checks += [f"if {r}_p != {spans[p['updates']][0]}:", "    return MISSED"]
        end = f"{r}_p + {_nbytes(p, symbols, dtype)}"
        for other, (address, nbytes) in spans.items():
            if other == p.get("updates"):
                continue  # the same memory: the kernel reads each element before it writes it
            checks += [f"if {r}_p < {address} + {nbytes} and {address} < {end}:",
                       "    return MISSED"]  # fmt: skip
        if len(results) == 1:
            given += checks
        else:  # a tuple of outs holds None where a result is allocated
            given += [f"if {r} is None:", *map(indent, made), "else:", *map(indent, checks)]
    if "return MISSED" in allocated:
        allocated = ["return MISSED"]
    if not all(names[f"{r}_dtypes"] for r in results):  # a dtype the library lacks
        return ["if out is not None:", "    return MISSED", *allocated]
    if len(results) == 1:
        unpack = ["r0 = out"]
    else:
        unpack = [f"if type(out) is not tuple or len(out) != {len(results)}:",
                  "    return MISSED", f"{', '.join(results)} = out"]  # fmt: skip
    return ["if out is None:", *map(indent, allocated), "else:",
            *map(indent, [*unpack, *given])]  # fmt: skip


def _nbytes(
    p: Mapping[str, Any], symbols: Mapping[str, str], dtype: Callable[[str], np.dtype]
) -> str:
    """The bytes of the tensor ``p`` as an expression of the size symbols, at least
    its true size (an i4 tensor's two elements a byte are counted as one each): enough
    to tell that two tensors do not overlap."""
    count = " * ".join(symbols.get(d, d) for d in p["dims"]) or "1"
    return f"{count} * {dtype(p['dtype']).itemsize}"


def _tuple(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _returned(results: list[str]) -> str:
    if not results:
        return "None"
    return results[0] if len(results) == 1 else f"({', '.join(results)})"
