"""Run under mpirun by tests/test_distributed.py: every collective alone against numpy,
the tensor-parallel MLP and the data-parallel step against float64, on 2 processes
(a mesh axis of 2 each) or 4 (a 2 x 2 mesh); exits non-zero on the first failure."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
from mpi4py import MPI

import tessera
import tessera.runtime.cpu
import tessera.runtime.mpi

COMM = MPI.COMM_WORLD
RANK, WORLD = COMM.Get_rank(), COMM.Get_size()
#: the meshes of the MLP (and of the collectives) and of the data-parallel step
TP_MESH, DP_MESH = (
    ({"dp": 1, "tp": 2}, {"dp": 2, "tp": 1}) if WORLD == 2 else ({"dp": 2, "tp": 2},) * 2
)

SOURCE = """
@kernel
def mlp(x: Tensor["B", "D", f32] @shard("dp", None), w1: Tensor["D", "F", f32] @shard(None, "tp"),
        w2: Tensor["F", "D", f32] @shard("tp", None)) -> Tensor["B", "D", f32] @shard("dp", None):
    with mesh(axes=TP_MESH):
        h = gelu(x @ w1)
        y = h @ w2
    return y

@kernel
def step(x: Tensor["B", "D", f32] @shard("dp", None), t: Tensor["B", "O", f32] @shard("dp", None),
         w: Tensor["D", "O", f32], lr: float) -> Tensor["D", "O", f32]:
    with mesh(axes=DP_MESH, deterministic=True):
        err = x @ w - t
        g = transpose(x) @ err
    return w - lr * g

@kernel
def attention(q: Tensor["B", "S", "D", f32] @shard(None, "tp", None),
              k: Tensor["B", "S", "D", f32] @shard(None, "tp", None),
              v: Tensor["B", "S", "D", f32] @shard(None, "tp", None)
              ) -> Tensor["B", "S", "D", f32] @shard(None, "tp", None):
    with mesh(axes=TP_MESH):
        keys = all_gather(k, axis="tp", dim=1)
        values = all_gather(v, axis="tp", dim=1)
        o = flash_attention(q, keys, values, causal=False)
    return o

def loss(x: Tensor["B", "D", f32], w: Tensor["D", "O", f32], b: Tensor["O", f32],
         c: Tensor["O", f32], t: Tensor["B", "O", f32]) -> Tensor[f32]:
    e = (x @ w + b) * c - t
    return sum(e * e, axis=None)

@kernel
def train(x: Tensor["B", "D", f32] @shard("dp", None), t: Tensor["B", "O", f32] @shard("dp", None),
          w: Tensor["D", "O", f32], b: Tensor["O", f32], c: Tensor["O", f32], lr: float
          ) -> tuple[Tensor["D", "O", f32], Tensor["O", f32], Tensor["O", f32]]:
    with mesh(axes=DP_MESH, bucket_mb=1, deterministic=True):
        gw, gb, gc = grad(loss, wrt=("w", "b", "c"))(x, w, b, c, t)
    return w - lr * gw, b - lr * gb, c - lr * gc

@kernel
def scattered(x: Tensor["B", "F", f32] @shard(None, "tp")) -> Tensor["B", f32] @shard("tp"):
    with mesh(axes=TP_MESH):
        y = sum(x, axis=1)
    return y

@kernel
def gathered(x: Tensor["B", "F", f32] @shard(None, "tp")) -> Tensor["B", "F", f32]:
    with mesh(axes=TP_MESH):
        y = x * 2.0
    return y

@kernel
def reduce_all(x: Tensor["N", 3, f32]) -> Tensor["N", 3, f32]:
    with mesh(axes=TP_MESH):
        y = all_reduce(x, op="max")
    return y

@kernel
def reduce_tp(x: Tensor["N", 3, f32]) -> Tensor["N", 3, f32]:
    with mesh(axes=TP_MESH):
        y = all_reduce(x, axis="tp", op="mean")
    return y

@kernel
def gather(x: Tensor["N", 6, f32] @shard(None, "tp")) -> Tensor["N", 6, f32]:
    with mesh(axes=TP_MESH):
        y = all_gather(x, axis="tp", dim=1)
    return y

@kernel
def scatter(x: Tensor[5, "M", f32]) -> Tensor[5, "M", f32] @shard(None, "tp"):
    with mesh(axes=TP_MESH):
        y = reduce_scatter(x, axis="tp", dim=1)
    return y

@kernel
def exchange(x: Tensor["R", 4, 3, f32] @shard("tp", None, None)
             ) -> Tensor["R", 4, 3, f32] @shard(None, "tp", None):
    with mesh(axes=TP_MESH):
        y = all_to_all(x, axis="tp", split_dim=1, concat_dim=0)
    return y
