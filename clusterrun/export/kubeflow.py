"""The job as Kubeflow YAML: a PyTorchJob (kubeflow.org/v1) or a TrainJob (trainer.kubeflow.org/v1alpha1).

Kubernetes places the pods, so the node list, the ranks and the master's address are the operator's: it gives
torchrun ``PET_NNODES``, ``PET_NODE_RANK`` and ``PET_NPROC_PER_NODE`` (and the master: ``MASTER_ADDR``/``MASTER_PORT``
for a PyTorchJob, passed on to torchrun; ``PET_MASTER_ADDR``/``PET_MASTER_PORT`` for a TrainJob). The document carries
the image, torchrun with the script and its arguments, the node count, the processes and GPUs per node, and the
environment that names no node-local device and that clusterrun did not derive from the inventory's hosts. What
cannot travel (each node's NIC names, GPU indices, the NCCL/Gloo settings derived from the hosts' NICs and HCAs,
variables that differ between nodes, secrets, clusterrun's own work while the job runs) is listed in the comment
header.

Kubernetes expands ``$(NAME)`` in a container's command, arguments and environment values, and ``$$`` to ``$``:
every ``$`` the user wrote is doubled, so that each argument and value arrives as typed.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from clusterrun.errors import PlanError, UsageError
from clusterrun.export.carry import runtime_only
from clusterrun.export.comments import bullets, one_line, paragraph
from clusterrun.export.environment import JobEnv, job_env
from clusterrun.export.naming import check_name, check_namespace, default_name
from clusterrun.inventory.models import Inventory
from clusterrun.planning.plan import LaunchPlan

GPU_RESOURCE = "nvidia.com/gpu"
#: Variables that name a node's own devices: meaningless in a pod the scheduler places anywhere.
DEVICE_VARS = frozenset({
    "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX",
    "UCX_NET_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
})
#: How to find each host-derived setting's value for the pods, where the target cluster needs it set.
_POD_VALUE = {
    "NCCL_SOCKET_IFNAME": "the pods' interface on the data network as `ip -br addr` shows it inside a pod (often "
                          "eth0, or net1 on a second network)",
    "GLOO_SOCKET_IFNAME": "the same interface as NCCL_SOCKET_IFNAME, without its '='",
    "NCCL_IB_HCA": "the RDMA devices `ibv_devices` lists inside a pod that has them (an RDMA device plugin), like "
                   "=mlx5_0:1",
    "NCCL_IB_DISABLE": "1 only where the pods have no RDMA device",
    "NCCL_IB_GID_INDEX": "the RoCE v2 GID index `show_gids` shows inside a pod",
}
#: Variables the operators set for torchrun (TrainJob refuses a job that sets PET_* itself).
_OPERATOR_VARS = frozenset({"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK"})
_OPERATOR_PREFIX = "PET_"
#: The items a TrainJob's command, args and env may hold (the CRD's maxItems).
_MAX_ITEMS = 128
_IMAGE_MAX = 500
_IMAGE_RE = re.compile(r"[^\s\x00-\x1f\x7f]+")
_RUNTIME_RE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
#: The TrainJob runtime that Kubeflow Trainer installs for torchrun jobs.
DEFAULT_RUNTIME = "torch-distributed"
#: The port TrainJob's torch runtime uses for the master (not configurable in the TrainJob).
_TRAINJOB_MASTER_PORT = 29500


@dataclass(frozen=True)
class KubeOptions:
    """The container image and where the job goes. Raises :class:`UsageError` for a missing or invalid value."""

    image: str | None
    name: str | None = None  # None: derived from the script and the run id
    namespace: str | None = None
    runtime: str = DEFAULT_RUNTIME  # TrainJob only

    def __post_init__(self) -> None:
        if not self.image:
            raise UsageError("--image is required: the container image that has torch and your code, like "
                             "--image ghcr.io/acme/train:1.4 (Kubernetes runs the script from it), or "
                             "container.image in the inventory")
        if not _IMAGE_RE.fullmatch(self.image) or len(self.image) > _IMAGE_MAX:
            raise UsageError(f"--image {self.image!r}: an image reference has no spaces or control characters and at "
                             f"most {_IMAGE_MAX} characters, like --image ghcr.io/acme/train:1.4")
        if self.namespace is not None:
            check_namespace(self.namespace)
        if not _RUNTIME_RE.fullmatch(self.runtime) or len(self.runtime) > 253:
            raise UsageError(f"--runtime {self.runtime!r}: the name of a ClusterTrainingRuntime, like --runtime "
                             f"{DEFAULT_RUNTIME}")


def escape(text: str) -> str:
    """``text`` as Kubernetes must be given it so that ``$(NAME)`` expansion leaves it as it is."""
    return text.replace("$", "$$")


@dataclass(frozen=True)
class _PodJob:
    """What both documents carry: the same for every node, or the export is refused."""

    name: str
    nproc: int
    gpus: int
    env: tuple[dict[str, str], ...]
    argv: tuple[str, ...]  # the script (after -m for a module) and its arguments, escaped
    lost: tuple[str, ...]  # what is not carried over, one line each


def _same_on_every_node(plan: LaunchPlan, kind: str) -> tuple[int, int]:
    """(processes per node, GPUs per node); :class:`PlanError` when the nodes differ (a pod template serves all)."""
    nprocs = {n.nproc_per_node for n in plan.nodes}
    gpus = {len(n.gpus) for n in plan.nodes}
    for what, values, fix in (("processes", nprocs, "--nproc-per-node N"), ("GPUs", gpus, "the same GPUs")):
        if len(values) > 1:
            each = ", ".join(f"{n.name}={n.nproc_per_node if what == 'processes' else len(n.gpus)}" for n in plan.nodes)
            raise PlanError(f"the nodes run different numbers of {what} ({each}); a {kind} gives every node the same: "
                            f"give {fix} to export it")
    return nprocs.pop(), gpus.pop()


def _pod_env(env: JobEnv, name: str) -> tuple[list[dict[str, str]], list[str]]:
    """(the container's environment, one line per variable or group left out and why)."""
    kept: list[dict[str, str]] = []
    devices: list[str] = []
    operator: list[str] = []
    for var in env.common:
        if var.name in DEVICE_VARS:
            devices.append(f"{var.name}={var.value}")
        elif var.name in _OPERATOR_VARS or var.name.startswith(_OPERATOR_PREFIX):
            operator.append(var.name)
        else:
            kept.append({"name": var.name, "value": escape(var.value)})
    lost = _host_settings(env)
    pinned = [f"{v.name} ({v.per_node()})" for v in env.varying if v.name in DEVICE_VARS]
    if pinned:
        lost.append(f"per-node NIC pinning, {'; '.join(pinned)}: pods use the network Kubernetes gives them (set "
                    "it in the pod template if your nodes need it)")
    if devices:
        lost.append(f"{', '.join(devices)}: name devices of the nodes; pods use the network and GPUs Kubernetes "
                    "gives them (set them in the pod template if your nodes need them)")
    if operator:
        lost.append(f"{', '.join(operator)}: the operator sets them for torchrun")
    for varying in env.varying:
        if varying.name not in DEVICE_VARS:
            lost.append(f"{varying.name} ({varying.per_node()}): differs between the nodes, and one pod template "
                        "serves them all")
    lost += [f"{left.name}: {left.why}" for left in env.left_out]
    for secret in env.secrets:
        lost.append(f"{secret} holds a secret and is not written: create a Secret (kubectl create secret generic "
                    f"{name}-secrets --from-literal={secret}=...) and add it to the container's env with "
                    "valueFrom.secretKeyRef")
    return kept, lost


def _host_settings(env: JobEnv) -> list[str]:
    """The comment on what clusterrun derived from the inventory's hosts: what, why it stays out, how to set it."""
    if not env.from_hosts:
        return []
    names = dict.fromkeys(v.name for v in env.from_hosts)
    harm = ("NCCL_IB_DISABLE=1 from hosts without RDMA would make NCCL use TCP on an InfiniBand cluster, and "
            if "NCCL_IB_DISABLE" in names else "")
    lead = (f"{', '.join(v.shown() for v in env.from_hosts)}: derived by clusterrun from the SSH inventory's hosts "
            f"(their NICs and HCAs), and the pods' network and HCAs are others: {harm}a NIC or HCA name the pods lack "
            "stops NCCL or makes it fall back to TCP. Without them NCCL picks the pod's interface and HCAs itself; "
            "where the target cluster needs one, add it to the container's env (as below)")
    return [lead, *(f"{name} for the pods: {_POD_VALUE[name]}" for name in names if name in _POD_VALUE)]


def _pod_job(plan: LaunchPlan, inv: Inventory, options: KubeOptions, kind: str, suffix: str) -> _PodJob:
    nproc, gpus = _same_on_every_node(plan, kind)
    name = check_name(options.name, suffix) if options.name is not None else default_name(plan, suffix)
    env, lost = _pod_env(job_env(plan, hosts=False), name)
    pythons = sorted({n.python for n in plan.nodes})
    lost.append(f"the nodes' interpreter ({', '.join(pythons)}): the image's torchrun runs the script")
    lost += runtime_only(plan, inv)
    argv = tuple(escape(arg) for arg in (*(["-m"] if plan.job.module else []), plan.job.script, *plan.job.args))
    if len(argv) > _MAX_ITEMS or len(env) > _MAX_ITEMS:
        raise UsageError(f"the script's {len(argv)} arguments or {len(env)} environment variables exceed the "
                         f"{_MAX_ITEMS} a {kind} takes; pass them in a file the script reads")
    return _PodJob(name, nproc, gpus, tuple(env), argv, tuple(lost))


def cpu_only(plan: LaunchPlan) -> str | None:
    """Why the exported job asks Kubernetes for no GPU and how to ask for them; None when its nodes have GPUs."""
    if any(node.gpus for node in plan.nodes):
        return None
    return (f"the job is CPU-only: the plan gives its nodes no GPUs, so its pods ask for no {GPU_RESOURCE}; to ask "
            "for GPUs, add --gpus (e.g. --gpus 0-7) or give the nodes gpus: in the inventory, and export again")


def _metadata(job: _PodJob, options: KubeOptions) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": job.name}
    if options.namespace is not None:
        meta["namespace"] = options.namespace
    meta["labels"] = {"app.kubernetes.io/created-by": "clusterrun"}
    return meta


def _header(kind: str, job: _PodJob, plan: LaunchPlan, options: KubeOptions, extra: list[str]) -> list[str]:
    script = one_line(shlex.join([*(["-m"] if plan.job.module else []), plan.job.script]))
    gpus = f", {job.gpus} GPU(s)" if job.gpus else ""
    namespace = f" -n {options.namespace}" if options.namespace else ""
    what = f"the module {plan.job.script}" if plan.job.module else f"{script} (relative to its working directory)"
    return [
        *paragraph(f"{kind} {job.name}: {script} on {plan.nnodes} node(s), {job.nproc} process(es) each{gpus}, under "
                   f"torchrun as `clusterrun up` runs it. Written by `clusterrun export {kind.lower()}`; start it with "
                   f"`kubectl apply{namespace} -f FILE`."),
        *paragraph(f"The image {options.image} must hold torch and {what}."),
        "#",
        *bullets("Not carried over:", [*job.lost, *extra]),
        *(["#", *paragraph(f"Note: {why}.")] if (why := cpu_only(plan)) else []),
        *(["#", *bullets("The plan warned:", plan.warnings)] if plan.warnings else []),
    ]


def _dump(header: list[str], document: dict[str, Any]) -> str:
    import yaml

    return "\n".join(header) + "\n" + yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)


