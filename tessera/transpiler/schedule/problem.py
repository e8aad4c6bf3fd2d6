"""A kernel's shape of work, as the schedule heuristics see it."""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.dims import Dim
from ..graph.dtypes import DType

__all__ = ["Problem"]


@dataclass(frozen=True)
class Problem:
    """What a fused kernel computes, reduced to the sizes that choose its tiles.

    - gemm: ``m x n`` outputs, reduction length ``k``.
    - attention: ``m`` queries, ``n`` keys, head dim ``d``.
    - reduction: ``m`` rows of ``n`` elements.
    - elementwise, layout, state: ``m`` elements.
    - tile: the user's kernel; ``m`` output rows, ``n`` the extent of its loop,
      ``d`` the last dim of its result; ``attention`` when it uses online softmax.
    """

    kind: str
    dtype: DType
    m: Dim
    n: Dim | None = None
    k: Dim | None = None
    d: Dim | None = None
    batch: tuple[Dim, ...] = ()
    attention: bool = False

    @property
    def bytes(self) -> int:
        return max(1, self.dtype.bits // 8)
