"""Host launchers for the generated CUDA and HIP files: C entries a C++ program calls.

A ``.cu`` or ``.hip`` file holds kernels; what a call needs besides them (the grid of
every launch, the guards, the intermediate buffers, the dynamic shared memory above
48 KiB, the TMA tensor maps) lives in the metadata, which the Python runtime reads.
``host_source`` writes the same from the metadata as C++ at the end of the file, so that
a program built with ``nvcc`` or ``hipcc`` alone can call a function of the ``.tsr`` file:

    int tessera_<f>(<tensors as typed pointers>, <scalars>, <sizes as int64_t>,
                    void* workspace, size_t workspace_bytes, <stream>);
    size_t tessera_<f>_workspace(<int scalars that size an intermediate>, <sizes>);

Each entry checks the sizes and the guards, places the intermediates in the workspace
(the caller's, or one it allocates and frees on the stream when given none), raises a
kernel's dynamic shared memory limit where a launch needs more than 48 KiB, encodes the
tensor maps, and launches the function's kernels in order on the stream. It returns a
``TSR_HOST_*`` status, never aborting. The section is compiled only by nvcc or hipcc
(NVRTC, hiprtc and other compilers of the file skip it), and ``tesserac --no-host``
leaves it out. ``docs/runtime.md`` documents the entries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..check.bounds import FAULT, FAULT_BYTES, accessed
from ..graph.dims import Dim, parse_dim
from ..graph.dtypes import ENTRY_DTYPES
from .cexpr import c_dim, names_used, param_name
from .simt_dialect import DIALECTS

__all__ = ["host_source", "HostNameClash", "NON_FINITE"]

#: A kernel may use this much dynamic shared memory without asking for more.
_DEFAULT_SMEM = 48 * 1024
_C_SCALARS = {"float": "float", "int": "std::int64_t", "bool": "bool"}
_RELATIONS = {"equal": "==", "at_most": "<=", "at_least": ">="}

_PRELUDE = {
    "cuda": """\
#if defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#include <cuda.h>
#include <cuda_runtime.h>
""",
    "hip": """\
#if defined(__HIPCC__) && !defined(__HIPCC_RTC__)
""",
}

_COMMON = """
#include <cstddef>
#include <cstdint>

#ifndef TSR_HOST_STATUS
#define TSR_HOST_STATUS
// What a host launcher returns.
enum {{
  TSR_HOST_SUCCESS = 0,
  TSR_HOST_EINVAL = 1,      // a size is negative, or a guard of the function fails
  TSR_HOST_EWORKSPACE = 2,  // the workspace given is smaller than _workspace() says
  TSR_HOST_ELAUNCH = 3,     // the runtime refused an allocation, an attribute or a launch
}};
#endif

namespace tsr_host {{

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {{ return (a + b - 1) / b; }}

// Intermediates start on 256 bytes within the workspace, as allocations do.
inline std::size_t aligned(std::int64_t bytes) {{
  return static_cast<std::size_t>((bytes > 0 ? bytes : 1) + 255) / 256 * 256;
}}

// Bytes of the workspace, passed where a kernel takes a typed pointer.
struct Bytes {{
  unsigned char* at;
  template <class T>
  operator T*() const {{ return reinterpret_cast<T*>(at); }}
}};
{maps}
}}  // namespace tsr_host
"""

_MAPS = """
// The TMA tensor map of a tensor of `rank` dims (`dims` outermost first) at `address`,
// for copies of `box` (innermost first), as tessera/runtime/tensor_map.py encodes it:
// zeros where TMA cannot describe the tensor (the kernel then copies it element by
// element). 0 on success.
inline int encode_map(tsr_tensor_map* map, const void* address, unsigned element_bytes,
                      unsigned rank, const std::int64_t* dims, const cuuint32_t* box) {
  *map = tsr_tensor_map{};
  if (reinterpret_cast<std::uintptr_t>(address) % 16 != 0 || dims[rank - 1] * element_bytes % 16)
    return 0;
  cuuint64_t sizes[5], strides[4];
  cuuint32_t ones[5];
  for (unsigned i = 0; i < rank; ++i) {
    if (dims[i] == 0) return 0;
    sizes[i] = static_cast<cuuint64_t>(dims[rank - 1 - i]);
    ones[i] = 1;
  }
  cuuint64_t stride = element_bytes;
  for (unsigned i = 0; i + 1 < rank; ++i) strides[i] = stride *= sizes[i];
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                              const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                              const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return Encode{};
    return reinterpret_cast<Encode>(entry);
  }();
  if (encode == nullptr) return 1;
  const CUtensorMapDataType type = element_bytes == 1   ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16
                                   : element_bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_UINT32
                                                        : CU_TENSOR_MAP_DATA_TYPE_UINT64;
  return encode(reinterpret_cast<CUtensorMap*>(map), type, rank, const_cast<void*>(address),
                sizes, strides, box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
             ? 0
             : 1;
}
"""

#: A debug build's checks. Bounds (``check/bounds.py``): the fault record is cleared
#: before the launches and read back after each that checks, and the first failed check
#: is printed, by the table of what each check is. Sentinels (``check/sentinels.py``):
#: each float tensor a launch writes is copied back and its elements' exponents read.
_DEBUG = """
#include <cstdio>
#include <cstring>
#include <vector>

