"""`clusterrun schema`: the inventory's JSON Schema."""

from __future__ import annotations

import json

import click


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="""\b
Examples:
  clusterrun schema > inventory.schema.json
  # then, first line of your inventory, for YAML editors (yaml-language-server):
  # yaml-language-server: $schema=./inventory.schema.json""",
)
def schema() -> None:
    """Print the JSON Schema of the inventory file, so editors can complete and check it."""
    from clusterrun.inventory.models import inventory_json_schema

    click.echo(json.dumps(inventory_json_schema(), indent=2))
