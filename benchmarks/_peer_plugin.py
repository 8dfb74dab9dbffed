"""pytest plugin for `python -m benchmarks peer`: routes `jax.lax`'s collectives through jaxpace.

Loaded with `-p benchmarks._peer_plugin` into a pytest run of JAX's own test
files. Environment:

  JAXPACE_PEER_MODE   "plain" (count outcomes only) or "jaxpace" (substitute)
  JAXPACE_PEER_OUT    path of the JSON summary written at the end of the session
  JAXPACE_PEER_KINDS  comma list of the collectives to route (default: all eight,
                      psum, pmean, pmax, pmin, all_gather, psum_scatter, ppermute, all_to_all)

jaxpace is imported *before* the patch, so `jaxpace.collectives.kinds.LAX` holds the real
`jax.lax` functions and jaxpace's own collectives never recurse into the
substitutes. Only the public names (`jax.lax.psum`, `jax.lax.all_gather`, ...)
are replaced: JAX's test files reach them as `lax.psum`/`jax.lax.psum`, and
replacing the names inside `jax._src.lax.parallel` would reroute lax's own
internals (its `pmean` calls the module-level `psum`), which is not what a
user's code does.

Every substituted call is classified at trace time by what the default
`Pacer`'s runtime did during it: it opened a measured site ("measured"),
recorded a pass-through reason ("passed through: <reason>"), neither (a call
jaxpace hands to lax before any decision, e.g. `psum(x, ())`), or it raised.
`Pacer.stats()` of the default pacer is summarised at the end as well.
"""

from __future__ import annotations

import collections
import inspect
import json
import os
import sys

import jax

import jaxpace
from jaxpace.collectives import kinds as _kinds

MODE = os.environ.get("JAXPACE_PEER_MODE", "plain")
OUT = os.environ.get("JAXPACE_PEER_OUT")

KINDS = tuple(
    k
    for k in os.environ.get(
        "JAXPACE_PEER_KINDS", "psum,pmean,pmax,pmin,all_gather,psum_scatter,ppermute,all_to_all"
    ).split(",")
    if k
)
_REAL = {k: getattr(jax.lax, k, None) for k in KINDS}
_outcomes: collections.Counter = collections.Counter()
_tests: dict[str, str] = {}
_test_calls: collections.Counter = collections.Counter()
_state = {"event": None, "test": None}


def _install() -> None:
    unknown = sorted(set(KINDS) - set(_kinds.KINDS))
    if unknown:
        raise RuntimeError(f"JAXPACE_PEER_KINDS: unknown {unknown}; choose from {_kinds.KINDS}")
    if any(_kinds.LAX[k] is not _REAL[k] for k in KINDS):
        raise RuntimeError("jaxpace.collectives.kinds.LAX does not hold the real jax.lax functions")
    hooks = jaxpace.default_pacer().hooks
    real_open, real_note = hooks.open_site, hooks.note_unmeasured

    def open_site(name, num_slots, layout):
        _state["event"] = "measured"
        return real_open(name, num_slots, layout)

    def note_unmeasured(site, reason):
        _state["event"] = f"passed through: {reason}"
        return real_note(site, reason)

    hooks.open_site = open_site
    hooks.note_unmeasured = note_unmeasured

    def wrap(kind):
        jp_fn = getattr(jaxpace, kind)

        def substitute(*args, **kwargs):
            # The site jaxpace would name itself if the test called it directly
            # (its own default would name this wrapper's line for every call).
            f = sys._getframe(1)
            site = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}:{f.f_code.co_name}"
            _state["event"] = None
            try:
                out = jp_fn(*args, site=site, **kwargs)
            except BaseException as e:
                _outcomes[f"{kind}: raised {type(e).__name__}"] += 1
                raise
            _outcomes[f"{kind}: {_state['event'] or 'handed to lax before any decision'}"] += 1
            _test_calls[_state["test"]] += 1
            return out

        substitute.__name__ = substitute.__qualname__ = kind
        substitute.__doc__ = _REAL[kind].__doc__
        substitute.__signature__ = inspect.signature(_REAL[kind])
        return substitute

    for kind in KINDS:
        setattr(jax.lax, kind, wrap(kind))


if MODE == "jaxpace":
    _install()
elif MODE != "plain":
    raise RuntimeError(f"JAXPACE_PEER_MODE must be 'plain' or 'jaxpace', got {MODE!r}")


def pytest_runtest_logstart(nodeid, location):
    _state["test"] = nodeid


def pytest_runtest_logreport(report):
    """One outcome per test: passed / failed / skipped / error (setup or teardown) / xfail."""
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    elif report.when == "call":
        outcome = report.outcome
    elif report.skipped:
        outcome = "skipped"
    elif report.failed:
        outcome = "error"
    else:
        return
    if _tests.get(report.nodeid) in (None, "passed"):
        _tests[report.nodeid] = outcome


def _stats_summary() -> dict:
    if MODE != "jaxpace":
        return {}
    st = jaxpace.default_pacer().stats()
    reasons = collections.Counter(s.unmeasured_reason for s in st.values() if not s.measured)
    measured = [s for s in st.values() if s.measured]
    return {
        "sites": len(st),
        "sites_measured": len(measured),
        "sites_measured_with_steps": sum(1 for s in measured if s.steps > 0),
        "steps_measured": int(sum(s.steps for s in measured)),
        "callback_errors": int(sum(s.errors for s in measured)),
        "probes": dict(collections.Counter(str(getattr(s, "probe", "n/a")) for s in measured)),
        "sites_passed_through": dict(reasons),
    }


def pytest_sessionfinish(session, exitstatus):
    if not OUT:
        return
    counts = collections.Counter(_tests.values())
    with open(OUT, "w") as f:
        json.dump(
            {
                "mode": MODE,
                "exitstatus": int(exitstatus),
                "counts": dict(counts),
                "tests": _tests,
                "calls": dict(_outcomes),
                "tests_with_calls": len(_test_calls),
                "stats": _stats_summary(),
            },
            f,
            indent=1,
            sort_keys=True,
        )
