"""Regular-file-only I/O: bounded input that never blocks, and the one atomic writer.

Every file `jaxpace report` reads goes through `open_regular`: a FIFO, a
device (`/dev/zero`, also through a symlink), a socket or a directory is
refused with a message saying what it is, instead of hanging in `open()` or
reading without end; `read_capped` reads at most a given number of bytes.

Every file jaxpace writes (records, stall records, the report's HTML, trace
and JSON, `jaxpace simulate`'s outputs) goes through `write_atomic`: a
temporary file beside the target, flushed to disk, then one rename. A failed
write (a full disk) leaves the earlier file whole and says which path and
which OS error; a symlink (dangling or not), device, FIFO, socket or
directory at the target is refused, never written through.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, BinaryIO

from jaxpace.errors import RecordsError

__all__ = [
    "MAX_PROCESS_COUNT",
    "check_declared_count",
    "check_output_path",
    "check_replaceable",
    "file_kind",
    "make_dirs",
    "path_kind",
    "open_regular",
    "read_capped",
    "write_atomic",
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

    The report checks its output paths with this before analyzing: the same
    test `write_atomic` applies before it writes (`check_replaceable`), so a
    FIFO, a device, a directory or a symlink (dangling or not) fails at once,
    naming `flag`.
    """
    try:
        check_replaceable(path, what, flag=flag)
    except OSError as e:
        raise RecordsError(str(e)) from None


def check_replaceable(
    path: str | os.PathLike, what: str = "records", *, flag: str | None = None
) -> None:
    """Raises unless `path` is missing or a regular file (a symlink is never followed).

    `flag` (e.g. `"--html"`) is the option the error tells the user to change.

    Raises:
      FileExistsError: a symlink (dangling or not), device node, FIFO or socket is there.
      IsADirectoryError: a directory is there.
      NotADirectoryError: a parent of `path` is a file.
    """
    p = os.fspath(path)
    fix = f"Remove it, or pass another path{_with(flag)}."
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    except NotADirectoryError as e:
        raise NotADirectoryError(
            f"cannot write {what} to {p!r}: a parent of it is a file, not a directory. "
            "Pick another path."
        ) from e
    except OSError as e:
        raise _failed(e, p, what, "cannot look at it", flag) from e
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(
            f"cannot write {what} to {p!r}: it is a directory. Pass a file path (inside it)."
        )
    raise FileExistsError(
        f"refusing to write {what} over {p!r}: it is {path_kind(p, mode)}, and only a regular "
        f"file (or a new path) is replaced, never written through. {fix}"
    )


def path_kind(path: str | os.PathLike, mode: int) -> str:
    """What `path` (of `lstat` mode `mode`) is, in words; a symlink says where it points.

    ("a device node", "a FIFO", "a symlink to '/dev/null', a character device",
    "a symlink to 'x', which does not exist (a dangling link)", ...)
    """
    if not stat.S_ISLNK(mode):
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            return "a device node"
        return "a FIFO" if stat.S_ISFIFO(mode) else file_kind(mode)
    try:
        target = os.readlink(path)
    except OSError:
        return "a symlink"
    try:
        kind = file_kind(os.stat(path).st_mode)
    except OSError:
        kind = "which does not exist (a dangling link)"
    return f"a symlink to {target!r}, {kind}"


def make_dirs(directory: str | os.PathLike, what: str = "records") -> None:
    """`os.makedirs(directory, exist_ok=True)` with an error that says which part is wrong."""
    d = os.fspath(directory)
    try:
        os.makedirs(d, exist_ok=True)
    except FileExistsError as e:
        raise NotADirectoryError(
            f"cannot create directory {d!r} for {what}: {d!r} or one of its "
            "parents exists and is not a directory. Pick another path."
        ) from e
    except NotADirectoryError as e:
        raise NotADirectoryError(
            f"cannot create directory {d!r} for {what}: one of its parents is a "
            "file, not a directory. Pick another path."
        ) from e
    except PermissionError as e:
        raise PermissionError(
            f"cannot create directory {d!r} for {what}: permission denied. Pick a writable path."
        ) from e


