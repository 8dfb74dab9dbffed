"""JSONL records through the engine: DuckDB's `read_json` fast path against the careful per-line path.

The careful path (`jaxpace.records.jsonl_checked`: `json` a line at a time, every value
checked) is the reference: on every file here, writer output as well as hostile input,
the fast path (`read_json` over all files, each file it cannot read cleanly handed to
the careful path) must give the same `Records` (columns, dtypes, order, sites, notes,
partial flag) or the same error. Forcing every file down the careful path is how the
reference is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from jaxpace.records import engine as _engine
from jaxpace.records import format as _record_format
from jaxpace.records import jsonl_checked
from jaxpace.records.reader import Records, load_records
from jaxpace.report import synthetic_records


def _header(p=0, count=1, run_id="r", **extra):
    h = _record_format.header_record(
        run_id=run_id,
        process_index=p,
        process_count=count,
        host=f"h{p}",
        pid=100 + p,
        granularity="process",
        jaxpace_version="0",
        policy="no_pacing",
        local_devices=[0],
        rank_groups=None,
    )
    h.update(extra)
    return h


def _step(site="train.py:42:train_step", step=0, rank=0, process=0, **kw):
    args = dict(arrive_ns=1_000_000 + step, done_ns=1_500_000 + step, delay_ns=0, engaged=False)
    args.update(kw)
    return _record_format.step_record(site=site, step=step, rank=rank, process=process, **args)


def _line(rec) -> bytes:
    return (json.dumps(rec, separators=(",", ":")) + "\n").encode()


def _write(path: Path, *lines: bytes | dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(x if isinstance(x, bytes) else _line(x) for x in lines))
    return path


def _load(source, monkeypatch, *, fast: bool):
    """(Records or None, (exception type, message) or None) of one path."""
    with monkeypatch.context() as m:
        if not fast:  # every file the careful way
            m.setattr(_engine, "ends_with_newline", lambda path: False)
        try:
            return load_records(source), None
        except Exception as e:  # the same exception, whatever it is, from both
            return None, (type(e), str(e))


def _same(a: Records, b: Records) -> None:
    assert a.headers == b.headers
    assert a.sites == b.sites
    assert list(a.columns) == list(b.columns)
    for k in a.columns:
        x, y = a.columns[k], b.columns[k]
        assert x.dtype == y.dtype and x.shape == y.shape, k
        np.testing.assert_array_equal(x, y, err_msg=k)
    for f in ("run_id", "process_count", "granularity", "partial", "notes", "sources"):
        assert getattr(a, f) == getattr(b, f), f


def _in_place(source):
    """(the run read as the report reads it, `by_site.open_run`: JSONL files alone through
    `jsonl_arrow` into Parquet, read in place; its rows per site, or the error)."""
    from jaxpace.records.by_site import open_run

    try:
        with open_run(source) as run:
            return run.meta, {s: run.site(s).columns for s in run.sites}, None
    except Exception as e:
        return None, None, (type(e), str(e))


def _rows(cols: dict) -> np.ndarray:
    """A site's rows as a sorted (rows x columns) array: the same rows in any order."""
    keys = ["step", "rank", "process", "arrive_ns", "done_ns", "wait_ns", "delay_ns", "device"]
    a = np.stack([cols[k].astype(np.int64) for k in keys] + [cols["engaged"].astype(np.int64)])
    return a[:, np.lexsort(a[::-1])] if a.size else a


def _same_in_place(source, want: Records | None, want_err) -> None:
    """The report's way of reading the run gives the careful reader's rows (each site's,
    in any order), headers, notes and partial flag, or its error."""
    meta, sites, err = _in_place(source)
    assert err == want_err
    if want is None:
        return
    assert meta.headers == want.headers
    assert tuple(sorted(sites)) == tuple(sorted(want.sites))
    assert (meta.notes, meta.partial) == (want.notes, want.partial)
    for name, cols in sites.items():
        sel = want.columns["site"] == want.sites.index(name)
        ref = {k: v[sel] for k, v in want.columns.items()}
        np.testing.assert_array_equal(_rows(cols), _rows(ref), err_msg=name)


