"""``--python-loader``: a Python module that loads a CUDA file with CuPy and calls it.

A project that checks in ``kernel.cu`` and this module needs CuPy, not Tessera: the
module carries what ``tessera.runtime.cuda`` reads from the metadata (the parameters,
the guards, the launches, a debug build's bounds checks and NaN/Inf sentinels) as plain
Python, one typed function per ``.tsr`` function.
Sizes are Python expressions of the symbols the arguments' shapes bind, printed from
the same dims as the C code's. The template (``templates/loader``) is written so that
its output is already formatted as black formats it; a test checks that for every
example and library file.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Mapping
from typing import Any

from ..check.bounds import FAULT, accessed
from ..graph.dims import parse_dim
from ..graph.dtypes import ENTRY_DTYPES
from .cexpr import c_dim
from .entry import signature_items
from .render import environment, python_text

__all__ = ["LoaderError", "python_loader"]

#: The cupy dtype that holds each Tessera dtype: bf16 and fp8 travel as their bits.
_STORAGE = {"f32": "float32", "tf32": "float32", "f16": "float16", "bf16": "uint16",
            "fp8_e4m3": "uint8", "fp8_e5m2": "uint8", "i32": "int32", "i8": "int8",
            "i4": "uint8", "f64": "float64", "i64": "int64"}  # fmt: skip
_SCALARS = {"float": "float32", "int": "int64", "bool": "int32"}
_RELATIONS = {"equal": "==", "at_most": "<=", "at_least": ">="}
_WIDTH = 88  # black's default line length
#: The module's own names, which a function's body reads: a size does not take them, and
#: a parameter may not.
_MODULE_NAMES = """cupy numpy math ctypes functools Path max ValueError _SOURCE _OPTIONS
    _DEFAULT_SMEM _module _kernel _launch _persistent _driver _tensor_map _tensor _shape _indices
    BoundsError _BOUNDS _fault NonFiniteError _as_floats _finite _updated"""
_MODULE = frozenset(_MODULE_NAMES.split())


class LoaderError(ValueError):
    """A function of the file that the loader module cannot offer as written."""


def python_loader(meta: Mapping[str, Any], cuda_file: str) -> str:
    """The loader module for the CUDA file named ``cuda_file`` (next to the module).
    Raises ``LoaderError`` for a parameter named like one of the module's own names:
    the function's body, which reads that name, would see the argument instead."""
    for f in meta["functions"]:
        if f.get("collectives"):
            raise LoaderError(
                f"function '{f['name']}' runs collectives, which a CuPy loader does not call "
                "yet: build the CUDA file with nvcc against NCCL (docs/distributed.md)"
            )
        for p in f["params"]:
            if p["name"] in _MODULE:
                raise LoaderError(
                    f"function '{f['name']}': the loader module cannot take a parameter "
                    f"named '{p['name']}', a name it uses itself; rename the parameter"
                )
    functions = [_function(f) for f in meta["functions"]]
    tma = any("tensor_maps" in launch for f in meta["functions"] for launch in f["launches"])
    indices = any(g["kind"] == "indices" for f in meta["functions"] for g in f["guards"])
    persistent = any(launch.get("persistent") for f in meta["functions"]
                     for launch in f["launches"])  # fmt: skip
    sentinels = any("sentinel" in launch for f in meta["functions"] for launch in f["launches"])
    updates = any("updates" in p for f in meta["functions"] for p in f["params"])
    return environment("loader").get_template("cupy_loader.py.j2").render(
        source=meta["source"], arch=meta["arch"], cuda_file=cuda_file,
        options=_tuple([f'"{o}"' for o in meta["build"]["options"]]), functions=functions,
        tma=tma, indices=indices, persistent=persistent, bounds=_bounds(meta),
        sentinels=sentinels, updates=updates,
    )  # fmt: skip


def _bounds(meta: Mapping[str, Any]) -> list[str]:
    """A debug build's bounds checks as the module's ``_BOUNDS`` list holds them, by the
    number a failure reports: kernel, ``.tsr`` line, access, axis, and whether the tile
    must end inside the axis (the same fields ``tessera.runtime.sentinel`` reads)."""
    lines = []
    for check in meta.get("bounds", ()):
        fields = [_quoted(check["kernel"]), _quoted(check["line"]), _quoted(accessed(check)),
                  str(check["axis"]), str(bool(check["whole"]))]  # fmt: skip
        lines += _wrap(4, "(", fields, "),")
    return lines


