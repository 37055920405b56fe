"""`clusterrun up`: run a script on every node under torchrun, supervised."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from clusterrun.cli.job_argv import JobCommand
from clusterrun.cli.job_options import JOB_CONTEXT, gpu_options, job_options, with_job
from clusterrun.cli.up_options import run_options, with_request

if TYPE_CHECKING:
    from clusterrun.inventory.models import Inventory
    from clusterrun.launch.settings import LaunchRequest
    from clusterrun.planning.plan import LaunchPlan
    from clusterrun.runs import RunDir, RunRecord
    from clusterrun.transport.early import EarlyConnections


@click.command(
    cls=JobCommand,
    context_settings=JOB_CONTEXT,
    epilog="""\b
Examples:
  clusterrun up inventories/localhost.yaml examples/train_ddp.py
  clusterrun up cluster.yaml train.py --epochs 10 --lr 0.1
  clusterrun up --dry-run cluster.yaml train.py            # print the plan only
  clusterrun up --ranks 0 -e NCCL_DEBUG=INFO cluster.yaml train.py
  clusterrun up --nproc-per-node 4 cluster.yaml -m mypkg.train
  clusterrun up --preflight full cluster.yaml train.py      # doctor's network checks first
  clusterrun up --ips 10.0.0.1,10.0.0.2 --gpus 0,1,2,3 train.py --epochs 3   # no inventory file
  clusterrun up --hostfile hostfile train.py               # DeepSpeed/MPI hostfile
  clusterrun up --devices=0,1 train.py --lr=0.01           # this machine, as torchrun/paddle do
  clusterrun up --slurm train.py                           # inside a Slurm allocation
  clusterrun up cluster.yaml --nodes 'gpu0[1-2]' train.py  # two nodes of the inventory
  clusterrun up --detach cluster.yaml train.py              # start, print the run id, return
  clusterrun up --notify https://hooks.slack.com/services/T0/B0/XX cluster.yaml train.py  # start, failure, end
  clusterrun up --on-path-loss warn cluster.yaml train.py   # a dead data path is reported, the job goes on
  clusterrun up --hang-timeout 600 cluster.yaml train.py    # 10 min without output: every rank's stack
  clusterrun up --max-restarts 3 --min-nodes 3 cluster.yaml train.py  # go on from a checkpoint, without a lost node
  clusterrun up --wait-gpus 3600 cluster.yaml train.py      # queue up to an hour for GPUs another run holds
  clusterrun up --rank-order label:switch cluster.yaml train.py  # nodes under one switch get consecutive ranks

Every rank's output is shown as [node:rank] and written to runs/<run-id>/<node>/rank<R>.log;
runs/<run-id>/status.json has per-rank exit codes and timings. Exit code: 0 when every rank
succeeds, the first failing rank's exit code otherwise, 125 when the job could not start,
124 when it ran past --timeout, 130 after Ctrl-C.""",
)
@job_options
@gpu_options
@click.option("--dry-run", is_flag=True, help="Print the plan (as `clusterrun plan` does) and run nothing.")
@run_options
@with_job
@with_request
def up(inv: Inventory, plan: LaunchPlan, runs_dir: Path, request: LaunchRequest, as_json: bool, dry_run: bool) -> int:
    """Start SCRIPT with torchrun on every node of INVENTORY (or --ips/--hostfile/--slurm) and supervise it.

    clusterrun computes each node's rank, the master address on the data network and the
    NCCL/Gloo environment (see `clusterrun plan`), starts torchrun on all nodes at once,
    streams every rank's output, and stops every node when a rank fails or on Ctrl-C
    (Ctrl-C twice kills at once). clusterrun's options come before SCRIPT; everything after
    SCRIPT goes to it exactly as typed, as with torchrun. torchrun's --nproc_per_node and
    fleetrun's --devices are understood; other launchers' flags are answered with clusterrun's
    equivalent. SCRIPT alone (no INVENTORY, --ips, --hostfile or --slurm) runs on this machine.
    """
    if dry_run:  # exactly what `up` would run, TORCHELASTIC_MAX_RESTARTS included
        from clusterrun.cli.render import plan_json, print_plan
        from clusterrun.planning.complete import with_restarts

        plan = with_restarts(inv, plan, request.restarts.max_restarts)
        click.echo(plan_json(plan)) if as_json else print_plan(plan)
        return 0
    from clusterrun.transport.early import EarlyConnections
    from clusterrun.transport.factory import open_transports

    early = EarlyConnections(lambda: open_transports(inv, plan))  # the nodes' connections open while `up` loads
    try:
        outcome, run_dir = _execute(inv, plan, runs_dir, request, early)
    finally:
        early.close()
    from clusterrun.cli.render import print_summary

    if outcome is None:
        run_id = run_dir.run_id
        click.echo(run_id)
        click.echo(f"clusterrun: detached: run {run_id} goes on, supervised on {plan.master.name}; "
                   f"`clusterrun attach {run_id}` shows it, `clusterrun logs {run_id} -f` follows its "
                   f"ranks, `clusterrun down {run_id}` stops it", err=True)
        return 0
    if as_json:
        import json

        from clusterrun.runs import RunState, read_record

        record = read_record(run_dir)  # the whole run's record (every attempt), as status.json says it
        click.echo(json.dumps((record if record.state is not RunState.unknown else outcome).to_dict(),
                              indent=2))
    print_summary(outcome, run_dir)
    return outcome.exit_code


def _execute(inv: Inventory, plan: LaunchPlan, runs_dir: Path, request: LaunchRequest,
             early: EarlyConnections) -> tuple[RunRecord | None, RunDir]:
    """The run, with its page written in its directory however it ended (a run that did not start too)."""
    from clusterrun.cli.pages import leave_page, with_doctor_page
    from clusterrun.launch.console import Console
    from clusterrun.launch.settings import Preflight
    from clusterrun.launch.up import execute

    view = request.terminal
    console = Console(ranks=view.ranks, quiet=view.quiet, raw=view.raw, fold=view.fold)
    full_check = None
    if request.preflight is Preflight.full:
        from clusterrun.doctor.gate import full_check as doctor_check

        full_check = with_doctor_page(doctor_check)
    opened: list[Path] = []  # the run's directory as execute made it (a new id after a collision)
    try:
        return execute(inv, plan, runs_dir, console, request, full_check=full_check, early=early,
                       on_attempt=leave_page, on_open=lambda d: opened.append(d.path))
    finally:  # every attempt is on the page
        for path in opened:
            leave_page(path)
