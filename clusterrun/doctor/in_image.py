"""Doctor's node checks inside the job's image: when the inventory runs the job in a container, the probe runs in
that image, started as `up` starts it (host network and IPC, memlock, the node's GPUs and RDMA devices, the
inventory's options), so torch, NCCL, /dev/shm, the memlock limit and /dev/infiniband are what the ranks will see."""

from __future__ import annotations

import os

from clusterrun.planning.container import RUNTIME_SETTINGS, build_container
from clusterrun.inventory.models import Inventory, Node


def image_command(inv: Inventory, node: Node) -> tuple[tuple[str, ...], dict[str, str]]:
    """(the container command up to its image, the runtime's settings from the inventory's env); ``((), {})``
    when the node runs its job on the host. The probe's container is labelled like a run's (``doctor-<pid>``)."""
    settings = inv.container_of(node)
    if settings is None:
        return (), {}
    plan = build_container(settings, run_id=f"doctor-{os.getpid()}", node=node.name, run_dir=None, cwd=None,
                           env={}, gpus=tuple(node.gpus), rdma=any(nic.kind.is_rdma for nic in node.nics))
    env = {k: v for k, v in {**inv.defaults.env, **node.env}.items() if k in RUNTIME_SETTINGS}
    return plan.argv(), env
