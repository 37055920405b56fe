"""The page of a run: its state, the first failure with its last lines, every attempt, a timeline per node and
rank (start, launch phases, end and exit code, the watch's events), output per rank, and the plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clusterrun.report import charts
from clusterrun.report.html import VERMILLION, document, esc, mark, missing, pre, seconds, size, table, when
from clusterrun.report.run_data import RunData, masked_env
from clusterrun.report.series_page import series_section
from clusterrun.runs.record import signal_name

#: Lines of the failing rank's log shown on its card.
TAIL = 30
#: Beyond this many ranks the timeline leaves out the rows of ranks that were only stopped.
MANY_RANKS = 64
#: event kind -> (glyph, colour, what it is)
EVENT_MARKS: dict[str, tuple[str, str, str]] = {
    "path-lost": ("\u25c6", VERMILLION, "data path lost"), "path-verdict": ("\u25c6", VERMILLION, "dead data path"),
    "path-ok": ("\u25c7", "#0072B2", "data path back"), "hang": ("\u25cf", "#8a5a00", "hang: no output"),
    "hang-stacks": ("\u25cf", "#8a5a00", "stacks taken"), "hang-collectives": ("\u25cf", "#8a5a00", "collectives"),
    "straggler": ("\u25a0", "#8a5a00", "straggler"), "flight-dump": ("\u25cb", "#444", "flight recorder dump"),
    "wrong-nic": ("\u25b2", "#8a5a00", "traffic on the wrong NIC"),
}


def _code(exit_code: int | None, signum: int | None) -> str:
    if signum:
        return f"{signal_name(signum)}" + (f" ({exit_code})" if exit_code is not None else "")
    return "-" if exit_code is None else str(exit_code)


def run_page(data: RunData) -> str:
    """The whole HTML page of the run in ``data``."""
    rec = data.record
    plan = data.plan
    world = plan.get("world_size") or sum(len(range(*_ranks(n))) for n in data.nodes) or "?"
    script = " ".join(str(x) for x in [plan.get("script") or "?", *(plan.get("args") or ())])
    sub = (f"{mark(rec.state.value)} &nbsp; <span class=\"mono\">{esc(script)}</span> on {len(data.node_names())} "
           f"node(s), {esc(world)} rank(s); started {esc(when(rec.started))}, took {esc(seconds(rec.duration))}"
           + (f", exit code <strong>{esc(rec.exit_code)}</strong>" if rec.exit_code is not None else "")
           + f" &nbsp; <span class=\"mono\">{esc(data.run.path)}/</span>")
    body = [missing(m) for m in data.missing]
    if rec.state.value == "detached":
        body.append("<p>" + mark("detached") + " it runs on its own; its end is recorded by <code>clusterrun logs "
                    f"{esc(data.run.run_id)}</code> (this page is written again then).</p>")
    if rec.state.value == "lost":
        body.append("<p>" + mark("lost") + " clusterrun stopped without recording the end; <code>clusterrun down "
                    f"{esc(data.run.run_id)}</code> stops what is left.</p>")
    if (data.run.path / "doctor" / "report.html").is_file():
        body.append('<p>Before the start, doctor\'s network checks (<code>--preflight full</code>): '
                    '<a href="doctor/report.html">their page</a>.</p>')
    body += [_failure(data), _problems(data), _attempts(data), _timeline(data), series_section(data),
             _rank_table(data), _output(data),
             _events(data), _plan(data)]
    if rec.notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in rec.notes) + "</ul>")
    return document(f"clusterrun run {data.run.run_id}: {rec.state.value}", sub, body)


def _ranks(node: Mapping[str, Any]) -> tuple[int, int]:
    r = node.get("ranks") or [0, -1]
    try:
        return int(r[0]), int(r[-1]) + 1
    except (TypeError, ValueError, IndexError):
        return 0, 0


# ------------------------------------------------------------------------------------------------ failure


def _failure(data: RunData) -> str:
    failure = data.record.first_failure
    if failure is None:
        return ""
    attempt = data.failure_attempt(failure)
    log = data.log_of(failure.node, failure.rank, attempt)
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL:] if log else []
    except OSError:
        lines = []
    how = (f"killed by {signal_name(failure.signal)}" if failure.signal else f"exit code {failure.exit_code}")
    who = f"{failure.node} rank {failure.rank}" if failure.rank is not None else f"{failure.node} (the node)"
    where = (f"last {len(lines)} line(s) of <span class=\"mono\">{esc(log)}</span>" if lines
             else "no log lines were received from it")
    return ('<div class="card"><h3>' + mark("failed", "first failure") + f": {esc(who)}, {esc(how)}</h3>"
            f"<p>{esc(failure.describe())}" + (f" (attempt {attempt})" if attempt is not None else "") + "</p>"
            f"<p>{where}</p>" + (pre(lines) if lines else "") + "</div>")


def _problems(data: RunData) -> str:
    if not data.record.problems and not data.record.detail:
        return ""
    rows = [[esc(n), esc(why)] for n, why in data.record.problems.items()]
    if data.record.detail:
        rows.append(["run", esc(data.record.detail)])
    return "<h2>Why it did not start</h2>" + table(["node", "problem"], rows)


def _attempts(data: RunData) -> str:
    if not data.record.attempts:
        return ""
    rows = []
    for a in data.record.attempts:
        changes = [f"{lost} \u2192 spare {spare}" for lost, spare in a.replaced.items()]
        changes += [f"without {n} ({why})" for n, why in a.left_out.items() if n not in a.replaced]
        rows.append([str(a.number), esc(", ".join(a.nodes)), esc(when(a.started)), esc(seconds(a.duration)),
                     mark(a.state), esc(a.exit_code if a.exit_code is not None else "-"), esc(a.cause or ""),
                     esc("; ".join(changes))])
    return (f"<h2>Attempts ({len(data.record.attempts)})</h2>"
            + table(["attempt", "nodes", "started", "took", "state", "exit", "cause", "nodes changed"], rows,
                    numeric=(0, 5)))


# ------------------------------------------------------------------------------------------------ timeline


def _timeline(data: RunData) -> str:
    rec = data.record
    axis = data.axis()
    if axis is None:
        return "<h2>Timeline</h2>" + missing("no start time is recorded: no timeline")
    t0, end = axis
    total = max(end - t0, 0.1)
    bands = [charts.Span(a.started - t0, (a.ended or end) - t0, a.state, f"attempt {a.number}: {a.state}"
                         + (f" ({a.cause})" if a.cause else ""), f"attempt {a.number}")
             for a in rec.attempts if a.started is not None]
    rows: list[charts.Row] = []
    run_points = [_event_point(e, t0) for e in rec.events if e.get("node") in (None, "-", "")]
    if run_points or rec.attempts:
        restarts = [charts.Point(a.started - t0, "\u21bb", f"attempt {a.number} started", "#222")
                    for a in rec.attempts[1:] if a.started is not None]
        rows.append(charts.Row("run", points=[*run_points, *restarts]))
    phases = data.phases()
    failure = _last_failure(data)
    # Many ranks: the ranks stopped after another's failure (all alike) get no row; the table lists every rank.
    many = sum(len(n.ranks) for n in rec.nodes.values()) > MANY_RANKS
    earlier: dict[tuple[str, int], list[charts.Point]] = {}  # a rank's failures in earlier attempts
    for a in rec.attempts[:-1]:
        f = a.first_failure
        if f is not None and f.rank is not None:
            earlier.setdefault((f.node, f.rank), []).append(charts.Point(
                (a.ended or end) - t0, "\u2717", f"attempt {a.number}: {f.describe()}", VERMILLION))
    for name in data.node_names():
        node = rec.nodes.get(name)
        spans, points = [], []
        for a in rec.attempts[:-1]:  # earlier attempts: the node's part in each, from the attempt's record
            if name in a.nodes and a.started is not None:
                failed = a.first_failure is not None and a.first_failure.node == name
                state = "failed" if failed else "stopped" if a.state == "failed" else a.state
                spans.append(charts.Span(a.started - t0, (a.ended or end) - t0, state,
                                         f"{name}, attempt {a.number}: {state}"
                                         + (f" ({a.first_failure.describe()})" if failed and a.first_failure else ""),
                                         f"#{a.number} {state}"))
            if name in a.replaced:
                points.append(charts.Point((a.started or t0) - t0, "\u2605",
                                           f"{name} replaced by spare {a.replaced[name]}", "#0072B2"))
        for a in rec.attempts:
            if name in a.replaced.values() and a.started is not None:
                lost = next(k for k, v in a.replaced.items() if v == name)
                points.append(charts.Point(a.started - t0, "\u2605", f"spare {name} takes {lost}'s place "
                                                                     f"(attempt {a.number})", "#0072B2"))
        if node is not None and node.started is not None:
            state = node.state.value if node.state else rec.state.value
            spans.append(charts.Span(node.started - t0, (node.ended or end) - t0, state,
                                     f"{name}: {state}" + (f", exit code {node.exit_code}" if node.exit_code is not None
                                                           else "") + (f" ({node.reason})" if node.reason else ""),
                                     state))
            if node.launched:
                points.append(charts.Point(node.launched - t0, "\u25b7", f"{name}: torchrun started", "#222"))
        points += [_event_point(e, t0) for e in rec.events if e.get("node") == name]
        strong = failure == (name, None)
        rows.append(charts.Row(name, spans, points, strong))
        for p in (p for p in phases if p.node == name):
            rows.append(charts.Row(f"  {name} {p.name}", [charts.Span(p.start - t0, (p.end or p.start) - t0,
                                                                      "running", f"{name}: {p.name} "
                                                                      + (f"{p.end - p.start:.2f}s" if p.end else ""))]))
        for r, rank in sorted((node.ranks if node else {}).items()):
            if rank.started is None or (many and rank.state.value == "stopped" and failure != (name, r)
                                        and (name, r) not in earlier):
                continue
            code = _code(rank.exit_code, rank.signal)
            label = rank.state.value + ("" if code == "-" else f" {code}")
            rows.append(charts.Row(f"  {name} rank {r}", [charts.Span(
                rank.started - t0, (rank.ended or end) - t0, rank.state.value,
                f"rank {r} on {name}: {rank.state.value}, exit {code}, ran {seconds((rank.ended or end) - rank.started)}",
                label)], earlier.pop((name, r), []), strong=failure == (name, r)))
        for (node_name, r), marks in sorted(earlier.items()):
            if node_name == name and not (node and r in node.ranks and node.ranks[r].started is not None):
                rows.append(charts.Row(f"  {name} rank {r}", points=marks))
    legend = ("<p class=\"legend\">" + ("Ranks that were stopped after another's failure have no row here (the "
                                          "table below lists every rank). " if many else "") + "Seconds since the start. Bars: \u2713 succeeded (blue), \u2717 failed (hatched), "
              "\u25a0 stopped (grey), unknown (light grey); \u25b7 torchrun started, \u25c6 data path lost, "
              "\u25c7 back, \u25cf hang, \u25a0 straggler, \u21bb restart, \u2605 spare used, \u25b2 traffic on the "
              "wrong NIC. The row of the first "
              "failure is bold. Every bar's state is also in the tables below.</p>")
    svg = charts.timeline(rows, total, bands=bands, label="timeline per node and rank")
    out = f"<h2>Timeline</h2>{legend}<figure>{svg}</figure>"
    if phases:
        out += ("<h3>Launch phases</h3>" + table(["node", "phase", "from", "took"], [
            [esc(p.node), esc(p.name), f"{p.start - t0:.2f}s", esc(seconds(p.end - p.start) if p.end else "-")]
            for p in phases], numeric=(2, 3)))
    return out


def _last_failure(data: RunData) -> tuple[str, int | None] | None:
    """(node, rank) of the first failure when it happened in the attempt the record's nodes are of (the last)."""
    failure = data.record.first_failure
    if failure is None:
        return None
    attempt = data.failure_attempt(failure)
    last = data.record.attempts[-1].number if data.record.attempts else None
    return (failure.node, failure.rank) if attempt is None or attempt == last else None


