"""Issue 47: the HTML report leads with the answer, laid out by a real browser.

The page is opened in Debian's headless chromium (`.ci/run` installs it) at 8 and 8192
ranks. A copy of the page gets a small script (the shipped page has none) that measures
what the browser laid out, after the page is parsed, and writes a JSON verdict into the
DOM (`<pre id="layout-check">`), which `--dump-dom` returns: the first text a reader
meets, the order of the sections, the boxes of sibling blocks and of every SVG text,
and the page's width. The test then asserts that the headline is the first text, the
heat map and the sites come right after it, nothing overlaps, nothing runs off the
window, and the 8192-rank page is under 5 MB.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_report_site_groups import GROUPS_4X2, grouped_records

from jaxpace.records.synthetic import synthetic_run
from jaxpace.report import analyze
from jaxpace.report.render.html import render_report_html
from jaxpace.report.render.summary import headline

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's `chromium` is not installed (.ci/run installs it: "
    "`apt-get install --no-install-recommends chromium`)",
)

MAX_PAGE_BYTES = 5_000_000

# Runs in the test's copy only. Boxes are CSS pixels of the laid-out page.
LAYOUT_CHECK = r"""
<script>
(function () {
  function box(el) {
    var r = el.getBoundingClientRect();
    return [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY];
  }
  function name(el) {
    var s = el.tagName.toLowerCase() + (el.id ? "#" + el.id : "");
    return s + ": " + (el.textContent || "").trim().slice(0, 40);
  }
  function visible(el) { return el.getClientRects().length > 0; }
  // The first text a reader meets: the first rendered, non-blank text node.
  var walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  var first = null, n;
  while ((n = walker.nextNode())) {
    var p = n.parentElement;
    if (!n.data.trim() || !visible(p) || p.closest("script, style, title")) continue;
    first = {text: n.data.trim().slice(0, 80), in_headline: !!p.closest("#headline"),
             box: box(p)};
    break;
  }
  // Sibling blocks: the body's children, each section's and figure's children.
  var groups = [];
  var containers = [document.body].concat(
    Array.from(document.querySelectorAll("header, section, figure")));
  containers.forEach(function (c) {
    var kids = Array.from(c.children).filter(function (k) {
      return visible(k) && k.tagName !== "SCRIPT" && k.id !== "layout-check";
    });
    groups.push({where: name(c), boxes: kids.map(function (k) {
      return {name: name(k), box: box(k)};
    })});
  });
  // Every text of every plot, and the plot's cell image, against each other.
  Array.from(document.querySelectorAll("svg")).forEach(function (svg, i) {
    var els = Array.from(svg.querySelectorAll("text, image"));
    groups.push({where: "svg " + i + " " + svg.getAttribute("aria-label"),
                 boxes: els.map(function (e) { return {name: name(e), box: box(e)}; })});
  });
  var sections = Array.from(document.querySelectorAll("body > header, body > section"))
    .map(function (s) { return {id: s.id || s.tagName.toLowerCase(), box: box(s)}; });
  var pre = document.createElement("pre");
  pre.id = "layout-check";
  pre.textContent = JSON.stringify({
    first: first, groups: groups, sections: sections,
    headline: box(document.getElementById("headline")),
    scroll_width: document.documentElement.scrollWidth, window_width: innerWidth,
    parsed_ms: performance.now()
  });
  document.body.appendChild(pre);
})();
</script>
"""


def _layout(page: str, tmp_path: Path, width: int) -> dict:
    """The verdict of `LAYOUT_CHECK` for `page` in a `width` px wide chromium window."""
    assert "<script" not in page  # the shipped page is script-free
    copy = tmp_path / f"checked-{width}.html"
    copy.write_text(page.replace("</body>", LAYOUT_CHECK + "</body>"))
    cmd = [
        CHROMIUM, "--headless=new", "--disable-gpu", "--no-sandbox", "--no-first-run",
        "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
        f"--window-size={width},900", "--dump-dom", copy.as_uri(),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="layout-check">(.*?)</pre>', out.stdout, flags=re.S)
    assert found, f"no verdict from chromium (rc {out.returncode}): {out.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


def _overlaps(a: list[float], b: list[float], tol: float = 0.5) -> bool:
    """Boxes [x0, y0, x1, y1] that share more than `tol` px both ways."""
    return min(a[2], b[2]) - max(a[0], b[0]) > tol and min(a[3], b[3]) - max(a[1], b[1]) > tol


def _check(v: dict, want_sections: list[str], culprit_label: str) -> None:
    first = v["first"]
    assert first["in_headline"], f"the first text is {first['text']!r}, not the headline"
    hb = v["headline"]
    # Sections in order, each below the one before; the headline's header first.
    ids = [s["id"] for s in v["sections"]]
    assert ids[: len(want_sections)] == want_sections, ids
    for prev, nxt in zip(v["sections"], v["sections"][1:], strict=False):
        assert nxt["box"][1] >= prev["box"][3] - 0.5, (prev, nxt)
    assert all(s["box"][1] >= hb[3] - 0.5 for s in v["sections"][1:])
    # Nothing overlaps: sibling blocks, and every text of every plot (and its cells).
    texts = []
    for g in v["groups"]:
        boxes = g["boxes"]
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                assert not _overlaps(boxes[i]["box"], boxes[j]["box"]), (g["where"], boxes[i], boxes[j])  # fmt: skip
        texts += [b["name"] for b in boxes]
    assert any(culprit_label in t for t in texts), f"no {culprit_label!r} on the map"
    assert v["scroll_width"] <= v["window_width"], "the page runs off the window"


@pytest.fixture(scope="module")
def page_8():
    sites = {
        "gather": {"kind": "all_gather", "groups": GROUPS_4X2},
        "reduce": {"kind": "psum", "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]},
        "swap": {"kind": "ppermute", "groups": [list(range(8))], "pairs": [[0, 1], [1, 0]]},
    }
    rep = analyze(grouped_records(sites, late_rank=5, late_s=0.020), site="gather")
    assert rep.culprit == 5 and rep.sites_table
    return rep, render_report_html(rep)


@pytest.fixture(scope="module")
def page_8192():
    recs = synthetic_run(8192, 60, ranks_per_process=8, late_rank=4099, late_s=0.002, seed=1)
    rep = analyze(recs)
    assert rep.num_ranks == 8192 and rep.culprit == 4099
    return rep, render_report_html(rep)


@pytest.mark.parametrize("width", [1280, 800])
def test_8_ranks_headline_first_then_the_map_then_the_sites(page_8, tmp_path, width):
    rep, page = page_8
    v = _layout(page, tmp_path, width)
    assert headline(rep).startswith(v["first"]["text"].rstrip(":"))
    _check(v, ["answer", "lateness", "sites", "summary"], "rank 5 (h5)")


@pytest.mark.parametrize("width", [1280, 800])
def test_8192_ranks_headline_first_nothing_overlaps_page_under_5_mb(page_8192, tmp_path, width):
    rep, page = page_8192
    size = len(page.encode())
    assert size < MAX_PAGE_BYTES, f"{size} bytes at 8192 ranks"
    v = _layout(page, tmp_path, width)
    _check(v, ["answer", "lateness", "summary"], "rank 4099 (node-512)")
