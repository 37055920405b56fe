"""Which GPUs of each node a run takes: the one GPU decision of ``up`` (and of ``plan --probe``), one verb per
step, on the one model of a node's GPUs (:mod:`clusterrun.facts.gpus`, which doctor's GPU checks read too):

1. :func:`found`: what each node has: the nodes whose reporter says which GPUs a run may take there.
2. :func:`in_way`: what is busy (:func:`clusterrun.facts.gpus.busy`, the rule doctor's ``gpu.busy`` applies)
   or leased by another run: never taken unless the user allows busy ones; a leased one never.
3. :func:`choose`: the GPUs one node gives this run; :func:`counted` for the nodes nvidia-smi could not describe.
4. :func:`for_run`: every node of the run, or the refusal naming each node, GPU and why.

A GPU list the user gave (inventory ``gpus``, ``--gpus``) is used as given, within what the node allows; a
listed GPU that another run holds, or that is busy, is refused before anything starts. Without a list and
without a process count the run takes every GPU the node allows, one process each, and refuses (naming each
busy or held GPU and the ways out) rather than run fewer: the world size is what the user asked for. With a
process count it takes idle GPUs only (never one another run holds); when it needs fewer than the node has, the
set with the best links (:func:`clusterrun.facts.gpulinks.best_set`). Reasons, in docs/gpus.md: one busy GPU
slows every rank of a synchronous job; a set split across sockets pays the CPU interconnect on every transfer
between them, and its ranks' memory sits on the far socket. Each chosen GPU's CPUs and memory node come from
``nvidia-smi topo -m``: the :class:`~clusterrun.facts.gpulinks.Binding` of the local rank that runs on it. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from clusterrun.errors import GpusLeased, StartError
from clusterrun.facts.gpulinks import Binding, best_set, binding, cpu_list, nic_warnings
from clusterrun.facts.gpus import NodeGpus, busy, span
from clusterrun.facts.node import ProbedNode
from clusterrun.inventory.models import Inventory, Node
from clusterrun.planning.plan import LaunchPlan

ALLOW_BUSY_FLAG = "--allow-busy-gpus"
NPROC_FLAG = "--nproc-per-node"
WAIT_HINT = "two runs never share a GPU: `up --wait-gpus` waits until they are free"
GPU_HINT = "no node was started; `clusterrun plan --probe` shows each node's GPUs (docs/gpus.md: how they are chosen)"
#: Held GPUs of each node: GPU index -> the run that holds it (see :func:`clusterrun.facts.leases.held_gpus`).
Held = Mapping[str, Mapping[int, str]]


class GpuRefused(Exception):
    """The node cannot give the run the GPUs it needs; ``reason`` says which GPU and why. ``leased``: only GPUs
    other runs hold are in the way (they come free when those runs end: ``up --wait-gpus`` may wait)."""

    def __init__(self, node: str, reason: str, leased: bool = False) -> None:
        super().__init__(f"{node}: {reason}")
        self.node, self.reason, self.leased = node, reason, leased


@dataclass(frozen=True)
class GpuChoice:
    """The GPUs of one node in local rank order (physical indices), why they were taken (None when a listed set
    was used as given), warnings, each local rank's :class:`Binding` (None where unknown); ``node_env``: the
    node's own CUDA_VISIBLE_DEVICES is kept (MIG instances)."""

    node: str
    gpus: tuple[int, ...]
    note: str | None = None
    warnings: tuple[str, ...] = ()
    bindings: tuple[Binding | None, ...] = ()
    node_env: bool = False

    def cpu_bind(self) -> str | None:
        """The value of CLUSTERRUN_CPU_BIND: each local rank's binding, ``;`` between ranks ("" where unknown);
        None when no rank has one."""
        if not any(self.bindings):
            return None
        return ";".join(b.spec() if b else "" for b in self.bindings)


def found(ready: Mapping[str, ProbedNode], planned: set[str]) -> dict[str, NodeGpus]:
    """Step 1: the GPU facts of each planned node that says which GPUs a run may take: nvidia-smi listed them, or
    it could not but the node's CUDA_VISIBLE_DEVICES limits a node that has GPUs (the reporter counted some)."""
    out: dict[str, NodeGpus] = {}
    for name, r in ready.items():
        facts = r.gpu_facts() if name in planned else None
        if facts is not None and (facts.gpus or (facts.limited and r.gpus != 0)):
            out[name] = facts
    return out


