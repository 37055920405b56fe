"""Which NIC on each node carries training traffic (the data network).

Pure: works from the inventory alone. The choice is one of

* a subnet (``network.data: 10.0.0.0/24``): on each node, the NIC with an address in it;
* a NIC name (``network.data: eth1``): that NIC on every node;
* ``auto``: a subnet every node has a NIC in (from addresses written with a prefix,
  ``10.0.0.1/24``), preferring RDMA-capable NICs, then the fastest slowest link;
  one node alone uses loopback; with nothing to go on, each node's ``host`` address
  and no interface pinning (a warning says so).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from clusterrun.errors import PlanError
from clusterrun.inventory.models import Inventory, Nic, Node

LOOPBACK = "lo"


@dataclass(frozen=True)
class DataPath:
    """A node's end of the data network: the NIC (None when unknown) and the address peers use."""

    node: str
    nic: str | None
    address: str
    reason: str


@dataclass(frozen=True)
class DataNetwork:
    """The resolved data network for the whole cluster."""

    description: str  # e.g. "198.19.0.0/16 (auto: shared by all nodes, fastest)"
    paths: tuple[DataPath, ...]
    warnings: tuple[str, ...] = ()

    def path_of(self, node: str) -> DataPath:
        return next(p for p in self.paths if p.node == node)


def _address_or_host(node: Node, nic: Nic, why: str) -> tuple[str, str]:
    if nic.address:
        return nic.address, why
    return node.host, f"{why}; {nic.name} has no address in the inventory, so peers use host {node.host}"


def resolve_data_network(inv: Inventory, ssh_addresses: Mapping[str, str] | None = None) -> DataNetwork:
    """Choose each node's data NIC and address. Raises :class:`PlanError` when the choice cannot be met.

    ``ssh_addresses`` (node -> the address SSH reached it at, when known) lets ``auto`` tell the
    management network from a separate data network when ``host`` is a name rather than an address.
    """
    if len(inv.nodes) == 1 and inv.network.data == "auto":
        node = inv.nodes[0]
        return DataNetwork(
            "loopback (single node: every rank is on this machine)",
            (DataPath(node.name, LOOPBACK, "127.0.0.1", "single node"),),
        )
    subnet = inv.network.data_subnet
    if subnet is not None:
        return _by_subnet(inv, subnet, f"{subnet} (network.data)")
    if inv.network.data != "auto":
        return _by_name(inv, inv.network.data)
    best = _auto_subnet(inv, ssh_addresses or {})
    if best is not None:
        return _by_subnet(inv, best, f"{best} (auto: the best subnet every node has a NIC in)")
    warning = (
        "the data network is unknown: no subnet is shared by all nodes' listed NICs (write addresses with their "
        "prefix, e.g. ip: 10.0.0.1/24, or set network.data); peers use each node's host address and NCCL/Gloo "
        "pick an interface themselves, which can hang or run on the slow network"
    )
    paths = tuple(DataPath(n.name, None, n.host, "host address (data network unknown)") for n in inv.nodes)
    return DataNetwork("unknown (each node's host address)", paths, (warning,))


def _by_subnet(inv: Inventory, subnet: ipaddress.IPv4Network | ipaddress.IPv6Network, description: str) -> DataNetwork:
    paths = []
    warnings = []
    for node in inv.nodes:
        nic = node.nic_in(subnet)
        if nic is None and not node.nics:
            # Nothing listed (a one-liner): `up` and `plan --probe` fill the NIC in from the node itself.
            warnings.append(f"{node.name}: lists no NICs; its NIC in {subnet} is taken from the node when it is probed")
            paths.append(DataPath(node.name, None, node.host, f"no NICs listed; the node's NIC in {subnet} is probed"))
            continue
        if nic is None:
            raise PlanError(
                f"{node.name}: no NIC with an address in the data subnet {subnet}; list it under nodes[].nics "
                "(name and ip), or choose another network.data"
            )
        address, why = _address_or_host(node, nic, f"{nic.name} is in {subnet}")
        paths.append(DataPath(node.name, nic.name, address, why))
    return DataNetwork(description, tuple(paths), tuple(warnings))


def _by_name(inv: Inventory, name: str) -> DataNetwork:
    paths = []
    warnings = []
    for node in inv.nodes:
        nic = node.nic_named(name)
        if nic is None:
            if node.nics:
                raise PlanError(f"{node.name}: has no NIC named {name!r} (network.data); set network.data to a subnet")
            warnings.append(f"{node.name}: lists no NICs; assuming it has {name} and that peers reach it at {node.host}")
            paths.append(DataPath(node.name, name, node.host, f"network.data names {name}"))
            continue
        address, why = _address_or_host(node, nic, f"network.data names {name}")
        paths.append(DataPath(node.name, nic.name, address, why))
    return DataNetwork(f"NIC {name} (network.data)", tuple(paths), tuple(warnings))


def _auto_subnet(inv: Inventory, ssh_addresses: Mapping[str, str]) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The subnet every node has a NIC in, best first: RDMA, then the highest slowest speed."""
    shared: set[ipaddress.IPv4Network | ipaddress.IPv6Network] | None = None
    for node in inv.nodes:
        nets = {nic.network for nic in node.nics if nic.network is not None}
        shared = nets if shared is None else shared & nets  # type: ignore[operator]
    if not shared:
        return None

    def score(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> tuple[int, int, int, str]:
        nics = [node.nic_in(net) for node in inv.nodes]
        rdma = all(n is not None and n.kind.is_rdma for n in nics)
        slowest = min((n.speed or 0) if n is not None else 0 for n in nics)
        # With equal speeds, prefer the network SSH does not use: a separate data network is the usual design.
        not_mgmt = all(n is not None and n.address not in (node.host, ssh_addresses.get(node.name))
                       for n, node in zip(nics, inv.nodes, strict=False))
        return (int(rdma), slowest, int(not_mgmt), str(net))

    return max(shared, key=score)
