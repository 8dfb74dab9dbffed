"""Program executions of a run's records: raw execution ids numbered 0, 1, ... in order.

A source that knows which execution of the program each record ran in (XLA's run id:
the native probes read it in every handler, `jax.profiler` traces carry it as
`run_id`) gives it as a raw id per record. `number_executions` turns those ids into
the `execution` column the report folds a step by (`report/stages/whole.py`):

- Per process, its executions in order: its distinct ids by their first arrival on
  that process (its own clock; never compared across processes).
- Across processes: by value when the ids agree (JAX gives the k-th execution of a
  multi-device program the same run id on every process: the program's fingerprint
  plus a call count). They agree when every process's sequence is a run of
  consecutive ids of the longest one (a process whose ring or trace lost earlier
  executions holds a later run of them). Otherwise by order: the k-th execution on
  process p is the k-th on process q (processes that number their ids
  independently), and the note says so.
- Ids must be usable: on each rank an id's records are consecutive in time (an id
  seen again after another one is an id reused, e.g. a single-device program's
  constant run id). When they are not, no column is made and the note says why; the
  report then folds by step counts.
"""

from __future__ import annotations

import numpy as np

__all__ = ["REUSED_NOTE", "number_executions", "partial_note"]

REUSED_NOTE = (
    "the records' execution ids repeat on a rank after other ids (an id reused, "
    "e.g. a single-device program's), so they do not say which execution a record "
    "ran in; the whole step folds the sites by their step counts instead."
)


def partial_note(missing: int, total: int) -> str:
    """The note when `missing` of `total` step records have no execution id (not used)."""
    return (
        f"{missing} of {total} step records have no `execution` id (the io_callback "
        "probes do not know it); the whole step folds the sites by their step counts."
    )


def number_executions(
    ids: np.ndarray, process: np.ndarray, rank: np.ndarray, arrive_ns: np.ndarray
) -> tuple[np.ndarray | None, str | None]:
    """The execution (0, 1, ... in order) of each record from its raw id, and a note
    (None when the ids matched by value); (None, why) when the ids are not usable."""
    ids = np.asarray(ids, np.int64)
    n = ids.size
    if n == 0:
        return np.zeros(0, np.int64), None
    process = np.asarray(process, np.int64)
    rank = np.asarray(rank, np.int64)
    order = np.lexsort((np.asarray(arrive_ns, np.int64), rank, process))
    p, r, k = process[order], rank[order], ids[order]
    start = np.ones(n, bool)
    start[1:] = (p[1:] != p[:-1]) | (r[1:] != r[:-1]) | (k[1:] != k[:-1])
    blocks = np.stack([p[start], r[start], k[start]], axis=1)
    if np.unique(blocks, axis=0).shape[0] != blocks.shape[0]:
        return None, REUSED_NOTE
    seqs = _sequences(process, ids, np.asarray(arrive_ns, np.int64))
    by_value = _by_value(seqs)
    if by_value is not None:
        ref = np.sort(by_value)
        pos = np.argsort(by_value)
        return pos[np.searchsorted(ref, ids)].astype(np.int64), None
    out = np.empty(n, np.int64)
    for proc, seq in seqs.items():
        sel = process == proc
        srt = np.argsort(seq)
        out[sel] = srt[np.searchsorted(seq[srt], ids[sel])]
    return out, (
        "the processes' execution ids differ (numbered on each process independently), so "
        "executions are matched by order: the k-th execution on one process is the k-th on "
        "every other."
    )


def _sequences(process: np.ndarray, ids: np.ndarray, arrive: np.ndarray) -> dict[int, np.ndarray]:
    """Per process, its distinct ids ordered by their first arrival on it."""
    order = np.argsort(process, kind="stable")
    p, k, t = process[order], ids[order], arrive[order]
    out: dict[int, np.ndarray] = {}
    bounds = np.flatnonzero(np.diff(p)) + 1
    for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), p.size], strict=True):
        uniq, inv = np.unique(k[lo:hi], return_inverse=True)
        first = np.full(uniq.size, np.iinfo(np.int64).max)
        np.minimum.at(first, inv, t[lo:hi])
        out[int(p[lo])] = uniq[np.argsort(first, kind="stable")]
    return out


def _by_value(seqs: dict[int, np.ndarray]) -> np.ndarray | None:
    """The longest sequence, when every other one is a run of consecutive ids of it."""
    ref = max(seqs.values(), key=len)
    srt = np.argsort(ref)
    for seq in seqs.values():
        at = np.searchsorted(ref[srt], seq)
        if (at >= ref.size).any() or (ref[srt][np.minimum(at, ref.size - 1)] != seq).any():
            return None
        pos = srt[at]
        if seq.size > 1 and (np.diff(pos) != 1).any():
            return None
    return ref
