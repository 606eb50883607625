"""Writing what migrate made: atomically, through symlinks, keeping the mode bits, or one line saying why not.

The new content goes to a temporary file in the destination's own folder, which is then renamed over the
destination: a reader sees the old file or the new one, never half of one, and a failure leaves the old
file as it was. A symlink is written through (the file it points to gets the new content and the link
stays a link). The destination's permission bits are kept; a new file gets the ones the umask gives.
Only a regular file or a new path is ever replaced: a device node, a FIFO, a socket or a directory (named
directly or through a symlink) is refused before anything is created, so `-o /dev/null` leaves the
device as it was.
"""
from __future__ import annotations

import os
import stat
import tempfile

from apexlite.script_source import file_kind


class WriteError(Exception):
    """The output could not be written; the message is one line and names the file."""


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _refuse_special(path: str, real: str) -> None:
    """WriteError unless `real` is a regular file or does not exist (lstat: `real` is already resolved)."""
    try:
        mode = os.lstat(real).st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise WriteError(f"cannot write {path}: {error.strerror or error}; nothing written") from None
    if not stat.S_ISREG(mode):
        through = f" (through a symlink to {real})" if real != os.path.abspath(path) else ""
        raise WriteError(f"cannot write {path}: it is {file_kind(mode)}{through}; migrate writes only onto a "
                         "regular file or a new path; nothing written")


def write_atomically(path: str, data: bytes, make_folders: bool = False) -> str:
    """Write `data` to `path` (through a symlink to its target); returns the file actually written."""
    real = os.path.realpath(path)
    _refuse_special(path, real)
    folder = os.path.dirname(real) or "."
    try:
        if make_folders:
            os.makedirs(folder, exist_ok=True)
        mode = os.stat(real).st_mode & 0o7777 if os.path.exists(real) else _umask_mode()
        handle, temporary = tempfile.mkstemp(prefix=".apexlite-migrate-", dir=folder)
    except OSError as error:
        raise WriteError(f"cannot write {path}: cannot create a file in {folder}: "
                         f"{error.strerror or error}; nothing written") from None
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        _refuse_special(path, real)  # it may have been replaced by something else while the data was written
        os.replace(temporary, real)
    except (OSError, WriteError) as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        if isinstance(error, WriteError):
            raise
        raise WriteError(f"cannot write {path}: {error.strerror or error}; it is unchanged") from None
    return real
