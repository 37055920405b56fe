"""Small multiples as inline SVG: a row of compact line panels per node on one shared time axis, a header of
column titles with the axis' ticks, and vertical marks (the first failure, restarts) across every panel.

Built for many rows: a line is one ``<path>`` of relative moves in whole pixels (a few bytes a point), the
grid of a panel one path, and nothing has a hover text but the marks and the panel itself; the values drawn are
in the page's tables and text (the caller's part).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clusterrun.report.charts import Point
from clusterrun.report.html import esc

#: Width of the row labels, of one panel, and the gap between panels; a panel's strip above its lines (pixels).
LABEL_W, PANEL_W, GAP, STRIP = 118, 214, 10, 13


@dataclass(frozen=True)
class Line:
    """One line of a panel: (seconds, value) points, oldest first; a value of None breaks the line there."""

    points: Sequence[tuple[float, float | None]]
    colour: str
    dash: str = ""  # stroke-dasharray, so that lines differ in more than their colour
    width: float = 1.3


@dataclass(frozen=True)
class Panel:
    """A panel: its lines against a y scale of 0 .. ``top``; ``peak`` is written in its corner, ``empty`` instead
    of lines when it has none; ``title`` is its hover text and accessible name."""

    title: str
    lines: Sequence[Line] = ()
    top: float = 1.0
    peak: str = ""
    empty: str = ""
    glyphs: Sequence[Point] = ()  # drawn at the panel's top


def _x(t: float, total: float) -> int:
    return round(PANEL_W * min(max(t, 0.0), total) / total)


def _path(line: Line, total: float, top: float, height: int) -> str:
    """The line as ``M x y l dx dy dx dy ...`` in whole pixels of a panel ``height`` high: 0 at its bottom, ``top``
    under its strip. Steps in the same direction are joined (a flat line is one step)."""
    runs: list[list[tuple[int, int]]] = []  # per unbroken stretch: its first point, then its steps
    last: tuple[int, int] | None = None
    for t, value in line.points:
        if value is None:
            last = None
            continue
        x = _x(t, total)
        y = height - round((height - STRIP) * min(max(value, 0.0), top) / top) if top > 0 else height
        if last is None:
            runs.append([(x, y), (0, 0)])  # a lone point still shows as a dot with round caps
        else:
            dx, dy = x - last[0], y - last[1]
            px, py = runs[-1][-1]
            if (px, py) == (0, 0) or (px * dy == py * dx and (px >= 0) == (dx >= 0) and (py >= 0) == (dy >= 0)):
                runs[-1][-1] = (px + dx, py + dy)
            else:
                runs[-1].append((dx, dy))
        last = (x, y)
    return "".join(f"M{r[0][0]} {r[0][1]}l" + " ".join(f"{dx} {dy}" for dx, dy in r[1:]) for r in runs
                   ).replace(" -", "-")


def _ticks(total: float) -> list[float]:
    """Round moments from 0 to ``total``, 2 to 6 of them after 0 (1, 2, 5 times a power of ten seconds, or of
    minutes and hours beyond them)."""
    steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]
    step = next((s for s in steps if total / s <= 6), 86400 * max(1, round(total / 86400 / 5)))
    return [k * step for k in range(int(total // step) + 1)]


def _seconds(t: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if t >= size and t % size == 0:
            return f"{t / size:.0f}{unit}"
    return f"{t:.0f}s"


def header(titles: Sequence[str], keys: Sequence[str], total: float) -> str:
    """The columns' titles, under each its lines' key (``keys``, plain text) and the time axis' ticks."""
    total = max(total, 1e-3)
    width = LABEL_W + len(titles) * (PANEL_W + GAP)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="columns: {esc(", ".join(titles))}" '
           f'width="{width}" height="50" viewBox="0 0 {width} 50">']
    for i, (title, key) in enumerate(zip(titles, keys, strict=True)):
        x0 = LABEL_W + i * (PANEL_W + GAP)
        out.append(f'<text x="{x0}" y="13" font-size="12" font-weight="700">{esc(title)}</text>'
                   f'<text x="{x0}" y="28" font-size="10.5" fill="#333">{esc(key)}</text>')
        for k, t in enumerate(_ticks(total)):
            anchor = "start" if k == 0 else "end" if _x(t, total) > PANEL_W - 12 else "middle"
            out.append(f'<text x="{x0 + _x(t, total)}" y="45" font-size="10" fill="#555" '
                       f'text-anchor="{anchor}">{_seconds(t)}</text>')
    out.append(f'<text x="{LABEL_W - 8}" y="45" font-size="10" fill="#555" text-anchor="end">since start</text>'
               "</svg>")
    return "".join(out)


