"""One source run on every target the suite can run: the CPU, OpenCL on PoCL, and CUDA
(sm_80, sm_90a), HIP and SYCL on the simulated GPU (``tests/gpusim``). A test parametrized
by ``EVERY_TARGET`` loads its functions with ``load_everywhere``."""

from __future__ import annotations

from typing import Any

import pytest

import tessera

from .gpusim import load_sycl
from .test_cuda import needs_gxx
from .test_gpusim import _library
from .test_opencl import _platform

needs_opencl = pytest.mark.skipif(
    _platform() is not None, reason=f"needs pyopencl and PoCL: {_platform()}"
)

#: (target, arch) for every target, each skipped where its tool is missing.
EVERY_TARGET = [
    pytest.param("cpu", None, marks=needs_gxx, id="cpu"),
    pytest.param("opencl", None, marks=needs_opencl, id="opencl"),
    pytest.param("cuda", "sm_80", marks=needs_gxx, id="sm_80"),
    pytest.param("cuda", "sm_90a", marks=needs_gxx, id="sm_90a"),
    pytest.param("hip", "gfx90a", marks=needs_gxx, id="gfx90a"),
    pytest.param("sycl", None, marks=needs_gxx, id="sycl"),
]


def every_target_beyond(*kept: str) -> list[Any]:
    """EVERY_TARGET with the targets other than ``kept`` (by id) in the exhaustive tier
    (make test-exhaustive): for a check whose cause lies in those targets alone."""
    return [
        p if p.id in kept else pytest.param(*p.values, marks=[*p.marks, pytest.mark.exhaustive],
                                           id=p.id)
        for p in EVERY_TARGET
    ]  # fmt: skip


def built_everywhere(source: str, *kept: str) -> Any:
    """A module-scoped fixture ``built``: ``source``'s functions built once for each
    target, those beyond ``kept`` in the exhaustive tier (``every_target_beyond``)."""
    targets = [pytest.param(p.values, marks=p.marks, id=p.id) for p in every_target_beyond(*kept)]

    @pytest.fixture(scope="module", params=targets)
    def built(request: pytest.FixtureRequest) -> Any:
        target, arch = request.param
        with pytest.MonkeyPatch.context() as monkeypatch:
            yield load_everywhere(source, target, arch, monkeypatch)

    return built


def load_everywhere(
    source: str, target: str, arch: str | None, monkeypatch: pytest.MonkeyPatch,
    defines: dict[str, int] | None = None,
) -> Any:  # fmt: skip
    """The source's functions built for ``target``: on the CPU, on PoCL, or on the
    simulated GPU."""
    if target in ("cuda", "hip"):
        return _library(source, target, arch, monkeypatch, defines=defines)
    if target == "sycl":
        return load_sycl(tessera.compile(source, filename="program.tsr", target=target,
                                         defines=defines))  # fmt: skip
    return tessera.compile(source, filename="program.tsr", target=target, defines=defines).load()
