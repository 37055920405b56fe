"""Options shared by `plan` and `up`: which inventory, which script, how to run it."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from clusterrun.cli.sources_options import load_nodes, source_options, uses_source

if TYPE_CHECKING:  # loaded when a command runs, not when the CLI starts
    from clusterrun.inventory.models import Inventory
    from clusterrun.planning.plan import LaunchPlan

F = TypeVar("F", bound=Callable[..., Any])

#: clusterrun's options come before SCRIPT; everything after SCRIPT goes to the script as typed (commands use
#: :class:`clusterrun.cli.job_argv.JobCommand`).
JOB_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def job_options(func: F) -> F:
    """[INVENTORY] SCRIPT [ARGS]... (INVENTORY unless --ips/--hostfile/--slurm) plus the options of the plan."""
    options = [
        click.argument("targets", nargs=-1, type=click.UNPROCESSED, metavar="[INVENTORY] SCRIPT [ARGS]..."),
        click.option("-m", "--module", is_flag=True,
                     help="SCRIPT is a Python module name (python -m SCRIPT), not a file."),
        click.option("--nproc-per-node", type=click.IntRange(1, 1024), metavar="N",
                     help="Processes per node (default: the node's GPU count, or 1 without GPUs)."),
        click.option("--master-port", type=click.IntRange(1, 65535), metavar="PORT",
                     help="Rendezvous port on the master (default: network.master_port, else 29500 or, when "
                     "another run holds it, the next port free on the master)."),
        click.option("--rank-order", metavar="inventory|label:KEY", help="Node ranks in inventory order, or nodes "
                     "sharing a KEY=VALUE label (switch=s1, rack=r2) on consecutive ranks (default: "
                     "network.rank_order, inventory)."),
        click.option("-e", "--env", "env", multiple=True, metavar="KEY=VALUE",
                     help="Set an environment variable on every node (repeatable; wins over the inventory)."),
        click.option("--env-forward", multiple=True, metavar="PATTERN",
                     help="Forward the local variables matching PATTERN (e.g. 'WANDB_*') to every node "
                          "(repeatable; --env wins over them)."),
        click.option("--sync", "sync_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
                     metavar="DIR", help="Copy DIR (your code: modules next to SCRIPT, configs) to every node's run "
                     "directory; unchanged content is not copied again. Not needed with shared_fs."),
        click.option("--image", metavar="IMAGE", help="Run the job inside this container image on every node "
                     "(wins over the inventory's container.image; see docs/containers.md)."),
        click.option("--container-runtime", type=click.Choice(["docker", "podman", "apptainer"]),
                     help="The container runtime on the nodes (default: container.runtime, else docker)."),
        click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"),
                     show_default=True, help="Where run directories (plan, logs, status) are written."),
        click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON instead of tables."),
    ]
    for option in reversed(options):
        func = option(func)
    return source_options(func)


def gpu_options(func: F) -> F:
    """How the nodes' GPUs are taken and the ranks bound (`plan --probe` and `up`, which read the nodes' GPUs)."""
    options = [
        click.option("--cpu-bind", type=click.Choice(["numa", "none"]), default=None,
                     help="numa: each rank runs on the CPUs and memory node of its GPU's NUMA node, as nvidia-smi "
                     "topo -m gives them; none: no binding (default: numa; inventory run.cpu_bind)."),
        click.option("--allow-busy-gpus", is_flag=True,
                     help="Use listed GPUs even when another process uses them (refused by default: one busy GPU "
                     "slows every rank of the job), and busy ones when too few are idle."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def split_targets(targets: tuple[str, ...], sources: dict[str, Any],
                  this_machine: bool = False) -> tuple[Path | None, str, tuple[str, ...]]:
    """(INVENTORY or None, SCRIPT, ARGS) from the positional arguments. ``this_machine``: the command line names
    no nodes and SCRIPT comes first (:func:`clusterrun.cli.job_argv.names_script`); ``sources["local"]`` is then set,
    and the job runs on this machine."""
    from clusterrun.errors import UsageError

    targets = tuple(targets)
    if this_machine and targets and not uses_source(sources):
        sources["local"] = True
        return None, targets[0], targets[1:]
    # os.path.isfile, unlike Path.is_file, is False for any value no file can have (too long, a NUL).
    if sources.get("slurm") and (sources["slurm"].endswith(".py") or os.path.isfile(sources["slurm"])):
        # `--slurm train.py`: the bare flag took the script as its value.
        targets, sources["slurm"] = (sources["slurm"], *targets), ""
    if uses_source(sources):
        if not targets:
            raise UsageError("missing SCRIPT: clusterrun up --ips HOSTS [options] SCRIPT [ARGS]...")
        return None, targets[0], targets[1:]
    if len(targets) < 2:
        what = "INVENTORY and SCRIPT" if not targets else "SCRIPT"
        raise UsageError(f"missing {what}: give an inventory file and a script (clusterrun up cluster.yaml train.py), "
                         "the nodes with --ips/--hostfile/--slurm, or a script alone to run on this machine "
                         "(clusterrun up train.py)")
    return Path(targets[0]), targets[1], targets[2:]


def forwarded_env(patterns: tuple[str, ...], environ: dict[str, str] | None = None) -> list[str]:
    """``KEY=VALUE`` for every local variable matching one of ``patterns`` (fnmatch), sorted."""
    import fnmatch

    environ = dict(os.environ) if environ is None else environ
    valid = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a shell may hold odd names; they cannot be forwarded
    return [f"{k}={environ[k]}" for k in sorted(environ)
            if valid.fullmatch(k) and any(fnmatch.fnmatchcase(k, p) for p in patterns)]


def build_job(inventory: Path | None, script: str, script_args: tuple[str, ...], *, module: bool,
              nproc_per_node: int | None, master_port: int | None, env: tuple[str, ...],
              runs_dir: Path, sync_dir: Path | None = None, env_forward: tuple[str, ...] = (),
              sources: dict[str, Any] | None = None, rank_order: str | None = None, cpu_bind: str | None = None,
              allow_busy_gpus: bool = False, image: str | None = None,
              container_runtime: str | None = None) -> tuple[Inventory, LaunchPlan]:
    """Load the nodes and make the plan. Raises ClusterrunError."""
    from clusterrun.errors import UsageError
    from clusterrun.inventory.hostspec import parse_env_assignments
    from clusterrun.inventory.models import Transport
    from clusterrun.planning.plan import JobSpec, build_plan
    from clusterrun.runs import new_run_id

    inv = load_nodes(inventory, nproc_per_node=nproc_per_node, **(sources or {}))
    if image or container_runtime:
        from clusterrun.cli.container_options import with_container

        inv = with_container(inv, image, container_runtime)
    # --env wins over what --env-forward brings along (both may name the same variable).
    env_vars = {**_env_values(parse_env_assignments(forwarded_env(env_forward), "--env-forward"), "--env-forward"),
                **_env_values(parse_env_assignments(list(env), "--env"), "--env")}
    needs_local_file = not module and (
        any(inv.transport_of(n) is Transport.local for n in inv.nodes) or not inv.defaults.shared_fs
    )
    if needs_local_file and not os.path.isfile(script):
        hint = " (use -m for a module name)" if "/" not in script and not script.endswith(".py") else ""
        raise UsageError(f"SCRIPT: {script}: no such file{hint}")
    if master_port is None and _local_only(inv) and "master_port" not in inv.network.model_fields_set:
        # One machine and no port asked for: take a free one, as torchrun --standalone does, so that two
        # runs on the same machine do not collide on 29500.
        master_port = _free_port()
    job = JobSpec(
        script=script, run_id=new_run_id(), args=tuple(script_args), module=module,
        nproc_per_node=nproc_per_node, master_port=master_port, env=tuple(env_vars.items()),
        local_runs_dir=str(runs_dir.resolve()), local_cwd=os.getcwd(),
        sync_dir=str(sync_dir.resolve()) if sync_dir else None, rank_order=_rank_order(rank_order),
        cpu_bind=cpu_bind or inv.run.cpu_bind, allow_busy_gpus=allow_busy_gpus,
    )
    return inv, build_plan(inv, job)


def _rank_order(value: str | None) -> str | None:
    from clusterrun.errors import UsageError
    from clusterrun.inventory.types import check_rank_order

    try:
        return None if value is None else check_rank_order(value)
    except ValueError as exc:
        raise UsageError(f"--rank-order: {exc}") from None


def _env_values(env: dict[str, str], flag: str) -> dict[str, str]:
    """``env`` as given, or UsageError naming ``flag`` for a value the inventory would refuse (a control character)."""
    from clusterrun.errors import UsageError
    from clusterrun.inventory.types import control_character_problem

    for name, value in env.items():
        problem = control_character_problem(value, line_breaks=True)
        if problem:
            raise UsageError(f"{flag} {name}: the value {problem}")
    return env


def _local_only(inv: Any) -> bool:
    from clusterrun.inventory.models import Transport

    return all(inv.transport_of(n) is Transport.local for n in inv.nodes)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def with_job(func: F) -> F:
    """Decorator: turns the job and source options into ``inv, plan`` keyword arguments."""

    @functools.wraps(func)
    def wrapper(targets: tuple[str, ...], module: bool, nproc_per_node: int | None, master_port: int | None,
                rank_order: str | None, env: tuple[str, ...], env_forward: tuple[str, ...], runs_dir: Path, sync_dir: Path | None,
                ips: str | None, hostfile: Path | None, slurm: str | None, gpus: str | None, ssh_user: str | None,
                ssh_config: Path | None, node_python: str | None, data_nic: str | None, node_pattern: str | None,
                image: str | None, container_runtime: str | None, **rest: Any) -> Any:
        sources = {"ips": ips, "hostfile": hostfile, "slurm": slurm, "gpus": gpus, "ssh_user": ssh_user,
                   "ssh_config": ssh_config, "node_python": node_python, "data_nic": data_nic,
                   "node_pattern": node_pattern}
        from clusterrun.cli.job_argv import LOCAL_KEY

        ctx = click.get_current_context(silent=True)
        this_machine = bool(ctx is not None and ctx.meta.get(LOCAL_KEY))
        inventory, script, script_args = split_targets(targets, sources, this_machine)
        cpu_bind, allow_busy_gpus = rest.pop("cpu_bind", None), rest.pop("allow_busy_gpus", False)
        inv, plan = build_job(inventory, script, script_args, module=module, nproc_per_node=nproc_per_node,
                              master_port=master_port, env=env, runs_dir=runs_dir, sync_dir=sync_dir,
                              env_forward=env_forward, sources=sources, rank_order=rank_order, cpu_bind=cpu_bind,
                              allow_busy_gpus=allow_busy_gpus, image=image, container_runtime=container_runtime)
        return func(inv=inv, plan=plan, runs_dir=runs_dir, **rest)

    return wrapper  # type: ignore[return-value]
