"""`clusterrun plan`: print the launch plan without running anything."""

from __future__ import annotations

from typing import Any

import click

from clusterrun.cli.job_options import JOB_CONTEXT, job_options, with_job


@click.command(
    context_settings=JOB_CONTEXT,
    epilog="""\b
Examples:
  clusterrun plan inventories/localhost.yaml examples/train_ddp.py
  clusterrun plan cluster.yaml train.py --epochs 5 --lr 0.1
  clusterrun plan cluster.yaml train.py --json | jq '.nodes[].env'
  clusterrun plan cluster.yaml -m mypkg.train --nproc-per-node 4 -e NCCL_DEBUG=INFO""",
)
@job_options
@with_job
def plan(inv: Any, plan: Any, runs_dir: Any, as_json: bool) -> int:
    """Show what `up` would run on each node: node_rank, master address, the torchrun command and the environment.

    INVENTORY is the cluster's YAML file; SCRIPT and its ARGS are what torchrun runs on
    every node (after `--`, verbatim). Nothing is started and no node is contacted. `up` executes this same plan.
    """
    from clusterrun.cli.render import plan_json, print_plan

    if as_json:
        click.echo(plan_json(plan))
    else:
        print_plan(plan)
    return 0
