"""The run page's series: per node a row of small panels on the run's time axis (the data NIC's rx and tx and
the RDMA ports, the two busiest other NICs, GPU utilisation and power where the node has GPUs, CPU per rank),
the first failure and the restarts marked across every panel; the run's GPU energy; traffic on the wrong NIC; a
straggler's evidence (its rank's CPU line and its GPU's own utilisation and power drawn apart, its moment marked
across its node's row).
Every value drawn is also in the page's text: a table of each line's mean and peak per node, and the points
themselves in a closed ``<details>`` per node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clusterrun.report import panels
from clusterrun.report.charts import Point
from clusterrun.report.html import BLUE, GREY, ORANGE, SKY, VERMILLION, esc, mark, seconds, si, table
from clusterrun.report.run_data import RunData
from clusterrun.report.series_data import POINTS, NodeSeries, Stat, node_series
from clusterrun.runs import series

#: The column titles come again above every this many rows; beyond as many nodes, fewer points per line.
HEADER_EVERY = 16
#: Points per line on a page of more than HEADER_EVERY nodes (the page of 64 nodes stays about 1 MB).
FEWER_POINTS = 72
GREEN, PURPLE = "#009E73", "#CC79A7"
#: event kind of a wrong-NIC verdict in the record (clusterrun/runs/traffic.py)
WRONG_NIC = "wrong-nic"
#: event kind of a straggler verdict (clusterrun/runs/stragglers.py), and the colour of its evidence
STRAGGLER, BROWN = "straggler", "#8a5a00"


def _rate(v: float | None) -> str:
    return si(v, "B/s")


def series_section(data: RunData) -> str:
    """The section, or a line saying why there is none."""
    head = "<h2>NICs, GPUs and ranks over time</h2>"
    names = series.nodes(data.run.path)
    if not names:
        return head + ("<p class=\"legend\">Not sampled: the run directory holds no series (sampling was off, "
                       "<code>up --sample-every 0</code>, or the run is older than sampling).</p>")
    axis = data.axis()
    if axis is None:
        return head + ("<p class=\"legend\">The nodes were sampled, but the record has no start time to draw them "
                       "against: <code>clusterrun metrics</code> prints them.</p>")
    t0, end = axis
    for name in names:
        newest = series.latest(data.run.path, name)
        if newest:
            end = max(end, float(newest[-1]["t"]))
    total = max(end - t0, 1e-3)
    nics = {str(n.get("name")): n.get("data_nic") for n in data.nodes}
    order = [n for n in data.node_names() if n in names] + [n for n in names if n not in data.node_names()]
    points = POINTS if len(order) <= HEADER_EVERY else FEWER_POINTS
    slow = {}  # node -> its straggler verdict (the first)
    for event in data.record.events:
        if event.get("kind") == STRAGGLER and isinstance(event.get("time"), (int, float)):
            slow.setdefault(str(event.get("node")), event)
    drawn = [s for s in (node_series(data.run.path, n, nics.get(n), t0, total, points,
                                     (str(slow[n]["gpu"]),) if slow.get(n, {}).get("gpu") is not None else ())
                         for n in order) if s is not None]
    if not drawn:
        return head + "<p class=\"legend\">The series files hold no sample.</p>"
    wrong = [e for e in data.record.events if e.get("kind") == WRONG_NIC]
    failed_at = data.failure_time()
    failure = data.record.first_failure
    marks = [Point(a.started - t0, "\u21bb", f"attempt {a.number} started", GREY)
             for a in data.record.attempts[1:] if a.started is not None]
    if failed_at is not None and failure is not None:
        marks.append(Point(failed_at - t0, "\u2717", f"first failure at {seconds(failed_at - t0)}: "
                                                     f"{failure.describe()}", VERMILLION))
    out = [head, _legend(failure, failed_at, t0, any(m.colour == GREY for m in marks), bool(slow)),
           _energy(drawn), *(_wrong(e, t0) for e in wrong), *(_straggler(e, t0) for e in slow.values())]
    out.append('<figure class="wide">' + _grid(drawn, total, marks, wrong, failure, t0, slow) + "</figure>")
    missing = [n for n in data.node_names() if n not in names]
    if missing:
        out.append(f"<p class=\"legend\">No samples from {esc(', '.join(missing))}.</p>")
    out.append(_table(drawn))
    out.append(_points(drawn))
    return "".join(out)


def _legend(failure: Any, failed_at: float | None, t0: float, restarts: bool, slow: bool = False) -> str:
    text = ("Each node's row on the run's time axis, every panel of a column on the same scale (its top in the "
            "column's title), so that a node that differs stands out down the column; a panel's own peak is in its "
            "corner. Both NIC columns share one scale: traffic on a NIC that should be quiet is as tall as the "
            "data NIC's. A point is the mean of the samples in its stretch of the axis (the table below has each "
            "line's mean and peak over every sample, and the points drawn are in the text under it).")
    if failure is not None and failed_at is not None:
        text += (f" The red dashed line (\u2717) is the first failure ({failure.node}"
                 + (f" rank {failure.rank}" if failure.rank is not None else "") + f", at {seconds(failed_at - t0)}).")
    elif failure is not None:
        text += " The first failure has no time in the record: it is not marked."
    if restarts:
        text += " Grey dashed lines (\u21bb): a restart's attempt starts."
    if slow:
        text += (" A straggler's evidence is brown: its rank's CPU line and its GPU's own utilisation and power "
                 "(against the node's mean and the others' lines), and a brown dashed line (\u25a0) across its node's "
                 "row when it was named.")
    return f'<p class="legend">{esc(text)}</p>'


def _energy(drawn: Sequence[NodeSeries]) -> str:
    used = {s.name: s.energy_j for s in drawn if s.energy_j is not None}
    if not used:
        return ""
    total = sum(used.values())
    how = ", ".join(sorted({s.energy_how for s in drawn if s.energy_how}))
    per = ", ".join(f"{n} {j / 1000:.1f} kJ" for n, j in used.items()) if len(used) <= 8 else (
        f"{len(used)} nodes, {min(used.values()) / 1000:.1f} to {max(used.values()) / 1000:.1f} kJ each; "
        "each node's in the table")
    return (f'<p class="energy"><strong>GPU energy: {total / 3.6e6:.3f} kWh</strong> ({total / 1000:.1f} kJ, '
            f"{esc(how)}): {esc(per)}</p>")


def _wrong(event: Mapping[str, Any], t0: float) -> str:
    at = event.get("time")
    when = f" at {seconds(at - t0)}" if isinstance(at, (int, float)) else ""
    return f"<p>{mark('warn', 'wrong NIC')}{esc(when)}: {esc(event.get('text'))}</p>"


def _straggler(event: Mapping[str, Any], t0: float) -> str:
    at = seconds(float(event["time"]) - t0)
    return f"<p><span class=\"v warn\">\u25a0 straggler</span> at {esc(at)}: {esc(event.get('text'))}</p>"


def _columns(drawn: Sequence[NodeSeries]) -> list[tuple[str, str, str, float]]:
    """(key, title, the lines' key, scale top) per column; the GPU columns only when a node has GPUs."""
    nic_top = max((s.top("rx", "tx", "rdma", "nic:") for s in drawn), default=0.0) or 1.0
    cols = [("data", "data NIC", f"\u2014 rx  \u2505 tx  \u00b7\u00b7 RDMA; 0 to {_rate(nic_top)}", nic_top),
            ("other", "other NICs", f"rx+tx: \u2014 busiest  \u2505 next; 0 to {_rate(nic_top)}", nic_top)]
    if any(s.gpus for s in drawn):
        power_top = max((s.top("power") for s in drawn), default=0.0) or 1.0
        cols += [("util", "GPU utilisation", "\u2014 mean of the GPUs  \u2505 lowest; 0 to 100%", 100.0),
                 ("power", "GPU power", f"\u2014 the node's GPUs together; 0 to {si(power_top, 'W')}", power_top)]
    cpu_top = max(1.0, max((s.top("cpu:") for s in drawn), default=0.0))
    cols.append(("cpu", "CPU per rank", f"a line each, the failing one red; 0 to {cpu_top:.2g} CPU", cpu_top))
    return cols


def _panel(s: NodeSeries, key: str, top: float, glyphs: list[tuple[float, str, str]],
           failed_rank: str | None, slow: Mapping[str, Any] | None = None) -> panels.Panel:
    pts, st = s.lines, s.stats
    slow_rank = str(slow["rank"]) if slow and slow.get("rank") is not None else None
    slow_gpu = str(slow["gpu"]) if slow and slow.get("gpu") is not None else None
    whose = f"; brown: GPU {slow_gpu} (rank {slow_rank}, the straggler)" if slow_gpu and slow_rank else (
        f"; brown: GPU {slow_gpu} (the straggler)" if slow_gpu else "")

    def line(k: str, colour: str, dash: str = "", width: float = 1.3) -> list[panels.Line]:
        return [panels.Line(pts[k], colour, dash, width)] if pts.get(k) else []

    if key == "data":
        lines = line("rx", BLUE) + line("tx", ORANGE, "4 2") + line("rdma", GREEN, "1 2", 1.8)
        peak = max((st[k].peak for k in ("rx", "tx", "rdma") if k in st), default=None)
        return panels.Panel(f"{s.name}: data NIC {s.data_nic or '?'} rx/tx" + (", RDMA ports" if s.rdma else ""),
                            lines, top, f"{s.data_nic or '?'} peak {_rate(peak)}" if lines else "",
                            "data NIC unknown" if not s.data_nic else f"no {s.data_nic} readings",
                            _glyphs(glyphs, "data"))
    if key == "other":
        lines = [L for i, nic in enumerate(s.others) for L in line(f"nic:{nic}", (PURPLE, GREEN)[i], ("", "4 2")[i])]
        peak = max((st[f"nic:{n}"].peak for n in s.others), default=None)
        names = ", ".join(s.others)
        return panels.Panel(f"{s.name}: other NICs ({names or 'none'})", lines, top,
                            f"{names} peak {_rate(peak)}" if lines else "", "no other NIC",
                            _glyphs(glyphs, "other"))
    if key in ("util", "power"):
        if not s.gpus:
            return panels.Panel(f"{s.name}: no GPUs", (), top, "", "no GPUs")
        if key == "util":
            lines = line("util", BLUE) + line("util_min", SKY, "4 2") + line(f"gpu_util:{slow_gpu}", BROWN, "", 1.8)
            low = st["util_min"].mean if "util_min" in st else None
            return panels.Panel(f"{s.name}: utilisation of its {s.gpus} GPU(s){whose}", lines, top,
                                f"{s.gpus} GPUs, mean {st['util'].mean:.0f}%" + (f", low {low:.0f}%" if low is not None
                                                                                else "") if "util" in st else "",
                                "no utilisation readings")
        return panels.Panel(f"{s.name}: power of its {s.gpus} GPU(s){whose}",
                            line("power", VERMILLION) + line(f"gpu_power:{slow_gpu}", BROWN, "", 1.8), top,
                            f"peak {si(st['power'].peak, 'W')}" if "power" in st else "", "no power readings")
    lines = [L for r in s.ranks if r not in (failed_rank, slow_rank) for L in line(f"cpu:{r}", BLUE, "", 1.0)]
    lines += line(f"cpu:{slow_rank}", BROWN, "", 1.8) if slow_rank != failed_rank else []
    lines += line(f"cpu:{failed_rank}", VERMILLION, "", 1.6)  # the failing rank's, drawn last (on top)
    peak = max((st[f"cpu:{r}"].peak for r in s.ranks), default=None)
    brown = f"; brown: rank {slow_rank} (the straggler)" if slow_rank in s.ranks else ""
    return panels.Panel(f"{s.name}: CPU of ranks {', '.join(s.ranks)}{brown}", lines, top,
                        f"{len(s.ranks)} ranks, peak {peak:.2f}" if peak is not None else "", "no rank readings")


def _glyphs(glyphs: list[tuple[float, str, str]], where: str) -> list[Point]:
    return [Point(at, "\u25b2", text, "#8a5a00") for at, column, text in glyphs if column == where]


def _grid(drawn: Sequence[NodeSeries], total: float, marks: Sequence[Point],
          wrong: Sequence[Mapping[str, Any]], failure: Any, t0: float,
          slow: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    slow = slow or {}
    cols = _columns(drawn)
    head = panels.header([c[1] for c in cols], [c[2] for c in cols], total)
    height = 52 if len(drawn) <= 16 else 40
    out = []
    for i, s in enumerate(drawn):
        if i % HEADER_EVERY == 0:
            out.append(head)
        glyphs = [(float(e["time"]) - t0, "data" if e.get("nic") == s.data_nic else "other", e.get("text") or "")
                  for e in wrong if e.get("node") == s.name and isinstance(e.get("time"), (int, float))]
        strong = failure is not None and failure.node == s.name
        failed_rank = str(failure.rank) if strong and failure.rank is not None else None
        verdict = slow.get(s.name)
        shown = [_panel(s, key, top, glyphs, failed_rank, verdict) for key, _title, _key, top in cols]
        note = ("\u2717 " + (f"rank {failure.rank}" if failure.rank is not None else "failed")) if strong else ""
        if any(e.get("node") == s.name for e in wrong):
            note = (note + " " if note else "") + "\u25b2 wrong NIC"
        own = list(marks)
        if verdict is not None:
            who = (f" rank {verdict['rank']}" if verdict.get("rank") is not None else
                   f" GPU {verdict['gpu']}" if verdict.get("gpu") is not None else "")  # an older record: the node
            note = (note + " " if note else "") + f"\u25a0 straggler{who}"
            own.append(Point(float(verdict["time"]) - t0, "\u25a0", f"straggler named at "
                             f"{seconds(float(verdict['time']) - t0)}: {verdict.get('text') or ''}", BROWN))
        out.append(panels.row(s.name, shown, total, marks=own, height=height, strong=strong, note=note))
    return "".join(out)


def _ms(st: Stat | None, fmt: Any) -> str:
    return f"{fmt(st.mean)} / {fmt(st.peak)}" if st is not None else "-"


def _table(drawn: Sequence[NodeSeries]) -> str:
    gpus = any(s.gpus for s in drawn)
    rows = []
    for s in drawn:
        st = s.stats
        cpus = [st[f"cpu:{r}"].mean for r in s.ranks if f"cpu:{r}" in st]
        gpu = [esc(s.gpus or "-"),
               esc(f"{st['util'].mean:.0f}% (lowest GPU {st['util_min'].mean:.0f}%)" if "util" in st else "-"),
               esc(_ms(st.get("power"), lambda v: si(v, "W"))),
               esc(f"{s.energy_j / 1000:.1f} kJ ({s.energy_how})" if s.energy_j is not None else "-")]
        rows.append([esc(s.name), esc(s.samples), esc(f"{seconds(s.span[0])} to {seconds(s.span[1])}"),
                     esc(s.data_nic or "?"), esc(_ms(st.get("rx"), _rate)), esc(_ms(st.get("tx"), _rate)),
                     esc(_ms(st.get("rdma"), _rate)),
                     esc("; ".join(f"{n} {_ms(st.get(f'nic:{n}'), _rate)}" for n in s.others) or "-"),
                     *(gpu if gpus else ()),
                     esc(f"{sum(cpus) / len(cpus):.2f} ({min(cpus):.2f} to {max(cpus):.2f})" if cpus else "-")])
    heads = ["node", "samples", "from, to", "data NIC", "rx", "tx", "RDMA", "other NICs",
             *(("GPUs", "GPU utilisation", "GPU power", "GPU energy") if gpus else ()),
             "CPU per rank: mean (lowest to highest)"]
    return ("<h3>Values per node</h3><p class=\"legend\">Mean / peak over every sample; rates are rx and tx "
            "separately, other NICs rx+tx.</p>"
            + table(heads, rows, numeric=(1, 4, 5, 6, *((8, 10, 11) if gpus else ()))))


def _fmt(v: float | None, unit: str) -> str:
    """A point's value as text, finer than the pixel it is drawn at: MB/s to 0.0001 (1 MB/s and more to 3 or 4
    figures), CPUs to 0.01, percents and watts whole."""
    if v is None:
        return "-"
    if unit == "CPU":
        return f"{v:.2f}"
    if unit != "MB/s":
        return f"{v:.0f}"
    v /= 1e6
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.4f}"


def _points(drawn: Sequence[NodeSeries]) -> str:
    """Every point drawn, per node, as text: a line per point of the axis."""
    blocks = []
    for s in drawn:
        keys = [(k, unit, name) for k, unit, name in (
            ("rx", "MB/s", f"{s.data_nic} rx"), ("tx", "MB/s", f"{s.data_nic} tx"), ("rdma", "MB/s", "RDMA"),
            *((f"nic:{n}", "MB/s", f"{n} rx+tx") for n in s.others), ("util", "%", "GPU util"),
            ("util_min", "%", "lowest GPU"), ("power", "W", "GPU power"),
            *((f"{k}:{g}", u, f"GPU {g} {n}") for k, u, n in (("gpu_util", "%", "util"), ("gpu_power", "W", "power"))
              for g in sorted({key.split(":", 1)[1] for key in s.lines if key.startswith("gpu_util:")})),
            *((f"cpu:{r}", "CPU", f"rank {r} CPU") for r in s.ranks)) if s.lines.get(k)]
        at: dict[float, dict[str, float | None]] = {}
        for k, _u, _n in keys:
            for t, v in s.lines[k]:
                if v is not None:
                    at.setdefault(round(t, 1), {})[k] = v
        head = "at (s)\t" + "\t".join(f"{n} ({u})" for _k, u, n in keys)
        lines = [f"{t:.1f}\t" + "\t".join(_fmt(vals.get(k), u) for k, u, _n in keys) for t, vals in sorted(at.items())]
        blocks.append(f"<h4>{esc(s.name)}</h4><pre>{esc(head)}\n{esc(chr(10).join(lines))}</pre>")
    return ("<details><summary>The points drawn, as text (per node: seconds since the start, then each line; MB/s, "
            "%, W and CPUs)</summary>" + "".join(blocks) + "</details>")