#define TSR_HOST_EBOUNDS 4     // a debug build's bounds check failed: stderr says where
#define TSR_HOST_ENONFINITE 5  // a debug build's launch wrote NaN or infinity: stderr says where

namespace tsr_host {{

// After a launch of a debug build: whether the `count` elements of `bytes` bytes at
// `data` (on the device) hold NaN or infinity, an element whose exponent bits (`mask`)
// are all ones; `what` says which launch wrote which tensor.
inline int check_finite(const void* data, std::int64_t count, int bytes, std::uint32_t mask,
                        const char* what, {stream} stream) {{
  std::vector<unsigned char> host(static_cast<std::size_t>(count * bytes));
  if (count == 0) return TSR_HOST_SUCCESS;
  if ({memcpy}(host.data(), data, host.size(), {to_host}, stream) != {success} ||
      {sync}(stream) != {success})
    return TSR_HOST_ELAUNCH;
  std::int64_t first = -1, bad = 0;
  for (std::int64_t i = 0; i < count; ++i) {{
    std::uint32_t bits = 0;
    std::memcpy(&bits, host.data() + i * bytes, static_cast<std::size_t>(bytes));
    if ((bits & mask) == mask) {{
      first = first < 0 ? i : first;
      ++bad;
    }}
  }}
  if (bad == 0) return TSR_HOST_SUCCESS;
  std::fprintf(stderr, "tessera: %s NaN or infinity at flat index %lld (%lld non-finite values): "
               "the first launch of the call to produce one\\n", what,
               static_cast<long long>(first), static_cast<long long>(bad));
  return TSR_HOST_ENONFINITE;
}}

// What each bounds check of the file is, by its number.
static const char* const bounds_checks[] = {{
{checks}
}};

// After a launch of a debug build: its fault record (zero, or the check's number + 1,
// the index, the tile's size and the extent), read back once the launch is done.
inline int check_bounds(const std::int64_t* fault, {stream} stream) {{
  std::int64_t record[4];
  if ({memcpy}(record, fault, sizeof record, {to_host}, stream) != {success} ||
      {sync}(stream) != {success})
    return TSR_HOST_ELAUNCH;
  if (record[0] == 0) return TSR_HOST_SUCCESS;
  std::fprintf(stderr, "tessera: %s out of bounds: the tile [%lld, %lld) of an axis of %lld\\n",
               bounds_checks[record[0] - 1], static_cast<long long>(record[1]),
               static_cast<long long>(record[1] + record[2]), static_cast<long long>(record[3]));
  return TSR_HOST_EBOUNDS;
}}

}}  // namespace tsr_host
"""

#: The runtime's names, per target: its error type, stream type, calls.
_API = {
    "cuda": {"stream": "cudaStream_t", "success": "cudaSuccess", "malloc": "cudaMallocAsync",
             "free": "cudaFreeAsync", "last_error": "cudaGetLastError",
             "memcpy": "cudaMemcpyAsync", "memset": "cudaMemsetAsync",
             "to_host": "cudaMemcpyDeviceToHost", "on_device": "cudaMemcpyDeviceToDevice",
             "sync": "cudaStreamSynchronize"},
    "hip": {"stream": "hipStream_t", "success": "hipSuccess", "malloc": "hipMallocAsync",
            "free": "hipFreeAsync", "last_error": "hipGetLastError",
            "memcpy": "hipMemcpyAsync", "memset": "hipMemsetAsync",
            "to_host": "hipMemcpyDeviceToHost", "on_device": "hipMemcpyDeviceToDevice",
            "sync": "hipStreamSynchronize"},
}  # fmt: skip


class HostNameClash(ValueError):
    """A host launcher would take the name of a kernel of the file."""


def host_source(meta: Mapping[str, Any]) -> str:
    """The host launchers of the CUDA or HIP file ``meta`` describes, to append to it."""
    target = meta["target"]
    kernels = {k["kernel"] for f in meta["functions"] for k in f["launches"]}
    for f in meta["functions"]:
        for name in (f"tessera_{f['name']}", f"tessera_{f['name']}_workspace"):
            if name in kernels:
                raise HostNameClash(
                    f"the host launcher of '{f['name']}' would be named like the kernel "
                    f"'{name}': rename the function, or leave the launchers out (--no-host)"
                )
    maps = any("tensor_maps" in k for f in meta["functions"] for k in f["launches"])
    parts = [
        "\n// ---- host launchers: one per function of the .tsr file (docs/runtime.md)\n",
        _PRELUDE[target],
        _COMMON.format(maps=_MAPS if maps else ""),
        _debug(meta.get("bounds", ()), target) if meta.get("debug") else "",
        'extern "C" {\n',
        *(_function(f, target) for f in meta["functions"]),
        '}  // extern "C"\n',
        "#endif\n",
    ]
    return "".join(parts)


def _debug(bounds: Sequence[Mapping[str, Any]], target: str) -> str:
    checks = [
        f"kernel '{c['kernel']}' ({c['line']}): {accessed(c)} on axis {c['axis']}" for c in bounds
    ]
    table = "\n".join(f'    "{text}",' for text in checks) or '    "",'
    return _DEBUG.format(checks=table, **_API[target])


def _function(f: Mapping[str, Any], target: str) -> str:
    api = _API[target]
    storage = DIALECTS[target].storage
    sizes = [f"std::int64_t {d}" for d in f["dims"]]
    name = f"tessera_{f['name']}"
    spans = [f"tsr_host::aligned({c_dim(parse_dim(b['bytes']))})" for b in f["buffers"]]
    workspace = " + ".join(spans) or "0"
    used = set().union(*(parse_dim(b["bytes"]).symbols() for b in f["buffers"]))
    # int scalars that size an intermediate (``view(B, T, n_head, C // n_head)``) are
    # the workspace's sizes too, before the size symbols, as in the entry
    sizing = [p["name"] for p in f["params"] if p["kind"] == "scalar" and p["name"] in used]
    n = _local_names(f)
    size_args = ", ".join([*sizing, *f["dims"]])
    lines: list[str] = []
    checks = [f"{d} < 0" for d in f["dims"]]
    lines.append(f"if ({' || '.join(checks)}) return TSR_HOST_EINVAL;" if checks else "")
    for g in f["guards"]:
        condition = _guard(g)
        if condition is not None:
            lines.append(f"if (!({condition})) return TSR_HOST_EINVAL;  // {g['reason']}")
    lines += [
        f"const std::size_t {n['need']} = {name}_workspace({size_args});",
        f"unsigned char* {n['base']} = static_cast<unsigned char*>({n['workspace']});",
        f"const bool {n['own']} = {n['workspace']} == nullptr && {n['need']} > 0;",
        f"if ({n['own']} && {api['malloc']}(reinterpret_cast<void**>(&{n['base']}), "
        f"{n['need']}, {n['stream']}) != {api['success']})",
        "  return TSR_HOST_ELAUNCH;",
        f"if (!{n['own']} && {n['workspace_bytes']} < {n['need']}) return TSR_HOST_EWORKSPACE;",
    ]
    # each intermediate starts where the one before it ends, aligned
    if len(spans) > 1:
        lines.append(f"std::size_t {n['offset']} = 0;")
    for k, (b, span) in enumerate(zip(f["buffers"], spans, strict=True)):
        at = n["base"] if k == 0 else f"{n['base']} + {n['offset']}"
        lines.append(f"const tsr_host::Bytes {b['name']}{{{at}}};")
        if k + 1 < len(spans):
            lines.append(f"{n['offset']} += {span};")
    lines.append(f"const int {n['status']} = [&]() -> int {{")
    if any(b["name"] == FAULT for b in f["buffers"]):
        lines += [
            f"  if ({api['memset']}({FAULT}, 0, {FAULT_BYTES}, {n['stream']}) != "
            f"{api['success']})",
            "    return TSR_HOST_ELAUNCH;",
        ]
    for p in f["params"]:
        if "updates" in p:  # the kernel reads the input from the result: it starts as it
            size = f"{c_dim(_elements(p))} * sizeof({storage[p['dtype']]})"
            lines += [
                f"  if ({p['name']} != {p['updates']} && {api['memcpy']}({p['name']}, "
                f"{p['updates']}, {size}, {api['on_device']}, {n['stream']}) != "
                f"{api['success']})",
                "    return TSR_HOST_ELAUNCH;",
            ]
    for k in f["launches"]:
        lines += ["  " + line for line in _launch(k, target, f, n)]
        if FAULT in k["args"]:
            lines += [
                f"  if (const int {n['failed']} = tsr_host::check_bounds({FAULT}, "
                f"{n['stream']})) return {n['failed']};"
            ]
        lines += ["  " + line for line in _sentinel(k, f, n)]
    lines += [
        "  return TSR_HOST_SUCCESS;",
        "}();",
        f"if ({n['own']} && {api['free']}({n['base']}, {n['stream']}) != {api['success']} "
        f"&& {n['status']} == TSR_HOST_SUCCESS)",
        "  return TSR_HOST_ELAUNCH;",
        f"return {n['status']};",
    ]
    body = "".join(f"  {line}\n" for line in lines if line)
    # an input that no kernel reads keeps its place in the signature, unnamed
    read = names_used([body])
    params = []
    for p in f["params"]:
        shown = param_name(p["name"], p["name"] in read)
        if p["kind"] == "scalar":
            params.append(f"{_C_SCALARS[p['type']]} {shown}")
        else:
            const = "const " if p["io"] == "in" else ""
            params.append(f"{const}{storage[p['dtype']]}* {shown}")
    workspace_sizes = [f"std::int64_t {n}" for n in sizing] + sizes
    signature = ", ".join([*params, *sizes, f"void* {n['workspace']}",
                           f"std::size_t {n['workspace_bytes']}",
                           f"{api['stream']} {n['stream']}"])  # fmt: skip
    return (
        f"\n// {f['name']}: the bytes of intermediates its launcher places in the workspace.\n"
        f"std::size_t {name}_workspace({', '.join(workspace_sizes) or 'void'}) {{\n"
        + "".join(f"  (void){d};\n" for d in f["dims"] if d not in used)
        + f"  return {workspace};\n}}\n\n"
        f"// {f['name']}: {_launches(len(f['launches']))} on `stream`.\n"
        f"int {name}({signature}) {{\n{body}}}\n"
    )


#: The exponent bits of each float dtype: all ones is NaN or infinity (e4m3 has no
#: infinity, and its NaN is S.1111.111).
NON_FINITE = {"f32": 0x7F800000, "tf32": 0x7F800000, "bf16": 0x7F80, "f16": 0x7C00,
               "fp8_e5m2": 0x7C, "fp8_e4m3": 0x7F}  # fmt: skip


#: The names a launcher declares besides the function's own: its last parameters and
#: its locals.
_LOCALS = ("workspace", "workspace_bytes", "stream", "need", "base", "own", "offset",
           "status", "grid", "failed")  # fmt: skip


def _local_names(f: Mapping[str, Any]) -> dict[str, str]:
    """Each of ``_LOCALS`` as the launcher of ``f`` names it: as itself, or with ``_``
    added until it names nothing of the function (a parameter called ``stream``, an
    intermediate called ``grid``, a kernel, a tensor map), which it would shadow."""
    taken = {p["name"] for p in f["params"]} | set(f["dims"])
    taken |= {b["name"] for b in f["buffers"]}
    for k in f["launches"]:
        taken.add(k["kernel"])
        taken |= {
            f"{m['name']}{end}" for m in k.get("tensor_maps", ()) for end in ("", "_dims", "_box")
        }
    names = {}
    for local in _LOCALS:
        name = local
        while name in taken:
            name += "_"
        names[local] = name
        taken.add(name)
    return names


def _elements(p: Mapping[str, Any]) -> Dim:
    """The elements of the tensor parameter ``p``."""
    count = Dim.const(1)
    for d in p["dims"]:
        count = count * parse_dim(d)
    return count


def _sentinel(k: Mapping[str, Any], f: Mapping[str, Any], n: Mapping[str, str]) -> list[str]:
    """A debug build's sentinel after launch ``k``: each float tensor it writes."""
    if "sentinel" not in k:
        return []
    tensors = {p["name"]: p for p in f["params"] if p["kind"] == "tensor"}
    buffers = {b["name"]: b["bytes"] for b in f["buffers"]}
    lines = []
    for w in k["sentinel"]["writes"]:
        size = ENTRY_DTYPES[w["dtype"]].bits // 8
        if w["name"] in tensors:
            count = _elements(tensors[w["name"]])
        else:
            count = parse_dim(buffers[w["name"]]) / size
        what = f"kernel '{k['kernel']}' ({k['sentinel']['line']}) wrote to '{w['name']}':"
        lines += [
            f"if (const int {n['failed']} = tsr_host::check_finite({w['name']}, "
            f"{c_dim(count)}, {size}, {NON_FINITE[w['dtype']]:#x}u, \"{what}\", {n['stream']}))",
            f"  return {n['failed']};",
        ]
    return lines


