"""Reading the lines of one records file into a `records._Builder`: per line, or fast by columns.

The per-line reader (`json.loads`, then `builder.add`) is the reference; the fast
reader parses the step lines the runtime writes straight from the bytes with
NumPy and hands every other line to the per-line one (tests/records/test_records_fast.py
checks they agree). Files are opened with `safe_io.open_regular`: regular files
only, never blocking in `open()`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.errors import RecordsError
from jaxpace.records.format import INT_STEP_FIELDS, step_record
from jaxpace.records.safe_io import open_regular

# `builder` below is a `jaxpace.records.reader._Builder` (not imported: records imports this).
_Builder = Any

__all__ = ["MAX_LINE_BYTES", "read_file"]

# Longest records line accepted. A step line is ~200 bytes and a header with
# rank groups for 1024 ranks well under 1 MiB; a longer line is not a records
# line, and it is refused after reading at most this much of it.
MAX_LINE_BYTES = 8 * 1024 * 1024


def read_file(builder: _Builder, path: Path) -> None:
    builder.sources.append(str(path))
    with open_regular(path, "records file") as f:
        _read_lines(builder, path, f)


def _too_long(where: str) -> RecordsError:
    return RecordsError(
        f"{where}: line is longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB; records "
        "lines are short JSON objects (docs/records.md). This is not a jaxpace records "
        "file, or it is corrupt; remove that line or point at the run's own files."
    )


def _one_line(builder: _Builder, path: Path, i: int, raw: bytes, first_seen: bool) -> bool:
    """Reads line `i` (bytes `raw`, with its newline if it has one) of `path` the
    per-line way: `json`, then `builder.add`. Returns whether the header was seen."""
    where = f"{path}:{i}"
    if len(raw) > MAX_LINE_BYTES:
        raise _too_long(where)
    line = raw.decode("utf-8", errors="replace")
    if not line.strip():
        return first_seen
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        if not raw.endswith(b"\n"):  # only the last line can lack it: cut short
            builder.partial = True
            builder.notes.append(
                f"PARTIAL: {where}: last line is cut short (the process was probably "
                "killed while writing); skipped it."
            )
            return first_seen
        raise RecordsError(
            f"{where}: not valid JSON ({e.msg} at column {e.colno}): {line[:80]!r}. "
            "Records files hold one JSON object per line (docs/records.md); remove or "
            "fix that line."
        ) from None
    except RecursionError:
        raise RecordsError(
            f"{where}: JSON nested too deeply to read: {line[:40]!r}... Records lines "
            "are flat JSON objects (docs/records.md); remove or fix that line."
        ) from None
    if not first_seen:
        first_seen = True
        if not (isinstance(rec, Mapping) and rec.get("type") == "header"):
            raise RecordsError(
                f'{where}: first line is not a header (`"type": "header"`); this does '
                "not look like a jaxpace records file (docs/records.md)."
            )
    builder.add(rec, where)
    return first_seen


def _readline(f: Any, path: Path, size: int = MAX_LINE_BYTES + 1) -> bytes:
    try:
        return f.readline(size)  # bounded: never a whole huge line
    except OSError as e:
        raise RecordsError(f"cannot read records file {path}: {e.strerror or e}.") from None


# The fast reader (`_read_chunks`) is used after a file's header; False reads every
# line the per-line way (`_read_per_line`), the reference the fast one matches.
_FAST_READ = True


def _read_lines(builder: _Builder, path: Path, f: Any) -> None:
    fast = _FAST_READ and _FAST_LAYOUT
    i, first_seen = _read_per_line(builder, path, f, until_header=fast)
    if not first_seen:
        builder.partial = True
        builder.notes.append(f"PARTIAL: {path} is empty (the process wrote nothing).")
        return
    if fast:
        _read_chunks(builder, path, f, i)


def _read_per_line(builder: _Builder, path: Path, f: Any, *, until_header: bool):
    """Lines one at a time, to the end (or only up to the header); `(lines read, header seen)`."""
    first_seen = False
    i = 0
    while not (until_header and first_seen):
        raw = _readline(f, path)
        if not raw:
            break
        i += 1
        first_seen = _one_line(builder, path, i, raw, first_seen)
    return i, first_seen


# ---------------------------------------------------------------- fast step lines
#
# After its header, a file is read in chunks of `_CHUNK_BYTES`, and the complete
# lines of each chunk are checked and parsed at once with NumPy (no Python loop
# per line). A line is taken as parsed when it is, byte for byte, the layout the
# runtime's writer produces (`jaxpace.records.format.write_jsonl` of a `step_record`:
# its keys in its order, no spaces):
#
#   {"type":"step","site":"S","step":I,"rank":I,"process":I,"device":I|null,
#    "arrive_ns":I,"done_ns":I,"wait_ns":I,"delay_ns":I,"engaged":true|false}
#
# S printable ASCII without `"` or `\` (at most 256 bytes), each I an integer as
# JSON writes it (`-?(0|[1-9][0-9]*)`, at most 18 digits: it fits in int64), and
# nothing else on the line (no "\r"). For such a line `json.loads` and
# `_Builder.add_step` give exactly these values and no error, so the columns are
# filled from the bytes directly. Every other line (blank, CRLF, reordered or
# extra keys, floats, NaN, escapes, non-ASCII, huge or cut short) goes through
# `_one_line`, in file order, with its messages unchanged.
#
# How a line is checked, from the positions of its "\n" and of its last nine
# commas (one before each key after the site): the prefix up to the site; the
# site's bytes; a quote right before the first of those commas; at each comma the
# key `,"name":`; between it and the next comma a number (digits, an optional
# "-"), `null` for the device; `true}` or `false}` up to the "\n". These pieces
# cover the line end to end, so a line that passes is the layout exactly.

_CHUNK_BYTES = 2 * 1024 * 1024
_BLOCK_LINES = 2048
_MAX_SITE_BYTES = 256
_MAX_DIGITS = 18
_PAD = _MAX_SITE_BYTES + 64  # spare bytes after a chunk: every gather stays inside

_STEP_TEMPLATE = step_record(
    site="", step=0, rank=0, process=0, arrive_ns=0, done_ns=0, delay_ns=0, engaged=False
)
_TAIL_KEYS = tuple(_STEP_TEMPLATE)[2:]  # after "type" and "site"
_INT_KEYS = _TAIL_KEYS[:-1]  # "device" may also be null; the last is "engaged"
_PREFIX = "".join(json.dumps(_STEP_TEMPLATE, separators=(",", ":")).partition('"site":"')[:2])
_PREFIX_B = _PREFIX.encode()  # b'{"type":"step","site":"'
# The layout above, as `step_record` writes it today; if it ever changes shape,
# every line is read the per-line way (tests/records/test_records_fast.py checks it holds).
_FAST_LAYOUT = (
    tuple(_STEP_TEMPLATE)[:2] == ("type", "site")
    and _PREFIX == '{"type":"step","site":"'
    and _TAIL_KEYS[-1] == "engaged"
    and sorted(_INT_KEYS) == sorted((*INT_STEP_FIELDS, "device"))
    and all(len(k) <= 12 for k in _TAIL_KEYS)
)
_DEVICE = _INT_KEYS.index("device") if "device" in _INT_KEYS else 0
_U = np.uint64


def _word(b: bytes) -> tuple[int, int]:
    """(value, mask) of up to 8 bytes as the little-endian uint64 read where they start."""
    return int.from_bytes(b.ljust(8, b"\0"), "little"), (1 << (8 * len(b))) - 1


_KEYS_B = [f',"{k}":'.encode() for k in _TAIL_KEYS]
_VALUE_OFF = np.array([len(k) for k in _KEYS_B], dtype=np.int64)[:, None]  # comma to value
# Each `,"name":` is checked as two words, its last 8 bytes and (longer ones) its first 8.
_KEY_LAST = np.array([_word(k[-8:])[0] for k in _KEYS_B], dtype=_U)[:, None]
_LONG = np.flatnonzero([len(k) > 8 for k in _KEYS_B])
_KEY_FIRST = np.array([_word(_KEYS_B[j][:8])[0] for j in _LONG], dtype=_U)[:, None]
_PREFIX_WORDS = np.array([_word(_PREFIX_B[j : j + 8])[0] for j in (0, 8, 15)], dtype=_U)
# _KEEP[k]: the top k bytes of a word (the last k characters before where it ends).
_KEEP = np.array([((1 << (8 * k)) - 1) << (64 - 8 * k) for k in range(9)], dtype=_U)
_W_NULL, _M4 = (_U(x) for x in _word(b"null"))
_W_TRUE = _U(_word(b"true")[0])
_W_FALSE, _M5 = (_U(x) for x in _word(b"false"))
_POW10 = (_U(1), _U(10**8), _U(10**16))
# SWAR steps turning 8 digit bytes into their value (D. Lemire's 8-digit parse).
_SWAR = (
    (_U(0x0F0F0F0F0F0F0F0F), _U(2561), _U(8)),
    (_U(0x00FF00FF00FF00FF), _U(6553601), _U(16)),
    (_U(0x0000FFFF0000FFFF), _U(42949672960001), _U(32)),
)
_SITE_BYTES = re.compile(rb"[\x20-\x21\x23-\x5b\x5d-\x7e]*")  # printable, no `"` or `\`


def _words(buf: bytes | bytearray) -> np.ndarray:
    """`out[i]`: the 8 bytes of `buf` from byte `i` as a little-endian uint64 (no copy)."""
    return np.ndarray(shape=(len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))


def _digits8(x: np.ndarray) -> np.ndarray:
    """Values of words holding digits 0-9 (the first one in the lowest byte): SWAR, in place."""
    for mask, mul, shift in _SWAR:
        x &= mask
        x *= mul
        x >>= shift
    return x


def _parse_ints(
    arr: np.ndarray, words: np.ndarray, vs: np.ndarray, ve: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """JSON integers in byte spans `[vs, ve)` (fields x lines): (int64 values, valid).

    Valid: digits only, 1 to 18 of them, no leading zero (the sign is outside the
    span). A field reads as many 8-byte words as its longest value needs.
    """
    dl = ve - vs
    valid = (dl - 1).view(np.uint64) < _MAX_DIGITS  # 1 to 18 digits
    valid &= (arr[vs] != 48) | (dl == 1)  # no leading zero
    np.clip(dl, 0, _MAX_DIGITS, out=dl)
    longest = dl.max(axis=1)
    value = bad = None
    for j in range(3):
        rows = np.flatnonzero(longest > 8 * j)  # the fields with a value this long
        if not rows.size:
            break
        whole = rows.size == vs.shape[0]
        end = ve - 8 * (j + 1) if whole else ve[rows] - 8 * (j + 1)
        n_keep = dl - 8 * j if whole else dl[rows] - 8 * j
        np.clip(n_keep, 0, 8, out=n_keep)
        x = words[end]
        x ^= _U(0x3030303030303030)
        x &= _KEEP[n_keep]
        # A byte's top bit set in `y` where it was not a digit: >= 0x80 after the
        # xor, or >= 10 and so >= 0x80 once 0x76 is added (no carry out of a byte
        # below 0x80; a carry out of one above does not matter, it is flagged).
        y = x + _U(0x7676767676767676)
        y |= x
        d = _digits8(x)
        if j:
            d *= _POW10[j]
        if value is None or bad is None:
            if whole:
                value, bad = d, y
                continue
            value, bad = np.zeros(vs.shape, _U), np.zeros(vs.shape, _U)
        if whole:
            value += d
            bad |= y
        else:
            value[rows] += d
            bad[rows] |= y
    if value is None or bad is None:
        return np.zeros(vs.shape, np.int64), np.zeros(vs.shape, bool)
    bad &= _U(0x8080808080808080)
    valid &= bad == 0
    return value.view(np.int64), valid


def _fast_lines(
    buf: bytearray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, list[str]]:
    """Which lines `[starts, ends)` of `buf` (`ends` at each "\\n", the lines one
    after the other) have the writer's step layout.

    Returns:
      (fast, cols, site_code, sites): `fast` per line; `cols` the integer fields and
      `engaged` per line (meaningful where `fast`); `site_code` indexes `sites`.
    """
    n, nk = starts.shape[0], len(_TAIL_KEYS)
    arr = np.frombuffer(buf, dtype=np.uint8)
    words = _words(buf)
    lo = int(starts[0])
    commas = np.flatnonzero(arr[lo : ends[-1] + 1] == 44) + lo
    if commas.size < nk:
        return np.zeros(n, dtype=bool), {}, np.zeros(n, np.int64), []
    if commas.size % n == 0 and commas.size // n >= nk + 1:
        # Usually every line has as many commas (a line that has not fails below).
        tail = np.ascontiguousarray(commas.reshape(n, -1)[:, -nk:].T)
    else:
        last = np.searchsorted(commas, ends) - 1
        tail = commas[np.clip(last[None, :] - np.arange(nk - 1, -1, -1)[:, None], 0, None)]
    # Its last nine commas: `tail[k]` is the comma before key k (keys x lines).
    ok = words[starts] == _PREFIX_WORDS[0]
    for j, off in ((1, 8), (2, 15)):
        ok &= words[starts + off] == _PREFIX_WORDS[j]
    site_start = starts + len(_PREFIX_B)
    site_len = tail[0] - 1 - site_start
    ok &= (site_len >= 0) & (site_len <= _MAX_SITE_BYTES)
    ok &= arr[tail[0] - 1] == 34  # the site's closing quote right before its comma
    vs = tail + _VALUE_OFF  # where each value starts
    key = words[vs - 8] == _KEY_LAST
    key[_LONG] &= words[tail[_LONG]] == _KEY_FIRST
    ok &= key.all(axis=0)
    engaged, last_ok = _engaged(arr, words, vs[-1], ends)
    ok &= last_ok
    cols, valid = _values(arr, words, vs[:-1], tail[1:])
    ok &= valid
    cols["engaged"] = engaged
    site_code, sites = _site_codes(arr, words, site_start, site_len, ok)
    return ok, cols, site_code, sites


def _engaged(
    arr: np.ndarray, words: np.ndarray, vs: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The last value: (is `true`, is `true}` or `false}` right up to the "\\n")."""
    w = words[vs]
    n_left = ends - vs
    true = (n_left == 5) & ((w & _M4) == _W_TRUE)
    false = (n_left == 6) & ((w & _M5) == _W_FALSE)
    return true, (arr[ends - 1] == 125) & (true | false)


