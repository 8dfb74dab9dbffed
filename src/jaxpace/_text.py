"""Small text helpers shared by the runtime (stall messages) and the report."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ranges"]


def ranges(values: Iterable[int], *, sep: str = ", ", limit: int | None = None) -> str:
    """Collapses a sorted integer sequence into runs: `[0, 1, 2, 4, 6, 7]` -> `'0-2, 4, 6-7'`.

    `sep` joins the runs; after `limit` runs the rest is summarized as `... (N in all)`.

    >>> ranges([0, 1, 2, 4, 6, 7], sep=",")
    '0-2,4,6-7'
    >>> ranges(range(0, 20, 2), limit=2)
    '0, 2, ... (10 in all)'
    """
    vals = [int(v) for v in values]
    runs: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        runs.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    if limit is not None and len(runs) > limit:
        return sep.join(runs[:limit]) + f"{sep}... ({len(vals)} in all)"
    return sep.join(runs)
