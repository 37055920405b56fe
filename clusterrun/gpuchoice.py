"""Which GPUs of a node a run takes, and the CPUs each of its ranks is bound to. Pure.

A GPU list the user gave (inventory ``gpus``, ``--gpus``) is used as given, within what the node allows; a
listed GPU that another run holds, or that is busy, is refused before anything starts. Without a list and
without a process count the run takes every GPU the node allows, one process each, and refuses (naming each
busy or held GPU and the ways out) rather than run fewer: the world size is what the user asked for. With a
process count it takes idle GPUs only (never one another run holds); when it needs fewer than the node has, the
set with the best links: one NVLink island, else one PCIe switch, else one NUMA node (lowest indices on a tie). Reasons, in
docs/gpus.md: one busy GPU slows every rank of a synchronous job; a set split across sockets pays the CPU
interconnect on every transfer between them, and its ranks' memory sits on the far socket.

Each chosen GPU's CPUs and memory node come from ``nvidia-smi topo -m`` (its CPU and NUMA affinity): the
:class:`Binding` of the local rank that runs on it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from clusterrun.facts.gpus import ALLOW_BUSY_FLAG, NPROC_FLAG, GpuUse, NodeGpus, span, whole_node
from clusterrun.facts.parsers.topo import Device, LinkKind, Topology

#: A GPU with more of its memory in use than this (by processes nvidia-smi may not list: another container's)
#: is busy; so is one with any compute process not of this run, or this busy.
BUSY_MEMORY_MIB = 1024
BUSY_UTILIZATION_PCT = 50
#: Past this many candidate sets the best one is found greedily (by island and NUMA node) instead of by trying all.
MAX_SETS = 20000


class GpuRefused(Exception):
    """The node cannot give the run the GPUs it needs; ``reason`` says which GPU and why. ``leased``: only GPUs
    other runs hold are in the way (they come free when those runs end: ``up --wait-gpus`` may wait)."""

    def __init__(self, node: str, reason: str, leased: bool = False) -> None:
        super().__init__(f"{node}: {reason}")
        self.node, self.reason, self.leased = node, reason, leased


@dataclass(frozen=True)
class Binding:
    """Where a local rank runs: its GPU's CPUs and memory node (None when the topology does not say)."""

    cpus: frozenset[int]
    numa: int | None

    def spec(self) -> str:
        """``0-51/0``: the CPU list, then the memory node after a slash when known."""
        return cpu_list(self.cpus) + ("" if self.numa is None else f"/{self.numa}")


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


def cpu_list(cpus: frozenset[int] | Sequence[int]) -> str:
    """``0-51,104-155`` (the kernel's list format, as taskset and numactl take it)."""
    out: list[list[int]] = []
    for cpu in sorted(cpus):
        if out and cpu == out[-1][1] + 1:
            out[-1][1] = cpu
        else:
            out.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def busy(gpu: GpuUse, run_id: str = "") -> str | None:
    """Why ``gpu`` is busy (its other processes, its memory or utilisation), or None when it is idle. Processes
    of run ``run_id`` (the run's own, on a restart) do not count."""
    others = [p for p in gpu.processes if not (run_id and p.run_id == run_id)]
    if others:
        return "busy: " + "; ".join(p.describe() for p in others)
    if len(others) < len(gpu.processes):
        return None  # what is in use is this run's own
    if gpu.memory_used_mib is not None and gpu.memory_used_mib > BUSY_MEMORY_MIB:
        total = f" of {gpu.memory_total_mib}" if gpu.memory_total_mib else ""
        return f"busy: {gpu.memory_used_mib}{total} MiB in use by processes nvidia-smi does not list"
    if gpu.utilization_pct is not None and gpu.utilization_pct >= BUSY_UTILIZATION_PCT:
        return f"busy: {gpu.utilization_pct} % utilised"
    return None


def _device(topology: Topology | None, index: int) -> Device | None:
    if topology is None:
        return None
    try:
        return topology.device(f"GPU{index}")
    except KeyError:
        return None


def binding(topology: Topology | None, index: int) -> Binding | None:
    """The CPUs and memory node of GPU ``index`` by the topology; None when it gives no CPU affinity."""
    device = _device(topology, index)
    if device is None or not device.cpus:
        return None
    numa = sorted(device.numa_nodes)
    return Binding(device.cpus, numa[0] if len(numa) == 1 else device.gpu_numa_id)


def _islands(topology: Topology) -> dict[int, int]:
    """GPU index -> the lowest index of its NVLink island (GPUs joined by NVLink, directly or through others)."""
    gpus = [d.gpu_index for d in topology.gpus if d.gpu_index is not None]
    island = {g: g for g in gpus}
    for a, b in itertools.combinations(gpus, 2):
        if topology.link(f"GPU{a}", f"GPU{b}").kind is LinkKind.NVLINK:
            low, high = sorted((island[a], island[b]))
            island = {g: (low if i == high else i) for g, i in island.items()}
    return island


def _numa(topology: Topology, index: int) -> int | None:
    b = binding(topology, index)
    return b.numa if b is not None else None


