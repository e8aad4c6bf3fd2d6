"""A kernel's shape of work, as the schedule heuristics see it."""

from __future__ import annotations

from ...frozen import frozen
from ..graph.dims import Dim
from ..graph.dtypes import DType

__all__ = ["Problem"]


@frozen
class Problem:
    """What a fused kernel computes, reduced to the sizes that choose its tiles.

    - gemm: ``m x n`` outputs, reduction length ``k``.
    - attention: ``m`` queries, ``n`` keys, head dim ``d``.
    - reduction: ``m`` rows of ``n`` elements.
    - columns: ``m`` column sums over ``n`` rows (a norm's weight gradient).
    - elementwise, layout, state: ``m`` elements.
    - tile: a kernel written with ``tile.*``; ``shape`` says which of the above it
      works like (``attention`` with online softmax, ``gemm`` with a dot,
      ``reduction`` for row blocks, ``elementwise`` for 1-D blocks) and the sizes
      follow that kind, with ``k`` (gemm) or ``n`` (attention) the extent of its loop.

    ``held`` counts the ``m x d`` tiles an attention program holds through its loop: the
    forward pass's queries, or two in its backward pass (queries and their output's
    gradient, or keys and values), which also stages probabilities for its products. A
    gemm holds ``held`` ``m x n`` accumulators, one a result (``gemm_i8``'s two parts).
    """

    kind: str
    dtype: DType
    m: Dim
    n: Dim | None = None
    k: Dim | None = None
    d: Dim | None = None
    batch: tuple[Dim, ...] = ()
    shape: str | None = None
    held: int = 1
    #: Whether a tile kernel's product reads an operand that it widens in registers from
    #: an integer load (a weight dequantized in the main loop), not through shared memory.
    dequantized: bool = False

    @property
    def bytes(self) -> int:
        return max(1, self.dtype.bits // 8)

    @property
    def works_like(self) -> str:
        """The kernel kind whose heuristics and costs apply."""
        return self.shape if self.kind == "tile" and self.shape else self.kind
