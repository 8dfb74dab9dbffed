"""Exporters for the monitoring tools users already run: Prometheus and TensorBoard.

Each factory returns a sink for `Pacer(sinks=[...])` / `jp.configure(sinks=[...])`.
Sinks run on the pacer's background sink thread (never inside a JAX callback):
a slow write delays only that thread, and a full queue drops summaries
(`Pacer.sink_dropped`) instead of slowing a step. Each uses the ecosystem's own
library, installed with an extra:

- `prometheus_textfile(path)`: `pip install "jaxpace[prometheus]"` (prometheus_client)
- `tensorboard(logdir)`: `pip install "jaxpace[tensorboard]"` (tensorboardX; no TensorFlow)
- `jax_monitoring()`: events in `jax.monitoring` under `/jaxpace/...` (no extra)

What a summary carries (one per measured step, site and rank of this
process): `site`, `step`, `rank`, `wait_s` (time inside the collective),
`delay_s` (pacing sleep before it), `engaged`, and, when the policy exchanges
waits in-band (`jp.adaptive`), `earliness_s`: every rank's earliness at the
previous step (the last to arrive has 0), and `step_time_s`, the exchanged
median step time. The culprit is the report's decision over the last 64
exchanged steps (late against per-step noise and outside the fleet's own
spread; `jaxpace.diagnosis.culprit`), -1 when nobody is named; it needs that
exchange: measure-only runs export -1 for it.

Cardinality does not grow with the job: each process exports only its own
ranks, and one process (process 0, unless `fleet=` says otherwise) exports
the fleet-wide view, a fixed set of values per site (`FleetView`: the
culprit, the 5 slowest ranks, quantiles of earliness). At 8192 ranks a site
has the same number of series and tags as at 16
(tests/sinks/test_sink_cardinality.py).

In a multi-process job every process writes its own file: a `{process}` in
`path` / `logdir` is replaced by the process index; without it, and with more
than one process, `.p{index}` is added before the file's suffix (Prometheus)
or `process-{index}` below the log directory (TensorBoard).

W&B has no extra: its `wandb.log` is one line,
`sinks=[lambda s: wandb.log({f"jaxpace/{s['site']}/wait_s": s["wait_s"]})]`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.diagnosis.culprit import decide_earliness
from jaxpace.errors import ConfigError
from jaxpace.runtime import monitoring as _monitoring

__all__ = [
    "FleetView",
    "JaxMonitoringSink",
    "PrometheusTextfile",
    "TensorBoardSink",
    "fleet_view",
    "jax_monitoring",
    "job_labels",
    "prometheus_textfile",
    "site_tag",
    "tensorboard",
]

WINDOW_STEPS = 64  # steps of earliness behind the culprit, the means and the fleet view
DECIDE_RANKS_PER_STEP = 1024  # the live culprit decision is re-run every ceil(R / this) steps
SLOWEST_K = 5  # the fleet view names this many slowest ranks
QUANTILES = (0.0, 0.5, 0.9, 0.99, 1.0)  # of the ranks' mean earliness, in the fleet view


def _process() -> tuple[int, int]:
    try:
        import jax

        return int(jax.process_index()), int(jax.process_count())
    except Exception:  # noqa: BLE001 - no backend yet: one process
        return 0, 1


def _need(module: str, extra: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"jaxpace.sinks needs `{module.split('.')[0]}` for this exporter: "
            f'pip install "jaxpace[{extra}]"'
        ) from e


def job_labels() -> dict[str, str]:
    """Labels every series carries: `node` (host name) and, under SLURM, `slurm_job_id`."""
    labels = {"node": socket.gethostname()}
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        labels["slurm_job_id"] = job
    return labels


def _check_fleet(fleet: Any) -> bool:
    if fleet is None:
        return _process()[0] == 0
    if not isinstance(fleet, bool):
        raise ConfigError(
            f"`fleet` must be True, False or None (process 0 only), got {fleet!r}. Pass None "
            "to write the fleet-wide view once per job."
        )
    return fleet


@dataclasses.dataclass(frozen=True)
class FleetView:
    """The job-wide view of one site, a fixed number of values at any job size.

    Attributes:
      ranks: ranks in the exchanged vector (the job's size at this site).
      culprit: the rank the report's culprit decision names over the window, or -1
        when unknown (no exchange: measure-only policies).
      culprit_last_fraction: fraction in [0, 1] of the window's steps in which
        the culprit arrived last, or -1 when unknown.
      slowest: up to `SLOWEST_K` `(rank, lateness_s)`, latest first; lateness
        is the median rank's mean earliness minus this rank's (seconds >= 0
        for ranks later than the median).
      quantiles: `{q: seconds}` of the ranks' mean earliness, for `QUANTILES`.
    """

    ranks: int = 0
    culprit: int = -1
    culprit_last_fraction: float = -1.0
    slowest: tuple[tuple[int, float], ...] = ()
    quantiles: tuple[tuple[float, float], ...] = ()


_TAG_KEEP = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.")


def site_tag(site: str) -> str:
    """The TensorBoard tag component of a site name: readable, and one-to-one.

    TensorBoard keeps only letters, digits, `_`, `.`, `-` and `/` in a tag
    (tensorboardX turns every other character into `_`, so `layer[0]` and
    `layer(0)` became one series). Here ASCII letters, digits, `_` and `.` are
    kept, `:` becomes `--`, and any other character (`/`, `-`, brackets,
    spaces, non-ASCII) becomes `-{hex code point}-`. No two sites share a tag,
    and the tag has no `/`, so the site is always one level of the tag.

    >>> site_tag("train.py:12:train_step"), site_tag("layer[0]"), site_tag("layer(0)")
    ('train.py--12--train_step', 'layer-5b-0-5d-', 'layer-28-0-29-')
    """
    out = []
    for c in str(site):
        if c in _TAG_KEEP:
            out.append(c)
        elif c == ":":
            out.append("--")
        else:
            out.append(f"-{ord(c):x}-")
    return "".join(out)


class _Window:
    """Per site: the last `WINDOW_STEPS` exchanged earliness vectors, one per step.

    Kept as a ring with running per-rank sums, so adding a step and reading the
    means cost O(ranks), not O(window x ranks): at 8192 ranks the sink thread
    keeps up with every step.
    """

    def __init__(self) -> None:
        self._buf: np.ndarray | None = None  # (WINDOW_STEPS, ranks)
        self._sums = np.zeros(0)
        self._counts = np.zeros(0, np.int64)
        self._head = 0
        self._rows = 0
        self._step_s = np.full(WINDOW_STEPS, np.nan)  # the exchanged median step time per row
        self._last: deque[int] = deque(maxlen=WINDOW_STEPS)  # the rank last at each step
        self.last_step: int | None = None
        self._adds = 0  # steps added so far
        self._decided: tuple[int, int] | None = None  # (steps added then, culprit or -1)

    def add(self, step: int, earliness: Any, step_time_s: Any = math.nan) -> bool:
        """Adds a step's vector once (each local rank carries the same one); True if new."""
        if earliness is None or step == self.last_step:
            return False
        e = np.asarray(earliness, dtype=np.float64).reshape(-1)
        fin = np.isfinite(e)
        if not (e.size and fin.any()):
            return False
        if self._buf is None or self._buf.shape[1] != e.size:  # a new layout: start over
            self._buf = np.full((WINDOW_STEPS, e.size), np.nan)
            self._sums, self._counts = np.zeros(e.size), np.zeros(e.size, np.int64)
            self._head = self._rows = 0
            self._last.clear()
            self._decided = None
        if self._rows == WINDOW_STEPS:  # evict the oldest row from the sums
            old = self._buf[self._head]
            ofin = np.isfinite(old)
            self._sums[ofin] -= old[ofin]
            self._counts -= ofin
        self._buf[self._head] = e
        self._step_s[self._head] = math.nan if step_time_s is None else float(step_time_s)
        self._sums[fin] += e[fin]
        self._counts += fin
        self._head = (self._head + 1) % WINDOW_STEPS
        self._rows = min(self._rows + 1, WINDOW_STEPS)
        self._last.append(int(np.argmin(np.where(fin, e, np.inf))))
        self.last_step = step
        self._adds += 1
        return True

    def mean(self) -> np.ndarray:
        """Each rank's mean earliness over the window (NaN where never finite)."""
        if self._buf is None:
            return np.zeros(0)
        mean = np.full(self._sums.size, np.nan)
        ok = self._counts > 0
        mean[ok] = self._sums[ok] / self._counts[ok]
        return mean

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The window's earliness rows and step times, oldest first."""
        if self._buf is None:
            return np.zeros((0, 0)), np.zeros(0)
        order = (self._head - self._rows + np.arange(self._rows)) % WINDOW_STEPS
        return self._buf[order], self._step_s[order]

    def culprit(self, mean: np.ndarray) -> tuple[int, float]:
        """(culprit, fraction of the window's steps it was last), or (-1, -1.0) for nobody.

        The culprit is the report's decision (`jaxpace.diagnosis.culprit.decide_earliness`)
        over the window: late against per-step noise and outside the fleet's own
        spread. -1 when nobody is named or nothing was exchanged (docs/api.md).
        """
        if not self._last or not np.isfinite(mean).any():
            return -1, -1.0
        # The decision costs about 0.1 s at 8192 ranks x 64 steps: above 1024 ranks it
        # is re-run every ceil(ranks / 1024) steps (8 at 8192) and reused in between.
        stride = -(-mean.size // DECIDE_RANKS_PER_STEP)
        if self._decided is None or self._adds - self._decided[0] >= stride:
            dec = decide_earliness(*self.rows())
            self._decided = (self._adds, -1 if dec is None or not dec.culprits else dec.culprits[0])
        r = int(self._decided[1])
        if r < 0:
            return -1, -1.0
        return r, sum(1 for x in self._last if x == r) / len(self._last)


def fleet_view(window: _Window, mean: np.ndarray | None = None) -> FleetView:
    """The bounded job-wide view of a site's window (see `FleetView`)."""
    mean = window.mean() if mean is None else mean
    finite = np.flatnonzero(np.isfinite(mean))
    if finite.size == 0:
        return FleetView(ranks=int(mean.size))
    culprit, frac = window.culprit(mean)
    vals = mean[finite]
    k = min(SLOWEST_K, finite.size)
    part = np.argpartition(vals, k - 1)[:k] if k < vals.size else np.arange(vals.size)
    idx = finite[part[np.argsort(vals[part], kind="stable")]]
    median = float(np.median(vals))
    q = np.quantile(vals, QUANTILES)
    return FleetView(
        ranks=int(mean.size),
        culprit=culprit,
        culprit_last_fraction=frac,
        slowest=tuple((int(r), median - float(mean[r])) for r in idx),
        quantiles=tuple(zip(QUANTILES, (float(v) for v in q), strict=True)),
    )


class PrometheusTextfile:
    """Sink writing per-site gauges in the node exporter's textfile format.

    The number of series per site does not grow with the job: each process
    writes its own ranks, and one process (process 0 unless `fleet=` says
    otherwise) writes a fixed-size fleet-wide view. Every series also carries
    `node` (host name) and, under SLURM, `slurm_job_id`. All are gauges; the
    table in docs/api.md ("Exporters") gives each one's unit and labels.

    The file is rewritten atomically by `prometheus_client.write_to_textfile`
    at most every `write_every_s` and on close.
    """

    def __init__(
        self, path: str | os.PathLike, *, write_every_s: float = 5.0, fleet: bool | None = None
    ) -> None:
        pc = _need("prometheus_client", "prometheus")
        if not (
            isinstance(write_every_s, (int, float))
            and not isinstance(write_every_s, bool)
            and write_every_s >= 0
        ):
            raise ConfigError(
                f"`write_every_s` must be a number >= 0 (seconds), got {write_every_s!r}. "
                "Pass e.g. 5.0, or 0 to write at every summary."
            )
        self._pc = pc
        self.fleet = _check_fleet(fleet)
        self.process, count = _process()
        p = os.fspath(path)
        if "{process}" in p:
            p = p.replace("{process}", str(self.process))
        elif count > 1:
            base = Path(p)
            p = str(base.with_name(f"{base.stem}.p{self.process}{base.suffix or '.prom'}"))
        self.path = p
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.labels = job_labels()
        self.write_every_s = float(write_every_s)
        self._last_write = -math.inf
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}
        self._ranks: dict[str, set[int]] = {}  # this process's ranks per site
        self._sums: dict[tuple[str, int], list[float]] = {}  # steps, wait sum, delay sum
        self.registry = pc.CollectorRegistry()
        self._g = self._gauges()

    def _gauges(self) -> dict[str, Any]:
        job = list(self.labels)
        rank, fleet = ["site", "rank", "process", *job], ["site", *job]
        specs = {
            "steps": ("jaxpace_steps_measured", "Steps measured (count)", rank),
            "wait": ("jaxpace_wait_seconds", "Wait inside the collective, last step", rank),
            "wait_mean": ("jaxpace_wait_mean_seconds", "Mean wait inside the collective", rank),
            "delay": ("jaxpace_delay_seconds", "Pacing sleep, last step", rank),
            "delay_total": ("jaxpace_delay_total_seconds", "Pacing sleep, total", rank),
            "engaged": ("jaxpace_pacing_engaged", "1 when pacing is on, else 0", rank),
            "early": (
                "jaxpace_earliness_seconds",
                f"Mean earliness over the last {WINDOW_STEPS} exchanged steps (latest rank: 0)",
                rank,
            ),
            "ranks": ("jaxpace_fleet_ranks", "Ranks in the exchange (job size)", fleet),
            "culprit": (
                "jaxpace_culprit_rank",
                f"Rank last on average over the last {WINDOW_STEPS} exchanged steps (-1: "
                "unknown, the policy does not exchange waits)",
                fleet,
            ),
            "culprit_frac": (
                "jaxpace_culprit_last_fraction",
                "Fraction of the window's steps in which the culprit arrived last (-1: unknown)",
                fleet,
            ),
            "slowest": (
                "jaxpace_slowest_rank",
                f"The k-th latest rank on average (k=1..{SLOWEST_K})",
                ["site", "k", *job],
            ),
            "slowest_late": (
                "jaxpace_slowest_lateness_seconds",
                "How much later than the median rank the k-th latest rank arrives, on average",
                ["site", "k", *job],
            ),
            "quantile": (
                "jaxpace_fleet_earliness_seconds",
                "Quantile over ranks of the mean earliness",
                ["site", "quantile", *job],
            ),
        }
        g, reg = self._pc.Gauge, self.registry
        return {k: g(name, doc, labels, registry=reg) for k, (name, doc, labels) in specs.items()}

    def __call__(self, s: dict[str, Any]) -> None:
        site, rank = str(s["site"]), int(s["rank"])
        wait, delay = float(s.get("wait_s", 0.0)), float(s.get("delay_s", 0.0))
        labels = (site, str(rank), str(self.process), *self.labels.values())
        g = self._g
        with self._lock:
            acc = self._sums.setdefault((site, rank), [0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += wait
            acc[2] += delay
            g["steps"].labels(*labels).set(acc[0])
            g["wait"].labels(*labels).set(wait)
            g["wait_mean"].labels(*labels).set(acc[1] / acc[0])
            g["delay"].labels(*labels).set(delay)
            g["delay_total"].labels(*labels).set(acc[2])
            g["engaged"].labels(*labels).set(1.0 if s.get("engaged") else 0.0)
            self._ranks.setdefault(site, set()).add(rank)
            self._windows.setdefault(site, _Window()).add(
                int(s.get("step", -1)), s.get("earliness_s"), s.get("step_time_s")
            )
            if time.monotonic() - self._last_write >= self.write_every_s:
                self._write_locked()

    def _write_locked(self) -> None:
        job = tuple(self.labels.values())
        g = self._g
        for site, win in self._windows.items():
            mean = win.mean()
            for r in sorted(self._ranks.get(site, ())):
                if r < mean.size and math.isfinite(mean[r]):
                    g["early"].labels(site, str(r), str(self.process), *job).set(float(mean[r]))
            if self.fleet:
                self._write_fleet(site, fleet_view(win, mean), job)
        self._pc.write_to_textfile(self.path, self.registry)
        self._last_write = time.monotonic()

    def _write_fleet(self, site: str, v: FleetView, job: tuple[str, ...]) -> None:
        g = self._g
        g["ranks"].labels(site, *job).set(v.ranks)
        g["culprit"].labels(site, *job).set(v.culprit)
        g["culprit_frac"].labels(site, *job).set(v.culprit_last_fraction)
        for k, (r, late) in enumerate(v.slowest, start=1):
            g["slowest"].labels(site, str(k), *job).set(r)
            g["slowest_late"].labels(site, str(k), *job).set(late)
        for q, val in v.quantiles:
            g["quantile"].labels(site, f"{q:g}", *job).set(val)

    def write(self) -> str:
        """Writes the file now; returns its path."""
        with self._lock:
            self._write_locked()
        return self.path

    def close(self) -> None:
        """Final write (the sink thread calls it when the pacer closes)."""
        self.write()


def _tag(site: str, *parts: str) -> str:
    """A TensorBoard tag of `site` (one place that builds them)."""
    return "/".join(("jaxpace", site, *parts))


class TensorBoardSink:
    """Sink writing scalars with tensorboardX's `SummaryWriter` (event files, no TensorFlow).

    Tags per site, for each rank r of this process, at each measured step:
    `jaxpace/{site}/wait_ms/rank{r}`, `.../delay_ms/rank{r}`,
    `.../engaged/rank{r}` and, when waits are exchanged, `.../earliness_ms/rank{r}`.
    The fleet-wide view (written by one process, process 0 unless `fleet=`
    says otherwise), when waits are exchanged: `.../fleet/culprit_rank`,
    `.../fleet/culprit_last_fraction`, `.../fleet/slowest{k}_rank`,
    `.../fleet/slowest{k}_lateness_ms` (k = 1..5) and
    `.../fleet/earliness_ms/q{quantile}`. The number of tags does not grow
    with the job.
    `{site}` is `site_tag(site)`: `:` shown as `--`, other characters
    TensorBoard does not allow as `-{hex}-`, so distinct sites stay distinct series.
    """

    def __init__(
        self, logdir: str | os.PathLike, *, flush_secs: int = 10, fleet: bool | None = None
    ) -> None:
        tbx = _need("tensorboardX", "tensorboard")
        self.fleet = _check_fleet(fleet)
        self.process, count = _process()
        d = os.fspath(logdir)
        if "{process}" in d:
            d = d.replace("{process}", str(self.process))
        elif count > 1:
            d = os.path.join(d, f"process-{self.process}")
        self.logdir = d
        self._writer = tbx.SummaryWriter(logdir=d, flush_secs=flush_secs)
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}

    def __call__(self, s: dict[str, Any]) -> None:
        site, rank, step = site_tag(s["site"]), int(s["rank"]), int(s["step"])
        w = self._writer
        with self._lock:
            w.add_scalar(_tag(site, "wait_ms", f"rank{rank}"), float(s["wait_s"]) * 1e3, step)
            w.add_scalar(_tag(site, "delay_ms", f"rank{rank}"), float(s["delay_s"]) * 1e3, step)
            w.add_scalar(_tag(site, "engaged", f"rank{rank}"), float(bool(s["engaged"])), step)
            early = s.get("earliness_s")
            if early is None:
                return
            if rank < len(early) and math.isfinite(early[rank]):
                w.add_scalar(_tag(site, "earliness_ms", f"rank{rank}"), early[rank] * 1e3, step)
            win = self._windows.setdefault(site, _Window())
            if (
                win.add(step, early, s.get("step_time_s")) and self.fleet
            ):  # once per step, not once per rank
                self._write_fleet(site, fleet_view(win), step)

    def _write_fleet(self, site: str, v: FleetView, step: int) -> None:
        w = self._writer
        if not v.slowest:  # nothing exchanged yet; a culprit of -1 (nobody named) is written
            return
        w.add_scalar(_tag(site, "fleet", "culprit_rank"), v.culprit, step)
        w.add_scalar(_tag(site, "fleet", "culprit_last_fraction"), v.culprit_last_fraction, step)
        for k, (r, late) in enumerate(v.slowest, start=1):
            w.add_scalar(_tag(site, "fleet", f"slowest{k}_rank"), r, step)
            w.add_scalar(_tag(site, "fleet", f"slowest{k}_lateness_ms"), late * 1e3, step)
        for q, val in v.quantiles:
            w.add_scalar(_tag(site, "fleet", "earliness_ms", f"q{q:g}"), val * 1e3, step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        """Flushes and closes the event file (the sink thread calls it at pacer close)."""
        self._writer.close()


class JaxMonitoringSink:
    """Sink recording jaxpace's events in `jax.monitoring` (names under `/jaxpace/...`).

    For each summary: the wait and the pacing delay as event durations; when
    the exchanged earliness names a new culprit (the report's decision over
    the last 64 steps), a `/jaxpace/culprit/changed` event. Listeners that JAX
    and Orbax users already register (`jax.monitoring.register_*_listener`)
    receive them on the pacer's sink thread. Names and metadata:
    `jaxpace.runtime.monitoring` and docs/api.md.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}
        self._culprit: dict[str, int] = {}

    def __call__(self, s: dict[str, Any]) -> None:
        _monitoring.record_step(s)
        early = s.get("earliness_s")
        if early is None:
            return
        site = str(s["site"])
        with self._lock:
            win = self._windows.setdefault(site, _Window())
            if not win.add(int(s.get("step", -1)), early, s.get("step_time_s")):
                return
            culprit, _ = win.culprit(win.mean())
            previous = self._culprit.get(site, -1)
            if culprit < 0 or culprit == previous:
                return
            self._culprit[site] = culprit
        _monitoring.record_culprit_change(site, culprit, previous)


def jax_monitoring() -> JaxMonitoringSink:
    """A sink recording waits, delays and culprit changes as `jax.monitoring` events.

    Off unless added (`Pacer(sinks=[jaxpace.sinks.jax_monitoring()])`): like any
    sink it makes the runtime build a summary per measured step and rank.
    No extra is needed.
    """
    return JaxMonitoringSink()


def prometheus_textfile(
    path: str | os.PathLike, *, write_every_s: float = 5.0, fleet: bool | None = None
) -> PrometheusTextfile:
    """A sink writing jaxpace's gauges to `path` for the node exporter's textfile collector.

    Point the collector at the file's directory (`--collector.textfile.directory`)
    and name the file `*.prom`. See `PrometheusTextfile` for the gauges.
    Needs `pip install "jaxpace[prometheus]"`.
    """
    return PrometheusTextfile(path, write_every_s=write_every_s, fleet=fleet)


def tensorboard(
    logdir: str | os.PathLike, *, flush_secs: int = 10, fleet: bool | None = None
) -> TensorBoardSink:
    """A sink writing per-step scalars to a TensorBoard log directory (tensorboardX).

    Needs `pip install "jaxpace[tensorboard]"`; view with `tensorboard --logdir LOGDIR`.
    """
    return TensorBoardSink(logdir, flush_secs=flush_secs, fleet=fleet)
