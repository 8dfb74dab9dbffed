"""A new user's first hour: the README's program, complete results, warnings that name the fix,
and a light core install."""

import json
import logging
import os
import re
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp
from jaxpace.records.reader import load_records

USE_IT = REPO / "examples" / "use_it.py"


def _mesh():
    return jax.make_mesh((8,), ("data",))


def _grad_step(pacer, mesh, *, pcast=True):
    def loss_fn(w, x):
        return jnp.mean((x @ w) ** 2)

    def local(w, x):
        lw = jax.lax.pcast(w, "data", to="varying") if pcast else w
        g = jax.grad(loss_fn)(lw, x)
        return w - 0.1 * pacer.pmean(g, "data", site="grads")

    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))


def _x(mesh):
    return jax.device_put(np.ones((16, 3), np.float32), NamedSharding(mesh, P("data")))


# ---------------------------------------------------------------- results cover every step


def test_stats_and_records_cover_every_dispatched_step():
    """Right after a loop (no block_until_ready) stats() and records() see all 20 steps."""
    mesh = _mesh()
    pacer = jp.Pacer(granularity="device", mesh=mesh)
    step, x, w = _grad_step(pacer, mesh), _x(mesh), jnp.ones(3)
    for _ in range(20):
        w = step(w, x)
    s = pacer.stats()["grads"]
    assert s.steps == 20 and s.in_flight == 0  # steps, not rank-steps (issue 26)
    steps = [r for r in pacer.records() if r.get("type") == "step"]
    assert len(steps) == 20 * 8
    pacer.close()


# ---------------------------------------------------------------- silent non-measurement


def test_already_invariant_operand_warns_with_the_fix(caplog):
    mesh = _mesh()
    pacer = jp.Pacer(granularity="device", mesh=mesh)
    with caplog.at_level(logging.WARNING, logger="jaxpace"):
        jax.block_until_ready(_grad_step(pacer, mesh, pcast=False)(jnp.ones(3), _x(mesh)))
    msgs = [r.getMessage() for r in caplog.records if "already invariant" in r.getMessage()]
    assert len(msgs) == 1 and "pcast" in msgs[0] and "grads" in msgs[0]
    pacer.close()


def test_varying_operand_does_not_warn(caplog):
    mesh = _mesh()
    pacer = jp.Pacer(granularity="device", mesh=mesh)
    with caplog.at_level(logging.WARNING, logger="jaxpace"):
        jax.block_until_ready(_grad_step(pacer, mesh, pcast=True)(jnp.ones(3), _x(mesh)))
    assert not [r for r in caplog.records if "already invariant" in r.getMessage()]
    pacer.close()


def test_one_process_default_granularity_says_use_device(caplog):
    mesh = _mesh()
    pacer = jp.Pacer(mesh=mesh)  # granularity="process": one rank in a one-process job
    with caplog.at_level(logging.WARNING, logger="jaxpace"):
        jax.block_until_ready(_grad_step(pacer, mesh)(jnp.ones(3), _x(mesh)))
    msgs = [r.getMessage() for r in caplog.records if "one rank" in r.getMessage()]
    assert len(msgs) == 1 and "granularity='device'" in msgs[0]
    pacer.close()


# ---------------------------------------------------------------- bitwise, with chex variants