def _size_names(f: Mapping[str, Any]) -> dict[str, str]:
    """Each size symbol's Python name: its own, unless it is a keyword or a parameter,
    buffer or tensor map of the function, or a name of the module, which it would hide
    (a size ``x`` would overwrite the tensor ``x``); then underscores are appended."""
    # An int parameter named like a size gives the size its value: the two are one name.
    params = {p["name"] for p in f["params"] if p.get("type") != "int"}
    taken = set(_MODULE) | params | {"out"} | {b["name"] for b in f["buffers"]}
    taken |= {m["name"] for launch in f["launches"] for m in launch.get("tensor_maps", ())}
    free = [d for d in f["dims"] if d not in taken and not keyword.iskeyword(d)]
    taken |= set(free)
    names = {}
    for d in f["dims"]:
        name = d
        while d not in free and (name in taken or keyword.iskeyword(name)):
            name += "_"
        taken.add(name)
        names[d] = name
    return names


def _py_size(text: str, names: Mapping[str, str]) -> str:
    """A size the metadata writes as a dim (``"B*H"``, ``"S/2"``) as a Python integer
    expression, its symbols by their ``names``: the C printer's, with Python's floor
    division and black's spacing."""
    spaced = re.sub(
        r"[*/]",
        lambda m: " * " if m.group() == "*" else " // ",
        c_dim(parse_dim(text), dict(names)),
    )
    return re.sub(r"\((\w+)\)", r"\1", spaced)


def _wrap(indent: int, head: str, items: list[str | list[str]], tail: str) -> list[str]:
    """``head(items)tail`` as black prints it: on one line when that fits in 88
    columns, else one item per line with a trailing comma (which keeps it that way). A
    list item is a tuple, split over lines in turn when its line is too long."""
    flat = [_tuple(item) if isinstance(item, list) else item for item in items]
    line = " " * indent + head + ", ".join(flat) + tail
    if len(line) <= _WIDTH or not items:
        return [line]
    pad = " " * (indent + 4)
    lines = [" " * indent + head]
    for item, text in zip(items, flat, strict=True):
        if isinstance(item, list) and len(f"{pad}{text},") > _WIDTH:
            lines += _wrap(indent + 4, "(", list(item), "),")
        else:
            lines.append(f"{pad}{text},")
    return [*lines, " " * indent + tail.lstrip(" ")]