def _container(job: _PodJob, options: KubeOptions, port: int) -> dict[str, Any]:
    """A fresh PyTorchJob container (each replica gets its own: shared objects would be dumped as YAML aliases)."""
    container: dict[str, Any] = {
        "name": "pytorch",  # the operator finds its container by this name
        "image": options.image,
        # torchrun takes the node count, rank and processes per node from the PET_* variables the operator sets;
        # the master's address and port it sets as MASTER_ADDR and MASTER_PORT, which torchrun does not read.
        "command": ["torchrun", "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)"],
        "args": list(job.argv),
    }
    if job.env:
        container["env"] = [dict(var) for var in job.env]
    container["ports"] = [{"name": "pytorchjob-port", "containerPort": port}]  # the master port the operator uses
    if job.gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: job.gpus}}
    # NCCL and DataLoader workers share memory through /dev/shm, which a container has only 64 MiB of.
    container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    return container


def _replica(count: int, job: _PodJob, options: KubeOptions, port: int) -> dict[str, Any]:
    return {
        "replicas": count,
        "restartPolicy": "Never",  # as `up`: a failed rank fails the job (no restarts behind the user's back)
        "template": {"spec": {
            "containers": [_container(job, options, port)],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        }},
    }


def pytorchjob(plan: LaunchPlan, inv: Inventory, options: KubeOptions) -> str:
    """A PyTorchJob: Master 1 replica, Worker the other nodes; a comment header lists what is not carried over."""
    suffix = f"-worker-{plan.nnodes - 2}" if plan.nnodes > 1 else "-master-0"
    job = _pod_job(plan, inv, options, "PyTorchJob", suffix)
    replicas = {"Master": _replica(1, job, options, plan.master_port)}
    if plan.nnodes > 1:
        replicas["Worker"] = _replica(plan.nnodes - 1, job, options, plan.master_port)
    document = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _metadata(job, options),
        "spec": {
            "nprocPerNode": str(job.nproc),
            # When the job ends (a failed pod ends it), the pods still running are removed, as `up` stops every node.
            "runPolicy": {"cleanPodPolicy": "Running"},
            "pytorchReplicaSpecs": replicas,
        },
    }
    return _dump(_header("PyTorchJob", job, plan, options, []), document)