def in_way(facts: NodeGpus, held: Mapping[int, str], run_id: str = "") -> dict[int, str]:
    """Step 2: each GPU the node offers that another run holds or that is busy (:func:`busy`), and why."""
    reasons: dict[int, str] = {}
    for index in facts.offered:
        gpu = facts.gpu(index)
        why = f"held by {held[index]}" if index in held else (busy(gpu, run_id) if gpu is not None else None)
        if why:
            reasons[index] = why
    return reasons


def whole_node(node_gpus: Sequence[int], blocked: Sequence[str], idle: int, *, any_busy: bool, leased: bool) -> str:
    """Why a run without a process count cannot start on a node (it takes every GPU the node allows,
    ``node_gpus``): ``blocked``, each GPU that is busy or leased in words; and the ways out: ``--nproc-per-node``
    with ``idle`` (the fewest idle GPUs of a node), and ``--allow-busy-gpus`` or ``up --wait-gpus``."""
    whole = f"without a process count the run takes every GPU the node allows ({span(node_gpus)}), one process each"
    if any_busy:
        why = f"{whole}, and one busy GPU slows every rank of the job" + (
            " (and two runs never share a GPU)" if leased else "")
    else:
        why = f"two runs never share a GPU, and {whole}"
    outs = [f"`{NPROC_FLAG} {idle}` takes the {idle} best idle GPU{'s' if idle > 1 else ''} on every node"
            ] if idle else []
    outs.append(f"add {ALLOW_BUSY_FLAG} to use busy GPUs anyway" if any_busy else
                "`up --wait-gpus` waits until they are free")
    return f"{'; '.join(blocked)}; {why}: {', or '.join(outs)}"


def _left_out(reasons: Mapping[int, str], chosen: Sequence[int]) -> str:
    skipped = [f"GPU {i} {why}" for i, why in sorted(reasons.items()) if i not in chosen]
    return f"; left out: {'; '.join(skipped)}" if skipped else ""


def idle_count(facts: NodeGpus, held: Mapping[int, str] | None = None, run_id: str = "") -> int:
    """How many GPUs the node offers that are idle and that no other run holds: the most ``--nproc-per-node`` may
    ask of it."""
    if facts.node_env:
        return len(facts.mig or facts.names)
    return len(facts.offered) - len(in_way(facts, held or {}, run_id))


def _kept(facts: NodeGpus, listed: Sequence[int], count: int | None, warnings: list[str]) -> GpuChoice:
    """The node's CUDA_VISIBLE_DEVICES names GPUs that cannot be numbered: it is kept as the node sets it."""
    node, kept = facts.node, facts.mig or facts.names
    what = (f"{len(kept)} MIG instance(s)" if facts.mig
            else f"{len(kept)} GPU(s) by UUID, which cannot be numbered without nvidia-smi's list")
    if listed:
        named = "MIG instances" if facts.mig else "GPUs by UUID, which cannot be numbered without nvidia-smi's list"
        raise GpuRefused(node, f"gpus {span(listed)} are listed, but the node's CUDA_VISIBLE_DEVICES names {named} "
                               f"({facts.visible}); leave the GPU list out to run on them")
    need = count or len(kept)
    if need > len(kept):
        raise GpuRefused(node, f"{need} processes need as many GPUs, but the node's CUDA_VISIBLE_DEVICES names {what}")
    return GpuChoice(node, (), f"{node}: the node's CUDA_VISIBLE_DEVICES names {what}: {need} process(es), "
                               "CUDA_VISIBLE_DEVICES as the node sets it", tuple(warnings), node_env=True)


def _whole_node(facts: NodeGpus, reasons: Mapping[int, str], held: Mapping[int, str], allow_busy: bool,
                fewest_idle: int | None) -> tuple[int, ...]:
    """Without a process count: every GPU the node offers, one process each; raises :class:`GpuRefused` where one
    of them is busy (without ``allow_busy``) or held, naming each with both ways out."""
    offered = facts.offered
    blocking = [i for i in offered if i in reasons and (i in held or not allow_busy)]
    if blocking:
        busy_ones = [i for i in blocking if i not in held]
        idle = len(offered) - len(reasons)
        raise GpuRefused(facts.node, whole_node(offered, [f"GPU {i} is {reasons[i]}" for i in blocking],
                                                idle if fewest_idle is None else min(idle, fewest_idle),
                                                any_busy=bool(busy_ones), leased=len(busy_ones) < len(blocking)),
                         leased=not busy_ones)
    return tuple(offered)


