"""The launcher's output side: whole lines per stream, prefixed, with a bounded tail per rank."""

from __future__ import annotations

import collections
import os
import stat
from typing import BinaryIO, TextIO

from jaxpace.errors import ConfigError
from jaxpace.records.safe_io import path_kind

__all__ = ["MAX_LINE_BYTES", "OutputSink", "RankTail", "open_output_file", "read_available"]

# A line longer than this is passed on in pieces of this size (nothing is
# dropped; only the piece boundaries are not the child's).
MAX_LINE_BYTES = 64 * 1024


def open_output_file(path: str | os.PathLike) -> TextIO:
    """Opens the launcher's `--output-file` for writing, truncated; never blocks.

    Only a regular file or a new path is accepted: a FIFO (opening it would
    block before any rank starts, past `--timeout`), a device (`/dev/full`), a
    socket, a directory or a symlink (dangling or not) is refused with a
    `ConfigError` naming `--output-file`. The open itself is `O_NONBLOCK` and
    `O_NOFOLLOW`, and what was opened is checked again (`fstat`) before it is
    truncated, so a file swapped in between is refused too.
    """
    p = os.fspath(path)
    fix = "Pass a regular file or a new path with `--output-file`."
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise ConfigError(
            f"`--output-file` {p!r} cannot be used: {e.strerror or e}. {fix}"
        ) from None
    if mode is not None and not stat.S_ISREG(mode):
        raise ConfigError(_not_regular(p, path_kind(p, mode), fix))
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(p, flags, 0o644)
    except OSError as e:
        raise ConfigError(
            f"`--output-file` {p!r} cannot be opened for writing: {e.strerror or e}. {fix}"
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(_not_regular(p, path_kind(p, mode), fix))
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "w", encoding="utf-8")
    except OSError as e:
        os.close(fd)
        raise ConfigError(
            f"`--output-file` {p!r} cannot be written: {e.strerror or e}. {fix}"
        ) from None
    except BaseException:
        os.close(fd)
        raise


def _not_regular(path: str, kind: str, fix: str) -> str:
    return (
        f"`--output-file` {path!r} is {kind}, not a regular file; the launcher writes its "
        f"output only to a regular file or a new path (checked before any rank starts). {fix}"
    )


class RankTail:
    """The last lines of one rank, bounded in lines and bytes; counts what it let go."""

    def __init__(self, max_lines: int, max_bytes: int) -> None:
        self.lines: collections.deque[str] = collections.deque()
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.dropped = 0

    def add(self, line: str) -> None:
        self.lines.append(line)
        self.nbytes += len(line)
        while self.lines and (len(self.lines) > self.max_lines or self.nbytes > self.max_bytes):
            self.nbytes -= len(self.lines.popleft())
            self.dropped += 1


class OutputSink:
    """Assembles each (rank, stream) into whole lines and writes them prefixed `[rank N]`.

    Every rank's stdout and stderr have their own buffer, so a line the child
    wrote to stderr in the middle of a stdout line (C++ logging, warnings) is
    never spliced into it. Each line goes, whole, to `stream` and `log`, and
    into the rank's bounded `RankTail`. When writing to `log` fails (a full
    disk), the log is no longer written and `log_error` says why (the job
    goes on: its output still reaches `stream` and the tails).
    """

    def __init__(
        self,
        num_processes: int,
        stream: TextIO | None,
        log: TextIO | None,
        *,
        tail_lines: int,
        tail_bytes: int,
    ) -> None:
        self.stream = stream
        self.log = log
        self.tails = [RankTail(tail_lines, tail_bytes) for _ in range(num_processes)]
        self.log_error: str | None = None
        self._partial: dict[tuple[int, int], bytes] = {}

    def feed(self, rank: int, key: int, data: bytes) -> None:
        """Adds bytes read from one stream of `rank`; emits every whole line in hand."""
        buf = self._partial.get((rank, key), b"") + data
        while True:
            nl = buf.find(b"\n")
            if nl < 0 and len(buf) < MAX_LINE_BYTES:
                break
            cut = nl + 1 if 0 <= nl < MAX_LINE_BYTES else MAX_LINE_BYTES
            self._emit(rank, buf[:cut])
            buf = buf[cut:]
        self._partial[(rank, key)] = buf

    def close(self, rank: int, key: int) -> None:
        """End of one stream: emits its last, unterminated line, if any."""
        buf = self._partial.pop((rank, key), b"")
        if buf:
            self._emit(rank, buf)

    def flush_all(self) -> None:
        for rank, key in list(self._partial):
            self.close(rank, key)

    def _emit(self, rank: int, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip("\n").rstrip("\r")
        self.tails[rank].add(line)
        text = f"[rank {rank}] {line}\n"
        if self.stream is not None:
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):
                pass
        if self.log is not None:
            try:
                self.log.write(text)
                self.log.flush()
            except (OSError, ValueError) as e:
                self.log_error = getattr(e, "strerror", None) or str(e) or type(e).__name__
                self.log = None  # the caller closes the file


def read_available(f: BinaryIO) -> bytes | None:
    """What a non-blocking pipe holds now: bytes, `b""` at EOF, None if nothing yet."""
    try:
        return os.read(f.fileno(), 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""
