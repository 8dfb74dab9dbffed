"""Who takes part with whom at a measured site: the rank groups and, for `ppermute`, the pairs.

A collective over some mesh axes runs as independent groups (one per position on the other
axes, or per `axis_index_groups` entry); `ppermute` is point to point (a rank waits for its
source only). The report compares arrivals within a group, and names a slow pair, from what
this module writes into the records' header (`sites`), in the site's rank numbering.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["describe", "leaders"]


def leaders(procs: np.ndarray) -> np.ndarray:
    """`is_leader[linear shard index]`: the first shard of each process in mesh order."""
    table = np.zeros(procs.size, dtype=bool)
    seen: set[int] = set()
    for i, p in enumerate(procs.tolist()):
        if p not in seen:
            seen.add(p)
            table[i] = True
    return table


def describe(
    kind: str,
    names: tuple,
    shape: tuple,
    axes: tuple,
    procs: np.ndarray | None,
    axis_index_groups,
    perm,
) -> dict[str, Any]:
    """`{"kind", "groups", "pairs"?}` of a site, ranks as the site numbers them.

    `procs` is the process of each linear shard (process granularity: a rank is a process,
    measured at its first shard), or None (device granularity: a rank is the shard's index
    over `axes`, the same numbering in every group).
    """
    out: dict[str, Any] = {"kind": kind}
    red = [names.index(a) for a in axes]
    size = int(np.prod([shape[i] for i in red])) if red else 1
    if procs is None:
        groups = [list(g) for g in axis_index_groups] if axis_index_groups else [list(range(size))]
        out["groups"] = groups
        if perm is not None:
            out["pairs"] = [[int(s), int(d)] for s, d in perm]
        return out
    table = leaders(procs)
    by_group: dict[tuple, list[int]] = {}
    src_of = {int(d): int(s) for s, d in perm} if perm is not None else {}
    pairs = []
    for lin in np.flatnonzero(table).tolist():
        coord = np.unravel_index(lin, shape)
        rank = _axis_rank(coord, red, shape)
        key = tuple(int(c) for i, c in enumerate(coord) if i not in red)
        if axis_index_groups:
            key += (next(k for k, g in enumerate(axis_index_groups) if rank in g),)
        proc = int(procs[lin])
        by_group.setdefault(key, []).append(proc)
        if rank in src_of:
            src = list(coord)
            _set_axis_rank(src, red, shape, src_of[rank])
            pairs.append([int(procs[np.ravel_multi_index(src, shape)]), proc])
    out["groups"] = [sorted(g) for _, g in sorted(by_group.items())]
    if perm is not None:
        out["pairs"] = sorted(pairs)
    return out


def _axis_rank(coord, red, shape) -> int:
    r = 0
    for i in red:
        r = r * shape[i] + int(coord[i])
    return r


def _set_axis_rank(coord: list, red, shape, rank: int) -> None:
    for i in reversed(red):
        coord[i] = rank % shape[i]
        rank //= shape[i]
