"""The launch plan: exactly what runs on each node, computed without any I/O.

``build_plan(inventory, job)`` assigns node ranks, finds the master address on the
data network, builds the torchrun argv and the environment (rules from
:mod:`clusterrun.planning.nccl`, then ``defaults.env``, the node's ``env``, then ``--env``;
later wins, and each variable records where it came from). ``clusterrun plan`` and
``clusterrun up --dry-run`` print this object; ``up`` executes the same object.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

from clusterrun.planning.container import build_container
from clusterrun.errors import PlanError
from clusterrun.inventory.models import Inventory, Node, Transport
from clusterrun.planning.nccl import RuleContext, rule_env
from clusterrun.planning.network import DataNetwork, resolve_data_network
from clusterrun.planning.planfile import (  # noqa: F401 - the plan's records, imported from here by most of clusterrun
    CPU_BIND_VAR,
    MAX_RESTARTS_VAR,
    REMOTE_RUNS_DIR,
    RESTART_COUNT_VAR,
    RUN_ID_VAR,
    EnvVar,
    JobSpec,
    LaunchPlan,
    NodePlan,
)


def _ordered(inv: Inventory, order: str) -> tuple[list[tuple[int, Node]], str]:
    """(inventory index, node) in node_rank order, and that order in words: pinned ranks, else ``order``
    (inventory order, or ``label:KEY``: see :func:`by_label`). Spares take no part."""
    indexed = [(i, n) for i, n in enumerate(inv.nodes) if not n.spare]
    if not indexed:
        raise PlanError("every node of the inventory is a spare (spare: true); at least one must run the job")
    if all(n.node_rank is not None for _, n in indexed):
        return sorted(indexed, key=lambda pair: pair[1].node_rank or 0), "pinned (node_rank)"
    if order.startswith("label:"):
        return by_label(indexed, order[len("label:"):])
    return indexed, "inventory"


def by_label(indexed: list[tuple[int, Node]], key: str) -> tuple[list[tuple[int, Node]], str]:
    """Nodes sharing a ``KEY=VALUE`` label value get consecutive ranks, groups in order of first appearance
    (nodes under one switch talk across it, not over the spine: ring and tree neighbours stay close). A node
    without the label is a group of its own, where it stands."""
    groups: dict[str, list[tuple[int, Node]]] = {}
    for i, node in indexed:
        value = node.label(key)
        groups.setdefault(f"={value}" if value is not None else f"#{i}", []).append((i, node))
    values = [g[1:] for g in groups if g.startswith("=")]
    words = f"by label {key} ({', '.join(values)})" if values else f"inventory (no node has a {key}= label)"
    return [pair for group in groups.values() for pair in group], words


def _nproc(inv: Inventory, node: Node, job: JobSpec) -> int:
    nproc = job.nproc_per_node or node.nproc_per_node or inv.defaults.nproc_per_node
    if nproc is None:
        return len(node.gpus) or 1
    if node.gpus and nproc > len(node.gpus):
        raise PlanError(
            f"{node.name}: {nproc} processes per node but only {len(node.gpus)} GPUs listed ({node.gpus}); "
            "lower --nproc-per-node or list more GPUs"
        )
    return nproc


def _script_in_code(job: JobSpec) -> str:
    """The script's path inside the node's code/ directory: relative to --sync DIR when it lies there."""
    if job.sync_dir:
        script = posixpath.normpath(posixpath.join(job.local_cwd, job.script))
        inside = posixpath.relpath(script, job.sync_dir)
        if not inside.startswith("../"):
            return inside
    return posixpath.basename(job.script)


def _paths(inv: Inventory, node: Node, job: JobSpec) -> tuple[str, str, str]:
    """(run_dir, script, cwd) as the node sees them; a restart's attempt gets a directory of its own."""
    workdir = inv.workdir_of(node)
    attempt = (f"attempt-{job.attempt}",) if job.attempt else ()
    if inv.transport_of(node) is Transport.local:
        run_dir = posixpath.join(job.local_runs_dir, job.run_id, node.name, "node", *attempt)
        script = job.script if job.module else posixpath.normpath(posixpath.join(job.local_cwd, job.script))
        return run_dir, script, workdir or job.local_cwd
    # The node name is part of the path: home directories are often shared between nodes (NFS).
    run_dir = posixpath.join(REMOTE_RUNS_DIR, job.run_id, node.name, *attempt)
    if inv.defaults.shared_fs or job.module:
        script = job.script
    else:
        script = posixpath.join(run_dir, "code", _script_in_code(job))
    if inv.defaults.shared_fs or job.module:
        # The same path on every node: run where clusterrun was started, unless a workdir is set.
        return run_dir, script, workdir or job.local_cwd
    return run_dir, script, workdir or posixpath.join(run_dir, "code")


