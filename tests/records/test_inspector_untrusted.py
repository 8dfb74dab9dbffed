"""Issue 49, readers: NCCL Inspector logs are untrusted input (items 3, 4, 7, 9).

Each case is a minimal reproduction of a break: the result must not depend on the
hash seed; out-of-range numbers are dropped and counted with file:line, never a
traceback or an int64 wrap; a re-created communicator's second lifetime is kept;
unequal all-to-all message sizes do not name a straggler.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

from jaxpace.records.sources.synthetic import write_inspector_logs
from jaxpace.report import analyze


def _edit(path, line: int, old: str, new: str) -> None:
    """Replaces `old` by `new` in 1-based line `line` of `path` (which must hold it)."""
    lines = path.read_text().splitlines(keepends=True)
    assert old in lines[line - 1], lines[line - 1][:200]
    lines[line - 1] = lines[line - 1].replace(old, new)
    path.write_text("".join(lines))


_SEED_PROBE = """
import sys
from jaxpace.report import analyze
rep = analyze(sys.argv[1])
bad = [n for n in rep.notes if "bad lines skipped" in n]
print(rep.culprit, rep.num_steps, rep.partial, bad)
"""


def test_inspector_n_ranks_disagreement_is_the_same_whatever_the_hash_seed(tmp_path):
    """Item 3: communicators were registered by iterating a `set`: rc 0 or 2 by seed."""
    paths = write_inspector_logs(tmp_path, 8, 30, late_ranks=[3], late_us=1500.0, seed=4)
    _edit(paths[0], 12, '"n_ranks":8', '"n_ranks":9')  # in the first file read
    outs = set()
    for seed in ("0", "1", "2", "3", "7"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", _SEED_PROBE, str(tmp_path)],
            capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.add(proc.stdout.strip())
    assert len(outs) == 1, outs
    [out] = outs
    # The one odd line is the one dropped, named by file and line; the culprit stands.
    assert out.startswith("3 30 True") and f"{paths[0].name}:12:" in out and "n_ranks" in out


@pytest.mark.parametrize(
    "old, new",
    [
        ('"coll_sn":12', f'"coll_sn":{2**63}'),
        ('"coll_sn":12', f'"coll_sn":{2**62}'),
        ('"coll_exec_time_us":', '"coll_exec_time_us":1e300,"was":'),
        ('"coll_exec_time_us":', '"coll_exec_time_us":9300000000000000,"was":'),
        ('"rank":2,', f'"rank":{2**70},'),
    ],
    ids=["sn-2^63", "sn-2^62", "exec-1e300", "exec-9.3e15-wraps-x1000", "rank-2^70"],
)
def test_unbounded_numbers_are_dropped_and_counted_with_file_and_line(tmp_path, old, new):
    """Item 4: an OverflowError traceback, a message naming no file, or an int64 wrap that
    made another rank 2.6e8 s late: now the line is dropped, counted and located."""
    paths = write_inspector_logs(tmp_path, 8, 30, late_ranks=[6], late_us=1500.0, seed=2)
    _edit(paths[2], 13, old, new)
    rep = analyze(tmp_path)
    assert rep.culprit == 6 and rep.partial
    [note] = [n for n in rep.notes if "bad lines skipped" in n]
    assert note.startswith("1 bad lines skipped") and f"{paths[2]}:13:" in note, note
    assert rep.data.lateness.max() < 0.01  # no wrapped value: every lateness under 10 ms


def test_a_coll_sn_reset_keeps_the_second_communicator_lifetime(tmp_path):
    """Item 7: a re-created communicator restarts `coll_sn`; its second lifetime was dropped
    as "duplicate records", its straggler missed and the report not PARTIAL."""
    first = write_inspector_logs(tmp_path / "a", 8, 40, seed=1)
    second = write_inspector_logs(tmp_path / "b", 8, 40, late_ranks=[5], late_us=1500.0, seed=2)
    run = tmp_path / "run"
    run.mkdir()
    for a, b in zip(first, second, strict=True):
        (run / a.name).write_text(a.read_text() + b.read_text())
    rep = analyze(run)
    assert rep.culprit == 5 and rep.num_steps == 80
    assert any("re-created 1 time(s)" in n and "2 lifetimes" in n for n in rep.notes), rep.notes
    assert not any("duplicate" in n for n in rep.notes)
    # A real duplicate (the same line twice) is still dropped, and now marks it PARTIAL.
    lines = (run / first[0].name).read_text().splitlines(keepends=True)
    (run / first[0].name).write_text("".join(lines[:10] + [lines[9]] + lines[10:]))
    rep = analyze(run)
    assert rep.partial and any("1 duplicate records" in n for n in rep.notes)


def test_unequal_all_to_all_message_sizes_name_no_straggler(tmp_path):
    """Item 9: a rank that moves 64x less finishes its all-to-all sooner and was named a
    straggler (z = 113.5); every line carries `coll_msg_size_bytes`."""
    paths = write_inspector_logs(tmp_path, 8, 40, seed=3, transfer_us=400.0)
    size = 1 << 26
    for p in paths:
        text = p.read_text().replace('"coll":"AllReduce"', '"coll":"AllToAll"')
        if p is paths[2]:  # rank 2 moves 64x less: its kernel is ~390 us shorter
            text = text.replace(
                f'"coll_msg_size_bytes":{size}', f'"coll_msg_size_bytes":{size // 64}'
            )
            text = re.sub(
                r'"coll_exec_time_us":(\d+)',
                lambda m: f'"coll_exec_time_us":{max(int(m[1]) - 390, 1)}',
                text,
            )
        p.write_text(text)
    rep = analyze(tmp_path)
    assert rep.culprit is None and not rep.culprits
    [why] = [n for n in rep.notes if n.startswith("NO CULPRIT")]
    assert "evidence only" in why and f"{size // 64} to {size} bytes" in why
    assert "coll_msg_size_bytes" in why
