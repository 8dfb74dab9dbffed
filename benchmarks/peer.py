"""`python -m benchmarks peer --jax-src DIR`: JAX's own collective suites, plain vs jaxpace.

Runs `tests/pmap_test.py` and `tests/shard_map_test.py` of a JAX source
checkout (at the tag of the installed jax) with pytest twice: once as they are
(plain `jax.lax`), once with `jax.lax`'s collectives (psum, pmean, pmax, pmin,
all_gather, psum_scatter, ppermute, all_to_all) replaced by
jaxpace's (`benchmarks/_peer_plugin.py`, loaded with `-p`). Prints the
pass/fail/skip counts side by side, the tests that fail only with jaxpace, and
how many substituted calls were measured or passed through (with reasons), so a
green run cannot come from a vacuous substitution.

Get the sources without copying them into this repo, e.g.:

    git --git-dir=<jax clone>/.git archive jax-v0.10.2 tests jax conftest.py \
        pyproject.toml | tar -x -C /tmp/jaxsrc

Run pytest from this repo's root (never from DIR), so `import jax` is the
installed jax, not the checkout's sources; JAX's own pytest settings
(`--import-mode=importlib`, `filterwarnings=error`) come from DIR/pyproject.toml.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITES = ("pmap_test.py", "shard_map_test.py")
# mode -> (plugin mode, extra environment). "jaxpace" uses the native probes where the
# extension loads; "jaxpace-fallback" forces the io_callback probes (JAXPACE_NATIVE=0).
MODES = {
    "plain": ("plain", {}),
    "jaxpace": ("jaxpace", {}),
    "jaxpace-fallback": ("jaxpace", {"JAXPACE_NATIVE": "0"}),
}
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
# Tests that no measuring drop-in can pass, by construction, with why. Still run, still
# printed among the failures with their reason; not counted as regressions in the exit code.
BY_CONSTRUCTION = {
    "shard_map_test.py::ShardMapTest::test_rewrite_scan": (
        "asserts the exact jaxpr of a psum inside scan (two equations: psum_invariant, pvary); "
        "a measured psum's jaxpr holds jaxpace's probe equations around it (custom_jvp_call "
        "wrapping arrive, psum, done). Results are unchanged."
    ),
}


def _by_construction(test_id: str) -> str | None:
    return next((why for k, why in BY_CONSTRUCTION.items() if test_id.endswith(k)), None)


def _tests_dir(src: Path) -> Path:
    for cand in (src / "tests", src):
        if all((cand / s).is_file() for s in SUITES):
            return cand
    raise SystemExit(
        f"--jax-src {src}: expected {', '.join(SUITES)} in {src}/tests or {src}; pass the root "
        "of a JAX source checkout at the installed version's tag."
    )


def _checkout_version(src: Path) -> str | None:
    f = src / "jax" / "version.py"
    if not f.is_file():
        return None
    m = re.search(r'^_version\s*(?::\s*str)?\s*=\s*"([^"]+)"', f.read_text(), re.M)
    return m.group(1) if m else None


def run_suite(test_file: Path, mode: str, out_dir: Path, timeout_s: int, keyword: str | None):
    """One pytest run; returns the plugin's summary (plus wall time and log path)."""
    summary = out_dir / f"{test_file.stem}-{mode}.json"
    log = out_dir / f"{test_file.stem}-{mode}.log"
    summary.unlink(missing_ok=True)
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    env.setdefault("JAX_PLATFORMS", "cpu")
    plugin_mode, extra = MODES[mode]
    env.update(extra)
    env["JAXPACE_PEER_MODE"] = plugin_mode
    env["JAXPACE_PEER_OUT"] = str(summary)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "benchmarks._peer_plugin",
        f"--timeout={timeout_s}",
        "-rfE",
        str(test_file),
    ]
    if keyword:
        cmd += ["-k", keyword]
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if not summary.is_file():
        tail = log.read_text()[-3000:]
        raise SystemExit(
            f"pytest ({mode}, {test_file.name}) wrote no summary (rc {proc.returncode}):\n{tail}"
        )
    res = json.loads(summary.read_text())
    res.update(wall_s=wall, log=str(log), returncode=proc.returncode)
    return res