""".replace("TP_MESH", repr(TP_MESH)).replace("DP_MESH", repr(DP_MESH))

THREE = """
@kernel
def f(x: Tensor["N", f32]) -> Tensor["N", f32]:
    with mesh(axes={"tp": 3}):
        y = all_reduce(x)
    return y
"""


def coords(mesh: dict[str, int]) -> dict[str, int]:
    """This rank's coordinate on each axis (row-major, the last axis fastest)."""
    out, rest = {}, RANK
    for axis, n in reversed(mesh.items()):
        out[axis], rest = rest % n, rest // n
    return out


def block(a: np.ndarray, dim: int, axis: str, mesh: dict[str, int]) -> np.ndarray:
    n, c = mesh[axis], coords(mesh)[axis]
    size = a.shape[dim] // n
    return np.ascontiguousarray(np.take(a, range(c * size, (c + 1) * size), axis=dim))


def check(name: str, got: np.ndarray, want: np.ndarray, tol: float = 1e-5) -> None:
    err = np.abs(got.astype(np.float64) - want).max() / max(1.0, np.abs(want).max())
    if not err <= tol:
        print(f"rank {RANK}: {name}: relative error {err}", flush=True)
        COMM.Abort(1)


def gelu(h: np.ndarray) -> np.ndarray:
    return 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))


def train_reference(
    x: np.ndarray, t: np.ndarray, w: np.ndarray, b: np.ndarray, c: np.ndarray, lr: float
) -> tuple[np.ndarray, ...]:
    """The training step of ``train`` in float64: the gradient of the summed squares."""
    x, t, w, b, c = (a.astype(np.float64) for a in (x, t, w, b, c))
    z = x @ w + b
    dy = 2 * (z * c - t)
    dz = dy * c
    return w - lr * x.T @ dz, b - lr * dz.sum(axis=0), c - lr * (dy * z).sum(axis=0)


