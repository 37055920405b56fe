"""The page of a doctor round: what failed and how to fix it, every check per node, each network's matrix of
measured pairs, each node against the fleet's median, and each node's GPU/NIC/NUMA matrix."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from clusterrun.doctor.facts import NodeFacts
from clusterrun.facts.parsers import topo
from clusterrun.report import charts
from clusterrun.report.doctor_data import Measure, Round, median
from clusterrun.report.html import cell_class, document, esc, mark, missing, pre, seconds, table, when

#: Pairs drawn with their value as text in a details table, up to this many nodes (beyond it: hover and the
#: table of the pairs that stand out).
TEXT_PAIRS_UP_TO = 32
#: Rows of pairs that stand out shown at once (the rest fold away).
ODD_ROWS = 24
_SEVERITY = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}


def gbit(bps: float | None) -> str:
    return "n/a" if bps is None else f"{bps / 1e9:.2f} Gbit/s" if bps >= 1e9 else f"{bps / 1e6:.0f} Mbit/s"


def _worst(verdicts: Sequence[str]) -> str:
    return max(verdicts, key=lambda v: _SEVERITY.get(v, 0), default="skip")


def doctor_page(found: Round) -> str:
    """The whole HTML page of the round ``found``."""
    r = found.report
    verdict = str(r.get("verdict") or "unknown")
    counts = r.get("counts") if isinstance(r.get("counts"), Mapping) else {}
    if r.get("cut_short"):
        verdict = "cut short"  # what it found so far is no verdict on the cluster
    sub = (f"{mark(verdict if verdict != 'cut short' else 'interrupted', verdict)} &nbsp; {len(found.nodes)} node(s), started {esc(when(r.get('started')))}, took "
           f"{esc(seconds(r.get('duration_s')))}; " + ", ".join(f"{esc(counts.get(k, 0))} {k}" for k in
                                                                  ("pass", "warn", "fail", "skip") if counts)
           + f" &nbsp; <span class=\"mono\">{esc(found.directory)}/</span>")
    body = [missing(m) for m in found.missing]
    body += [_problems(found), _checks_by_node(found), _networks(found), _fleet(found), _topologies(found)]
    if r.get("recommended"):
        body.append("<h2>Recommended settings</h2><p>An inventory snippet from what the checks found:</p>"
                    + pre(str(r["recommended"]).rstrip().splitlines()))
    return document(f"clusterrun doctor: {verdict}", sub, body)


# ------------------------------------------------------------------------------------------------ findings


def _problems(found: Round) -> str:
    bad = sorted((f for f in found.findings() if f.get("verdict") in ("fail", "warn")),
                 key=lambda f: -_SEVERITY.get(str(f.get("verdict")), 0))
    if not bad:
        return "<h2>Problems</h2><p>" + (mark("pass", "none found") if found.report else "none known") + "</p>"
    rows = [[mark(str(f["verdict"])), f"<code>{esc(f['check'])}</code>", esc(f.get("node") or "all"),
             esc(f.get("subject") or ""), esc(f.get("summary") or ""),
             esc(f.get("hint") or "") + (f"<br><span class=\"mute\">measured {esc(f.get('measured'))}, expected "
                                         f"{esc(f.get('expected'))}</span>" if f.get("measured") else "")]
            for f in bad]
    return ("<h2>Problems</h2><p>Failures first; each with what to do about it.</p>"
            + table(["verdict", "check", "node", "on", "finding", "fix"], rows))


def _checks_by_node(found: Round) -> str:
    if not found.checks:
        return "<h2>Checks per node</h2>" + missing("no check's result is there")
    columns = [*found.nodes, "all"]
    rows = []
    for c in found.checks:
        per: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for f in c.get("findings") or ():
            per[f.get("node") if f.get("node") in found.nodes else "all"].append(f)
        cells = [f"<code>{esc(c['name'])}</code><br><span class=\"mute\">{esc(c.get('title') or '')}</span>"]
        for col in columns:
            if c.get("ran") is False:
                cells.append(f'<td class="{cell_class("skip")}">{mark("not run")}</td>')
                continue
            fs = per.get(col, [])
            if not fs:
                cells.append('<td class="mute">\u00b7</td>')
                continue
            v = _worst([str(f.get("verdict")) for f in fs])
            title = "\n".join(str(f.get("summary") or "") for f in fs)
            cells.append(f'<td class="{cell_class(v)}" title="{esc(title)}">{mark(v)}</td>')
        rows.append(cells)
    return ("<h2>Checks per node</h2><p class=\"legend\">A cell per node (\u2713 pass, \u25b2 warn, \u2717 fail, "
            "\u2013 skip, \u00b7 nothing about that node); <em>all</em> holds findings about the cluster as a whole. "
            "Hover a cell for its findings.</p><div class=\"wide\">" + table(["check", *columns], rows) + "</div>")


# ------------------------------------------------------------------------------------------------ networks


def _cells(ms: list[Measure], check: str) -> tuple[dict[tuple[str, str], charts.Cell], float | None]:
    ok = [m.value for m in ms if m.ok and m.value is not None]
    med = median(ok)
    lo, hi = (min(ok), max(ok)) if ok else (0.0, 0.0)
    cells = {}
    for m in ms:
        where = f"{m.src} ({m.src_nic or '?'}) \u2192 {m.dst} ({m.dst_nic or '?'})"
        if m.ok is None:
            cells[(m.src, m.dst)] = charts.Cell("?", f"{where}: not tried ({m.note})", None, "untried")
            continue
        if not m.ok or m.value is None:
            status = "fail" if not m.ok else "ok"
            cells[(m.src, m.dst)] = charts.Cell("\u2717" if not m.ok else "ok", f"{where}: "
                                                + (f"failed: {m.note}" if not m.ok else "answered"), None, status)
            continue
        if check == "net.ping":
            # log scale over at least a factor of 10: round trips of 0.05 and 0.1 ms are both good
            good = 1.0 - math.log(max(m.value, lo) / lo) / math.log(max(hi / lo, 10.0)) if lo > 0 else 1.0
            slow = med is not None and m.value > 3 * med and m.value - med > 0.5
            text, title = f"{m.value:.2f}" if m.value < 10 else f"{m.value:.0f}", f"{where}: {m.value:.3f} ms round trip"
        else:
            good = m.value / hi if hi else 0.0
            slow = med is not None and m.value < 0.7 * med
            text, title = f"{m.value / 1e9:.1f}", f"{where}: {gbit(m.value)}"
        if slow:
            title += " (slow against the median)"
            text = "\u25bc" + text
        cells[(m.src, m.dst)] = charts.Cell(text, title, good, "slow" if slow else "ok")
    return cells, med


def _failed_nics(found: Round, check: str, ms: list[Measure]) -> dict[str, str]:
    """Row notes: the nodes a failing finding of ``check`` names on this network, with their NIC."""
    nics = {m.dst: m.dst_nic for m in ms} | {m.src: m.src_nic for m in ms}
    out = {}
    for f in found.findings():
        node = f.get("node")
        if (f.get("check") == check and f.get("verdict") == "fail" and node in nics
                and f.get("subject") in (None, nics[node])):
            out[node] = f" \u2717 {nics[node] or ''}".rstrip()
    return out


def _networks(found: Round) -> str:
    if not found.measures:
        reason = ("the pair checks (net.ping, net.bandwidth) did not run or measured no pair" if found.report
                  else "no report")
        return "<h2>Networks</h2>" + missing(f"no measured pair: {reason}")
    out = ["<h2>Networks</h2><p>Per network, each measured direction of each pair: rows send, columns receive. "
           "Colour: light is better (viridis scale); \u2717 hatched: nothing got through; \u25bc outlined: far off "
           "the network's median; ? not tried (an end was already known dead). Hover a cell for its value.</p>"]
    by_net: dict[str, list[Measure]] = defaultdict(list)
    for m in found.measures:
        by_net[m.network].append(m)
    order = sorted(by_net, key=lambda n: (not any(m.data_network for m in by_net[n]), n))
    for k, net in enumerate(order):
        ms = by_net[net]
        kind = "data network" if any(m.data_network for m in ms) else "other network"
        out.append(f"<h3>{esc(net)} ({kind})</h3>")
        for check, what, unit in (("net.ping", "ping round trip", "ms"), ("net.bandwidth", "TCP bandwidth",
                                                                          "Gbit/s")):
            mine = [m for m in ms if m.check == check]
            if not mine:
                continue
            ends = {x for m in mine for x in (m.src, m.dst)}
            names = [n for n in found.nodes if n in ends]
            names += sorted(ends - set(names))
            cells, med = _cells(mine, check)
            notes = _failed_nics(found, check, mine)
            uid = f"{k}{check.replace('.', '')}"
            med_text = ("" if med is None else f"; median {med:.3f} ms" if check == "net.ping" else
                        f"; median {gbit(med)}")
            svg = charts.matrix(names, cells, uid=uid, row_notes=notes, label=f"{what} matrix of {net}",
                                row_titles=_row_titles(mine, check))
            low, high = ("slower", "faster")
            out.append(f"<h4>{esc(what)} ({unit})</h4><figure><figcaption>{esc(what)} on {esc(net)} in {unit}"
                       f"{esc(med_text)}" + (f"; failing: <strong>{esc(', '.join(n + notes[n] for n in notes))}"
                                             "</strong>" if notes else "")
                       + f"</figcaption>{svg}{charts.gradient_legend(low, high, uid)}</figure>")
            out.append(_pair_tables(mine, cells, names, check))
    return "".join(out)


def _row_titles(ms: list[Measure], check: str) -> dict[str, str]:
    """Per sending node: its pairs' median and worst, for the hover of its row."""
    per: dict[str, list[Measure]] = defaultdict(list)
    for m in ms:
        per[m.src].append(m)
    out = {}
    for node, mine in per.items():
        got = [m for m in mine if m.ok and m.value is not None]
        if not got:
            out[node] = f"{node}: nothing measured"
            continue
        worst = max(got, key=lambda m: m.value or 0.0) if check == "net.ping" else min(got, key=lambda m: m.value or 0.0)
        out[node] = (f"{node} ({mine[0].src_nic or '?'}): median {_value(_median_of(got), check)}, worst "
                     f"{_value(worst, check)} to {worst.dst}; {len(mine) - len(got)} pair(s) without a value")
    return out


