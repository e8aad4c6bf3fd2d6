"""Bank-conflict linter: how many accesses one bank serializes per wavefront.

Shared memory is 32 banks of 4-byte words; a warp's request is served a wavefront at
a time (its 32 lanes for accesses up to 4 bytes, 16 lanes for 8 bytes, 8 lanes for 16
bytes), and within a wavefront each bank delivers one word: lanes that touch
different words of one bank wait for each other, lanes that touch one word share it.
The degree of an access is the most distinct words any bank holds in any of its
wavefronts (1: conflict-free; 8: eight times slower).

The lanes' addresses come from the buffer's layout (``row-major``, ``padded +P``,
``xor``, ``sw128``: ``smem.py`` chose it, ``simt_layout.smem_index`` is what the code
computes) and from how the SIMT lowering walks the buffer:

- a ``copy`` moves 16-byte chunks, thread ``e`` chunk ``e`` in row-major order (rows
  of whole chunks), else one element per thread;
- a ``read`` that a ``mma.sync`` product takes is loaded with ``ldmatrix``: each phase
  of 8 lanes reads 16 bytes from each of 8 consecutive rows of the buffer, at one chunk;
- any other read is walked by the ``Grid`` distribution: lane ``l`` reads element
  ``(l / 16, l % 16)`` of each 2 x 16 block.

Copies through TMA and operands that ``wgmma`` or MFMA read from shared memory are
not lane accesses (the copy engine and the matrix unit read whole swizzled rows), so
they are not linted. Staging buffers that the emitter adds on its own are padded by a
word against conflicts and are not in the Tile IR.
"""

from __future__ import annotations

from collections.abc import Iterator

from ...frozen import frozen
from ..graph.ir import Op, walk
from ..schedule.hardware import GRID_COLUMNS
from ..tile.ir import Mma, SharedType, TileKernel
from .findings import Finding

__all__ = ["BANKS", "THRESHOLD", "Pattern", "byte_address", "degree", "lint_banks", "patterns"]

BANKS = 32
WORD = 4
CHUNK = 16
#: Degrees above this warn. Two-way conflicts are common and cheap (a 64-bit walk of a
#: row-major tile); from four ways on they slow a kernel down measurably.
THRESHOLD = 2


