"""Day-to-day commands on past and running runs: `runs`, `status`, `logs`, `down`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from clusterrun.cli.pages import leave_page
from clusterrun.cli.run_args import RUN_ARG, RUNS_DIR
from clusterrun.remote import protocol


@click.command(epilog="""\b
Examples:
  clusterrun runs
  clusterrun runs --json | jq '.[] | select(.state == "failed")'""")
@RUNS_DIR
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def runs(runs_dir: Path, as_json: bool) -> int:
    """List the runs in the runs directory: id, state, nodes, ranks, start, duration, exit code."""
    from clusterrun.cli.detached_cmd import refreshed
    from clusterrun.runs import list_runs, run_record
    from clusterrun.runs.timeline import when

    rows = []
    for run in list_runs(runs_dir):
        refreshed(run, quiet=True)  # a detached run still going: as its supervisor has it
        plan = run.read_plan()
        record = run_record(run)
        rows.append({"run_id": run.run_id, "state": record.state.value, "nodes": plan.nnodes,
                     "world_size": plan.world_size, "script": plan.job.script,
                     "started": record.started, "duration": record.duration,
                     "exit_code": record.exit_code})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return 0
    if not rows:
        click.echo(f"no runs in {runs_dir}/")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, padding=(0, 2))
    for column in ("run", "state", "nodes", "ranks", "started", "took", "exit", "script"):
        table.add_column(column, no_wrap=column != "script")
    for r in rows:
        took = f"{r['duration']:.1f}s" if isinstance(r["duration"], (int, float)) else "-"
        table.add_row(r["run_id"], str(r["state"]), str(r["nodes"]), str(r["world_size"]), when(r["started"]), took,
                      "-" if r["exit_code"] is None else str(r["exit_code"]), str(r["script"]))
    Console(highlight=False, width=None if sys.stdout.isatty() else 200).print(table)
    return 0


@click.command(epilog="""\b
Examples:
  clusterrun status              # the last run
  clusterrun status 20261123-101500-a1b2 --json
  clusterrun status --watch      # a row per node, refreshed until the run ends""")
@RUN_ARG
@RUNS_DIR
@click.option("--json", "as_json", is_flag=True, help="Print status.json (with the state checked) as JSON.")
@click.option("--watch", is_flag=True, help="Show the running run live, a row per node (phase, ranks running, last "
              "output, CPU, data path, the data NIC's throughput and the GPUs' use from the newest samples), refreshed "
              "in place until it ends (Ctrl-C to stop watching).")
def status(run: str, runs_dir: Path, as_json: bool, watch: bool) -> int:
    """Show one run: its state, its launch timeline, and per node and rank what happened (RUN: an id, a unique part
    of one, or last)."""
    from clusterrun.cli.detached_cmd import refreshed
    from clusterrun.cli.status_text import print_status
    from clusterrun.runs import find_run, run_record

    found = find_run(runs_dir, run)
    if watch:
        if as_json:
            from clusterrun.errors import UsageError

            raise UsageError("--watch draws a live view: it does not go with --json")
        return _watch(found)
    refreshed(found)
    record = run_record(found)
    if as_json:
        click.echo(json.dumps(record.to_dict(), indent=2))
        return 0
    print_status(found)
    return 0


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _watch(found: Any) -> int:
    """The live view of ``found`` until its record says it ended (printed once when it already has)."""
    from rich.live import Live

    from clusterrun.cli.run_view import WATCH_EVERY, live_view, newest_samples
    from clusterrun.runs import RunState, run_record

    plan = found.read_plan().nodes
    nodes = [(n.name, len(n.ranks)) for n in plan]
    nics = {n.name: n.data_nic for n in plan}
    going = (RunState.starting, RunState.running)

    def view(record: Any) -> Any:  # with each node's newest samples: the ends of their files, read each time
        return live_view(record, nodes, samples=newest_samples(found.path, [n for n, _ in nodes]), data_nics=nics)

    record = run_record(found)
    console = _console()
    if record.state not in going:
        console.print(view(record))
        return 0
    try:
        with Live(view(record), console=console, auto_refresh=False) as live:
            while record.state in going:
                time.sleep(WATCH_EVERY)  # status.json is rewritten every few seconds: a look a second is enough
                record = run_record(found)
                live.update(view(record), refresh=True)
    except KeyboardInterrupt:
        return 0  # the run goes on; only the watching stops
    return 0


