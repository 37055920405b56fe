"""The pieces every page is made of: one self-contained HTML document with its style inline, tables, verdict
marks and notes of what is missing.

The pages work offline and printed: no script, no font, no image is fetched from anywhere (a Content-Security-Policy
in the document forbids it), charts are inline SVG drawn here, and every value a chart shows is also text. Colours
come from palettes that colour-blind readers can tell apart (Okabe-Ito, viridis), and no state is told by colour
alone: each verdict and state also has its own glyph and word.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence

from clusterrun import __version__

#: Okabe-Ito colours: told apart with every common colour-vision deficiency.
BLUE, ORANGE, VERMILLION, SKY, GREY = "#0072B2", "#E69F00", "#D55E00", "#56B4E9", "#8a8a8a"

#: verdict or state -> (glyph, colour class). The glyph and the word carry the meaning; the colour only helps.
MARKS: dict[str, tuple[str, str]] = {
    "pass": ("\u2713", "ok"), "succeeded": ("\u2713", "ok"),
    "warn": ("\u25b2", "warn"), "stopped": ("\u25a0", "mute"), "interrupted": ("\u25a0", "warn"),
    "fail": ("\u2717", "bad"), "failed": ("\u2717", "bad"), "lost": ("\u2717", "bad"), "not-started": ("\u2717", "bad"),
    "skip": ("\u2013", "mute"), "unknown": ("?", "mute"), "running": ("\u25b6", "run"), "starting": ("\u25b6", "run"),
    "detached": ("\u25b6", "run"), "not run": ("\u2013", "mute"),
}

# Content-Security-Policy: nothing outside the file may be loaded, even by a value a rank printed.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

STYLE = """
:root{--ok:#0072B2;--warn:#E69F00;--bad:#D55E00;--run:#56B4E9;--mute:#8a8a8a;--fg:#1b1b1b;--bg:#fff;--line:#d0d0d0}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);
background:var(--bg);margin:0;padding:16px 24px;max-width:1400px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:2px solid var(--line)}
h3{font-size:15px;margin:18px 0 6px}
.sub{color:#555;margin:0 0 12px}
table{border-collapse:collapse;margin:6px 0 12px}
th,td{border:1px solid var(--line);padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f2f2f2;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
code,pre,.mono{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12.5px}
pre{background:#f6f6f6;border:1px solid var(--line);padding:8px;overflow-x:auto;white-space:pre-wrap;
word-break:break-all;margin:4px 0}
.v{font-weight:600;white-space:nowrap}
.ok{color:#005a8c}.warn{color:#8a5a00}.bad{color:#b34700}.mute{color:#666}.run{color:#1d6f99}
td.cell-ok{background:#e3f0f9}td.cell-warn{background:#fdf0cf}td.cell-bad{background:#fbe0cf}td.cell-mute{background:#f4f4f4}
.missing{border-left:4px solid var(--warn);background:#fff8e6;padding:6px 10px;margin:8px 0}
.card{border:2px solid var(--bad);border-radius:6px;padding:8px 12px;margin:8px 0;background:#fff6f1}
.card h3{margin-top:0}
.summary{display:flex;flex-wrap:wrap;gap:8px 22px;margin:6px 0 10px}
.summary div{white-space:nowrap}
.legend{color:#444;font-size:12.5px;margin:2px 0 10px}
figure{margin:8px 0 14px;overflow-x:auto}.wide{overflow-x:auto}h4{font-size:14px;margin:14px 0 2px}
figcaption{font-size:12.5px;color:#444}
svg text{font-family:system-ui,"DejaVu Sans",sans-serif}
details{margin:6px 0}
summary{cursor:pointer}
.foot{color:#777;font-size:12px;margin-top:30px;border-top:1px solid var(--line);padding-top:6px}
@media print{body{padding:0;max-width:none}figure{overflow:visible}details{display:block}
 h2{break-after:avoid}table,figure,.card{break-inside:avoid}}
"""


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def number(value: object) -> float | None:
    """``value`` when it is a number (a record from another version may hold anything)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def when(ts: object) -> str:
    t = number(ts)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def seconds(value: object) -> str:
    value = number(value)
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f}s"
    minutes, secs = divmod(int(value), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{secs:02d}s"


def size(nbytes: object) -> str:
    nbytes = number(nbytes)
    if nbytes is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"


def si(value: object, unit: str, digits: int = 3) -> str:
    """``value`` in ``unit`` with an SI prefix and ``digits`` significant digits: ``1.23 GB/s``, ``612 W``."""
    v = number(value)
    if v is None:
        return "-"
    prefix = ""
    for p in ("k", "M", "G", "T"):
        if abs(v) < 999.5:
            break
        v, prefix = v / 1000, p
    shown = f"{v:.{digits}g}" if abs(v) >= 1 or v == 0 else f"{v:.2f}"
    return f"{shown} {prefix}{unit}"


def mark(state: str | None, text: str | None = None) -> str:
    """A verdict or state as glyph and word (``✗ fail``), coloured by its class."""
    key = state or "unknown"
    glyph, cls = MARKS.get(key, ("?", "mute"))
    return f'<span class="v {cls}">{glyph} {esc(text if text is not None else key)}</span>'


def cell_class(state: str | None) -> str:
    return f"cell-{MARKS.get(state or 'unknown', ('?', 'mute'))[1]}"


def missing(text: str) -> str:
    """A note that says what the page cannot show, and why."""
    return f'<p class="missing"><strong>\u26a0 missing:</strong> {esc(text)}</p>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Sequence[int] = (),
          caption: str = "") -> str:
    """A table whose cells are already HTML (escape text with :func:`esc`). ``numeric``: columns aligned right."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            if cell.startswith("<td"):
                cells.append(cell)  # a cell with its own attributes
            else:
                cells.append(f'<td class="num">{cell}</td>' if i in numeric else f"<td>{cell}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def pre(lines: Iterable[str]) -> str:
    return f"<pre>{esc(chr(10).join(lines))}</pre>"


def document(title: str, subtitle: str, body: Sequence[str]) -> str:
    """The whole page: a standalone HTML5 document."""
    return "".join((
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{esc(title)}</h1><p class=\"sub\">{subtitle}</p>",
        *body,
        f'<p class="foot">written by clusterrun {esc(__version__)} at {esc(when(time.time()))}; '
        "one file, works offline; every chart's values are in the tables too.</p>",
        "</body></html>\n",
    ))