def _event_point(event: Mapping[str, Any], t0: float) -> charts.Point:
    glyph, colour, what = EVENT_MARKS.get(str(event.get("kind")), ("\u25cb", "#444", str(event.get("kind"))))
    at = event.get("time") if isinstance(event.get("time"), (int, float)) else t0
    return charts.Point(at - t0, glyph, f"{what}: {event.get('text') or ''}", colour)


# ------------------------------------------------------------------------------------------------ tables


def _rank_table(data: RunData) -> str:
    rec = data.record
    if not rec.nodes:
        return ""
    received = data.received()
    failure = _last_failure(data)
    rows = []
    for name, node in rec.nodes.items():
        node_state = node.state.value if node.state else rec.state.value
        for r, rank in sorted(node.ranks.items()):
            first = failure == (name, r)
            got = received.get((name, r))
            rows.append([esc(name), ("<strong>" if first else "") + esc(r) + (" \u2190 first failure</strong>"
                                                                               if first else ""),
                         esc(rank.local_rank if rank.local_rank is not None else "-"), mark(rank.state.value),
                         esc(_code(rank.exit_code, rank.signal)), esc(seconds(rank.ended - rank.started) if
                                                                      rank.started and rank.ended else "-"),
                         esc(size(got[0]) if got else "-"), esc(got[1] if got else "-")])
        if not node.ranks:
            rows.append([esc(name), "-", "-", mark(node_state), esc(_code(node.exit_code, None)), "-", "-", "-"])
    reasons = [[esc(n), mark(o.state.value if o.state else "unknown"), esc(o.reason)] for n, o in rec.nodes.items()
               if o.reason and (o.state is None or o.state.value != "succeeded")]
    last = f" (attempt {rec.attempts[-1].number}, the last)" if rec.attempts else ""
    return (f"<h2>Nodes and ranks{last}</h2>" + table(["node", "rank", "local", "state", "exit", "ran", "output", "lines"],
                                                 rows, numeric=(1, 2, 4, 5, 6, 7))
            + (table(["node", "state", "why"], reasons) if reasons else ""))


