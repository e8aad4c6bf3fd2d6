"""The CPU backend's collectives: calls of MPI in the entry of a mesh function.

The entry runs its launches and its collectives in program order, so every process
reaches the same collectives in the same order. Each set of mesh axes a collective runs
over is an MPI communicator, split from the world on the entry's first call (on every
process, as MPI_Comm_split requires) and kept; the collectives themselves are
``tsr::mpi`` functions of ``templates/cpu/tessera_mpi.hpp``.
"""

from __future__ import annotations

import math

from ..graph.collectives import collective_of
from ..graph.dims import Dim
from ..graph.ir import Function, Op, result_names
from ..graph.printer import value_names
from ..schedule.ir import Launch, param_name
from .cexpr import c_dim
from .cpu_kernel import C_TYPES
from .naming import Namer

__all__ = ["Collectives"]


def _product(dims: tuple[Dim, ...]) -> Dim:
    return math.prod(dims, start=Dim.const(1))


class Collectives:
    """The MPI calls of one mesh function's entry, and the communicators they use."""

    def __init__(
        self,
        function: Function,
        results: tuple[str, ...],
        namer: Namer,
        c_name: dict[str, str],
        sizes: dict[str, str],
    ) -> None:
        self.function = function
        self.results = results
        self.mesh = function.mesh
        self.namer = namer
        self.c_name = c_name
        self.sizes = sizes
        self.names = value_names(function)
        #: the C name of each set of axes' communicator (``"dp,tp"``), in first use
        self.groups: dict[str, str] = {}

    def _group(self, axes: str) -> str:
        if axes not in self.groups:
            self.groups[axes] = self.namer.fresh(axes.replace(",", "_") + "_group")
        return self.groups[axes]

    def setup(self) -> list[str]:
        """The communicators, made on the first call."""
        shape = self.namer.fresh("mesh")
        sizes = ", ".join(str(n) for _, n in self.mesh.axes)
        lines = [f"static const int {shape}[] = {{{sizes}}};"]
        for axes, name in self.groups.items():
            mask = sum(1 << i for i, a in enumerate(self.mesh.names) if a in axes.split(","))
            lines.append(
                f"static const MPI_Comm {name} = "
                f"tsr::mpi::group({shape}, {len(self.mesh.axes)}, {mask}u);"
            )
        return lines

    def _tensor(self, printed: str) -> str:
        """The entry's C name of a value the Schedule IR prints as ``printed``."""
        if printed in self.results:
            return self.c_name[result_names(len(self.results))[self.results.index(printed)]]
        return self.c_name[param_name(printed)]

    def _dim(self, dim: Dim) -> str:
        return c_dim(dim, self.sizes)

    def call(self, launch: Launch) -> list[str]:
        """The call that runs the collective of ``launch``."""
        op, sources = collective_of(self.function, launch.group)
        srcs = [self._tensor(self.names[v.id]) for v in sources]
        dsts = [self._tensor(self.names[v.id]) for v in op.results]
        ctype = C_TYPES[op.results[0].type.dtype.name]
        comm = self._group(op.attr("axis"))
        ordered = "true" if self.mesh.deterministic else "false"
        reduce = f"tsr::mpi::Reduce::{op.attr('op')}"
        s, r = op.operands[0].type.dims, op.results[0].type.dims
        comment = f"// {op.kind} over {op.attr('axis').replace(',', ', ')}"
        if len(sources) > 1:
            bucket = self._bucket(op, srcs, dsts, ctype, f"{reduce}, {ordered}", comm)
            return [f"{comment}: a bucket of {len(sources)} tensors", "{", *bucket, "}"]
        if op.kind == "all_reduce":
            args = [self._dim(_product(s)), reduce, ordered]
        elif op.kind == "all_gather":
            d = op.attr("dim")
            args = [self._dim(_product(s[:d])), self._dim(_product(s[d:]))]
        elif op.kind == "reduce_scatter":
            d = op.attr("dim")
            args = [self._dim(_product(r[:d])), self._dim(_product(r[d:])), reduce, ordered]
        else:
            a, b = op.attr("split_dim"), op.attr("concat_dim")
            n = math.prod(self.mesh.size(x) for x in op.attr("axis").split(","))
            block = tuple(d / n if i == a else d for i, d in enumerate(s))
            args = [self._dim(_product(block[:a])), self._dim(_product(block[a:])),
                    self._dim(_product(block[:b])), self._dim(_product(block[b:]))]  # fmt: skip
        return [
            comment,
            f"tsr::mpi::{op.kind}<{ctype}>({', '.join([srcs[0], dsts[0], *args, comm])});",
        ]

    def _bucket(
        self, op: Op, srcs: list[str], dsts: list[str], ctype: str, how: str, comm: str
    ) -> list[str]:
        """The all-reduce of several tensors (``how``: the reduction and whether it is in
        rank order), which the runtime packs into messages of at most the mesh's bucket
        size."""
        counts = ", ".join(self._dim(_product(v.type.dims)) for v in op.operands)
        return [
            f"  const {ctype}* const in[] = {{{', '.join(srcs)}}};",
            f"  {ctype}* const out[] = {{{', '.join(dsts)}}};",
            f"  const tsr::i64 counts[] = {{{counts}}};",
            f"  tsr::mpi::all_reduce_buckets<{ctype}>(in, out, counts, {len(srcs)}, "
            f"{how}, {self.mesh.bucket_mb}ll << 20, {comm});",
        ]
