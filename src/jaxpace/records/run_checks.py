"""What the records' headers say of a whole run: missing processes, truncation, how many ranks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxpace.errors import RecordsError

__all__ = ["check_truncated", "missing_note", "rank_bound", "truncation_notes"]


def rank_bound(headers: tuple[dict, ...], granularity: str) -> int | None:
    """How many ranks the headers say the run has (ranks are 0 .. bound - 1), or None
    when they do not say: one per process (`process` granularity), else the processes
    times the most devices a process has (`device`: shards over the whole mesh at most)."""
    if not headers:
        return None
    count = int(headers[0]["process_count"])
    if granularity == "process":
        return count
    devices = [h.get("local_devices") for h in headers]
    if not all(isinstance(d, list) and d for d in devices):
        return None
    return count * max(len(d) for d in devices)


def missing_note(process_count: int | None, by_proc: Mapping[int, Any]) -> str | None:
    """The PARTIAL note for processes the headers announce but no file holds (or None).

    Lists at most 20 of them, never building a set of `process_count` items.
    """
    if process_count is None:
        return None
    n_missing = process_count - len(by_proc)  # every index is < process_count
    if not n_missing:
        return None
    shown = []
    for p in range(process_count):
        if p not in by_proc:
            shown.append(p)
            if len(shown) == 20:
                break
    more = f", and {n_missing - len(shown)} more" if n_missing > len(shown) else ""
    return (
        f"PARTIAL: records of {n_missing} of {process_count} processes are "
        f"missing (process {', '.join(map(str, shown))}{more}); their ranks are "
        "absent, so lateness is relative to the ranks that reported."
    )


def check_truncated(t: Any, where: str) -> None:
    """The header's `truncated` field: `{"capacity": int, "first_step": {site: int}}`."""
    ok = (
        isinstance(t, Mapping)
        and isinstance(t.get("capacity"), int)
        and not isinstance(t.get("capacity"), bool)
        and isinstance(t.get("first_step"), Mapping)
        and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for v in t["first_step"].values()
        )
    )
    if not ok:
        raise RecordsError(
            f"{where}: header field `truncated` must be "
            '`{"capacity": N, "first_step": {"site": step, ...}}` (docs/records.md), got '
            f"{str(t)[:80]!r}. The header is corrupt; fix it or point at the run's own files."
        )


def truncation_notes(headers: tuple[dict, ...]) -> list[str]:
    """One `TRUNCATED:` note when any process kept only the last `capacity` steps of a site."""
    first: dict[str, int] = {}
    caps = set()
    for h in headers:
        t = h.get("truncated")
        if t:
            caps.add(int(t["capacity"]))
            for site, step in t["first_step"].items():
                first[str(site)] = max(first.get(str(site), 0), int(step))
    if not first:
        return []
    where = "; ".join(
        f"`{site}` from step {step} (steps 0-{step - 1} dropped)"
        for site, step in sorted(first.items())[:8]
    )
    more = f"; and {len(first) - 8} more sites" if len(first) > 8 else ""
    return [
        f"TRUNCATED: the records hold only the last {'/'.join(map(str, sorted(caps)))} steps "
        f"per site and rank (the ring buffer's `capacity`): {where}{more}. The report covers "
        "the steps kept. To keep more, pass `jp.Pacer(capacity=...)` or "
        "`jp.configure(capacity=...)` (memory grows with it, docs/records.md), or export "
        "more often."
    ]
