"""Loading an ahead-of-time bundle (``tesserac bundle``; ``tessera.bundle``): the CPU
part runs from the shared object the bundle holds, without compiling anything.

``load_bundle(path)`` checks every file against the bundle's manifest and gives a
``Bundle``: ``cpu``, the loaded library (one callable per function of the ``.tsr``
file, as ``Program.load()`` gives), ``kernels``, the CPU kernels' metadata as the YAML
beside the JSON records it, ``info``, the bundle's ``bundle.json``, and ``cubin(arch)``,
the CUDA image of an arch (for ``tsrLoadModule`` or the driver's ``cuModuleLoadData``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..cachedir import cache_dir
from ..files import write_file
from ..frozen import frozen
from ..packs import PackError, is_archive, read_pack
from .cpu import CpuLibrary
from .kernel_yaml import load as load_yaml

__all__ = ["Bundle", "BundleError", "load_bundle"]

#: The bundle layout this runtime reads (``tessera.bundle.FORMAT``).
_FORMAT = 1


class BundleError(RuntimeError):
    """The path is not a bundle this runtime can load; the message says why."""


@frozen
class Bundle:
    """A loaded bundle (see the module's docstring)."""

    path: Path
    info: Mapping[str, Any]
    cpu: CpuLibrary
    kernels: list[dict[str, Any]]
    files: Mapping[str, bytes]

    def __repr__(self) -> str:
        """What the bundle holds, in a line: its files are megabytes of source and binary."""
        meta = json.loads(self.files[self.info["cpu"]["meta"]])
        names = ", ".join(f["name"] for f in meta["functions"])
        arches = ", ".join(self.info["cuda"]) or "none"
        return (
            f"<Bundle {str(self.path)!r}: functions {names}; cpu {self.info['cpu']['arch']}; "
            f"cuda {arches}>"
        )

    def cubin(self, arch: str) -> bytes:
        """The cubin built for ``arch``; ``BundleError`` where the bundle has none."""
        part = self.info["cuda"].get(arch)
        if part is None or part["binary"] is None:
            built = [a for a, p in self.info["cuda"].items() if p["binary"] is not None]
            raise BundleError(
                f"{self.path} has no cubin for {arch} (it has: {', '.join(built) or 'none'})"
            )
        return self.files[part["binary"]]


def load_bundle(path: str | Path) -> Bundle:
    """Load the bundle at ``path`` (a ``.tsrpkg`` directory, or its ``.tar.gz``)."""
    path = Path(path)
    try:
        files = read_pack(path)
    except PackError as exc:
        raise BundleError(str(exc)) from None
    if "bundle.json" not in files:
        raise BundleError(f"{path} is a pack but not a bundle: it has no bundle.json")
    info = json.loads(files["bundle.json"])
    if info.get("format") != _FORMAT:
        raise BundleError(
            f"{path} is a bundle of format {info.get('format')}; this runtime reads format "
            f"{_FORMAT}: rebuild it with this tesserac"
        )
    cpu = info["cpu"]
    meta = json.loads(files[cpu["meta"]])
    kernels = load_yaml(files[cpu["kernels"]].decode(), cpu["kernels"])
    library = path / cpu["binary"] if not is_archive(path) else _extracted(files[cpu["binary"]])
    return Bundle(path, info, CpuLibrary(library, meta), kernels, files)


def _extracted(image: bytes) -> Path:
    """The shared object of an archived bundle as a file, which the loader needs: in the
    cache folder, named by its hash."""
    target = cache_dir() / f"bundle-{hashlib.sha256(image).hexdigest()[:24]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        write_file(target, image)
    return target
