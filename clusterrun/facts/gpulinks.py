"""How a node's GPUs connect, as ``nvidia-smi topo -m`` says it: each GPU's CPUs and memory node (the
:class:`Binding` of the local rank that runs on it), the best-linked set of ``k`` GPUs, and which GPUs reach
their nearest NIC only across the sockets. Pure.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from clusterrun.facts.parsers.topo import Device, LinkKind, Topology

#: Past this many candidate sets the best one is found greedily (by island and NUMA node) instead of by trying all.
MAX_SETS = 20000


@dataclass(frozen=True)
class Binding:
    """Where a local rank runs: its GPU's CPUs and memory node (None when the topology does not say)."""

    cpus: frozenset[int]
    numa: int | None

    def spec(self) -> str:
        """``0-51/0``: the CPU list, then the memory node after a slash when known."""
        return cpu_list(self.cpus) + ("" if self.numa is None else f"/{self.numa}")


def cpu_list(cpus: frozenset[int] | Sequence[int]) -> str:
    """``0-51,104-155`` (the kernel's list format, as taskset and numactl take it)."""
    out: list[list[int]] = []
    for cpu in sorted(cpus):
        if out and cpu == out[-1][1] + 1:
            out[-1][1] = cpu
        else:
            out.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


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


def nic_warnings(node: str, topology: Topology | None, gpus: Sequence[int]) -> list[str]:
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
