"""Verdicts from the nodes' series (clusterrun/remote/sampler.py): the ranks' traffic on the wrong NIC, and the
run's GPU energy. Pure functions over the samples and the plan; no I/O.

**Traffic on the wrong NIC.** Only the ranks' own connections to the other nodes count (the sampler reads them
from the ranks' sockets: never sshd's, never the agent's, never the one to torchrun's store): a NIC other than
the node's data NIC carrying at least ``min_rate`` bytes per second of them for ``sustain`` seconds in a row is
named once per node. Where the plan chose RDMA, sockets on the data NIC's own IP interface at that rate while the
HCA counters stay flat are named too (NCCL fell back to sockets). Traffic to an address that is no other node's
(a dataset or checkpoint server), clusterrun's own (SSH, the log relay) and output however heavy never count.
The likely cause is the ranks' variable that names the NIC carrying it (or turns RDMA off), with where it came
from when the plan set it.

**Energy.** Per GPU, the energy counter's increase between samples where nvidia-smi reports it; else (and across
a counter that went back) the power integrated over the samples' seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIN_RATE = 1_000_000.0  # bytes per second: collectives, not a heartbeat or a store's chatter
SUSTAIN = 5.0  # seconds in a row: named within 10 s of sustained traffic at one sample a second
RDMA_FLAT = 0.1  # HCA counters below this share of the socket traffic are "flat"
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


@dataclass(frozen=True)
class NodeNet:
    """What the plan says of a node's network: its data NIC and address, RDMA or not, the other nodes'
    addresses (its peers), and where each of the plan's variables came from."""

    node: str
    data_nic: str | None
    data_address: str
    rdma: bool
    peers: frozenset[str]
    env: Mapping[str, str] = field(default_factory=dict)
    env_sources: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WrongNic:
    """The ranks' traffic of ``node`` on ``nic`` instead of ``data_nic`` (``kind``: ``wrong_nic``, or
    ``sockets_not_rdma`` on the data NIC's IP interface while the plan chose RDMA)."""

    node: str
    kind: str
    nic: str
    rate: float
    data_nic: str | None
    peers: tuple[str, ...]
    cause: str
    variable: str | None = None
    time: float = 0.0

    def message(self) -> str:
        peers = ", ".join(self.peers[:3]) + (" ..." if len(self.peers) > 3 else "")
        if self.kind == "sockets_not_rdma":
            return (f"{self.node}: the ranks' traffic to the other nodes goes over sockets on {self.nic} at "
                    f"{rate_text(self.rate)} (to {peers}) while the RDMA counters stay flat: {self.cause}")
        return (f"{self.node}: the ranks' traffic to the other nodes goes over {self.nic} at {rate_text(self.rate)} "
                f"(to {peers}), not the data NIC {self.data_nic or '?'}: {self.cause}")

    def record_event(self) -> dict[str, Any]:
        """The verdict as an event of the run's record (time, node, kind, text, and its figures)."""
        return {"time": self.time, "node": self.node, "kind": "wrong-nic", "text": self.message(), "nic": self.nic,
                "data_nic": self.data_nic, "rate": round(self.rate), "variable": self.variable}

    def to_dict(self) -> dict[str, Any]:
        return {"ev": "wrong_nic", "node": self.node, "kind": self.kind, "nic": self.nic, "rate": round(self.rate),
                "data_nic": self.data_nic, "peers": list(self.peers), "variable": self.variable,
                "cause": self.cause, "time": self.time, "text": self.message()}


def rate_text(bps: float | None) -> str:
    """Bytes per second in words (``12.3 MB/s``); ``-`` for no reading."""
    if bps is None:
        return "-"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} B/s"


def names_nic(value: str, nic: str) -> bool:
    """Whether an interface variable's ``value`` lets ``nic`` be used: NCCL's syntax (comma-separated prefixes,
    ``=`` for exact names, ``^`` to exclude), which also reads Gloo's plain names right."""
    value = value.strip()
    if not value:
        return False
    exclude = value.startswith("^")
    exact = value.lstrip("^").startswith("=")
    items = [i.strip() for i in value.lstrip("^").lstrip("=").split(",") if i.strip()]
    hit = any(nic == i if exact else nic.startswith(i) for i in items)
    return not hit if exclude else hit


