"""A node's RDMA ports as every source of its probe tells them, merged (for the ``ib.port`` check).

Port states come from ``ibstat`` first, then ``ibv_devinfo -v``, then MLNX_OFED's ``ibdev2netdev -v``
(port state and netdev, no rate), then the node reporter's listing of ``/sys/class/infiniband`` (the same
record ``up`` reads: state, physical state, rate, link layer, netdevs; a port whose state file could not be
read is listed without one). ``ibdev2netdev`` also gives each port's netdev and whether it is up. The MLNX_OFED
tools are optional: a node without them is checked as before, without a word about them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from clusterrun.doctor.facts import NodeFacts, Section
from clusterrun.doctor.model import Evidence
from clusterrun.errors import ParseError
from clusterrun.facts.node import RDMA_SOURCE, RdmaPort
from clusterrun.facts.parsers import ibdev2netdev, ibstat
from clusterrun.facts.parsers.ibdev2netdev import PortNetdev, PortNetdevs
from clusterrun.facts.parsers.ibstat import Ca, IbDevices, LinkLayer, Port, PortState
from clusterrun.inventory.models import Nic, Node

ACTIVE = (PortState.ACTIVE, PortState.ACTIVE_DEFER)


@dataclass
class RdmaView:
    """What a node's probe says about its RDMA devices, from every source that worked."""

    node: str
    parsed: dict[str, tuple[Section, IbDevices]] = field(default_factory=dict)
    errors: dict[str, tuple[Section, ParseError]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)  # tools not installed (or not probed)
    sys_ports: dict[tuple[str, int], str] | None = None  # (hca, port) -> link layer; None: no usable listing
    sys_netdevs: dict[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)  # netdevs of the port's device
    sys_section: Section | None = None
    netdevs: PortNetdevs | None = None  # ibdev2netdev, when it ran and listed ports
    netdev_section: Section | None = None

    def port(self, hca: str, number: int) -> tuple[Port, list[Section]] | None:
        """The port from the first tool that lists it, with fields it leaves out filled in from the other."""
        found = [(s, p) for s, devices in self.parsed.values() if (p := devices.port(hca, number)) is not None]
        if not found:
            return None
        merged = found[0][1]
        for _section, other in found[1:]:
            merged = replace(merged, physical_state=merged.physical_state or other.physical_state,
                             rate_gbps=merged.rate_gbps if merged.rate_gbps is not None else other.rate_gbps,
                             link_layer=merged.link_layer or other.link_layer, gids=merged.gids or other.gids)
        return merged, [s for s, _ in found]

    def listed(self) -> tuple[str, set[tuple[str, int]], list[Section | None]] | None:
        """(source, every (hca, port) it lists, its section) from the first source that worked."""
        if self.parsed:
            name, (section, devices) = next(iter(self.parsed.items()))
            return name, {(ca.name, p.number) for ca in devices.cas for p in ca.ports}, [section]
        if self.sys_ports is not None:
            return RDMA_SOURCE, set(self.sys_ports), [self.sys_section]
        if self.netdevs is not None:
            return "ibdev2netdev", {(p.hca, p.port) for p in self.netdevs.ports}, [self.netdev_section]
        return None

    def stateless(self, hca: str, number: int) -> tuple[str, str | None, list[Section | None]] | None:
        """(source, link layer if known, sections) for a port listed by a source that gives no state: the
        reporter's /sys listing (a state file it could not read), ``ibdev2netdev`` without ``-v`` (only the netdev);
        None where neither lists it."""
        found: list[tuple[str, str | None, Section | None]] = []
        if self.sys_ports is not None and (hca, number) in self.sys_ports:
            found.append((RDMA_SOURCE, self.sys_ports[(hca, number)] or None, self.sys_section))
        if self.netdevs is not None and self.netdevs.port(hca, number) is not None:
            found.append(("ibdev2netdev", None, self.netdev_section))
        if not found:
            return None
        return found[0][0], next((layer for _, layer, _ in found if layer), None), [s for *_, s in found]

    def owner(self, netdev: str) -> PortNetdev | None:
        """The port ibdev2netdev shows driving ``netdev``."""
        return self.netdevs.of_netdev(netdev) if self.netdevs is not None else None

    def active(self) -> set[tuple[str, int]]:
        return {(ca.name, p.number) for _s, devices in self.parsed.values() for ca in devices.cas
                for p in ca.ports if p.state in ACTIVE}

    def unread(self) -> str:
        """Why no tool gave a port's state: "ibstat is not installed, ibv_devinfo output is not understood"."""
        parts = [f"{t} is not installed" for t in self.missing] + [f"{t} output is not understood" for t in self.errors]
        return ", ".join(parts + [f"{t} does not list it" for t in self.parsed]) or "no RDMA tool output"