def best_set(topology: Topology, candidates: Sequence[int], k: int) -> tuple[tuple[int, ...], str]:
    """The ``k`` of ``candidates`` with the best links, and why: fewest NVLink islands, then the closest worst
    link between two of them (NVLink, PIX, PXB, PHB, NODE, SYS), then fewest NUMA nodes, then the lowest indices.
    Raises KeyError when a candidate is not in the topology."""
    island = _islands(topology)
    numa = {i: _numa(topology, i) for i in candidates}  # KeyError for a GPU the matrix lacks
    rank = {(a, b): topology.link(f"GPU{a}", f"GPU{b}").kind.rank for a, b in itertools.combinations(candidates, 2)}
    rank.update({(b, a): r for (a, b), r in list(rank.items())})

    def key(combo: tuple[int, ...]) -> tuple[int, int, int, tuple[int, ...]]:
        worst = max((rank[pair] for pair in itertools.combinations(combo, 2)), default=0)
        return (len({island[i] for i in combo}), worst, len({numa[i] for i in combo}), combo)

    ordered = sorted(candidates)
    if math.comb(len(ordered), k) <= MAX_SETS:
        chosen = min(itertools.combinations(ordered, k), key=key)
    else:  # too many sets to try: by island, then NUMA node, then index
        chosen = tuple(sorted(sorted(ordered, key=lambda i: (island[i], numa[i] or 0, i))[:k]))
    return chosen, _why(topology, chosen, island)


def _why(topology: Topology, chosen: Sequence[int], island: Mapping[int, int]) -> str:
    words = []
    links = [topology.link(f"GPU{a}", f"GPU{b}") for a, b in itertools.combinations(chosen, 2)]
    if links and all(link.kind is LinkKind.NVLINK for link in links):
        words.append(f"one NVLink island (NV{min(link.nvlinks for link in links)})")
    elif links:
        kind = max((link.kind for link in links), key=lambda k: k.rank)
        words.append({LinkKind.PIX: "one PCIe switch (PIX)", LinkKind.PXB: "one PCIe switch (PXB)",
                      LinkKind.PHB: "one PCIe host bridge (PHB)", LinkKind.NODE: "within one NUMA node's PCIe (NODE)",
                      }.get(kind, f"across sockets ({kind.value}): no closer set is idle"))
        if len({island[i] for i in chosen}) == 1:
            words.append("one NVLink island")
    numa = {_numa(topology, i) for i in chosen}
    if len(numa) == 1 and None not in numa:
        words.append(f"one NUMA node ({numa.pop()})")
    return ", ".join(words) or "the first idle ones"


def _nic_warnings(node: str, topology: Topology | None, gpus: Sequence[int]) -> list[str]:
    out = []
    for rank, index in enumerate(gpus):
        if _device(topology, index) is None or topology is None:
            continue
        nics = topology.nearest_nics(f"GPU{index}")
        if nics and topology.link(f"GPU{index}", nics[0].name).kind is LinkKind.SYS:
            names = ", ".join(n.hca or n.name for n in nics)
            out.append(f"{node}: local rank {rank} (GPU {index}) reaches its nearest NIC ({names}) only across the CPU "
                       "interconnect (SYS): its traffic to other nodes crosses sockets")
    return out


def _left_out(reasons: Mapping[int, str], chosen: Sequence[int]) -> str:
    skipped = [f"GPU {i} {why}" for i, why in sorted(reasons.items()) if i not in chosen]
    return f"; left out: {'; '.join(skipped)}" if skipped else ""


def _reasons(facts: NodeGpus, held: Mapping[int, str], run_id: str) -> dict[int, str]:
    """Each GPU the node offers that another run holds or that is busy: why."""
    reasons: dict[int, str] = {}
    for index in facts.offered:
        gpu = facts.gpu(index)
        why = f"held by {held[index]}" if index in held else (busy(gpu, run_id) if gpu is not None else None)
        if why:
            reasons[index] = why
    return reasons


def idle_count(facts: NodeGpus, held: Mapping[int, str] | None = None, run_id: str = "") -> int:
    """How many GPUs the node offers that are idle and that no other run holds: the most ``--nproc-per-node`` may
    ask of it."""
    if facts.node_env:
        return len(facts.mig or facts.names)
    return len(facts.offered) - len(_reasons(facts, held or {}, run_id))


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
    in_way = [i for i in offered if i in reasons and (i in held or not allow_busy)]
    if in_way:
        busy_ones = [i for i in in_way if i not in held]
        idle = len(offered) - len(reasons)
        raise GpuRefused(facts.node, whole_node(offered, [f"GPU {i} is {reasons[i]}" for i in in_way],
                                                idle if fewest_idle is None else min(idle, fewest_idle),
                                                busy=bool(busy_ones), leased=len(busy_ones) < len(in_way)),
                         leased=not busy_ones)
    return tuple(offered)


def choose(facts: NodeGpus, *, listed: Sequence[int] = (), count: int | None = None,
           held: Mapping[int, str] | None = None, run_id: str = "", allow_busy: bool = False,
           networked: bool = False, fewest_idle: int | None = None) -> GpuChoice:
    """The GPUs a run takes on the node ``facts`` describes.

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
    reasons = _reasons(facts, held, run_id)
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
        warnings += _nic_warnings(node, facts.topology, chosen)
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
