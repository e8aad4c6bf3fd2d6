"""What one SIMT language calls things: the data that makes one emitter serve several.

The SIMT emitter (``simt_kernel.py``, ``simt_tiles.py``) and the shared templates
(``templates/simt/``) write the same statements for every target; a ``Dialect``
supplies the spelling: types, how a tensor element of each dtype is read and
written, rounding, math functions, the kernel qualifier, thread and program
indices, shared memory and the barrier: OpenCL C, HIP, CUDA and SYCL.
"""

from __future__ import annotations

import math
from dataclasses import field, replace

from ...frozen import frozen
from ..graph.graph_ops import C_MATH

__all__ = ["Dialect", "OPENCL", "HIP", "CUDA", "SYCL", "DIALECTS"]


@frozen
class Dialect:
    name: str
    #: A 64-bit signed integer, for sizes and element indices.
    index_type: str
    #: Kernel-argument types of ``.tsr`` scalars (neither passes a bool).
    scalar_types: dict[str, str]
    #: Storage type of a tensor element of each dtype.
    storage: dict[str, str]
    #: An element of each dtype as a float (``{p}`` the pointer, ``{o}`` the offset), and
    #: a statement storing float ``{v}`` into it, rounded to nearest even.
    reads: dict[str, str]
    writes: dict[str, str]
    #: The qualifier of memory the threads of a program share, of a pointer into it, and
    #: its byte type.
    local_qualifier: str
    local_pointer: str
    byte_type: str
    #: A statement: every thread of the program waits, and shared memory is visible.
    barrier: str
    #: Fused multiply-add and maximum of floats.
    fma: str
    fmax: str
    #: 2 to a float power: the online softmax's exponential (``simt_tiles.exp_online``).
    exp2: str
    #: ``x`` to an integer power ``n``.
    pown: str
    #: How a helper function and a kernel are declared (``{threads}`` per program).
    function: str
    kernel: str
    #: A tensor parameter (``{const}``, ``{type}``, ``{name}``).
    pointer: str
    #: The thread's index in its program, and the program's index along each grid axis.
    thread_index: str
    program_index: tuple[str, ...]
    #: How many programs the launch has along each axis.
    program_count: tuple[str, ...]
    #: The number of threads of a program, as the header's group reductions read it.
    program_size: str
    #: Unsigned 16-, 32- and 64-bit types, and float <-> bits reinterpretation.
    u16: str
    u32: str
    u64: str
    float_bits: str
    bits_float: str
    #: A line before a loop over a thread's registers that must unroll, so that the
    #: registers stay registers ("" where the compiler is left to decide).
    unroll: str
    #: The first lines of a generated file, after the line that names its source.
    preamble: tuple[str, ...]
    unary: dict[str, str] = field(default_factory=dict)
    #: ``x`` from the lane whose index differs in the bits of ``mask`` ("" where the
    #: emitter never exchanges registers between lanes).
    shuffle_xor: str = ""
    #: Positive infinity and the quiet NaN as float expressions: the header's names for
    #: them, the same in every dialect.
    infinity: str = "tsr_infinity()"
    #: Whether a parameter that no statement reads is left unnamed (C++); OpenCL C, as
    #: C99, names every parameter of a definition, and casts an unread one to void.
    unnamed_parameters: bool = True
    nan: str = "tsr_nan()"
    #: Whether the shared-memory arena is sized at launch (CUDA: a static array is
    #: limited to 48 KiB; the metadata gives each launch its ``dynamic_smem`` bytes).
    dynamic_arena: bool = False
    #: Whether a copy ahead (a pipelined loop's copy of a later iteration's operands) runs
    #: asynchronously, its 16-byte chunks waited for before the barrier (CUDA's
    #: ``cp.async``). Elsewhere copies are loads and stores, done when they are issued.
    async_copy: bool = False
    #: Statements that store two neighbouring elements of a dtype as one access, from
    #: floats ``{lo}`` and ``{hi}`` (empty where the emitter never pairs stores).
    pair_writes: dict[str, str] = field(default_factory=dict)
    #: What a call of a header function that synchronizes the program (the group
    #: reductions) passes first: SYCL's work-item, through which it reaches its group.
    group_context: str = ""
    #: Whether shared memory comes from the launch, not from the kernel's declarations:
    #: SYCL allocates it in the host's command group (``local_accessor``) and passes
    #: each array to the kernel function as a pointer.
    launched_locals: bool = False
    #: The namespace of ``isnan`` and ``isinf`` ("" where they are built in).
    math_namespace: str = ""
    #: Whether long lines of a file are broken under 100 columns (``wrap.py``).
    wrapped: bool = False
    #: The declaration of a kernel's named tile size (``tile_constants.py``): a constant
    #: expression, which sizes an array (``float v[BM];``).
    constant: str = "constexpr int {name} = {value};"

    def read(self, dtype: str, pointer: str, offset: str) -> str:
        """A tensor element as a float."""
        return self.reads[dtype].format(p=pointer, o=offset)

    def write(self, dtype: str, pointer: str, offset: str, value: str) -> str:
        """A statement that stores a float into a tensor element, rounded to nearest even."""
        return self.writes[dtype].format(p=pointer, o=offset, v=value)

    def write_pair(self, dtype: str, pointer: str, offset: str, lo: str, hi: str) -> str:
        """A statement that stores elements ``offset`` and ``offset + 1`` as one access;
        the caller checks that the address is aligned to the pair."""
        return self.pair_writes[dtype].format(p=pointer, o=offset, lo=lo, hi=hi)

    def copy(self, dtype: str, dst: str, at: str, src: str, offset: str, condition: str) -> str:
        """A statement that copies a tensor element as it is stored (zero past a masked
        edge); a type without variables (OpenCL's half) goes through float."""
        if self.storage[dtype] == "half":
            value = self.read(dtype, src, offset)
            return self.write(
                dtype, dst, at, f"{condition} ? {value} : 0.0f" if condition else value
            )
        value = f"{condition} ? {src}[{offset}] : 0" if condition else f"{src}[{offset}]"
        return f"{dst}[{at}] = {value};"

    def literal(self, value: float) -> str:
        """A float constant; the infinities and NaN as the dialect spells them."""
        if math.isinf(value):
            return f"-{self.infinity}" if value < 0 else self.infinity
        if math.isnan(value):
            return self.nan
        text = repr(float(value))
        return text + ("" if "e" in text or "." in text else ".0") + "f"

    def round(self, dtype: str, value: str) -> str:
        """A float rounded to the nearest value of ``dtype``, still a float."""
        return value if dtype == "f32" else f"tsr_round_{dtype}({value})"

    def local(self, ctype: str, name: str, count: str) -> str:
        """A shared array, declared at the top of the kernel."""
        return f"{self.local_qualifier} {ctype} {name}[{count}];"

    def local_bytes(self, name: str, count: int, align: str = "16") -> str:
        """The bytes the shared-memory plan lays buffers out in, aligned to ``align``
        bytes (a number, or the constant that holds it)."""
        if self.dynamic_arena:
            return (
                f"extern {self.local_qualifier} __align__({align}) {self.byte_type} {name}[];"
                f"  // {count} bytes, given at launch"
            )
        attribute = f"__attribute__((aligned({align})))"
        return f"{self.local_qualifier} {self.byte_type} {name}[{count}] {attribute};"

    def local_view(self, ctype: str, name: str, arena: str, offset: int) -> str:
        """A typed pointer to a planned buffer at ``offset`` bytes into the arena."""
        pointer = f"{self.local_pointer}{ctype}*"
        return f"{pointer} const {name} = ({pointer})({arena} + {offset});"