def rdma_view(facts: NodeFacts) -> RdmaView:
    view = RdmaView(facts.node)
    for tool, parse in (("ibstat", ibstat.parse), ("ibv_devinfo", ibstat.parse_devinfo)):
        section = facts.section(tool)
        if section is None or section.missing:
            view.missing.append(tool)
            continue
        try:
            view.parsed[tool] = (section, parse(section.output))
        except ParseError as exc:
            view.errors[tool] = (section, exc)
    report = facts.report
    if report is not None:  # the reporter ran: its listing of /sys/class/infiniband, possibly empty
        view.sys_section, view.sys_ports = facts.rdma_section(), {}
        for p in report.rdma:
            view.sys_ports[(p.hca, p.port)] = p.link_layer
            view.sys_netdevs[(p.hca, p.port)] = p.netdevs
    _add_ibdev2netdev(view, facts.section("ibdev2netdev"))
    if report is not None and view.sys_section is not None:
        _add_sysfs(view, report.rdma, view.sys_section)
    return view


def _add_sysfs(view: RdmaView, ports: Iterable[RdmaPort], section: Section) -> None:
    """The ports whose state the kernel showed become the last source of port states (ibstat reads the same
    files; the reporter reads them where infiniband-diags is not installed)."""
    layers = {m.value: m for m in LinkLayer}
    cas: dict[str, list[Port]] = {}
    for p in ports:
        if (state := p.port_state) is not None:
            cas.setdefault(p.hca, []).append(Port(p.port, state, p.physical_state, p.rate_gbps,
                                                  layers.get(p.link_layer)))
    if cas:
        view.parsed[RDMA_SOURCE] = (section, IbDevices(tuple(Ca(name, None, None, None, tuple(found))
                                                             for name, found in cas.items())))


def _add_ibdev2netdev(view: RdmaView, section: Section | None) -> None:
    """Use ``ibdev2netdev -v`` where it ran to the end and listed ports; its port states become a source of
    their own, after ibstat and ibv_devinfo (with the link layer from /sys where it has it)."""
    if section is None or not section.ok:
        return  # not installed, no /sys/class/infiniband (exit 255) or cut short: nothing to add
    try:
        netdevs = ibdev2netdev.parse(section.output)
    except ParseError:
        return  # nothing recognisable: the evidence keeps the output, the other sources answer
    if not netdevs.ports:
        return
    view.netdevs, view.netdev_section = netdevs, section
    layers = {m.value: m for m in LinkLayer}
    cas: dict[str, list[Port]] = {}
    for entry in netdevs.ports:
        if entry.port_state is not None:  # only -v prints the RDMA port's own state
            layer = layers.get((view.sys_ports or {}).get((entry.hca, entry.port), ""))
            cas.setdefault(entry.hca, []).append(Port(entry.port, entry.port_state, None, None, layer))
    if cas:
        view.parsed["ibdev2netdev"] = (section, IbDevices(tuple(Ca(name, None, None, None, tuple(ports))
                                                                  for name, ports in cas.items())))


def rdma_nics(node: Node) -> list[Nic]:
    return [nic for nic in node.nics if nic.kind.is_rdma]


def evidence_of(node: str, sections: Iterable[Section | None]) -> tuple[Evidence, ...]:
    return tuple(s.evidence(node) for s in sections if s is not None)


def port_names(ports: Iterable[tuple[str, int]]) -> list[str]:
    return [f"{hca}/{port}" for hca, port in sorted(ports)]


