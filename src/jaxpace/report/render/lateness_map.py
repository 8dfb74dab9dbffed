"""The lateness heat map: who is late in which steps, ranks grouped by host, culprits marked.

`lateness_map` takes plain arrays (step x rank lateness, each rank's host) and the
culprits to mark, so that any estimate of lateness (one site's, or a whole step's) draws
the same picture. A cell's colour is how much later than the median rank a rank arrived,
as the decisions measure it: its lateness minus the other ranks' median in each step (a
lateness all ranks share, such as the first arrival being an extreme among thousands, is
no one's), less the median rank's mean of that. Rows are ranks grouped by host (hosts in natural name order,
ranks ascending within a host); above `MAX_ROWS` ranks a row is a host, and above
`MAX_ROWS` hosts a run of consecutive hosts, each showing its latest rank over the run
(never a mean, which would hide one late rank among thousands). Columns are steps,
binned to at most `MAX_COLS`, each the mean over its steps. The cells are one embedded
PNG; transparent boxes on top carry the hover text (per cell when there are few, else
per row), so the figure stays small at 8192 ranks.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from html import escape

import numpy as np

from jaxpace.diagnosis.stats import median_of_others
from jaxpace.report.render.svg import (
    FONT_PX,
    colorbar,
    fmt,
    index_ticks,
    raster,
    rgb,
    svg_open,
    ticks,
)
from jaxpace.report.render.text import ranges

__all__ = [
    "MAX_COLS",
    "MAX_ROWS",
    "TITLE",
    "WIDTH",
    "LatenessGrid",
    "lateness_grid",
    "lateness_map",
]

TITLE = "Lateness by host and rank over the steps"
MAX_ROWS = 128  # rows drawn at most: ranks, else hosts, else runs of hosts
MAX_COLS = 120  # step columns at most (bins of consecutive steps)
WIDTH = 900  # px: the page's width (the page scales it down in narrower windows)
CELL_TIPS = 2400  # up to this many cells, each has its own hover text; above, each row
MARK = "#d62728"  # the culprit's outline and label
_CHAR_PX = FONT_PX * 0.62  # a character's width at FONT_PX (sans-serif digits and letters)
_HOST_CHARS = 16  # longer host names are shortened in the labels (the hover has them whole)
_MARK_CHARS = 30  # and longer culprit labels


@dataclasses.dataclass(frozen=True)
class LatenessGrid:
    """What the heat map draws, before any pixel: rows, step columns and cell values.

    Attributes:
      unit: what a row is: `"rank"`, `"host"` or `"hosts"` (a run of consecutive hosts).
      values_s: (rows, columns) seconds; a row's value in a column is its latest rank's
        mean over the column's steps of its lateness minus the other ranks' median at that
        step, less the median over ranks of that mean over all the steps (NaN: no value).
      row_ranks: the ranks of each row (row order); row_hosts: the hosts of each row.
      col_steps: the first and last step number of each column.
      rank_mean_s: each row's latest rank over all the steps: (rank, its mean lateness
        over the median rank, seconds: the decisions' excess lateness over these steps).
      row_median_s: the median over the row's ranks of that mean.
      marks: (label, row indices) of every culprit to mark.
    """

    unit: str
    values_s: np.ndarray
    row_ranks: tuple[tuple[int, ...], ...]
    row_hosts: tuple[tuple[str, ...], ...]
    col_steps: tuple[tuple[int, int], ...]
    rank_mean_s: tuple[tuple[int, float], ...]
    row_median_s: tuple[float, ...]
    marks: tuple[tuple[str, tuple[int, ...]], ...]


def _natural(name: str) -> tuple:
    """Sort key that puts `node-2` before `node-10`."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def lateness_grid(
    lateness_s: np.ndarray,
    hosts: Sequence[str],
    *,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    culprit_ranks: Sequence[int] = (),
    culprit_hosts: Sequence[str] = (),
    culprit_groups: Sequence[tuple[str, Sequence[int]]] = (),
    max_rows: int = MAX_ROWS,
    max_cols: int = MAX_COLS,
) -> LatenessGrid:
    """Rows, columns and cell values of the heat map (see the module docstring).

    Args:
      lateness_s: (steps, ranks) seconds late, NaN where unknown.
      hosts: the host of each column of `lateness_s`.
      steps: the step number of each row of `lateness_s` (default 0, 1, ...).
      ranks: the rank of each column (default 0, 1, ...).
      culprit_ranks, culprit_hosts: ranks and hosts to mark, each with its own label.
      culprit_groups: other named groups to mark, as (label, ranks).

    Raises:
      ValueError: a shape that does not match, or a culprit not in the data.
    """
    lat = np.asarray(lateness_s, dtype=float)
    if lat.ndim != 2:
        raise ValueError(f"`lateness_s` must be (steps, ranks); got shape {lat.shape}.")
    S, R = lat.shape
    steps_a = np.arange(S) if steps is None else np.asarray(steps)
    ranks_a = np.arange(R) if ranks is None else np.asarray(ranks)
    col = _check_grid_input(
        lat, hosts, steps_a, ranks_a, culprit_ranks, culprit_hosts, culprit_groups
    )
    # Ranks in host order (natural names), ascending within a host.
    host_names = sorted(set(hosts), key=_natural)
    host_index = {h: i for i, h in enumerate(host_names)}
    order = sorted(range(R), key=lambda i: (host_index[hosts[i]], int(ranks_a[i])))
    lat = lat[:, order]
    ranks_o = [int(ranks_a[i]) for i in order]
    hosts_o = [hosts[i] for i in order]
    known = np.isfinite(lat)
    excess = _excess(lat, known)
    cols, mean_r, col_steps = _step_columns(excess, known, steps_a, max_cols)
    unit, bounds = _row_bounds(hosts_o, max_rows)
    row_ranks, row_hosts, rank_mean, row_median, shown = [], [], [], [], []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        row_ranks.append(tuple(ranks_o[a:b]))
        row_hosts.append(tuple(dict.fromkeys(hosts_o[a:b])))
        m = mean_r[a:b]
        k = int(np.nanargmax(m)) if np.isfinite(m).any() else 0
        shown.append(a + k)
        rank_mean.append((ranks_o[a + k], float(m[k])))
        row_median.append(float(np.nanmedian(m)) if np.isfinite(m).any() else math.nan)
    values = cols[:, shown].T if R else np.zeros((0, cols.shape[0]))
    marks = _marks(row_ranks, row_hosts, hosts, col, culprit_ranks, culprit_hosts, culprit_groups)
    return LatenessGrid(
        unit=unit,
        values_s=values,
        row_ranks=tuple(row_ranks),
        row_hosts=tuple(row_hosts),
        col_steps=col_steps,
        rank_mean_s=tuple(rank_mean),
        row_median_s=tuple(row_median),
        marks=tuple(marks),
    )


