"""Issue 26, item 9: the HTML report's plots render without overlapping or clipped text.

Each plot is rendered with cairosvg; every text element is then rendered alone
to find its pixels, and no two texts may share a pixel box, none may leave the
canvas, and no axis repeats a tick label. The page scales plots down to fit
windows from 760 px (CSS `max-width:100%`), so the plot's own canvas is what
must hold together at every width from 760 to 1600 px.
"""

from __future__ import annotations

import copy
import io
import math
import re
import xml.etree.ElementTree as ET

import cairosvg  # the dev extra installs it (and pillow with it): a missing one fails
import numpy as np
import PIL.Image as PIL_Image
import pytest

from jaxpace.report import analyze, synthetic_records
from jaxpace.report.render.html import render_report_html

SVG_NS = "{http://www.w3.org/2000/svg}"
ET.register_namespace("", SVG_NS[1:-1])


def _svgs(page: str) -> list[str]:
    return re.findall(r"<svg .*?</svg>", page, flags=re.S)


def _render(root: ET.Element) -> np.ndarray:
    png = cairosvg.svg2png(bytestring=ET.tostring(root))
    return np.asarray(PIL_Image.open(io.BytesIO(png)).convert("RGBA"))


def _text_boxes(svg: str) -> list[tuple[str, tuple[int, int, int, int]]]:
    """(text, (x0, y0, x1, y1)) of every text element, from its own rendering."""
    root = ET.fromstring(svg)
    texts = [el for el in root.iter(f"{SVG_NS}text")]
    boxes = []
    for i, el in enumerate(texts):
        alone = copy.deepcopy(root)
        keep = list(alone.iter(f"{SVG_NS}text"))[i]
        for parent in alone.iter():
            for child in list(parent):
                if (
                    child.tag != f"{SVG_NS}text"
                    and child.tag != f"{SVG_NS}title"
                    or (child.tag == f"{SVG_NS}text" and child is not keep)
                ):
                    parent.remove(child)
        alpha = _render(alone)[..., 3]
        ys, xs = np.nonzero(alpha > 0)
        assert xs.size, f"text {el.text!r} renders nothing"
        boxes.append((el.text or "", (xs.min(), ys.min(), xs.max(), ys.max())))
    return boxes


def _overlap(a, b) -> bool:
    return not (a[2] < b[0] or b[2] < a[0] or a[3] < b[1] or b[3] < a[1])


def _check_svg(svg: str) -> None:
    root = ET.fromstring(svg)
    w, h = int(root.get("width")), int(root.get("height"))
    img = _render(root)
    assert img.shape[:2] == (h, w)
    boxes = _text_boxes(svg)
    for text, (x0, y0, x1, y1) in boxes:
        # Clipped text would touch the canvas edge: keep a pixel of room.
        assert x0 >= 1 and y0 >= 1 and x1 <= w - 2 and y1 <= h - 2, (text, (x0, y0, x1, y1), w)
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not _overlap(boxes[i][1], boxes[j][1]), (boxes[i], boxes[j])


REPORTS = {
    # The case: 2 ranks, 15 steps (no forecast to fit, y labels "0" five times).
    "2 ranks, 15 steps": lambda: analyze(synthetic_records(2, 15, seed=0)),
    "8 ranks, a straggler": lambda: analyze(
        synthetic_records(8, 60, late_rank=3, late_s=0.01, seed=1)
    ),
    "64 ranks, balanced, forecast": lambda: analyze(synthetic_records(64, 200, seed=2)),
    "300 ranks, binned": lambda: analyze(synthetic_records(300, 30, late_rank=7, seed=3)),
}


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_plots_render_without_overlapping_or_clipped_text(name):
    page = render_report_html(REPORTS[name]())
    svgs = _svgs(page)
    assert len(svgs) == 4
    for svg in svgs:
        _check_svg(svg)


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_axis_tick_labels_are_not_repeated(name):
    """The heat map once labelled rank 0 five times for 2 ranks."""
    for svg in _svgs(render_report_html(REPORTS[name]())):
        root = ET.fromstring(svg)
        by_axis: dict[tuple[str, str], list[str]] = {}
        for el in root.iter(f"{SVG_NS}text"):
            if el.get("text-anchor") == "end":  # y tick labels
                by_axis.setdefault(("y", el.get("x")), []).append(el.text)
            elif el.get("text-anchor") == "middle" and el.get("transform") is None:
                by_axis.setdefault(("x", el.get("y")), []).append(el.text)
        for axis, labels in by_axis.items():
            assert len(labels) == len(set(labels)), (axis, labels)


def test_plots_fit_a_760_px_window_and_scale_down():
    page = render_report_html(REPORTS["8 ranks, a straggler"]())
    assert re.search(r"svg\{[^}]*max-width:100%[^}]*height:auto", page)
    widths = [int(ET.fromstring(s).get("width")) for s in _svgs(page)]
    assert max(widths) <= 1600 and sorted(widths)[0] <= 760 - 2 * 24


def test_forecast_note_is_a_caption_not_text_on_the_axis():
    """The note once sat on the x-axis label's line, cut off at 760 px."""
    page = render_report_html(REPORTS["2 ranks, 15 steps"]())
    forecast_svg = _svgs(page)[3]
    assert "too few" not in forecast_svg and "compute samples" not in forecast_svg
    figure = next(f for f in page.split("<figure>") if "Amplification forecast" in f)
    caption = re.search(r"<figcaption>(.*?)</figcaption>", figure, flags=re.S).group(1)
    assert "compute samples" in caption


def _sim_rows(nodes):
    from types import SimpleNamespace

    def result(n, paced):
        eff = 0.99 ** math.log2(n) * (1.02 if paced else 1.0)
        return SimpleNamespace(
            ranks=8 * n, throughput_per_s=8 * n * 95.0 * eff, scaling_efficiency=eff,
            cv=0.01 + 0.004 * math.log2(n), p99_step_s=0.012 + 0.0004 * math.log2(n),
            mean_step_s=0.0105, engaged_fraction=0.5 if paced else 0.0,
        )  # fmt: skip

    return [(n, result(n, False), result(n, True) if n > 1 else None) for n in nodes]


@pytest.mark.parametrize("nodes", [(1,), (1, 2), tuple(2**k for k in range(11))])
def test_simulator_plots_share_the_report_plot_helper(nodes):
    """`jaxpace simulate --html` draws with `report.render.svg`: same checks as the report's."""
    from jaxpace.sim.cli import render_scaling_html

    svgs = _svgs(render_scaling_html(_sim_rows(nodes), "paper", "adaptive"))
    assert len(svgs) == 4
    for svg in svgs:
        _check_svg(svg)
        root = ET.fromstring(svg)
        x_labels = [el.text for el in root.iter(f"{SVG_NS}text") if el.get("y") == "226"]
        assert x_labels == [str(n) for n in nodes]  # one tick label per node count
        paths = list(root.iter(f"{SVG_NS}path"))
        assert len(paths) == (1 if nodes == (1,) else 2)  # no pacing, and pacing from 2 nodes
