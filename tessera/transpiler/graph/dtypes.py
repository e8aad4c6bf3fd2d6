"""Element types and numerics policies.

A dtype says how an element is stored; a policy says how arithmetic on it
behaves (``bf16 @accum(f32)``: stored in bf16, accumulated in f32). Both come
from the type annotations of a ``.tsr`` file and are checked where they apply,
so ``f32 @saturate`` is an error at the annotation, not a surprise at run time.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from ...frozen import frozen

__all__ = [
    "DType", "DTYPES", "ALIASES", "BOOL", "lookup_dtype", "Policies", "promote", "accumulator",
    "SATURATION", "saturation_error", "I8_EXACT_ROWS",
]  # fmt: skip

#: The most products of i8s whose sum an f32 (a tile's element) holds exactly: 1024 of
#: at most 2^14 (``-128 * -128``) sum to at most 2^24 (docs/numerics.md, W8A8).
I8_EXACT_ROWS = 1024


@frozen
class DType:
    name: str
    bits: int
    kind: str  # "float", "int" or "bool"
    #: Bits of mantissa precision, to order float types (tf32 and f16: 10, bf16: 7).
    mantissa: int = 0

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    def __str__(self) -> str:
        return self.name


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("f32", 32, "float", 23),
        DType("tf32", 32, "float", 10),
        DType("bf16", 16, "float", 7),
        DType("f16", 16, "float", 10),
        DType("fp8_e4m3", 8, "float", 3),
        DType("fp8_e5m2", 8, "float", 2),
        DType("i32", 32, "int"),
        DType("i8", 8, "int"),
        DType("i4", 4, "int"),
    )
}

#: Spellings from the seed documents and from NumPy/PyTorch habits.
ALIASES = {
    "fp32": "f32",
    "float32": "f32",
    "fp16": "f16",
    "float16": "f16",
    "half": "f16",
    "bfloat16": "bf16",
    "e4m3": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "float8_e4m3": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "int32": "i32",
    "int8": "i8",
    "int4": "i4",
}

F32 = DTYPES["f32"]
I32 = DTYPES["i32"]
#: The lengths of a ``KVCache`` (``tessera.KVCache.lengths``, numpy's int64), which only
#: a cache's tensors at an entry have (``tile.kvcache``): no annotation spells it.
I64 = DType("i64", 64, "int")
#: Every dtype a tensor at an entry may have, by the name its metadata gives.
ENTRY_DTYPES = {**DTYPES, I64.name: I64}

#: A comparison's result: a mask, which only ``where`` and ``cast`` read. It is no dtype
#: an annotation can name, so no parameter or result has it; where a mask must be kept
#: between two kernels (a mask of ``[C]`` read by a kernel over ``[R, C]``), it is stored
#: as the floats 1.0 and 0.0, which is how every backend computes it.
BOOL = DType("bool", 32, "bool")


def lookup_dtype(name: str) -> DType | None:
    return DTYPES.get(ALIASES.get(name, name))


def promote(a: DType, b: DType) -> DType:
    """The dtype of an elementwise result: float beats int, then precision wins.

    Two different 16-bit floats (bf16 and f16) meet in f32, which holds both.
    """
    if a == b:
        return a
    if a.is_float != b.is_float:
        return a if a.is_float else b
    if a.is_float:
        if a.bits == b.bits == 16 or {a.name, b.name} == {"f32", "tf32"}:
            return F32
        return max(a, b, key=lambda d: (d.bits, d.mantissa))
    return max(a, b, key=lambda d: d.bits)


@frozen
class Policies:
    """The numerics policies of a tensor type; all optional."""

    accum: DType | None = None
    stochastic_round: bool = False
    #: The Philox key of ``@stochastic_round``: a number, or the name of an int parameter.
    seed: int | str = 0
    #: Where ``@stochastic_round`` is written, for the errors about its seed and result.
    stochastic_span: Any = field(default=None, compare=False, repr=False)
    loss_scale: float | None = None
    saturate: bool = False

    def __str__(self) -> str:
        parts = []
        if self.accum is not None:
            parts.append(f"@accum({self.accum})")
        if self.stochastic_round:
            parts.append("@stochastic_round" + (f"(seed={self.seed})" if self.seed else ""))
        if self.loss_scale is not None:
            value = int(self.loss_scale) if self.loss_scale.is_integer() else self.loss_scale
            parts.append(f"@loss_scale({value})")
        if self.saturate:
            parts.append("@saturate")
        return " ".join(parts)


def accumulator(dtype: DType, policies: Policies) -> DType:
    """The dtype a matmul or reduction over ``dtype`` accumulates in."""
    if policies.accum is not None:
        return policies.accum
    return F32 if dtype.is_float else I32


#: The range a saturating conversion clamps to, by dtype: the largest finite value of each
#: fp8 format (``docs/numerics.md``), and an integer's whole range.
SATURATION: dict[str, tuple[float, float]] = {
    "fp8_e4m3": (-448.0, 448.0),
    "fp8_e5m2": (-57344.0, 57344.0),
    "i8": (-128.0, 127.0),
    "i4": (-8.0, 7.0),
}


def saturation_error(dtype: DType) -> str | None:
    """Why values of ``dtype`` cannot saturate, or None where they can: the wider floats
    hold every value their computations give but infinities, which are meant; i32 has no
    float that is its largest value."""
    if dtype.name in SATURATION:
        return None
    return f"@saturate applies to fp8_e4m3, fp8_e5m2, i8 and i4, not {dtype}"
