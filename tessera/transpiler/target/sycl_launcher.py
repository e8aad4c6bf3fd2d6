"""The host side of a SYCL file: one function per graph function, on a ``sycl::queue``.

CUDA, HIP and OpenCL files leave their launches to a runtime that reads the metadata.
A SYCL file is C++ for one compiler, host and device together, so it carries its own
host code: ``f(queue, tensors..., sizes...)`` allocates the intermediates on the
queue's device, submits each launch (each after the one before it: a queue need not
be in order), waits for the last and frees them.

Each kernel function has a submit function beside it, ``k_submit(queue, done,
tensors..., sizes...)``, which runs it as a ``parallel_for`` over an ``nd_range<3>``
after the event ``done``: it declares the launch's numbers once, by name, as the kernel
declares them (``THREADS``, ``BM``, ``BN``, and the elements of each local array,
``SMEM_CHUNKS``), and allocates the kernel's shared memory in its command group
(``local_accessor``), passed to the kernel function as pointers. So a host function of
twenty launches reads as twenty calls, and the geometry of each launch stands once,
next to the kernel it launches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ...frozen import frozen
from ..check.bounds import FAULT, FAULT_BYTES, accessed
from ..check.sentinels import written_floats
from ..graph.dims import Dim
from ..graph.types import TensorType, in_memory
from ..tile.ir import TileKernel, TileProgram
from .cexpr import c_dim, names_used, param_name
from .entry import entry_params, kernel_sizes, symbols, updated, written
from .naming import C_LIBRARY, GPU_BUILTINS, Namer
from .simt_dialect import Dialect
from .simt_host import NON_FINITE
from .simt_kernel import SimtKernel
from .tile_constants import C_NAMES

__all__ = ["Launcher", "launcher", "LAUNCHER_NAMES", "debug_host_code"]

#: Names the host functions declare themselves; a parameter never takes one.
LAUNCHER_NAMES = frozenset({"queue", "cgh", "it", "done", "global", "group", "sycl"})
#: The widest element a shared array is allocated in: a local accessor's elements are
#: aligned to their type, so that the arena (16-byte chunks) is allocated in uint4s.
_CHUNK = 16
#: Lines stay under this many columns.
_COLUMNS = 100


@frozen
class Launch:
    """One kernel's launch, as the host function writes it."""

    kernel: str
    #: The kernel's submit function, which the host function calls with ``args``.
    submit: str
    args: tuple[str, ...]
    #: Whether it checks bounds (a debug build): it takes the fault record, which the
    #: host function reads back after it.
    checked: bool = False
    #: A debug build's NaN/Inf sentinel: the kernel and its line, then each float tensor
    #: it writes: (name, elements, bytes of one, exponent mask, whether it has
    #: infinities).
    sentinel: str = ""
    writes: tuple[tuple[str, str, int, int, bool], ...] = ()


@frozen
class Launcher:
    name: str
    function: str
    params: tuple[str, ...]
    #: (pointer type, name, bytes) of each intermediate.
    buffers: tuple[tuple[str, str, str], ...]
    launches: tuple[Launch, ...]
    #: (result, input, bytes) of each result that starts as the input it updates
    #: (``entry.updated``): copied there first, unless the caller passes the input.
    updates: tuple[tuple[str, str, str], ...] = ()


