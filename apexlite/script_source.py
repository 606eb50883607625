"""Reading a script the way Python would, without ever hanging or reading without bound.

`apexlite check` parses scripts it never runs. Whatever Python itself would run must parse here too
(a PEP 263 coding line such as latin-1, a UTF-8 byte-order mark), while anything else is refused with
one line saying why: a path that is not a regular file (a directory, a device, a FIFO, a symlink to
one; opening those can block or never end), a file over the size limit, or bytes that are not
Python source. Each refusal carries its own exit status.
"""
from __future__ import annotations

import ast
import os
import stat

MAX_SOURCE_BYTES = 16 * 1024 * 1024  # far above any real training script; bounds memory and parse time
_READ_CHUNK = 1024 * 1024


class ScriptSourceError(Exception):
    """A script could not be read as Python source; `exit_status` says which way (see `check --help`)."""

    exit_status = 2


class NotReadable(ScriptSourceError):
    """Missing, or the OS refused to open it."""

    exit_status = 2


class NotPythonSource(ScriptSourceError):
    """Not text Python would run: undecodable under its declared encoding, NUL bytes, a syntax error."""

    exit_status = 3


class NotRegularFile(ScriptSourceError):
    """A directory, device, FIFO or socket (directly or through a symlink)."""

    exit_status = 4


class TooLarge(ScriptSourceError):
    """Larger than `MAX_SOURCE_BYTES`."""

    exit_status = 5


def file_kind(mode: int) -> str:
    """`a FIFO`, `a character device`, ...: what a non-regular file is, for one-line messages."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def _check_regular(path: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise NotRegularFile(f"{path} is {file_kind(mode)}, not a Python script")


def read_source_bytes(path: str, max_bytes: int = MAX_SOURCE_BYTES) -> bytes:
    """The file's bytes, refusing non-regular files (checked before and after opening) and oversized ones."""
    try:
        _check_regular(path, os.stat(path).st_mode)  # before opening: opening a FIFO or a tape can block
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
        descriptor = os.open(path, flags)
    except FileNotFoundError:
        raise NotReadable(f"{path}: no such file") from None
    except OSError as error:
        raise NotReadable(f"{path}: {error.strerror or error}") from None
    try:
        status = os.fstat(descriptor)
        _check_regular(path, status.st_mode)  # the path may have been swapped between stat and open
        if status.st_size > max_bytes:
            raise TooLarge(f"{path} is {status.st_size} bytes; scripts over {max_bytes} bytes are not checked")
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(descriptor, min(_READ_CHUNK, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise TooLarge(f"{path} grew past {max_bytes} bytes while being read; not checked")
        return b"".join(chunks)
    except OSError as error:
        raise NotReadable(f"{path}: {error.strerror or error}") from None
    finally:
        os.close(descriptor)


def parse_script(path: str, max_bytes: int = MAX_SOURCE_BYTES) -> ast.Module:
    """The script's syntax tree, decoded as Python decodes source (coding line, BOM, else UTF-8)."""
    source = read_source_bytes(path, max_bytes)
    try:
        return ast.parse(source, filename=path)
    except SyntaxError as error:
        where = f" (line {error.lineno})" if error.lineno else ""
        raise NotPythonSource(f"{path} is not Python source Python would run: {error.msg}{where}") from None
    except (ValueError, RecursionError, MemoryError) as error:
        raise NotPythonSource(f"{path} is not Python source apexlite can parse: {error}") from None
