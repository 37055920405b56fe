"""Charts as inline SVG, drawn here: an N x N matrix (colour scale, marked cells, value on hover and in the cell
when it fits), bars against the median, and a timeline of rows.

Why drawn here and not with a chart library: a library inlined into every page costs 50 KB (uPlot) to 1 MB
(Plotly, ECharts), needs JavaScript to show anything at all, and prints poorly; these three chart kinds are
a few dozen lines each as SVG, which every browser shows without script, prints as vectors and keeps small.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from clusterrun.report.html import GREY, ORANGE, VERMILLION, esc

# viridis, sampled: dark (worst) to light (best). Perceptually even and readable with colour-vision deficiencies.
_VIRIDIS = ((68, 1, 84), (72, 40, 120), (62, 74, 137), (49, 104, 142), (38, 130, 142), (31, 158, 137),
            (53, 183, 121), (110, 206, 88), (181, 222, 43), (253, 231, 37))


def scale(t: float) -> str:
    """The colour of ``t`` in [0, 1] (0 worst, 1 best)."""
    t = min(1.0, max(0.0, t)) * (len(_VIRIDIS) - 1)
    i = min(int(t), len(_VIRIDIS) - 2)
    f = t - i
    r, g, b = (round(a + (b - a) * f) for a, b in zip(_VIRIDIS[i], _VIRIDIS[i + 1], strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def ink(t: float) -> str:
    """Text colour readable on :func:`scale`'s colour of ``t``."""
    return "#000" if t > 0.55 else "#fff"


#: Up to this many nodes every matrix cell has its own hover text; beyond it cells are drawn compactly (the page
#: stays a few MB at 128 nodes) and the values are in the row labels' hover and the tables.
HOVER_UP_TO = 48


@dataclass(frozen=True)
class Cell:
    """One matrix cell: ``good`` in [0, 1] colours it (None: no value), ``text`` is shown in it when it fits,
    ``title`` on hover; ``status`` is ``ok``, ``slow`` (outlined, with a ▼), ``fail`` (hatched, ✗) or ``untried``."""

    text: str
    title: str
    good: float | None
    status: str = "ok"


_HATCH = ('<defs><pattern id="hatch{uid}" width="6" height="6" patternUnits="userSpaceOnUse" '
          'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f3d5c4"/>'
          f'<line x1="0" y1="0" x2="0" y2="6" stroke="{VERMILLION}" stroke-width="2.5"/></pattern></defs>')


