"""Generated CUDA and HIP kernels run on the CPU: a simulated GPU, and CuPy over it.

No GPU runs in CI, and most of a GPU backend is code no other backend shares: warp
fragments for mma.sync and MFMA, wgmma descriptors over swizzled shared memory,
shuffles, cp.async pipelines. So the tests compile each CUDA or HIP file with ``g++``
against ``gpusim.hpp``, which runs a block's threads as fibers and computes what a
warp's, wavefront's or warpgroup's instruction would from the vendors' definitions.
The kernels are the generated ones, unchanged; only the header functions whose bodies
are PTX are replaced, the shared-memory arena becomes the simulator's (poisoned for
every block), and HIP's vector types and MFMA built-ins get g++'s spelling.

``simulated_cupy(arch)`` stands in for CuPy with host memory: ``RawModule`` builds the
file this way, and a launch runs every block of the grid. ``simulated_driver()`` stands
in for the CUDA driver's ``cuTensorMapEncodeTiled``, whose tensor maps the simulated
TMA copies read; ``use_simulator`` puts both under ``tessera.runtime.cuda``. The runtime
and the generated loaders run over them unchanged, so a test checks the whole call: the
runtime's arguments and buffers, the launches the metadata gives, and the numbers.
``load_hip`` runs a HIP file's functions the same way, through the CUDA runtime's
launches (the metadata of both backends describes them alike). ``load_sycl`` runs a
SYCL file's kernels and its own host functions, over ``sycl_sim.hpp`` in place of the
SYCL headers.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = ["simulated_source", "build", "simulated_cupy", "simulated_driver", "use_simulator",
           "load_hip", "load_sycl", "DeviceArray", "SimulationError"]  # fmt: skip

HERE = Path(__file__).resolve().parent
_CACHE = Path(tempfile.gettempdir()) / "tessera-gpusim"
#: A launch may use this much dynamic shared memory before it asks for more, as in CUDA.
_DEFAULT_SMEM = 48 * 1024
_FUNCTION = re.compile(r"^(?:template <[^\n]*>\n)?__device__ inline [^\n(]*?\b(\w+)\(", re.M)
_KERNEL = re.compile(
    r'^extern "C" __global__ void __launch_bounds__\([\d, ]+\) (\w+)\(([^)]*)\) \{', re.M
)
#: The shared-memory arena: CUDA's, sized at launch, and HIP's, of a size the kernel gives.
_ARENA = re.compile(
    r"extern __shared__ __align__\(\w+\) unsigned char tsr_smem\[\];"
    r"|__shared__ unsigned char tsr_smem\[(\d+)\] __attribute__\(\(aligned\(\w+\)\)\);"
)
_VECTOR = re.compile(r"typedef (\w+) (\w+) __attribute__\(\(ext_vector_type\((\d+)\)\)\);")
_WGMMA = re.compile(r"tsr_wgmma_m64n(\d+)k(?:16|32)_(bf16|f16|fp8_e4m3|fp8_e5m2)_(ss|rs)")
_SCALARS = {"long long": ctypes.c_longlong, "int": ctypes.c_int, "float": ctypes.c_float}
_MAP = "tsr_tensor_map"


class SimulationError(RuntimeError):
    """The simulated kernel could not be built."""


def _body_end(text: str, start: int) -> int:
    """The index just past the brace that closes the one opening at ``start``; string
    and character literals (the PTX in ``asm``) are skipped."""
    depth, i = 0, start
    while True:
        c = text[i]
        if c in "\"'":
            i += 1
            while text[i] != c:
                i += 2 if text[i] == "\\" else 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1


def _without_ptx(source: str) -> tuple[str, list[str]]:
    """The source without the header functions whose bodies are PTX, and their names."""
    kept, dropped, at = [], [], 0
    for match in _FUNCTION.finditer(source):
        if match.start() < at:
            continue
        end = _body_end(source, source.index("{", match.end()))
        if "asm" in source[match.start() : end]:
            kept.append(source[at : match.start()])
            dropped.append(match.group(1))
            at = end
    kept.append(source[at:])
    return "".join(kept), dropped


def _wgmma_forward(name: str) -> str:
    """A generated wgmma function, forwarded to the simulator's."""
    n, dtype, form = _WGMMA.fullmatch(name).groups()  # type: ignore[union-attr]
    kind = f"tsr_sim::Type::{dtype}"
    if dtype.startswith("fp8_"):  # both operands K-major: no modes
        return (
            f"void {name}(float* d, unsigned long long a, unsigned long long b) {{\n"
            f"  tsr_sim::wgmma({kind}, {n}, d, nullptr, a, false, false, b);\n}}\n"
        )
    if form == "ss":
        return (
            f"template <int TransA, int TransB>\n"
            f"void {name}(float* d, unsigned long long a, unsigned long long b) {{\n"
            f"  tsr_sim::wgmma({kind}, {n}, d, nullptr, a, TransA, TransB, b);\n}}\n"
        )
    return (
        f"template <int TransB>\n"
        f"void {name}(float* d, const unsigned* a, unsigned long long b) {{\n"
        f"  tsr_sim::wgmma({kind}, {n}, d, a, 0, false, TransB, b);\n}}\n"
    )


