"""The launch plan's records: what runs on each node, as ``plan.json`` holds it, and back.

:func:`clusterrun.planning.plan.build_plan` makes a :class:`LaunchPlan` from the inventory; this module only holds the
records and their round trip (:meth:`LaunchPlan.to_dict`, :meth:`LaunchPlan.from_dict`). Standard library only:
it travels to rank 0's node with the cluster supervisor of a detached run, which reads the plan it was given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterrun import redact
from clusterrun.inventory.kinds import Runtime, Transport


@dataclass(frozen=True)
class ContainerPlan:
    """A node's container command, in parts: ``head``, one ``--env NAME`` per variable, ``options``, ``image``,
    then torchrun's argv. The agent adds ``--env`` for the variables it sets itself (the stack hook's)."""

    runtime: Runtime
    image: str
    head: tuple[str, ...]
    env_names: tuple[str, ...]
    options: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]
    pull: str
    env: tuple[tuple[str, str], ...] = ()  # values the container sees instead of the node's (CUDA_VISIBLE_DEVICES)
    mounts: tuple[str, ...] = ()  # the inventory's SRC:DST[:ro] (in ``head`` too): sources checked before the start

    def argv(self, command: Iterable[str] = ()) -> tuple[str, ...]:
        return (*self.head, *env_flags(self.runtime, self.env_names), *self.options, self.image, *command)

    def to_dict(self, command: Iterable[str] = ()) -> dict[str, Any]:
        return {"runtime": self.runtime.value, "image": self.image, "head": list(self.head),
                "env_names": list(self.env_names), "options": list(self.options),
                "labels": dict(self.labels), "pull": self.pull, "env": dict(self.env), "mounts": list(self.mounts),
                "argv": list(self.argv(command))}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContainerPlan:
        return cls(runtime=Runtime(data["runtime"]), image=data["image"], head=tuple(data["head"]),
                   env_names=tuple(data.get("env_names") or ()), options=tuple(data.get("options") or ()),
                   labels=tuple((data.get("labels") or {}).items()), pull=data.get("pull", "missing"),
                   env=tuple((data.get("env") or {}).items()), mounts=tuple(data.get("mounts") or ()))


def env_flags(runtime: Runtime, names: Iterable[str]) -> list[str]:
    """``--env NAME`` for each name: the runtime takes the value from its own environment. Apptainer passes the
    host's environment on by itself."""
    if runtime is Runtime.apptainer:
        return []
    out: list[str] = []
    for name in names:
        out += ["--env", name]
    return out



#: Where a node keeps a run's files when the job does not say otherwise (relative to the ssh user's home).
REMOTE_RUNS_DIR = "~/.clusterrun/runs"
#: Environment variable that marks every process of a run (used to find and stop them).
RUN_ID_VAR = "CLUSTERRUN_RUN_ID"
#: How many times clusterrun has restarted the job (0 on its first attempt), as torchrun's TORCHELASTIC_RESTART_COUNT.
RESTART_COUNT_VAR = "CLUSTERRUN_RESTART_COUNT"
#: How many times clusterrun may restart the job (``--max-restarts``): the workers see it as TORCHELASTIC_MAX_RESTARTS.
MAX_RESTARTS_VAR = "CLUSTERRUN_MAX_RESTARTS"
#: Each local rank's CPUs and memory node (``0-51/0;0-51/0;52-103/1``), applied as the rank starts (stackhook.py).
CPU_BIND_VAR = "CLUSTERRUN_CPU_BIND"


