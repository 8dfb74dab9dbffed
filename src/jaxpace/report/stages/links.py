"""Every site of a run: where the step's collective time goes, and who is late within a group.

A collective over some mesh axes runs as independent groups (an all-gather over `data` on a
(`data`, `model`) mesh is one group per `model` position), and `ppermute` is point to point:
ranks of different groups never wait for each other, so comparing their waits says nothing
about who was late. The records' header says, per site, which ranks run together
(`sites`: groups, and ppermute's (source, destination) pairs, docs/records.md); this stage
compares arrivals only within a group (the clock-free rule: within one collective, the rank
that spent the least time inside it arrived last) and names, per site:

- the latest rank of each group, when it is the latest in so many of the analyzed steps
  that chance (each of the group's ranks equally likely to be the latest) gives that
  count with probability below `ALPHA` (a binomial test), and the others lead it by a
  median above `MIN_LEAD_S` (a test made for groups as small as two; the fleet-wide
  culprit test of `stages.culprit` compares a rank with the spread of many);
- for `ppermute`, each pair's median wait of the destination (what it waited for its
  source, or the link), and the slowest pair when it stands out from the others.

Sites are listed in step order (the median, over ranks and steps, of each site's arrival
after its process's first arrival of that step: one process's own clock, so clock-free), so the
first site where a rank is late is where its lateness enters the step; later sites inherit it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from jaxpace.report.records import Records
from jaxpace.report.text import format_ms

__all__ = ["GroupLate", "LinkWait", "SiteRow", "format_site_table", "site_table"]

ALPHA = 1e-3  # per site and group, as `stages.culprit`'s culprit test
MIN_LEAD_S = 1e-3


@dataclasses.dataclass(frozen=True)
class GroupLate:
    """A rank that arrives last in its group at a site: `lead_s` is the median over steps of
    how long the others of its group had been waiting (median over them) when it arrived;
    `latest_share` the share of steps it was the latest; `p_value` the chance of that many."""

    rank: int
    group: tuple[int, ...]
    lead_s: float
    latest_share: float
    p_value: float


@dataclasses.dataclass(frozen=True)
class LinkWait:
    """One ppermute pair: the destination's median wait for its source (seconds)."""

    source: int
    destination: int
    wait_s: float


@dataclasses.dataclass(frozen=True)
class SiteRow:
    """One site. `wait_s`: median over steps of the mean wait over ranks; `share`: the
    site's part of the sum of those over all sites; `order_s`: median time into the step."""

    site: str
    kind: str | None
    groups: tuple[tuple[int, ...], ...]
    steps: int
    wait_s: float
    share: float
    order_s: float
    late: tuple[GroupLate, ...]
    links: tuple[LinkWait, ...]
    slow_link: LinkWait | None


def _site_info(recs: Records) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for h in recs.headers:
        for name, info in (h.get("sites") or {}).items():
            if isinstance(info, Mapping):
                out.setdefault(str(name), dict(info))
    return out


def _grid(recs: Records, k: int, skip: int) -> tuple[np.ndarray, ...]:
    """`(steps, ranks, wait[S, R], arrive_ns[S, R], process[S, R])` of site `k`: its
    complete steps after the first `skip`."""
    c = recs.columns
    sel = c["site"] == k
    steps, ranks = np.unique(c["step"][sel]), np.unique(c["rank"][sel])
    wait = np.full((steps.size, ranks.size), np.nan)
    arrive = np.full((steps.size, ranks.size), np.nan)
    proc = np.full((steps.size, ranks.size), -1, np.int64)
    si, ri = np.searchsorted(steps, c["step"][sel]), np.searchsorted(ranks, c["rank"][sel])
    wait[si, ri] = c["wait_ns"][sel] / 1e9
    arrive[si, ri] = c["arrive_ns"][sel]
    proc[si, ri] = c["process"][sel]
    keep = ~np.isnan(wait).any(axis=1)
    keep[: min(skip, keep.size)] = False
    return steps[keep], ranks, wait[keep], arrive[keep], proc[keep]


def _group_late(wait: np.ndarray, ranks: np.ndarray, group: Iterable[int]) -> GroupLate | None:
    cols = [int(np.flatnonzero(ranks == r)[0]) for r in group if r in ranks]
    if len(cols) < 2 or wait.shape[0] == 0:
        return None
    w = wait[:, cols]
    latest = np.argmin(w, axis=1)  # least time inside: arrived last
    counts = np.bincount(latest, minlength=len(cols))
    j = int(np.argmax(counts))
    others = np.delete(w, j, axis=1)
    lead = np.median(others, axis=1) - w[:, j]
    med = float(np.median(lead))
    n, k = w.shape[0], int(counts[j])
    p = _binomial_tail(n, k, 1.0 / len(cols))
    if p >= ALPHA or med <= MIN_LEAD_S:
        return None
    return GroupLate(int(ranks[cols[j]]), tuple(int(ranks[c]) for c in cols), med, k / n, p)


