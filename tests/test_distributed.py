"""Meshes, shard specs and collectives: the language's checks, the distribution pass's
collectives in ``--emit graph``, and runs on 2 and 4 MPI processes (tests/mpi/meshes.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tessera

HERE = Path(__file__).parent

MLP = """
@kernel
def mlp(x: Tensor["B", "D", f32], w1: Tensor["D", "F", f32] @shard(None, "tp"),
        w2: Tensor["F", "D", f32] @shard("tp", None)) -> Tensor["B", "D", f32]:
    with mesh(axes={"tp": 2}):
        h = gelu(x @ w1)
        y = h @ w2
    return y

@kernel
def step(x: Tensor["B", "D", f32] @shard("dp", None), t: Tensor["B", "O", f32] @shard("dp", None),
         w: Tensor["D", "O", f32], lr: float) -> Tensor["D", "O", f32]:
    with mesh(axes={"dp": 4}):
        g = transpose(x) @ (x @ w - t)
    return w - lr * g
"""


def test_distribution_inserts_the_all_reduce_of_each_partial_sum() -> None:
    graph = tessera.compile(MLP, "mlp.tsr", target="cpu").inspect_ir("graph")
    assert "mesh {tp = 2}" in graph and "mesh {dp = 4}" in graph
    assert "param %w1 : tensor<[D, F_local], f32> shard(none, tp)" in graph
    assert "param %x : tensor<[B_local, D], f32> shard(dp, none)" in graph
    inserted = [line.split("=", 1)[1] for line in graph.splitlines() if "all_reduce" in line]
    assert len(inserted) == 2
    assert inserted[0].startswith(" all_reduce %y {axis = tp, op = sum, inserted = true}")
    assert inserted[1].startswith(" all_reduce %g {axis = dp, op = sum, inserted = true}")
    # the step's all-reduce comes before the update that reads it, in program order
    step = graph[graph.index("func @step") :]
    assert step.index("all_reduce") < step.index("= mul %")


RELAYOUT = """
def loss(x: Tensor["B", "D", f32], w: Tensor["D", "O", f32], b: Tensor["O", f32],
         t: Tensor["B", "O", f32]) -> Tensor[f32]:
    e = x @ w + b - t
    return sum(e * e, axis=None)

@kernel
def train(x: Tensor["B", "D", f32] @shard("dp", None), t: Tensor["B", "O", f32] @shard("dp", None),
          w: Tensor["D", "O", f32], b: Tensor["O", f32]
          ) -> tuple[Tensor["D", "O", f32], Tensor["O", f32]]:
    with mesh(axes={"dp": 2}):
        gw, gb = grad(loss, wrt=("w", "b"))(x, w, b, t)
    return w - 0.1 * gw, b - 0.1 * gb

@kernel
def scattered(x: Tensor["B", "F", f32] @shard(None, "tp")) -> Tensor["B", f32] @shard("tp"):
    with mesh(axes={"tp": 2}):
        y = sum(x, axis=1)
    return y

@kernel
def gathered(x: Tensor["B", "F", f32] @shard(None, "tp")) -> Tensor["B", "F", f32]:
    with mesh(axes={"tp": 2}):
        y = x * 2.0
    return y
