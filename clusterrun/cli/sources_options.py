"""Where the nodes come from: an INVENTORY file, or --ips / --hostfile / --slurm, and --nodes to pick some.

Shared by `up`, `plan` and `doctor`. Imports nothing heavy until a command runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

SOURCE_FLAGS = ("ips", "hostfile", "slurm")
# --transport is kept in the click context rather than passed as a parameter: only load_nodes reads it, and the
# commands hand their other source flags on by name.
_TRANSPORT_KEY = "clusterrun.transport"


def _remember_transport(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    ctx.meta[_TRANSPORT_KEY] = value
    return value


def source_options(func: F) -> F:
    options = [
        click.option("--ips", metavar="HOSTS", help="Nodes without an inventory: 10.0.0.1,10.0.0.2 (host or "
                     "host:port with port 22 or from 1024, names or addresses); the first is node_rank 0."),
        click.option("--hostfile", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
                     help="Nodes from a DeepSpeed/MPI hostfile (`worker-1 slots=4`); slots sets processes per node."),
        click.option("--slurm", is_flag=False, flag_value="", default=None, metavar="[NODELIST]",
                     help="Nodes from a Slurm host list (gpu[01-04]); alone, from SLURM_JOB_NODELIST."),
        click.option("--gpus", metavar="LIST", help="With --ips/--hostfile/--slurm (or SCRIPT alone: this "
                     "machine): GPU indices on every node, e.g. 0,1,2,3 or 0-7 (default: every GPU each node sees, "
                     "one process each)."),
        click.option("--ssh-user", metavar="USER", help="With --ips/--hostfile/--slurm: the SSH user."),
        click.option("--ssh-config", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="FILE",
                     help="With --ips/--hostfile/--slurm: an ssh_config to read instead of ~/.ssh/config."),
        click.option("--python", "node_python", metavar="PATH", help="With --ips/--hostfile/--slurm: the python on "
                     "the nodes (default: the interpreter clusterrun runs under, as DeepSpeed does); torchrun is run with it."),
        click.option("--data-nic", metavar="NAME|CIDR", help="With --ips/--hostfile/--slurm: the data network "
                     "(default: found on the nodes)."),
        click.option("--transport", type=click.Choice(["ssh", "srun"]), expose_value=False,
                     callback=_remember_transport, help="With --ips/--hostfile/--slurm: how to reach the nodes "
                     "(default: srun for --slurm inside a Slurm allocation, else ssh)."),
        click.option("--nodes", "node_pattern", metavar="PATTERN", help="Only these nodes: a name glob (gpu*), a "
                     "Slurm host list (gpu0[1-2]) or label=VALUE; comma-separated terms add up."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def uses_source(values: dict[str, Any]) -> bool:
    return any(values.get(k) is not None for k in SOURCE_FLAGS)


def load_nodes(inventory: Path | None, *, ips: str | None = None, hostfile: Path | None = None,
               slurm: str | None = None, gpus: str | None = None, ssh_user: str | None = None,
               ssh_config: Path | None = None,
               node_python: str | None = None, data_nic: str | None = None, node_pattern: str | None = None,
               nproc_per_node: int | None = None, transport: str | None = None, local: bool = False) -> Any:
    """The validated Inventory for whichever source was given (``local``: this machine alone); ``transport``
    defaults to the command's --transport. Raises ClusterrunError."""
    from clusterrun.inventory.sources import HostSource, load_cluster

    if transport is None:
        ctx = click.get_current_context(silent=True)
        transport = ctx.meta.get(_TRANSPORT_KEY) if ctx is not None else None
    return load_cluster(HostSource(inventory=inventory, ips=ips, hostfile=hostfile, slurm=slurm, gpus=gpus,
                                   nproc_per_node=nproc_per_node, ssh_user=ssh_user, ssh_config=ssh_config, python=node_python,
                                   data_nic=data_nic, nodes=node_pattern, transport=transport,
                                   local=local))
