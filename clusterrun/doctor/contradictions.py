"""Where the inventory and a node disagree about one of the node's NICs, told once as an inventory problem.

A NIC written in the inventory with an address its interface does not have (``198.19.0.99`` where the node
has ``198.19.0.12``), or under a name the node gives another interface, is a fault of the inventory, not of
the network: pinging from an address the node does not have fails whatever the cable. ``nic.present``
reports each contradiction once (``file:line``, what the node has, the corrected line); the checks that would
use the inventory's value leave the NIC out and say "not tested: inventory says X, node has Y" (see
:func:`not_tested`), and the recommended snippet uses the node's own values.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass

from clusterrun.doctor.model import Finding, Verdict
from clusterrun.doctor.registry import Context
from clusterrun.facts.parsers import ip
from clusterrun.inventory.locate import nic_line
from clusterrun.inventory.models import Nic


@dataclass(frozen=True)
class Contradiction:
    """The inventory's ``key`` (``ip`` or ``name``) of NIC ``nic`` of ``node`` says ``listed``; the node has
    ``actual``. ``real_nic``/``real_address``/``prefixlen``: the node's own values (address None when the
    node has none to offer); ``where``: ``file:line`` in the inventory, or "the inventory"."""

    node: str
    nic: str
    key: str
    listed: str
    actual: str
    real_nic: str
    real_address: str | None
    prefixlen: int | None
    where: str

    @property
    def said(self) -> str:
        return f"inventory says {self.listed}, node has {self.actual}"

    @property
    def snippet(self) -> str:
        """The inventory's NIC line with the node's values: ``{name: eth1, ip: 198.19.0.12/24}``."""
        address = f", ip: {self.real_address}/{self.prefixlen}" if self.real_address else ""
        return f"{{name: {self.real_nic}{address}}}"

    @property
    def real_network(self) -> str | None:
        if self.real_address is None or self.prefixlen is None:
            return None
        return str(ipaddress.ip_interface(f"{self.real_address}/{self.prefixlen}").network)

    def to_data(self) -> dict[str, str]:
        return {"inventory": self.where, "key": self.key, "listed": self.listed, "actual": self.actual,
                "snippet": self.snippet}


def _real_address(iface: ip.Interface, nic: Nic) -> ip.Address | None:
    """The address the inventory most likely meant: same family, not link-local, in its subnet when one is."""
    wanted = ipaddress.ip_address(nic.address) if nic.address else None
    usable = [a for a in iface.addresses if a.scope != "link"
              and (wanted is None or ipaddress.ip_address(a.local).version == wanted.version)]
    near = [a for a in usable if nic.network is not None and ipaddress.ip_address(a.local) in nic.network]
    return (near or usable or [None])[0]


def _find(ctx: Context, node_name: str, nic: Nic, ifaces: ip.Interfaces) -> Contradiction | None:
    source = ctx.options.inventory_file

    def where(key: str) -> str:
        return (nic_line(source, node_name, nic.name, key) if source else None) or "the inventory"

    iface = ifaces.get(nic.name)
    holder = ifaces.with_address(nic.address) if nic.address else None
    if holder is not None and holder.name != nic.name:  # the address is there, under another name
        prefix = next((a.prefixlen for a in holder.addresses
                       if ipaddress.ip_address(a.local) == ipaddress.ip_address(nic.address)), None)
        return Contradiction(node_name, nic.name, "name", nic.name, f"{nic.address} on {holder.name}", holder.name,
                             nic.address, prefix, where("name"))
    if iface is None or not iface.is_up or not nic.address or holder is not None:
        return None  # missing or down: a fault of the node, told by nic.present as such
    real = _real_address(iface, nic)
    actual = f"{real.local}/{real.prefixlen}" if real else "no address"
    return Contradiction(node_name, nic.name, "ip", nic.address, actual, nic.name, real.local if real else None,
                         real.prefixlen if real else None, where("ip"))


def contradictions(ctx: Context) -> dict[tuple[str, str], Contradiction]:
    """Every contradiction of this run, keyed by (node, the inventory's NIC name); worked out once per run."""
    found = ctx.extra.get("contradictions")
    if isinstance(found, dict):
        return found
    found = {}
    for node in ctx.reachable():
        report = ctx.facts[node.name].report
        ifaces = report.interfaces if report is not None else None
        if ifaces is None:
            continue
        for nic in node.nics:
            c = _find(ctx, node.name, nic, ifaces)
            if c is not None:
                found[(node.name, nic.name)] = c
    ctx.extra["contradictions"] = found
    return found


def on_network(c: Contradiction, ctx: Context, subnet: str) -> bool:
    """Whether the contradicted NIC belongs on ``subnet`` by the inventory's value or the node's."""
    nic = next((n for n in ctx.inventory.node(c.node).nics if n.name == c.nic), None)
    listed = str(nic.network) if nic is not None and nic.network is not None else None
    return subnet in (listed, c.real_network)


def not_tested(ctx: Context, check: str, subnets: list[str]) -> Iterator[Finding]:
    """One ``skip`` finding per contradicted NIC on one of ``subnets``: what the check did not test, and why."""
    for c in contradictions(ctx).values():
        subnet = next((s for s in subnets if on_network(c, ctx, s)), None)
        if subnet is None:
            continue
        yield Finding(check, Verdict.skipped,
                      f"{c.node}: {c.nic} not tested on {subnet}: {c.said} ({c.where})", node=c.node,
                      subject=c.nic, measured=c.actual, expected=c.listed,
                      hint=f"an inventory problem (see nic.present), not a network fault: set {c.snippet} at "
                           f"{c.where} and run doctor again", data=c.to_data())