@dataclass(frozen=True)
class JobSpec:
    """What the user asked to run. Paths are as the CLI resolved them (absolute for local use)."""

    script: str
    run_id: str
    args: tuple[str, ...] = ()
    module: bool = False
    nproc_per_node: int | None = None
    master_port: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    local_runs_dir: str = "runs"
    local_cwd: str = "."
    max_restarts: int = 0  # torchrun's own restarts (clusterrun restarts the whole job itself: ``attempt``)
    sync_dir: str | None = None  # copied whole to each node's code/ directory (absolute, local)
    attempt: int = 0  # clusterrun's restarts so far: each attempt has its own directory on the nodes
    restarts: int = 0  # how many times clusterrun may restart the job (``--max-restarts``, run.max_restarts)
    rank_order: str | None = None  # ``--rank-order``: inventory or label:KEY (None: network.rank_order)
    cpu_bind: str = "numa"  # "numa": each rank on its GPU's NUMA node (where the node's topology says); "none"
    allow_busy_gpus: bool = False  # a listed GPU that is busy is used anyway (``--allow-busy-gpus``)


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    source: str  # "rule:socket-ifname", "defaults.env", "nodes[1].env", "--env", "clusterrun"


@dataclass(frozen=True)
class NodePlan:
    name: str
    host: str
    transport: Transport
    node_rank: int
    nproc_per_node: int
    rank_offset: int  # global rank of this node's local rank 0
    gpus: tuple[int, ...]
    python: str
    argv: tuple[str, ...]
    cwd: str
    run_dir: str  # the node's own directory for this run (logs, copied code)
    script: str  # the script path as the node sees it
    env: tuple[EnvVar, ...]
    data_nic: str | None
    data_address: str
    container: ContainerPlan | None = None  # the job runs inside this image (None: on the host)

    @property
    def ranks(self) -> range:
        return range(self.rank_offset, self.rank_offset + self.nproc_per_node)

    def env_dict(self) -> dict[str, str]:
        return {var.name: var.value for var in self.env}

    def to_dict(self, master_addr: str, master_port: int, *, secrets: bool = False) -> dict[str, Any]:
        """The node as plan.json holds it: a secret's value redacted, unless ``secrets`` (the plan handed to a
        detached run's supervisor on its stdin, never written to a file)."""
        return {
            "name": self.name,
            "host": self.host,
            "transport": self.transport.value,
            "node_rank": self.node_rank,
            "nproc_per_node": self.nproc_per_node,
            "ranks": [self.rank_offset, self.rank_offset + self.nproc_per_node - 1],
            "gpus": list(self.gpus),
            "master_addr": master_addr,
            "master_port": master_port,
            "data_nic": self.data_nic,
            "data_address": self.data_address,
            "python": self.python,
            "argv": list(self.argv),
            "cwd": self.cwd,
            "run_dir": self.run_dir,
            "script": self.script,
            "env": self.env_dict() if secrets else redact.env(self.env_dict()),  # a secret's value stays out of files
            "env_sources": {var.name: var.source for var in self.env},
            "container": self.container.to_dict(self.argv) if self.container else None,
        }


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    job: JobSpec
    master_addr: str
    master_port: int
    data_network: str
    nodes: tuple[NodePlan, ...]
    warnings: tuple[str, ...] = field(default=())
    probed: tuple[str, ...] = field(default=())  # inventory values that came from the nodes themselves
    spares: tuple[str, ...] = field(default=())  # nodes that wait to take a lost node's place
    choose_port: bool = False  # nobody set the master port: the master's ready check chooses a free one
    rank_order: str = "inventory"  # how node ranks were given, in words

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def world_size(self) -> int:
        return sum(n.nproc_per_node for n in self.nodes)

    @property
    def master(self) -> NodePlan:
        return next(n for n in self.nodes if n.node_rank == 0)

    def node(self, name: str) -> NodePlan:
        return next(n for n in self.nodes if n.name == name)

    def node_of_rank(self, rank: int) -> NodePlan:
        return next(n for n in self.nodes if rank in n.ranks)

    @property
    def facts_pending(self) -> tuple[str, ...]:
        """Nodes whose data NIC the inventory does not give: ``up`` takes it from what the node reports
        (``plan --probe`` shows that plan). Empty for one node (its ranks talk over loopback)."""
        if self.nnodes < 2:
            return ()
        return tuple(n.name for n in self.nodes if not n.data_nic)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchPlan:
        """The plan as :meth:`to_dict` wrote it (``plan.json``). The job keeps its script, args and run id."""
        nodes = tuple(NodePlan(
            name=n["name"], host=n["host"], transport=Transport(n["transport"]), node_rank=int(n["node_rank"]),
            nproc_per_node=int(n["nproc_per_node"]), rank_offset=int(n["ranks"][0]), gpus=tuple(n.get("gpus") or ()),
            python=n["python"], argv=tuple(n["argv"]), cwd=n["cwd"], run_dir=n["run_dir"], script=n["script"],
            env=tuple(EnvVar(k, v, (n.get("env_sources") or {}).get(k, "")) for k, v in (n.get("env") or {}).items()),
            data_nic=n.get("data_nic"), data_address=n.get("data_address", ""),
            container=ContainerPlan.from_dict(n["container"]) if n.get("container") else None,
        ) for n in data["nodes"])
        job = JobSpec(script=data.get("script", ""), run_id=data["run_id"], args=tuple(data.get("args") or ()),
                      attempt=int(data.get("attempt") or 0), restarts=int(data.get("restarts") or 0))
        return cls(run_id=data["run_id"], job=job, master_addr=data["master_addr"], master_port=int(data["master_port"]),
                   data_network=data.get("data_network", ""), nodes=nodes, warnings=tuple(data.get("warnings") or ()),
                   probed=tuple(data.get("probed") or ()), spares=tuple(data.get("spares") or ()),
                   choose_port=bool(data.get("choose_port")), rank_order=str(data.get("rank_order") or "inventory"))

    def for_attempt(self, attempt: int) -> LaunchPlan:
        """This plan for clusterrun's restart number ``attempt`` on the same nodes, as the planner would make it:
        each node's directory ``attempt-<n>`` beside the first attempt's (its paths in the argv, the script, the
        working directory and the environment with it) and CLUSTERRUN_RESTART_COUNT. It needs only the plan, so a
        detached run's supervisor on rank 0's node restarts the job exactly as an attached ``up`` does."""
        def moved(node: NodePlan) -> NodePlan:
            first = node.run_dir.rsplit("/attempt-", 1)[0] if self.job.attempt else node.run_dir
            new = f"{first}/attempt-{attempt}" if attempt else first

            def path(value: str) -> str:
                return new + value[len(node.run_dir):] if value == node.run_dir or value.startswith(
                    node.run_dir + "/") else value

            env = tuple(EnvVar(v.name, str(attempt) if v.name == RESTART_COUNT_VAR else path(v.value), v.source)
                        for v in node.env)
            return dataclasses.replace(node, run_dir=new, script=path(node.script), cwd=path(node.cwd),
                                       argv=tuple(path(a) for a in node.argv), env=env)

        return dataclasses.replace(self, job=dataclasses.replace(self.job, attempt=attempt),
                                   nodes=tuple(moved(n) for n in self.nodes))

    def to_dict(self, *, secrets: bool = False) -> dict[str, Any]:
        """The plan as plan.json holds it (``secrets``: see :meth:`NodePlan.to_dict`)."""
        return {
            "run_id": self.run_id,
            "script": self.job.script,
            "args": list(self.job.args),
            "attempt": self.job.attempt,
            "restarts": self.job.restarts,
            "nnodes": self.nnodes,
            "world_size": self.world_size,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "data_network": self.data_network,
            "warnings": list(self.warnings),
            "probed": list(self.probed),
            "spares": list(self.spares),
            "choose_port": self.choose_port,
            "rank_order": self.rank_order,
            "facts_pending": list(self.facts_pending),
            "nodes": [n.to_dict(self.master_addr, self.master_port, secrets=secrets) for n in self.nodes],
        }
