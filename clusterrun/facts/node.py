"""A node's facts as its reporter says them: the one model of a node's NICs, RDMA ports and GPUs.

Every command that needs to know what a node has runs the same node-side reporter
(``clusterrun/remote/nodefacts.py``): ``up`` in its ready check, ``plan --probe``, ``init``, and doctor.
:func:`parse_report` turns what it printed into a :class:`NodeReport`; ``up``/``plan``/``init`` read the
network part as :class:`NetFacts` (see :func:`read_facts`), doctor's checks read the whole record; both give
nodes nobody listed GPUs for the ones the reporter counted (:func:`clusterrun.planning.gpuchoice.every_gpu`). Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterrun.errors import ParseError
from clusterrun.facts import gpus as gpu_facts
from clusterrun.facts.parsers import ibstat, ip

TOOL = "nodefacts"
#: The line the reporter prints (remote/nodefacts.py LINE).
LINE = "CLUSTERRUN-FACTS "
#: What the reporter runs for the interfaces, and where it reads the RDMA ports (for evidence).
IP_COMMAND = "ip -j addr show"
RDMA_SOURCE = "/sys/class/infiniband"


@dataclass(frozen=True)
class RdmaPort:
    """One RDMA port, from ``/sys/class/infiniband/<hca>/ports/<port>/``; a field is "" when unreadable."""

    hca: str
    port: int
    state: str  # "4: ACTIVE"
    link_layer: str  # "InfiniBand" or "Ethernet"
    netdevs: tuple[str, ...]  # the interfaces of the port's device
    phys_state: str = ""  # "5: LinkUp"
    rate: str = ""  # "100 Gb/sec (2X HDR)"

    @property
    def active(self) -> bool:
        return self.state.upper().endswith("ACTIVE")

    @property
    def port_state(self) -> ibstat.PortState | None:
        return ibstat.sysfs_state(self.state) if self.state else None

    @property
    def physical_state(self) -> ibstat.PhysState | None:
        return ibstat.sysfs_phys_state(self.phys_state) if self.phys_state else None

    @property
    def rate_gbps(self) -> float | None:
        return ibstat.sysfs_rate(self.rate) if self.rate else None

    def line(self) -> str:
        """One line of the listing doctor shows as evidence: ``mlx5_0 1 4: ACTIVE, 5: LinkUp, InfiniBand, ...``."""
        words = [w for w in (self.state, self.phys_state, self.link_layer, self.rate) if w]
        netdevs = f" ({', '.join(self.netdevs)})" if self.netdevs else ""
        return f"{self.hca} {self.port} {', '.join(words) or 'nothing readable'}{netdevs}"


@dataclass(frozen=True)
class NetFacts:
    """A node's network, as ``up`` plans with it: interfaces, their speeds and the RDMA ports."""

    node: str
    interfaces: ip.Interfaces
    speeds: Mapping[str, int] = field(default_factory=dict)  # Mbit/s; absent or <= 0 when unknown
    rdma: tuple[RdmaPort, ...] = ()

    def rdma_of(self, netdev: str) -> RdmaPort | None:
        return next((p for p in self.rdma if netdev in p.netdevs), None)

    def port(self, hca: str, number: int) -> RdmaPort | None:
        return next((p for p in self.rdma if p.hca == hca and p.port == number), None)


@dataclass(frozen=True)
class NodeReport:
    """What the reporter said about one node. ``interfaces`` is None when ``ip -j addr`` did not run or printed
    something else (``ip_error`` says which; ``ip_output`` keeps what it printed)."""

    node: str
    interfaces: ip.Interfaces | None
    ip_output: str = ""
    ip_error: ParseError | None = None
    speeds: Mapping[str, int] = field(default_factory=dict)
    rdma: tuple[RdmaPort, ...] = ()
    gpus: int | None = None  # the NVIDIA GPUs a process started there sees (None: not reported)
    gpu_model: str | None = None  # nvidia-smi's name of the first
    gpu: gpu_facts.NodeGpus | None = None  # each GPU's use and topology (None: no nvidia-smi there)

    @property
    def gpu_indices(self) -> tuple[int, ...] | None:
        """The physical indices of the GPUs a process started there may use (the node's CUDA_VISIBLE_DEVICES
        counts); 0..N-1 of the count when nvidia-smi could not list them; None when not reported."""
        return gpu_facts.offered_indices(self.gpu, self.gpus)

    @property
    def ip_ran(self) -> bool:
        """``ip -j addr`` ran and printed something (whether or not it was understood)."""
        return bool(self.ip_output)

    def net(self) -> NetFacts:
        """The network part. Raises :class:`ParseError` when the node's interfaces could not be read."""
        if self.interfaces is None:
            raise self.ip_error or ParseError(ip.TOOL, "no output")
        return NetFacts(self.node, self.interfaces, self.speeds, self.rdma)

    def rdma_listing(self) -> str:
        """The RDMA ports, one line each (the evidence doctor shows)."""
        return "\n".join(p.line() for p in self.rdma)