def _no_logs(found: Any, record: Any, node: str | None, rank: int | None) -> Any:
    """The error for a run with no matching rank log in runs/: where the logs are when they stayed on the nodes."""
    from clusterrun.errors import UsageError

    what = " and ".join(x for x in (f"node {node}" if node else "", f"rank {rank}" if rank is not None else "") if x)
    message = f"no rank logs{' for ' + what if what else ''} in {found.path}/"
    if record.detached:
        plan = found.read_plan()
        where = "; ".join(f"{n.name}:{n.run_dir}/torchrun/" for n in plan.nodes if node is None or n.name == node)
        if where:
            message += (f"; this run was detached, so its rank logs stayed on its nodes ({where}; the node agent's "
                        "per-rank files, stdout and stderr of each): copy them with scp or rsync, or print them with "
                        "`clusterrun exec <inventory> -- cat <dir>/...`")
    return UsageError(message)


@click.command(epilog="""\b
Examples:
  clusterrun logs                      # every rank of the last run
  clusterrun logs last --rank 0 -f     # follow rank 0 while the run goes on
  clusterrun logs 0f3c --node gpu02""")
@RUN_ARG
@RUNS_DIR
@click.option("--node", help="Only this node's ranks.")
@click.option("--rank", type=int, help="Only this global rank.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends (Ctrl-C to stop).")
@click.option("--raw", is_flag=True, help="Print control characters as the ranks wrote them (by default they are "
              "escaped, colours kept; the log files are always byte-exact).")
def logs(run: str, runs_dir: Path, node: str | None, rank: int | None, follow: bool, raw: bool) -> int:
    """Print a run's rank logs, each line prefixed [node:rank] (RUN: an id, a unique part of one, or last)."""
    from clusterrun.cli.detached_cmd import refreshed
    from clusterrun.launch.console import safe
    from clusterrun.ops.tail import NoLogs, Printer, print_logs
    from clusterrun.runs import find_run

    found = find_run(runs_dir, run)
    out = sys.stdout.write if raw else (lambda text: sys.stdout.write(safe(text)))
    printer = Printer(out, sys.stdout.flush, lambda text: click.echo(text, err=True))
    try:
        return print_logs(found, node, rank, follow=follow, printer=printer,
                          refresh=lambda quiet: refreshed(found, quiet=quiet), ended=leave_page)
    except NoLogs as exc:
        raise _no_logs(found, exc.record, node, rank) from None


@click.command(epilog="""\b
Examples:
  clusterrun down                 # the last run
  clusterrun down 20261123-101500-a1b2 --grace 10""")
@RUN_ARG
@RUNS_DIR
@click.option("--grace", type=click.FloatRange(0, 600), default=protocol.GRACE, show_default=True, metavar="SECONDS",
              help="Between SIGTERM and SIGKILL on each node.")
def down(run: str, runs_dir: Path, grace: float) -> int:
    """Stop whatever is left of a run on every node (a leftover, or a run whose clusterrun was killed).

    Every process carrying the run's id is sent SIGTERM, then SIGKILL after the grace period, on
    all nodes at once; afterwards nothing of the run runs anywhere. Nodes that cannot be reached are named.
    """
    from clusterrun.cli.detached_cmd import stop_detached
    from clusterrun.ops.down import record_stopped, sweep_run
    from clusterrun.runs import find_run

    found = find_run(runs_dir, run)
    code = stop_detached(found, grace)  # a detached run: its supervisor stops it and records the end
    if code is not None:
        leave_page(found.path)
        return code
    results = sweep_run(found, grace)
    failed = 0
    for name, (pids, problem) in results.items():
        if problem:
            failed += 1
            click.echo(f"{name}: could not check: {problem}", err=True)
        else:
            click.echo(f"{name}: {'stopped ' + str(len(pids)) + ' process(es)' if pids else 'nothing left'}")
    if not failed:
        record_stopped(found)
        leave_page(found.path)
    return 1 if failed else 0