#: Element ``o`` of a packed i4 tensor (``docs/numerics.md``): the low nibble of byte
#: ``o / 2`` for an even ``o``, the high one for an odd ``o``, sign-extended from 4 bits.
_NIBBLE = "(float)(((((int){p}[({o}) >> 1] >> ((({o}) & 1) * 4)) & 15) ^ 8) - 8)"

#: A stored element as a float, and a float as a stored element (rounded to nearest
#: even), by dtype. A tf32 tensor's elements are read as tf32, however the caller filled
#: the f32s.
_READS = {
    "f32": "{p}[{o}]", "tf32": "tsr_round_tf32({p}[{o}])", "bf16": "tsr_bf16_to_float({p}[{o}])",
    "f16": "tsr_f16_to_float({p}[{o}])", "fp8_e4m3": "tsr_fp8_e4m3_to_float({p}[{o}])",
    "fp8_e5m2": "tsr_fp8_e5m2_to_float({p}[{o}])", "i32": "(float){p}[{o}]",
    "i8": "(float){p}[{o}]", "i4": _NIBBLE,
}  # fmt: skip
_STORED = {
    "f32": "{v}", "tf32": "tsr_round_tf32({v})", "bf16": "tsr_float_to_bf16({v})",
    "f16": "tsr_float_to_f16({v})", "fp8_e4m3": "tsr_float_to_fp8_e4m3({v})",
    "fp8_e5m2": "tsr_float_to_fp8_e5m2({v})", "i32": "(int)({v})", "i8": "tsr_float_to_i8({v})",
}  # fmt: skip
_WRITES = {dtype: "{p}[{o}] = " + stored + ";" for dtype, stored in _STORED.items()}
#: Two neighbouring elements in one store (the header's ``tsr_store_pair``), for the
#: float dtypes: integer results of products are rare enough to store one at a time.
_PAIRS = {
    dtype: "tsr_store_pair(&{p}[{o}], "
    + ", ".join(stored.replace("{v}", half) for half in ("{lo}", "{hi}"))
    + ");"
    for dtype, stored in _STORED.items()
    if dtype not in ("i32", "i8")
}