class BitwiseVariants(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_pmean_is_bitwise_lax(self):
        mesh = _mesh()
        pacer = jp.Pacer(granularity="device", mesh=mesh)
        tree = {"a": jnp.linspace(-3.0, 7.0, 8 * 5).reshape(8, 5), "b": jnp.arange(8.0) / 3}
        tree = jax.device_put(tree, NamedSharding(mesh, P("data")))

        def run(reduce):
            f = jax.shard_map(
                lambda t: reduce(t, "data"), mesh=mesh, in_specs=P("data"), out_specs=P()
            )
            return self.variant(f)(tree)

        chex.assert_trees_all_equal(run(pacer.pmean), run(jax.lax.pmean))
        chex.assert_trees_all_equal(run(pacer.psum), run(jax.lax.psum))
        pacer.close()


# ---------------------------------------------------------------- the README's program


def _readme():
    return (REPO / "README.md").read_text()


def test_readme_use_it_is_the_tested_file():
    block = "```python\n" + USE_IT.read_text() + "```"
    assert block in _readme(), "README 'Use it' must include examples/use_it.py verbatim"


def test_docs_do_not_replace_params_by_their_pcast():
    """The pcast'ed copy must not replace `params` (the update then fails out_specs=P())."""
    bad = re.compile(r"params\s*=\s*jax\.tree\.map\(\s*lambda p: jax\.lax\.pcast")
    for path in [REPO / "README.md", *(REPO / "docs").glob("*.md"), USE_IT]:
        assert not bad.search(path.read_text()), path


def _env(**extra):
    e = dict(os.environ)
    e.pop("XLA_FLAGS", None)
    e.update(extra)
    return e


def _records(out, p):
    dicts = load_records(out / f"records-p{p}.parquet").to_dicts()  # the native format
    return [d for d in dicts if d.get("type") == "step"]


def test_use_it_runs_as_written_single_process(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, USE_IT, f"{out}/"],
        env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"),
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"process 0: \S+: 20 steps", proc.stdout), proc.stdout
    assert len(_records(out, 0)) == 20


@pytest.mark.multiprocess
def test_use_it_under_launch_joins_one_job(tmp_path, launch):
    out = tmp_path / "run"
    proc = launch(
        ["-n", 2, "--local-devices", 2, "--timeout", 200, "--", sys.executable, USE_IT, f"{out}/"],
        timeout_s=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for p in range(2):
        steps = _records(out, p)
        assert len(steps) == 20 and {r["rank"] for r in steps} == {p}
    header = load_records(out / "records-p1.parquet").headers[0]
    assert header["process_count"] == 2


@pytest.mark.multiprocess
def test_replace_psum_example_joins_the_launched_job(launch):
    proc = launch(
        [
            "-n",
            2,
            "--local-devices",
            2,
            "--timeout",
            200,
            "--",
            sys.executable,
            REPO / "examples" / "replace_psum.py",
        ],  # fmt: skip
        timeout_s=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "process 1 of 2" in proc.stdout and "process 0 of 2" in proc.stdout


# ---------------------------------------------------------------- docs


def test_docs_name_only_files_in_the_repo():
    """Every relative link and every backquoted repo path in README and docs exists."""
    missing = []
    for md in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        text = md.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if "://" not in target and not (md.parent / target).exists():
                missing.append(f"{md.name}: link {target}")
        for path in re.findall(
            r"`((?:jaxpace|tests|examples|docs|benchmarks|shared)/[\w./-]+)", text
        ):
            # Package paths (`jaxpace/...`) name files of the package, which lives in src/.
            where = REPO / "src" if path.startswith("jaxpace/") else REPO
            if "*" not in path and not (where / path.rstrip("/.")).exists():
                missing.append(f"{md.name}: `{path}`")
    assert not missing, missing


# ---------------------------------------------------------------- a light core install


def test_core_install_pulls_only_jax_numpy_rich_and_their_dependencies(tmp_path):
    """`pip install .` (no extras) resolves to jax, numpy, rich, scipy (which jax requires
    too; named because `jaxpace.diagnosis.stats` uses it), pyarrow and duckdb (the records
    format and the report's engine, issue 46: `pip install .` gives a working `jaxpace
    report`; imported lazily) and their own requirements.

    Needs the package index (CI installs from it too). If it cannot be reached the
    test FAILS with pip's message rather than skipping: a skipped check could let a
    heavy dependency slip into the core unnoticed, and CI cannot install at all without
    the index anyway.
    """
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
           "--quiet", "--report", str(report), str(REPO)]  # fmt: skip
    for _ in range(2):  # one retry for a transient index error
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        if proc.returncode == 0:
            break
    assert proc.returncode == 0, "pip could not resolve the core install:\n" + proc.stderr[-3000:]
    items = json.loads(report.read_text())["install"]
    meta = {_norm(i["metadata"]["name"]): i["metadata"] for i in items}
    core = {"jax", "numpy", "rich", "scipy", "pyarrow", "duckdb"}
    assert set(_requires(meta["jaxpace"])) == core
    closure, todo = set(), sorted(core)
    while todo:
        name = todo.pop()
        if name not in closure:
            closure.add(name)
            todo += _requires(meta[name])
    assert set(meta) - {"jaxpace"} == closure
    for heavy in ("flax", "optax", "chex", "orbax-checkpoint", "tensorstore", "prometheus-client",
                  "tensorboardx", "tensorboard"):  # fmt: skip
        assert heavy not in meta


def _norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(metadata):
    """Names of the unconditional requirements (no extra, no unmet marker) in `metadata`."""
    from packaging.requirements import Requirement

    out = []
    for spec in metadata.get("requires_dist", []):
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(_norm(req.name))
    return out


# ---------------------------------------------------------------- CLI and report presentation


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "jaxpace", *args], capture_output=True, text=True, timeout=120,
        env=_env(JAX_PLATFORMS="cpu"),
    )  # fmt: skip


