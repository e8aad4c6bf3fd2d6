"""Shared fixtures and options: --update-golden, --fuzz-long, hypothesis profiles."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

#: The compiler checks its own work as it goes (tessera/checks.py), here and in every
#: process a test starts.
os.environ["TESSERA_CHECKS"] = "1"

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.tsr"))
SEEDS = sorted((ROOT / "tests" / "seeds").glob("*.tsr"))
#: Every example and library file, relative to the repository (a backend compiles them all).
SOURCES = [str(p.relative_to(ROOT)) for p in EXAMPLES] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "tessera/stdlib").glob("*.tsr")
)
#: Files whose kernels fit an arch only at a head dim known when they compile: at one
#: known only at run time their head-dim tile is the widest, 128, and FlashAttention-2's
#: backward kernels (in f32) then exceed gfx90a's 64 KiB of LDS, which is an error at
#: the kernel's line that says to give the head dim (-D D=64). What a sweep passes them.
FIXED_HEAD_DIM = {
    ("hip", f"tessera/stdlib/{name}.tsr"): {"D": 64}
    for name in ("attention_stats", "attention_dq", "attention_dkdv")
}

#: SOURCES as the parameters of a sweep that puts each file through a toolchain: the
#: library's files are the exhaustive tier's (make test-exhaustive), the examples, which
#: instantiate the library's kernels, make test's.
COMPILED_SOURCES = [
    p if p.startswith("examples/") else pytest.param(p, marks=pytest.mark.exhaustive, id=p)
    for p in SOURCES
]

#: Examples per fuzz test: six fuzz tests give 1,200 cases, and --fuzz-long fifty times
#: that (10,000 mutants of the examples, seed snippets and library kernels alone).
FUZZ_EXAMPLES = 200

settings.register_profile(
    "ci",
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
settings.load_profile("ci")

#: One build cache for the whole run, shared by its xdist workers (they inherit the
#: controller's environment: a kernel two workers compile is built once, and builds are
#: atomic renames) and by no other run, so each run checks cold builds and leaves the
#: user's own cache alone. The controller removes it at the end.
RUN_CACHE = Path(tempfile.gettempdir()) / f"tessera-tests-{os.getpid()}"
if "TESSERA_CACHE_DIR" not in os.environ:
    os.environ["TESSERA_CACHE_DIR"] = str(RUN_CACHE)


#: Test modules whose tests share a module-scoped build per parameter (the file of every
#: library function, built for each target: g++ spends a minute on the CPU's), by the
#: test id's brackets: under ``--dist loadgroup`` each such group runs on one xdist
#: worker, which builds once, while the other runs other tests.
SHARED_BUILDS = ("tests/test_library_kernels.py::",)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` grouping SHARED_BUILDS by parameter: xdist's own
    ``xdist_group`` mark renames the test ids, which pytest 9 no longer lets it do."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedBuilds(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(SHARED_BUILDS) and nodeid.endswith("]"):
                return nodeid.split("::")[0] + nodeid[nodeid.index("[") :]
            return nodeid

    return SharedBuilds(config, log)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite golden files from the current output (review the diff before committing)",
    )
    parser.addoption(
        "--fuzz-long",
        action="store_true",
        help="run the fuzz tier with fifty times the examples",
    )
    parser.addoption(
        "--debug-examples",
        action="store_true",
        help="run every example under --debug on the CPU and OpenCL against a plain build",
    )
    parser.addoption(
        "--fuzz-shards",
        type=int,
        default=1,
        help="split each fuzz test's examples over N test cases, so that pytest -n runs "
        "them on N cores (the total stays the same)",
    )


def pytest_configure(config: pytest.Config) -> None:
    shards = max(1, config.getoption("--fuzz-shards"))
    examples = (50 if config.getoption("--fuzz-long") else 1) * FUZZ_EXAMPLES
    settings.register_profile(
        "run", parent=settings.get_profile("ci"), max_examples=-(-examples // shards)
    )
    settings.load_profile("run")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput") and os.environ["TESSERA_CACHE_DIR"] == str(
        RUN_CACHE
    ):
        shutil.rmtree(RUN_CACHE, ignore_errors=True)


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))
