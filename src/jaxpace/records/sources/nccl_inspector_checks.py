"""NCCL Inspector records that need more than one line to judge: communicator lifetimes
(a `coll_sn` that restarts) and message sizes that differ between a collective's ranks."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["UNEQUAL_SIZES_RATIO", "lifetime_notes", "lifetimes", "unequal_sizes"]

# A site whose ranks move message sizes this many times apart (median over its steps of
# the largest over the smallest) is evidence only: its ranks do not finish together.
UNEQUAL_SIZES_RATIO = 2.0


def lifetimes(a: dict[str, np.ndarray]) -> np.ndarray:
    """Each record's communicator lifetime: 0, and one more each time its rank's `coll_sn`
    goes back (the communicator was destroyed and re-created under the same hash), in the
    order the rank's log holds them."""
    if a["sn"].size == 0:
        return np.zeros(0, np.int64)
    r_span = int(a["rank"].max()) + 1
    key = a["comm"] * r_span + a["rank"]
    order = np.argsort(key, kind="stable")  # file order within each (communicator, rank)
    k, sn = key[order], a["sn"][order]
    back = np.zeros(k.size, np.int64)
    back[1:] = (k[1:] == k[:-1]) & (sn[1:] < sn[:-1])
    life = np.cumsum(back)
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    life -= np.repeat(life[starts], np.diff(np.r_[starts, k.size]))
    out = np.empty_like(life)
    out[order] = life
    return out


def lifetime_notes(p: Any, a: dict[str, np.ndarray], life: np.ndarray) -> list[str]:
    """One note per communicator whose `coll_sn` restarted (re-created under its hash)."""
    notes = []
    if life.size == 0 or not life.any():
        return notes
    n_comm = len(p.comm_meta)
    most = np.zeros(n_comm, np.int64)
    np.maximum.at(most, a["comm"], life)
    for i in np.flatnonzero(most).tolist():
        meta = p.comm_meta[i]
        notes.append(
            f"communicator {meta['id']} ({meta['name']}) was re-created {int(most[i])} "
            f"time(s) (its ranks' `coll_sn` restarted): {int(most[i]) + 1} lifetimes, kept "
            "apart and analyzed one after the other (steps count on)."
        )
    return notes


def unequal_sizes(
    a: dict[str, np.ndarray],
    site: np.ndarray,
    step: np.ndarray,
    keep: np.ndarray,
    sites: list[str],
) -> dict[str, dict[str, Any]]:
    """`{site: {"no_culprit": why}}` for the sites whose ranks move different message
    sizes in one collective (`coll_msg_size_bytes`, e.g. an uneven all-to-all).

    The clock-free rule (the rank with the shortest time inside arrived last) holds only
    when a collective's ranks finish together; a rank that moves less data finishes sooner
    without having arrived later, so such a site is evidence only: the report names no
    culprit from it and says why (normalizing by size would need each rank's bandwidth,
    which the logs do not give).
    """
    out: dict[str, dict[str, Any]] = {}
    ok = keep & (a["msg"] >= 0)
    if not ok.any():
        return out
    s, k, m = site[ok], step[ok], a["msg"][ok]
    span = int(k.max()) + 1
    uniq, inv = np.unique(s * span + k, return_inverse=True)
    lo = np.full(uniq.size, np.iinfo(np.int64).max)
    hi = np.zeros(uniq.size, np.int64)
    np.minimum.at(lo, inv, m)
    np.maximum.at(hi, inv, m)
    ratio = hi / np.maximum(lo, 1)
    s_of = uniq // span
    for j in np.unique(s_of).tolist():
        r = ratio[s_of == j]
        if float(np.median(r)) > UNEQUAL_SIZES_RATIO:
            sel = inv[s_of[inv] == j]
            out[sites[j]] = {
                "no_culprit": (
                    f"the site is evidence only: its ranks move {int(lo[sel].min())} to "
                    f"{int(hi[sel].max())} bytes in one collective (`coll_msg_size_bytes`; the "
                    f"median step's largest is {float(np.median(r)):.0f}x its smallest), and a "
                    "rank that moves less data finishes sooner without having arrived later, "
                    "so the shortest time inside does not mark the last arrival. Name the "
                    "straggler from a collective whose ranks move equal sizes (`site=`)"
                )
            }
    return out
