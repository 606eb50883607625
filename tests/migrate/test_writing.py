"""migrate writes only onto a regular file or a new path (apexlite.migrate.writing): `-o` onto a device node,
a FIFO, a socket or a directory, and `--in-place` through a symlink to one, are refused in one line with the
README's exit status, and the thing is left exactly as it was (same inode, same type, nothing written)."""
import os
import socket
import stat
from pathlib import Path

import pytest

from apexlite.migrate import cli
from apexlite.migrate.writing import WriteError, write_atomically

GOLDEN = Path(__file__).with_name("golden")
SCRIPT = GOLDEN / "o1_runtime_device.in.py"
WRITE_FAILED, BAD_INPUT = 3, 2


def _fifo(path):
    os.mkfifo(path)


def _char_device(path):
    """A character device node with /dev/null's numbers, made in the test's own folder (never /dev/null)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")


def _socket(path):
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # the socket file stays


def _directory(path):
    path.mkdir()
    (path / "keep.txt").write_text("kept\n")


# (kind, maker, stat test, the words the one-line error uses)
SPECIAL = [
    ("fifo", _fifo, stat.S_ISFIFO, "a FIFO"),
    ("char_device", _char_device, stat.S_ISCHR, "a character device"),
    ("socket", _socket, stat.S_ISSOCK, "a socket"),
    ("directory", _directory, stat.S_ISDIR, "a directory"),
]
IDS = [kind for kind, *_ in SPECIAL]
NOT_FOLDERS = [case for case in SPECIAL if case[0] != "directory"]  # `-o DIR` means "into DIR" (its own test)
NOT_FOLDER_IDS = [kind for kind, *_ in NOT_FOLDERS]


def _identity(path):
    status = os.lstat(path)
    return status.st_ino, status.st_mode, status.st_rdev, status.st_size


def one_line_error(capsys):
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("apexlite migrate: ")
    assert "Traceback" not in captured.err
    return captured


@pytest.mark.parametrize("kind,make,is_kind,words", NOT_FOLDERS, ids=NOT_FOLDER_IDS)
def test_output_onto_a_special_file_is_refused_and_left_as_it_was(tmp_path, capsys, kind, make, is_kind, words):
    target = tmp_path / "out.py"
    make(target)
    before = _identity(target)
    assert cli.main([str(SCRIPT), "-o", str(target)]) == WRITE_FAILED
    captured = one_line_error(capsys)
    assert f"cannot write {target}: it is {words};" in captured.err and "nothing written" in captured.err
    assert _identity(target) == before and is_kind(os.lstat(target).st_mode)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.py"]  # no temporary left behind


def test_output_into_a_folder_whose_entry_is_a_folder_is_refused(tmp_path, capsys):
    """`-o DIR` writes DIR/<script name>; that entry too must be a regular file or new."""
    (tmp_path / SCRIPT.name).mkdir()
    assert cli.main([str(SCRIPT), "-o", str(tmp_path)]) == WRITE_FAILED
    assert "it is a directory;" in one_line_error(capsys).err
    assert (tmp_path / SCRIPT.name).is_dir() and not any((tmp_path / SCRIPT.name).iterdir())


@pytest.mark.parametrize("kind,make,is_kind,words", SPECIAL, ids=IDS)
def test_write_atomically_refuses_every_special_destination(tmp_path, kind, make, is_kind, words):
    target = tmp_path / "out.py"
    make(target)
    before = _identity(target)
    with pytest.raises(WriteError, match=f"it is {words}; migrate writes only onto a regular file or a new path"):
        write_atomically(str(target), b"x = 1\n")
    assert _identity(target) == before and is_kind(os.lstat(target).st_mode)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.py"]


@pytest.mark.parametrize("kind,make,is_kind,words", NOT_FOLDERS, ids=NOT_FOLDER_IDS)
def test_output_through_a_symlink_to_a_special_file_is_refused(tmp_path, capsys, kind, make, is_kind, words):
    target = tmp_path / "special"
    make(target)
    link = tmp_path / "out.py"
    link.symlink_to(target)
    before = _identity(target)
    assert cli.main([str(SCRIPT), "-o", str(link)]) == WRITE_FAILED
    assert f"it is {words} (through a symlink to {target})" in one_line_error(capsys).err
    assert _identity(target) == before and link.is_symlink()


@pytest.mark.parametrize("kind,make,is_kind,words", NOT_FOLDERS, ids=NOT_FOLDER_IDS)
def test_in_place_through_a_symlink_to_a_special_file_is_refused(tmp_path, capsys, kind, make, is_kind, words):
    target = tmp_path / "special"
    make(target)
    link = tmp_path / "train.py"
    link.symlink_to(target)
    before = _identity(target)
    assert cli.main([str(link), "--in-place"]) == BAD_INPUT  # read first: not a regular file is bad input
    captured = one_line_error(capsys)
    assert f"is {words}, not a Python script" in captured.err
    assert _identity(target) == before and link.is_symlink()


def test_a_regular_file_and_a_new_path_are_written(tmp_path, capsys):
    existing = tmp_path / "existing.py"
    existing.write_text("old\n")
    existing.chmod(0o640)
    assert cli.main([str(SCRIPT), "-o", str(existing)]) == 0
    assert cli.main([str(SCRIPT), "-o", str(tmp_path / "new.py")]) == 0
    assert existing.read_bytes() == (tmp_path / "new.py").read_bytes() == (GOLDEN / "o1_runtime_device.out.py").read_bytes()
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640


def test_a_file_swapped_for_a_fifo_while_writing_is_not_replaced(tmp_path, monkeypatch):
    from apexlite.migrate import writing

    target = tmp_path / "out.py"
    target.write_text("old\n")
    real_fsync = writing.os.fsync

    def swap_then_sync(descriptor):
        real_fsync(descriptor)
        target.unlink()
        os.mkfifo(target)

    monkeypatch.setattr(writing.os, "fsync", swap_then_sync)
    with pytest.raises(WriteError, match="it is a FIFO"):
        write_atomically(str(target), b"x = 1\n")
    assert stat.S_ISFIFO(os.lstat(target).st_mode)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.py"]


def test_several_files_to_a_fifo_say_what_it_is(tmp_path, capsys):
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "train.py").write_bytes(SCRIPT.read_bytes())
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    assert cli.main([str(folder), "-o", str(fifo)]) == BAD_INPUT
    assert "-o names a folder (this is a FIFO); nothing written" in one_line_error(capsys).err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