@dataclass(frozen=True)
class _Kernel:
    name: str
    params: tuple[tuple[str, str], ...]  # (C type, name)
    #: Bytes of a fixed-size arena (HIP's), which the launch must provide.
    arena: int


def _kernels(source: str) -> list[_Kernel]:
    found = []
    starts = list(_KERNEL.finditer(source))
    for match, after in zip(starts, [*starts[1:], None], strict=True):
        parsed = []
        for param in re.split(r",\s+", match.group(2).strip()):
            plain = param.replace(" __restrict__", "").replace("__grid_constant__ ", "")
            # a parameter the kernel does not read is unnamed there (``float* /* like */``)
            plain = " ".join(plain.replace("/*", "").replace("*/", "").split())
            ctype, pname = plain.rsplit(" ", 1)
            parsed.append((ctype.removeprefix("const "), pname))
        body = source[match.end() : after.start() if after else len(source)]
        arena = _ARENA.search(body)
        size = int(arena.group(1)) if arena and arena.group(1) else 0
        found.append(_Kernel(match.group(1), tuple(parsed), size))
    return found


def simulated_source(source: str) -> str:
    """A generated CUDA or HIP file as C++ for the simulator, with a launcher per kernel:
    ``tsr_sim_<kernel>(grid x, y, z, threads, shared memory bytes, arguments...)``."""
    text, dropped = _without_ptx(source)
    text = _ARENA.sub("unsigned char* const tsr_smem = tsr_sim::block->smem;", text)
    text = text.replace("#include <hip/hip_runtime.h>\n", "")
    text = _VECTOR.sub(r"typedef \1 \2 __attribute__((vector_size(\3 * sizeof(\1))));", text)
    text = text.replace("__builtin_amdgcn_", "tsr_sim_amdgcn_")
    forwards = [_wgmma_forward(name) for name in dropped if _WGMMA.fullmatch(name)]
    launchers = []
    for k in _kernels(source):
        # A tensor map, which a launch passes by value, comes to the launcher by address.
        params = ", ".join(f"const {t}* {n}" if t == _MAP else f"{t} {n}" for t, n in k.params)
        args = ", ".join(f"*{n}" if t == _MAP else n for t, n in k.params)
        launchers.append(
            # The launch's own parameters are prefixed: the kernel's may be named `smem`;
            # ::name: a parameter may have the kernel's name.
            f'extern "C" void tsr_sim_{k.name}(unsigned tsr_sim_gx, unsigned tsr_sim_gy, '
            f"unsigned tsr_sim_gz, unsigned tsr_sim_threads, unsigned long long tsr_sim_smem, "
            f"{params}) {{\n"
            f"  tsr_sim::launch({{tsr_sim_gx, tsr_sim_gy, tsr_sim_gz}}, tsr_sim_threads, "
            f"tsr_sim_smem,\n"
            f"                  [&] {{ ::{k.name}({args}); }});\n}}\n"
        )
        # The same launch as the driver's cuLaunchKernel takes it: each argument by the
        # address of its value (the simulated driver's cuLaunchKernel calls this).
        unpacked = ", ".join(f"*static_cast<{t}*>(tsr_sim_params[{i}])"
                             for i, (t, _) in enumerate(k.params))  # fmt: skip
        launchers.append(
            f'extern "C" void tsr_sim_raw_{k.name}(unsigned tsr_sim_gx, unsigned tsr_sim_gy, '
            f"unsigned tsr_sim_gz, unsigned tsr_sim_threads, unsigned tsr_sim_smem, "
            f"void** tsr_sim_params) {{\n"
            f"  tsr_sim::launch({{tsr_sim_gx, tsr_sim_gy, tsr_sim_gz}}, tsr_sim_threads,\n"
            f"                  tsr_sim_smem < {k.arena}u ? {k.arena}u : tsr_sim_smem,\n"
            f"                  [&] {{ ::{k.name}({unpacked}); }});\n}}\n"
        )
    end = "// end of the Tessera tile primitives"
    head, _, rest = text.partition("\n" + end)
    hip = "#include <hip/hip_runtime.h>" in source
    dialect = "#define TSR_SIM_HIP" if hip else "#define TSR_SIM_CUDA"
    return "\n".join([dialect, '#include "gpusim.hpp"', head, *forwards, end + rest, *launchers])


