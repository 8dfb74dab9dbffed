"""The launcher's output side: whole lines per stream, prefixed, with a bounded tail per rank."""

from __future__ import annotations

import collections
import os
from typing import BinaryIO, TextIO

__all__ = ["MAX_LINE_BYTES", "OutputSink", "RankTail", "read_available"]

# A line longer than this is passed on in pieces of this size (nothing is
# dropped; only the piece boundaries are not the child's).
MAX_LINE_BYTES = 64 * 1024


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
    into the rank's bounded `RankTail`.
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
        for out in (self.stream, self.log):
            if out is not None:
                try:
                    out.write(text)
                    out.flush()
                except (OSError, ValueError):
                    pass


def read_available(f: BinaryIO) -> bytes | None:
    """What a non-blocking pipe holds now: bytes, `b""` at EOF, None if nothing yet."""
    try:
        return os.read(f.fileno(), 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""
