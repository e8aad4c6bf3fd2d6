"""Writing the files Tessera produces: compiled sources, loaders, schedule caches.

Every writer goes through ``write_file``, because the path a user names can be
anything: ``-o /dev/null`` run as root must not turn the device into a regular
file, ``-o link.cu`` must write the file the link points to, and a new file must
get the permissions its directory and umask give, as ``cc -o`` does.
"""

from __future__ import annotations

import contextlib
import os
import stat

__all__ = ["write_file", "is_special"]


def write_file(path: str | os.PathLike[str], content: str | bytes) -> None:
    """Write ``content`` (text as UTF-8, newlines as given) to ``path``.

    A regular file, or a path where nothing is yet, is replaced atomically: the
    content goes to a temporary file beside it that is renamed over it, so that a
    reader sees the old file or the new one, never half of one. It is not forced to
    disk (no ``fsync``, which can cost tens of milliseconds a file): like a C
    compiler's, the output can be made again from its source. The new file keeps the
    mode of the file it replaces; a file that did not exist gets ``0o666`` less the
    umask (and the directory's default ACL).
    A symbolic link is followed: its target is replaced and the link stays.
    Anything else (a device such as ``/dev/null``, ``/dev/stdout``, a FIFO) is
    opened and written directly, never replaced. ``OSError`` says why a path
    cannot be written.
    """
    data = content.encode("utf-8") if isinstance(content, str) else content
    mode = _mode(path)
    if mode is not None and not stat.S_ISREG(mode):
        # Opened by the name given, not its real path: /dev/stdout resolves through
        # /proc to names such as "pipe:[1234]" that only the kernel can open.
        with open(path, "wb") as handle:
            handle.write(data)
        return
    _replace(os.path.realpath(path), data, None if mode is None else stat.S_IMODE(mode))


def is_special(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (its links followed) is there and is not a regular file: a device,
    a FIFO, a directory. ``write_file`` writes such a path directly; a writer that would
    read, lock or move the file first must leave it alone too."""
    mode = _mode(path)
    return mode is not None and not stat.S_ISREG(mode)


def _mode(path: str | os.PathLike[str]) -> int | None:
    """``st_mode`` of what ``path`` names; None when nothing is there yet, or only a
    dangling link (whose target ``write_file`` creates)."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None


def _replace(target: str, data: bytes, mode: int | None) -> None:
    """Write ``data`` to a temporary file beside ``target`` and rename it over ``target``."""
    fd, tmp = _create_beside(target)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _create_beside(target: str) -> tuple[int, str]:
    """A new file in ``target``'s directory, created with mode ``0o666`` so that the
    kernel applies the umask and default ACL exactly as for the file itself
    (``tempfile.mkstemp`` would create it ``0o600``). ``O_EXCL`` never opens a file or
    link that is already there."""
    directory, name = os.path.split(target)
    tmp = os.path.join(directory, f".{name}.{os.urandom(8).hex()}.tmp")
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), tmp