"""


def test_distribution_buckets_gradients_and_follows_the_result_specs() -> None:
    """A data-parallel step by grad all-reduces its gradients as one bucket, before the
    first update reads one; a partial sum returned split is reduce-scattered, and a
    split value returned whole is gathered."""
    graph = tessera.compile(RELAYOUT, "relayout.tsr", target="cpu", until="graph")
    text = graph.inspect_ir("graph")
    collectives = [line.split(" = ", 1)[1].split(" effects")[0] for line in text.splitlines()
                   if "effects(collective)" in line]  # fmt: skip
    assert collectives == [
        "all_reduce %5 {axis = dp, op = sum, inserted = true}",  # the loss, which grad reads
        "all_reduce %gw, %gb {axis = dp, op = sum, inserted = true}",
        "reduce_scatter %y {axis = tp, dim = 0, op = sum, inserted = true}",
        "all_gather %y {axis = tp, dim = 1, inserted = true}",
    ], collectives
    assert "guard B % 2 == 0  // the result's dim 0, split over 'tp'" in text
    source = tessera.compile(RELAYOUT, "relayout.tsr", target="cpu").source
    assert "tsr::mpi::all_reduce_buckets<float>(in, out, counts, 2," in source
    assert "16ll << 20" in source


def _errors(source: str) -> list[str]:
    with pytest.raises(tessera.CompileError) as info:
        tessera.compile(source, "bad.tsr", target="cpu")
    return [f"{d.span.line}:{d.span.column}: {d.message}" for d in info.value.diagnostics]


def _function(params: str, body: str, result: str = 'Tensor["N", 8, f32]') -> str:
    return f"@kernel\ndef f({params}) -> {result}:\n{body}    return y\n"


IN_MESH = '    with mesh(axes={"dp": 2, "tp": 2}):\n        y = '


@pytest.mark.parametrize(
    "source, message",
    [
        (_function('x: Tensor["N", 8, f32] @shard("pp", None)', IN_MESH + "x * 2.0\n"),
         "2:37: the mesh has no axis 'pp'; its axes: dp, tp"),
        (_function('x: Tensor["N", 7, f32] @shard(None, "tp")', IN_MESH + "x * 2.0\n",
                   'Tensor["N", 7, f32]'),
         "2:10: dim 1 of 'x' is 7, which the 2 devices of mesh axis 'tp' cannot split evenly"),
        (_function('x: Tensor["N", 8, f32] @shard("dp")', IN_MESH + "x * 2.0\n"),
         "2:30: @shard gives one entry per dim"),
        (_function('x: Tensor["N", 8, f32] @shard("dp", None)', "    y = x * 2.0\n"),
         "2:30: @shard needs a mesh"),
        (_function('x: Tensor["N", 8, f32]', '    y = all_reduce(x, axis="tp")\n'),
         "3:9: all_reduce: a collective runs inside the function's 'with mesh(...)' block"),
        (_function('x: Tensor["N", 8, f32]', IN_MESH + 'all_reduce(x, axis="pp")\n'),
         "4:32: all_reduce: the mesh has no axis 'pp'"),
        (_function('x: Tensor["N", 8, f32]', IN_MESH + 'all_gather(x, axis="tp", dim=2)\n'),
         "4:42: all_gather: axis 2 is out of range"),
        (_function('x: Tensor["N", 6, f32]', IN_MESH + 'reduce_scatter(x, axis=("dp", "tp"), '
                   "dim=1)\n", 'Tensor["N", 1, f32]'),
         "4:54: reduce_scatter: dim 1 is 6, which 4 devices cannot split evenly"),
        (_function('x: Tensor["N", 8, f32] @shard(None, "tp")', IN_MESH + "softmax(x)\n",
                   'Tensor["N", 8, f32] @shard(None, "tp")'),
         "4:13: softmax on a tensor split over mesh axis 'tp' is not supported"),
        (_function('x: Tensor["N", 8, f32] @shard(None, "tp"), b: Tensor[4, f32]',
                   IN_MESH + "x + b\n", 'Tensor["N", 8, f32] @shard(None, "tp")'),
         "4:13: add: dim 1 is split over 'tp' in one operand and whole in another"),
        ("@kernel\ndef f(q: Tensor['S', 8, f32] @shard('tp', None), k: Tensor['S', 8, f32]"
         ") -> Tensor['S', 8, f32] @shard('tp', None):\n" + IN_MESH
         + "flash_attention(q, k, k, causal=True)\n    return y\n",
         "4:13: flash_attention: causal queries split by rows over 'tp'"),
        (_function('x: Tensor["N", 8, bf16]', IN_MESH + "all_reduce(x)\n", 'Tensor["N", 8, bf16]'),
         "4:24: all_reduce: combines f32 or i32 values, not bf16"),
        (_function('x: Tensor["N", 8, f32]', '    with mesh(axes={"dp": 0}):\n        y = x\n'),
         "3:20: mesh axis 'dp' has 1 to 4096 devices, not 0"),
        (_function('x: Tensor["N", 8, f32]', '    with mesh(axes={"dp": 2}, bucket_mb=0):\n'
                   "        y = x\n"),
         "3:41: bucket_mb= is a whole number of MiB from 1 to 1024, not 0"),
        (_function('x: Tensor["N", 8, f32]', IN_MESH + "x * 2.0\n", 'Tensor["N", 8, f32] '
                   '@shard("dp", None)'),
         "5:12: dim 0 of the result is declared split over mesh axis 'dp', but every device "
         "holds all of it"),
        (_function('x: Tensor[4, 8, f32] @shard("dp", None)', IN_MESH + "reshape(x, (8, 2))\n",
                   'Tensor[8, 2, f32]'),
         "4:13: reshape: a dim split over mesh axis 'dp' must stay the first"),
        ("def mse(x: Tensor['N', 8, f32], w: Tensor[8, f32]) -> Tensor[f32]:\n"
         "    return mean(x * w, axis=None)\n" + _function(
             'x: Tensor["N", 8, f32] @shard("dp", None), w: Tensor[8, f32]',
             IN_MESH + 'grad(mse, wrt="w")(x, w)\n', "Tensor[8, f32]")
         .replace("@kernel\n", "\n@kernel\n"),
         "7:13: grad of a mean over a dim split over mesh axis 'dp'"),
    ],
)  # fmt: skip
def test_bad_meshes_shards_and_collectives_are_errors_at_their_line(
    source: str, message: str
) -> None:
    assert any(e.startswith(message) for e in _errors(source)), _errors(source)


MPIRUN = shutil.which("mpirun")


def _mpirun(n: int, *args: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mpi4py", reason="mpi4py is not installed")
    if MPIRUN is None:
        pytest.skip("mpirun (OpenMPI) is not installed")
    env = dict(
        os.environ,
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
        PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    )
    command = [
        MPIRUN,
        "-n",
        str(n),
        "--oversubscribe",
        sys.executable,
        "-m",
        "mpi4py",
        str(HERE / "mpi" / "meshes.py"),
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.execute
@pytest.mark.parametrize("processes", [2, 4])
def test_collectives_mlp_and_step_on_mpi_processes(processes: int) -> None:
    done = _mpirun(processes)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ok: {processes} processes" in done.stdout


@pytest.mark.execute
def test_a_rank_that_dies_stops_every_rank() -> None:
    done = _mpirun(2, "die", timeout=120)
    assert done.returncode != 0


COLLECTIVES = """
@kernel
def scaled(x: Tensor["N", 8, f32]) -> Tensor["N", 8, f32]:
    with mesh(axes={"dp": 2, "tp": 2}):
        y = all_reduce(x * 2.0, axis="tp")
        z = all_gather(y, axis="dp")
        w = reduce_scatter(z, axis="dp")
        v = all_to_all(w, axis="tp")
    return v