def write_atomic(
    path: str | os.PathLike,
    content: str | bytes | Callable[[IO[str]], None],
    *,
    what: str,
    flag: str | None = None,
    make_parents: bool = False,
) -> str:
    """Writes `content` to `path` through a temporary file and one rename; returns the path.

    The text (UTF-8), the bytes, or what `content(f)` writes to a text file `f`
    goes to a uniquely named temporary file beside `path`, is flushed to disk
    (`fsync`), and then replaces `path` in one rename: a reader never sees half
    a file, concurrent writers never share a temporary name (the last one
    wins), and a failed write (a full disk) leaves the earlier file whole.
    Only a regular file (or nothing) at `path` is replaced: a symlink
    (dangling or not), a device node, FIFO, socket or directory there is
    refused and left as it was (checked again just before the rename). An
    existing file's permission bits are kept; a new file gets 0o644.

    Args:
      path: the file to write.
      content: the text, the bytes, or a function that writes text to the open file.
      what: what the file is, for errors ("HTML report", "records").
      flag: the command-line option that sets `path` (e.g. `"--html"`), named in errors.
      make_parents: create missing parent directories.

    Raises:
      OSError: the write failed; the message names `what`, the path and the OS
        error (`errno` is kept, and the type: `PermissionError`, ...).
      FileExistsError, IsADirectoryError, NotADirectoryError: see `check_replaceable`.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> write_atomic(os.path.join(d, "a.txt"), "hello", what="note") == os.path.join(d, "a.txt")
    True
    >>> os.symlink(os.path.join(d, "a.txt"), os.path.join(d, "link.txt"))
    >>> write_atomic(os.path.join(d, "link.txt"), "x", what="note")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileExistsError: refusing to write note over '.../link.txt': it is a symlink to '.../a.txt', a regular file, and only a regular file (or a new path) is replaced, never written through. Remove it, or pass another path.
    """
    p = os.fspath(path)
    check_replaceable(p, what, flag=flag)
    d = os.path.dirname(p) or "."
    if make_parents:
        make_dirs(d, what)
    try:
        old = os.lstat(p)
        perm = stat.S_IMODE(old.st_mode) if stat.S_ISREG(old.st_mode) else 0o644
    except OSError:
        perm = 0o644
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(p) + ".", suffix=".tmp", dir=d)
    except OSError as e:
        raise _failed(e, p, what, f"cannot create a temporary file in {d!r}", flag) from e
    try:
        try:
            binary = isinstance(content, bytes | bytearray)
            with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
                if callable(content):
                    content(f)
                else:
                    f.write(content)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, perm)
        except OSError as e:
            raise _failed(e, p, what, "writing it failed", flag) from e
        check_replaceable(p, what, flag=flag)  # again, just before the rename
        try:
            os.replace(tmp, p)
        except OSError as e:
            raise _failed(
                e, p, what, "renaming the finished temporary file over it failed", flag
            ) from e
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p


def _with(flag: str | None) -> str:
    return f" with `{flag}`" if flag else ""


def _failed(e: OSError, path: str, what: str, stage: str, flag: str | None) -> OSError:
    """An OSError of `e`'s type and errno whose message names `what`, `path` and the OS error."""
    reason = e.strerror or str(e) or type(e).__name__
    msg = (
        f"cannot write {what} {path!r}: {stage}: {reason}. Nothing was replaced: an earlier "
        f"file at that path is left as it was. Free space or fix permissions, or pass "
        f"another path{_with(flag)}."
    )
    try:
        err = type(e)(msg)
    except Exception:  # noqa: BLE001 - an OSError subclass with another constructor
        err = OSError(msg)
    err.errno = e.errno
    return err


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