def _launch(
    k: Mapping[str, Any], target: str, f: Mapping[str, Any], n: Mapping[str, str]
) -> list[str]:
    """One launch, in a block: its grid, its attribute, its tensor maps, the launch."""
    api = _API[target]
    grid = [f"tsr_host::ceil_div({_operand(g['extent'])}, {g['block']})" if g["block"] != 1
            else _operand(g["extent"]) for g in k["grid"]]  # fmt: skip
    grid += ["1"] * (3 - len(grid))
    smem = k.get("dynamic_smem", 0)
    # the opt-in is needed where the static and dynamic bytes together pass 48 KiB
    opt_in = smem + k.get("static_smem", 0) > _DEFAULT_SMEM
    g = n["grid"]
    lines = [f"{{  // {k['kernel']}",
             f"  const std::int64_t {g}[3] = {{{', '.join(grid)}}};",
             f"  if ({g}[0] > 0 && {g}[1] > 0 && {g}[2] > 0) {{"]  # fmt: skip
    inner = []
    if opt_in:
        inner += [
            f"if (cudaFuncSetAttribute({k['kernel']}, cudaFuncAttributeMaxDynamicSharedMemorySize,"
            f" {smem}) != cudaSuccess)",
            "  return TSR_HOST_ELAUNCH;",
        ]
    tensors = {p["name"] for p in f["params"] if p["kind"] == "tensor"}
    for m in k.get("tensor_maps", ()):
        element = ENTRY_DTYPES[m["dtype"]].bits // 8
        address = m["tensor"] if m["tensor"] in tensors else f"static_cast<void*>({m['tensor']})"
        inner += [
            f"tsr_tensor_map {m['name']};",
            f"const std::int64_t {m['name']}_dims[] = {{{', '.join(_operand(d) for d in m['dims'])}}};",  # noqa: E501
            f"const cuuint32_t {m['name']}_box[] = {{{', '.join(str(b) for b in m['box'])}}};",
            f"if (tsr_host::encode_map(&{m['name']}, {address}, {element}, {len(m['dims'])}, "
            f"{m['name']}_dims, {m['name']}_box) != 0)",
            "  return TSR_HOST_ELAUNCH;",
        ]
    dims = f"dim3(unsigned({g}[0]), unsigned({g}[1]), unsigned({g}[2]))"
    inner += [
        f"{k['kernel']}<<<{dims}, {k['threads']}, {smem}, {n['stream']}>>>"
        f"({', '.join(k['args'])});",
        f"if ({api['last_error']}() != {api['success']}) return TSR_HOST_ELAUNCH;",
    ]
    return [*lines, *(f"    {line}" for line in inner), "  }", "}"]


def _launches(count: int) -> str:
    return "one launch" if count == 1 else f"{count} launches"


def _operand(text: str) -> str:
    expr = c_dim(parse_dim(text))
    return expr if expr.isidentifier() or expr.isdigit() else f"({expr})"


def _guard(g: Mapping[str, Any]) -> str | None:
    """A guard as a C condition on the sizes; None for one on a tensor's values (an
    index in range), which the host does not read: the caller vouches for it."""
    if g["kind"] == "indices":
        return None
    left, right = _operand(g["left"]), _operand(g["right"])
    if g["kind"] == "divisible":
        return f"{right} != 0 && {left} % {right} == 0"
    return f"{left} {_RELATIONS[g['kind']]} {right}"