def matrix(names: Sequence[str], cells: Mapping[tuple[str, str], Cell], *, uid: str, row_notes: Mapping[str, str]
           | None = None, label: str = "", row_titles: Mapping[str, str] | None = None) -> str:
    """The N x N matrix of ``names`` (rows: from, columns: to); ``row_notes`` follow a row's name (a failing NIC),
    ``row_titles`` are its hover text."""
    n = max(len(names), 1)
    size = max(6, min(46, 720 // n))
    row_notes = row_notes or {}
    labels = [f"{name}{row_notes.get(name, '')}" for name in names]
    left = min(260, 12 + 7 * max((len(s) for s in labels), default=4))
    top = min(160, 14 + 6 * max((len(s) for s in names), default=4)) if size < 60 else 40
    width, height = left + n * size + 10, top + n * size + 10
    font = max(6, min(12, size - 4))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{esc(label)}" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}">', _HATCH.replace("{uid}", uid)]
    for i, name in enumerate(names):
        y = top + i * size + size / 2 + font / 3
        strong = f' font-weight="700" fill="{VERMILLION}"' if name in row_notes else ""
        hover = f"<title>{esc(row_titles[name])}</title>" if row_titles and name in row_titles else ""
        out.append(f'<text x="{left - 6}" y="{y:.1f}" text-anchor="end" font-size="{font}"{strong}>'
                   f'{esc(labels[i])}{hover}</text>')
        x = left + i * size + size / 2 + font / 3
        out.append(f'<text transform="translate({x:.1f},{top - 6}) rotate(-55)" font-size="{font}"{strong}>'
                   f'{esc(name)}</text>')
    show_text = size >= 34
    compact = n > HOVER_UP_TO
    buckets: dict[str, list[str]] = {}
    for i, src in enumerate(names):
        for j, dst in enumerate(names):
            x, y = left + j * size, top + i * size
            if i == j:
                out.append(f'<rect x="{x}" y="{y}" width="{size}" height="{size}" fill="#eee"/>')
                continue
            c = cells.get((src, dst))
            if c is None:
                if not compact:
                    out.append(f'<rect x="{x}" y="{y}" width="{size}" height="{size}" fill="#fff" stroke="#ddd">'
                               f'<title>{esc(src)} \u2192 {esc(dst)}: not measured</title></rect>')
                continue
            if compact and c.status == "ok" and c.good is not None:
                # Many nodes: one path per colour (a few bytes a cell); the row's label and the tables say the rest.
                fill = scale(round(c.good * 24) / 24)
                buckets.setdefault(fill, []).append(f"M{x} {y}h{size}v{size}h-{size}z")
                continue
            fill = (f"url(#hatch{uid})" if c.status == "fail" else "#fff" if c.good is None
                    else scale(c.good))
            stroke = (f' stroke="{ORANGE}" stroke-width="3"' if c.status == "slow" else
                      f' stroke="{VERMILLION}" stroke-width="1.5"' if c.status == "fail" else ' stroke="#fff"')
            inset = 1.5 if c.status == "slow" and size > 8 else 0
            out.append(f'<rect x="{x + inset}" y="{y + inset}" width="{size - 2 * inset}" height="{size - 2 * inset}" '
                       f'fill="{fill}"{stroke}><title>{esc(c.title)}</title></rect>')
            glyph = {"fail": "\u2717", "untried": "?", "slow": "\u25bc"}.get(c.status, "")
            text = c.text if show_text else glyph
            if text and (show_text or size >= 10):
                color = ("#000" if c.status in ("fail", "untried") or c.good is None else ink(c.good))
                fs = font if show_text else max(6, size - 2)
                out.append(f'<text x="{x + size / 2:.1f}" y="{y + size / 2 + fs / 3:.1f}" text-anchor="middle" '
                           f'font-size="{fs}" fill="{color}" pointer-events="none">{esc(text)}</text>')
    out[2:2] = [f'<path fill="{fill}" d="{"".join(d)}"/>' for fill, d in buckets.items()]
    out.append("</svg>")
    return "".join(out)


def gradient_legend(low: str, high: str, uid: str) -> str:
    """The colour scale from worst to best, with the marks' meanings."""
    stops = "".join(f'<stop offset="{i / (len(_VIRIDIS) - 1):.2f}" stop-color="{scale(i / (len(_VIRIDIS) - 1))}"/>'
                    for i in range(len(_VIRIDIS)))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="640" height="34" role="img" aria-label="colour scale">'
            f'<defs><linearGradient id="grad{uid}">{stops}</linearGradient></defs>'
            f'{_HATCH.replace("{uid}", uid + "l")}'
            f'<rect x="0" y="4" width="160" height="14" fill="url(#grad{uid})"/>'
            f'<text x="0" y="31" font-size="11">{esc(low)}</text>'
            f'<text x="160" y="31" font-size="11" text-anchor="end">{esc(high)}</text>'
            f'<rect x="190" y="4" width="14" height="14" fill="url(#hatch{uid}l)" stroke="{VERMILLION}"/>'
            f'<text x="209" y="16" font-size="11">\u2717 failed</text>'
            f'<rect x="275" y="4" width="14" height="14" fill="#fff" stroke="{ORANGE}" stroke-width="3"/>'
            f'<text x="294" y="16" font-size="11">\u25bc slow (outlined)</text>'
            f'<rect x="400" y="4" width="14" height="14" fill="#fff" stroke="#ddd"/>'
            f'<text x="419" y="16" font-size="11">? not tried / blank: not measured</text></svg>')


@dataclass(frozen=True)
class Bar:
    label: str
    value: float | None
    text: str  # the value as read
    note: str = ""  # why it stands out (shown after the value)


def bars(items: Sequence[Bar], median: float | None, *, label: str, tolerance: float = 0.1) -> str:
    """A bar per item against the median (the dashed line); a bar off the median by more than ``tolerance``
    (a fraction) is orange and marked ▲ or ▼ in its text."""
    top_value = max([b.value for b in items if b.value is not None] + [median or 0.0, 1e-9])
    name_w = min(240, 16 + 7 * max((len(b.label) for b in items), default=4))
    bar_w, row = 360, 18
    height = 26 + row * len(items)
    width = name_w + bar_w + 260
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{esc(label)}" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}">']
    for i, b in enumerate(items):
        y = 6 + i * row
        out.append(f'<text x="{name_w - 6}" y="{y + 12}" text-anchor="end" font-size="12">{esc(b.label)}</text>')
        if b.value is None:
            out.append(f'<text x="{name_w + 4}" y="{y + 12}" font-size="12" fill="#666">{esc(b.text or "unknown")}'
                       "</text>")
            continue
        off = median is not None and median > 0 and abs(b.value - median) > tolerance * median
        w = max(1.0, bar_w * b.value / top_value)
        colour = ORANGE if off else "#3b6f99"
        glyph = ("\u25b2 " if median is not None and b.value > median else "\u25bc ") if off else ""
        out.append(f'<rect x="{name_w}" y="{y}" width="{w:.1f}" height="{row - 5}" fill="{colour}">'
                   f'<title>{esc(b.label)}: {esc(b.text)}</title></rect>')
        weight = ' font-weight="700"' if off else ""
        shown = glyph + b.text + (" " + b.note if b.note else "")
        out.append(f'<text x="{name_w + w + 5:.1f}" y="{y + 12}" font-size="12"{weight}>{esc(shown)}</text>')
    if median:
        x = name_w + bar_w * median / top_value
        out.append(f'<line x1="{x:.1f}" y1="2" x2="{x:.1f}" y2="{height - 14}" stroke="#222" stroke-dasharray="4 3"/>'
                   f'<text x="{x:.1f}" y="{height - 3}" font-size="11" text-anchor="middle">median</text>')
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class Span:
    """A stretch of a timeline row: from ``start`` to ``end`` (seconds), in the colour of ``state``."""

    start: float
    end: float
    state: str
    title: str
    label: str = ""


@dataclass(frozen=True)
class Point:
    """A moment on a row: ``glyph`` drawn there, ``title`` on hover."""

    at: float
    glyph: str
    title: str
    colour: str = "#222"


@dataclass(frozen=True)
class Row:
    label: str
    spans: Sequence[Span] = ()
    points: Sequence[Point] = ()
    strong: bool = False  # the row of the first failure


_FILL = {"succeeded": "#0072B2", "failed": VERMILLION, "stopped": GREY, "unknown": "#c9c9c9", "running": "#56B4E9",
         "interrupted": ORANGE, "lost": VERMILLION}


def timeline(rows: Sequence[Row], total: float, *, bands: Sequence[Span] = (), label: str = "") -> str:
    """Rows on one time axis (0 .. ``total`` seconds); ``bands``: shaded stretches across every row (attempts)."""
    total = max(total, 1e-3)
    name_w = min(260, 16 + 7 * max((len(r.label) for r in rows), default=4))
    plot_w, row_h, top = 760, 20, 26
    height = top + row_h * len(rows) + 26
    width = name_w + plot_w + 30

    def x(t: float) -> float:
        return name_w + plot_w * min(max(t, 0.0), total) / total

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{esc(label)}" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}">',
           '<defs><pattern id="tlhatch" width="6" height="6" patternUnits="userSpaceOnUse" '
           f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{VERMILLION}"/>'
           '<line x1="0" y1="0" x2="0" y2="6" stroke="#fff" stroke-width="2"/></pattern></defs>']
    for i, band in enumerate(bands):
        shade = "#f1f1f1" if i % 2 == 0 else "#e4ecf3"
        out.append(f'<rect x="{x(band.start):.1f}" y="{top - 4}" width="{max(1.0, x(band.end) - x(band.start)):.1f}" '
                   f'height="{row_h * len(rows) + 6}" fill="{shade}"><title>{esc(band.title)}</title></rect>'
                   f'<text x="{x(band.start) + 3:.1f}" y="{top - 8}" font-size="11">{esc(band.label)}</text>')
    for i, r in enumerate(rows):
        y = top + i * row_h
        weight = ' font-weight="700"' if r.strong else ""
        out.append(f'<text x="{name_w - 6}" y="{y + 13}" text-anchor="end" font-size="12"{weight}>{esc(r.label)}</text>')
        out.append(f'<line x1="{name_w}" y1="{y + row_h - 1}" x2="{name_w + plot_w}" y2="{y + row_h - 1}" '
                   'stroke="#eee"/>')
        for s in r.spans:
            fill = "url(#tlhatch)" if s.state == "failed" else _FILL.get(s.state, "#9ecae1")
            w = max(2.0, x(s.end) - x(s.start))
            out.append(f'<rect x="{x(s.start):.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" fill="{fill}"'
                       f' stroke="#333" stroke-width="0.5"><title>{esc(s.title)}</title></rect>')
            if s.label and w > 6 * len(s.label) + 10:
                # dark on light bars; on dark or hatched ones white, or dark with a white halo
                colour, halo = (("#000", "") if s.state in ("unknown", "running") else
                                ("#000", ' stroke="#fff" stroke-width="3" paint-order="stroke"')
                                if s.state == "failed" else ("#fff", ""))
                out.append(f'<text x="{x(s.start) + 10:.1f}" y="{y + 13}" font-size="10" fill="{colour}"{halo} '
                           f'font-weight="600" pointer-events="none">{esc(s.label)}</text>')
            elif s.label and x(s.end) + 6 * len(s.label) < name_w + plot_w:  # beside a bar too short for it
                out.append(f'<text x="{x(s.end) + 4:.1f}" y="{y + 13}" font-size="10" fill="#000" font-weight="600" '
                           f'pointer-events="none">{esc(s.label)}</text>')
        for p in r.points:
            out.append(f'<text x="{x(p.at):.1f}" y="{y + 14}" font-size="13" text-anchor="middle" fill="{p.colour}" '
                       f'font-weight="700">{esc(p.glyph)}<title>{esc(p.title)}</title></text>')
    axis_y = top + row_h * len(rows) + 4
    out.append(f'<line x1="{name_w}" y1="{axis_y}" x2="{name_w + plot_w}" y2="{axis_y}" stroke="#555"/>')
    for k in range(6):
        t = total * k / 5
        out.append(f'<text x="{x(t):.1f}" y="{axis_y + 14}" font-size="11" text-anchor="middle">{t:.1f}s</text>')
    out.append("</svg>")
    return "".join(out)
