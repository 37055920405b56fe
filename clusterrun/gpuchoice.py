"""Which GPUs of a node a run takes, and the CPUs each of its ranks is bound to. Pure.

A GPU list the user gave (inventory ``gpus``, ``--gpus``) is used as given, within what the node allows; a
listed GPU that another run holds, or that is busy, is refused before anything starts. Without a list the run
takes idle GPUs only (never one another run holds); when it needs fewer than the node has, the set with the
best links: one NVLink island, else one PCIe switch, else one NUMA node (lowest indices on a tie). Reasons, in
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

from clusterrun.facts.gpus import GpuUse, NodeGpus, span
from clusterrun.facts.parsers.topo import Device, LinkKind, Topology

#: A GPU with more of its memory in use than this (by processes nvidia-smi may not list: another container's)
#: is busy; so is one with any compute process not of this run, or this busy.
BUSY_MEMORY_MIB = 1024
BUSY_UTILIZATION_PCT = 50
ALLOW_BUSY_FLAG = "--allow-busy-gpus"
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


def choose(facts: NodeGpus, *, listed: Sequence[int] = (), count: int | None = None,
           held: Mapping[int, str] | None = None, run_id: str = "", allow_busy: bool = False,
           networked: bool = False) -> GpuChoice:
    """The GPUs a run takes on the node ``facts`` describes.

    ``listed``: the GPUs the user gave (used as given); ``count``: the processes wanted (None: one per idle GPU);
    ``held``: GPU index -> the run that holds its lease (never taken); ``run_id``: this run (its own processes
    do not make a GPU busy); ``allow_busy``: take busy GPUs too (``--allow-busy-gpus``); ``networked``: the
    ranks talk to other nodes (a rank whose nearest NIC is across the sockets is warned of).

    Raises :class:`GpuRefused` naming the GPU and why: a listed GPU the node does not offer, another run holds,
    or that is busy (without ``allow_busy``); fewer usable GPUs than ``count``.
    """
    node, held = facts.node, held or {}
    warnings = list(facts.problems)
    if facts.mig:
        if listed:
            raise GpuRefused(node, f"gpus {span(listed)} are listed, but the node's CUDA_VISIBLE_DEVICES names MIG "
                                   f"instances ({facts.visible}); leave the GPU list out to run on them")
        need = count or len(facts.mig)
        if need > len(facts.mig):
            raise GpuRefused(node, f"{need} processes need as many GPUs, but the node's CUDA_VISIBLE_DEVICES names "
                                   f"{len(facts.mig)} MIG instance(s)")
        return GpuChoice(node, (), f"{node}: the node's CUDA_VISIBLE_DEVICES names {len(facts.mig)} MIG instance(s): "
                                   f"{need} process(es), CUDA_VISIBLE_DEVICES as the node sets it", tuple(warnings),
                         node_env=True)
    offered = facts.offered
    reasons: dict[int, str] = {}
    for index in offered:
        gpu = facts.gpu(index)
        why = f"held by {held[index]}" if index in held else (busy(gpu, run_id) if gpu is not None else None)
        if why:
            reasons[index] = why
    where = (f"the node's CUDA_VISIBLE_DEVICES={facts.visible} allows GPUs {span(offered) or 'none'}"
             if facts.allowed is not None else f"nvidia-smi lists GPUs {span(facts.indices)}")
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
        idle = [i for i in offered if i not in reasons]
        usable = [i for i in offered if i not in reasons or (allow_busy and i not in held)]
        need = len(usable) if count is None else count
        if not offered:
            return GpuChoice(node, (), f"{node}: {where}: CPU processes", tuple(warnings))
        if need == 0 or need > len(usable):
            others = "; ".join(f"GPU {i} {why}" for i, why in sorted(reasons.items()))
            fixes = [f"{ALLOW_BUSY_FLAG} takes busy ones too" if not allow_busy and len(usable) < len(offered)
                     - len([i for i in offered if i in held]) else "",
                     "ask for fewer processes (--nproc-per-node)" if count and usable else ""]
            wanted = f"{need} GPU(s) needed" if need else "no idle GPU"
            # Only leases in the way: enough GPUs would be usable once the runs holding them end.
            leased = bool(need) and need <= len([i for i in offered if i in held or i in usable])
            raise GpuRefused(node, f"{wanted}, {len(idle)} of {len(offered)} idle ({others}); "
                                   + (", or ".join(w for w in fixes if w) or "wait for them or list other GPUs"),
                             leased=leased)
        if need == len(usable):
            chosen = tuple(usable)
            if count is not None:
                note = f"{node}: GPUs {span(chosen)} for {need} process(es)"
            elif len(chosen) < len(offered):
                note = f"{node}: {len(chosen)} idle GPU(s) of {len(offered)}, one process each (gpus: {span(chosen)})"
            else:
                note = f"{node}: {len(chosen)} GPU(s) seen, one process each (gpus: {span(chosen)})"
        else:
            try:
                chosen, why = best_set(facts.topology, usable, need) if facts.topology else (tuple(usable[:need]), "")
            except KeyError as exc:  # the matrix lacks a GPU nvidia-smi lists
                warnings.append(f"{node}: nvidia-smi topo -m has no {exc.args[0]}: GPUs taken in index order")
                chosen, why = tuple(usable[:need]), ""
            if not why:
                why = "the first idle ones" + ("" if facts.topology else " (the topology is not known)")
            note = f"{node}: GPUs {span(chosen)} for {need} process(es): {why}"
        if facts.allowed is not None:
            note += f" (the node's CUDA_VISIBLE_DEVICES={facts.visible})"
        note += _left_out(reasons, chosen)
    if networked:
        warnings += _nic_warnings(node, facts.topology, chosen)
    return GpuChoice(node, chosen, note, tuple(warnings), tuple(binding(facts.topology, i) for i in chosen))
