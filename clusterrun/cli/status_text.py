"""`clusterrun status`'s text of one run (also what `clusterrun attach` shows once the run has ended)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click


def energy_line(energy: Any) -> str | None:
    """The run's GPU energy in one line (None when no GPU was sampled)."""
    if not energy or not energy.get("per_node_j"):
        return None
    nodes = ", ".join(f"{node} {joules / 1000:.1f} kJ" for node, joules in energy["per_node_j"].items())
    how = set((energy.get("how") or {}).values())
    found = "from the energy counter" if how == {"counter"} else "power over time" if how == {"power"} else "measured"
    return f"GPU energy: {energy['total_j'] / 1000:.1f} kJ ({energy['total_j'] / 3.6e6:.3f} kWh; {nodes}; {found})"


def _print_timeline(record: Any) -> None:
    from rich.console import Console

    from clusterrun.cli.run_view import timeline_table

    table = timeline_table(record)
    if table is not None:
        Console(highlight=False, width=None if sys.stdout.isatty() else 200).print(table)


def _earlier_logs(found: Any, record: Any) -> dict[str, Path]:
    """The nodes whose logs are only in an earlier attempt's directory (left out of the later ones): where."""
    out: dict[str, Path] = {}
    for name, _rank, path in found.rank_logs():
        if path.parent.parent != found.path and name not in record.nodes:
            out.setdefault(name, path.parent)
    return out


def print_status(found: Any) -> None:
    """The run's state, per node and rank what happened, its launch timeline, attempts, events and notes."""
    from clusterrun.runs import run_record
    from clusterrun.runs.record import signal_name
    from clusterrun.runs.timeline import when

    record = run_record(found)
    plan = found.read_plan()
    took = f", took {record.duration:.1f}s" if record.duration is not None else ""
    click.echo(f"run {found.run_id}: {record.state.value}, {plan.nnodes} node(s), {plan.world_size} rank(s), "
               f"script {plan.job.script}, started {when(record.started)}{took}"
               + (f", exit code {record.exit_code}" if record.exit_code is not None else ""))
    for name, node in record.nodes.items():
        ranks = ", ".join(f"{r}: {o.state.value}" + (f" ({signal_name(o.signal) or o.exit_code})" if o.exit_code
                                                     else "") for r, o in sorted(node.ranks.items()))
        what = (node.state.value if node.state else
                f"exit code {node.exit_code}" if node.exit_code is not None else record.state.value)
        reason = f" - {node.reason}" if node.reason and what != "succeeded" else ""
        click.echo(f"  {name}: {what}{reason}" + (f"; ranks {ranks}" if ranks else ""))
    for name, problem in record.problems.items():
        click.echo(f"  {name}: {problem}")
    _print_timeline(record)
    for attempt in record.attempts:
        took = f" in {attempt.duration:.1f}s" if attempt.duration is not None else ""
        what = f"{attempt.state}: {attempt.cause}" if attempt.cause else attempt.state
        click.echo(f"attempt {attempt.number} on {', '.join(attempt.nodes)}, started {when(attempt.started)}"
                   f"{took}: {what}")
    if record.first_failure is not None:
        click.echo(f"first failure: {record.first_failure.describe()}")
    if energy_line(record.energy):
        click.echo(energy_line(record.energy))
    for event in record.events:
        click.echo(f"event {when(event.get('time'))}: {event.get('node')}: {event.get('kind')}: {event.get('text')}")
    for note in record.notes:
        click.echo(f"note: {note}")
    if record.detached and record.state.value in ("detached", "running"):
        click.echo(f"detached: it runs on its own; `clusterrun attach {found.run_id}` shows it live, `clusterrun logs "
                   f"{found.run_id} -f` follows its ranks, `clusterrun down {found.run_id}` stops it")
    if record.state.value == "lost":
        click.echo(f"clusterrun stopped without recording the end; `clusterrun down {found.run_id}` stops what is left")
    click.echo(f"logs: {found.path}/")
    for name, where in _earlier_logs(found, record).items():
        click.echo(f"logs of {name}: {where}/")
