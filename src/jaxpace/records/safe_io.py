"""Bounded input for the report: regular files only, opened without blocking, read with a cap.

Every file `jaxpace report` reads goes through `open_regular`: a FIFO, a
device (`/dev/zero`, also through a symlink), a socket or a directory is
refused with a message saying what it is, instead of hanging in `open()` or
reading without end; `read_capped` reads at most a given number of bytes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from jaxpace.errors import RecordsError

__all__ = [
    "MAX_PROCESS_COUNT",
    "check_declared_count",
    "check_output_path",
    "file_kind",
    "open_regular",
    "read_capped",
]

# The largest `process_count` a header may declare. JAX jobs run at most tens of
# thousands of processes; a larger count is a corrupt or hostile header, refused
# before anything is sized from it.
MAX_PROCESS_COUNT = 1 << 20

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a `st_mode` is, in words ("a regular file", "a FIFO (named pipe)", ...)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def open_regular(path: str | os.PathLike, what: str) -> BinaryIO:
    """Opens `path` for binary reading if (after symlinks) it is a regular file.

    The open itself never blocks (`O_NONBLOCK`, so a FIFO without a writer
    cannot hang it); anything but a regular file raises `RecordsError`
    naming `what`, the path and what it is.

    >>> open_regular("/dev/null", "records file")
    Traceback (most recent call last):
    ...
    jaxpace.errors.RecordsError: records file /dev/null is a character device, not a regular file; jaxpace report reads only regular files. Point it at the files the run wrote.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise RecordsError(f"cannot read {what} {p}: {e.strerror or e}.") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise RecordsError(
                f"{what} {p} is {file_kind(mode)}, not a regular file; jaxpace report "
                "reads only regular files. Point it at the files the run wrote."
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: str | os.PathLike, what: str, cap_bytes: int) -> bytes:
    """The bytes of regular file `path`, refusing (`RecordsError`) one longer than `cap_bytes`.

    Reads at most `cap_bytes + 1` bytes whatever the file claims or holds.
    """
    with open_regular(path, what) as f:
        data = f.read(cap_bytes + 1)
    if len(data) > cap_bytes:
        raise RecordsError(
            f"{what} {path} is larger than {cap_bytes} bytes, the most jaxpace report "
            "reads from such a file; it is not one the run wrote, or it is corrupt."
        )
    return data


def check_output_path(path: str | os.PathLike, what: str, flag: str) -> None:
    """Refuses (`RecordsError`) to write over anything but a regular file or a new path.

    Writing to a FIFO would block forever, and to a device (also through a
    symlink) would write into it; the report checks its output paths first.
    """
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return  # a new file (or a dangling symlink: the directory's owner's choice)
    except OSError as e:
        raise RecordsError(f"cannot write {what} {p}: {e.strerror or e}.") from None
    if not stat.S_ISREG(mode):
        raise RecordsError(
            f"{what} {p} is {file_kind(mode)}, not a regular file; jaxpace report writes "
            f"only regular files. Remove it, or pass another path with `{flag}`."
        )


def check_declared_count(value: int, key: str, where: str, *, at_least: int = 1) -> None:
    """Refuses a count a file declares that no real run has (`RecordsError` naming it).

    Counts read from a header (`process_count`) must lie in
    `[at_least, MAX_PROCESS_COUNT]` before anything is sized from them.
    """
    if not at_least <= value <= MAX_PROCESS_COUNT:
        raise RecordsError(
            f"{where}: `{key}` is {value}, expected an integer in [{at_least}, "
            f"{MAX_PROCESS_COUNT}] (and above every `process_index`). The header is corrupt "
            "or was not written by jaxpace; fix it or point at the run's own files."
        )
