"""After preflight: complete the plan with what the nodes really have, or stop when they contradict it; after
a failed attempt: which nodes the next one runs on (a spare in a lost node's place, or one node fewer down to
``--min-nodes``), and how long to wait before it; how long to wait for GPUs other runs hold (``--wait-gpus``)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence

from clusterrun import remote
from clusterrun.planning import gpuchoice
from clusterrun.errors import ClusterrunError, GpusLeased, PlanError, StartError
from clusterrun.facts.gpus import NodeGpus, span
from clusterrun.facts.leases import WAIT_HINT, held_gpus, spare_leased_gpus
from clusterrun.facts.nics import reconcile
from clusterrun.facts.node import LINE, ProbedNode, complete_gpus, read_facts
from clusterrun.inventory.models import Inventory
from clusterrun.planning.plan import CPU_BIND_VAR, EnvVar, JobSpec, LaunchPlan, NodePlan, build_plan
from clusterrun.transport.base import Transport
from clusterrun.transport.fanout import on_every_node

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


def with_free_gpus(inv: Inventory, plan: LaunchPlan, ready: Mapping[str, ProbedNode],
                   held: Held) -> tuple[Inventory, list[str]]:
    """For the nodes whose nvidia-smi did not describe their GPUs: the inventory with every GPU each node sees
    where nobody listed its GPUs (:func:`with_found_gpus`), with a process count that many none of them leased
    by another run (``held``, see :func:`clusterrun.facts.leases.spare_leased_gpus`), and a line per node so
    completed. Raises :class:`GpusLeased` naming each node, GPU and holder where the run cannot have the GPUs it
    needs (without a process count: any GPU of the node that another run holds)."""
    completed, found = with_found_gpus(inv, plan, ready)
    completed, spared, leased = spare_leased_gpus(inv, completed, plan.job.nproc_per_node,
                                                  {name: r.gpu_indices() for name, r in ready.items()}, held)
    if leased:
        raise GpusLeased(leased, hint="no node was started")
    return completed, [*found, *spared]


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


def _binding_line(node: str, choice: gpuchoice.GpuChoice) -> str:
    groups: dict[str, list[int]] = {}
    for gpu, bound in zip(choice.gpus, choice.bindings, strict=True):
        if bound is not None:
            where = f"CPUs {gpuchoice.cpu_list(bound.cpus)}" + ("" if bound.numa is None else f", NUMA node {bound.numa}")
            groups.setdefault(where, []).append(gpu)
    return f"{node}: each rank on its GPU's CPUs (--cpu-bind numa): " + "; ".join(
        f"GPU {span(gpus)} on {where}" for where, gpus in groups.items())


def _readable(ready: Mapping[str, ProbedNode], planned: set[str]) -> dict[str, NodeGpus]:
    """The GPU facts of each planned node that says which GPUs a run may take: nvidia-smi listed them, or it could
    not but the node's CUDA_VISIBLE_DEVICES limits a node that has GPUs (the reporter counted some)."""
    out: dict[str, NodeGpus] = {}
    for name, r in ready.items():
        facts = r.gpu_facts() if name in planned else None
        if facts is not None and (facts.gpus or (facts.limited and r.gpus != 0)):
            out[name] = facts
    return out


def choose_gpus(inv: Inventory, plan: LaunchPlan, ready: Mapping[str, ProbedNode],
                held: Held) -> tuple[Inventory, list[str], list[str], dict[str, tuple[EnvVar, ...]]]:
    """Each node's GPUs from what it reported (:func:`clusterrun.planning.gpuchoice.choose`): the inventory with them, a line
    per node saying which and why, warnings, and the variables they give each node (CUDA_DEVICE_ORDER, the CPU
    binding, the node's own CUDA_VISIBLE_DEVICES where it names GPUs that cannot be numbered). A node whose GPUs
    nvidia-smi could not list is chosen for within its own CUDA_VISIBLE_DEVICES where that is set, else left as it
    was (a warning says so). Raises :class:`StartError` naming every node that cannot give the run its GPUs,
    :class:`GpusLeased` when only GPUs other runs hold are in the way."""
    job, planned = plan.job, {n.name for n in plan.nodes}
    readable = _readable(ready, planned)
    fewest = min((gpuchoice.idle_count(f, held.get(n, {}), job.run_id) for n, f in readable.items()), default=None)
    nodes, lines, warnings, env, refused = [], [], [], {}, {}
    leased = True  # every refusal is of GPUs other runs hold: `up --wait-gpus` may wait for them
    for node in inv.nodes:
        facts = readable.get(node.name)
        if facts is None:
            unread = ready[node.name].gpu_facts() if node.name in ready and node.name in planned else None
            if unread is not None and unread.smi:
                warnings += [*unread.problems, f"{node.name}: its GPUs could not be read: planned in plain order"]
            nodes.append(node)
            continue
        count = job.nproc_per_node or node.nproc_per_node or inv.defaults.nproc_per_node
        try:
            choice = gpuchoice.choose(facts, listed=node.gpus, count=count, held=held.get(node.name, {}),
                                      run_id=job.run_id, allow_busy=job.allow_busy_gpus, networked=plan.nnodes > 1,
                                      fewest_idle=fewest)
        except gpuchoice.GpuRefused as exc:
            refused[node.name] = exc.reason
            leased = leased and exc.leased
            nodes.append(node)
            continue
        update: dict[str, object] = {"gpus": list(choice.gpus)}
        if choice.node_env and count is None:
            update["nproc_per_node"] = len(facts.mig or facts.names)
        nodes.append(node.model_copy(update=update))
        lines += [choice.note] if choice.note else []
        warnings += choice.warnings
        env[node.name] = _gpu_env(node.name, facts, choice, job.cpu_bind, lines)
    if refused:
        if leased:
            raise GpusLeased(refused, hint=f"no node was started; {WAIT_HINT}")
        raise StartError(refused, hint=GPU_HINT)
    return inv.model_copy(update={"nodes": nodes}), lines, warnings, env


