"""The one SVG plot helper: frames, nice ticks, axes, line series, legends, a colour map,
raster cells and a colour bar.

Hand-written inline SVG (no scripts, no CDN), for the report's page (`render.html`)
and the simulator's (`jaxpace.sim.cli`): text at `FONT_PX` set in each SVG so that
it renders the same anywhere, margins that leave room for tick labels. Many cells
(a heat map of thousands of ranks) go in as one embedded PNG (`raster`), not one
element each: the page stays small and quick to open.
"""

from __future__ import annotations

import base64
import math
import struct
import zlib
from collections.abc import Callable, Sequence
from html import escape

import numpy as np

__all__ = [
    "CSS",
    "FONT_PX",
    "H",
    "MB",
    "ML",
    "MR",
    "MT",
    "W",
    "axes",
    "color",
    "colorbar",
    "fmt",
    "index_ticks",
    "label_step",
    "legend",
    "line_series",
    "png_data_uri",
    "raster",
    "rgb",
    "svg_open",
    "ticks",
]

W, H = 700, 330  # fits a 760 px window beside the page margins; CSS scales it down below
ML, MR, MT, MB = 70, 20, 40, 50  # margins
FONT_PX = 11  # the plots' text size, set in each SVG (so it renders the same anywhere)
# The page's style for the plots: axis lines (`class="ax"`), quantile markers (`class="q"`).
CSS = "svg .ax{stroke:#333;stroke-width:1}svg .q{stroke:#c00;stroke-dasharray:4 3}"
# Viridis anchors, low -> high.
_CMAP = np.array(
    [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=float
)


NAN_RGB = (221, 221, 221)  # cells with no value: light grey, off the colour map


def rgb(v: np.ndarray) -> np.ndarray:
    """Values in [0, 1] (clipped) on the viridis colour map: uint8 RGB, shape `v.shape + (3,)`;
    NaN becomes `NAN_RGB`."""
    v = np.asarray(v, dtype=float)
    x = np.clip(np.nan_to_num(v, nan=0.0), 0.0, 1.0) * (len(_CMAP) - 1)
    i = np.minimum(x.astype(int), len(_CMAP) - 2)
    c = _CMAP[i] + (x - i)[..., None] * (_CMAP[i + 1] - _CMAP[i])
    out = np.round(c).astype(np.uint8)
    out[np.isnan(v)] = NAN_RGB
    return out


def color(v: float) -> str:
    """`v` in [0, 1] (clipped) on the viridis colour map, as `#rrggbb`."""
    r, g, b = (int(x) for x in rgb(np.array(v)))
    return f"#{r:02x}{g:02x}{b:02x}"


def png_data_uri(pixels: np.ndarray) -> str:
    """A `data:` URI of the (h, w, 3) uint8 image `pixels` as PNG.

    Hand-written (zlib framing, 10 lines): no image library is a runtime dependency.
    """
    h, w, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[y].astype(np.uint8).tobytes() for y in range(h))

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def raster(x: float, y: float, width: float, height: float, pixels: np.ndarray) -> str:
    """An `<image>` showing `pixels` ((h, w, 3) uint8, one per cell) stretched over the box,
    each cell a sharp-edged block (no smoothing between cells)."""
    return (
        f'<image x="{x:.2f}" y="{y:.2f}" width="{width:.2f}" height="{height:.2f}" '
        f'preserveAspectRatio="none" image-rendering="optimizeSpeed" '
        f'style="image-rendering:pixelated" href="{png_data_uri(pixels)}"/>'
    )


def colorbar(x: float, y: float, width: float, vmax: float, unit: str) -> list[str]:
    """A horizontal colour bar from 0 (left) to `vmax` (right) at (x, y), 10 px tall, its
    ends labelled to its left (`0`) and right (`vmax unit`)."""
    strip = rgb(np.linspace(0.0, 1.0, 64))[None, :, :]
    return [
        f'<text x="{x - 4:.1f}" y="{y + 9:.1f}" text-anchor="end">0</text>',
        raster(x, y, width, 10, strip),
        f'<text x="{x + width + 4:.1f}" y="{y + 9:.1f}">{fmt(vmax)} {escape(unit)}</text>',
    ]


def fmt(x: float) -> str:
    """A tick or value label: 3 significant digits, `n/a` when not finite."""
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.3g}"