@frozen
class Pattern:
    """How one instruction's lanes touch a buffer: ``lanes`` (element row, column) of
    ``width`` bytes each, in wavefronts of ``per_wavefront`` lanes."""

    name: str
    lanes: tuple[tuple[int, int], ...]
    width: int

    @property
    def per_wavefront(self) -> int:
        return max(1, BANKS * WORD // max(self.width, WORD))


def byte_address(layout: str, rows: int, cols: int, bits: int, i: int, j: int) -> int:
    """The byte offset of element ``(i, j)`` of slot 0 of a ``[rows, cols]`` buffer."""
    per_chunk = CHUNK * 8 // bits
    if layout == "sw128":
        panel = 128 * 8 // bits
        chunk = (j % panel) // per_chunk ^ i % 8
        element = j // panel * rows * panel + i * panel + chunk * per_chunk + j % per_chunk
        return element * bits // 8
    stride = cols
    if layout.startswith("padded +"):
        stride += int(layout.removeprefix("padded +"))
    column = j
    if layout == "xor":
        group = 8
        while group > 1 and (cols // per_chunk) % group:
            group //= 2
        column = (j // per_chunk ^ i % group) * per_chunk + j % per_chunk
    return (i * stride + column) * bits // 8


def degree(layout: str, rows: int, cols: int, bits: int, pattern: Pattern) -> int:
    """The most distinct words one bank holds in any wavefront of ``pattern``."""
    worst = 1
    step = pattern.per_wavefront
    for start in range(0, len(pattern.lanes), step):
        banks: dict[int, set[int]] = {}
        for i, j in pattern.lanes[start : start + step]:
            address = byte_address(layout, rows, cols, bits, i, j)
            for word in range(address // WORD, (address + pattern.width - 1) // WORD + 1):
                banks.setdefault(word % BANKS, set()).add(word)
        worst = max(worst, max(len(words) for words in banks.values()))
    return worst


def patterns(kind: str, rows: int, cols: int, bits: int) -> Iterator[Pattern]:
    """Every wavefront-sized group of lanes of a walk (``copy``, ``ldmatrix``, ``grid``)
    over a ``[rows, cols]`` buffer."""
    per_chunk = CHUNK * 8 // bits
    if kind == "ldmatrix":
        for i0 in range(0, rows - 7, 8):
            for j0 in range(0, cols, per_chunk):
                yield Pattern(kind, tuple((i0 + r, j0) for r in range(8)), CHUNK)
    elif kind == "copy" and cols % per_chunk == 0:
        chunks = [(e // (cols // per_chunk), e % (cols // per_chunk) * per_chunk)
                  for e in range(rows * cols // per_chunk)]  # fmt: skip
        for start in range(0, len(chunks), 32):
            yield Pattern("copy", tuple(chunks[start : start + 32]), CHUNK)
    else:
        width = max(1, bits // 8)
        if kind == "copy":
            cells = [(e // cols, e % cols) for e in range(rows * cols)]
        else:
            tx = min(GRID_COLUMNS, cols)
            cells = [(i0 + lane // tx, j0 + lane % tx) for i0 in range(0, rows, 32 // tx)
                     for j0 in range(0, cols - tx + 1, tx) for lane in range(32)
                     if i0 + lane // tx < rows]  # fmt: skip
        for start in range(0, len(cells), 32):
            yield Pattern(kind, tuple(cells[start : start + 32]), width)


def lint_banks(kernel: TileKernel, threshold: int = THRESHOLD) -> list[Finding]:
    """A finding for each shared-memory access whose degree is above ``threshold``."""
    layouts = {slot.buffer: slot.layout for slot in kernel.smem}
    findings = []
    for op, kind in _accesses(kernel):
        buf = op.operands[1 if op.kind == "copy" else 0]
        t: SharedType = buf.type
        layout = layouts.get(buf.name or "smem")
        if layout is None or len(t.dims) > 2:
            continue
        rows, cols = (1, t.dims[0].constant) if len(t.dims) == 1 else (d.constant for d in t.dims)
        if rows is None or cols is None:
            continue
        worst = max(
            (degree(layout, rows, cols, t.dtype.bits, p) for p in patterns(kind, rows, cols,
             t.dtype.bits)), default=1
        )  # fmt: skip
        if worst > threshold:
            what = "written by a copy" if op.kind == "copy" else f"read ({kind})"
            findings.append(
                Finding(
                    "bank-conflict",
                    kernel.name,
                    f"{worst}-way bank conflict: shared buffer '{buf.name}' ({layout}, "
                    f"[{rows}, {cols}] {t.dtype}) {what} touches {worst} words of one bank "
                    "in a wavefront",
                    op.span,
                )
            )
    return findings


def _accesses(kernel: TileKernel) -> Iterator[tuple[Op, str]]:
    """The lane-addressed shared-memory accesses and how each walks its buffer."""
    ops = list(walk(kernel.body))
    takers: dict[int, Op] = {}
    for op in ops:
        for operand in op.operands:
            takers.setdefault(operand.id, op)
    for op in ops:
        if op.kind == "copy" and op.attr("async") != "tma" and not kernel.producer:
            yield op, "copy"
        elif op.kind == "read":
            taker = takers.get(op.result.id)
            while taker is not None and taker.kind == "transpose":
                taker = takers.get(taker.result.id)
            mma = taker.attr("mma") if taker is not None else None
            if not isinstance(mma, Mma) or mma.operands != "shared":
                yield op, "grid"
            elif mma.inst.startswith("mma.sync") and op.result.type.dtype.bits == 16:
                yield op, "ldmatrix"