def _median_of(ms: list[Measure]) -> Measure:
    ordered = sorted(ms, key=lambda m: m.value or 0.0)
    return ordered[len(ordered) // 2]


def _pair_tables(ms: list[Measure], cells: Mapping[tuple[str, str], charts.Cell], names: list[str],
                 check: str) -> str:
    odd = [(m, cells[(m.src, m.dst)]) for m in ms if cells[(m.src, m.dst)].status != "ok"]
    out = ""
    if odd:
        per: Counter[tuple[str, str]] = Counter()
        for m, c in odd:
            per[(m.src, c.status)] += 1
            per[(m.dst, c.status)] += 1
        many = sorted(((node, status, k) for (node, status), k in per.items() if k >= 4), key=lambda x: -x[2])
        if many:
            out += "<ul>" + "".join(f"<li>{_odd_mark(status)} <strong>{esc(node)}</strong>: in {k} pair(s)</li>"
                                    for node, status, k in many) + "</ul>"
        rows = [[_odd_mark(c.status), esc(m.src), esc(m.src_nic or ""), esc(m.dst), esc(m.dst_nic or ""),
                 esc(_value(m, check)), esc(m.note)] for m, c in odd]
        headers = ["", "from", "NIC", "to", "NIC", "measured", "why"]
        out += table(headers, rows[:ODD_ROWS])
        if len(rows) > ODD_ROWS:
            out += (f"<details><summary>{len(rows) - ODD_ROWS} more</summary>" + table(headers, rows[ODD_ROWS:])
                    + "</details>")
    if len(names) <= TEXT_PAIRS_UP_TO:
        rows = [[esc(m.src), esc(m.dst), esc(_value(m, check))] for m in ms]
        out += (f"<details><summary>every pair as text ({len(ms)})</summary>"
                + table(["from", "to", "measured"], rows, numeric=(2,)) + "</details>")
    return out


def _odd_mark(status: str) -> str:
    glyph, cls, word = {"fail": ("\u2717", "bad", "failed"), "slow": ("\u25bc", "warn", "slow"),
                        "untried": ("?", "mute", "not tried")}[status]
    return f'<span class="v {cls}">{glyph} {word}</span>'


def _value(m: Measure, check: str) -> str:
    if m.ok is None:
        return "not tried"
    if not m.ok or m.value is None:
        return "no reply" if check == "net.ping" and not m.ok else "failed" if not m.ok else "answered"
    return f"{m.value:.3f} ms" if check == "net.ping" else gbit(m.value)


# ------------------------------------------------------------------------------------------------ the fleet


def _fleet(found: Round) -> str:
    out = ["<h2>Nodes against the fleet</h2><p>Numbers that should be equal on every node, each against the "
           "median (dashed); a bar off it by more than 10% is orange and marked \u25b2/\u25bc.</p>"]
    reports = {n: (found.facts.get(n) or NodeFacts(n)).report for n in found.nodes}
    known = {n: r for n, r in reports.items() if r is not None}
    if not known:
        out.append(missing("no node's facts (GPUs, NIC speeds) are there"))
    else:
        gpus = {n: r.gpus for n, r in known.items()}
        if any(v for v in gpus.values()):
            med = median([float(v) for v in gpus.values() if v is not None])
            out.append("<h3>GPU count</h3>" + charts.bars(
                [charts.Bar(n, float(gpus[n]) if gpus.get(n) is not None else None,
                            str(gpus[n]) if gpus.get(n) is not None else "not reported") for n in found.nodes],
                med, label="GPUs per node"))
            models = {n: r.gpu_model or "-" for n, r in known.items()}
            common = Counter(models.values()).most_common(1)[0][0]
            rows = [[esc(n), esc(models.get(n, "unknown")) + (" " + mark("warn", "differs") if n in models and
                                                              models[n] != common else "")] for n in found.nodes]
            out.append("<h3>GPU model</h3>" + table(["node", "model"], rows))
        else:
            out.append("<p>GPUs: none reported on any node.</p>")
        out.append(_nic_speeds(found, known))
    bw = [m for m in found.measures if m.check == "net.bandwidth" and m.ok and m.value]
    if bw:
        per = {n: median([m.value for m in bw if n in (m.src, m.dst) and m.value]) for n in found.nodes}
        med = median([v for v in per.values() if v is not None])
        out.append("<h3>Bandwidth to the others</h3><p class=\"legend\">The median of each node's measured "
                   "transfers (sent and received).</p>" + charts.bars(
                       [charts.Bar(n, per[n], gbit(per[n]) if per[n] else "not measured") for n in found.nodes],
                       med, label="bandwidth per node"))
    return "".join(out)


def _nic_speeds(found: Round, known: Mapping[str, Any]) -> str:
    data_nic = {m.src: m.src_nic for m in found.measures if m.data_network and m.src_nic}
    speeds = {}
    for n in found.nodes:
        r = known.get(n)
        nic = data_nic.get(n)
        if r is None or not nic:
            continue
        mbit = r.speeds.get(nic)
        speeds[n] = (nic, float(mbit) if mbit and mbit > 0 else None)
    if not speeds:
        rows = [[esc(n), esc(", ".join(f"{k} {v} Mbit/s" for k, v in sorted(r.speeds.items()) if v and v > 0)
                             or "none reported")] for n, r in known.items()]
        return "<h3>NIC speeds</h3>" + table(["node", "NICs"], rows)
    med = median([v for _, v in speeds.values() if v])
    items = [charts.Bar(f"{n} {speeds[n][0]}" if n in speeds else n, speeds[n][1] if n in speeds else None,
                        f"{speeds[n][1] / 1000:g} Gbit/s" if n in speeds and speeds[n][1] else "speed unknown")
             for n in found.nodes]
    return "<h3>Data NIC speed (negotiated)</h3>" + charts.bars(items, med, label="data NIC speed per node")


# ------------------------------------------------------------------------------------------------ topology


_LINK_CLASS = {topo.LinkKind.SELF: "cell-mute", topo.LinkKind.NVLINK: "cell-ok", topo.LinkKind.PIX: "cell-ok",
               topo.LinkKind.PXB: "", topo.LinkKind.PHB: "", topo.LinkKind.NODE: "cell-warn",
               topo.LinkKind.SYS: "cell-bad"}


def _topo_table(t: topo.Topology) -> str:
    names = [d.name + (f" ({d.hca})" if d.hca and d.hca != d.name else "") for d in t.devices]
    rows = []
    for d, links in zip(t.devices, t.links, strict=True):
        cells = [f"<strong>{esc(d.name)}</strong>"]
        cells += [f'<td class="{_LINK_CLASS.get(link.kind, "")}">{esc(link)}</td>' for link in links]
        cells.append(esc(_cpus(d.cpus)))
        cells.append(esc(",".join(str(n) for n in sorted(d.numa_nodes)) or "-"))
        rows.append(cells)
    return table(["", *names, "CPU affinity", "NUMA"], rows)


def _cpus(cpus: frozenset[int]) -> str:
    if not cpus:
        return "-"
    out, run = [], [min(cpus)]
    for c in sorted(cpus)[1:]:
        if c == run[-1] + 1:
            run.append(c)
        else:
            out.append(run)
            run = [c]
    out.append(run)
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out)


def _topologies(found: Round) -> str:
    out = ["<h2>GPU, NIC and NUMA topology</h2><p class=\"legend\">From <code>nvidia-smi topo -m</code> on each node; "
           "nodes with the same matrix are shown once. NV# NVLink, PIX/PXB PCIe switch, PHB host bridge, NODE within "
           "a NUMA node, SYS across NUMA nodes (slowest, marked).</p>"]
    groups: dict[str, list[str]] = defaultdict(list)
    tables: dict[str, str] = {}
    absent: dict[str, list[str]] = defaultdict(list)
    for n in found.nodes:
        t, why = found.topology(n)
        if t is None:
            absent[why].append(n)
            continue
        html = _topo_table(t)
        groups[html].append(n)
        tables[html] = html
    if len(groups) > 1:
        out.append(f"<p>{mark('warn', f'{len(groups)} different matrices')}: the nodes are not built alike.</p>")
    for html, nodes in sorted(groups.items(), key=lambda g: -len(g[1])):
        out.append(f"<h3>{esc(', '.join(nodes))}</h3>{html}")
    for why, nodes in absent.items():
        out.append(f"<p>{esc(', '.join(nodes))}: {mark('unknown', 'no matrix')} ({esc(why)})</p>")
    return "".join(out)
