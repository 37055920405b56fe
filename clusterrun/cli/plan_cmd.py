"""`clusterrun plan`: print the launch plan without running anything."""

from __future__ import annotations

from typing import Any

import click

from clusterrun.cli.job_argv import JobCommand
from clusterrun.cli.job_options import JOB_CONTEXT, gpu_options, job_options, with_job


@click.command(
    cls=JobCommand,
    context_settings=JOB_CONTEXT,
    epilog="""\b
Examples:
  clusterrun plan inventories/localhost.yaml examples/train_ddp.py
  clusterrun plan cluster.yaml train.py --epochs 5 --lr 0.1
  clusterrun plan --json cluster.yaml train.py | jq '.nodes[].env'
  clusterrun plan --probe cluster.yaml train.py            # with the NICs the nodes really have
  clusterrun plan --json --ips 10.0.0.1,10.0.0.2 --gpus 0-7 train.py   # what a one-liner means
  clusterrun plan --nproc-per-node 4 -e NCCL_DEBUG=INFO cluster.yaml -m mypkg.train""",
)
@job_options
@gpu_options
@click.option("--probe", is_flag=True, help="Connect to the nodes and complete the plan with their NICs and GPUs "
              "(what `up` does); values that came from the nodes are marked.")
@with_job
def plan(inv: Any, plan: Any, runs_dir: Any, as_json: bool, probe: bool) -> int:
    """Show what `up` would run on each node: node_rank, master address, the torchrun command and the environment.

    INVENTORY is the cluster's YAML file; SCRIPT and its ARGS are what torchrun runs on
    every node (everything after SCRIPT is the script's, as typed). Nothing is started and, without --probe, no node is contacted: the plan
    is exactly what the inventory says. `up` completes it with the nodes' NICs (as --probe shows) and runs it.
    """
    from clusterrun.cli.render import plan_json, print_plan

    if probe:  # the nodes' NICs (one node's ranks talk over loopback) and the GPUs each one sees
        from clusterrun.agents.gather import gather
        from clusterrun.planning.complete import plan_with_facts
        from clusterrun.transport.factory import open_transports

        transports = open_transports(inv, plan)
        try:
            inv, plan = plan_with_facts(inv, plan, gather(plan, transports))
        finally:
            for transport in transports.values():
                transport.close()
    if as_json:
        click.echo(plan_json(plan))
    else:
        print_plan(plan)
    return 0
