"""`python -m benchmarks html`: the HTML report's size and how fast chromium opens it.

Synthetic runs (one culprit, 8 ranks a host) at 8 and 8192 ranks: the page's bytes, the
time to render it, and, in Debian's headless chromium, the page's own load time (the
navigation's `loadEventEnd`, from a script added to a copy of the page) and the wall
time of the whole `chromium --dump-dom` process (browser start included), beside that of
an empty page. Medians over `--reps` launches. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMING = """<script>
window.addEventListener("load", function () {
  setTimeout(function () {
    var nav = performance.getEntriesByType("navigation")[0];
    var pre = document.createElement("pre");
    pre.id = "timing";
    pre.textContent = JSON.stringify({load_ms: nav.loadEventEnd});
    document.body.appendChild(pre);
  }, 0);
});
</script>"""

SIZES = ((8, 60), (8192, 60), (8192, 1000))


def _chromium(chromium: str, page: Path, profile: Path) -> tuple[float, float | None]:
    """(wall seconds of the process, the page's loadEventEnd in ms or None)."""
    cmd = [
        chromium, "--headless=new", "--disable-gpu", "--no-sandbox", "--no-first-run",
        f"--user-data-dir={profile}", "--dump-dom", page.as_uri(),
    ]  # fmt: skip
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    found = re.search(r'<pre id="timing">(.*?)</pre>', out.stdout)
    return wall, json.loads(found.group(1))["load_ms"] if found else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="chromium launches per page")
    args = ap.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("chromium is not installed (apt-get install --no-install-recommends chromium)")
        return 1
    from jaxpace.records.synthetic import synthetic_run
    from jaxpace.report import analyze
    from jaxpace.report.render.html import render_report_html

    tmp = Path(tempfile.mkdtemp(prefix="jaxpace-html-bench-"))
    blank = tmp / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body>" + TIMING + "</body></html>")
    rows = []
    try:
        blank_wall = statistics.median(
            _chromium(chromium, blank, tmp / "profile")[0] for _ in range(args.reps)
        )
        for ranks, steps in SIZES:
            rpp = min(8, ranks)
            recs = synthetic_run(
                ranks, steps, ranks_per_process=rpp, late_rank=ranks // 2 + 3, late_s=0.002
            )
            rep = analyze(recs)
            t0 = time.perf_counter()
            page = render_report_html(rep)
            render_s = time.perf_counter() - t0
            path = tmp / f"page-{ranks}-{steps}.html"
            path.write_text(page.replace("</body>", TIMING + "</body>"))
            runs = [_chromium(chromium, path, tmp / "profile") for _ in range(args.reps)]
            loads = [ms for _, ms in runs if ms is not None]
            rows.append(
                (ranks, steps, len(page.encode()), render_s,
                 statistics.median(loads) if loads else float("nan"),
                 statistics.median(w for w, _ in runs))
            )  # fmt: skip
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    version = subprocess.run([chromium, "--version"], capture_output=True, text=True).stdout
    print(f"\n{version.strip()}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}")
    print(f"empty page: chromium --dump-dom {blank_wall:.2f} s (median of {args.reps})\n")
    print("| ranks x steps | page | render | page load (loadEventEnd) | chromium --dump-dom |")
    print("|---|---|---|---|---|")
    for ranks, steps, size, render_s, load_ms, wall in rows:
        print(
            f"| {ranks} x {steps} | {size / 1e3:.0f} kB | {render_s:.2f} s | {load_ms:.0f} ms "
            f"| {wall:.2f} s |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