def _check_grid_input(
    lat, hosts, steps_a, ranks_a, culprit_ranks, culprit_hosts, culprit_groups
) -> dict[int, int]:
    """Shapes agree and every culprit is in the data; returns each rank's column."""
    S, R = lat.shape
    for name, got, want in (("hosts", len(hosts), R), ("ranks", ranks_a.size, R)):
        if got != want:
            raise ValueError(f"`{name}` has {got} entries; `lateness_s` has {want} ranks.")
    if steps_a.size != S:
        raise ValueError(f"`steps` has {steps_a.size} entries; `lateness_s` has {S} steps.")
    col = {int(r): i for i, r in enumerate(ranks_a)}
    for r in list(culprit_ranks) + [r for _, g in culprit_groups for r in g]:
        if int(r) not in col:
            raise ValueError(f"culprit rank {r} is not among the {R} ranks of `lateness_s`.")
    for h in culprit_hosts:
        if h not in set(hosts):
            raise ValueError(f"culprit host {h!r} is not among the hosts of `lateness_s`.")
    return col


def _excess(lat: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Lateness against the median rank, as the decisions measure it
    (`diagnosis.culprit.decide`): each step, the rank's lateness minus the other ranks'
    median (a lateness every rank shares, such as the first arrival being an extreme among
    thousands, is no one's); then less the median rank's mean of that, so a typical rank
    reads 0 on average."""
    whole = known.all(axis=1)
    excess = np.full_like(lat, np.nan)
    if whole.any():
        excess[whole] = lat[whole] - median_of_others(lat[whole])
    partial = ~whole & known.any(axis=1)
    if partial.any():  # steps with unknown ranks: against the median of the known ones
        excess[partial] = lat[partial] - np.nanmedian(lat[partial], axis=1)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        counts_r = known.sum(axis=0)
        mean_all = np.where(
            counts_r > 0, np.where(known, excess, 0.0).sum(axis=0) / counts_r, np.nan
        )
    if np.isfinite(mean_all).any():
        excess = excess - np.nanmedian(mean_all)
    return excess


def _step_columns(excess, known, steps_a, max_cols):
    """`(cols (C, R), each rank's mean, each column's (first, last) step)`: the mean over
    each bin of consecutive steps (NaN-aware)."""
    S, R = excess.shape
    C = max(min(S, max_cols), 1)
    sb = np.linspace(0, S, C + 1).astype(int)
    if S:
        zeroed = np.where(known, excess, 0.0)
        sums = np.add.reduceat(zeroed, sb[:-1], axis=0)
        counts = np.add.reduceat(known.astype(float), sb[:-1], axis=0)
        known_r = known.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            cols = np.where(counts > 0, sums / counts, np.nan)  # (C, R)
            mean_r = np.where(known_r > 0, zeroed.sum(axis=0) / known_r, np.nan)
    else:
        cols, mean_r = np.full((1, R), np.nan), np.full(R, np.nan)
    col_steps = tuple(
        (int(steps_a[a]), int(steps_a[max(b - 1, a)])) if S else (0, 0)
        for a, b in zip(sb[:-1], sb[1:], strict=True)
    )
    return cols, mean_r, col_steps


def _row_bounds(hosts_o: list[str], max_rows: int) -> tuple[str, list[int]]:
    """Rows: ranks, else hosts, else runs of consecutive hosts (a row of several ranks
    shows its latest rank over all the steps)."""
    R = len(hosts_o)
    if R <= max_rows:
        return "rank", list(range(R + 1))
    starts = [0] + [i for i in range(1, R) if hosts_o[i] != hosts_o[i - 1]]
    per = 1 if len(starts) <= max_rows else math.ceil(len(starts) / max_rows)
    return ("host" if per == 1 else "hosts"), starts[::per] + [R]


def _marks(row_ranks, row_hosts, hosts, col, culprit_ranks, culprit_hosts, culprit_groups):
    """Every culprit, on the rows holding its ranks."""
    where = {r: i for i, rr in enumerate(row_ranks) for r in rr}
    marks: list[tuple[str, tuple[int, ...]]] = []
    for r in culprit_ranks:
        marks.append((f"rank {int(r)} ({hosts[col[int(r)]]})", (where[int(r)],)))
    for h in culprit_hosts:
        rows = sorted({i for i, hh in enumerate(row_hosts) if h in hh})
        marks.append((f"host {h}", tuple(rows)))
    for label, g in culprit_groups:
        marks.append((label, tuple(sorted({where[int(r)] for r in g}))))
    return marks


def _short(name: str, most: int = _HOST_CHARS) -> str:
    """`name` in at most `most` characters (the middle elided)."""
    if len(name) <= most:
        return name
    k = (most - 1) // 2
    return name[:k] + "…" + name[-(most - 1 - k) :]


def _steps(a: int, b: int) -> str:
    return f"step {a}" if a == b else f"steps {a}-{b}"


def _row_name(g: LatenessGrid, i: int) -> str:
    """Who row `i` is, for its hover text."""
    rr, hh = g.row_ranks[i], g.row_hosts[i]
    if g.unit == "rank":
        return f"rank {rr[0]} on {hh[0]}"
    if g.unit == "host":
        return f"host {hh[0]} (ranks {ranges(rr)})"
    return f"hosts {hh[0]} to {hh[-1]} ({len(hh)} hosts, {len(rr)} ranks)"


def _late(s: float) -> str:
    """`s` seconds after (or before) the median rank, in words."""
    if not math.isfinite(s):
        return "no value"
    return f"{fmt(abs(s) * 1e3)} ms {'after' if s >= 0 else 'before'} the median rank"


def _row_tip(g: LatenessGrid, i: int, marked: dict[int, list[str]]) -> str:
    rank, mean_s = g.rank_mean_s[i]
    peak = g.values_s[i]
    j = int(np.nanargmax(peak)) if np.isfinite(peak).any() else 0
    text = _row_name(g, i) + ": "
    if g.unit == "rank":
        text += f"{_late(mean_s)} on average"
    else:
        text += (
            f"its latest rank {rank} {_late(mean_s)} on average; its median rank "
            f"{_late(g.row_median_s[i])}"
        )
    text += f"; at most {_late(float(peak[j]))} ({_steps(*g.col_steps[j])})"
    if i in marked:
        text += "; marked: " + ", ".join(marked[i])
    return text


def _cell_tip(g: LatenessGrid, i: int, j: int) -> str:
    v = float(g.values_s[i, j])
    mean = " (mean)" if g.col_steps[j][0] != g.col_steps[j][1] and math.isfinite(v) else ""
    who = _row_name(g, i) if g.unit == "rank" else f"rank {g.rank_mean_s[i][0]}"
    return f"{who}, {_steps(*g.col_steps[j])}: {_late(v)}{mean}"


def _row_labels(g: LatenessGrid, top: float, row_h: float, x: float) -> list[str]:
    """Left labels, none overlapping: rows of ranks get their host's name at the middle of
    its rows and each rank's number beside its row, or, when the rows are too thin to
    label one by one, the host's name with its rank range; rows of hosts get host names."""
    n = len(g.row_ranks)
    fit = max(int(n * row_h // (FONT_PX + 3)), 1)  # labels that fit one above the other
    out: list[str] = []

    def text(x: float, y: float, label: str) -> None:
        out.append(f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="end">{escape(label)}</text>')

    if g.unit != "rank":
        for i in index_ticks(n, fit) if fit < n else range(n):
            text(x, top + (i + 0.5) * row_h, _short(g.row_hosts[i][0]))
        return out
    groups: list[tuple[str, int, int]] = []  # (host, first row, end row)
    for i, hh in enumerate(g.row_hosts):
        if groups and groups[-1][0] == hh[0]:
            groups[-1] = (hh[0], groups[-1][1], i + 1)
        else:
            groups.append((hh[0], i, i + 1))
    per_rank = fit >= n
    shown = index_ticks(len(groups), fit) if fit < len(groups) else range(len(groups))
    for k in shown:
        name, a, b = groups[k]
        label = _short(name)
        span = ranges(tuple(r for rr in g.row_ranks[a:b] for r in rr))
        if not per_rank and len(span) <= 2 * len(str(_max_rank(g))) + 1:  # else: too long
            label += f" ({span})"
        text(x - (_rank_label_w(g) if per_rank else 0), top + (a + b) / 2 * row_h, label)
    if per_rank:
        for i in range(n):
            text(x, top + (i + 0.5) * row_h, str(g.row_ranks[i][0]))
    return out


def _max_rank(g: LatenessGrid) -> int:
    return max((r for rr in g.row_ranks for r in rr), default=0)


def _rank_label_w(g: LatenessGrid) -> float:
    """Width of the rank-number column beside rows of ranks, px."""
    return (len(str(_max_rank(g))) + 2) * _CHAR_PX


def lateness_map(
    lateness_s: np.ndarray,
    hosts: Sequence[str],
    *,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    culprit_ranks: Sequence[int] = (),
    culprit_hosts: Sequence[str] = (),
    culprit_groups: Sequence[tuple[str, Sequence[int]]] = (),
    title: str = TITLE,
) -> tuple[str, str]:
    """The heat map as an SVG element and its caption (plain text).

    Arguments as `lateness_grid`'s; `title` heads the SVG.

    >>> import numpy as np
    >>> lat = np.zeros((10, 4)); lat[:, 3] = 0.002
    >>> svg, caption = lateness_map(lat, ["a", "a", "b", "b"], culprit_ranks=[3])
    >>> svg.startswith("<svg") and "rank 3 (b)" in svg
    True
    >>> caption.split(";")[0]
    'Each row is a rank, grouped by host (2 hosts)'
    """
    g = lateness_grid(
        lateness_s, hosts, steps=steps, ranks=ranks, culprit_ranks=culprit_ranks,
        culprit_hosts=culprit_hosts, culprit_groups=culprit_groups,
    )  # fmt: skip
    n, C = g.values_s.shape
    ms = g.values_s * 1e3
    finite = ms[np.isfinite(ms)]
    # The top of the scale: the 99.5th percentile of the cells (a late rank's row reaches
    # it, the spread of the others stays in the dark half).
    vmax = float(np.quantile(finite, 0.995)) if finite.size else 1.0
    vmax = vmax if vmax > 0 else (float(finite.max()) if finite.size and finite.max() > 0 else 1.0)

    # Geometry: labels left, the cells, culprit labels right.
    n_hosts = len({h for hh in g.row_hosts for h in hh})
    max_rank = _max_rank(g)
    host_w = min(max(len(h) for hh in g.row_hosts for h in hh), _HOST_CHARS) * _CHAR_PX
    # Beside rows of ranks: a rank number per row, or a range "(4096-4103)" per host.
    rank_w = _rank_label_w(g) if g.unit == "rank" else 0
    if g.unit == "rank" and n * _row_height(n) // (FONT_PX + 3) < n:
        rank_w = (2 * len(str(max_rank)) + 4) * _CHAR_PX
    left = math.ceil(30 + host_w + rank_w + 8)
    labels = [_short(label, _MARK_CHARS) for label, _ in g.marks[:8]]
    if len(g.marks) > 8:
        labels.append(f"+{len(g.marks) - 8} more")
    right = math.ceil(max((len(s) + 3 for s in labels), default=0) * _CHAR_PX + 16) + 10
    width = WIDTH
    pw = width - left - right
    row_h = _row_height(n)
    ph = n * row_h
    top = 58.0
    height = int(math.ceil(top + ph + 50))
    ylabel = {"rank": "rank, by host", "host": "host", "hosts": "hosts"}[g.unit]
    out = svg_open(title, "", ylabel, width=width, height=height)
    out.append(f'<text x="{left + pw / 2:.1f}" y="{height - 8}" text-anchor="middle">step</text>')
    # Colour bar under the title, right-aligned with the cells.
    bar_w = 140
    unit_w = (len(fmt(vmax)) + 4) * _CHAR_PX
    bar_x = left + pw - bar_w - unit_w
    out.append(
        f'<text x="{bar_x - 16:.1f}" y="{top - 17:.1f}" text-anchor="end">'
        "after the median rank</text>"
    )
    out += colorbar(bar_x, top - 26, bar_w, vmax, "ms")

    cw = pw / max(C, 1)
    out.append(raster(left, top, pw, ph, rgb(ms / vmax)))
    # Host boundaries between rank rows (white lines), when rows are tall enough to see them.
    if g.unit == "rank" and row_h >= 4:
        for i in range(1, n):
            if g.row_hosts[i][0] != g.row_hosts[i - 1][0]:
                y = top + i * row_h
                out.append(
                    f'<line x1="{left}" y1="{y:.2f}" x2="{left + pw}" y2="{y:.2f}" '
                    'stroke="#fff" stroke-width="1.5"/>'
                )
    out += _row_labels(g, top, row_h, left - 6)
    for X, t in _step_ticks(g, left, cw, max(int(pw // 60), 2)):
        out.append(f'<text x="{X:.1f}" y="{top + ph + 16:.1f}" text-anchor="middle">{t}</text>')

    out += _hover(g, left, top, pw, row_h, cw)
    out += _culprit_marks(g, left, top, pw, row_h, height, labels)
    out.append("</svg>")
    return "\n".join(out), _caption(g, n_hosts)


def _hover(g: LatenessGrid, left: float, top: float, pw: float, row_h: float, cw: float):
    """Invisible rectangles with a title: per cell when there are few, else per row."""
    n, C = g.values_s.shape
    marked: dict[int, list[str]] = {}
    for label, rows in g.marks:
        for i in rows:
            marked.setdefault(i, []).append(label)
    tips = ['<g fill="#000" fill-opacity="0">']
    for i in range(n):
        y = top + i * row_h
        if n * C <= CELL_TIPS:
            for j in range(C):
                tips.append(
                    f'<rect x="{left + j * cw:.2f}" y="{y:.2f}" width="{cw:.2f}" '
                    f'height="{row_h:.2f}"><title>{escape(_cell_tip(g, i, j))}'
                    + (f"; {escape(_row_tip(g, i, marked))}" if j == 0 else "")
                    + "</title></rect>"
                )
        else:
            tips.append(
                f'<rect x="{left}" y="{y:.2f}" width="{pw:.2f}" height="{row_h:.2f}">'
                f"<title>{escape(_row_tip(g, i, marked))}</title></rect>"
            )
    tips.append("</g>")
    return tips


def _culprit_marks(g: LatenessGrid, left, top, pw, row_h, height, labels) -> list[str]:
    """An outline around each culprit's rows and a label to the right, never overlapping."""
    out: list[str] = []
    wanted: list[tuple[float, str]] = []
    for label, rows in g.marks[:8]:
        for a, b in _runs(rows):
            out.append(
                f'<rect x="{left - 1:.1f}" y="{top + a * row_h - 1:.2f}" width="{pw + 2:.1f}" '
                f'height="{(b - a) * row_h + 2:.2f}" fill="none" stroke="{MARK}" '
                'stroke-width="2"/>'
            )
        a, b = _runs(rows)[0] if rows else (0, 0)
        wanted.append((top + (a + b) / 2 * row_h + 4, f"◀ {_short(label, _MARK_CHARS)}"))
    wanted.sort()
    if len(g.marks) > 8:
        wanted.append((wanted[-1][0] + 1, labels[-1]))
    ys = _spread([y for y, _ in wanted], FONT_PX + 3, top + FONT_PX, height - 4.0)
    for y, (_, label) in zip(ys, wanted, strict=True):
        out.append(
            f'<text x="{left + pw + 8:.1f}" y="{y:.1f}" fill="{MARK}">{escape(label)}</text>'
        )
    return out


def _spread(ys: Sequence[float], gap: float, lo: float, hi: float) -> list[float]:
    """Sorted label positions `ys` moved as little as needed to be `gap` apart within
    [lo, hi] (down first, then up from `hi`)."""
    out: list[float] = []
    for y in ys:
        out.append(max(y, lo, out[-1] + gap) if out else max(y, lo))
    for i in range(len(out) - 1, -1, -1):
        out[i] = min(out[i], hi if i == len(out) - 1 else out[i + 1] - gap)
    return out


def _step_ticks(g: LatenessGrid, left: float, cw: float, most: int) -> list[tuple[float, int]]:
    """(x, step) of round step numbers (0, 50, 100 ...) under the columns that hold them."""
    lo, hi = g.col_steps[0][0], g.col_steps[-1][1]
    out: list[tuple[float, int]] = []
    for t in ticks(lo, hi, most) if hi > lo else [lo]:
        t = int(round(t))
        j = next((j for j, (a, b) in enumerate(g.col_steps) if a <= t <= b), None)
        if j is None:  # a gap in the steps
            continue
        a, b = g.col_steps[j]
        out.append((left + (j + (t - a + 0.5) / (b - a + 1)) * cw, t))
    return out


def _row_height(n: int) -> float:
    """Px per row: 24 for a few rows, down to 2 (128 rows: 384 px in all)."""
    return min(max(384.0 / max(n, 1), 2.0), 24.0)


def _runs(rows: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive row indices as half-open runs [a, b)."""
    out: list[tuple[int, int]] = []
    for i in rows:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def _caption(g: LatenessGrid, n_hosts: int) -> str:
    n, C = g.values_s.shape
    per = max(b - a + 1 for a, b in g.col_steps) if g.col_steps else 1
    rows = {
        "rank": f"Each row is a rank, grouped by host ({n_hosts} hosts)",
        "host": f"Each row is a host ({n_hosts} hosts), showing its latest rank",
        "hosts": (
            f"Each row is {max(len(h) for h in g.row_hosts)} consecutive hosts ({n_hosts} in "
            "all), showing their latest rank over the run"
        ),
    }[g.unit]
    cols = "each column a step" if per == 1 else f"each column the mean over up to {per} steps"
    hover = "a cell" if n * C <= CELL_TIPS else "a row"
    return (
        f"{rows}; {cols}. Colour: how much later than the median rank it arrived, as the "
        "decisions measure it (its lateness minus the other ranks' median, each step; at "
        f"or before the median: darkest); hover over {hover} for its figures."
        + (f" Outlined in red: the culprit{'s' * (len(g.marks) > 1)}." if g.marks else "")
    )
