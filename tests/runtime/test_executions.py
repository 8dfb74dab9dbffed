"""Issue 47: jaxpace's records carry the program execution (XLA's run id, read by the
native probes), so the whole step is one execution of the program even when every
collective runs several times an execution (a `lax.scan` over microbatches)."""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpace as jp
from jaxpace.native.probes import available as native_available
from jaxpace.records.reader import load_records
from jaxpace.report import analyze

CALLS = 5

native = pytest.mark.skipif(
    not native_available()[0], reason="the execution id comes from the native probes"
)


def _run(tmp_path, *, outer: bool, **pacer_kw):
    """A jit/shard_map step on 8 CPU devices: a drop-in psum in a `lax.scan` of 4, and
    (`outer`) one after it; `CALLS` calls, exported as Parquet and as JSONL."""
    pacer = jp.Pacer(granularity="device", **pacer_kw)
    mesh = jax.make_mesh((8,), ("data",))

    def body(x):
        def micro(c, _):
            return c + pacer.psum(c, "data", site="micro") * 1e-3, None

        x, _ = jax.lax.scan(micro, x, None, length=4)
        return x + pacer.psum(x, "data", site="outer") * 1e-3 if outer else x

    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data")))
    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("data")))
    for _ in range(CALLS):
        x = step(x)
    x.block_until_ready()
    pacer.export(tmp_path / "pq")
    pacer.export(tmp_path / "jl" / "records-p0.jsonl")
    return pacer


@native
@pytest.mark.timeout(120)
def test_records_carry_one_execution_per_call_and_the_whole_step_folds_by_it(tmp_path):
    _run(tmp_path, outer=True)
    line = json.loads((tmp_path / "jl" / "records-p0.jsonl").read_text().splitlines()[1])
    assert isinstance(line["execution"], int)  # XLA's run id, as the native probe read it
    for fmt in ("pq", "jl"):
        recs = load_records(tmp_path / fmt)
        c = recs.columns
        assert np.array_equal(np.unique(c["execution"]), np.arange(CALLS)), fmt
        for i, site in enumerate(recs.sites):
            sel = c["site"] == i
            # every rank's k-th run of a site is in the same execution, in step order
            per = 4 if site == "micro" else 1
            assert np.array_equal(c["execution"][sel], c["step"][sel] // per), (fmt, site)
        rep = analyze(tmp_path / fmt, warmup_steps=0)
        assert rep.site == "(whole step)" and rep.num_steps == CALLS and rep.num_ranks == 8
        assert any("execution ids" in n and "`micro` x4" in n for n in rep.notes)


@native
@pytest.mark.timeout(120)
def test_a_program_whose_only_collective_is_in_a_scan_has_one_step_per_call(tmp_path):
    """Folding by step counts cannot see this: the site's 20 steps look like 20
    executions. The execution ids say 5."""
    _run(tmp_path, outer=False)
    rep = analyze(tmp_path / "pq", warmup_steps=0)
    assert rep.num_steps == CALLS
    assert any("`micro` x4" in n for n in rep.notes)


@pytest.mark.timeout(120)
def test_the_io_callback_probes_write_no_execution_and_the_step_folds_by_counts(tmp_path):
    """A custom clock runs the io_callback probes, which cannot read XLA's run id: no
    column, and the whole step folds the scan's site by its step counts, as before."""
    _run(tmp_path, outer=True, clock=lambda: time.perf_counter_ns())
    recs = load_records(tmp_path / "pq")
    assert "execution" not in recs.columns and len(recs)
    rep = analyze(tmp_path / "pq", warmup_steps=0)
    assert rep.num_steps == CALLS
    assert any("step counts are that multiple" in n and "`micro` x4" in n for n in rep.notes)
