"""The node agent's specs, built here and nowhere else: one function per mode.

Each returns the spec filled by its :class:`clusterrun.remote.protocol.Spec` (so a key clusterrun does not set
gets the same default the node would apply, and a wrong key fails here, in clusterrun, not on a node).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from clusterrun import remote
from clusterrun.planning.planfile import CPU_BIND_VAR, NodePlan
from clusterrun.remote import protocol
from clusterrun.remote.warm import MODULE as TORCHRUN

Spec = dict[str, Any]
#: ``0`` in clusterrun's environment: every node's torchrun starts at ``go``, not at the ready check.
WARM_VAR = "CLUSTERRUN_WARM_TORCHRUN"


def container_spec(node: NodePlan) -> Spec | None:
    """The node's container command in the parts the agent takes (``protocol.CONTAINER``), or None."""
    c = node.container
    if c is None:
        return None
    return protocol.CONTAINER.fill({"runtime": c.runtime.value, "image": c.image, "head": list(c.head),
                                    "options": list(c.options), "labels": dict(c.labels), "env": dict(c.env),
                                    "mounts": list(c.mounts), "pull": c.pull})


def run_spec(node: NodePlan, run_id: str, *, grace: float, heartbeat_timeout: float,
             stage: Sequence[Sequence[str]] | None = None, detached: bool = False, script_args: int = 0,
             stacks: bool = False, flight: bool = False, load_every: float = 0.0,
             watch_interval: float | None = None,
             watch_dead_after: float = protocol.WATCH_DEAD_AFTER, sample_every: float = 0.0) -> Spec:
    """``run`` (``go`` after ``prepare``): ``node``'s part of the job.

    ``script_args``: how many of the argv's last items are the script's own arguments (passed exactly as
    typed, never expanded); ``stacks``: the workers' stack hook (``flight``: with torch's flight recorder);
    ``load_every``: seconds between CPU reports (0: none); ``watch_interval``: the data-path watch on the node's
    data address (None: no watch); ``sample_every``: seconds between the node's samples (0: none).
    """
    binds = CPU_BIND_VAR in node.env_dict()
    watch = None
    if watch_interval is not None:
        watch = {"address": node.data_address, "nic": node.data_nic, "interval": watch_interval,
                 "dead_after": watch_dead_after}
    return protocol.RUN.fill({
        "detached": detached,
        "stage": [list(item) for item in stage or ()],
        "run_id": run_id,
        "node": node.name,
        "rank_offset": node.rank_offset,
        "argv": list(node.argv),
        "script_args": script_args,
        "env": node.env_dict(),
        "cwd": node.cwd,
        "run_dir": node.run_dir,
        "grace": grace,
        "heartbeat_timeout": heartbeat_timeout,
        # The workers' hook: stacks (hang diagnosis, restarts), and the CPU binding of each rank.
        "stacks": {"hook": remote.source("stackhook"), "flight": flight} if stacks or binds else None,
        "load_every": load_every,
        "sample_every": sample_every,
        "watch": watch,
        "gpus": list(node.gpus),
        "container": container_spec(node),
    })


def warm_spec(node: NodePlan) -> Spec | None:
    """The node's torchrun to start at the check (remote/warm.py), or None: in a container, for a job that is not
    ``python -m torch.distributed.run``, or where ``CLUSTERRUN_WARM_TORCHRUN=0``."""
    if node.container is not None or os.environ.get(WARM_VAR, "1") == "0":
        return None
    if list(node.argv[:3]) != [node.python, "-m", TORCHRUN]:
        return None
    return protocol.WARM.fill({"python": node.python, "env": node.env_dict(), "cwd": node.cwd})


def check_spec(run_dir: str, *, cache: str, hashes: Sequence[str], port: int | None,
               idle: float = protocol.IDLE, choose_port: bool = False, run_id: str = "",
               node: NodePlan | None = None, warm: bool = False) -> Spec:
    """``check`` (before ``go``): the ready check of a node whose run directory is ``run_dir``; on the master,
    ``port`` to lease and prove free, or ``choose_port`` to lease a free one (the user gave none). ``node``: the
    node checked (its container's image is checked too); ``warm``: its torchrun starts at the check, importing
    torch while the launch goes on (see :func:`warm_spec`)."""
    extra = {} if node is None or node.container is None else {
        "container": container_spec(node), "python": node.python, "env": node.env_dict()}
    if warm and node is not None:
        extra["warm"] = warm_spec(node)
    return protocol.CHECK.fill({"run_dir": run_dir, "cache": cache, "hashes": sorted(set(hashes)), "port": port,
                                "idle": idle, "choose_port": choose_port, "run_id": run_id,
                                "node": node.name if node is not None else "", **extra})


def exec_spec(command: str, timeout: float | None) -> Spec:
    """``exec``: ``command`` under ``sh -c``, stopped after ``timeout`` seconds (None: never)."""
    return protocol.EXEC.fill({"command": command, "timeout": float(timeout or 0)})


def collect_spec(*, run_id: str, node: str, run_dir: str, rank_offset: int, offsets: Mapping[str, int],
                 sweep: bool, grace: float, max_bytes: int, partial: bool, container: Spec | None = None) -> Spec:
    """``collect``: stop what is left (``sweep``) or say whether it runs, then the rank log bytes past ``offsets``."""
    return protocol.COLLECT.fill({"run_id": run_id, "node": node, "grace": float(grace), "run_dir": run_dir,
                                  "sweep": sweep, "rank_offset": rank_offset, "max_bytes": max_bytes,
                                  "skip": dict(offsets), "partial": partial, "container": container})


def sweep_spec(run_id: str, node: str, grace: float, container: Spec | None = None) -> Spec:
    """``sweep``: stop every process of the run on ``node`` (and remove its containers there, by label)."""
    return protocol.SWEEP.fill({"run_id": run_id, "node": node, "grace": float(grace), "container": container})


def ps_spec(run_id: str, node: str, container: Spec | None = None) -> Spec:
    """``ps``: list the processes of the run on ``node``."""
    return protocol.PS.fill({"run_id": run_id, "node": node, "container": container})


def mirror_spec(run_id: str, node: str, folder: str, have: Mapping[str, Any], stop: str | None = None) -> Spec:
    """``mirror``: the record of a detached run in ``folder`` on its supervisor's node (``node``: the supervisor's
    marker), its log files past what ``have`` says this machine holds, its other files unless ``have`` holds their
    digest; ``stop``: who asks the run to stop."""
    return protocol.MIRROR.fill({"run_id": run_id, "node": node, "dir": folder, "have": dict(have), "stop": stop})
