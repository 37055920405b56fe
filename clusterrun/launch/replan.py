"""After preflight: complete the plan with what the nodes really have, or stop when they contradict it; after
a failed attempt: which nodes the next one runs on (a spare in a lost node's place, or one node fewer down to
``--min-nodes``), and how long to wait before it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence

from clusterrun import gpuchoice, remote
from clusterrun.errors import ClusterrunError, PlanError, StartError
from clusterrun.facts.gpus import span
from clusterrun.facts.nics import reconcile
from clusterrun.facts.node import LINE, ProbedNode, complete_gpus, read_facts
from clusterrun.inventory.models import Inventory
from clusterrun.plan import CPU_BIND_VAR, EnvVar, LaunchPlan, NodePlan, build_plan
from clusterrun.transport.base import Transport
from clusterrun.transport.fanout import on_every_node

MAX_BACKOFF = 60.0

MISMATCH_HINT = ("the inventory and the nodes disagree: fix the inventory (or the node); `clusterrun doctor "
                 "<inventory> --checks nic` shows every NIC; no node was started")
GPU_HINT = "no node was started; `clusterrun plan --probe` shows each node's GPUs (docs/gpus.md: how they are chosen)"
#: Held GPUs of each node: GPU index -> the run that holds it (see gpuchoice.choose).
Held = Mapping[str, Mapping[int, str]]


def gather(plan: LaunchPlan, transports: Mapping[str, Transport]) -> dict[str, ProbedNode]:
    """Only the facts of every node, in parallel, from the node reporter (``plan --probe``, ``init``: nothing is
    created on the nodes).

    Raises :class:`StartError` naming every node that could not be probed.
    """
    def one(node: NodePlan) -> ProbedNode:
        res = transports[node.name].run(remote.argv(node.python, "nodefacts"), timeout=60)
        line = next((x for x in res.stdout.splitlines() if x.startswith(LINE)), None)
        if line is None:
            raise ClusterrunError(f"probing with {node.python} failed (exit {res.exit_code}): {res.tail(2) or 'no output'}")
        facts = json.loads(line[len(LINE):])
        return ProbedNode(node.name, net=facts.get("net"), ssh_address=transports[node.name].peer_address(),
                          gpus=facts.get("gpus"), gpu_model=facts.get("gpu_model"), gpu=facts.get("gpu"))

    out, problems = on_every_node(plan.nodes, lambda n: n.name, one, "facts")
    if problems:
        raise StartError(problems, hint="the nodes named could not be probed")
    return out


def with_found_gpus(inv: Inventory, plan: LaunchPlan, ready: Mapping[str, ProbedNode]) -> tuple[Inventory, list[str]]:
    """The inventory with every GPU each node sees where nobody listed its GPUs or set its process count (see
    :func:`clusterrun.facts.node.complete_gpus`), and a line per node that was completed."""
    return complete_gpus(inv, {name: r.gpu_indices() for name, r in ready.items()}, plan.job.nproc_per_node is not None)


def _binding_line(node: str, choice: gpuchoice.GpuChoice) -> str:
    groups: dict[str, list[int]] = {}
    for gpu, bound in zip(choice.gpus, choice.bindings, strict=True):
        if bound is not None:
            where = f"CPUs {gpuchoice.cpu_list(bound.cpus)}" + ("" if bound.numa is None else f", NUMA node {bound.numa}")
            groups.setdefault(where, []).append(gpu)
    return f"{node}: each rank on its GPU's CPUs (--cpu-bind numa): " + "; ".join(
        f"GPU {span(gpus)} on {where}" for where, gpus in groups.items())


def choose_gpus(inv: Inventory, plan: LaunchPlan, ready: Mapping[str, ProbedNode],
                held: Held) -> tuple[Inventory, list[str], list[str], dict[str, tuple[EnvVar, ...]]]:
    """Each node's GPUs from what it reported (:func:`clusterrun.gpuchoice.choose`): the inventory with them, a line
    per node saying which and why, warnings, and the variables they give each node (CUDA_DEVICE_ORDER, the CPU
    binding). A node without nvidia-smi, or whose nvidia-smi failed, is left as it was (a warning says so).
    Raises :class:`StartError` naming every node that cannot give the run its GPUs."""
    job, planned = plan.job, {n.name for n in plan.nodes}
    nodes, lines, warnings, env, refused = [], [], [], {}, {}
    for node in inv.nodes:
        facts = ready[node.name].gpu_facts() if node.name in ready and node.name in planned else None
        if facts is None or not facts.gpus:
            if facts is not None:
                warnings += [*facts.problems, f"{node.name}: its GPUs could not be read: planned in plain order"]
            nodes.append(node)
            continue
        count = job.nproc_per_node or node.nproc_per_node or inv.defaults.nproc_per_node
        try:
            choice = gpuchoice.choose(facts, listed=node.gpus, count=count, held=held.get(node.name, {}),
                                      run_id=job.run_id, allow_busy=job.allow_busy_gpus, networked=plan.nnodes > 1)
        except gpuchoice.GpuRefused as exc:
            refused[node.name] = exc.reason
            nodes.append(node)
            continue
        update: dict[str, object] = {"gpus": list(choice.gpus)}
        if choice.node_env and count is None:
            update["nproc_per_node"] = len(facts.mig)
        nodes.append(node.model_copy(update=update))
        lines += [choice.note] if choice.note else []
        warnings += choice.warnings
        # nvidia-smi numbers GPUs in PCI bus order; CUDA by default fastest first: the same order only on nodes
        # with one GPU model. This makes CUDA_VISIBLE_DEVICES mean the GPUs chosen here on every node.
        found = [EnvVar("CUDA_DEVICE_ORDER", "PCI_BUS_ID", "clusterrun:gpu-choice")] if choice.gpus else []
        bind = choice.cpu_bind() if job.cpu_bind == "numa" else None
        if bind:
            found.append(EnvVar(CPU_BIND_VAR, bind, "clusterrun:cpu-bind"))
            lines.append(_binding_line(node.name, choice))
        env[node.name] = tuple(found)
    if refused:
        raise StartError(refused, hint=GPU_HINT)
    return inv.model_copy(update={"nodes": nodes}), lines, warnings, env


def plan_with_facts(inv: Inventory, plan: LaunchPlan, ready: Mapping[str, ProbedNode],
                    held: Held | None = None) -> tuple[Inventory, LaunchPlan]:
    """The inventory completed with the nodes' GPUs (:func:`choose_gpus`; ``held``: the GPUs other runs hold, by
    node) and network facts (and the GPUs of nodes nobody listed them for and nvidia-smi could not describe, see
    :func:`with_found_gpus`), and the plan made from it. A single node's NICs are not looked at (its ranks talk
    over loopback). Raises :class:`StartError` naming each node that cannot give the run its GPUs, or whose
    listed NICs, addresses or RDMA ports are not what the node has.
    """
    inv, chosen, gpu_warnings, gpu_env = choose_gpus(inv, plan, ready, held or {})
    inv, found = with_found_gpus(inv, plan, {n: r for n, r in ready.items() if n not in gpu_env})
    probed = (*chosen, *found)
    if plan.nnodes < 2:
        if not probed and not gpu_warnings and not gpu_env:
            return inv, plan
        try:
            new = build_plan(inv, plan.job, probed=(*plan.probed, *probed), gpu_env=gpu_env)
        except PlanError as exc:
            raise StartError({"plan": str(exc)}, hint=GPU_HINT) from None
        return inv, dataclasses.replace(new, warnings=(*new.warnings, *gpu_warnings))
    facts, unknown, ssh = read_facts(ready)
    result = reconcile(inv, facts)
    if result.problems:
        raise StartError(dict(result.problems), hint=MISMATCH_HINT)
    try:
        new = build_plan(result.inventory, plan.job, ssh_addresses=ssh, probed=(*probed, *result.probed),
                         gpu_env=gpu_env)
    except PlanError as exc:
        raise StartError({"plan": str(exc)}, hint=MISMATCH_HINT) from None
    if unknown or gpu_warnings:
        new = dataclasses.replace(new, warnings=(*new.warnings, *gpu_warnings, *unknown))
    return result.inventory, new


class CannotContinue(Exception):
    """Too few nodes are left to start the job again."""


def recompose(active: Sequence[str], spares: Sequence[str], drop: Mapping[str, str],
              min_nodes: int | None) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The next attempt's nodes in rank order, ``{lost: spare}`` and ``{node: why}`` for those left out.

    A spare takes a dropped node's place in the order (so the master moves to a spare when rank 0's node was
    lost); without a spare the node is left out, as long as ``min_nodes`` remain (None: every node is needed).
    Raises :class:`CannotContinue` otherwise.
    """
    free = [s for s in spares if s not in active and s not in drop]
    nodes, replaced, left_out = [], {}, {}
    for name in active:
        if name not in drop:
            nodes.append(name)
        elif free:
            replaced[name] = free.pop(0)
            nodes.append(replaced[name])
            left_out[name] = drop[name]
        else:
            left_out[name] = drop[name]
    need = len(active) if min_nodes is None else min_nodes
    if len(nodes) < need:
        gone = "; ".join(f"{n}: {why}" for n, why in left_out.items())
        limit = ("every node is needed (--min-nodes lets the job go on with fewer)" if min_nodes is None
                 else f"--min-nodes is {min_nodes}")
        raise CannotContinue(f"{len(nodes)} node(s) left after leaving out {gone}; {limit}"
                             + ("" if spares else "; no spare nodes in the inventory"))
    return nodes, replaced, left_out


def backoff(restart: int, base: float) -> float:
    """Seconds to wait before restart number ``restart`` (1, 2, ...): doubling from ``base``, at most a minute."""
    return min(base * (2 ** max(restart - 1, 0)), MAX_BACKOFF) if base > 0 else 0.0