def trainjob(plan: LaunchPlan, inv: Inventory, options: KubeOptions) -> str:
    """A TrainJob on the ``options.runtime`` ClusterTrainingRuntime; a comment header lists what is not carried over."""
    job = _pod_job(plan, inv, options, "TrainJob", f"-node-0-{plan.nnodes - 1}")
    trainer: dict[str, Any] = {
        "image": options.image,
        # The runtime gives torchrun the node count, rank, processes per node and master as PET_* variables.
        "command": ["torchrun"],
        "args": list(job.argv),
        "numNodes": plan.nnodes,
        "numProcPerNode": job.nproc,
    }
    if job.gpus:
        trainer["resourcesPerNode"] = {"limits": {GPU_RESOURCE: job.gpus}}
    if job.env:
        trainer["env"] = [dict(var) for var in job.env]
    document = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _metadata(job, options),
        "spec": {"runtimeRef": {"name": options.runtime}, "trainer": trainer},
    }
    extra = [] if plan.master_port == _TRAINJOB_MASTER_PORT else [
        f"the master port {plan.master_port}: the {options.runtime} runtime uses {_TRAINJOB_MASTER_PORT}"]
    extra.append(f"a larger /dev/shm: the {options.runtime} runtime's pod template decides it")
    return _dump(_header("TrainJob", job, plan, options, extra), document)