#: Flags of a build under AddressSanitizer and UBSan (the process must preload both),
#: unoptimized: the checks see every access as written, and the build takes half as long.
SANITIZE = ("-O0", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer")  # fmt: skip


def build(source: str, sanitize: bool = False) -> tuple[ctypes.CDLL, list[_Kernel]]:
    """The simulated module of a CUDA or HIP file (built once per source and flags) and
    its kernels; with ``sanitize``, every access the kernels make is checked."""
    return _compiled(simulated_source(source), sanitize), _kernels(source)


def _compiled(text: str, sanitize: bool) -> ctypes.CDLL:
    """C++ for the simulator as a loaded shared library, built once per text and flags."""
    header = (HERE / "gpusim.hpp").read_text()
    flags = ["-std=c++17", "-O1", "-shared", "-fPIC", "-w", f"-I{HERE}",
             *(SANITIZE if sanitize else ())]  # fmt: skip
    key = hashlib.sha256("\0".join([text, header, *flags]).encode()).hexdigest()[:24]
    _CACHE.mkdir(parents=True, exist_ok=True)
    library = _CACHE / f"{key}.so"
    if not library.exists():
        # files of this process's own, renamed into place: two pytest workers may build
        # the same text at once
        cpp, built = (_CACHE / f"{key}.{os.getpid()}.{suffix}" for suffix in ("cpp", "tmp"))
        cpp.write_text(text)
        done = subprocess.run(["g++", *flags, str(cpp), "-o", str(built)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            raise SimulationError(f"building {cpp} for the simulator failed:\n{done.stderr}")
        built.rename(library)
        cpp.unlink()
    return ctypes.CDLL(str(library))


def simulated_driver(sanitize: bool = False) -> ctypes.CDLL:
    """The CUDA driver's ``cuTensorMapEncodeTiled``, writing the tensor maps that the
    simulated TMA copies read."""
    return _compiled('#define TSR_SIM_DRIVER\n#include "gpusim.hpp"\n', sanitize)


def use_simulator(monkeypatch: Any, cupy: Any, sanitize: bool = False) -> None:
    """Run ``tessera.runtime.cuda`` over a simulated CuPy and the simulated driver."""
    from tessera.runtime import cuda as cuda_runtime

    monkeypatch.setattr(cuda_runtime, "_cupy", lambda: cupy)
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: simulated_driver(sanitize))


class DeviceArray:
    """An array in the simulated GPU's memory: host memory, so that addresses are real.
    It shows what CuPy's arrays show a caller (shape, dtype, flags, size), and reduces
    as they do (``min``, ``max``: a 0-d array)."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.shape, self.dtype, self.ndim, self.flags, self.size = (
            data.shape,
            data.dtype,
            data.ndim,
            data.flags,
            data.size,
        )

    def min(self) -> DeviceArray:
        return DeviceArray(np.asarray(self.data.min()))

    def max(self) -> DeviceArray:
        return DeviceArray(np.asarray(self.data.max()))

    def __int__(self) -> int:
        return int(self.data)

    def copy(self) -> DeviceArray:
        """A copy on the device, as ``cupy_array.copy()`` makes it."""
        return DeviceArray(self.data.copy())

    def __setitem__(self, key: Any, value: Any) -> None:
        """A copy on the device, as ``cupy_array[...] = other`` makes it."""
        self.data[key] = value.data if isinstance(value, DeviceArray) else value

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self.data.__array_interface__ | {"version": 3, "stream": None}

    def get(self, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return self.data.copy()
        out[...] = self.data
        return out


def _by_address(ctype: str) -> bool:
    """Whether a kernel parameter reaches the launcher as an address: a pointer, or a
    tensor map (passed by value to the kernel)."""
    return ctype.endswith("*") or ctype == _MAP


class _Launcher:
    """A kernel of a simulated module, called as CuPy's ``RawKernel`` is."""

    def __init__(self, function: Any, raw: Any, kernel: _Kernel) -> None:
        function.restype = None
        function.argtypes = (
            [ctypes.c_uint] * 4
            + [ctypes.c_ulonglong]
            + [ctypes.c_void_p if _by_address(t) else _SCALARS[t] for t, _ in kernel.params]
        )
        self.function = function
        #: The loaded function, as CuPy's RawKernel.kernel: its CUfunction at ``ptr`` is
        #: what the simulated driver's cuLaunchKernel takes.
        self.kernel = SimpleNamespace(ptr=ctypes.cast(raw, ctypes.c_void_p).value)
        self.name = kernel.name
        self.arena = kernel.arena
        self.max_dynamic_shared_size_bytes = _DEFAULT_SMEM
        #: Static shared memory, as CuPy's RawKernel gives it: the simulator holds a
        #: kernel's static arrays apart from the dynamic arena, so none counts here.
        self.shared_size_bytes = 0

    def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int = 0) -> None:
        if shared_mem > self.max_dynamic_shared_size_bytes:
            raise RuntimeError(
                f"{self.name}: {shared_mem} bytes of dynamic shared memory, but the kernel "
                f"allows {self.max_dynamic_shared_size_bytes}"
            )
        values = [a.data.ctypes.data if isinstance(a, DeviceArray)
                  else a.ctypes.data if isinstance(a, np.ndarray)  # passed by value: a map
                  else a.item() for a in args]  # fmt: skip
        self.function(*grid, block[0], max(shared_mem, self.arena), *values)


class _Module:
    def __init__(
        self, code: str, options: tuple[str, ...] = (), backend: str = "nvrtc",
        sanitize: bool = False,
    ) -> None:  # fmt: skip
        library, kernels = build(code, sanitize)
        self._launchers = {
            k.name: _Launcher(getattr(library, f"tsr_sim_{k.name}"),
                              getattr(library, f"tsr_sim_raw_{k.name}"), k)
            for k in kernels
        }  # fmt: skip

    def get_function(self, name: str) -> _Launcher:
        return self._launchers[name]


def simulated_cupy(arch: str, sanitize: bool = False, multiprocessors: int = 4) -> Any:
    """The parts of CuPy that Tessera's runtime and loaders use, over the simulator, for
    a GPU of ``arch``'s compute capability with ``multiprocessors`` (the programs of a
    persistent launch); with ``sanitize``, modules are built under AddressSanitizer and
    UBSan, as ``compute-sanitizer`` checks a GPU's."""
    capability = arch.removeprefix("sm_").rstrip("a")
    stream = SimpleNamespace(ptr=0, synchronize=lambda: None)  # launches run as they are made
    gpu = SimpleNamespace(id=0, compute_capability=capability,
                          attributes={"MultiProcessorCount": multiprocessors})  # fmt: skip
    return SimpleNamespace(
        cuda=SimpleNamespace(get_current_stream=lambda: stream, Device=lambda id=0: gpu),
        RawModule=functools.partial(_Module, sanitize=sanitize),
        RawKernel=_Launcher,
        ndarray=DeviceArray,
        dtype=np.dtype,
        uint8=np.uint8,
        int32=np.int32,
        int64=np.int64,
        float32=np.float32,
        asarray=_asarray,
        empty=lambda shape, dtype: DeviceArray(_poisoned(shape, dtype)),
        zeros=lambda shape, dtype: DeviceArray(np.zeros(shape, dtype)),
    )


def _asarray(x: Any) -> DeviceArray:
    """A copy of a host array on the simulated GPU, or a device array as it is."""
    if isinstance(x, DeviceArray):
        return x
    if isinstance(x, np.ndarray):
        return DeviceArray(x.copy())
    raise TypeError(f"the simulated GPU holds no {type(x).__name__}")


def _poisoned(shape: Any, dtype: Any) -> np.ndarray:
    a = np.empty(shape, dtype)
    a.reshape(-1).view(np.uint8)[...] = 0xFF
    return a


def load_hip(program: Any) -> Any:
    """A HIP program's functions over the simulator, launched as ``tessera.runtime.cuda``
    launches CUDA's (call with the simulated CuPy in place as the runtime's)."""
    from tessera.runtime.cuda import CudaFunction
    from tessera.runtime.cuda import _cupy as cuda_runtime_cupy
    from tessera.runtime.entry import Library

    meta = program.ir("meta")
    module = cuda_runtime_cupy().RawModule(program.source)
    # A HIP kernel's shared memory is a fixed-size array: its launches ask for none.
    functions = [{**f, "launches": [{"dynamic_smem": 0, **k} for k in f["launches"]]}
                 for f in meta["functions"]]  # fmt: skip
    return Library(meta, [CudaFunction(module, f, meta, meta.get("bounds", ())) for f in functions])


#: A SYCL file's host function: its name and its parameters after the queue.
_SYCL_HOST = re.compile(r"^inline void (\w+)\(\s*sycl::queue& queue, ([^)]*)\) \{", re.M)
_SYCL_SCALARS = {"long long": ctypes.c_longlong, "int": ctypes.c_int, "float": ctypes.c_float}


def simulated_sycl_source(source: str) -> str:
    """A generated SYCL file as C++ for the simulator: ``sycl_sim.hpp`` for the SYCL
    headers, and ``tsr_sim_<function>(arguments...)`` calling each host function on a
    queue of its own."""
    text = source.replace("#include <sycl/sycl.hpp>\n", "")
    wrappers = []
    for match in _SYCL_HOST.finditer(source):
        # the wrapper names every parameter, the ones the host function leaves unnamed
        # (``const float* /* y */``, unused) included
        params = [
            " ".join(p.replace("/*", "").replace("*/", "").split())
            for p in match.group(2).split(",")
        ]
        names = [p.rsplit(" ", 1)[1] for p in params]
        wrappers.append(
            f'extern "C" void tsr_sim_{match.group(1)}({", ".join(params)}) {{\n'
            f"  sycl::queue tsr_sim_queue;\n"
            f"  tsr_sim_error_text.clear();\n"
            f"  try {{\n"
            f"    ::{match.group(1)}(tsr_sim_queue, {', '.join(names)});\n"
            f"  }} catch (const std::out_of_range& e) {{\n"
            f'    tsr_sim_error_text = std::string("bounds: ") + e.what();\n'
            f"  }} catch (const std::domain_error& e) {{\n"
            f'    tsr_sim_error_text = std::string("finite: ") + e.what();\n'
            f"  }}\n}}\n"
        )
    # What the last call threw (a debug build's failed check), for the caller to raise.
    errors = (
        "static std::string tsr_sim_error_text;\n"
        'extern "C" const char* tsr_sim_error() { return tsr_sim_error_text.c_str(); }\n'
    )
    head = '#include <stdexcept>\n#include <string>\n\n#include "gpusim.hpp"\n'
    head += '#include "sycl_sim.hpp"\n'
    return "\n".join([head, text, errors, *wrappers])


def _sycl_function(library: ctypes.CDLL, meta: dict[str, Any], host: str) -> Any:
    """The host function ``host`` of a simulated SYCL file, called as the CPU runtime
    calls its entries (the same checks, addresses and sizes), with the SYCL file's
    scalar types."""
    from tessera.runtime.cpu import CpuFunction
    from tessera.runtime.sentinel import BoundsError, NonFiniteError

    entry = getattr(library, f"tsr_sim_{host}")
    error = library.tsr_sim_error
    error.restype = ctypes.c_char_p

    def check_fault() -> None:
        """A debug build's host function throws std::out_of_range at a failed bounds
        check and std::domain_error at a sentinel that found NaN or infinity."""
        kind, _, text = error().decode().partition(": ")
        if kind:
            raise {"bounds": BoundsError, "finite": NonFiniteError}[kind](text)

    # No C calls are built for a simulated file (its library counts no warm calls), and
    # its launches have no metrics.
    runtime = SimpleNamespace(meta={}, called=lambda: None, check_fault=check_fault)
    function = CpuFunction(entry, {**meta, "symbol": f"tsr_sim_{host}", "kernels": []}, runtime)
    entry.argtypes = [
        *(_SYCL_SCALARS[_SYCL_TYPES[p["type"]]] if p["kind"] == "scalar" else ctypes.c_void_p
          for p in meta["params"]),
        *(ctypes.c_longlong for _ in meta["dims"]),
    ]  # fmt: skip
    return function


#: The C type of each scalar parameter type in a SYCL host function.
_SYCL_TYPES = {"float": "float", "int": "long long", "bool": "int", "index": "long long"}


def load_sycl(program: Any, sanitize: bool = False) -> Any:
    """A SYCL program's functions over the simulator: each call checks its arguments as
    the CPU runtime does, then runs the file's own host function."""
    from tessera.runtime.entry import Library

    meta = program.ir("meta")
    library = _compiled(simulated_sycl_source(program.source), sanitize)
    # The host functions follow the metadata's order; a name the dialect reserves
    # (``int8``, ``explicit``) is renamed there.
    hosts = [m.group(1) for m in _SYCL_HOST.finditer(program.source)]
    return Library(
        meta,
        [
            _sycl_function(library, f, host)
            for f, host in zip(meta["functions"], hosts, strict=True)
        ],
    )
