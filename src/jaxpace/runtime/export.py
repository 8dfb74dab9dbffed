"""A pacer's records (docs/records.md): the rows, export (Parquet or JSONL), and gather across processes."""

from __future__ import annotations

import json
import logging
import os
import socket
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxpace import _jax_compat
from jaxpace.errors import ConfigError
from jaxpace.records import format as _record_format
from jaxpace.runtime.consensus import KEY_GENERATIONS
from jaxpace.runtime.inflight import settle

if TYPE_CHECKING:
    from jaxpace.runtime.interface import PacerState

__all__ = ["check_header_extra", "export", "export_all", "gather", "header", "records"]

log = logging.getLogger("jaxpace")

# The fields `header_record` writes itself (docs/records.md, "header").
_HEADER_FIELDS = (
    "type", "format", "run_id", "process_index", "process_count", "host", "pid",
    "granularity", "jaxpace_version", "policy", "local_devices", "topology", "truncated",
    "platform", "sample_every", "sites",
)  # fmt: skip


def _collect(pacer: PacerState, header_extra: Mapping[str, Any] | None) -> tuple[dict, list]:
    """This process's header and its finished rows: `[(site, rank, rows), ...]` by site and
    rank (`rows` the recorder's structured array, steps in order).

    First waits (bounded) for the steps this process dispatched (`inflight.settle`).
    """
    extra = check_header_extra(header_extra)
    settle(pacer)
    head: dict[str, Any] = {**header(pacer), **extra}
    parts = []
    first_kept: dict[str, int] = {}  # site -> first step still in every rank's ring
    for name, site in sorted(pacer.sites.items()):
        site.flush()  # native probes: drain what the handlers finished
        for r in sorted(site.ranks):
            st = site.ranks[r]
            with st.lock:
                rows = st.recorder.completed()
            cap = st.recorder.capacity
            if rows.size and int(rows["step"][-1]) >= cap:  # the ring wrapped: say so
                first = int(rows["step"][-1]) - cap + 1
                first_kept[name] = max(first_kept.get(name, 0), first)
            parts.append((name, int(r), rows))
    if first_kept:
        # docs/records.md, "truncated": steps before these were overwritten in the ring.
        head["truncated"] = {"capacity": pacer.config.capacity, "first_step": first_kept}
        log.warning(
            "jaxpace: the records keep only the last %d steps per site and rank (`capacity`); "
            "%s. Pass `Pacer(capacity=...)` / `jp.configure(capacity=...)` to keep more.",
            pacer.config.capacity,
            ", ".join(f"{k} from step {v}" for k, v in sorted(first_kept.items())),
        )
    return head, parts


# Header fields only the readers of other sources write (`records.sources.common`): what the
# source was and whether it has arrival times. Never from `header_extra`.
_RESERVED_FIELDS = ("source", "source_label", "timed")