def _values(
    arr: np.ndarray, words: np.ndarray, vs: np.ndarray, ve: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The integer fields in `[vs, ve)` (fields x lines): (columns, valid per line)."""
    neg = arr[vs] == 45  # "-"
    ints, valid = _parse_ints(arr, words, vs + neg, ve)
    dev = _DEVICE
    null = (ve[dev] - vs[dev] == 4) & ((words[vs[dev]] & _M4) == _W_NULL)
    if null.any():
        valid[dev] |= null
        ints[dev] = np.where(null, -1, ints[dev])
    if neg.any():
        np.negative(ints, out=ints, where=neg)
    ok = valid.all(axis=0)
    return dict(zip(_INT_KEYS, ints, strict=True)), ok


def _site_codes(
    arr: np.ndarray, words: np.ndarray, start: np.ndarray, length: np.ndarray, ok: np.ndarray
) -> tuple[np.ndarray, list[str]]:
    """Site strings of the `ok` lines: an index per line into a list of distinct sites.

    Clears `ok` of lines whose site is not printable ASCII without `"` or `\\`.
    """
    code = np.zeros(start.shape[0], dtype=np.int64)
    idx = np.flatnonzero(ok)
    if not idx.size:
        return code, []
    s0, l0 = int(start[idx[0]]), int(length[idx[0]])
    first = bytes(arr[s0 : s0 + l0])
    same = length[idx] == l0  # the usual case: one site, compared a word at a time
    for off in range(0, l0, 8):
        want, mask = (_U(x) for x in _word(first[off : off + 8]))
        same &= (words[start[idx] + off] & mask) == want
    if same.all():
        if not _SITE_BYTES.fullmatch(first):
            ok[idx] = False
            return code, []
        return code, [first.decode("ascii")]
    width = max(int(length[idx].max()), 1)
    rows = np.lib.stride_tricks.sliding_window_view(arr, width)[start[idx]]
    rows[np.arange(width) >= length[idx][:, None]] = 0  # 0 is not a site byte
    view = np.ascontiguousarray(rows).view(f"V{width}").ravel()
    _, first_at, inv = np.unique(view, return_index=True, return_inverse=True)
    inv = inv.ravel()
    sites = [bytes(arr[start[idx[i]] : start[idx[i]] + length[idx[i]]]) for i in first_at]
    good = np.array([bool(_SITE_BYTES.fullmatch(b)) for b in sites])
    ok[idx] = good[inv]
    code[idx] = inv
    return code, [b.decode("ascii") if g else "" for b, g in zip(sites, good, strict=True)]


def _read_chunks(builder: _Builder, path: Path, f: Any, i: int) -> None:
    """Reads the rest of `f` (after line `i`) a chunk at a time, fast lines at once."""
    cap = _CHUNK_BYTES
    if builder.buffer is None:  # one buffer for all files of a load
        builder.buffer = bytearray(cap + _PAD)
    buf = builder.buffer
    have = 0  # the start of a line at buf[:have], its end not read yet
    while True:
        got = _readinto(f, path, memoryview(buf)[have:cap])
        if not got:
            if have:  # a last line without "\n"
                _one_line(builder, path, i + 1, bytes(buf[:have]), True)
            return
        end = have + got
        k = buf.rfind(b"\n", have, end)
        if k < 0 and end < cap:
            have = end
            continue
        if k < 0:  # a line longer than a chunk: its rest the bounded per-line way
            i += 1
            rest = _readline(f, path, MAX_LINE_BYTES + 1 - end)
            if end + len(rest) > MAX_LINE_BYTES:
                raise _too_long(f"{path}:{i}")
            _one_line(builder, path, i, bytes(buf[:end]) + rest, True)
            have = 0
            continue
        i = _read_block(builder, path, buf, k + 1, i)
        buf[: end - k - 1] = buf[k + 1 : end]
        have = end - k - 1


def _readinto(f: Any, path: Path, view: memoryview) -> int:
    try:
        with view:
            return f.readinto(view) or 0
    except OSError as e:
        raise RecordsError(f"cannot read records file {path}: {e.strerror or e}.") from None


def _read_block(builder: _Builder, path: Path, buf: bytearray, size: int, i: int) -> int:
    """Reads the complete lines `buf[:size]` (lines `i + 1`, ...); returns the last number.

    The lines go to `_fast_lines` `_BLOCK_LINES` at a time: its per-line arrays stay
    small enough to be reused by the allocator (larger ones cost page faults).
    """
    ends = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8, count=size) == 10)
    starts = np.concatenate([[0], ends[:-1] + 1])
    for a in range(0, ends.size, _BLOCK_LINES):
        b = min(a + _BLOCK_LINES, ends.size)
        _read_some(builder, path, buf, starts[a:b], ends[a:b], i + a)
    return i + ends.size


def _read_some(
    builder: _Builder, path: Path, buf: bytearray, starts: np.ndarray, ends: np.ndarray, i: int
) -> None:
    """Lines `[starts, ends]` of `buf` (numbers `i + 1`, ...): fast ones at once, the
    others one at a time, in file order."""
    fast, cols, site_code, sites = _fast_lines(buf, starts, ends)
    fast &= ends - starts < MAX_LINE_BYTES  # (fast lines are short; for a lower cap)
    slow = np.flatnonzero(~fast)
    if slow.size > 32 and slow.size * 8 > ends.size:  # mostly other lines: one at a time
        slow = np.arange(ends.size)
    done = 0
    for j in [*slow.tolist(), ends.size]:
        if j > done:
            _add_fast(builder, path, i + done, cols, site_code, sites, done, j)
        if j < ends.size:
            _one_line(builder, path, i + j + 1, bytes(buf[starts[j] : ends[j] + 1]), True)
        done = j + 1


def _add_fast(
    builder: _Builder,
    path: Path,
    i: int,
    cols: dict[str, np.ndarray],
    site_code: np.ndarray,
    sites: list[str],
    lo: int,
    hi: int,
) -> None:
    """Adds fast lines `lo:hi` of a block (line numbers `i + 1`, ...) to `builder`."""
    keep = (cols["wait_ns"][lo:hi] >= 0) & (cols["delay_ns"][lo:hi] >= 0)
    names = (*INT_STEP_FIELDS, "engaged", "device")
    if keep.all():  # the usual case: slices, no copies
        out = {k: cols[k][lo:hi] for k in names}
        code = site_code[lo:hi]
    else:
        # As `add_step`: dropped, counted, the first one named.
        if builder.negative_first is None:
            builder.negative_first = f"{path}:{i + 1 + int(np.argmin(keep))}"
        builder.negative += int((~keep).sum())
        out = {k: cols[k][lo:hi][keep] for k in names}
        code = site_code[lo:hi][keep]
    if len(sites) == 1:
        if code.size:
            index = builder.site_index.setdefault(sites[0], len(builder.site_index))
            out["site"] = np.full(code.size, index, dtype=np.int64)
        else:
            out["site"] = code
    else:
        lut = np.zeros(max(len(sites), 1), dtype=np.int64)
        for s in np.unique(code).tolist():
            lut[s] = builder.site_index.setdefault(sites[s], len(builder.site_index))
        out["site"] = lut[code]
    builder.add_columns(out)
