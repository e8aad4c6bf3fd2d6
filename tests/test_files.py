"""``tessera.files.write_file``: how every output file is written.

Nothing here writes to a device: the device case is a FIFO, or a regular file
in ``tmp_path`` that ``os.stat`` is made to call a character device
(``tests/special_files.py``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.files import write_file

from .special_files import make_fifo, stat_as_device

pytestmark = pytest.mark.unit


@pytest.fixture
def umask() -> Iterator[None]:
    """Run under umask 027, whatever the caller's."""
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def test_a_new_file_gets_the_mode_the_umask_gives(tmp_path: Path, umask: None) -> None:
    write_file(tmp_path / "new.cu", "text\n")
    assert (tmp_path / "new.cu").read_bytes() == b"text\n"
    assert stat.S_IMODE((tmp_path / "new.cu").stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["new.cu"]  # no temporary left


def test_a_replaced_file_keeps_its_mode_and_is_a_new_inode(tmp_path: Path) -> None:
    old = tmp_path / "old.cu"
    old.write_text("old")
    old.chmod(0o640)
    inode = old.stat().st_ino
    write_file(old, b"new \xff")
    assert old.read_bytes() == b"new \xff"
    assert stat.S_IMODE(old.stat().st_mode) == 0o640
    assert old.stat().st_ino != inode  # replaced by a rename, not rewritten in place


def test_a_symlink_is_followed_and_kept(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "out.cu"
    target.write_text("old")
    link = tmp_path / "link.cu"
    link.symlink_to(Path("real") / "out.cu")  # relative, as links in a checkout are
    write_file(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(Path("real") / "out.cu")
    assert target.read_text() == "new"


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.cu"
    link.symlink_to(tmp_path / "made.cu")
    write_file(link, "new")
    assert link.is_symlink() and (tmp_path / "made.cu").read_text() == "new"


def test_a_fifo_is_written_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    reader = make_fifo(fifo)
    write_file(fifo, "through the pipe\n")
    assert reader.text() == "through the pipe\n"
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_device_is_written_in_place_never_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/dev/null`` as root: the node must stay. A regular file stands in for it, with
    ``os.stat`` saying it is a character device, so that no real device is touched."""
    device = tmp_path / "null"
    device.write_text("previous content")
    inode = device.stat().st_ino
    stat_as_device(monkeypatch, device)
    write_file(device, "output")
    monkeypatch.undo()
    assert device.stat().st_ino == inode and device.read_text() == "output"
    assert [p.name for p in tmp_path.iterdir()] == ["null"]


@pytest.mark.parametrize(
    ("where", "error"),
    [
        ("missing/dir/out.cu", FileNotFoundError),
        ("file/out.cu", NotADirectoryError),
        ("adir", IsADirectoryError),
    ],
)
def test_a_path_that_cannot_be_written_raises(
    tmp_path: Path, where: str, error: type[OSError]
) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "adir").mkdir()
    with pytest.raises(error):
        write_file(tmp_path / where, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "file"]
