"""The plan completed from what the nodes report: each node's data NIC and addresses from its facts, the GPUs it
gives the run (``gpuchoice``), the master port its ready check chose, Slurm's topology order; or the run stopped
where the nodes contradict the inventory. ``with_restarts``: the plan of a run clusterrun may restart."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from clusterrun.errors import PlanError, StartError
from clusterrun.facts.gpus import NodeGpus
from clusterrun.facts.leases import held_gpus
from clusterrun.facts.nics import reconcile
from clusterrun.facts.node import ProbedNode, read_facts
from clusterrun.inventory.models import Inventory
from clusterrun.planning import gpuchoice
from clusterrun.planning.plan import CPU_BIND_VAR, EnvVar, JobSpec, LaunchPlan, build_plan

MISMATCH_HINT = ("the inventory and the nodes disagree: fix the inventory (or the node); `clusterrun doctor "
                 "<inventory> --checks nic` shows every NIC; no node was started")


def with_master_port(plan: LaunchPlan, ready: Mapping[str, ProbedNode]) -> tuple[JobSpec, list[str]]:
    """The job with the master port the master's ready check chose and leased (when nobody set one), and a line
    saying so when it is not the usual 29500."""
    chosen = ready[plan.master.name].master_port if plan.master.name in ready else None
    if not plan.choose_port or not chosen or chosen == plan.master_port:
        return plan.job, []
    return (dataclasses.replace(plan.job, master_port=chosen),
            [f"{plan.master.name}: master port {chosen} (port {plan.master_port} is taken there; the first free one "
             "after it)"])


#: The label the nodes' Slurm switch is given, from SLURM_TOPOLOGY_ADDR, when nobody chose a rank order.
SLURM_SWITCH = "slurm-switch"


def with_slurm_topology(inv: Inventory, job: JobSpec, ready: Mapping[str, ProbedNode]) -> tuple[Inventory, JobSpec]:
    """Under Slurm with a network topology (``SLURM_TOPOLOGY_ADDR`` in the nodes' steps, ``s0.s2.node07``), and
    nobody chose a rank order: each node labelled with its leaf switch (``slurm-switch=s0.s2``) and the job
    ordered by it, so the nodes under one switch get consecutive ranks. The first node keeps rank 0 (its group
    comes first): the master the ready check looked at stays the master."""
    switches = {name: r.topology_addr.rsplit(".", 1)[0] for name, r in ready.items()
                if r.topology_addr and "." in r.topology_addr}
    chosen = job.rank_order not in (None, f"label:{SLURM_SWITCH}")  # a restart's job has it already
    if not switches or chosen or "rank_order" in inv.network.model_fields_set:
        return inv, job
    nodes = [n.model_copy(update={"labels": [*n.labels, f"{SLURM_SWITCH}={switches[n.name]}"]})
             if n.name in switches else n for n in inv.nodes]
    return inv.model_copy(update={"nodes": nodes}), dataclasses.replace(job, rank_order=f"label:{SLURM_SWITCH}")


def _gpu_env(facts: NodeGpus, choice: gpuchoice.GpuChoice, cpu_bind: str) -> tuple[EnvVar, ...]:
    """The variables a node's GPU choice gives it (CUDA_DEVICE_ORDER, the CPU binding, the node's own
    CUDA_VISIBLE_DEVICES where it names GPUs that cannot be numbered)."""
    found: list[EnvVar] = []
    if choice.node_env and facts.visible is not None:
        # Set as the node sets it: so that a container, whose GPUs follow the plan's value, gets them too.
        found.append(EnvVar("CUDA_VISIBLE_DEVICES", facts.visible, "the node's own"))
    if choice.gpus and facts.gpus:
        # nvidia-smi numbers GPUs in PCI bus order; CUDA by default fastest first: the same order only on nodes
        # with one GPU model. This makes CUDA_VISIBLE_DEVICES mean the GPUs chosen here on every node. Not where
        # nvidia-smi could not list them: the node's own numbers are kept, in the node's own order.
        found.append(EnvVar("CUDA_DEVICE_ORDER", "PCI_BUS_ID", "clusterrun:gpu-choice"))
    bind = choice.cpu_bind() if cpu_bind == "numa" else None
    if bind:
        found.append(EnvVar(CPU_BIND_VAR, bind, "clusterrun:cpu-bind"))
    return tuple(found)


def plan_with_facts(inv: Inventory, plan: LaunchPlan, ready: Mapping[str, ProbedNode]) -> tuple[Inventory, LaunchPlan]:
    """The inventory completed with the nodes' GPUs (:func:`clusterrun.planning.gpuchoice.for_run`, clear of the GPUs
    other runs lease and of busy ones) and network facts, and the plan made from it
    with the master port the master chose. A single node's NICs are not looked at (its ranks talk over loopback).
    Raises :class:`StartError` naming each node that cannot give the run its GPUs, or whose listed NICs,
    addresses or RDMA ports are not what the node has; :class:`GpusLeased` naming the GPUs other runs hold that
    this one needs.
    """
    given = inv
    held = held_gpus({name: r.leases for name, r in ready.items() if r.leases}, plan.run_id)
    gpus = gpuchoice.for_run(inv, plan, ready, held)
    inv, gpu_warnings = gpus.inventory, gpus.warnings
    gpu_env = {node: _gpu_env(facts, choice, plan.job.cpu_bind) for node, (facts, choice) in gpus.choices.items()}
    job, port = with_master_port(plan, ready)
    probed = (*gpus.lines, *port)
    if plan.nnodes < 2:
        if not probed and not gpu_warnings and not gpu_env and inv is given and job is plan.job:
            return inv, plan
        try:
            new = build_plan(inv, job, probed=(*plan.probed, *probed), gpu_env=gpu_env)
        except PlanError as exc:
            raise StartError({"plan": str(exc)}, hint=gpuchoice.GPU_HINT) from None
        return inv, dataclasses.replace(new, warnings=(*new.warnings, *gpu_warnings))
    inv, job = with_slurm_topology(inv, job, ready)
    facts, unknown, ssh = read_facts(ready)
    result = reconcile(inv, facts)
    if result.problems:
        raise StartError(dict(result.problems), hint=MISMATCH_HINT)
    try:
        new = build_plan(result.inventory, job, ssh_addresses=ssh, probed=(*probed, *result.probed),
                         gpu_env=gpu_env)
    except PlanError as exc:
        raise StartError({"plan": str(exc)}, hint=MISMATCH_HINT) from None
    if unknown or gpu_warnings:
        new = dataclasses.replace(new, warnings=(*new.warnings, *gpu_warnings, *unknown))
    return result.inventory, new


def with_restarts(inv: Inventory, plan: LaunchPlan, max_restarts: int) -> LaunchPlan:
    """``plan`` for a run that clusterrun may restart ``max_restarts`` times (the workers see it as
    TORCHELASTIC_MAX_RESTARTS): what ``up`` runs, and what ``up --dry-run`` shows."""
    if plan.job.restarts == max_restarts:
        return plan
    return dataclasses.replace(build_plan(inv, dataclasses.replace(plan.job, restarts=max_restarts)),
                               probed=plan.probed)