def launcher(
    program: TileProgram,
    kernels: list[tuple[str, str, SimtKernel]],
    d: Dialect,
    name: str,
    file_names: frozenset[str],
    sentinels: dict[str, str] | None = None,
) -> Launcher:
    """The host function ``name`` of ``program``, whose kernels are printed under the
    given names and submitted by the given functions; ``file_names`` are the
    file-scope names that its parameters must not hide. ``sentinels`` (a debug build)
    gives each kernel's ``.tsr`` line, and what it writes is checked for NaN and
    infinity after it."""
    namer = Namer(file_names | LAUNCHER_NAMES | C_LIBRARY | GPU_BUILTINS)
    names: dict[str, str] = {}
    inputs = []  # (the declaration before its name, the name)
    for entry, t in entry_params(program):
        names[entry] = namer.fresh(entry, "arg")
        if isinstance(t, TensorType):
            const = "" if written(program, entry) else "const "
            inputs.append((f"{const}{d.storage[t.dtype.name]}*", names[entry]))
        else:
            inputs.append((f"const {d.scalar_types[t.kind]}", names[entry]))
    sizes = []  # (the declaration before its name, the name)
    for dim in symbols([t for _, t in entry_params(program)]):
        names[dim] = namer.fresh(dim, "size")
        sizes.append((f"const {d.index_type}", names[dim]))
    buffers = []
    for b in program.host.buffers:
        names[b.param] = namer.fresh(b.param, "buffer")
        pointer = f"{d.storage[in_memory(b.type).dtype.name]}*"  # a mask: its floats
        buffers.append((pointer, names[b.param], c_dim(b.bytes, names)))
    launches = []
    for kernel, (printed, submit, simt) in zip(program.kernels, kernels, strict=True):
        args = [names[p.name] for p in kernel.params]
        args += [names[dim] for dim in kernel_sizes(kernel)]
        args += [FAULT] if simt.checked else []
        launch = Launch(printed, submit, tuple(args), simt.checked)
        if sentinels is not None:
            launch = replace(launch, sentinel=f"kernel '{printed}' ({sentinels[kernel.name]})",
                             writes=_writes(kernel, names))  # fmt: skip
        launches.append(launch)
    types = dict(entry_params(program))
    updates = []
    for result, given in updated(program).items():
        t = types[result]
        size = f"{c_dim(_elements(t), names)} * sizeof({d.storage[t.dtype.name]})"
        updates.append((names[result], names[given], size))
    # an input or a size that nothing reads (a function whose kernels read no input, as
    # arange's) keeps its place in the signature, unnamed
    f = Launcher(name, program.host.function, (), tuple(buffers), tuple(launches),
                 tuple(updates))  # fmt: skip
    read = names_used(launcher_lines(f))
    params = [f"{decl} {param_name(n, n in read)}" for decl, n in (*inputs, *sizes)]
    return replace(f, params=tuple(params))


def _writes(
    kernel: TileKernel, names: dict[str, str]
) -> tuple[tuple[str, str, int, int, bool], ...]:
    """Each float tensor ``kernel`` writes, as a sentinel checks it."""
    out = []
    for p in written_floats(kernel):
        dtype = p.type.dtype.name
        infinite = dtype != "fp8_e4m3"  # S.1111.111 is its one non-finite value, a NaN
        out.append((names[p.name], c_dim(_elements(p.type), names), p.type.dtype.bits // 8,
                    NON_FINITE[dtype], infinite))  # fmt: skip
    return tuple(out)


def _elements(t: TensorType) -> Dim:
    """The elements of a tensor of type ``t``."""
    count = Dim.const(1)
    for d in t.dims:
        count = count * d
    return count