def _port(entry: Any) -> RdmaPort:
    if not isinstance(entry, Mapping) or "hca" not in entry or not str(entry.get("port", "")).isdigit():
        raise ParseError(TOOL, "an RDMA port needs hca and port", line=json.dumps(entry)[:200])
    return RdmaPort(str(entry["hca"]), int(entry["port"]), str(entry.get("state") or ""),
                    str(entry.get("link_layer") or ""), tuple(str(d) for d in entry.get("netdevs") or ()),
                    str(entry.get("phys_state") or ""), str(entry.get("rate") or ""))


def parse_report(node: str, raw: Mapping[str, Any]) -> NodeReport:
    """The record of the reporter's JSON (``{"net": {...}, "gpus": N}``).

    Raises :class:`ParseError` when it is not shaped as the reporter writes it; ``ip -j addr`` that failed or
    printed something else is not an error here but the record's ``ip_error``.
    """
    net = raw.get("net") or {}
    if not isinstance(net, Mapping):
        raise ParseError(TOOL, f"net is {type(net).__name__}, not an object")
    text = net.get("ip") or ""
    interfaces, error = None, None
    if net.get("ip_error") or not text:
        error = ParseError(ip.TOOL, str(net.get("ip_error") or "no output (is iproute2 installed?)"))
    else:
        try:
            interfaces = ip.parse(text)
        except ParseError as exc:
            error = exc
    speeds = net.get("speeds") or {}
    if not isinstance(speeds, Mapping):
        raise ParseError(TOOL, f"speeds is {type(speeds).__name__}, not an object")
    gpus, model = raw.get("gpus"), raw.get("gpu_model")
    return NodeReport(node, interfaces, text, error,
                      {str(k): int(v) for k, v in speeds.items() if isinstance(v, int)},
                      tuple(_port(p) for p in net.get("rdma") or ()), gpus if isinstance(gpus, int) else None,
                      model if isinstance(model, str) and model else None, gpu_facts.parse(node, raw.get("gpu")))


def parse_output(node: str, text: str) -> NodeReport:
    """The record of the reporter's output (its ``CLUSTERRUN-FACTS`` line, whatever else was printed).

    Raises :class:`ParseError` when there is no such line or it is not the reporter's JSON.
    """
    line = next((x for x in text.splitlines() if x.startswith(LINE)), None)
    if line is None:
        raise ParseError(TOOL, f"no {LINE.strip()} line", line=text.strip().splitlines()[-1][:200] if text.strip()
                         else None)
    try:
        raw = json.loads(line[len(LINE):])
    except ValueError as exc:
        raise ParseError(TOOL, f"not JSON: {exc}", line=line[:200]) from None
    if not isinstance(raw, Mapping):
        raise ParseError(TOOL, "not a JSON object", line=line[:200])
    return parse_report(node, raw)


@dataclass
class ProbedNode:
    """What one node said about itself (the ready check of ``up``, or ``plan --probe``/``init``'s probe): its
    python and torch (the ready check only), the reporter's raw ``net`` and ``gpus``, and the address SSH reached
    it at."""

    node: str
    python_version: str = ""
    torch_version: str = ""
    net: dict[str, Any] | None = None  # the reporter's ``net``, raw (see :func:`parse_report`)
    ssh_address: str | None = None  # the address SSH reached the node at
    gpus: int | None = None  # the NVIDIA GPUs a process there sees (None: not reported)
    gpu_model: str | None = None  # nvidia-smi's name of the first (``plan --probe``/``init`` only)
    leases: dict[str, Any] | None = None  # the GPUs other runs hold there, raw (see facts.leases)
    master_port: int | None = None  # the master port the node chose and leased (the ready check of rank 0)
    topology_addr: str | None = None  # SLURM_TOPOLOGY_ADDR there (in a Slurm step): "s0.s2.node07"
    gpu: dict[str, Any] | None = None  # the reporter's ``gpu``, raw (see clusterrun.facts.gpus)

    def report(self) -> NodeReport:
        """Raises :class:`ParseError` when the node's report is not shaped as the reporter writes it."""
        return parse_report(self.node, {"net": self.net or {}, "gpus": self.gpus, "gpu_model": self.gpu_model,
                                        "gpu": self.gpu})

    def gpu_facts(self) -> gpu_facts.NodeGpus | None:
        """Each GPU's use and topology as the node reported them; None without nvidia-smi there."""
        return gpu_facts.parse(self.node, self.gpu)

    def gpu_indices(self) -> tuple[int, ...] | None:
        """The physical indices of the GPUs a process there may use (see :attr:`NodeReport.gpu_indices`)."""
        return gpu_facts.offered_indices(self.gpu_facts(), self.gpus)


def read_facts(nodes: Mapping[str, ProbedNode]) -> tuple[dict[str, NetFacts], list[str], dict[str, str]]:
    """The nodes' network facts, a warning for each node whose NICs could not be read (it is planned from the
    inventory alone), and the addresses SSH reached them at. Nodes that reported nothing are left out."""
    facts: dict[str, NetFacts] = {}
    unknown: list[str] = []
    for name, r in nodes.items():
        if r.net is None:
            continue
        try:
            facts[name] = r.report().net()
        except ParseError as exc:  # no usable `ip` there: that node is planned from the inventory alone
            unknown.append(f"{name}: its NICs could not be read ({exc}); planned from the inventory alone")
    return facts, unknown, {name: r.ssh_address for name, r in nodes.items() if r.ssh_address}