def _check(source, monkeypatch):
    """The fast paths match the careful one; returns the careful one's result."""
    want, want_err = _load(source, monkeypatch, fast=False)
    got, got_err = _load(source, monkeypatch, fast=True)
    assert got_err == want_err
    if want is not None:
        _same(got, want)
    _same_in_place(source, want, want_err)
    return want, want_err


class _Counter:
    """Counts the files, and their step rows, read the careful way."""

    def __init__(self, monkeypatch):
        self.files = self.rows = 0
        read_checked = _engine.read_checked

        def counted(path):
            out = read_checked(path)
            self.files += 1
            self.rows += int(out.columns["step"].size)
            return out

        monkeypatch.setattr(_engine, "read_checked", counted)


# --------------------------------------------------------------------------- the layout


# --------------------------------------------------------------------------- writer output


def test_writer_output_is_read_fast_and_identically(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    d = tmp_path / "run"
    n = 0
    for p in range(3):
        recs = [_header(p, 3)]
        for step in range(150):
            for r in range(2):
                arrive = int(rng.integers(0, 10**15))
                wait = int(rng.integers(0, 10**9))
                recs.append(
                    _step(
                        site=("a.py:1:f", "b.py:20:g")[step % 2],
                        step=step,
                        rank=2 * p + r,
                        process=p,
                        device=None if step % 3 else r,
                        arrive_ns=arrive,
                        done_ns=arrive + wait,
                        delay_ns=int(rng.integers(0, 10**6)) * (step % 5 == 0),
                        engaged=bool(step % 4 == 0),
                    )
                )
                n += 1
        _record_format.write_jsonl(d / _record_format.records_filename(p, "jsonl"), recs)
    counter = _Counter(monkeypatch)
    got = load_records(d)
    assert counter.files == 0 and len(got) == n  # every file read fast
    monkeypatch.undo()
    want, err = _check(d, monkeypatch)
    assert err is None and len(want) == n
    _same(got, want)


def test_synthetic_records_written_back(tmp_path, monkeypatch):
    recs = load_records(
        synthetic_records(6, 80, late_rank=2, late_s=0.003, ranks_per_process=2, seed=1)
    )
    recs.write_jsonl(tmp_path / "syn")
    counter = _Counter(monkeypatch)
    assert len(load_records(tmp_path / "syn")) == len(recs) and counter.files == 0
    monkeypatch.undo()
    want, err = _check(tmp_path / "syn", monkeypatch)
    assert err is None and len(want) == len(recs)  # (grouped by process in the files)


def test_simulator_records(tmp_path, monkeypatch):
    from jaxpace.sim import simulate_records, write_records

    run = simulate_records("pure-bsp", nodes=2, steps=30, seed=0, policy="adaptive")
    write_records(run, tmp_path / "sim", format="jsonl")
    counter = _Counter(monkeypatch)
    assert len(load_records(tmp_path / "sim")) == len(run.records) and counter.files == 0
    monkeypatch.undo()
    want, err = _check(tmp_path / "sim", monkeypatch)
    assert err is None and len(want) == len(run.records)


def test_values_at_the_edges_of_the_layout(tmp_path, monkeypatch):
    """Zero, 18 digits (fast), 19 digits and beyond (per line), negatives, odd sites."""
    big = 10**18 - 1
    steps = [
        _step(step=0, arrive_ns=0, done_ns=0),
        _step(step=1, arrive_ns=big - 5, done_ns=big),
        _step(step=2, arrive_ns=10**18, done_ns=10**18 + 1),  # 19 digits: per line
        _step(step=3, arrive_ns=-(10**17), done_ns=-(10**17) + 5),  # negative times
        _step(step=4, arrive_ns=5, done_ns=3),  # negative wait: skipped, noted
        _step(step=5, delay_ns=-1),  # negative delay: skipped
        _step(step=6, device=-3, rank=7, process=12345678),
        _step(step=7, site=""),
        _step(step=8, site="a,b:c d{e}f[g]h;'~`!@#$%^&*()-=+"),
        _step(step=9, site="x" * 256),
        _step(step=10, site="y" * 257),  # longer than the fast reader takes
        _step(step=11, site='quote"in'),  # escaped: per line
        _step(step=12, site="back\\slash"),
        _step(step=13, site="caf\u00e9 \u2603"),  # escaped by the writer
        _step(step=14, site="tab\there"),
        _step(step=15, site="0123456789"),
        _step(step=16, device=0, engaged=True),
        _step(step=17, arrive_ns=2**62, done_ns=2**62 + 7),
    ]
    path = _write(tmp_path / "edge.jsonl", _header(), *steps)
    want, err = _check(path, monkeypatch)
    assert err is None and len(want) == len(steps) - 2
    assert any("skipped 2 step record(s) with a negative" in n for n in want.notes)
    assert "edge.jsonl:6" in " ".join(want.notes)  # the first skipped line is named


def test_huge_integers_are_dropped_the_same_way(tmp_path, monkeypatch):
    """Past int64 both readers drop the record and say where (issue 49 item 4: it was an
    OverflowError traceback)."""
    path = _write(
        tmp_path / "big.jsonl",
        _header(),
        _step(step=0),
        _step(step=1, arrive_ns=2**70, done_ns=2**70 + 1),
    )
    want, err = _check(path, monkeypatch)
    assert err is None and len(want) == 1 and want.partial
    assert any("beyond the int64 range (first at " in n and "big.jsonl:3" in n for n in want.notes)


# --------------------------------------------------------------------------- hostile lines

GOOD = _line(_step(step=1))
GOOD2 = _line(_step(step=2, rank=1, device=4, engaged=True))

HOSTILE: dict[str, bytes] = {
    "crlf": GOOD[:-1] + b"\r\n",
    "blank": b"\n",
    "spaces": b"   \t \n",
    "space_after_colon": GOOD.replace(b'"step":1', b'"step": 1'),
    "trailing_space": GOOD[:-1] + b" \n",
    "reordered": _line({**dict(reversed(list(_step(step=3).items())))}),
    "extra_key": GOOD[:-2] + b',"extra":1}\n',
    "missing_key": GOOD.replace(b',"delay_ns":0', b""),
    "duplicate_key": GOOD.replace(b'"rank":0', b'"rank":0,"rank":5'),
    "nan": GOOD.replace(b'"delay_ns":0', b'"delay_ns":NaN'),
    "infinity": GOOD.replace(b'"delay_ns":0', b'"delay_ns":Infinity'),
    "float": GOOD.replace(b'"delay_ns":0', b'"delay_ns":0.0'),
    "exponent": GOOD.replace(b'"delay_ns":0', b'"delay_ns":1e3'),
    "leading_zero": GOOD.replace(b'"delay_ns":0', b'"delay_ns":01'),
    "plus_sign": GOOD.replace(b'"delay_ns":0', b'"delay_ns":+1'),
    "lone_minus": GOOD.replace(b'"delay_ns":0', b'"delay_ns":-'),
    "minus_zero": GOOD.replace(b'"delay_ns":0', b'"delay_ns":-0'),
    "empty_value": GOOD.replace(b'"delay_ns":0', b'"delay_ns":'),
    "string_number": GOOD.replace(b'"delay_ns":0', b'"delay_ns":"0"'),
    "bool_number": GOOD.replace(b'"delay_ns":0', b'"delay_ns":true'),
    "null_number": GOOD.replace(b'"step":1', b'"step":null'),
    "device_string": GOOD.replace(b'"device":null', b'"device":"7"'),
    "device_bad_string": GOOD.replace(b'"device":null', b'"device":"x"'),
    "device_true": GOOD.replace(b'"device":null', b'"device":true'),
    "device_float": GOOD.replace(b'"device":null', b'"device":2.5'),
    "engaged_number": GOOD.replace(b'"engaged":false', b'"engaged":1'),
    "engaged_null": GOOD.replace(b'"engaged":false', b'"engaged":null'),
    "engaged_word": GOOD.replace(b'"engaged":false', b'"engaged":"false"'),
    "engaged_Falsy": GOOD.replace(b'"engaged":false', b'"engaged":False'),
    "site_number": GOOD.replace(b'"site":"train.py:42:train_step"', b'"site":7'),
    "site_escape": GOOD.replace(b"train.py", b"train\\u0041py"),
    "control_char": GOOD.replace(b"train.py", b"train\x01py"),
    "non_utf8": GOOD.replace(b"train.py", b"train\xff\xfepy"),
    "utf8": GOOD.replace(b"train.py", "trâin.py".encode()),
    "del_char": GOOD.replace(b"train.py", b"train\x7fpy"),
    "digit_in_key": GOOD.replace(b'"rank":0', b'"ra1nk":0'),
    "digit_in_prefix": GOOD.replace(b'"type"', b'"ty1pe"'),
    "digit_after_site": GOOD.replace(b'train_step"', b'train_step"1'),
    "digit_in_bool": GOOD.replace(b"false", b"fa1se"),
    "digit_after_brace": GOOD[:-1] + b"1\n",
    "comma_in_value": GOOD.replace(b'"wait_ns":500000', b'"wait_ns":500,000'),
    "two_objects": GOOD[:-1] + GOOD,
    "array": b"[1,2,3]\n",
    "string": b'"step"\n',
    "number": b"12\n",
    "nested": GOOD.replace(b'"delay_ns":0', b'"delay_ns":{"a":[1]}'),
    "unknown_type": GOOD.replace(b'"type":"step"', b'"type":"steps"'),
    "header_again": _line(_header(1, 2)),
    "garbage": b"this is not json\n",
    "truncated_brace": GOOD[:-2] + b"\n",
}


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_line_among_writer_lines(name, where, tmp_path, monkeypatch):
    bad = HOSTILE[name]
    lines = [GOOD2] * 6
    at = {"first": 0, "middle": 3, "last": 6}[where]
    lines.insert(at, bad)
    path = _write(tmp_path / "records-p0.jsonl", _header(0, 2), *lines)
    _check(path, monkeypatch)


def test_many_hostile_lines_in_one_file(tmp_path, monkeypatch):
    """Lines the per-line reader accepts, interleaved with fast ones in one chunk."""
    lines = []
    accepted = [
        k
        for k, v in sorted(HOSTILE.items())
        if _load(_write(tmp_path / k / "r.jsonl", _header(), v), monkeypatch, fast=False)[1] is None
    ]
    assert {"crlf", "reordered", "extra_key", "blank", "device_string"} <= set(accepted)
    for i, k in enumerate(accepted * 3):
        lines += [_line(_step(step=100 + i, rank=i % 3)), HOSTILE[k]]
    path = _write(tmp_path / "mixed.jsonl", _header(), *lines)
    want, err = _check(path, monkeypatch)
    assert err is None and len(want) > len(lines) // 2


def test_cut_short_last_line(tmp_path, monkeypatch):
    for cut in (1, 2, 10, len(GOOD2) - 3, len(GOOD2) - 2):
        path = _write(tmp_path / f"cut{cut}.jsonl", _header(), GOOD, GOOD2, GOOD2[:cut])
        want, err = _check(path, monkeypatch)
        assert err is None and want.partial and len(want) == 2
        assert any("cut short" in n for n in want.notes)


def test_last_line_without_newline_is_kept(tmp_path, monkeypatch):
    path = _write(tmp_path / "r.jsonl", _header(), GOOD, GOOD2[:-1])
    want, err = _check(path, monkeypatch)
    assert err is None and len(want) == 2 and not want.partial


@pytest.mark.parametrize(
    "content",
    [b"", b"\n\n", _line(_header()), GOOD, b"\n" + GOOD, b"   \n" + _line(_header()) + GOOD],
    ids=["empty", "blank", "header_only", "no_header", "no_header_after_blank", "blank_first"],
)
def test_file_starts(content, tmp_path, monkeypatch):
    _check(_write(tmp_path / "r.jsonl", content), monkeypatch)


def test_huge_line_is_refused_at_the_same_line(tmp_path, monkeypatch):
    cap = jsonl_checked.MAX_LINE_BYTES
    huge = b'{"type":"step","site":"' + b"a" * (cap + 10) + b'"}\n'
    path = _write(tmp_path / "records-p0.jsonl", _header(), GOOD, GOOD2, huge, GOOD)
    _, err = _check(path, monkeypatch)
    assert err is not None and "records-p0.jsonl:4: line is longer than" in err[1]


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_lines_at_the_length_cap(extra, tmp_path, monkeypatch):
    """A line of exactly the cap (with its "\\n") is read; one byte more is refused by the
    careful path, which holds a line in memory. (The fast path is DuckDB's: it bounds its
    own memory and reads a long line that is otherwise a valid step record.)"""
    monkeypatch.setattr(jsonl_checked, "MAX_LINE_BYTES", 3000)
    rec = _step(step=5)
    body = _line(rec)
    rec["site"] += "s" * (3000 - len(body) + extra)
    line = _line(rec)
    assert len(line) == 3000 + extra
    path = _write(tmp_path / "cap.jsonl", _header(), GOOD, line, GOOD2)
    _, err = _load(path, monkeypatch, fast=False)
    assert (err is not None) == (extra > 0)
    if extra <= 0:
        _check(path, monkeypatch)


def test_long_valid_lines_longer_than_a_chunk(tmp_path, monkeypatch):
    lines = [_line(_step(step=i, site="s" * (300 * i))) for i in range(1, 6)]
    path = _write(tmp_path / "long.jsonl", _header(), *lines, GOOD, GOOD2)
    want, err = _check(path, monkeypatch)
    assert err is None and len(want) == 7


def test_lines_longer_than_pyarrows_block_and_than_the_cap(tmp_path, monkeypatch):
    """A valid line longer than pyarrow's block (1 MiB) but within `MAX_LINE_BYTES` gives the
    careful reader's rows; in a file whose longest line is over the cap pyarrow reads
    nothing (the careful reader refuses it, naming the line)."""
    from jaxpace.records import jsonl_arrow

    long = _line(_step(step=3, site="s" * (jsonl_arrow._BLOCK_BYTES + 100)))
    assert jsonl_arrow._BLOCK_BYTES < len(long) < jsonl_checked.MAX_LINE_BYTES
    path = _write(tmp_path / "records-p0.jsonl", _header(), GOOD, long, GOOD2)
    want, err = _check(path, monkeypatch)
    assert err is None and len(want) == 3
    over = _line(_step(step=4, site="s" * jsonl_checked.MAX_LINE_BYTES))
    path = _write(tmp_path / "over" / "records-p0.jsonl", _header(), GOOD, over, GOOD2)
    assert jsonl_arrow.read_clean(path) is None
    want, err = _load(path, monkeypatch, fast=False)
    assert err is not None and "records-p0.jsonl:3: line is longer than" in err[1]
    _same_in_place(path, want, err)  # (the report's reading refuses it the same way)


def test_errors_name_the_same_file_and_line_across_files(tmp_path, monkeypatch):
    d = tmp_path / "run"
    _write(d / "records-p0.jsonl", _header(0, 3), GOOD, GOOD2)
    _write(d / "records-p1.jsonl", _header(1, 3), GOOD, HOSTILE["garbage"], GOOD)
    want, err = _check(d, monkeypatch)
    # A bad line in the middle of a file is dropped, counted and located; the rest is read.
    assert err is None and len(want) == 4 and want.partial
    assert any("1 step line(s) with a bad value" in n and "records-p1.jsonl:3: not JSON" in n
               for n in want.notes), want.notes  # fmt: skip
    _write(d / "records-p2.jsonl", b"not a header\n")
    _, err = _check(d, monkeypatch)
    assert err is not None and "records-p2.jsonl:1: first line is not a header" in err[1]


def test_several_files_and_runs(tmp_path, monkeypatch):
    d = tmp_path / "run"
    _write(d / "records-p0.jsonl", _header(0, 3), GOOD, GOOD2)
    _write(d / "records-p2.jsonl", _header(2, 3), GOOD2, HOSTILE["reordered"], GOOD)
    want, err = _check(d, monkeypatch)
    assert err is None and want.partial  # process 1 has no file
    _write(d / "records-p1.jsonl", _header(1, 3, run_id="other"), GOOD)
    _, err = _check(d, monkeypatch)
    assert err is not None and "different runs" in err[1]


def test_random_corruptions_of_writer_lines(tmp_path, monkeypatch):
    """One byte replaced, inserted or deleted anywhere in a writer line: the fast path
    accepts it only where `json` reads the same values (fuzzed, fixed seed; one file a
    corruption, all in one run, so the fast path meets many bad files at once)."""
    rng = np.random.default_rng(15)
    alphabet = b'0123456789-+.,:"\\ {}[]eEnultrfasx\x00\x1f\x7f\xff'
    bases = [GOOD, GOOD2, _line(_step(step=123, arrive_ns=10**17 + 3, done_ns=10**17 + 99))]
    n = 150
    for case in range(n):
        line = bytearray(bases[case % len(bases)])
        at = int(rng.integers(0, len(line) - 1))  # not the closing "\n"
        op = case % 3
        byte = alphabet[int(rng.integers(0, len(alphabet)))]
        if op == 0:
            line[at] = byte
        elif op == 1:
            line.insert(at, byte)
        else:
            del line[at]
        good = _line(_step(step=1000 + case, process=case))
        _write(tmp_path / f"records-p{case}.jsonl", _header(case, n), good, bytes(line), good)
    counter = _Counter(monkeypatch)
    got = load_records(tmp_path)
    monkeypatch.undo()
    want, err = _check(tmp_path, monkeypatch)
    assert err is None
    _same(got, want)
    assert len(got) - counter.rows > 100  # the files with a harmless change, read fast
    assert counter.files > 20  # and the others the careful way


# ------------------------------------------------------- the report's other fast paths


def test_round3_is_pythons_round_bit_for_bit():
    from jaxpace.records.perfetto import _round3

    rng = np.random.default_rng(3)
    ties = (rng.integers(-(10**9), 10**9, 200_000) + 0.5) / 1000.0  # x.xxx5 as doubles
    x = np.concatenate(
        [
            rng.uniform(-1e7, 1e7, 200_000),
            ties,
            np.nextafter(ties, np.inf),
            np.nextafter(ties, -np.inf),
            rng.integers(0, 10**12, 100_000) / 2.0 ** rng.integers(0, 30, 100_000),
            [0.0, -0.0, 5e-4, -5e-4, 1.5e-3, 2.5e-3, 1e-300, 2.0**40, 2.0**41 + 0.3, 1e300],
        ]
    )
    want = np.array([round(v, 3) for v in x.tolist()])
    assert np.array_equal(_round3(x).view(np.int64), want.view(np.int64))


@pytest.mark.parametrize(
    "kw",
    [
        dict(late_rank=2, late_s=0.003),
        dict(straggler_prob=0.2, straggler_factor=3.0),
        dict(late_rank=5, late_s=0.002, engaged_from_step=10, max_delay_s=0.003),
        dict(ranks_per_process=2, jitter_s=0.004),
    ],
    ids=["late", "episodic", "paced", "grouped"],
)
def test_trace_vectorized_equals_per_event(kw, monkeypatch):
    """Perfetto events built with NumPy equal the per-event path, and the text that
    `write_trace` writes equals `json.dumps` of them."""
    from jaxpace.records import perfetto as tr
    from jaxpace.records.synthetic import synthetic_run
    from jaxpace.report import analyze

    rep = analyze(synthetic_run(16, 60, seed=4, **kw))
    data, site = rep.data, rep.site
    fast = tr.trace_events(data, site)
    text = tr.trace_json(data, site)
    assert text == json.dumps(fast, separators=(",", ":"))
    monkeypatch.setattr(tr, "_slices_vectorized", lambda *a: None)
    slow = tr.trace_events(data, site)
    assert json.dumps(fast) == json.dumps(slow)
    assert tr.trace_json(data, site) == text
    assert sum(e["ph"] == "X" for e in fast["traceEvents"]) > 16 * 50
    if "engaged_from_step" in kw:
        assert any(e["name"] == "pacing sleep" for e in fast["traceEvents"])


def test_trace_with_times_that_are_not_finite_takes_the_per_event_path(monkeypatch):
    import dataclasses

    from jaxpace.records import perfetto as tr
    from jaxpace.records.synthetic import synthetic_run
    from jaxpace.report import analyze

    rep = analyze(synthetic_run(8, 40, seed=1))
    wait = rep.data.wait.copy()
    wait[3, 2] = np.inf
    data = dataclasses.replace(rep.data, wait=wait)
    got = tr.trace_json(data, rep.site)
    monkeypatch.setattr(tr, "_slices_vectorized", lambda *a: None)
    assert got == json.dumps(tr.trace_events(data, rep.site), separators=(",", ":"))


def test_permutation_null_by_counting_equals_the_one_hot_product():
    from jaxpace.report.stages.modes import _permuted_ssb

    rng = np.random.default_rng(5)
    R, G = 96, 12
    codes = rng.integers(0, G, R)
    codes[:G] = np.arange(G)
    sizes = np.bincount(codes, minlength=G)
    onehot = np.zeros((R, G))
    onehot[np.arange(R), codes] = 1.0
    y = rng.normal(size=(50, R)) * 1e-3
    want = ((y @ onehot) ** 2 / sizes).sum(axis=-1) - y.sum(axis=-1) ** 2 / R
    np.testing.assert_allclose(_permuted_ssb(y, codes, sizes), want, rtol=1e-12, atol=1e-18)


def test_grid_index_by_lookup_equals_searchsorted():
    from jaxpace.records.site_data import _index_in

    rng = np.random.default_rng(6)
    for lo, span, n in ((0, 50, 1000), (10**12, 10**6, 100), (-7, 3, 10), (5, 10**9, 1000)):
        a = lo + rng.integers(0, span, n)
        uniq = np.unique(a)
        np.testing.assert_array_equal(_index_in(uniq, a), np.searchsorted(uniq, a))


def test_a_cap_below_the_writer_lines_is_kept(tmp_path, monkeypatch):
    """With a line cap shorter than a writer line, the careful path refuses that line."""
    long_site = _line(_step(step=7, site="s" * 250))  # still the fast layout
    header = _line(_header())
    assert len(header) < 300 < len(long_site)
    monkeypatch.setattr(jsonl_checked, "MAX_LINE_BYTES", 300)
    path = _write(tmp_path / "r.jsonl", header, b"\n", GOOD2, long_site, GOOD2)
    _, err = _load(path, monkeypatch, fast=False)
    assert err is not None and "r.jsonl:4: line is longer than" in err[1]


def test_a_jsonl_run_alone_is_read_in_place_each_bad_file_the_careful_way(tmp_path, monkeypatch):
    """The report's reading of a JSONL run (`open_run`): clean files through pyarrow's parser,
    a file with a bad line through the careful reader (its line dropped and located), the
    whole run then read in place from Parquet files the engine removes when closed."""
    from jaxpace.records.by_site import open_run

    recs = load_records(synthetic_records(6, 40, ranks_per_process=2, seed=3))
    recs.write_jsonl(tmp_path / "run")
    bad = tmp_path / "run" / "records-p1.jsonl"
    lines = bad.read_bytes().splitlines(keepends=True)
    bad.write_bytes(b"".join([*lines[:5], HOSTILE["float"], *lines[5:]]))
    careful = []
    read_checked = jsonl_checked.read_checked
    monkeypatch.setattr(
        jsonl_checked, "read_checked", lambda p: careful.append(Path(p).name) or read_checked(p)
    )
    with open_run(tmp_path / "run") as run:
        assert run.engine.in_place  # read in place, not into a table
        temp = run.engine._jsonl_dirs[0]
        assert sorted(p.suffix for p in temp.iterdir()) == [".parquet"] * 3
        assert len(run) == len(recs)  # the bad line dropped, every good one kept
        assert any("records-p1.jsonl:6" in n for n in run.notes) and run.partial
    assert careful == ["records-p1.jsonl"]  # the other two files: pyarrow alone
    assert not temp.exists()