def choose(facts: NodeGpus, *, listed: Sequence[int] = (), count: int | None = None,
           held: Mapping[int, str] | None = None, run_id: str = "", allow_busy: bool = False,
           networked: bool = False, fewest_idle: int | None = None) -> GpuChoice:
    """Step 3: the GPUs a run takes on the node ``facts`` describes.

    ``listed``: the GPUs the user gave (used as given); ``count``: the processes wanted (None: one per GPU the
    node offers); ``held``: GPU index -> the run that holds its lease (never taken); ``run_id``: this run (its own
    processes do not make a GPU busy); ``allow_busy``: take busy GPUs too (``--allow-busy-gpus``); ``networked``:
    the ranks talk to other nodes (a rank whose nearest NIC is across the sockets is warned of); ``fewest_idle``:
    the fewest idle GPUs of any node of the run (what a refusal suggests for ``--nproc-per-node``).

    Raises :class:`GpuRefused` naming the GPU and why: a listed GPU the node does not offer, another run holds,
    or that is busy (without ``allow_busy``); without a count, any GPU the node offers that is held or busy (the
    world size is never cut); fewer usable GPUs than ``count``.
    """
    node, held = facts.node, held or {}
    warnings = list(facts.problems)
    if facts.node_env:
        return _kept(facts, listed, count, warnings)
    offered = facts.offered
    reasons = in_way(facts, held, run_id)
    where = (f"the node's CUDA_VISIBLE_DEVICES={facts.visible} allows GPUs {span(offered) or 'none'}"
             if facts.allowed is not None else f"nvidia-smi lists GPUs {span(facts.indices)}")
    unread = "" if facts.gpus else ("; no nvidia-smi there" if not facts.smi else "; nvidia-smi could not list the GPUs")
    note: str | None = None
    if listed:
        for index in listed:
            if index not in offered:
                raise GpuRefused(node, f"GPU {index} is listed, but the node does not offer it ({where})")
            if index in held:
                raise GpuRefused(node, f"GPU {index} is held by {held[index]}", leased=True)
        taken = [i for i in listed if i in reasons]
        if taken and not allow_busy:
            i = taken[0]
            raise GpuRefused(node, f"GPU {i} is {reasons[i]}; one busy GPU slows every rank of the job: list idle "
                                   f"GPUs, or add {ALLOW_BUSY_FLAG} to use it anyway")
        warnings += [f"{node}: GPU {i} is {reasons[i]}; used anyway ({ALLOW_BUSY_FLAG})" for i in taken]
        chosen = tuple(listed)
    else:
        if not offered:
            return GpuChoice(node, (), f"{node}: {where}: CPU processes", tuple(warnings))
        if count is None:
            chosen = _whole_node(facts, reasons, held, allow_busy, fewest_idle)
            warnings += [f"{node}: GPU {i} is {reasons[i]}; used anyway ({ALLOW_BUSY_FLAG})" for i in chosen
                         if i in reasons]
            note = f"{node}: {len(chosen)} GPU(s) {'allowed' if unread else 'seen'}, one process each (gpus: {span(chosen)})"
        else:
            chosen, note = _best(facts, reasons, held, allow_busy, count, where, warnings)
        if facts.allowed is not None:
            note += f" (the node's CUDA_VISIBLE_DEVICES={facts.visible}" + (
                f"{unread}: its GPUs as it numbers them, not renumbered)" if unread else ")")
        note += _left_out(reasons, chosen)
    if networked:
        warnings += nic_warnings(node, facts.topology, chosen)
    return GpuChoice(node, chosen, note, tuple(warnings), tuple(binding(facts.topology, i) for i in chosen))