def _binomial_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how often a rank is the latest by chance."""
    return float(sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def _links(wait: np.ndarray, ranks: np.ndarray, pairs) -> tuple[list[LinkWait], LinkWait | None]:
    out = []
    for s, d in pairs or ():
        if d in ranks:
            col = int(np.flatnonzero(ranks == d)[0])
            out.append(LinkWait(int(s), int(d), float(np.median(wait[:, col]))))
    if len(out) < 2:
        return out, None
    worst = max(out, key=lambda lw: lw.wait_s)
    rest = np.median([lw.wait_s for lw in out if lw is not worst])
    slow = worst if worst.wait_s > max(MIN_LEAD_S, 3 * rest) else None
    return out, slow


def site_table(recs: Records, warmup_steps: int = 5) -> list[SiteRow]:
    """One `SiteRow` per site of `recs`, in step order (see the module docstring).

    Args:
      recs: the run's records (`jaxpace.report.load_records`).
      warmup_steps: steps skipped at the start of each site (at most a quarter of them).

    Returns:
      The rows, earliest site in the step first.
    """
    info = _site_info(recs)
    rows, first = [], {}
    grids = {}
    for k, name in enumerate(recs.sites):
        n = int(np.unique(recs.columns["step"][recs.columns["site"] == k]).size)
        grids[name] = _grid(recs, k, min(warmup_steps, n // 4))
        steps, _, _, arrive, proc = grids[name]
        # Keyed by process: one clock (ranks of different sites may be different devices).
        for i, st in enumerate(steps.tolist()):
            for j, p in enumerate(proc[i].tolist()):
                key = (st, p)
                first[key] = min(first.get(key, math.inf), arrive[i, j])
    means = {
        n: float(np.median(g[2].mean(axis=1))) if g[2].size else math.nan for n, g in grids.items()
    }
    total = float(np.nansum(list(means.values())))
    for name, (steps, ranks, wait, arrive, proc) in grids.items():
        meta = info.get(name, {})
        groups = tuple(tuple(int(r) for r in g) for g in meta.get("groups") or [ranks.tolist()])
        offs = [
            arrive[i, j] - first[(st, p)]
            for i, st in enumerate(steps.tolist())
            for j, p in enumerate(proc[i].tolist())
        ]
        late = tuple(x for x in (_group_late(wait, ranks, g) for g in groups) if x is not None)
        links, slow = _links(wait, ranks, meta.get("pairs"))
        rows.append(
            SiteRow(
                site=name,
                kind=meta.get("kind"),
                groups=groups,
                steps=int(steps.size),
                wait_s=means[name],
                share=means[name] / total if total > 0 else math.nan,
                order_s=float(np.median(offs)) / 1e9 if offs else math.nan,
                late=late,
                links=tuple(links),
                slow_link=slow,
            )
        )
    return sorted(rows, key=lambda r: (math.isnan(r.order_s), r.order_s))


def format_site_table(rows: list[SiteRow]) -> str:
    """The rows as plain text: one line per site, then who is late where."""
    lines = [
        "Sites, in step order (waits: median over steps of the mean over ranks)",
        f"{'site':<16} {'collective':<13} {'groups':>6} {'wait':>9} {'share':>6}  latest in group",
    ]
    for r in rows:
        late = ", ".join(
            f"rank {g.rank} by {format_ms(g.lead_s)} in {list(g.group)}" for g in r.late
        )
        if r.slow_link is not None:
            lw = r.slow_link
            late = (late + "; " if late else "") + (
                f"slow pair {lw.source}->{lw.destination}: waits {format_ms(lw.wait_s)}"
            )
        lines.append(
            f"{r.site:<16} {r.kind or '?':<13} {len(r.groups):>6} "
            f"{format_ms(r.wait_s):>9} {r.share:>6.0%}  {late or '-'}"
        )
    if any(len(r.groups) > 1 for r in rows):
        lines.append(
            "Ranks of different groups never wait for each other: a ranking over all ranks "
            "mixes them; this table compares arrivals within each group."
        )
    first = next((r for r in rows if r.late or r.slow_link), None)
    if first is not None:
        who = (
            f"rank {first.late[0].rank}"
            if first.late
            else f"the pair {first.slow_link.source}->{first.slow_link.destination}"
        )
        lines.append(
            f"First late in the step: {who} at `{first.site}` ({first.kind}); sites after it "
            "can inherit that lateness through the collectives between them."
        )
    return "\n".join(lines)
