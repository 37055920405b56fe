"""What a node's network really is, and how it completes or contradicts the inventory.

The node's reporter (``remote/nodefacts.py``, parsed by :mod:`clusterrun.facts.node`) gives the output
of ``ip -j addr``, each interface's speed (``/sys/class/net/*/speed``, Mbit/s) and the RDMA ports
(``/sys/class/infiniband``: state, link layer, netdevs). :func:`reconcile` is pure: where a node's inventory entry lists no NICs, it
fills them in from these facts (so ``network.data: auto`` can choose by evidence); where it lists
NICs, it checks them (the NIC exists and is up, has the listed address, its RDMA port is ACTIVE)
and completes what is missing (prefix, speed). Values that came from probing are named in
``probed``, disagreements in ``problems`` (one line per node).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clusterrun.facts.node import NetFacts, RdmaPort, parse_report
from clusterrun.facts.parsers import ip
from clusterrun.inventory.models import Inventory, Nic, NicKind, Node

__all__ = ["VIRTUAL_PREFIXES", "NetFacts", "RdmaPort", "Reconciled", "parse_net_facts", "probed_nics", "reconcile"]

#: Interfaces of containers, bridges and tunnels: never a node's NIC to the cluster.
VIRTUAL_PREFIXES = ("lo", "docker", "virbr", "veth", "br-", "cni", "flannel", "cali", "tun", "tap", "vnet", "kube")


def parse_net_facts(node: str, raw: Mapping[str, Any]) -> NetFacts:
    """The network part of the reporter's ``net`` (see :func:`clusterrun.facts.node.parse_report`).

    Raises :class:`~clusterrun.errors.ParseError` when ``ip -j addr`` did not run or printed something else."""
    return parse_report(node, {"net": raw}).net()


def _ipv4(iface: ip.Interface) -> ip.Address | None:
    return next((a for a in iface.addresses if a.family == "inet" and a.scope != "host"), None)


def _speed(facts: NetFacts, name: str) -> int | None:
    mbit = facts.speeds.get(name, 0)
    return mbit * 1_000_000 if mbit and mbit > 0 else None


def probed_nics(facts: NetFacts) -> list[Nic]:
    """The node's NICs as the inventory would list them.

    Every interface that is up with an IPv4 address (not loopback, bridges or containers' veths);
    one whose RDMA port is ACTIVE becomes an infiniband/roce NIC with its HCA. ACTIVE RDMA ports
    without such an interface (InfiniBand without IPoIB) are added as RDMA NICs without an address, so
    NCCL still gets them; ports that are not ACTIVE are left out of NCCL_IB_HCA.
    """
    nics = []
    covered: set[tuple[str, int]] = set()
    for iface in facts.interfaces.interfaces:
        addr = _ipv4(iface)
        if addr is None or not iface.is_up or iface.name.startswith(VIRTUAL_PREFIXES) or iface.master is not None:
            continue
        port = facts.rdma_of(iface.name)
        kind = NicKind.ethernet
        if port is not None and port.active:
            kind = NicKind.infiniband if port.link_layer.lower() == "infiniband" else NicKind.roce
            covered.add((port.hca, port.port))
        else:
            port = None
        nics.append(Nic(name=iface.name, ip=f"{addr.local}/{addr.prefixlen}", kind=kind, speed=_speed(facts, iface.name),
                        hca=port.hca if port else None, port=port.port if port else 1))
    taken = {n.name for n in nics}
    for port in facts.rdma:
        if not port.active or (port.hca, port.port) in covered:
            continue
        name = next((d for d in port.netdevs if d not in taken), f"{port.hca}-{port.port}")
        kind = NicKind.infiniband if port.link_layer.lower() == "infiniband" else NicKind.roce
        nics.append(Nic(name=name, kind=kind, hca=port.hca, port=port.port))
        taken.add(name)
    return nics


@dataclass(frozen=True)
class Reconciled:
    inventory: Inventory
    probed: tuple[str, ...]  # "node1: eth1 198.19.0.11/24 (probed: not in the inventory)"
    problems: Mapping[str, str]  # node -> what differs


def _check_nic(node: Node, nic: Nic, facts: NetFacts) -> tuple[Nic, list[str], list[str]]:
    """The NIC completed from the facts, what was filled in, and what contradicts the inventory."""
    iface = facts.interfaces.get(nic.name)
    known = ", ".join(i.name for i in facts.interfaces.interfaces if i.name != "lo")
    if iface is None:
        holder = facts.interfaces.with_address(nic.address) if nic.address else None
        where = f" ({nic.address} is on {holder.name})" if holder else f" (it has: {known})"
        return nic, [], [f"NIC {nic.name} does not exist{where}"]
    problems: list[str] = []
    if not iface.is_up:
        problems.append(f"NIC {nic.name} is down ({iface.operstate})")
    addresses = [a for a in iface.addresses if a.scope != "link"]
    update: dict[str, Any] = {}
    filled: list[str] = []
    if nic.address:
        match = next((a for a in addresses if ipaddress.ip_address(a.local) == ipaddress.ip_address(nic.address)), None)
        if match is None:
            holder = facts.interfaces.with_address(nic.address)
            where = f"; {nic.address} is on {holder.name}" if holder else ""
            has = ", ".join(a.local for a in addresses) or "no address"
            problems.append(f"NIC {nic.name} does not have {nic.address} (it has {has}{where})")
        elif "/" not in str(nic.ip):
            update["ip"] = f"{match.local}/{match.prefixlen}"
            filled.append(f"prefix /{match.prefixlen}")
    elif (addr := _ipv4(iface)) is not None:
        update["ip"] = f"{addr.local}/{addr.prefixlen}"
        filled.append(f"address {update['ip']}")
    if nic.speed is None and (speed := _speed(facts, nic.name)):
        update["speed"] = speed
        filled.append(f"speed {speed // 1_000_000} Mbit/s")
    if nic.kind.is_rdma and nic.hca:
        port = facts.port(nic.hca, nic.port)
        if not facts.rdma:
            problems.append(f"no RDMA device on the node (/sys/class/infiniband is empty), but {nic.name} lists "
                            f"{nic.hca}: load the driver (mlx5_ib) or list the NIC as ethernet")
        elif port is None:
            problems.append(f"RDMA device {nic.hca} port {nic.port} does not exist "
                            f"(it has: {', '.join(f'{p.hca}/{p.port}' for p in facts.rdma)})")
        elif port is not None and not port.active:
            problems.append(f"{nic.hca} port {nic.port} is {port.state.split(': ')[-1] or 'not active'}, not ACTIVE")
    return (nic.model_copy(update=update) if update else nic), filled, problems


def reconcile(inv: Inventory, facts: Mapping[str, NetFacts]) -> Reconciled:
    """Complete and check ``inv`` with the nodes' facts (nodes without facts are left as they are)."""
    nodes: list[Node] = []
    probed: list[str] = []
    problems: dict[str, str] = {}
    for node in inv.nodes:
        f = facts.get(node.name)
        if f is None:
            nodes.append(node)
            continue
        if not node.nics:
            nics = probed_nics(f)
            probed += [f"{node.name}: {n.name} {n.ip}" + (f" {n.kind.value} {n.hca}" if n.hca else "") +
                       " (probed: not in the inventory)" for n in nics]
            nodes.append(node.model_copy(update={"nics": nics}))
            continue
        checked, mine = [], []
        for nic in node.nics:
            new, filled, wrong = _check_nic(node, nic, f)
            checked.append(new)
            probed += [f"{node.name}: {nic.name} {x} (probed)" for x in filled]
            mine += wrong
        if mine:
            problems[node.name] = "; ".join(mine)
        nodes.append(node.model_copy(update={"nics": checked}))
    return Reconciled(inv.model_copy(update={"nodes": nodes}), tuple(probed), problems)