def _best(facts: NodeGpus, reasons: Mapping[int, str], held: Mapping[int, str], allow_busy: bool, need: int,
          where: str, warnings: list[str]) -> tuple[tuple[int, ...], str]:
    """``need`` GPUs of those the node offers, idle ones only (busy ones too with ``allow_busy``, never held
    ones), the best-linked set; and the line that says which and why. Raises :class:`GpuRefused` when too few."""
    node, offered = facts.node, facts.offered
    idle = [i for i in offered if i not in reasons]
    usable = [i for i in offered if i not in reasons or (allow_busy and i not in held)]
    if need == 0 or need > len(usable):
        others = "; ".join(f"GPU {i} {why}" for i, why in sorted(reasons.items())) or where
        fixes = [f"{ALLOW_BUSY_FLAG} takes busy ones too" if not allow_busy and len(usable) < len(offered)
                 - len([i for i in offered if i in held]) else "",
                 f"ask for fewer processes ({NPROC_FLAG})" if usable else ""]
        # Only leases in the way: enough GPUs would be usable once the runs holding them end.
        leased = bool(need) and need <= len([i for i in offered if i in held or i in usable])
        raise GpuRefused(node, f"{need} GPU(s) needed, {len(idle)} of {len(offered)} idle ({others}); "
                               + (", or ".join(w for w in fixes if w) or "wait for them or list other GPUs"),
                         leased=leased)
    if need == len(usable):
        chosen = tuple(usable)
        return chosen, f"{node}: GPUs {span(chosen)} for {need} process(es)"
    why = ""
    if facts.topology:
        try:
            chosen, why = best_set(facts.topology, usable, need)
        except KeyError as exc:  # the matrix lacks a GPU nvidia-smi lists
            warnings.append(f"{node}: nvidia-smi topo -m has no {exc.args[0]}: GPUs taken in index order")
            chosen = tuple(usable[:need])
    else:
        chosen = tuple(usable[:need])
    if not why:
        why = ("the first idle ones" + ("" if facts.topology else " (the topology is not known)") if facts.gpus
               else "the first the node allows, in its order")
    return chosen, f"{node}: GPUs {span(chosen)} for {need} process(es): {why}"


def every_gpu(inv: Inventory, offered: Mapping[str, Sequence[int] | None],
              nproc_given: bool) -> tuple[Inventory, list[str]]:
    """Nodes whose GPUs nobody listed (a one-liner without --gpus, an inventory node without ``gpus``) and whose
    process count nobody set (``nproc_given``: a command-line count) get every GPU the node sees (``offered``: the
    physical indices the reporter found, :func:`clusterrun.facts.gpus.offered_indices`), one process each, as
    ``torchrun --nproc-per-node gpu`` does. Returns the inventory so completed and a line per node that was."""
    if nproc_given or inv.defaults.nproc_per_node is not None:
        return inv, []
    nodes, lines = [], []
    for node in inv.nodes:
        indices = offered.get(node.name)
        if node.gpus or node.nproc_per_node is not None or not indices:
            if indices is not None and not indices and "gpus" not in node.model_fields_set \
                    and node.nproc_per_node is None:
                lines.append(f"{node.name}: no GPU seen: one CPU process (--nproc-per-node for more)")
            nodes.append(node)
            continue
        nodes.append(node.model_copy(update={"gpus": list(indices)}))
        lines.append(f"{node.name}: {len(indices)} GPU(s) seen, one process each (gpus: {span(indices)})")
    changed = any(a is not b for a, b in zip(nodes, inv.nodes, strict=True))
    return (inv.model_copy(update={"nodes": nodes}) if changed else inv), lines


def _holders(gpus: list[int], held: Mapping[int, str]) -> str:
    return "; ".join(f"GPU {g} is leased by {held[g]}" for g in gpus)


def spare_leased(given: Inventory, completed: Inventory, nproc: int | None, offered: Mapping[str, Sequence[int] | None],
                 held: Held) -> tuple[Inventory, list[str], dict[str, str]]:
    """For nodes nvidia-smi could not describe (no use to judge, only leases): ``completed`` (see
    :func:`every_gpu`) with each node's GPUs clear of ``held``; a line per node whose GPUs changed, and per node a
    problem where the run cannot have the GPUs it needs.

    ``given``: the inventory as the user gave it (which nodes listed their GPUs); ``nproc``: the command line's
    process count; ``offered``: the physical indices of the GPUs each node offers. A listed GPU another run holds
    refuses the run; without a process count so does any GPU of the node (never a smaller world size); with one,
    that many GPUs nobody holds, in index order."""
    listed = {n.name for n in given.nodes if n.gpus}
    nodes: list[Node] = []
    lines: list[str] = []
    problems: dict[str, str] = {}
    for node in completed.nodes:
        here = held.get(node.name) or {}
        pool = list(offered.get(node.name) or ())
        want = nproc or node.nproc_per_node or completed.defaults.nproc_per_node
        if node.spare or (not here and (node.gpus or not want or not pool)):
            nodes.append(node)
            continue
        if node.name in listed or not want:
            taken = [g for g in node.gpus or pool if g in here]
            if taken and node.name in listed:
                problems[node.name] = f"{_holders(taken, here)}; list other GPUs, or {WAIT_HINT}"
            elif taken:
                free = len([g for g in pool if g not in here])
                problems[node.name] = whole_node(node.gpus or pool, [f"GPU {g} is leased by {here[g]}" for g in taken],
                                                 free, any_busy=False, leased=True)
            nodes.append(node)
            continue
        free = [g for g in pool if g not in here]
        if len(free) < want:
            if here:  # without leases, a count above the GPUs is the user's to give (as before)
                problems[node.name] = (f"{want} GPU(s) needed, {len(free)} of {len(pool)} free; "
                                       f"{_holders(sorted(here), here)}; {WAIT_HINT}")
            nodes.append(node)
            continue
        chosen = free[:want]
        nodes.append(node.model_copy(update={"gpus": chosen}))
        lines.append(f"{node.name}: {_holders(sorted(here), here)}; this run takes GPU(s) {','.join(map(str, chosen))}"
                     if here else f"{node.name}: {len(pool)} GPU(s) seen, {want} process(es) take GPU(s) "
                     f"{','.join(map(str, chosen))}")
    changed = any(a is not b for a, b in zip(nodes, completed.nodes, strict=True))
    return (completed.model_copy(update={"nodes": nodes}) if changed else completed), lines, problems