OPENCL = Dialect(
    name="opencl",
    unnamed_parameters=False,
    # (a const int is no constant expression in C: an array it sized would be a VLA,
    # which OpenCL C has not; an enumerator is one, and scoped to the kernel's body)
    constant="enum {{ {name} = {value} }};",
    index_type="long",
    scalar_types={"float": "float", "int": "long", "bool": "int", "index": "long"},
    storage={"f32": "float", "tf32": "float", "f16": "half", "bf16": "ushort",
             "fp8_e4m3": "uchar", "fp8_e5m2": "uchar", "i32": "int", "i8": "char", "i4": "char",
             "i64": "long"},
    reads={**_READS, "f16": "vload_half({o}, {p})"},
    writes={**_WRITES, "f16": "vstore_half_rte({v}, {o}, {p});"},
    local_qualifier="__local",
    local_pointer="__local ",
    byte_type="uchar",
    barrier="barrier(CLK_LOCAL_MEM_FENCE);",
    fma="fma",
    fmax="fmax",
    exp2="exp2",
    pown="pown({x}, (int)({n}))",
    function="inline",
    kernel="__kernel __attribute__((reqd_work_group_size({threads}, 1, 1)))\nvoid",
    pointer="__global {const}{type}* restrict {name}",
    thread_index="get_local_id(0)",
    program_index=("get_group_id(0)", "get_group_id(1)", "get_group_id(2)"),
    program_count=("get_num_groups(0)", "get_num_groups(1)", "get_num_groups(2)"),
    program_size="get_local_size(0)",
    u16="ushort",
    u32="uint",
    u64="ulong",
    float_bits="as_uint",
    bits_float="as_float",
    unroll="",
    preamble=(
        "// OpenCL C 1.2. Each kernel runs one program per work-group: launch it over a range",
        "// of (programs x threads) work-items in groups of `threads` (its grid and threads are",
        "// in the comment above it, and in the metadata that tessera.runtime.opencl reads).",
    ),
    unary={
        "exp": "exp", "pow": "pow", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt",
        "tanh": "tanh", "abs": "fabs", "sin": "sin", "cos": "cos", "relu": "tsr_relu",
        "round": "rint", "fmod": "fmod", "floor": "floor", "copysign": "copysign",
        "floordiv": "tsr_floordiv", "mod": "tsr_mod",
        "maximum": "fmax", "minimum": "fmin",
        "sigmoid": "tsr_sigmoid", "gelu": "tsr_gelu", "silu": "tsr_silu", "rint": "rint",
        **{name: name for name in C_MATH},
    },
    wrapped=True,
)  # fmt: skip

HIP = Dialect(
    name="hip",
    wrapped=True,
    index_type="long long",
    scalar_types={"float": "float", "int": "long long", "bool": "int", "index": "long long"},
    storage={"f32": "float", "tf32": "float", "f16": "unsigned short",
             "bf16": "unsigned short", "fp8_e4m3": "unsigned char", "fp8_e5m2": "unsigned char",
             "i32": "int", "i8": "signed char", "i4": "signed char",
             "i64": "long long"},
    reads=_READS,
    writes=_WRITES,
    local_qualifier="__shared__",
    local_pointer="",
    byte_type="unsigned char",
    barrier="__syncthreads();",
    fma="fmaf",
    fmax="fmaxf",
    exp2="exp2f",
    pown="powf({x}, (float)({n}))",
    function="__device__ inline",
    kernel='extern "C" __global__ void __launch_bounds__({threads})',
    pointer="{const}{type}* __restrict__ {name}",
    thread_index="(int)threadIdx.x",
    program_index=("blockIdx.x", "blockIdx.y", "blockIdx.z"),
    program_count=("gridDim.x", "gridDim.y", "gridDim.z"),
    program_size="(int)blockDim.x",
    u16="unsigned short",
    u32="unsigned int",
    u64="unsigned long long",
    float_bits="__float_as_uint",
    bits_float="__uint_as_float",
    unroll="#pragma unroll",
    preamble=(
        "// HIP C++ for AMD GPUs (hipcc --offload-arch=ARCH). Each kernel runs one program per",
        "// thread block: launch it with a grid of programs and `threads` threads per block (its",
        "// grid and threads are in the comment above it, and in the metadata).",
        "#include <hip/hip_runtime.h>",
    ),
    shuffle_xor="__shfl_xor({x}, {mask})",
    unary={
        "exp": "expf", "pow": "powf", "log": "logf", "sqrt": "sqrtf", "rsqrt": "rsqrtf",
        "tanh": "tanhf", "abs": "fabsf", "sin": "sinf", "cos": "cosf", "relu": "tsr_relu",
        "round": "rintf", "fmod": "fmodf", "floor": "floorf", "copysign": "copysignf",
        "floordiv": "tsr_floordiv", "mod": "tsr_mod",
        "maximum": "fmaxf", "minimum": "fminf",
        "sigmoid": "tsr_sigmoid", "gelu": "tsr_gelu", "silu": "tsr_silu", "rint": "rintf",
        **{name: f"{name}f" for name in C_MATH},
    },
)  # fmt: skip

