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
    unary: dict[str, str] = field(default_factory=dict)

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
    unary={
        "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh",
        "abs": "fabs", "sin": "sin", "cos": "cos", "relu": "tsr_relu",
        "sigmoid": "tsr_sigmoid", "gelu": "tsr_gelu", "silu": "tsr_silu",
    },
)  # fmt: skip