def _env(inv: Inventory, index: int, node: Node, ctx: RuleContext, job: JobSpec,
         gpu_env: tuple[EnvVar, ...] = ()) -> tuple[EnvVar, ...]:
    merged: dict[str, EnvVar] = {}
    for key, value, rule in rule_env(ctx):
        merged[key] = EnvVar(key, value, f"rule:{rule}")
    for var in gpu_env:  # from the node's GPU facts (the GPU choice, the CPU binding); the user's env wins
        merged[var.name] = var
    for key, value in inv.defaults.env.items():
        merged[key] = EnvVar(key, value, "defaults.env")
    for key, value in node.env.items():
        merged[key] = EnvVar(key, value, f"nodes[{index}].env")
    for key, value in job.env:
        merged[key] = EnvVar(key, value, "--env")
    merged[RUN_ID_VAR] = EnvVar(RUN_ID_VAR, job.run_id, "clusterrun")
    merged[RESTART_COUNT_VAR] = EnvVar(RESTART_COUNT_VAR, str(job.attempt), "clusterrun")
    if job.restarts:
        merged[MAX_RESTARTS_VAR] = EnvVar(MAX_RESTARTS_VAR, str(job.restarts), "clusterrun")
    return tuple(merged.values())


def build_plan(inv: Inventory, job: JobSpec, ssh_addresses: Mapping[str, str] | None = None,
               probed: tuple[str, ...] = (), gpu_env: Mapping[str, tuple[EnvVar, ...]] | None = None) -> LaunchPlan:
    """Compute the launch plan. Pure. ``gpu_env``: per node, the variables its GPU facts give (see
    :mod:`clusterrun.launch.replan`). Raises :class:`PlanError` when the job does not fit the inventory."""
    data: DataNetwork = resolve_data_network(inv, ssh_addresses)
    ordered, order_words = _ordered(inv, job.rank_order or inv.network.rank_order)
    master_node = ordered[0][1]
    master_addr = data.path_of(master_node.name).address
    if len(ordered) > 1 and master_addr in {"localhost", "127.0.0.1", "::1"}:
        raise PlanError(
            f"{master_node.name}: the master address would be {master_addr}, which other nodes cannot reach; "
            "give the node a routable host or list its data NIC address"
        )
    master_port = job.master_port or inv.network.master_port
    warnings = list(data.warnings)
    nodes: list[NodePlan] = []
    offset = 0
    for rank, (index, node) in enumerate(ordered):
        nproc = _nproc(inv, node, job)
        path = data.path_of(node.name)
        ctx = RuleContext(node=node, data=path, nnodes=len(ordered))
        run_dir, script, cwd = _paths(inv, node, job)
        python = inv.python_of(node)
        argv = (
            python, "-m", "torch.distributed.run",
            "--nnodes", str(len(ordered)),
            "--node-rank", str(rank),
            "--nproc-per-node", str(nproc),
            "--master-addr", master_addr,
            "--master-port", str(master_port),
            # This node's own address, from the plan like the master's: wherever torchrun needs it (the c10d
            # rendezvous, MASTER_ADDR when none is given) it would otherwise take its host name's FQDN, which needs
            # DNS (pytorch#150532). Every torch clusterrun supports (>= 2.1; torch 2.0 on) has the flag.
            "--local-addr", path.address,
            "--max-restarts", str(job.max_restarts),
            # Each rank's output goes to its own file on the node, so lines of different
            # ranks never interleave and nothing is lost if the stream breaks.
            "--redirects", "3",
            "--log-dir", posixpath.join(run_dir, "torchrun"),
            *(("-m",) if job.module else ()),
            script,
            *job.args,
        )
        env = _env(inv, index, node, ctx, job, (gpu_env or {}).get(node.name, ()))
        settings = inv.container_of(node)
        container = None if settings is None else build_container(
            settings, run_id=job.run_id, node=node.name, run_dir=run_dir, cwd=cwd,
            env={var.name: var.value for var in env}, gpus=tuple(node.gpus),
            rdma=any(nic.kind.is_rdma for nic in node.nics))
        nodes.append(NodePlan(
            name=node.name, host=node.host, transport=inv.transport_of(node), node_rank=rank,
            nproc_per_node=nproc, rank_offset=offset, gpus=tuple(node.gpus), python=python, argv=argv,
            cwd=cwd, run_dir=run_dir, script=script, env=env,
            data_nic=path.nic, data_address=path.address, container=container,
        ))
        offset += nproc
    if len({n.nproc_per_node for n in nodes}) > 1:
        counts = ", ".join(f"{n.name}={n.nproc_per_node}" for n in nodes)
        warnings.append(f"nodes run different numbers of processes ({counts}); data-parallel jobs usually want equal")
    return LaunchPlan(
        run_id=job.run_id, job=job, master_addr=master_addr, master_port=master_port,
        data_network=data.description, nodes=tuple(nodes), warnings=tuple(warnings), probed=probed,
        spares=tuple(n.name for n in inv.nodes if n.spare),
        choose_port=job.master_port is None and "master_port" not in inv.network.model_fields_set,
        rank_order=order_words,
    )