#: CUDA spells everything as HIP does (HIP took its spelling from CUDA). Files include
#: nothing, so that NVRTC compiles them as they are; without math.h there is no
#: INFINITY, so the header defines the infinity and NaN by their bit patterns.
CUDA = replace(
    HIP,
    name="cuda",
    preamble=(
        "// CUDA C++ for NVIDIA GPUs (nvcc or NVRTC, sm_80 and newer). Each kernel runs one",
        "// program per thread block: launch it with a grid of programs, `threads` threads per",
        "// block and the dynamic shared memory its metadata gives (its grid and threads are in",
        "// the comment above it).",
    ),
    shuffle_xor="__shfl_xor_sync(0xffffffffu, {x}, {mask})",
    dynamic_arena=True,
    async_copy=True,
    pair_writes=_PAIRS,
)

#: SYCL 2020 spells the kernel's SIMT code as C++ over an ``nd_item``: each kernel is a
#: function of its tensors, its sizes, the work-item ``it`` and its local arrays, which
#: the file's host launcher calls from a ``parallel_for`` over an ``nd_range<3>``. SYCL's
#: last dimension varies fastest (it is CUDA's x on NVIDIA GPUs), so the threads and the
#: first grid axis are dimension 2. Products are FMAs, as on OpenCL (no matrix extension
#: is assumed).
SYCL = replace(
    HIP,
    name="sycl",
    local_qualifier="",
    barrier="sycl::group_barrier(it.get_group());",
    fma="sycl::fma",
    fmax="sycl::fmax",
    exp2="sycl::exp2",
    pown="sycl::pown({x}, (int)({n}))",
    function="inline",
    kernel="inline void",
    thread_index="(int)it.get_local_id(2)",
    program_index=("it.get_group(2)", "it.get_group(1)", "it.get_group(0)"),
    program_count=("it.get_group_range(2)", "it.get_group_range(1)", "it.get_group_range(0)"),
    program_size="(int)it.get_local_range(2)",
    float_bits="sycl::bit_cast<unsigned int>",
    bits_float="sycl::bit_cast<float>",
    unroll="",
    preamble=(
        "// SYCL 2020 (DPC++ or AdaptiveCpp). Each kernel is a function of one work-item `it`",
        "// of a work-group of `threads`; the host function of each .tsr function, at the end,",
        "// launches them in order on a sycl::queue, over USM device pointers.",
        "#include <sycl/sycl.hpp>",
        "",
        "#include <cmath>",
    ),
    shuffle_xor="sycl::permute_group_by_xor(it.get_sub_group(), {x}, {mask})",
    unary={
        "exp": "sycl::exp", "pow": "sycl::pow", "log": "sycl::log", "sqrt": "sycl::sqrt",
        "rsqrt": "sycl::rsqrt", "tanh": "sycl::tanh", "abs": "sycl::fabs", "sin": "sycl::sin",
        "cos": "sycl::cos", "relu": "tsr_relu", "maximum": "sycl::fmax",
        "minimum": "sycl::fmin", "sigmoid": "tsr_sigmoid", "gelu": "tsr_gelu",
        "silu": "tsr_silu", "rint": "sycl::rint", "round": "sycl::rint",
        "fmod": "sycl::fmod", "floor": "sycl::floor", "copysign": "sycl::copysign",
        "floordiv": "tsr_floordiv", "mod": "tsr_mod",
        **{name: f"sycl::{name}" for name in C_MATH},
    },
    group_context="it, ",
    wrapped=True,
    launched_locals=True,
    math_namespace="sycl::",
)  # fmt: skip

DIALECTS = {d.name: d for d in (OPENCL, HIP, CUDA, SYCL)}