def _locals(simt: SimtKernel) -> tuple[tuple[str, str, int], ...]:
    """Each shared array as a local accessor allocates it: the byte arena as uint4s."""
    out = []
    for ctype, name, count, align in simt.locals:
        assert align <= _CHUNK, "a SYCL arena is aligned to 16 bytes"
        if ctype == "unsigned char":
            out.append(("sycl::uint4", name, -(-count // _CHUNK)))
        else:
            out.append((ctype, name, count))
    return tuple(out)


def submit_function(
    name: str,
    kernel: str,
    params: Sequence[str],
    args: Sequence[str],
    simt: SimtKernel,
    grid: Sequence[tuple[Dim, int]],
    sizes: dict[str, str],
) -> list[str]:
    """The lines of ``name(queue, done, params...)``, which submits ``kernel`` (whose
    arguments, but for the work-item and its local arrays, are ``args``, declared as
    ``params``, the size symbols among them named by ``sizes``) over the launch
    ``grid`` ((extent, block) per axis, the first axis fastest) after the event
    ``done``, and returns the launch's event. The numbers of the launch are its
    constants, declared first: the work-group's ``THREADS``, the tile that a program
    of each axis covers (the kernel's name for it, ``BM``), and each local array's
    elements (``SMEM_CHUNKS`` for the byte arena in uint4s)."""
    namer = Namer(frozenset(args) | LAUNCHER_NAMES | C_LIBRARY | GPU_BUILTINS)
    constants: dict[str, int] = {}

    def constant(wanted: str, value: int) -> str:
        """The name of ``value`` in the role ``wanted``: that name once declared for it."""
        named = wanted if constants.get(wanted) == value else namer.fresh(wanted)
        constants[named] = value
        return named

    counts = []
    for (extent, block), (pid, _, _) in zip(grid, simt.grid, strict=False):
        if extent.constant is not None:  # a size the source fixes: a count of programs
            counts.append(str(-(-extent.constant // block)))
        elif block != 1:
            tile = constant(simt.blocks.get(pid, "BLOCK"), block)
            counts.append(f"({c_dim(extent, sizes)} + {tile} - 1) / {tile}")
        else:
            counts.append(c_dim(extent, sizes))
    counts += ["1"] * (3 - len(counts))
    threads = constant("THREADS", simt.threads)
    counts[0] = threads if counts[0] == "1" else f"{threads} * ({counts[0]})"
    accessors = []
    for ctype, local, count in _locals(simt):
        unit = "CHUNKS" if ctype == "sycl::uint4" else "SIZE"
        size = constant(f"{local.removeprefix('tsr_').upper()}_{unit}", count)
        accessors.append(
            f"    sycl::local_accessor<{ctype}, 1> {local}(sycl::range<1>({size}), cgh);"
        )
    head = _call(f"inline sycl::event {name}(",
                 ["sycl::queue& queue", "const sycl::event& done", *params], ") {", 0)  # fmt: skip
    call = [*args, "it", *(accessor_pointer(n, c) for c, n, _ in _locals(simt))]
    return [
        f"// ---- {name}: submits {kernel} to `queue` after the event `done`",
        *head,
        *(f"  constexpr int {n} = {constants[n]};" for n in sorted(constants, key=_order)),
        "  return queue.submit([&](sycl::handler& cgh) {",
        "    cgh.depends_on(done);",
        *accessors,
        f"    const sycl::range<3> global({counts[2]}, {counts[1]}, {counts[0]});",
        f"    const sycl::range<3> group(1, 1, {threads});",
        "    cgh.parallel_for(sycl::nd_range<3>(global, group), [=](sycl::nd_item<3> it) {",
        *_call(f"      {kernel}(", call, ");", 0),
        "    });",
        "  });",
        "}",
    ]


def _order(name: str) -> tuple[int, str]:
    """Where a launch's constant is declared: rows before columns, as the kernel
    declares its tiles, then the work-group, then the local arrays."""
    tiles = [*C_NAMES.values(), "THREADS"]
    return (tiles.index(name), "") if name in tiles else (len(tiles), name)


def accessor_pointer(name: str, ctype: str) -> str:
    """The kernel function's pointer to a local accessor's memory."""
    pointer = f"{name}.get_multi_ptr<sycl::access::decorated::no>().get()"
    return f"(unsigned char*){pointer}" if ctype == "sycl::uint4" else pointer


def launcher_lines(f: Launcher) -> list[str]:
    """The body of the host function, one statement per line. In a debug build, the
    fault record is allocated with the intermediates and read back after each launch
    that checks bounds; a failed check frees them and throws."""
    buffers = list(f.buffers)
    if any(launch.checked for launch in f.launches):
        buffers.append(("long long*", FAULT, str(FAULT_BYTES)))
    checked = any(launch.checked or launch.sentinel for launch in f.launches)
    lines = [f"{ptype} const {name} = static_cast<{ptype}>(sycl::malloc_device({size}, queue));"
             for ptype, name, size in buffers]  # fmt: skip
    frees = [f"sycl::free({name}, queue);" for _, name, _ in buffers]
    if any(launch.checked for launch in f.launches):
        lines.append(f"queue.memset({FAULT}, 0, {FAULT_BYTES}).wait();")
    lines.append("sycl::event done;")
    for result, given, size in f.updates:  # the kernel reads `given` from `result`
        lines.append(f"if ({result} != {given}) done = queue.memcpy({result}, {given}, "
                     f"{size}, done);")  # fmt: skip
    launches = _launch_lines(f)
    if checked:
        lines += ["try {", *("  " + line for line in launches), "} catch (...) {"]
        lines += ["  done.wait();", *("  " + line for line in frees), "  throw;", "}"]
    else:
        lines += launches
    lines.append("done.wait();")
    return lines + frees


def _launch_lines(f: Launcher) -> list[str]:
    lines = []
    for launch in f.launches:
        lines += _call(f"done = {launch.submit}(", ["queue", "done", *launch.args], ");")
        if launch.checked:
            lines.append(f"tsr_debug::check_bounds({FAULT}, queue, done);")
        for name, count, size, mask, infinite in launch.writes:
            args = [name, count, str(size), f"{mask:#x}u", str(infinite).lower(),
                    f'"{_quoted(launch.sentinel)}"', f'"{name}"', "queue", "done"]  # fmt: skip
            lines += _call("tsr_debug::check_finite(", args, ");")
    return lines


def _call(head: str, args: list[str], tail: str, indent: int = 2) -> list[str]:
    """A call on one line, or with its arguments on lines of their own, all under 100
    columns once indented by ``indent``."""
    line = head + ", ".join(args) + tail
    if len(line) + indent < _COLUMNS:
        return [line]
    pad = " " * (len(head) - len(head.lstrip()) + 4)
    lines, current = [head.rstrip()], pad
    for arg in args:
        piece = arg + ","
        if current.strip() and len(current) + len(piece) + indent >= _COLUMNS:
            lines.append(current.rstrip())
            current = pad
        current += piece + " "
    lines.append(current.rstrip()[:-1] + tail)
    return lines


def launcher_view(f: Launcher) -> dict[str, Any]:
    """What the module template prints of a host function: its signature's lines and
    its body's."""
    head = _call(f"inline void {f.name}(", ["sycl::queue& queue", *f.params], ") {", 0)
    return {"name": f.name, "function": f.function, "head": head,
            "body": launcher_lines(f)}  # fmt: skip


#: The host functions' part of a debug build: the checks by number, and the read-back.
_DEBUG = """\
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace tsr_debug {{

// What each bounds check of the file is, by its number: the access, the axis, and
// whether the whole tile must lie inside the axis (an unmasked one) or its start.
struct Check {{
  const char* what;
  int axis;
  bool whole;
}};

static const Check bounds_checks[] = {{
{checks}
}};

// After a launch of a debug build: its fault record (zero, or the check's number + 1,
// the index, the tile's size and the extent), read back once the launch is done. A
// failed check throws std::out_of_range, which says it as the Python runtimes do.
inline void check_bounds(const long long* fault, sycl::queue& queue, sycl::event& done) {{
  long long record[4];
  done.wait();
  queue.memcpy(record, fault, sizeof record).wait();
  if (record[0] == 0) return;
  const Check& check = bounds_checks[record[0] - 1];
  // An unmasked tile that starts inside the axis fails at its first index past the end.
  const long long bad = check.whole && record[1] < record[3] ? record[3] : record[1];
  std::string text = std::string("tessera: ") + check.what + " out of bounds: index " +
                     std::to_string(bad) + " on axis " + std::to_string(check.axis) +
                     ", which has " + std::to_string(record[3]) + " elements";
  if (record[2] > 1)
    text += " (the tile covers [" + std::to_string(record[1]) + ", " +
            std::to_string(record[1] + record[2]) + "))";
  throw std::out_of_range(text);
}}

// After a launch of a debug build: the `count` elements of `bytes` bytes at `data` (on
// the device), read back once the launch is done. An element whose exponent bits
// (`mask`) are all ones is NaN or infinity (where the dtype has infinities): the first
// throws std::domain_error, which says it as the Python runtimes do.
inline void check_finite(const void* data, long long count, int bytes, unsigned mask,
                         bool infinite, const char* launch, const char* name,
                         sycl::queue& queue, sycl::event& done) {{
  done.wait();
  if (count == 0) return;
  std::vector<unsigned char> host(static_cast<std::size_t>(count * bytes));
  queue.memcpy(host.data(), data, host.size()).wait();
  long long first = -1, bad = 0;
  unsigned found = 0;
  for (long long i = 0; i < count; ++i) {{
    unsigned bits = 0;
    std::memcpy(&bits, host.data() + i * bytes, static_cast<std::size_t>(bytes));
    if ((bits & mask) == mask) {{
      if (first < 0) found = bits, first = i;
      ++bad;
    }}
  }}
  if (bad == 0) return;
  const unsigned sign = 1u << (bytes * 8 - 1);
  const char* value = !infinite || (found & ~sign) != mask ? "nan" : found & sign ? "-inf" : "inf";
  throw std::domain_error(std::string(launch) + " wrote " + value + " to '" + name +
                          "' at flat index " + std::to_string(first) + " (" +
                          std::to_string(bad) +
                          " non-finite values): the first launch of the call to produce one");
}}

}}  // namespace tsr_debug
"""


def debug_host_code(bounds: Sequence[Mapping[str, Any]]) -> str:
    """The host functions' debug helpers, for the metadata's list of bounds checks
    (nothing where there are none)."""
    if not bounds:
        return ""
    lines = []
    for c in bounds:
        what = f"kernel '{c['kernel']}' ({c['line']}): {accessed(c)}"
        lines.append(f'    {{"{_quoted(what)}", {c["axis"]}, {str(c["whole"]).lower()}}},')
    return _DEBUG.format(checks="\n".join(lines))


def _quoted(text: str) -> str:
    """``text`` to stand between double quotes in C++."""
    return text.replace("\\", "\\\\").replace('"', '\\"')
