"""Options shared by `plan` and `up`: which inventory, which script, how to run it."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

#: clusterrun's own options may come before or after SCRIPT; every other argument goes to the script in
#: order, and everything after ``--`` goes to it verbatim (for a script option that clashes with ours).
JOB_CONTEXT = {"ignore_unknown_options": True, "allow_interspersed_args": True,
               "help_option_names": ["-h", "--help"], "max_content_width": 100}


def job_options(func: F) -> F:
    """INVENTORY SCRIPT [ARGS]... plus the options that shape the plan."""
    options = [
        click.argument("inventory", type=click.Path(dir_okay=False, path_type=Path)),
        click.argument("script"),
        click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[ARGS]..."),
        click.option("-m", "--module", is_flag=True,
                     help="SCRIPT is a Python module name (python -m SCRIPT), not a file."),
        click.option("--nproc-per-node", type=click.IntRange(1, 1024), metavar="N",
                     help="Processes per node (default: the node's GPU count, or 1 without GPUs)."),
        click.option("--master-port", type=click.IntRange(1, 65535), metavar="PORT",
                     help="Rendezvous port on the master (default: network.master_port, 29500)."),
        click.option("-e", "--env", "env", multiple=True, metavar="KEY=VALUE",
                     help="Set an environment variable on every node (repeatable; wins over the inventory)."),
        click.option("--sync", "sync_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
                     metavar="DIR", help="Copy DIR (your code: modules next to SCRIPT, configs) to every node's run "
                     "directory; unchanged content is not copied again. Not needed with shared_fs."),
        click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"),
                     show_default=True, help="Where run directories (plan, logs, status) are written."),
        click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON instead of tables."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_job(inventory: Path, script: str, script_args: tuple[str, ...], *, module: bool,
              nproc_per_node: int | None, master_port: int | None, env: tuple[str, ...],
              runs_dir: Path, sync_dir: Path | None = None) -> tuple[Any, Any]:
    """Load the inventory and make the plan: returns (inventory, LaunchPlan). Raises ClusterrunError."""
    from clusterrun.errors import UsageError
    from clusterrun.inventory.hostspec import parse_env_assignments
    from clusterrun.inventory.models import Transport
    from clusterrun.inventory.yaml_source import load_inventory
    from clusterrun.plan import JobSpec, build_plan
    from clusterrun.runs import new_run_id

    inv = load_inventory(inventory)
    env_vars = parse_env_assignments(list(env), "--env")
    needs_local_file = not module and (
        any(inv.transport_of(n) is Transport.local for n in inv.nodes) or not inv.defaults.shared_fs
    )
    if needs_local_file and not Path(script).is_file():
        hint = " (use -m for a module name)" if "/" not in script and not script.endswith(".py") else ""
        raise UsageError(f"SCRIPT: {script}: no such file{hint}")
    job = JobSpec(
        script=script, run_id=new_run_id(), args=tuple(script_args), module=module,
        nproc_per_node=nproc_per_node, master_port=master_port, env=tuple(env_vars.items()),
        local_runs_dir=str(runs_dir.resolve()), local_cwd=os.getcwd(),
        sync_dir=str(sync_dir.resolve()) if sync_dir else None,
    )
    return inv, build_plan(inv, job)


def with_job(func: F) -> F:
    """Decorator: turns the job options into ``inv, plan`` keyword arguments."""

    @functools.wraps(func)
    def wrapper(inventory: Path, script: str, script_args: tuple[str, ...], module: bool,
                nproc_per_node: int | None, master_port: int | None, env: tuple[str, ...],
                runs_dir: Path, sync_dir: Path | None, **rest: Any) -> Any:
        inv, plan = build_job(inventory, script, script_args, module=module, nproc_per_node=nproc_per_node,
                              master_port=master_port, env=env, runs_dir=runs_dir, sync_dir=sync_dir)
        return func(inv=inv, plan=plan, runs_dir=runs_dir, **rest)

    return wrapper  # type: ignore[return-value]