def _binding_line(node: str, choice: GpuChoice) -> str:
    groups: dict[str, list[int]] = {}
    for gpu, bound in zip(choice.gpus, choice.bindings, strict=True):
        if bound is not None:
            where = f"CPUs {cpu_list(bound.cpus)}" + ("" if bound.numa is None else f", NUMA node {bound.numa}")
            groups.setdefault(where, []).append(gpu)
    return f"{node}: each rank on its GPU's CPUs (--cpu-bind numa): " + "; ".join(
        f"GPU {span(gpus)} on {where}" for where, gpus in groups.items())


@dataclass(frozen=True)
class RunGpus:
    """Step 4's answer: the inventory with each node's GPUs, a line per node saying which and why, warnings, and
    each node whose nvidia-smi described its GPUs with its facts and :class:`GpuChoice`."""

    inventory: Inventory
    lines: tuple[str, ...]
    warnings: tuple[str, ...]
    choices: Mapping[str, tuple[NodeGpus, GpuChoice]]


def for_run(inv: Inventory, plan: LaunchPlan, ready: Mapping[str, ProbedNode], held: Held) -> RunGpus:
    """Step 4: each node's GPUs from what it reported: :func:`choose` where nvidia-smi described them (or the
    node's CUDA_VISIBLE_DEVICES limits them), else every GPU it counted (:func:`every_gpu`) clear of other runs'
    leases (:func:`spare_leased`); a node whose GPUs could not be read is planned in plain order (a warning says
    so). Raises :class:`GpusLeased` when only GPUs other runs hold are in the way, else :class:`StartError`,
    naming every node that cannot give the run its GPUs."""
    job, planned = plan.job, {n.name for n in plan.nodes}
    readable = found(ready, planned)
    fewest = min((idle_count(f, held.get(n, {}), job.run_id) for n, f in readable.items()), default=None)
    nodes, lines, warnings, choices, refused = [], [], [], {}, {}
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
            choice = choose(facts, listed=node.gpus, count=count, held=held.get(node.name, {}), run_id=job.run_id,
                            allow_busy=job.allow_busy_gpus, networked=plan.nnodes > 1, fewest_idle=fewest)
        except GpuRefused as exc:
            refused[node.name] = exc.reason
            leased = leased and exc.leased
            nodes.append(node)
            continue
        update: dict[str, object] = {"gpus": list(choice.gpus)}
        if choice.node_env and count is None:
            update["nproc_per_node"] = len(facts.mig or facts.names)
        nodes.append(node.model_copy(update=update))
        lines += [choice.note] if choice.note else []
        lines += [_binding_line(node.name, choice)] if job.cpu_bind == "numa" and choice.cpu_bind() else []
        warnings += choice.warnings
        choices[node.name] = (facts, choice)
    if refused:
        if leased:
            raise GpusLeased(refused, hint=f"no node was started; {WAIT_HINT}")
        raise StartError(refused, hint=GPU_HINT)
    chosen = inv.model_copy(update={"nodes": nodes})
    rest = {n: r for n, r in ready.items() if n not in choices}
    offered = {name: r.gpu_indices() for name, r in rest.items()}
    completed, seen = every_gpu(chosen, offered, job.nproc_per_node is not None)
    completed, spared, problems = spare_leased(chosen, completed, job.nproc_per_node, offered, held)
    if problems:
        raise GpusLeased(problems, hint="no node was started")
    return RunGpus(completed, (*lines, *seen, *spared), tuple(warnings), choices)
