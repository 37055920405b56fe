"""The options of `clusterrun up` that say how the run goes, made into one :class:`LaunchRequest` (``with_request``):
supervision, restarts, the check before the start, detaching, webhooks and the terminal."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from clusterrun.launch.settings import LaunchRequest, OnHang, OnPathLoss, Preflight
from clusterrun.remote import protocol

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS = [
    click.option("--ranks", metavar="LIST", help="Show only these global ranks' output, e.g. 0 or 0,8 (all are logged)."),
    click.option("-q", "--quiet", is_flag=True, help="Show no rank output, only clusterrun's messages and the summary."),
    click.option("--raw", is_flag=True, help="Show rank output's control characters as they came (by default they are "
                 "shown escaped, colours kept, so no rank can retitle, clear or take over the terminal)."),
    click.option("--fold/--no-fold", default=None,
                 help="Show a line that many ranks print alike once, under all their ranks ([gpu[01-64]:0-511] ...), "
                 "after waiting at most half a second for its copies; --no-fold shows every rank's copy (default: fold; "
                 "inventory run.fold). The rank logs always hold every line."),
    click.option("--preflight", type=click.Choice([m.value for m in Preflight]), default=Preflight.quick.value,
                 show_default=True, help="Before starting: quick = every node reaches rank 0's master port on the data "
                 "network (about a second); full = doctor's network checks too; off = no check."),
    click.option("--detach", is_flag=True, help="Start the job, print its run id and return: it is supervised on rank "
                 "0's node as it would be here (fail-fast, watches, --timeout, --notify, every rank's log), whatever "
                 "becomes of this terminal. `clusterrun attach RUN` shows it, `clusterrun down RUN` stops it."),
    click.option("--timeout", "time_limit", type=click.FloatRange(1, 10 * 365 * 86400), metavar="SECONDS",
                 help="Stop the job (exit 124) if it runs longer than this; by default it may run forever."),
    click.option("--grace", type=click.FloatRange(0, 600), default=protocol.GRACE, show_default=True, metavar="SECONDS",
                 help="After a failure or Ctrl-C, how long ranks get between SIGTERM and SIGKILL."),
    click.option("--path-watch/--no-path-watch", default=None,
                 help="While the job runs, every node checks its data paths (to rank 0's node and to the next node) "
                 "with small UDP probes every second; a path silent for 5 s is named with its node and NIC "
                 "(default: on; inventory run.path_watch)."),
    click.option("--on-path-loss", type=click.Choice([m.value for m in OnPathLoss]), default=None,
                 help="What a dead data path does: stop the job (its ranks would only wait for NCCL's or gloo's "
                 "timeout), or warn and let it run (default: stop; inventory run.on_path_loss)."),
    click.option("--hang-timeout", type=click.FloatRange(1, 604800), metavar="SECONDS",
                 help="When no rank has printed anything for this long, take every rank's stack (py-spy, or a "
                 "faulthandler hook clusterrun installs) and print where each rank is (default: off; inventory "
                 "run.hang_timeout)."),
    click.option("--on-hang", type=click.Choice([m.value for m in OnHang]), default=None,
                 help="After the stacks of a hang: wait (a reminder every --hang-timeout) or stop the job (default: "
                 "wait; inventory run.on_hang)."),
    click.option("--max-restarts", type=click.IntRange(0, 100), default=None, metavar="N",
                 help="After a failure, stop what is left, check the nodes again and start the job again, up to N times "
                 "(same run id; CLUSTERRUN_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT tell the script; default 0; "
                 "inventory run.max_restarts)."),
    click.option("--min-nodes", type=click.IntRange(1, 100000), default=None, metavar="M",
                 help="With restarts: a node that was lost, lost its data path or fails the checks is left out of the "
                 "next attempt (a spare node takes its place when the inventory has one) as long as M nodes remain "
                 "(default: every node is needed; inventory run.min_nodes)."),
    click.option("--restart-backoff", type=click.FloatRange(0, 3600), default=None, metavar="SECONDS",
                 help="Wait before the first restart, doubling for each further one, at most 60 s (default 5; inventory "
                 "run.restart_backoff)."),
    click.option("--wait-gpus", type=click.FloatRange(0, None), is_flag=False, flag_value="inf", default=None,
                 metavar="[SECONDS]", help="When GPUs the run needs are leased by another run, wait until they are free "
                 "(checking again with a growing pause, at most 30 s), at most SECONDS (default: no limit), instead of "
                 "being refused."),
    click.option("--sample-every", type=click.FloatRange(0, 3600), default=None, metavar="SECONDS",
                 help="How often each node samples its NICs, RDMA ports, ranks and GPUs for the run's series "
                 "(`clusterrun metrics RUN`) and the wrong-NIC verdict; 0 = off (default 1; inventory run.sample_every)."),
    click.option("--notify", "notify", multiple=True, metavar="URL",
                 help="POST a small JSON document (with a Slack-style `text`) to URL when the run starts, fails and "
                 "ends; repeatable, added to the inventory's run.notify. A slow or dead webhook never delays the run."),
]


def run_options(func: F) -> F:
    """The options of `up` that make its :class:`LaunchRequest`."""
    for option in reversed(_OPTIONS):
        func = option(func)
    return func


def ranks_flag(value: str | None) -> set[int] | None:
    """``--ranks 0,8`` as a set of global ranks (None: every rank)."""
    if not value:
        return None
    from clusterrun.inventory.hostspec import parse_gpu_list

    return set(parse_gpu_list(value, "--ranks"))


def with_request(func: F) -> F:
    """Decorator, under :func:`clusterrun.cli.job_options.with_job`: the options of :func:`run_options` become one
    ``request`` (:meth:`LaunchRequest.from_flags` over the inventory's ``run`` settings)."""

    @functools.wraps(func)
    def wrapper(*, inv: Any, plan: Any, runs_dir: Any, as_json: bool, dry_run: bool, ranks: str | None,
                **flags: Any) -> Any:
        request = LaunchRequest.from_flags(inv.run, world_size=plan.world_size, ranks=ranks_flag(ranks), **flags)
        return func(inv=inv, plan=plan, runs_dir=runs_dir, request=request, as_json=as_json, dry_run=dry_run)

    return wrapper  # type: ignore[return-value]
