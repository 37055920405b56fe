"""`clusterrun up`: run a script on every node under torchrun, supervised."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from clusterrun.cli.job_argv import JobCommand
from clusterrun.cli.job_options import JOB_CONTEXT, gpu_options, job_options, with_job
from clusterrun.remote import protocol

if TYPE_CHECKING:
    from clusterrun.transport.early import EarlyConnections


def _parse_ranks(value: str | None) -> set[int] | None:
    if not value:
        return None
    from clusterrun.inventory.hostspec import parse_gpu_list

    return set(parse_gpu_list(value, "--ranks"))


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
@click.option("--ranks", metavar="LIST", help="Show only these global ranks' output, e.g. 0 or 0,8 (all are logged).")
@click.option("-q", "--quiet", is_flag=True, help="Show no rank output, only clusterrun's messages and the summary.")
@click.option("--raw", is_flag=True, help="Show rank output's control characters as they came (by default they are "
              "shown escaped, colours kept, so no rank can retitle, clear or take over the terminal).")
@click.option("--fold/--no-fold", default=None,
              help="Show a line that many ranks print alike once, under all their ranks ([gpu[01-64]:0-511] ...), "
              "after waiting at most half a second for its copies; --no-fold shows every rank's copy (default: fold; "
              "inventory run.fold). The rank logs always hold every line.")
@click.option("--preflight", "preflight_mode", type=click.Choice(["quick", "full", "off"]), default="quick",
              show_default=True, help="Before starting: quick = every node reaches rank 0's master port on the data "
              "network (about a second); full = doctor's network checks too; off = no check.")
@click.option("--detach", is_flag=True, help="Start the job, print its run id and return: it is supervised on rank "
              "0's node as it would be here (fail-fast, watches, --timeout, --notify, every rank's log), whatever "
              "becomes of this terminal. `clusterrun attach RUN` shows it, `clusterrun down RUN` stops it.")
@click.option("--timeout", "time_limit", type=click.FloatRange(1, 10 * 365 * 86400), metavar="SECONDS",
              help="Stop the job (exit 124) if it runs longer than this; by default it may run forever.")
@click.option("--grace", type=click.FloatRange(0, 600), default=protocol.GRACE, show_default=True, metavar="SECONDS",
              help="After a failure or Ctrl-C, how long ranks get between SIGTERM and SIGKILL.")
@click.option("--path-watch/--no-path-watch", default=None,
              help="While the job runs, every node checks its data paths (to rank 0's node and to the next node) "
              "with small UDP probes every second; a path silent for 5 s is named with its node and NIC "
              "(default: on; inventory run.path_watch).")
@click.option("--on-path-loss", type=click.Choice(["stop", "warn"]), default=None,
              help="What a dead data path does: stop the job (its ranks would only wait for NCCL's or gloo's "
              "timeout), or warn and let it run (default: stop; inventory run.on_path_loss).")
@click.option("--hang-timeout", type=click.FloatRange(1, 604800), metavar="SECONDS",
              help="When no rank has printed anything for this long, take every rank's stack (py-spy, or a "
              "faulthandler hook clusterrun installs) and print where each rank is (default: off; inventory "
              "run.hang_timeout).")
@click.option("--on-hang", type=click.Choice(["wait", "stop"]), default=None,
              help="After the stacks of a hang: wait (a reminder every --hang-timeout) or stop the job (default: "
              "wait; inventory run.on_hang).")
@click.option("--max-restarts", type=click.IntRange(0, 100), default=None, metavar="N",
              help="After a failure, stop what is left, check the nodes again and start the job again, up to N times "
              "(same run id; CLUSTERRUN_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT tell the script; default 0; "
              "inventory run.max_restarts).")
@click.option("--min-nodes", type=click.IntRange(1, 100000), default=None, metavar="M",
              help="With restarts: a node that was lost, lost its data path or fails the checks is left out of the "
              "next attempt (a spare node takes its place when the inventory has one) as long as M nodes remain "
              "(default: every node is needed; inventory run.min_nodes).")
@click.option("--restart-backoff", type=click.FloatRange(0, 3600), default=None, metavar="SECONDS",
              help="Wait before the first restart, doubling for each further one, at most 60 s (default 5; inventory "
              "run.restart_backoff).")
@click.option("--wait-gpus", type=click.FloatRange(0, None), is_flag=False, flag_value="inf", default=None,
              metavar="[SECONDS]", help="When GPUs the run needs are leased by another run, wait until they are free "
              "(checking again with a growing pause, at most 30 s), at most SECONDS (default: no limit), instead of "
              "being refused.")
@click.option("--sample-every", type=click.FloatRange(0, 3600), default=None, metavar="SECONDS",
              help="How often each node samples its NICs, RDMA ports, ranks and GPUs for the run's series "
              "(`clusterrun metrics RUN`) and the wrong-NIC verdict; 0 = off (default 1; inventory run.sample_every).")
@click.option("--notify", "notify", multiple=True, metavar="URL",
              help="POST a small JSON document (with a Slack-style `text`) to URL when the run starts, fails and "
              "ends; repeatable, added to the inventory's run.notify. A slow or dead webhook never delays the run.")
@with_job
def up(inv: Any, plan: Any, runs_dir: Any, as_json: bool, dry_run: bool, ranks: str | None, quiet: bool, raw: bool,
       fold: bool | None, preflight_mode: str, detach: bool, time_limit: float | None, grace: float,
       path_watch: bool | None, on_path_loss: str | None, hang_timeout: float | None, on_hang: str | None,
       max_restarts: int | None,
       min_nodes: int | None, restart_backoff: float | None, wait_gpus: float | None, sample_every: float | None,
       notify: tuple[str, ...]) -> int:
    """Start SCRIPT with torchrun on every node of INVENTORY (or --ips/--hostfile/--slurm) and supervise it.

    clusterrun computes each node's rank, the master address on the data network and the
    NCCL/Gloo environment (see `clusterrun plan`), starts torchrun on all nodes at once,
    streams every rank's output, and stops every node when a rank fails or on Ctrl-C
    (Ctrl-C twice kills at once). clusterrun's options come before SCRIPT; everything after
    SCRIPT goes to it exactly as typed, as with torchrun. torchrun's --nproc_per_node and
    fleetrun's --devices are understood; other launchers' flags are answered with clusterrun's
    equivalent. SCRIPT alone (no INVENTORY, --ips, --hostfile or --slurm) runs on this machine.
    """
    early = None
    if not dry_run:  # the nodes' connections open while the rest of `up` loads
        from clusterrun.transport.early import EarlyConnections
        from clusterrun.transport.factory import open_transports

        early = EarlyConnections(lambda: open_transports(inv, plan))
    try:
        return _up(inv, plan, runs_dir, early, dry_run=dry_run, as_json=as_json, ranks=ranks, quiet=quiet, raw=raw,
                   fold=fold, preflight_mode=preflight_mode, detach=detach, time_limit=time_limit, grace=grace,
                   path_watch=path_watch, on_path_loss=on_path_loss, hang_timeout=hang_timeout, on_hang=on_hang,
                   max_restarts=max_restarts, min_nodes=min_nodes, restart_backoff=restart_backoff,
                   wait_gpus=wait_gpus, sample_every=sample_every, notify=notify)
    finally:
        if early is not None:
            early.close()


def _up(inv: Any, plan: Any, runs_dir: Any, early: EarlyConnections | None, *, dry_run: bool, as_json: bool,
        ranks: str | None, quiet: bool, raw: bool, fold: bool | None, preflight_mode: str, detach: bool,
        time_limit: float | None, grace: float,
        path_watch: bool | None, on_path_loss: str | None, hang_timeout: float | None, on_hang: str | None,
        max_restarts: int | None, min_nodes: int | None, restart_backoff: float | None, wait_gpus: float | None,
        sample_every: float | None, notify: tuple[str, ...]) -> int:
    from clusterrun.cli.render import plan_json, print_plan, print_summary
    from clusterrun.launch.settings import RestartSettings
    from clusterrun.launch.up import execute
    from clusterrun.planning.complete import with_restarts

    run = inv.run
    restarts = RestartSettings(
        max_restarts=max_restarts if max_restarts is not None else run.max_restarts,
        min_nodes=min_nodes if min_nodes is not None else run.min_nodes,
        backoff=restart_backoff if restart_backoff is not None else run.restart_backoff)
    if dry_run:  # exactly what `up` would run, TORCHELASTIC_MAX_RESTARTS included
        plan = with_restarts(inv, plan, restarts.max_restarts)
        click.echo(plan_json(plan)) if as_json else print_plan(plan)
        return 0
    from clusterrun.launch.console import Console
    from clusterrun.launch.settings import SupervisorSettings

    shown = _parse_ranks(ranks)
    # Folding waits for copies only where a copy can come: more than one rank is shown.
    fold = (run.fold if fold is None else fold) and plan.world_size > 1 and (shown is None or len(shown) > 1)
    console = Console(ranks=shown, quiet=quiet, raw=raw, fold=fold)
    full_check = None
    if preflight_mode == "full":
        from clusterrun.cli.pages import with_doctor_page
        from clusterrun.doctor.gate import full_check as doctor_check

        full_check = with_doctor_page(doctor_check)
    settings = SupervisorSettings.for_run(inv.run, grace=grace, timeout=time_limit, path_watch=path_watch,
                                          on_path_loss=on_path_loss, hang_timeout=hang_timeout, on_hang=on_hang,
                                          sample_every=sample_every)
    if wait_gpus is not None:
        import dataclasses

        settings = dataclasses.replace(settings, wait_gpus=wait_gpus)
    from clusterrun.cli.pages import leave_page

    opened: list[Path] = []  # the run's directory as execute made it (a new id after a collision)
    try:
        outcome, run_dir = execute(inv, plan, runs_dir, console, settings, preflight_mode, detach=detach,
                                   full_check=full_check, notify=[*inv.run.notify, *notify], restarts=restarts,
                                   early=early, on_attempt=leave_page, on_open=lambda d: opened.append(d.path))
    finally:  # the run's page, however it ended (a run that did not start too); every attempt is on it
        for path in opened:
            leave_page(path)
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
