"""`clusterrun ps`: what runs on the nodes, whoever started it (run id, user, GPUs, since)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from clusterrun.cli.sources_options import load_nodes, source_options, uses_source


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
               epilog="""\b
Examples:
  clusterrun ps cluster.yaml
  clusterrun ps --ips 10.0.0.1,10.0.0.2 --json
  clusterrun ps cluster.yaml --nodes 'gpu0[1-2]' --timeout 10

Runs of every user show through the GPU and master-port leases they hold on each node; your own
runs also by their processes. Exit code: 0 when every node answered, 1 otherwise (each node that
did not is named).""")
@source_options
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON (stdout) instead of a table.")
@click.option("--timeout", type=click.FloatRange(1, 3600), default=30.0, show_default=True, metavar="SECONDS",
              help="How long each node may take to answer.")
@click.argument("inventory", required=False, type=click.Path(dir_okay=False, path_type=Path))
def ps(inventory: Path | None, as_json: bool, timeout: float, **sources: Any) -> int:
    """Show what runs on the nodes of INVENTORY (or --ips/--hostfile/--slurm): per node and run, the run id,
    its user, the GPUs and master port it holds, and since when."""
    from clusterrun.errors import UsageError

    if inventory is None and not uses_source(sources):
        raise UsageError("missing INVENTORY: clusterrun ps cluster.yaml (or --ips/--hostfile/--slurm)")
    inv = load_nodes(inventory, **sources)
    from clusterrun.ops.ps import runs_on_nodes, since_words

    rows, problems = runs_on_nodes(inv, timeout)
    if as_json:
        import json

        click.echo(json.dumps({"runs": [r.to_dict() for r in rows], "unreachable": problems}, indent=2))
    else:
        import sys

        from rich.console import Console
        from rich.table import Table

        # Not a terminal (a log, a pipe): whole lines, never a run id cut to fit 80 columns.
        console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)
        if rows:
            table = Table(box=None)
            for title in ("node", "run", "user", "GPUs", "port", "since", "processes"):
                table.add_column(title, no_wrap=True)
            for r in rows:
                table.add_row(r.node, r.run, r.user, ",".join(map(str, r.gpus)) or "-",
                              ",".join(map(str, r.ports)) or "-", since_words(r.since),
                              "?" if r.processes is None else str(r.processes))
            console.print(table)
        answered = len(inv.nodes) - len(problems)
        console.print(f"clusterrun: {len(rows)} run(s) on {answered} of {len(inv.nodes)} node(s)"
                      + ("" if rows else ": nothing runs there"))
    for node, why in problems.items():
        click.echo(f"clusterrun: {node}: could not be asked: {why}", err=True)
    return 1 if problems else 0