def _gpu_env(node: str, facts: NodeGpus, choice: gpuchoice.GpuChoice, cpu_bind: str,
             lines: list[str]) -> tuple[EnvVar, ...]:
    """The variables a node's GPU choice gives it (and the binding's line, added to ``lines``)."""
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
        lines.append(_binding_line(node, choice))
    return tuple(found)


def plan_with_facts(inv: Inventory, plan: LaunchPlan, ready: Mapping[str, ProbedNode]) -> tuple[Inventory, LaunchPlan]:
    """The inventory completed with the nodes' GPUs (:func:`choose_gpus`, clear of the GPUs other runs lease;
    for nodes nvidia-smi could not describe, :func:`with_free_gpus`) and network facts, and the plan made from it
    with the master port the master chose. A single node's NICs are not looked at (its ranks talk over loopback).
    Raises :class:`StartError` naming each node that cannot give the run its GPUs, or whose listed NICs,
    addresses or RDMA ports are not what the node has; :class:`GpusLeased` naming the GPUs other runs hold that
    this one needs.
    """
    given = inv
    held = held_gpus({name: r.leases for name, r in ready.items() if r.leases}, plan.run_id)
    inv, chosen, gpu_warnings, gpu_env = choose_gpus(inv, plan, ready, held)
    inv, found = with_free_gpus(inv, plan, {n: r for n, r in ready.items() if n not in gpu_env}, held)
    job, port = with_master_port(plan, ready)
    probed = (*chosen, *found, *port)
    if plan.nnodes < 2:
        if not probed and not gpu_warnings and not gpu_env and inv is given and job is plan.job:
            return inv, plan
        try:
            new = build_plan(inv, job, probed=(*plan.probed, *probed), gpu_env=gpu_env)
        except PlanError as exc:
            raise StartError({"plan": str(exc)}, hint=GPU_HINT) from None
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


FIRST_DELAY = 2.0
MAX_DELAY = 30.0


class GpuWait:
    """The waits of one ``up --wait-gpus [SECONDS]``: ``limit`` seconds in all (inf: no limit), each announced
    through ``say``.

    When the ready check finds GPUs the run needs leased by other runs (:class:`GpusLeased`), the agents are
    dropped, a line says who holds what and when the next look is, and the ready check runs again after a
    backoff (doubling from 2 s, at most 30 s: a queue of runs should not hammer the nodes' sshd, and a freed GPU
    should not idle long). Past the time limit the refusal stands, naming the holders."""

    def __init__(self, limit: float, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.limit, self.say, self.clock, self.sleep = limit, say, clock, sleep
        self.started = clock()
        self.waits = 0

    def again(self, refused: GpusLeased) -> bool:
        """Wait before the next ready check and return True; False when the time limit is past (the caller
        raises ``refused``)."""
        left = self.limit - (self.clock() - self.started)
        if left <= 0:
            return False
        delay = min(FIRST_DELAY * 2 ** self.waits, MAX_DELAY, left)
        self.waits += 1
        held = "; ".join(f"{node}: {why.split('; list other GPUs')[0].split('; two runs never')[0]}"
                         for node, why in refused.problems.items())
        limit = "" if math.isinf(self.limit) else f", giving up in {left:.0f}s"
        self.say(f"waiting for GPUs ({held}); next look in {delay:.0f}s{limit}")
        self.sleep(delay)
        return True


def with_restarts(inv: Inventory, plan: LaunchPlan, max_restarts: int) -> LaunchPlan:
    """``plan`` for a run that clusterrun may restart ``max_restarts`` times (the workers see it as
    TORCHELASTIC_MAX_RESTARTS): what ``up`` runs, and what ``up --dry-run`` shows."""
    if plan.job.restarts == max_restarts:
        return plan
    return dataclasses.replace(build_plan(inv, dataclasses.replace(plan.job, restarts=max_restarts)),
                               probed=plan.probed)