class WrongNicJudge:
    """Feeds on each node's samples; names the wrong NIC once per node (see the module's docstring)."""

    def __init__(self, nets: Mapping[str, NodeNet], min_rate: float = MIN_RATE, sustain: float = SUSTAIN) -> None:
        self.nets = dict(nets)
        self.min_rate = min_rate
        self.sustain = sustain
        self.busy: dict[tuple[str, str, str], float] = {}  # (node, kind, nic) -> seconds of sustained traffic
        self.env: dict[str, dict[str, str]] = {}
        self.named: set[str] = set()
        # Each node's own addresses as its samples show them (the local ends of its ranks' connections): a plan may
        # name a node's host by a name that only the nodes resolve, and a peer's other NICs are its addresses too.
        self.own: dict[str, set[str]] = {}

    @classmethod
    def from_plan(cls, plan: Mapping[str, Any], resolve: Callable[[str], Iterable[str]] | None = None,
                  **limits: float) -> WrongNicJudge:
        """From a plan as plan.json holds it. ``resolve``: a host name's addresses (plans may name hosts)."""
        nodes = list(plan.get("nodes") or [])
        addresses: dict[str, set[str]] = {}
        for n in nodes:
            own = {a for a in (n.get("host"), n.get("data_address")) if a}
            for a in list(own):
                own.update(resolve(a) if resolve is not None else ())
            addresses[n["name"]] = own
        nets = {}
        for n in nodes:
            env = dict(n.get("env") or {})
            peers = frozenset(a for other, own in addresses.items() if other != n["name"] for a in own)
            rdma = bool(env.get("NCCL_IB_HCA")) and env.get("NCCL_IB_DISABLE", "0") != "1"
            nets[n["name"]] = NodeNet(n["name"], n.get("data_nic"), n.get("data_address") or "", rdma, peers, env,
                                      dict(n.get("env_sources") or {}))
        return cls(nets, **limits)

    def feed(self, node: str, sample: Mapping[str, Any]) -> list[WrongNic]:
        """The verdicts this sample completes (at most one per node for the whole run)."""
        net = self.nets.get(node)
        if net is None or node in self.named:
            return []
        if sample.get("env"):
            self.env[node] = dict(sample["env"])
        for pairs in (sample.get("conns") or {}).values():
            self.own.setdefault(node, set()).update(pair.split(">", 1)[0] for pair in pairs)
        dt = float(sample.get("dt") or 0.0)
        rates = self._peer_rates(net, sample)
        hot: dict[tuple[str, str], float] = {}
        for nic, rate in rates.items():
            if rate < self.min_rate or nic in ("lo", "?"):
                continue
            if net.data_nic and nic != net.data_nic:
                hot[("wrong_nic", nic)] = rate
            elif net.rdma and nic == net.data_nic:
                hca = sum(sum(v) for v in (sample.get("rdma") or {}).values())
                if hca < rate * RDMA_FLAT:
                    hot[("sockets_not_rdma", nic)] = rate
        for key in [k for k in self.busy if k[0] == node and (k[1], k[2]) not in hot]:
            del self.busy[key]  # sustained means in a row
        for (kind, nic), rate in sorted(hot.items(), key=lambda kv: -kv[1]):
            seconds = self.busy[(node, kind, nic)] = self.busy.get((node, kind, nic), 0.0) + dt
            if seconds >= self.sustain:
                self.named.add(node)
                variable, cause = self._cause(net, kind, nic)
                peers = sorted({pair.split(">", 1)[1] for pair in (sample.get("conns") or {}).get(nic, {})}
                               & self._peers(net))
                return [WrongNic(node, kind, nic, rate, net.data_nic, tuple(peers), cause, variable,
                                 float(sample.get("t") or 0.0))]
        return []

    def _peer_rates(self, net: NodeNet, sample: Mapping[str, Any]) -> dict[str, float]:
        """Bytes per second of the ranks' connections to other nodes, per NIC. Where the kernel gave no bytes per
        connection, the NIC's own rate stands for them (only on a NIC that holds such a connection)."""
        out: dict[str, float] = {}
        nics = sample.get("nics") or {}
        peers = self._peers(net)
        for nic, pairs in (sample.get("conns") or {}).items():
            for pair, entry in pairs.items():
                if pair.split(">", 1)[-1] not in peers:
                    continue  # a dataset or checkpoint server, a same-node rank: not the collectives
                if "tx" in entry or "rx" in entry:
                    out[nic] = out.get(nic, 0.0) + float(entry.get("tx") or 0) + float(entry.get("rx") or 0)
                else:
                    out[nic] = max(out.get(nic, 0.0), float(sum(nics.get(nic) or (0, 0))))
        return out

    def _peers(self, net: NodeNet) -> frozenset[str] | set[str]:
        """The other nodes' addresses: from the plan, and as their own samples show them."""
        seen = {a for other, own in self.own.items() if other != net.node for a in own}
        return net.peers | seen if seen else net.peers

    def _cause(self, net: NodeNet, kind: str, nic: str) -> tuple[str | None, str]:
        env = self.env.get(net.node, {})
        if kind == "sockets_not_rdma":
            for var, bad in (("NCCL_IB_DISABLE", lambda v: v.strip() == "1"),
                             ("NCCL_NET", lambda v: v.strip().lower() == "socket")):
                if var in env and bad(env[var]):
                    return var, f"{var}={env[var]} in the ranks' environment{self._source(net, var, env[var])}"
            return None, ("no variable turns RDMA off in the ranks' environment: check NCCL_IB_HCA "
                          f"({env.get('NCCL_IB_HCA', 'unset')}) against the node's HCAs, and NCCL_DEBUG=INFO's NET lines")
        for var in IFNAME_VARS:
            if var in env and names_nic(env[var], nic):
                use = f"; set it to {net.data_nic} or leave it to clusterrun" if net.data_nic else ""
                return var, f"{var}={env[var]} in the ranks' environment{self._source(net, var, env[var])}{use}"
        return None, ("no interface variable in the ranks' starting environment names it: the script may set one "
                      "itself (os.environ before init_process_group), or the library chose it by its route to "
                      "the master address")

    @staticmethod
    def _source(net: NodeNet, var: str, value: str) -> str:
        if var in net.env_sources and net.env.get(var) == value:
            return f" (set by {net.env_sources[var]})"
        if var in net.env:
            return f" (the plan set {net.env[var]!r}; the node's environment or the image overrides it)"
        return " (not from clusterrun's plan: the node's environment, a shell profile or the image)"