def row(label: str, panels: Sequence[Panel], total: float, *, marks: Sequence[Point] = (), height: int = 52,
        strong: bool = False, note: str = "") -> str:
    """One node's row: its name (bold for the failing node, ``note`` under it), then its panels side by side;
    each of ``marks`` a dashed vertical line across every panel, its glyph and hover text on the first."""
    total = max(total, 1e-3)
    width = LABEL_W + len(panels) * (PANEL_W + GAP)
    full = height + 8
    weight = f' font-weight="700" fill="{"#b34700"}"' if strong else ""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{esc(label)} over time" width="{width}" '
           f'height="{full}" viewBox="0 0 {width} {full}">',
           f'<text x="{LABEL_W - 8}" y="{height / 2 + 8:.0f}" font-size="12" text-anchor="end"{weight}>'
           f"{esc(label)}</text>"]
    if note:
        out.append(f'<text x="{LABEL_W - 8}" y="{height / 2 + 20:.0f}" font-size="10" text-anchor="end" '
                   f'fill="#8a5a00">{esc(note)}</text>')
    grid = "".join(f"M{_x(t, total)} {STRIP}v{height - STRIP}" for t in _ticks(total)[1:])
    for i, p in enumerate(panels):
        x0 = LABEL_W + i * (PANEL_W + GAP)
        out.append(f'<g transform="translate({x0},4)" class="panel"><title>{esc(p.title)}</title>'
                   f'<rect width="{PANEL_W}" height="{height}" fill="#fbfbfb" stroke="#c8c8c8"/>'
                   f'<path d="{grid}" stroke="#e6e6e6"/>')
        if not p.lines:
            out.append(f'<text x="{PANEL_W / 2:.0f}" y="{height / 2 + 4:.0f}" font-size="10.5" fill="#666" '
                       f'text-anchor="middle">{esc(p.empty or "no samples")}</text>')
        for line in p.lines:
            d = _path(line, total, p.top, height)
            if d:
                dash = f' stroke-dasharray="{line.dash}"' if line.dash else ""
                out.append(f'<path d="{d}" fill="none" stroke="{line.colour}" stroke-width="{line.width}"{dash} '
                           'stroke-linejoin="round" stroke-linecap="round"/>')
        for m in marks:  # its glyph and hover text on the row's first panel only: the legend says what it is
            x = _x(m.at, total)
            out.append(f'<line x1="{x}" y1="-3" x2="{x}" y2="{height + 3}" stroke="{m.colour}" stroke-width="1.6" '
                       'stroke-dasharray="4 2"/>')
            if i == 0:
                out.append(f'<text x="{x + 2}" y="{height - 2}" font-size="10" fill="{m.colour}" font-weight="700">'
                           f"{esc(m.glyph)}<title>{esc(m.title)}</title></text>")
        for g in p.glyphs:
            out.append(f'<text x="{_x(g.at, total)}" y="11" font-size="12" text-anchor="middle" fill="{g.colour}" '
                       f'font-weight="700">{esc(g.glyph)}<title>{esc(g.title)}</title></text>')
        if p.peak:
            out.append(f'<text x="{PANEL_W - 3}" y="10" font-size="9.5" fill="#444" text-anchor="end">'
                       f"{esc(p.peak)}</text>")
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