def _function(f: Mapping[str, Any]) -> dict[str, Any]:
    """One function's signature, docstring and body, indented as printed."""
    name = f["name"]
    inputs = [p for p in f["params"] if p.get("io") != "out"]
    results = [p for name in f["results"] for p in f["params"] if p["name"] == name]
    names = _size_names(f)
    bound: set[str] = set()
    body: list[str] = []
    for p in inputs:
        if p["kind"] == "scalar":
            body.append(f"    {p['name']} = cupy.{_SCALARS[p['type']]}({p['name']})")
        else:
            body.extend(_tensor_checks(4, name, p, bound, names))
    for g in f["guards"]:
        body.extend(_guard(name, g, names))
    if len(results) > 1:
        unpacked = ", ".join(r["name"] for r in results)
        chosen = f"{_tuple(['None'] * len(results))} if out is None else out"
        line = f"    {unpacked} = {chosen}"
        # as black splits an assignment too long for a line: its value in parentheses
        body.extend(
            [line] if len(line) <= _WIDTH else [f"    {unpacked} = (", f"        {chosen}", "    )"]
        )
    for result in results:
        out, dtype = result["name"], f'dtype="{_STORAGE[result["dtype"]]}"'
        shape = _tuple(_array_shape(result, names))
        given = result.get("updates")
        if given is not None:  # the kernel reads the input from the result's memory
            body.append(
                f"    # {out} is {given} updated: in place where {given} is passed as {out}"
            )
            body.append(f"    if {out} is not None:")
            body.extend(_tensor_checks(8, name, result, set(bound), names))
            body.append(f"    {out} = _updated({out}, {given})")
            continue
        body.append(f"    if {out} is None:")
        body.extend(_wrap(8, f"{out} = cupy.empty(", [shape, dtype], ")"))
        body.append("    else:")
        body.extend(_tensor_checks(8, name, result, set(bound), names))
    for b in f["buffers"]:
        # a debug build's fault record starts empty: no check has failed
        make = "zeros" if b["name"] == FAULT else "empty"
        body.extend(
            _wrap(
                4,
                f"{b['name']} = cupy.{make}(",
                [f"max(1, {_py_size(b['bytes'], names)})", 'dtype="uint8"'],
                ")",
            )
        )
    for launch in f["launches"]:
        for m in launch.get("tensor_maps", ()):
            dims = _tuple([_py_size(d, names) for d in m["dims"]])
            element_bytes = str(ENTRY_DTYPES[m["dtype"]].bits // 8)
            args = [m["tensor"], element_bytes, dims, _tuple([str(b) for b in m["box"]])]
            body.extend(_wrap(4, f"{m['name']} = _tensor_map(", args, ")"))
        body.extend(_wrap(4, "_launch(", _launch(launch, names), ")"))
        if FAULT in launch["args"]:
            body.append(f"    _fault({FAULT})")
        for write in launch.get("sentinel", {}).get("writes", ()):
            check = [_quoted(launch["kernel"]), _quoted(launch["sentinel"]["line"]),
                     _quoted(write["name"]), write["name"], _quoted(write["dtype"])]  # fmt: skip
            body.extend(_wrap(4, "_finite(", check, ")"))
    if results:
        body.append(f"    return {', '.join(r['name'] for r in results)}")
    # Defaults as the .tsr file gives them, where Python allows them: on the positional
    # parameters after the last one without, and on every keyword-only one.
    positional = [p for p in inputs if not p.get("keyword_only")]
    required = max((i for i, p in enumerate(positional) if "default" not in p), default=-1)
    params = [f"{p['name']}: {'cupy.ndarray' if p['kind'] == 'tensor' else p['type']}"
              + (f" = {p['default']!r}" if "default" in p and (i > required or i < 0) else "")
              for i, p in [*enumerate(positional), *((-1, p) for p in inputs
                                                    if p.get("keyword_only"))]]  # fmt: skip
    if len(positional) < len(inputs):
        params.insert(len(positional), "*")
    returns = "None"
    if results:
        params += [] if "*" in params else ["*"]
    if len(results) == 1:
        params.append("out: cupy.ndarray | None = None")
        returns = "cupy.ndarray"
    elif results:
        params.append("out: tuple | None = None")
        returns = f"tuple[{', '.join(['cupy.ndarray'] * len(results))}]"
    return {
        "signature": _wrap(0, f"def {name}(", params, f") -> {returns}:"),
        "doc": _doc(name, inputs, results),
        "body": body,
    }


def _launch(launch: Mapping[str, Any], names: Mapping[str, str]) -> list[str | list[str]]:
    """The arguments of ``_launch``: kernel, grid in blocks, threads, shared memory, and
    the kernel's arguments (sizes as 64-bit integers, as the kernels declare them)."""
    grid = [_blocks(_py_size(g["extent"], names), g["block"]) for g in launch["grid"]]
    if launch.get("persistent"):  # a program per multiprocessor, each looping over tiles
        grid = [f"_persistent({' * '.join(grid)})"]
    args = [f"cupy.int64({names[a]})" if a in names else a for a in launch["args"]]
    return [f'"{launch["kernel"]}"', _tuple(grid), str(launch["threads"]),
            str(launch["dynamic_smem"]), args]  # fmt: skip


def _tensor_checks(
    indent: int, function: str, p: Mapping[str, Any], bound: set[str], names: Mapping[str, str]
) -> list[str]:
    """Check one tensor argument, binding the size symbols its shape gives first."""
    name, dims, pad = p["name"], p["dims"], " " * indent
    check = [f'"{function}"', f'"{name}"', name, f'"{_STORAGE[p["dtype"]]}"', str(len(dims))]
    lines = _wrap(indent, f"{name} = _tensor(", check, ")")
    if p["dtype"] == "i4":
        return lines + _packed_checks(indent, function, p, bound, names)
    fresh = [d for d in dims if re.fullmatch(r"[A-Za-z_]\w*", d) and d not in bound]
    if fresh == dims and len(dims) == 1:
        lines.append(f"{pad}{names[dims[0]]} = {name}.shape[0]")
    elif fresh == dims and len(set(dims)) == len(dims) > 0:
        lines.append(f"{pad}{', '.join(names[d] for d in dims)} = {name}.shape")
    elif dims:  # a 0-d tensor has its rank checked, and no more
        lines += [f"{pad}{names[d]} = {name}.shape[{dims.index(d)}]" for d in dict.fromkeys(fresh)]
        shown, want = f'"[{", ".join(dims)}]"', _tuple([_py_size(d, names) for d in dims])
        lines += _wrap(indent, "_shape(", [f'"{function}"', f'"{name}"', name, shown, want], ")")
    bound.update(dims)
    return lines


def _array_shape(p: Mapping[str, Any], names: Mapping[str, str]) -> list[str]:
    """The shape of a tensor's array: an i4 tensor's holds two elements in each byte of
    its last dim (``docs/numerics.md``)."""
    shape = [_py_size(d, names) for d in p["dims"]]
    if p["dtype"] == "i4":
        shape[-1] = f"{_paren(shape[-1])} // 2"
    return shape


def _packed_checks(
    indent: int, function: str, p: Mapping[str, Any], bound: set[str], names: Mapping[str, str]
) -> list[str]:
    """An i4 tensor's checks: the symbols its shape gives, bound from its bytes (two
    elements in each of the last dim's), then its shape in bytes."""
    name, dims, pad = p["name"], p["dims"], " " * indent
    lines = []
    for i, d in enumerate(dims):
        if re.fullmatch(r"[A-Za-z_]\w*", d) and d not in bound:
            size = f"2 * {name}.shape[{i}]" if i == len(dims) - 1 else f"{name}.shape[{i}]"
            lines.append(f"{pad}{names[d]} = {size}")
            bound.add(d)
    shown = f'"[{", ".join(dims)}] in bytes of two"'
    want = _tuple(_array_shape(p, names))
    return lines + _wrap(indent, "_shape(", [f'"{function}"', f'"{name}"', name, shown, want], ")")


def _guard(function: str, g: Mapping[str, Any], names: Mapping[str, str]) -> list[str]:
    """The guard's test and the runtime's message, split before the reason when the
    message does not fit on a line."""
    left, right = _paren(_py_size(g["left"], names)), _paren(_py_size(g["right"], names))
    if g["kind"] == "indices":
        shown = _quoted(g["right"] if g["right"].isdigit() else f"{g['right']} = {{{right}}}", "f")
        args = [f'"{function}"', f'"{g["tensor"]}"', g["tensor"], left, right, shown,
                _quoted(g["reason"])]  # fmt: skip
        return _wrap(4, "_indices(", args, ")")
    said, right_name = _literal(g["left"]), _literal(g["right"])
    # A size on the right has its value shown too, as the runtime's message does.
    value = "" if g["right"].isdigit() else f"{right_name} = {{{right}}}"
    if g["kind"] == "divisible":
        nonzero = "" if right.isdigit() and int(right) else f"{right} == 0 or "
        test = f"{nonzero}{left} % {right} != 0"
        broken = f"{said} % {right_name} == 0" + (f" with {value}" * bool(value))
    else:
        test = f"not {left} {_RELATIONS[g['kind']]} {right}"
        broken = f"{said} {_RELATIONS[g['kind']]} {value or right_name}"
    head = f"{function}(): {said} = {{{left}}} breaks {broken} "
    reason = f"({g['reason']})"
    whole = _wrap(8, "raise ValueError(", [_quoted(head + _literal(reason), "f")], ")")
    if all(len(line) <= _WIDTH for line in whole):
        return [f"    if {test}:", *whole]
    parts = [" " * 12 + _quoted(head, "f"), " " * 12 + _quoted(reason)]
    return [f"    if {test}:", "        raise ValueError(", *parts, "        )"]


def _literal(text: str) -> str:
    """``text`` as the literal part of an f-string."""
    return text.replace("{", "{{").replace("}", "}}")


def _quoted(text: str, prefix: str = "") -> str:
    """A string literal of ``text``, quoted as black quotes it: double quotes unless the
    text holds double quotes and no single ones."""
    quote = "'" if '"' in text and "'" not in text else '"'
    return f"{prefix}{quote}{python_text(text, quote)}{quote}"


def _doc(name: str, inputs: list[Mapping[str, Any]], results: list[Mapping[str, Any]]) -> list[str]:
    """The signature as the ``.tsr`` file gives it, dtypes and dims included: the
    docstring, on one line or one argument per line."""
    args = signature_items(inputs)
    shown = [f"{r['dtype']}[{', '.join(r['dims'])}]" for r in results]
    tail = f" -> {shown[0]}" if len(shown) == 1 else f" -> ({', '.join(shown)})" if shown else ""
    return _wrap(4, f'"""{name}(', args, f'){tail}"""')


def _blocks(extent: str, block: int) -> str:
    """Programs along one grid axis: ``extent`` in blocks of ``block``, rounded up."""
    return extent if block == 1 else f"-(-{_paren(extent)} // {block})"


def _tuple(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _paren(expr: str) -> str:
    return expr if re.fullmatch(r"[\w.]+", expr) else f"({expr})"