def _bad(res) -> set[str]:
    return {t for t, o in res["tests"].items() if o in ("failed", "error", "xpassed")}


def report(results: dict) -> tuple[list[str], int]:
    lines, regressions = [], 0
    for suite, by_mode in results.items():
        plain = by_mode["plain"]
        walls = ", ".join(f"{m} {r['wall_s']:.0f} s" for m, r in by_mode.items())
        lines.append(f"{suite}  ({walls})")
        lines.append(f"  {'':17}" + "".join(f"{o:>9}" for o in OUTCOMES))
        for mode, res in by_mode.items():
            c = res["counts"]
            lines.append(f"  {mode:17}" + "".join(f"{c.get(o, 0):>9}" for o in OUTCOMES))
        for mode, jp in by_mode.items():
            if mode == "plain":
                continue
            only = sorted(_bad(jp) - _bad(plain))
            known = [t for t in only if _by_construction(t)]
            regressions += len(only) - len(known)
            lines.append(
                f"  [{mode}] failing only with jaxpace: {len(only)}"
                + (f" ({len(known)} by construction, listed with why)" if known else "")
            )
            for t in only:
                why = _by_construction(t)
                lines.append(f"    {t}" + (f"\n      by construction: {why}" if why else ""))
            fixed = sorted(_bad(plain) - _bad(jp))
            if fixed:
                lines.append(f"  [{mode}] failing only with plain lax: {len(fixed)}")
                lines += [f"    {t}" for t in fixed]
            calls = jp["calls"]
            lines.append(
                f"  [{mode}] substituted calls (trace time): {sum(calls.values())}, in "
                f"{jp.get('tests_with_calls', '?')} tests"
            )
            for k, v in sorted(calls.items(), key=lambda kv: -kv[1]):
                lines.append(f"    {v:>6}  {k}")
            st = jp["stats"]
            lines.append(
                f"  [{mode}] default Pacer.stats(): {st['sites']} sites, {st['sites_measured']} "
                f"measured ({st['sites_measured_with_steps']} with steps > 0, "
                f"{st['steps_measured']} steps, {st['callback_errors']} callback errors)"
            )
            for probe, n in sorted(st.get("probes", {}).items(), key=lambda kv: -kv[1]):
                lines.append(f"    {n:>6} measured sites, probes: {probe}")
            for reason, n in sorted(st["sites_passed_through"].items(), key=lambda kv: -kv[1]):
                lines.append(f"    {n:>6} sites passed through: {reason}")
        lines.append("")
    return lines, regressions


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks peer", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--jax-src", required=True, help="JAX source checkout at the installed tag")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "peer"))
    ap.add_argument("--timeout", type=int, default=600, help="per-test timeout (s)")
    ap.add_argument("-k", dest="keyword", default=None, help="pytest -k expression (subsets)")
    ap.add_argument("--suite", choices=SUITES, action="append", help="default: both")
    ap.add_argument("--mode", choices=list(MODES), action="append", help="default: all three")
    args = ap.parse_args(argv)
    import jax

    src = Path(args.jax_src).resolve()
    tests = _tests_dir(src)
    version = _checkout_version(src)
    print(f"installed jax {jax.__version__}; checkout {tests} (jax/version.py: {version})")
    if version is not None and version != jax.__version__:
        print(f"WARNING: the checkout is jax {version}, the installed jax is {jax.__version__}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modes = args.mode or list(MODES)
    modes = ["plain", *[m for m in modes if m != "plain"]] if "plain" in modes else modes
    results: dict = {}
    for suite in args.suite or SUITES:
        for mode in modes:
            print(f"running {suite} ({mode}) ...", flush=True)
            res = run_suite(tests / suite, mode, out, args.timeout, args.keyword)
            print(f"  {res['counts']} in {res['wall_s']:.0f} s", flush=True)
            results.setdefault(suite, {})[mode] = res
    (out / "peer.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    if "plain" not in modes or len(modes) < 2:
        return 0
    lines, regressions = report(results)
    print("\n".join(lines))
    print(f"wrote {out / 'peer.json'}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
