"""What `clusterrun status` draws of a run beyond its text: the launch timeline (a row per node, a column per phase)
and, with ``--watch``, the live view of a running run, refreshed in place until it ends.

Both are rendered from the run record alone (status.json: :mod:`clusterrun.runs.timeline` says what the supervisor
writes there), so a run of an older clusterrun shows what its file has and says what it lacks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from clusterrun.runs.record import NodeRecord, RunRecord, RunState
from clusterrun.runs.timeline import PHASES, PhaseSpan, size
from clusterrun.runs.traffic import rate_text

#: Seconds between two looks at status.json (the supervisor writes it every 2 s or so).
WATCH_EVERY = 1.0
#: The newest samples of a node folded into its row (a few seconds: one sample alone jitters).
RECENT = 3
#: A running node's newest sample older than this many seconds is shown with its age.
STALE = 10.0


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}s" if value < 10 else f"{value:.0f}s"


def _cell(span: PhaseSpan | None, going: bool) -> str:
    if span is None or span.start is None:
        return "-"
    if span.end is None:
        return "..." if going else "-"
    copied = span.detail.get("bytes")
    warm = " warm" if span.detail.get("warm") is True else ""  # torchrun importing torch since the ready check
    return _seconds(span.seconds) + (f" {size(copied)}" if isinstance(copied, (int, float)) and copied else "") + warm


def timeline_table(record: RunRecord) -> Table | None:
    """A row per node: how long each launch phase took, and when (from the first node's connect) torchrun ran and the
    first rank line came. None when the record has no timeline (a run of an older clusterrun, or one that did not
    get that far)."""
    timed = {name: node.timeline for name, node in record.nodes.items() if node.timeline}
    if not timed:
        return None
    starts = [s.start for t in timed.values() for s in t.values() if s.start is not None]
    origin = min(starts) if starts else 0.0
    table = Table(box=None, padding=(0, 1), title="launch timeline (seconds per phase)", title_justify="left")
    table.add_column("node", no_wrap=True)
    for phase in PHASES:
        table.add_column(phase.replace("_", " "), justify="right", no_wrap=True)
    table.add_column("torchrun at", justify="right", no_wrap=True)
    table.add_column("first line at", justify="right", no_wrap=True)
    for name, timeline in timed.items():
        go, first = timeline.get("go"), timeline.get("first_line")
        running = go.end if go is not None else None
        going = record.state in (RunState.starting, RunState.running) and record.nodes[name].ended is None
        table.add_row(name, *(_cell(timeline.get(p), going) for p in PHASES),
                      _seconds(running - origin) if running is not None else "-",
                      _seconds(first.end - origin) if first is not None and first.end is not None else "-")
    return table


# ---------------------------------------------------------------- the live view


def _phase(node: NodeRecord | None, state: RunState) -> str:
    """Where a node is: its end, or the last launch phase it reached (``running`` once its first line came)."""
    if node is None:
        return "starting" if state in (RunState.starting, RunState.running) else "-"
    if node.state is not None and node.ended is not None:
        return node.state.value
    reached = [p for p in PHASES if p in node.timeline and node.timeline[p].start is not None]
    if not reached:
        return "starting"
    last = reached[-1]
    if last == "first_line" and node.timeline[last].end is not None:
        return "running"
    return last.replace("_", " ") + ("" if node.timeline[last].end is not None else "...")


def _age(now: float, when: float | None) -> str:
    if when is None:
        return "-"
    ago = max(0.0, now - when)
    return f"{ago:.0f}s ago" if ago < 120 else f"{ago / 60:.0f}m ago"


def _cpu(cpu: dict[str, float] | Any) -> str:
    if not cpu:
        return "-"
    shares = sorted(cpu.values())
    mean = sum(shares) / len(shares)
    return f"{100 * mean:.0f}%" + (f" (min {100 * shares[0]:.0f}%)" if len(shares) > 1 else "")


def newest_samples(run_dir: Path, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each node's newest samples folded into one (clusterrun/runs/series.py), read from the ends of their files
    only: cheap to do every second however long the run has been going. A node without samples is left out."""
    from clusterrun.runs import series

    out = {}
    for name in names:
        recent = series.latest(run_dir, name, RECENT)
        if recent:
            out[name] = series.fold(recent)
    return out


def _net(sample: Mapping[str, Any] | None, data_nic: str | None, now: float, going: bool) -> tuple[str, str]:
    """The data NIC's throughput and the GPUs' utilisation in ``sample`` (``-`` where it has none)."""
    if not sample:
        return "-", "-"
    nics = sample.get("nics") if isinstance(sample.get("nics"), Mapping) else {}
    pair = nics.get(data_nic) if data_nic else None
    nic = (f"{data_nic} rx {rate_text(pair[0])} tx {rate_text(pair[1])}" if isinstance(pair, list) and len(pair) == 2
           else f"{data_nic or '?'}: no reading")
    age = now - float(sample.get("t") or now)
    if going and age > STALE:
        nic += f" ({age:.0f}s old)"
    gpus = sample.get("gpus") if isinstance(sample.get("gpus"), Mapping) else {}
    utils = [g["util"] for g in gpus.values() if isinstance(g, Mapping) and isinstance(g.get("util"), (int, float))]
    gpu = f"{len(gpus)}x {sum(utils) / len(utils):.0f}% (min {min(utils):.0f}%)" if utils else "-"
    return nic, gpu


def live_view(record: RunRecord, nodes: Sequence[tuple[str, int]], now: float | None = None,
              samples: Mapping[str, Mapping[str, Any]] | None = None,
              data_nics: Mapping[str, str | None] | None = None) -> Group:
    """The live view of one run: a line on the run, then a row per node (``nodes``: name and ranks, in the plan's
    order): its phase, ranks running, the age of its last output, its ranks' CPU, its data path; with ``samples``
    (:func:`newest_samples`) also its data NIC's throughput (``data_nics``: the plan's) and its GPUs' use."""
    now = time.time() if now is None else now
    took = (record.ended or now) - record.started if record.started is not None else None
    head = Text(f"run {record.run_id}: {record.state.value}" + (f", {_seconds(took)}" if took is not None else "")
                + f", {len(nodes)} node(s), {sum(r for _, r in nodes)} rank(s)")
    table = Table(box=None, padding=(0, 2))
    sampled = samples is not None
    for column in ("node", "phase", "ranks", "last output", "cpu", "data path",
                   *(("data NIC", "GPUs") if sampled else ())):
        table.add_column(column, no_wrap=True)
    updated = []
    for name, ranks in nodes:
        node = record.nodes.get(name)
        live = node.live if node is not None else None
        if live is not None and live.updated is not None:
            updated.append(live.updated)
        running = f"{live.ranks_running}/{ranks}" if live is not None and live.ranks_running is not None else f"-/{ranks}"
        if node is not None and node.ended is not None:
            running = f"0/{ranks}"
        path = live.path if live is not None and live.path else "-"
        # Its age when the supervisor last wrote (every few seconds): the output may be newer, never older.
        seen = _age(live.updated or now, live.last_output) if live is not None else "-"
        going = record.state in (RunState.starting, RunState.running) and (node is None or node.ended is None)
        net = _net((samples or {}).get(name), (data_nics or {}).get(name), now, going) if sampled else ()
        table.add_row(name, _phase(node, record.state), running, seen,
                      _cpu(live.cpu if live else {}), Text(path, style="bold" if path.startswith("lost") else ""),
                      *net)
    parts: list[Any] = [head, table]
    if record.events:
        last = record.events[-1]
        parts.append(Text(f"last event: {last.get('node')}: {last.get('kind')}: {last.get('text')}"))
    if record.first_failure is not None:
        parts.append(Text(f"first failure: {record.first_failure.describe()}"))
    if record.state is RunState.running and not updated:
        parts.append(Text("no live state yet (it comes every few seconds; a run of an older clusterrun has none)"))
    elif record.state is RunState.running and now - max(updated) > 30:
        parts.append(Text(f"the live state is {now - max(updated):.0f}s old: is clusterrun still running?"))
    return Group(*parts)