def test_typo_flag_under_report_prints_report_usage(tmp_path):
    proc = _cli("report", str(tmp_path), "--warmpu", "3")
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: jaxpace report") and "--warmpu" in proc.stderr


def test_topo_bad_mesh_is_an_error_even_without_gpus():
    proc = _cli("topo", "--mesh", "abc")
    assert proc.returncode == 2 and "--mesh" in proc.stderr and "'abc'" in proc.stderr


def test_demo_help_describes_the_current_demo():
    proc = _cli("demo", "--help")
    assert proc.returncode == 0 and "interleaved" in proc.stdout and "Flax" in proc.stdout


def test_no_what_if_row_without_culprit_and_warmup_is_the_one_used():
    from jaxpace.report import analyze, synthetic_records
    from jaxpace.report.render.tables import summary_rows

    rep = analyze(synthetic_records(8, 40, seed=3))
    assert rep.culprit is None
    assert not any(r[0].startswith("what if") for r in summary_rows(rep))
    rep = analyze(synthetic_records(8, 40, seed=3), warmup_steps=1000)  # leaves no step
    assert rep.warmup_steps == 0 and rep.analyzed_steps > 0


def test_every_report_says_what_to_do_next_in_terminal_and_html():
    import io

    from rich.console import Console

    from jaxpace.report import analyze, print_summary, synthetic_records
    from jaxpace.report.render.html import render_report_html

    straggler = analyze(synthetic_records(8, 60, late_rank=3, late_s=0.01, seed=1))
    balanced = analyze(synthetic_records(8, 60, seed=1))
    for rep, must in ((straggler, "nvidia-smi -q -d CLOCK"), (balanced, "Nothing to fix")):
        buf = io.StringIO()
        print_summary(rep, Console(file=buf, width=250))
        page = render_report_html(rep)
        assert "What to do next" in buf.getvalue() and must in buf.getvalue()
        assert "<h2>What to do next</h2>" in page and must in page
    assert "node-3" in render_report_html(straggler).split("What to do next")[1][:400]


def test_html_plots_use_the_analyzed_steps_and_supported_forecasts_only():
    from jaxpace.report import analyze, synthetic_records
    from jaxpace.report.render.html import render_report_html

    rep = analyze(synthetic_records(4, 60, late_rank=1, late_s=0.01, seed=2))
    page = render_report_html(rep)
    p50 = float(np.median(np.median(rep.data.step_time[rep.warmup_steps :], axis=1))) * 1e3
    assert f"p50 {p50:.3g} ms" in page
    assert "lognormal fit" not in page  # one straggler in 4 ranks: no lognormal extrapolation
    assert "<td class=l>" in page.split("<h2>Failure modes</h2>")[1].split("</table>")[0]


def test_perfetto_slices_never_overlap_on_a_track():
    from jaxpace.records.perfetto import trace_events
    from jaxpace.records.reader import load_records
    from jaxpace.records.site_data import site_data
    from jaxpace.report import synthetic_records

    recs = load_records(
        synthetic_records(4, 80, late_rank=1, late_s=0.02, straggler_prob=0.1, seed=4)
    )
    data, _, _ = site_data(recs, recs.sites[0])
    tracks = {}
    for e in trace_events(data, recs.sites[0])["traceEvents"]:
        if e["ph"] == "X":
            tracks.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end - 1e-9, (end, start)
