"""Trees of files written byte for byte the same every time: repro packs and bundles.

A pack is a mapping of relative paths to bytes. ``write_pack`` writes it as a
directory, or as a ``.tar.gz`` (or ``.tgz``) archive when the path ends so. The same
mapping gives the same bytes: the archive's members are sorted, their times, owners
and the gzip header's time are zero, and a directory holds nothing else, so that a
pack can be compared, hashed and checked in.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from .files import write_file

__all__ = ["MANIFEST", "PackError", "write_pack", "read_pack", "is_archive", "manifest"]

#: The file every pack holds: each other file's SHA-256 and size. A directory that has
#: one was written by Tessera, and ``write_pack`` may replace it.
MANIFEST = "manifest.json"

#: Files a pack marks executable (a script that replays the run).
_EXECUTABLE = (".sh",)


class PackError(OSError):
    """A pack cannot be written or read there; the message names the path and why."""


def is_archive(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an archive (``.tar.gz``, ``.tgz``) rather than a directory."""
    return str(path).endswith((".tar.gz", ".tgz"))


def manifest(files: Mapping[str, bytes]) -> bytes:
    """The manifest of ``files``: sorted by path, as JSON."""
    entries = {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
               for name, data in sorted(files.items())}  # fmt: skip
    return (json.dumps({"files": entries}, indent=2, sort_keys=True) + "\n").encode()


def write_pack(path: str | os.PathLike[str], files: Mapping[str, bytes]) -> None:
    """Write ``files`` and their manifest to ``path`` (see the module's docstring). A
    directory that is there is replaced only if it is empty or a pack; ``PackError``
    otherwise, and for a path that cannot be written."""
    for name in files:
        parts = PurePosixPath(name).parts
        if not parts or name.startswith("/") or ".." in parts or name == MANIFEST:
            raise ValueError(f"a pack's file names are relative paths inside it: {name!r}")
    everything = {**files, MANIFEST: manifest(files)}
    try:
        if is_archive(path):
            write_file(path, _archive(everything))
        else:  # through a link to a pack, the pack it names
            _write_directory(Path(os.path.realpath(path)), everything)
    except OSError as exc:
        raise PackError(f"cannot write '{path}': {exc.strerror or exc}") from None


def read_pack(path: str | os.PathLike[str]) -> dict[str, bytes]:
    """The files of a pack (its manifest left out), after checking each against the
    manifest: a file changed or missing is a ``PackError``."""
    try:
        files = _read_archive(Path(path)) if is_archive(path) else _read_directory(Path(path))
    except (OSError, tarfile.TarError) as exc:
        raise PackError(f"cannot read the pack '{path}': {exc}") from None
    recorded = files.pop(MANIFEST, None)
    if recorded is None or manifest(files) != recorded:
        raise PackError(f"'{path}' is not a pack, or its files differ from its manifest")
    return files


def _archive(files: Mapping[str, bytes]) -> bytes:
    """The ``.tar.gz`` of ``files``: directories and files in sorted order, no times,
    no owners."""
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(_directories(files)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(_anonymous(info))
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.endswith(_EXECUTABLE) else 0o644
            tar.addfile(_anonymous(info), io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0, compresslevel=9) as gz:
        gz.write(tar_bytes.getvalue())
    return packed.getvalue()


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def _directories(files: Mapping[str, bytes]) -> set[str]:
    return {str(parent) for name in files for parent in PurePosixPath(name).parents
            if str(parent) != "."}  # fmt: skip


def _write_directory(path: Path, files: Mapping[str, bytes]) -> None:
    """Write the files to a new directory beside ``path`` and move it into place, so
    that a failure leaves the old pack (or nothing) there."""
    if path.exists() and not path.is_dir():
        raise PackError(f"cannot write '{path}': it is a file; a pack is a directory there")
    if path.is_dir() and any(path.iterdir()) and not (path / MANIFEST).is_file():
        raise PackError(f"cannot write '{path}': the directory is not empty and not a pack")
    parent = path.absolute().parent
    fresh = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=parent))
    try:
        for name, data in files.items():
            target = fresh / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            if name.endswith(_EXECUTABLE):
                target.chmod(0o755)
        fresh.chmod(0o755)
        if path.is_dir():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=parent))
            os.replace(path, old / "pack")
            os.replace(fresh, path)
            shutil.rmtree(old)
        else:
            os.replace(fresh, path)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def _read_directory(path: Path) -> dict[str, bytes]:
    return {file.relative_to(path).as_posix(): file.read_bytes()
            for file in sorted(path.rglob("*")) if file.is_file()}  # fmt: skip


def _read_archive(path: Path) -> dict[str, bytes]:
    files = {}
    with tarfile.open(path, mode="r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile():
                handle = tar.extractfile(member)
                assert handle is not None
                files[member.name] = handle.read()
    return files