@kernel
def sums(x: Tensor["B", "D", f32] @shard("dp", None), y: Tensor["B", "E", f32] @shard("dp", None)
         ) -> tuple[Tensor["D", f32], Tensor["E", f32]]:
    with mesh(axes={"dp": 2, "tp": 2}, deterministic=True):
        a = sum(x, axis=0)
        b = sum(y, axis=0)
    return a * 2.0, b * 2.0
"""


def _nccl() -> Path | None:
    try:
        import nvidia.nccl
    except ImportError:
        return None
    return Path(next(iter(nvidia.nccl.__path__)))


@pytest.mark.compile
def test_cuda_collectives_compile_and_link_against_nccl(tmp_path: Path) -> None:
    """The CUDA file's NCCL host code (on a stream of its own, a bucket, the ordered sums
    of a deterministic mesh) builds with nvcc warning-free and links against the
    nvidia-nccl-cu13 wheel; NVRTC, which skips it, still compiles the kernels."""
    program = tessera.compile(COLLECTIVES, "scaled.tsr", target="cuda")
    scaled, sums = program.ir("meta")["functions"]
    assert [(c["kind"], c["after"], c["wait_before"]) for c in scaled["collectives"]] == [
        ("all_reduce", 1, None), ("all_gather", 1, None), ("reduce_scatter", 1, None),
        ("all_to_all", 1, None),
    ]  # fmt: skip
    # the two sums' all-reduce is one bucket, which the kernel after it waits for
    (bucket,) = sums["collectives"]
    assert bucket["after"] == bucket["wait_before"] > 0, bucket
    assert bucket["reads"] == ["%a", "%b"] and len(bucket["writes"]) == 2, bucket
    # deterministic: gathered into a scratch buffer of both devices' blocks, then summed
    # in rank order by a kernel, as on MPI
    assert bucket["scratch"] == "2*D + 2*E" and scaled["collectives"][0]["scratch"] is None
    assert "tessera_combine_on(scratch + 2*D, y1, static_cast<size_t>(E), n, 0, stream)" in (
        program.source
    )
    assert "cudaStreamWaitEvent(stream, ready, 0)" in program.source
    assert "cudaEventRecord(done, stream)" in program.source
    with pytest.raises(RuntimeError, match="runs collectives"):
        from tessera.runtime.cuda import load

        load(program.source, program.ir("meta"))
    nvcc, nccl = shutil.which("nvcc"), _nccl()
    if nvcc is None or nccl is None:
        pytest.skip("needs nvcc and the nvidia-nccl-cu13 wheel")
    source = tmp_path / "scaled.cu"
    source.write_text(program.source, encoding="utf-8")
    library = tmp_path / "scaled.so"
    done = subprocess.run(
        [nvcc, "-arch=sm_80", "-std=c++17", "-shared", "-Xcompiler", "-fPIC,-Wall,-Wextra",
         "-Werror", "all-warnings", f"-I{nccl / 'include'}", str(source),
         f"-L{nccl / 'lib'}", "-l:libnccl.so.2", "-o", str(library)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    symbols = subprocess.run(["nm", "-D", str(library)], capture_output=True, text=True).stdout
    assert all(f"T tessera_scaled_k{i}" in symbols for i in (1, 2, 3, 4))
    assert f"T {bucket['symbol']}" in symbols
    assert "U ncclAllReduce" in symbols and "U ncclSend" in symbols


def test_a_gather_along_another_dim_is_an_error_on_cuda() -> None:
    source = COLLECTIVES.replace('all_gather(y, axis="dp")', 'all_gather(y, axis="dp", dim=1)')
    source = source.replace('reduce_scatter(z, axis="dp")', "reduce_scatter(z, axis='dp', dim=1)")
    with pytest.raises(tessera.CompileError) as info:
        tessera.compile(source, "bad.tsr", target="cuda")
    assert "on NCCL it runs along dim 0 only" in str(info.value)
    tessera.compile(source, "good.tsr", target="cpu")  # MPI regroups: any dim