def _output(data: RunData) -> str:
    received = data.received()
    if not received:
        sizes = {(n, r): p.stat().st_size for n, r, p in data.run.rank_logs() if p.is_file()}
        received = {k: (v, 0) for k, v in sizes.items()}
    out = "<h2>Output per rank</h2>"
    if received:
        items = sorted(received.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        med = sorted(v[0] for _, v in items)[len(items) // 2]
        out += charts.bars([charts.Bar(f"{n} rank {r}", float(b), size(b)) for (n, r), (b, _l) in items],
                           float(med), label="output per rank", tolerance=0.5)
    else:
        out += missing("no rank output is recorded")
    logs = data.record.logs or {}
    if logs.get("gaps") or logs.get("unverified"):
        out += missing(f"output that never reached the run directory: {logs.get('gaps') or ''} "
                       f"{'unverified on ' + ', '.join(logs.get('unverified') or []) if logs.get('unverified') else ''}")
    out += ("<p class=\"legend\">The run record keeps each rank's output as totals over the run; the NICs, GPUs "
            "and each rank's CPU over time are drawn above, when the nodes were sampled.</p>")
    return out


def _events(data: RunData) -> str:
    events = data.record.events
    if not events:
        return ""
    t0 = data.record.started or 0.0
    rows = [[esc(f"{e['time'] - t0:.1f}s" if isinstance(e.get("time"), (int, float)) and t0 else "-"),
             esc(e.get("attempt", "")), esc(e.get("node")),
             f"{esc(_glyph(e))} {esc(e.get('kind'))}", esc(e.get("text"))]
            for e in events]
    return "<h2>Events</h2>" + table(["at", "attempt", "node", "kind", "what"], rows, numeric=(0,))


def _glyph(event: Mapping[str, Any]) -> str:
    return EVENT_MARKS.get(str(event.get("kind")), ("\u25cb", "", ""))[0]


def _plan(data: RunData) -> str:
    nodes = data.nodes
    if not nodes:
        return "<h2>Plan</h2>" + missing("no plan to show")
    p = data.plan
    head = (f"<p>master {esc(p.get('master_addr'))}:{esc(p.get('master_port'))} on data network "
            f"{esc(p.get('data_network') or '-')}; {esc(p.get('nnodes') or len(nodes))} node(s), "
            f"{esc(p.get('world_size') or '?')} rank(s)</p>")
    rows = []
    for n in nodes:
        lo, hi = _ranks(n)
        rows.append([esc(n.get("name")), esc(n.get("host")), esc(n.get("node_rank")),
                     esc(f"{lo}-{hi - 1}" if hi - lo > 1 else lo), esc(",".join(str(g) for g in n.get("gpus") or ())
                                                                       or "-"),
                     esc(n.get("data_nic") or "-"), esc(n.get("data_address") or "-")])
    out = "<h2>Plan</h2>" + head + table(["node", "host", "node rank", "ranks", "GPUs", "data NIC", "address"], rows)
    envs = {str(n.get("name")): masked_env(n) for n in nodes}
    shared = _shared(list(envs.values()))
    if shared:
        out += ("<h3>Environment of every node</h3><p class=\"legend\">Secrets are masked.</p>"
                + table(["variable", "value"], [[f"<code>{esc(k)}</code>", f"<code>{esc(v)}</code>"]
                                                for k, v in sorted(shared.items())]))
    own = [[esc(name), f"<code>{esc(k)}</code>", f"<code>{esc(v)}</code>"] for name, env in envs.items()
           for k, v in sorted(env.items()) if k not in shared]
    if own:
        out += "<h3>Environment per node</h3>" + table(["node", "variable", "value"], own)
    argv = [str(a) for a in (nodes[0].get("argv") or ())]
    if argv:
        out += f"<h3>Command on {esc(nodes[0].get('name'))}</h3>" + pre([" ".join(argv)])
    for w in p.get("warnings") or ():
        out += f"<p>{mark('warn', 'warning')} {esc(w)}</p>"
    return out


def _shared(envs: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not envs:
        return {}
    first = envs[0]
    return {k: v for k, v in first.items() if all(e.get(k) == v for e in envs[1:])}
