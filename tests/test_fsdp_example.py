"""examples/fsdp.py: FSDP + tensor parallelism with every collective a jaxpace drop-in.

Single process: the same losses and weight bytes as the `jax.lax` step, and every collective
of both compiled halves is bracketed by the probes, with lax's collective counts. Under
`jaxpace launch -n 4 --local-devices 2` with process 1 made late: the report names rank 1,
within its group, at the first all-gather and the first reduce-scatter of the step, and
no site names anyone else.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO, run_launch, run_report
from hlo_graph import check_bracketed, count_collectives, entry_ops

from jaxpace.native import probes as _native
from jaxpace.records.reader import load_records
from jaxpace.report.stages import links

EXAMPLE = REPO / "examples" / "fsdp.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("fsdp_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path, coll):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    out = tmp_path / coll
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "4", "--collective", coll, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "result-p0.json").read_text())


def test_fsdp_single_process_matches_lax_to_the_bit(tmp_path):
    ours, plain = _run(tmp_path, "jaxpace"), _run(tmp_path, "lax")
    assert ours["params_sha256"] == plain["params_sha256"]
    assert np.array(ours["losses"]).view(np.uint8).tobytes() == (
        np.array(plain["losses"]).view(np.uint8).tobytes()
    )
    assert ours["losses"][-1] < ours["losses"][0]
    assert sorted(p.name for p in (tmp_path / "jaxpace").iterdir()) == [
        "records-p0.jsonl",
        "result-p0.json",
    ]


@pytest.mark.skipif(
    not _native.available()[0], reason=f"native probes unavailable: {_native.available()[1]}"
)
def test_every_collective_of_the_fsdp_step_is_a_bracketed_dropin():
    ex = _load_example()
    mesh = jax.make_mesh((2, 4), ("data", "model"), devices=jax.devices()[:8])
    from jax.sharding import NamedSharding

    import jaxpace as jp

    with jax.set_mesh(mesh):
        shardings = [{n: NamedSharding(mesh, s) for n, s in d.items()} for d in ex.param_specs()]
        params = ex._place(ex.init_params(jax.random.key(0)), shardings)
        x, y = ex.make_data(mesh, 2, 1)[0]
        texts = {}
        for coll in ("jaxpace", "lax"):
            grads_fn, update_fn = ex.make_step(mesh, coll, 0.05).halves
            grads = jax.eval_shape(grads_fn, params, x, y)[0]
            texts[coll] = [
                grads_fn.lower(params, x, y).compile().as_text(),
                update_fn.lower(params, grads).compile().as_text(),
            ]
    for ours, plain in zip(texts["jaxpace"], texts["lax"], strict=True):
        seen, problems = check_bracketed(ours, "jaxpace_arrive_cpu", "jaxpace_done_cpu")
        assert seen > 0 and not problems, problems
        assert count_collectives(ours) == count_collectives(plain)
        # What measuring adds to each half, by design: two custom calls per measured call,
        # and no kernel. The arrive handler copies each small operand leaf itself (the
        # weight shards and gradients are `jit` arguments: a tie of one needs a new buffer,
        # a kernel of its own per leaf); the done probe takes a gathered / scattered result
        # in the layout XLA gives it. The first form (arrival token, [tag, rank] stack, done
        # concatenation) had 188 fusions against lax's 137 in the forward/backward half; the
        # per-leaf ties had 143 against 127, and 28 against 16 in the update half.
        ops, base = entry_ops(ours), entry_ops(plain)
        assert ops.get("custom-call", 0) == 2 * ours.count('custom_call_target="jaxpace_arrive')
        assert ops["fusion"] <= base["fusion"], (ops, base)
    assert jp.default_pacer() is not None


@pytest.mark.multiprocess
def test_fsdp_4x2_report_names_the_late_process_at_gathers_and_scatters(tmp_path):
    out = tmp_path / "run"
    args = ["-n", 4, "--local-devices", 2, "--timeout", 400, "--", sys.executable, EXAMPLE]
    args += ["--steps", 24, "--lag-process", 1, "--lag-s", 0.2, "--out", out]
    proc = run_launch(args, timeout_s=460)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = {r.site: r for r in links.site_table(load_records(out))}
    gathers = [s for s, r in rows.items() if r.kind == "all_gather"]
    scatters = [s for s, r in rows.items() if r.kind == "psum_scatter"]
    assert len(gathers) == 4 and len(scatters) == 4, rows.keys()
    # Rank 1, in its group, is the only rank ever named at an all-gather or reduce-scatter,
    # by about its 200 ms. The first of each kind in step order always names it. A later
    # site need not: XLA's CPU runtime runs what is ready (most-depended-on first) and a
    # CPU collective holds its thread while it waits, so rank 3 may reach a later site's
    # arrival probe only after waiting for rank 1 at an earlier one, arriving with it.
    for s in gathers + scatters:
        named = {(g.rank, g.group) for g in rows[s].late}
        assert named <= {(1, (1, 3))}, (s, rows[s].late)
        assert all(g.lead_s > 0.1 for g in rows[s].late), (s, rows[s].late)
    for first in (gathers[0], scatters[0]):
        assert {(g.rank, g.group) for g in rows[first].late} == {(1, (1, 3))}, first
    named_sites = [s for s in gathers + scatters if rows[s].late]
    assert len(named_sites) >= 4, named_sites  # in practice 3 of 4 of each kind
    text = links.format_site_table(list(rows.values()))
    assert "rank 1 by" in text
    report = run_report(str(out), timeout_s=300, cwd=REPO)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "First late in the step: rank 1" in report.stdout


def test_benchmark_rewrites_only_its_section(tmp_path):
    from benchmarks import __main__ as bench
    from benchmarks import fsdp

    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"{bench.BEGIN}\ngenerated\n{bench.END}\n\n## Kept\n\nhand-written\n")
    fsdp.write_section(f"{fsdp.BEGIN}\nfirst\n{fsdp.END}", doc)
    fsdp.write_section(f"{fsdp.BEGIN}\nsecond\n{fsdp.END}", doc)
    text = doc.read_text()
    assert "second" in text and "first" not in text and text.count(fsdp.BEGIN) == 1
    assert "generated" in text and text.endswith("## Kept\n\nhand-written\n")
    assert text.index(bench.END) < text.index(fsdp.BEGIN)


def test_benchmark_table_shows_the_multi_process_run_with_its_spread():
    from benchmarks import fsdp

    def pair(lax_ms, other_ms, paired):
        return {
            "lax_ms": lax_ms,
            "other_ms": other_ms,
            "lax_iqr_ms": [lax_ms - 10, lax_ms + 20],
            "other_iqr_ms": [other_ms - 10, other_ms + 20],
            "ratio_of_medians_pct": (other_ms / lax_ms - 1) * 100,
            "paired_pct": paired,
        }

    one = {
        "machine": "m",
        "date": "d",
        "reps": 5,
        "repeats": 3,
        "batch_per_replica": 8,
        "sites_measured": 16,
        "runs": {"jaxpace": [pair(5.0, 5.2, 4.0)] * 3, "sample_every=10": [pair(5.0, 5.1, 2)] * 3},
    }
    runs = [pair(70.0, 71.4, 2.5), pair(72.0, 71.28, -0.5), pair(69.0, 72.45, 5.0)]
    mp = {"runs": runs, "processes": 4, "local_devices": 2, "sites_measured": 16}
    mp.update(reps=5, repeats=3, batch_per_replica=8)
    text = fsdp.markdown([one], mp)
    assert "4 processes x 2 CPU devices" in text and "launch -n 4 --local-devices 2" in text
    # Medians over the repeats, with the spread: the -1.0% run is not hidden.
    assert "| 70.00 ms (60.0 to 90.0 ms) | 71.40 ms" in text, text
    assert "+2.0% [-1.0, +5.0]" in text and "+2.5% [-0.5, +5.0]" in text, text
    assert text.index("4 processes") < text.index(fsdp.END)
    assert "4 processes" not in fsdp.markdown([one])
