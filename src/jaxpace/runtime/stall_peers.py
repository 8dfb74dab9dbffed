"""The stall watchdog's view of its peers: who is missing, who diverged, who exited, since when.

Pure functions of the entries peers publish (`last/p{i}`) and of this
process's own record of when it left recent collectives; no key-value store
calls, no JAX.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["PeerAges", "classify", "pid_gone", "secs"]

_LEFT_HISTORY = 256  # steps per site whose end time this process remembers


def pid_gone(pid: Any) -> bool:
    """Whether process `pid` (on this host) no longer runs; False when unknown."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    try:  # an exited child not yet reaped is a zombie: gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def secs(s: float) -> str:
    """Seconds for a message: whole seconds from 10 s up, one decimal below."""
    return f"{s:.0f}" if s >= 10 else f"{s:.1f}"


def classify(me: int, site: str, step: int, counts: dict, peers: dict[int, dict | None]):
    """Sorts peers into here / missing / diverged for a stall of `me` at (site, step).

    `counts` are this process's per-site arrival counts; each peer entry carries
    its own `counts`, its last `site`/`step` and `state` ("in" a collective or
    "left" it). Returns `(here, missing, diverged)`: lists of `(process, text)`.
    """
    here, missing, diverged = [], [], []
    for p, e in sorted(peers.items()):
        if p == me:
            continue
        gone = bool(e) and (e.get("exited") or e.get("closed"))
        verb = "exited" if e and e.get("exited") else "closed its pacer (or exited)"
        if not e or e.get("site") is None:
            if gone:
                missing.append((p, f"{verb} before any measured collective; it will not arrive"))
            else:
                missing.append((p, "has not reached a measured collective"))
            continue
        where = f"{e.get('site')} step {e.get('step')}"
        age = e.get("age_s")
        ago = f", {secs(age)} s ago" if isinstance(age, (int, float)) else ""
        if e.get("age_over"):
            ago = f", more than {secs(age)} s ago"
        pc = e.get("counts") or {}
        if gone:
            last = f"{'inside' if e.get('state') == 'in' else 'after'} {where}"
            missing.append((p, f"{verb}, last {last}{ago}; it will not arrive"))
            continue
        if e.get("state") == "in":
            if e.get("site") == site and e.get("step") == step:
                here.append((p, ""))
            else:
                diverged.append((p, f"is in the collective at {where} instead"))
            continue
        ahead = sorted(s for s, c in pc.items() if c > counts.get(s, 0))
        if pc.get(site, 0) > step or ahead:
            diff = "; ".join(
                f"{s}: {pc.get(s, 0)} arrivals vs {counts.get(s, 0)} here"
                for s in sorted(set(pc) | set(counts))
                if pc.get(s, 0) != counts.get(s, 0)
            )
            diverged.append((p, f"has already passed this collective ({diff}), last at {where}"))
        else:
            missing.append((p, f"last seen at {where}{ago}"))
    return here, missing, diverged


class PeerAges:
    """When this process left each recent step of each site, and peers' ages read off it.

    Leaving a collective is an event all its processes share (they leave
    together), so the time since a peer's last position is the time since this
    process left the same collective: no clock is compared across processes.
    """

    def __init__(self) -> None:
        self._left_at: dict[str, dict[int, float]] = {}

    def note_left(self, site: str, step: int, now: float) -> None:
        """Remembers when this process was first seen past (site, step)."""
        left = self._left_at.setdefault(site, {})
        if step not in left:
            left[step] = now
            if len(left) > _LEFT_HISTORY:
                del left[next(iter(left))]

    def age_here(self, site: Any, step: Any, now: float) -> tuple[float | None, bool]:
        """Seconds since this process left (site, step): `(age, is a lower bound)`, or None.

        Exact to one watchdog tick when this process saw that step end; a lower
        bound when it saw only a later step of the site end (the peer left the
        earlier one before).
        """
        left = self._left_at.get(site) if isinstance(site, str) else None
        if not left or not isinstance(step, int):
            return None, False
        if step in left:
            return max(0.0, now - left[step]), False
        later = [t for s, t in left.items() if s > step]
        return (max(0.0, now - min(later)), True) if later else (None, False)

    def refresh(self, peers: dict[int, dict | None], now: float, host: str) -> None:
        """Marks peers that exited, and gives every peer's last position a current age.

        A peer whose pid is gone on this host exited. An entry's published
        `age_s` is as old as the entry (processes publish at most once a second
        and an exited one never again), so the age is recomputed here from
        when this process left the same collective; a peer still inside one
        keeps its published age only if it refreshed it for this stall.
        """
        for e in peers.values():
            if not e:
                continue
            if e.get("host") == host and pid_gone(e.get("pid")):
                e["exited"] = True
            if e.get("state") == "left" or e.get("exited") or e.get("closed"):
                age, over = self.age_here(e.get("site"), e.get("step"), now)
                e["age_s"] = None if age is None else round(age, 3)
                e["age_over"] = over
            elif not e.get("answered"):
                e["age_s"] = None