def svg_open(title: str, xlabel: str, ylabel: str, width: int = W, height: int = H) -> list[str]:
    """The `<svg>` element's opening, its title (centred on top) and the axis labels (an
    empty label: none)."""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" '
        f'font-family="sans-serif" font-size="{FONT_PX}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{width / 2}" y="20" text-anchor="middle" class="t" font-size="14" '
        f'font-weight="bold">{escape(title)}</text>',
    ]
    if xlabel:
        out.append(
            f'<text x="{ML + (width - ML - MR) / 2}" y="{height - 8}" text-anchor="middle">'
            f"{escape(xlabel)}</text>"
        )
    if ylabel:
        out.append(
            f'<text x="16" y="{MT + (height - MT - MB) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 16 {MT + (height - MT - MB) / 2})">{escape(ylabel)}</text>'
        )
    return out


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round tick values (steps of 1, 2, 2.5 or 5 x 10^k) from `lo` to `hi`."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    out = []
    v = start
    while v <= hi + 1e-12 * abs(hi):
        out.append(round(v, 12))
        v += step
    return out


def axes(
    x0: float,
    x1: float,
    y0: float,
    y1: float,
    xt: Sequence[float],
    yt: Sequence[float],
    *,
    width: int = W,
    height: int = H,
    xfmt: Callable[[float], str] = fmt,
    yfmt: Callable[[float], str] = fmt,
) -> tuple[list[str], Callable[[float], float], Callable[[float], float]]:
    """Axis lines and ticks at `xt`/`yt` (labelled by `xfmt`/`yfmt`), and the maps
    (fx, fy) from data to pixels."""
    pw, ph = width - ML - MR, height - MT - MB

    def fx(x):
        return ML + (x - x0) / (x1 - x0 or 1) * pw

    def fy(y):
        return MT + ph - (y - y0) / (y1 - y0 or 1) * ph

    out = [
        f'<line x1="{ML}" y1="{MT + ph}" x2="{ML + pw}" y2="{MT + ph}" class="ax"/>',
        f'<line x1="{ML}" y1="{MT}" x2="{ML}" y2="{MT + ph}" class="ax"/>',
    ]
    for t in xt:
        X = fx(t)
        out.append(
            f'<line x1="{X:.1f}" y1="{MT + ph}" x2="{X:.1f}" y2="{MT + ph + 4}" class="ax"/>'
        )
        out.append(f'<text x="{X:.1f}" y="{MT + ph + 16}" text-anchor="middle">{xfmt(t)}</text>')
    for t in yt:
        Y = fy(t)
        out.append(f'<line x1="{ML - 4}" y1="{Y:.1f}" x2="{ML}" y2="{Y:.1f}" class="ax"/>')
        out.append(f'<text x="{ML - 6}" y="{Y + 4:.1f}" text-anchor="end">{yfmt(t)}</text>')
    return out, fx, fy


def index_ticks(n: int, most: int) -> list[int]:
    """At most `most` distinct indices in [0, n), evenly spread (each label once)."""
    return sorted({int(t) for t in ticks(0, n - 1, max(most, 1)) if 0 <= t <= n - 1}) or [0]


def label_step(labels: Sequence[str], span_px: float) -> int:
    """Show every k-th of `labels` across `span_px` so that none overlaps its neighbours."""
    if not labels:
        return 1
    need = max(len(lbl) for lbl in labels) * FONT_PX * 0.62 + 8  # px per label
    return max(1, math.ceil(len(labels) * need / max(span_px, 1.0)))


def line_series(
    points: Sequence[tuple[float, float]],
    stroke: str,
    fx: Callable[[float], float],
    fy: Callable[[float], float],
    tips: Sequence[str] | None = None,
) -> list[str]:
    """A line through `points` (data coordinates) with a dot at each; `tips`: each
    dot's tooltip (escaped here)."""
    if not points:
        return []
    path = " ".join(
        f"{'M' if i == 0 else 'L'}{fx(x):.1f},{fy(y):.1f}" for i, (x, y) in enumerate(points)
    )
    out = [f'<path d="{path}" fill="none" stroke="{stroke}" stroke-width="2"/>']
    for k, (x, y) in enumerate(points):
        tip = f"<title>{escape(tips[k])}</title>" if tips is not None else ""
        out.append(
            f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="3" fill="{stroke}">{tip}</circle>'
        )
    return out


def legend(items: Sequence[tuple[str, str]], spacing: float) -> list[str]:
    """(colour, name) swatches in a row under the title, `spacing` px apart."""
    out = []
    for k, (fill, name) in enumerate(items):
        x = ML + 10 + k * spacing
        out.append(f'<rect x="{x}" y="28" width="10" height="10" fill="{fill}"/>')
        out.append(f'<text x="{x + 14}" y="37">{escape(name)}</text>')
    return out