@dataclass(frozen=True)
class Energy:
    """The run's GPU energy in joules: per node, per GPU of each node, in total, and how each was found
    (``counter``: nvidia-smi's energy counter; ``power``: power integrated over the samples; ``counter+power``)."""

    per_node: dict[str, float]
    per_gpu: dict[str, dict[str, float]]
    how: dict[str, str]

    @property
    def total(self) -> float:
        return sum(self.per_node.values())


def energy(series: Mapping[str, Iterable[Mapping[str, Any]]]) -> Energy:
    """The GPU energy of ``series`` (node -> its samples, oldest first)."""
    per_node: dict[str, float] = {}
    per_gpu: dict[str, dict[str, float]] = {}
    how: dict[str, str] = {}
    for node, samples in series.items():
        gpus: dict[str, float] = {}
        last: dict[str, float] = {}
        ways: set[str] = set()
        for sample in samples:
            dt = float(sample.get("dt") or 0.0)
            for index, reading in (sample.get("gpus") or {}).items():
                counter, before = reading.get("energy"), last.get(index)
                if counter is not None:
                    last[index] = float(counter)
                if counter is not None and before is not None and float(counter) >= before:
                    gpus[index] = gpus.get(index, 0.0) + float(counter) - before
                    ways.add("counter")
                elif reading.get("power") is not None and dt > 0:
                    gpus[index] = gpus.get(index, 0.0) + float(reading["power"]) * dt
                    ways.add("power")
        if gpus:
            per_gpu[node] = {k: round(v, 1) for k, v in sorted(gpus.items(), key=lambda kv: int(kv[0]))}
            per_node[node] = round(sum(gpus.values()), 1)
            how[node] = "counter+power" if len(ways) > 1 else ways.pop()
    return Energy(per_node, per_gpu, how)


def run_energy(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's GPU energy from its series, as its record keeps it (None: no GPU was sampled)."""
    from clusterrun.runs import series

    used = energy({node: series.read_series(run_dir, node) for node in series.nodes(run_dir)})
    if not used.per_node:
        return None
    return {"total_j": round(used.total, 1), "per_node_j": used.per_node, "per_gpu_j": used.per_gpu, "how": used.how}
