"""What one SIMT language calls things: the data that makes one emitter serve several.

The SIMT emitter (``simt_kernel.py``) writes the same statements for every
target; a ``Dialect`` supplies the spelling: index and scalar types, how a
tensor of each dtype is read and written, rounding to a dtype, and the math
functions. OpenCL C is the first; CUDA and HIP differ in these names, the kernel
qualifier, the thread indices, local memory and the barrier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Dialect", "OPENCL"]


@dataclass(frozen=True)
class Dialect:
    name: str
    #: A 64-bit signed integer, for sizes and element indices.
    index_type: str
    #: Kernel-argument types of ``.tsr`` scalars (OpenCL passes no bool).
    scalar_types: dict[str, str]
    #: Storage type of a tensor element of each dtype.
    storage: dict[str, str]
    #: The qualifier of memory the threads of a program share, and its byte type.
    local_qualifier: str
    byte_type: str
    #: A statement: every thread of the program waits, and shared memory is visible.
    barrier: str
    #: Fused multiply-add of floats.
    fma: str
    unary: dict[str, str] = field(default_factory=dict)

    def local(self, ctype: str, name: str, count: int) -> str:
        """A shared array, declared at the top of the kernel."""
        return f"{self.local_qualifier} {ctype} {name}[{count}];"

    def local_bytes(self, name: str, count: int) -> str:
        """The bytes the shared-memory plan lays buffers out in, 16-byte aligned."""
        return (
            f"{self.local_qualifier} {self.byte_type} {name}[{count}] __attribute__((aligned(16)));"
        )

    def local_view(self, ctype: str, name: str, arena: str, offset: int) -> str:
        """A typed pointer to a planned buffer at ``offset`` bytes into the arena."""
        pointer = f"{self.local_qualifier} {ctype}*"
        return f"{pointer} const {name} = ({pointer})({arena} + {offset});"

    def read(self, dtype: str, pointer: str, offset: str) -> str:
        """A tensor element as a float."""
        if dtype == "f32":
            return f"{pointer}[{offset}]"
        if dtype == "f16":
            return f"vload_half({offset}, {pointer})"
        return f"tsr_{dtype}_to_float({pointer}[{offset}])"

    def write(self, dtype: str, pointer: str, offset: str, value: str) -> str:
        """A statement that stores a float into a tensor element, rounded to nearest even."""
        if dtype == "f32":
            return f"{pointer}[{offset}] = {value};"
        if dtype == "f16":
            return f"vstore_half_rte({value}, {offset}, {pointer});"
        return f"{pointer}[{offset}] = tsr_float_to_{dtype}({value});"

    def copy(self, dtype: str, dst: str, at: str, src: str, offset: str, condition: str) -> str:
        """A statement that copies a tensor element as it is stored (zero past a masked
        edge); f16 goes through float, since OpenCL C has no half variables."""
        if dtype == "f16":
            value = self.read(dtype, src, offset)
            return self.write(
                dtype, dst, at, f"{condition} ? {value} : 0.0f" if condition else value
            )
        value = f"{condition} ? {src}[{offset}] : 0" if condition else f"{src}[{offset}]"
        return f"{dst}[{at}] = {value};"

    def literal(self, value: float) -> str:
        """A float constant; the infinities and NaN by their C99 macro names."""
        if math.isinf(value):
            return "-INFINITY" if value < 0 else "INFINITY"
        if math.isnan(value):
            return "NAN"
        text = repr(float(value))
        return text + ("" if "e" in text or "." in text else ".0") + "f"

    def round(self, dtype: str, value: str) -> str:
        """A float rounded to the nearest value of ``dtype``, still a float."""
        return value if dtype == "f32" else f"tsr_round_{dtype}({value})"


OPENCL = Dialect(
    name="opencl",
    index_type="long",
    scalar_types={"float": "float", "int": "long", "bool": "int", "index": "long"},
    storage={"f32": "float", "f16": "half", "bf16": "ushort"},
    local_qualifier="__local",
    byte_type="uchar",
    barrier="barrier(CLK_LOCAL_MEM_FENCE);",
    fma="fma",
    unary={
        "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh",
        "abs": "fabs", "sin": "sin", "cos": "cos", "relu": "tsr_relu",
        "sigmoid": "tsr_sigmoid", "gelu": "tsr_gelu", "silu": "tsr_silu",
    },
)  # fmt: skip
