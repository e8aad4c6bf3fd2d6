"""The types of Graph IR values.

``TensorType`` is the type of kernel arguments and graph values; tile kernels
also have tiles, block indices and the tile context. Every type prints the
way ``--emit graph`` shows it.
"""

from __future__ import annotations

from dataclasses import field

from ...frozen import frozen
from .dims import Dim
from .dtypes import BOOL, F32, DType, Policies

__all__ = [
    "TensorType",
    "ScalarType",
    "TileType",
    "KVCacheType",
    "OptimizerStateType",
    "BlockType",
    "ContextType",
    "ValueType",
    "TupleType",
    "result_types",
    "dims_text",
    "in_memory",
]


def dims_text(dims: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


@frozen
class TensorType:
    dims: tuple[Dim, ...]
    dtype: DType
    policies: Policies = field(default_factory=Policies)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def with_(self, dims: tuple[Dim, ...] | None = None, dtype: DType | None = None) -> TensorType:
        return TensorType(
            self.dims if dims is None else dims,
            self.dtype if dtype is None else dtype,
            self.policies,
        )

    def __str__(self) -> str:
        policies = f" {self.policies}" if str(self.policies) else ""
        return f"tensor<{dims_text(self.dims)}, {self.dtype}{policies}>"


def in_memory(t: ValueType) -> ValueType:
    """The type a kernel reads or writes ``t`` with: its own, but a mask (which a kernel
    computes as floats) is kept between kernels as the floats 1.0 and 0.0."""
    return TensorType(t.dims, F32) if isinstance(t, TensorType) and t.dtype == BOOL else t


@frozen
class ScalarType:
    """A run-time scalar: ``int``, ``float`` or ``bool`` parameters and their arithmetic."""

    kind: str

    def __str__(self) -> str:
        return self.kind


@frozen
class TileType:
    """A tile held by one program instance of a tile kernel: ``tile<[T.m, T.d], f32>``."""

    dims: tuple[Dim, ...]
    dtype: DType
    #: The schedule's tile each dim is (``"T.m"``; None for another size), where the
    #: lowering knew it: a backend prints such an extent as the tile's name (``BM``),
    #: not as the number it shares with other sizes. Not part of the type's identity.
    tiles: tuple[str | None, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def with_(self, dims: tuple[Dim, ...] | None = None, dtype: DType | None = None) -> TileType:
        tiles = self.tiles if dims is None else None
        return TileType(self.dims if dims is None else dims, self.dtype if dtype is None else dtype,
                        tiles)  # fmt: skip

    def __str__(self) -> str:
        return f"tile<{dims_text(self.dims)}, {self.dtype}>"


@frozen
class KVCacheType:
    """A key/value cache: state that ``append`` updates (an effect)."""

    dims: tuple[Dim, ...] | None
    dtype: DType | None
    policies: tuple[str, ...] = ()

    def __str__(self) -> str:
        inside = ""
        if self.dims is not None and self.dtype is not None:
            inside = f"<{dims_text(self.dims)}, {self.dtype}>"
        policies = "".join(f" {p}" for p in self.policies)
        return f"kvcache{inside}{policies}"


@frozen
class OptimizerStateType:
    """``OptimizerState[w] @fp32_master``: the Adam state of the parameter ``w``, which
    ``fused_adam`` updates. It is no Graph IR value: analysis flattens it into its
    tensors (``fields``), the f32 master copy first where ``@fp32_master`` keeps one,
    then the moments ``m`` and ``v``, each of the parameter's dims. The moments are f32
    with a master and in the parameter's dtype without one, as ``fused_adam`` takes
    them. ``tensor`` is the parameter's type once the annotation is bound to it."""

    param: str
    fp32_master: bool
    policies: tuple[str, ...] = ()
    tensor: TensorType | None = None

    @property
    def fields(self) -> tuple[str, ...]:
        return ("master", "m", "v") if self.fp32_master else ("m", "v")

    def field_type(self) -> TensorType:
        """The type of each of the state's tensors (all share it)."""
        assert self.tensor is not None, "bound to its parameter first"
        return TensorType(self.tensor.dims, F32 if self.fp32_master else self.tensor.dtype)

    def __str__(self) -> str:
        return f"OptimizerState[{self.param}]" + "".join(f" {p}" for p in self.policies)


@frozen
class BlockType:
    """The index of a block of ``size`` rows out of ``extent``, from ``tile.range_n``."""

    size: Dim
    extent: Dim

    def __str__(self) -> str:
        return f"block<{self.size} of {self.extent}>"


@frozen
class ContextType:
    """``tile.context()``: the tile sizes of the running program instance."""

    def __str__(self) -> str:
        return "tile.context"


ValueType = TensorType | ScalarType | TileType | KVCacheType | BlockType | ContextType


@frozen
class TupleType:
    """The declared result of a function that returns several values
    (``-> tuple[A, B]``, or ``-> (A, B)``): a function's result only, never a value's."""

    items: tuple[ValueType, ...]

    def __str__(self) -> str:
        return "tuple<" + ", ".join(str(t) for t in self.items) + ">"


def result_types(declared: ValueType | TupleType | None) -> tuple[ValueType, ...]:
    """The types a declared result lists, one per returned value."""
    if declared is None:
        return ()
    return declared.items if isinstance(declared, TupleType) else (declared,)
