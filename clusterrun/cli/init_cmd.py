"""`clusterrun init`: write an inventory by probing the nodes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from clusterrun.cli.sources_options import load_nodes, source_options, uses_source


@click.command(epilog="""\b
Examples:
  clusterrun init --ips 10.0.0.1,10.0.0.2 -o cluster.yaml
  clusterrun init --slurm --ssh-user alice -o cluster.yaml
  clusterrun init --hostfile hostfile --python /opt/conda/bin/python -o cluster.yaml --force

The nodes are probed over SSH (NICs, addresses, speeds, InfiniBand/RoCE ports, GPUs); the
data network is the one `up` would choose. Without -o the inventory is printed.""")
@source_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write the inventory here (default: print it).")
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
def init(output: Path | None, force: bool, **sources: Any) -> int:
    """Write a commented inventory for the nodes of --ips/--hostfile/--slurm, from what they really have."""
    from clusterrun.errors import UsageError

    if not uses_source(sources):
        raise UsageError("init needs the nodes: --ips HOSTS, --hostfile FILE or --slurm [NODELIST]")
    if output is not None and output.exists() and not force:
        raise UsageError(f"-o {output}: the file exists; nothing was written (add --force to replace it)")
    inv = load_nodes(None, **sources)
    from clusterrun.ops.init import inventory_text

    click.echo(f"clusterrun: probing {len(inv.nodes)} node(s)...", err=True)
    text = inventory_text(inv, "clusterrun " + " ".join(sys.argv[1:]), str(output or "<init>"))
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        click.echo(f"clusterrun: wrote {output} ({len(inv.nodes)} node(s)); check it with `clusterrun check {output}`",
                   err=True)
    return 0