def records(
    pacer: PacerState, header_extra: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """This process's finished records as dicts: its header, then steps by site, rank, step.

    First waits (bounded) for the steps this process dispatched (`inflight.settle`).
    `header_extra` adds fields to the header (see `check_header_extra`).
    """
    import jax

    head, parts = _collect(pacer, header_extra)
    proc = jax.process_index()
    out: list[dict[str, Any]] = [head]
    for name, r, rows in parts:
        for row in rows:
            out.append(
                _record_format.step_record(
                    site=name,
                    step=int(row["step"]),
                    rank=r,
                    process=proc,
                    arrive_ns=int(row["arrive_ns"]),
                    done_ns=int(row["done_ns"]),
                    delay_ns=int(row["delay_ns"]),
                    engaged=bool(row["engaged"]),
                    execution=None
                    if int(row["execution"]) == _record_format.NO_EXECUTION
                    else int(row["execution"]),
                )
            )
    return out


def _columns(parts: list, process: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """`_collect`'s rows as the step columns of `format.write_parquet` (no dict per row)."""
    sites = sorted({name for name, _, _ in parts})
    index = {s: i for i, s in enumerate(sites)}
    keep = [(name, r, rows) for name, r, rows in parts if rows.size]
    n = sum(int(rows.size) for _, _, rows in keep)

    def cat(f) -> np.ndarray:
        return np.concatenate([f(*t) for t in keep]) if keep else np.zeros(0, np.int64)

    arrive = cat(lambda _n, _r, rows: rows["arrive_ns"].astype(np.int64))
    done = cat(lambda _n, _r, rows: rows["done_ns"].astype(np.int64))
    cols = {
        "site": cat(lambda name, _r, rows: np.full(rows.size, index[name], np.int64)),
        "step": cat(lambda _n, _r, rows: rows["step"].astype(np.int64)),
        "rank": cat(lambda _n, r, rows: np.full(rows.size, r, np.int64)),
        "process": np.full(n, process, np.int64),
        "arrive_ns": arrive,
        "done_ns": done,
        "wait_ns": done - arrive,
        "delay_ns": cat(lambda _n, _r, rows: rows["delay_ns"].astype(np.int64)),
        "engaged": cat(lambda _n, _r, rows: rows["engaged"].astype(bool)).astype(bool),
        "device": np.full(n, -1, np.int64),
    }
    execution = cat(lambda _n, _r, rows: rows["execution"].astype(np.int64))
    if (execution != _record_format.NO_EXECUTION).any():  # the native probes know it
        cols["execution"] = execution
    return cols, sites


def check_header_extra(extra: Any) -> dict[str, Any]:
    """`Pacer.export(header_extra=...)`: JSON fields that do not replace the header's own.

    `interleaved_phases` (an integer >= 1) is read by the report (docs/records.md).
    """
    if extra is None:
        return {}
    if not isinstance(extra, Mapping) or not all(isinstance(k, str) for k in extra):
        raise ConfigError(
            f"`header_extra` must be a dict with string keys, got {extra!r}. Pass e.g. "
            '`header_extra={"interleaved_phases": 3}`, or leave it out.'
        )
    clash = sorted(set(extra) & set(_HEADER_FIELDS))
    if clash:
        raise ConfigError(
            f"`header_extra` may not replace the header's own fields {clash}. Pass "
            "other names (docs/records.md lists the header's fields)."
        )
    reserved = sorted(set(extra) & set(_RESERVED_FIELDS))
    if reserved:
        raise ConfigError(
            f"`header_extra` may not set {', '.join(f'`{k}`' for k in reserved)}: the report "
            "reads these only from records converted from another source (an NCCL Inspector "
            "log, a `jax.profiler` trace), where they say which source and whether it has "
            "arrival times; on jaxpace's own records they would change how the report reads "
            "them. Pass other names."
        )
    n = extra.get("interleaved_phases", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(
            f"`header_extra['interleaved_phases']` must be an integer >= 1, got {n!r}. Pass "
            "how many runs this process interleaved step by step (1: not interleaved)."
        )
    try:
        json.dumps(dict(extra), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"`header_extra` must be JSON-serializable ({e}). Pass strings, numbers, "
            "lists and dicts only."
        ) from None
    return dict(extra)


def header(pacer: PacerState) -> dict[str, Any]:
    import jax

    from jaxpace import __version__

    return _record_format.header_record(
        run_id=pacer.run_id or "local",
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        host=socket.gethostname(),
        pid=os.getpid(),
        granularity=pacer.config.granularity,
        jaxpace_version=__version__,
        policy=pacer.policy.name,
        local_devices=[d.id for d in jax.local_devices()],
        rank_groups=_rank_groups(pacer),
        platform=_platform(),
        sample_every=int(pacer.config.sample_every),
        # Per site: what changes what its numbers mean (probe, an invariant operand, the
        # policy stopping), its collective and who takes part with whom (groups, pairs).
        sites=_site_context(pacer),
    )


def _platform() -> str:
    """`cpu`, `gpu` or `tpu` (or what JAX calls it): the devices this process's ranks ran on."""
    import jax

    try:
        p = str(jax.local_devices()[0].platform).lower()
    except Exception:  # noqa: BLE001 - no backend: say so rather than fail the export
        return "unknown"
    return "gpu" if p in ("cuda", "rocm") else p


def _site_context(pacer: PacerState) -> dict[str, dict[str, Any]]:
    """Per site, what changes what its numbers mean (docs/records.md, header `sites`).

    `probe`: which probes timed it; `invariant_over`: the axis its operand was
    already reduced over (the skew is hidden), else None; `backed_off` /
    `ab_rejected`: the policy stopped pacing during the run on some rank; and the
    site's layout (`collective`, its rank groups, ppermute's pairs; `jaxpace.collectives.layout`).
    """
    out: dict[str, dict[str, Any]] = {}
    invariant = dict(pacer.hooks.invariant_sites)
    for name, site in sorted(pacer.sites.items()):
        backed_off = ab_rejected = False
        for st in list(site.ranks.values()):
            with st.lock:
                status = pacer.policy.status(st.policy_state)
            backed_off = backed_off or bool(status.backed_off)
            ab = status.ab_effect or {}
            ab_rejected = ab_rejected or bool(ab.get("rejected"))
        out[name] = {
            **(site.layout_info or {}),  # collective, groups, ppermute pairs
            "probe": site.probe,
            "invariant_over": invariant.get(name),
            "backed_off": backed_off,
            "ab_rejected": ab_rejected,
        }
    for name, axis in sorted(invariant.items()):
        out.setdefault(name, {"probe": None, "invariant_over": axis})
    return out


def _rank_groups(pacer: PacerState) -> dict[str, dict[str, str]]:
    """Group labels of this process's ranks: its host, plus any the user gave."""
    import jax

    if pacer.config.granularity == "process":
        mine = {jax.process_index()}
    else:
        mine = {r for site in pacer.sites.values() for r in site.ranks}
    host = socket.gethostname()
    groups: dict[str, dict[str, str]] = {"host": {str(r): host for r in sorted(mine)}}
    for kind, mapping in (pacer.rank_groups or {}).items():
        groups[str(kind)] = {str(r): str(v) for r, v in mapping.items()}
    return groups


def _format_of(path: str, format: str | None) -> str:
    """The format to write: `format`, else the path's suffix (`.jsonl`), else Parquet."""
    if format is not None:
        try:
            _record_format.check_format(format)
        except ValueError as e:
            raise ConfigError(f"`Pacer.export`: {e}") from None
        suffix = os.path.splitext(path)[1]
        other = {".jsonl": "jsonl", ".parquet": "parquet"}.get(suffix)
        if other is not None and other != format:
            raise ConfigError(
                f"`Pacer.export({path!r}, format={format!r})`: the file name says "
                f"{other}. Name the file `*.{format}` or pass `format={other!r}`."
            )
        return format
    return "jsonl" if path.endswith(".jsonl") else _record_format.DEFAULT_FORMAT


def export(
    pacer: PacerState,
    path: str | os.PathLike,
    header_extra: Mapping[str, Any] | None = None,
    format: str | None = None,
) -> str:
    """Writes this process's records (Parquet, or JSONL) and returns the path (see
    `Pacer.export`)."""
    import jax

    check_header_extra(header_extra)  # before creating anything
    p = os.fspath(path)
    fmt = _format_of(p, format)
    ends_in_sep = p.endswith(os.sep) or bool(os.altsep and p.endswith(os.altsep))
    if ends_in_sep or os.path.isdir(p):
        # An existing directory (or a symlink to one), or a new one ("run/"): the file goes
        # inside it.
        _record_format.make_dirs(p)
        p = os.path.join(p, _record_format.records_filename(jax.process_index(), fmt))
    if fmt == "jsonl":
        return _record_format.write_jsonl(p, records(pacer, header_extra))
    _record_format.check_replaceable(p)  # before collecting (as `write_jsonl` does)
    head, parts = _collect(pacer, header_extra)
    cols, sites = _columns(parts, jax.process_index())
    return _record_format.write_parquet(p, head, cols, sites)


def gather(pacer: PacerState, timeout_s: float = 60.0) -> list[dict[str, Any]] | None:
    """Every process's records on process 0 (see `Pacer.gather`)."""
    import jax

    recs = records(pacer)
    if jax.process_count() == 1:
        return recs
    client = _jax_compat.distributed_client()
    if client is None:
        raise RuntimeError("`gather` needs `jax.distributed.initialize()` (multi-process).")
    gen = KEY_GENERATIONS.next("gather")
    prefix = f"jaxpace/records/{pacer.run_id}/{gen}"
    me = jax.process_index()
    blob = zlib.compress("\n".join(json.dumps(r, separators=(",", ":")) for r in recs).encode())
    client.key_value_set_bytes(f"{prefix}/p{me}", blob)
    if me != 0:
        return None
    out = list(recs)
    for p in range(1, jax.process_count()):
        try:
            data = client.blocking_key_value_get_bytes(f"{prefix}/p{p}", int(timeout_s * 1000))
        except Exception as e:  # noqa: BLE001 - a dead peer must not hang or crash us
            log.warning(
                "jaxpace: no records from process %d within %.0fs (%s)",
                p,
                timeout_s,
                type(e).__name__,
            )
            continue
        out.extend(json.loads(line) for line in zlib.decompress(data).decode().splitlines())
    return out


def export_all(
    pacer: PacerState,
    directory: str | os.PathLike,
    timeout_s: float = 60.0,
    format: str = _record_format.DEFAULT_FORMAT,
) -> str | None:
    """`gather` to process 0 and write one records file per process there (Parquet, or
    `format="jsonl"`)."""
    try:
        _record_format.check_format(format)
    except ValueError as e:
        raise ConfigError(f"`Pacer.export_all`: {e}") from None
    recs = gather(pacer, timeout_s)
    if recs is None:
        return None
    d = os.fspath(directory)
    _record_format.make_dirs(d)
    by_proc: dict[int, list[dict[str, Any]]] = {}
    current = None
    for r in recs:
        if r.get("type") == "header":
            current = int(r["process_index"])
        by_proc.setdefault(current, []).append(r)
    for proc, rows in by_proc.items():
        _record_format.write_records(
            os.path.join(d, _record_format.records_filename(proc, format)), rows, format
        )
    return d
