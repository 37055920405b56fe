"""`clusterrun check`: validate an inventory without touching any node."""

from __future__ import annotations

from pathlib import Path

import click


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="""\b
Examples:
  clusterrun check cluster.yaml
  clusterrun check inventories/*.yaml""",
)
@click.argument("inventories", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
def check(inventories: tuple[Path, ...]) -> int:
    """Validate INVENTORY files: every problem is reported as file:line:column with what to do.

    Also resolves the data network, so a subnet that some node has no NIC in is caught here.
    Exits 2 when any file has a problem. No node is contacted.
    """
    from clusterrun.errors import ClusterrunError
    from clusterrun.inventory.yaml_source import load_inventory
    from clusterrun.planning.network import resolve_data_network

    failed = 0
    for path in inventories:
        try:
            inv = load_inventory(path)
            data = resolve_data_network(inv)
        except ClusterrunError as exc:
            failed += 1
            click.echo(str(exc), err=True)
            continue
        click.echo(f"{path}: ok: {len(inv.nodes)} node(s), data network {data.description}")
        for warning in data.warnings:
            click.echo(f"{path}: warning: {warning}")
    return 2 if failed else 0
