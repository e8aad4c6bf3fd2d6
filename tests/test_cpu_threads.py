"""The CPU runtime's threads: a launch's programs run on the calling thread and worker
threads. Results must not depend on how many threads there are or which thread ran a
program, calls from several Python threads at once must each get their own result, and
a child of fork() must run its launches (its parent's worker threads are not there)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

import tessera
from tessera.runtime.cpu import CpuLibrary

from .conftest import ROOT
from .reference import f64

pytestmark = [
    pytest.mark.execute,
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
]

#: A product on a 2-D grid and a softmax on a 1-D grid, both of ragged sizes (their last
#: programs are short), and a 3-D grid (a batch of products).
SOURCE = """\
@kernel
def sgemm(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return a @ b

@kernel
def softmax_rows(x: Tensor["R", "C", f32]) -> Tensor["R", "C", f32]:
    return softmax_safe(x, axis=-1)

@kernel
def batched(a: Tensor["B", "M", "K", f32],
            b: Tensor["B", "K", "N", f32]) -> Tensor["B", "M", "N", f32]:
    return a @ b
"""

#: The inputs, from a fixed seed, and every kernel's outputs as raw bytes, in a process of
#: its own (the pool's size is read from OMP_NUM_THREADS when it starts).
SCRIPT = """\
import sys
import numpy as np
import tessera
sys.path.insert(0, {root!r})
from tests.test_cpu_threads import SOURCE, inputs
lib = tessera.compile(SOURCE, "threads.tsr", target="cpu").load()
out = {{name: getattr(lib, name)(*args) for name, args in inputs().items()}}
np.savez({path!r}, **out)
"""


def inputs() -> dict[str, tuple[np.ndarray, ...]]:
    """Each kernel's arguments: several programs per grid axis, none a tile multiple."""
    rng = np.random.default_rng(7)

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32)

    return {
        "sgemm": (normal(517, 301), normal(301, 563)),
        "softmax_rows": (normal(131, 1000),),
        "batched": (normal(3, 259, 70), normal(3, 70, 301)),
    }


def reference(name: str, args: tuple[np.ndarray, ...]) -> np.ndarray:
    if name == "softmax_rows":
        x = f64(args[0])
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return f64(args[0]) @ f64(args[1])


@pytest.fixture(scope="module")
def lib() -> CpuLibrary:
    return tessera.compile(SOURCE, "threads.tsr", target="cpu").load()


def test_results_do_not_depend_on_the_number_of_threads(tmp_path) -> None:
    """One thread, two, and more threads than this machine has cores give the same bits,
    and those bits are the float64 reference's to f32 accuracy."""
    results = {}
    for threads in (1, 2, 5):
        path = tmp_path / f"{threads}.npz"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT), path=str(path))],
                              env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        results[threads] = dict(np.load(path))
    for name, args in inputs().items():
        np.testing.assert_allclose(results[1][name], reference(name, args), rtol=2e-4, atol=2e-4)
        for threads in (2, 5):
            assert results[threads][name].tobytes() == results[1][name].tobytes(), (name, threads)


def test_calls_from_several_python_threads_at_once(lib: CpuLibrary) -> None:
    """Python threads calling at once (the GIL is released during a call) each get their
    own result, every element written."""
    cases = [(name, args) for name, args in inputs().items()] * 3
    expected = [getattr(lib, name)(*args) for name, args in cases]
    failures: list[BaseException] = []

    def call(i: int) -> None:
        name, args = cases[i]
        out = np.full_like(expected[i], np.nan)  # poisoned: every element must be written
        try:
            for _ in range(20):
                getattr(lib, name)(*args, out=out)
                assert out.tobytes() == expected[i].tobytes(), name
                out.fill(np.nan)
        except BaseException as error:  # reported from the main thread
            failures.append(error)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def _child(lib: CpuLibrary, queue: multiprocessing.Queue) -> None:
    name, args = "sgemm", inputs()["sgemm"]
    queue.put(getattr(lib, name)(*args).tobytes())


def test_a_forked_child_runs_its_launches(lib: CpuLibrary) -> None:
    """A child of fork() has none of its parent's worker threads: its launches must not
    wait on them."""
    expected = lib.sgemm(*inputs()["sgemm"]).tobytes()  # the parent's pool has started
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(lib, queue))
    child.start()
    got = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert got == expected
