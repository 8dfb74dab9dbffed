"""Exporters for the monitoring tools users already run: Prometheus and TensorBoard.

Each factory returns a sink for `Pacer(sinks=[...])` / `jp.configure(sinks=[...])`.
Sinks run on the pacer's background sink thread (never inside a JAX callback):
a slow write delays only that thread, and a full queue drops summaries
(`Pacer.sink_dropped`) instead of slowing a step. Each uses the ecosystem's own
library, installed with an extra:

- `prometheus_textfile(path)`: `pip install "jaxpace[prometheus]"` (prometheus_client)
- `tensorboard(logdir)`: `pip install "jaxpace[tensorboard]"` (tensorboardX; no TensorFlow)

What a summary carries (one per measured step, site and rank of this
process): `site`, `step`, `rank`, `wait_s` (time inside the collective),
`delay_s` (pacing sleep before it), `engaged`, and, when the policy exchanges
waits in-band (`jp.adaptive`), `earliness_s`: every rank's earliness at the
previous step (the last to arrive has 0). The culprit (the rank that arrives
last on average) needs that exchange: measure-only runs export -1 for it.

In a multi-process job every process writes its own file: a `{process}` in
`path` / `logdir` is replaced by the process index; without it, and with more
than one process, `.p{index}` is added before the file's suffix (Prometheus)
or `process-{index}` below the log directory (TensorBoard).

W&B has no extra: its `wandb.log` is one line,
`sinks=[lambda s: wandb.log({f"jaxpace/{s['site']}/wait_s": s["wait_s"]})]`.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from jaxpace.errors import ConfigError

__all__ = [
    "PrometheusTextfile",
    "TensorBoardSink",
    "prometheus_textfile",
    "site_tag",
    "tensorboard",
]

WINDOW_STEPS = 64  # steps of earliness behind the culprit and the mean gauges


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
    """Per site: a bounded history of the exchanged earliness vectors."""

    def __init__(self) -> None:
        self.rows: deque[np.ndarray] = deque(maxlen=WINDOW_STEPS)

    def add(self, earliness: Any) -> None:
        if earliness is None:
            return
        e = np.asarray(earliness, dtype=np.float64).reshape(-1)
        if e.size and np.isfinite(e).any():
            self.rows.append(e)

    def culprit(self) -> tuple[int, float, np.ndarray]:
        """(rank last on average or -1, fraction of steps it was last, mean earliness)."""
        if not self.rows or len({r.size for r in self.rows}) != 1:
            return -1, math.nan, np.zeros(0)
        h = np.stack(self.rows)
        ok = np.isfinite(h).any(axis=0)
        mean = np.full(h.shape[1], np.nan)
        mean[ok] = np.nanmean(h[:, ok], axis=0)
        r = int(np.nanargmin(mean))
        last = np.nanargmin(np.where(np.isfinite(h), h, np.inf), axis=1)
        return r, float(np.mean(last == r)), mean


class PrometheusTextfile:
    """Sink writing per-site gauges in the node exporter's textfile format.

    Gauges (labels): `jaxpace_steps_measured`, `jaxpace_wait_seconds` (last
    step), `jaxpace_wait_mean_seconds`, `jaxpace_delay_seconds` (last step),
    `jaxpace_delay_total_seconds`, `jaxpace_pacing_engaged` (site, rank, host);
    `jaxpace_earliness_seconds` (site, rank, process: mean over the last 64
    exchanged steps); `jaxpace_culprit_rank` and `jaxpace_culprit_last_fraction`
    (site, process, host). The file is rewritten atomically by
    `prometheus_client.write_to_textfile` at most every `write_every_s` and on
    close.
    """

    def __init__(self, path: str | os.PathLike, *, write_every_s: float = 5.0) -> None:
        pc = _need("prometheus_client", "prometheus")
        if not (isinstance(write_every_s, (int, float)) and write_every_s >= 0):
            raise ConfigError(
                f"`write_every_s` must be a number >= 0 (seconds), got {write_every_s!r}."
            )
        self._pc = pc
        self.process, count = _process()
        p = os.fspath(path)
        if "{process}" in p:
            p = p.replace("{process}", str(self.process))
        elif count > 1:
            base = Path(p)
            p = str(base.with_name(f"{base.stem}.p{self.process}{base.suffix or '.prom'}"))
        self.path = p
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.host = socket.gethostname()
        self.write_every_s = float(write_every_s)
        self._last_write = -math.inf
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}
        self._sums: dict[tuple[str, int], list[float]] = {}  # steps, wait sum, delay sum
        reg = pc.CollectorRegistry()
        self.registry = reg
        rl = ["site", "rank", "host"]
        g = pc.Gauge
        self._steps = g("jaxpace_steps_measured", "Steps measured at this site", rl, registry=reg)
        self._wait = g("jaxpace_wait_seconds", "Wait inside the collective, last step", rl,
                       registry=reg)  # fmt: skip
        self._wait_mean = g("jaxpace_wait_mean_seconds", "Mean wait inside the collective", rl,
                            registry=reg)  # fmt: skip
        self._delay = g("jaxpace_delay_seconds", "Pacing sleep, last step", rl, registry=reg)
        self._delay_total = g("jaxpace_delay_total_seconds", "Pacing sleep, total", rl,
                              registry=reg)  # fmt: skip
        self._engaged = g("jaxpace_pacing_engaged", "1 when pacing is on", rl, registry=reg)
        self._early = g(
            "jaxpace_earliness_seconds",
            "Mean earliness over the last 64 exchanged steps (the latest rank has 0)",
            ["site", "rank", "process"],
            registry=reg,
        )
        cl = ["site", "process", "host"]
        self._culprit = g(
            "jaxpace_culprit_rank",
            "Rank that arrived last on average over the last 64 exchanged steps (-1: unknown, "
            "the policy does not exchange waits)",
            cl,
            registry=reg,
        )
        self._culprit_frac = g(
            "jaxpace_culprit_last_fraction",
            "Fraction of the last 64 exchanged steps in which the culprit arrived last",
            cl,
            registry=reg,
        )

    def __call__(self, s: dict[str, Any]) -> None:
        site, rank = str(s["site"]), int(s["rank"])
        wait, delay = float(s.get("wait_s", 0.0)), float(s.get("delay_s", 0.0))
        labels = (site, str(rank), self.host)
        with self._lock:
            acc = self._sums.setdefault((site, rank), [0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += wait
            acc[2] += delay
            self._steps.labels(*labels).set(acc[0])
            self._wait.labels(*labels).set(wait)
            self._wait_mean.labels(*labels).set(acc[1] / acc[0])
            self._delay.labels(*labels).set(delay)
            self._delay_total.labels(*labels).set(acc[2])
            self._engaged.labels(*labels).set(1.0 if s.get("engaged") else 0.0)
            win = self._windows.setdefault(site, _Window())
            win.add(s.get("earliness_s"))
            if time.monotonic() - self._last_write >= self.write_every_s:
                self._write_locked()

    def _write_locked(self) -> None:
        for site, win in self._windows.items():
            culprit, frac, mean = win.culprit()
            self._culprit.labels(site, str(self.process), self.host).set(culprit)
            self._culprit_frac.labels(site, str(self.process), self.host).set(frac)
            for r, v in enumerate(mean):
                if math.isfinite(v):
                    self._early.labels(site, str(r), str(self.process)).set(float(v))
        self._pc.write_to_textfile(self.path, self.registry)
        self._last_write = time.monotonic()

    def write(self) -> str:
        """Writes the file now; returns its path."""
        with self._lock:
            self._write_locked()
        return self.path

    def close(self) -> None:
        """Final write (the sink thread calls it when the pacer closes)."""
        self.write()


class TensorBoardSink:
    """Sink writing scalars with tensorboardX's `SummaryWriter` (event files, no TensorFlow).

    Tags, at each measured step: `jaxpace/{site}/wait_ms/rank{r}`,
    `jaxpace/{site}/delay_ms/rank{r}`, `jaxpace/{site}/engaged/rank{r}`, and, when
    waits are exchanged, `jaxpace/{site}/earliness_ms/rank{j}` for every rank j
    (written by the lowest rank of this process only). `{site}` is
    `site_tag(site)`: `:` shown as `--`, other characters TensorBoard does not
    allow as `-{hex}-`, so distinct sites stay distinct series.
    """

    def __init__(self, logdir: str | os.PathLike, *, flush_secs: int = 10) -> None:
        tbx = _need("tensorboardX", "tensorboard")
        self.process, count = _process()
        d = os.fspath(logdir)
        if "{process}" in d:
            d = d.replace("{process}", str(self.process))
        elif count > 1:
            d = os.path.join(d, f"process-{self.process}")
        self.logdir = d
        self._writer = tbx.SummaryWriter(logdir=d, flush_secs=flush_secs)
        self._lock = threading.Lock()
        self._first_rank: dict[str, int] = {}

    def __call__(self, s: dict[str, Any]) -> None:
        site, rank, step = site_tag(s["site"]), int(s["rank"]), int(s["step"])
        w = self._writer
        with self._lock:
            w.add_scalar(f"jaxpace/{site}/wait_ms/rank{rank}", float(s["wait_s"]) * 1e3, step)
            w.add_scalar(f"jaxpace/{site}/delay_ms/rank{rank}", float(s["delay_s"]) * 1e3, step)
            w.add_scalar(f"jaxpace/{site}/engaged/rank{rank}", float(bool(s["engaged"])), step)
            early = s.get("earliness_s")
            first = self._first_rank[site] = min(self._first_rank.get(site, rank), rank)
            if early is not None and rank == first:  # one copy of the shared vector
                for j, v in enumerate(early):
                    if math.isfinite(v):
                        w.add_scalar(f"jaxpace/{site}/earliness_ms/rank{j}", v * 1e3, step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        """Flushes and closes the event file (the sink thread calls it at pacer close)."""
        self._writer.close()


def prometheus_textfile(
    path: str | os.PathLike, *, write_every_s: float = 5.0
) -> PrometheusTextfile:
    """A sink writing jaxpace's gauges to `path` for the node exporter's textfile collector.

    Point the collector at the file's directory (`--collector.textfile.directory`)
    and name the file `*.prom`. See `PrometheusTextfile` for the gauges.
    Needs `pip install "jaxpace[prometheus]"`.
    """
    return PrometheusTextfile(path, write_every_s=write_every_s)


def tensorboard(logdir: str | os.PathLike, *, flush_secs: int = 10) -> TensorBoardSink:
    """A sink writing per-step scalars to a TensorBoard log directory (tensorboardX).

    Needs `pip install "jaxpace[tensorboard]"`; view with `tensorboard --logdir LOGDIR`.
    """
    return TensorBoardSink(logdir, flush_secs=flush_secs)