def main() -> None:
    # one compile and one build, on rank 0: the others take its output and find the
    # build in the cache
    built = None
    if RANK == 0:
        program = tessera.compile(SOURCE, "meshes.tsr", target="cpu")
        program.load()
        built = program.source, program.ir("meta")
    source, meta = COMM.bcast(built)
    lib = tessera.runtime.cpu.load(source, meta)
    if sys.argv[1:] == ["die"]:  # one rank dies before a collective: every rank must stop
        if RANK == 1:
            os._exit(5)
        lib.reduce_all(np.ones((5, 3), np.float32))
        return
    rng = np.random.default_rng(7)  # the same global tensors on every rank
    tp = TP_MESH["tp"]

    # each collective alone, against numpy on every rank's value
    mine = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(WORLD)]
    check("all_reduce max", lib.reduce_all(mine[RANK]), np.max(mine, axis=0))
    group = [r for r in range(WORLD) if r // tp == RANK // tp]
    check("all_reduce mean", lib.reduce_tp(mine[RANK]), np.mean([mine[r] for r in group], axis=0))
    x = rng.standard_normal((5, 6)).astype(np.float32)
    check("all_gather", lib.gather(block(x, 1, "tp", TP_MESH)), x)
    check(
        "reduce_scatter",
        lib.scatter(mine[RANK][:, :2].repeat(tp, axis=1)),
        block(np.sum([mine[r][:, :2].repeat(tp, axis=1) for r in group], axis=0), 1, "tp", TP_MESH),
    )
    x = rng.standard_normal((2 * tp, 4, 3)).astype(np.float32)
    check("all_to_all", lib.exchange(block(x, 0, "tp", TP_MESH)), block(x, 1, "tp", TP_MESH))

    # the tensor-parallel MLP: column- then row-parallel matmul, one all-reduce inserted
    B, D, F = 6, 7, 10
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((B, D), (D, F), (F, D)))
    out = lib.mlp(
        block(x, 0, "dp", TP_MESH), block(w1, 1, "tp", TP_MESH), block(w2, 0, "tp", TP_MESH)
    )
    want = gelu(x.astype(np.float64) @ w1) @ w2
    check("tensor-parallel MLP", out, block(want, 0, "dp", TP_MESH), 1e-5)

    # sequence-parallel attention: queries split by rows, keys and values gathered
    q, k, v = (rng.standard_normal((2, 6, 8)).astype(np.float32) for _ in range(3))
    scores = q.astype(np.float64) @ k.transpose(0, 2, 1) / math.sqrt(8)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    shards = (block(a, 1, "tp", TP_MESH) for a in (q, k, v))
    check("sequence-parallel attention", lib.attention(*shards), block(want, 1, "tp", TP_MESH))

    # the data-parallel step: the gradient's all-reduce inserted; deterministic sums
    O = 5
    x, t, w = (rng.standard_normal(s).astype(np.float32) for s in ((B, D), (B, O), (D, O)))
    args = block(x, 0, "dp", DP_MESH), block(t, 0, "dp", DP_MESH), w
    out = lib.step(*args, 0.1)
    x64 = x.astype(np.float64)
    check("data-parallel step", out, w - 0.1 * x64.T @ (x64 @ w - t), 1e-5)
    every = COMM.allgather(out.tobytes())
    again = lib.step(*args, 0.1)
    if len(set(every)) != 1 or again.tobytes() != out.tobytes():
        print(f"rank {RANK}: the deterministic step differs between ranks or runs", flush=True)
        COMM.Abort(1)

    # a data-parallel training step by grad: the three gradients' all-reduce inserted
    # as one bucket, which a 1 MiB bucket size splits into two messages (w alone, then
    # b and c packed); summed in rank order, the same bits on every rank
    B, D, O = 6, 512, 512
    x, t = (rng.standard_normal(s).astype(np.float32) for s in ((B, D), (B, O)))
    w, b, c = ((rng.standard_normal(s) / 20).astype(np.float32) for s in ((D, O), (O,), (O,)))
    got = lib.train(block(x, 0, "dp", DP_MESH), block(t, 0, "dp", DP_MESH), w, b, c, 0.01)
    reference = train_reference(x, t, w, b, c, 0.01)
    for name, have, want in zip(("w", "b", "c"), got, reference, strict=True):
        check(f"data-parallel training step {name}", have, want, 1e-5)
    if len(set(COMM.allgather(b"".join(a.tobytes() for a in got)))) != 1:
        print(f"rank {RANK}: the deterministic buckets differ between ranks", flush=True)
        COMM.Abort(1)

    # the result's spec calls for a reduce-scatter of a partial sum, or a gather
    x = rng.standard_normal((4, 6)).astype(np.float32)
    want = x.astype(np.float64).sum(axis=1)
    check("reduce_scatter inserted", lib.scattered(block(x, 1, "tp", TP_MESH)),
          block(want, 0, "tp", TP_MESH))  # fmt: skip
    check("all_gather inserted", lib.gathered(block(x, 1, "tp", TP_MESH)), 2.0 * x)

    # once the module is warm, a mesh function's C call meets the other processes in C
    # and takes a given out
    for _ in range(tessera.runtime.cpu.WARM_CALLS + 8):
        lib.reduce_all(mine[RANK])
    assert lib.reduce_all._fast is not None
    given = np.full((5, 3), np.nan, np.float32)
    assert lib.reduce_all._fast(mine[RANK], out=given) is given
    check("all_reduce max, warm, into out", given, np.max(mine, axis=0))
    # an out that is the input itself: MPI forbids one buffer as both send and receive
    # buffer, so the call takes a new array for the result and copies it (numpy's out=)
    own = mine[RANK].copy()
    assert lib.reduce_all(own, out=own) is own
    check("all_reduce max, out over the input", own, np.max(mine, axis=0))
    check("all_reduce mean, warm", lib.reduce_tp(mine[RANK]),
          np.mean([mine[r] for r in group], axis=0))  # fmt: skip
    # shards of different shapes are an error on every rank, not a hang, on the C calls
    # and where one process takes the full checks (its input by name) and the others
    # their C calls
    for by_name in (False, True):
        shard = mine[RANK][: 5 - (RANK % 2)]
        try:
            lib.reduce_all(x=shard) if by_name and RANK == 0 else lib.reduce_all(shard)
        except ValueError as exc:
            assert "shards differ" in str(exc), exc
        else:
            COMM.Abort(1)
    # an argument refused on one process only is refused on all, not left half-run
    try:
        lib.reduce_all(mine[RANK].astype(np.float64) if RANK == 0 else mine[RANK])
    except ValueError as exc:
        assert "process 0 refused its arguments" in str(exc), exc
    else:
        COMM.Abort(1)
    # a mesh of another size is refused before the build
    try:
        tessera.compile(THREE, "three.tsr", target="cpu").load()
    except RuntimeError as exc:
        assert "mpirun -n 3" in str(exc), exc
    else:
        COMM.Abort(1)
    # torchrun's variables must agree with MPI's world
    os.environ["WORLD_SIZE"] = str(WORLD + 1)
    try:
        tessera.runtime.mpi.process.__wrapped__()
    except RuntimeError as exc:
        assert "torchrun does not start" in str(exc), exc
    else:
        COMM.Abort(1)
    del os.environ["WORLD_SIZE"]
    here = tessera.runtime.mpi.process()
    assert (here.rank, here.world_size, here.local_rank) == (RANK, WORLD, RANK), here
    COMM.Barrier()
    if RANK == 0:
        print(f"ok: {WORLD} processes", flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
