"""Running the HIP backend's output: not yet, and never without an AMD GPU.

The generated ``.hip`` file builds with hipcc for the arch it was written for; loading
it from Python (hiprtc through hip-python) is not part of Tessera yet. ``load`` says
which of the two is missing, in one line, instead of failing somewhere inside a
driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["HipUnavailable", "load"]


class HipUnavailable(RuntimeError):
    """HIP code cannot run here; the message says why."""


def load(source: str, meta: Mapping[str, Any]) -> NoReturn:
    """Refuse to load, saying why: no AMD GPU, or no HIP runtime in Tessera yet."""
    if not Path("/dev/kfd").exists():
        raise HipUnavailable(
            f"cannot run the {meta['arch']} code of {meta['source']}: no AMD GPU is present "
            "(no /dev/kfd); the file still builds with hipcc --offload-arch="
            f"{meta['arch']}"
        )
    raise HipUnavailable(
        "running HIP code from Python is not part of Tessera yet; build the file with "
        f"hipcc --offload-arch={meta['arch']} and load it with the HIP runtime"
    )
