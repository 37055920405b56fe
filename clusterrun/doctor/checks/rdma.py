"""InfiniBand/RoCE checks: port state and rate, the RoCE v2 GID of each address, GPUDirect RDMA.

Port facts come from ``ibstat`` first, then ``ibv_devinfo -v``, then MLNX_OFED's ``ibdev2netdev -v``
(port state and netdev, no rate), then the bare listing of ``/sys/class/infiniband`` (section
``rdma_sys``: device, port, link layer, netdevs, no state). ``ibdev2netdev`` also gives each port's
netdev and whether it is up; ``show_gids`` stands in for ``ibv_devinfo`` as the source of GIDs.
Both are optional: a node without them is checked as before, without a word about them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial

from clusterrun.doctor.facts import NodeFacts, Section
from clusterrun.doctor.model import Evidence, Finding, Scope, Verdict
from clusterrun.doctor.registry import Context, check
from clusterrun.errors import ParseError
from clusterrun.facts.parsers import ibdev2netdev, ibstat, show_gids
from clusterrun.facts.parsers.ibdev2netdev import NetdevState, PortNetdev, PortNetdevs
from clusterrun.facts.parsers.ibstat import Ca, Gid, IbDevices, LinkLayer, PhysState, Port, PortState
from clusterrun.inventory.models import Nic, NicKind, Node

_ACTIVE = (PortState.ACTIVE, PortState.ACTIVE_DEFER)
_PHYS_WORD = {PhysState.SLEEP: "Sleep", PhysState.POLLING: "Polling", PhysState.DISABLED: "Disabled",
              PhysState.TRAINING: "PortConfigurationTraining", PhysState.LINK_UP: "LinkUp",
              PhysState.ERROR_RECOVERY: "LinkErrorRecovery", PhysState.PHY_TEST: "PhyTest"}
_LAYER = {NicKind.infiniband: LinkLayer.INFINIBAND, NicKind.roce: LinkLayer.ETHERNET}
NO_DEVICE_HINT = ("no RDMA device is visible: check the HCA is seen (`lspci | grep -i mellanox`) and its driver "
                  "loaded (`modprobe mlx5_ib`), and in a container that /dev/infiniband is passed in")
INSTALL_HINT = ("install infiniband-diags (ibstat) and rdma-core's ibverbs-utils (ibv_devinfo) on the node so doctor "
                "can read port state, rate and GIDs")


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
            return "/sys/class/infiniband", set(self.sys_ports), [self.sys_section]
        if self.netdevs is not None:
            return "ibdev2netdev", {(p.hca, p.port) for p in self.netdevs.ports}, [self.netdev_section]
        return None

    def owner(self, netdev: str) -> PortNetdev | None:
        """The port ibdev2netdev shows driving ``netdev``."""
        return self.netdevs.of_netdev(netdev) if self.netdevs is not None else None

    def active(self) -> set[tuple[str, int]]:
        return {(ca.name, p.number) for _s, devices in self.parsed.values() for ca in devices.cas
                for p in ca.ports if p.state in _ACTIVE}

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
    sys_section = facts.section("rdma_sys")
    if sys_section is not None and sys_section.ok:
        view.sys_section, view.sys_ports = sys_section, {}
        for words in (line.split() for line in sys_section.output.splitlines()):
            if len(words) >= 2 and words[1].isdigit():
                view.sys_ports[(words[0], int(words[1]))] = words[2] if len(words) > 2 and "," not in words[2] else ""
                view.sys_netdevs[(words[0], int(words[1]))] = tuple(d for d in words[-1].split(",") if d) \
                    if len(words) > 2 and words[-1].endswith(",") else ()
    _add_ibdev2netdev(view, facts.section("ibdev2netdev"))
    return view


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


def _evidence(node: str, sections: Iterable[Section | None]) -> tuple[Evidence, ...]:
    return tuple(s.evidence(node) for s in sections if s is not None)


def _names(ports: Iterable[tuple[str, int]]) -> list[str]:
    return [f"{hca}/{port}" for hca, port in sorted(ports)]


@check("ib.port", "listed InfiniBand/RoCE ports are up at their listed rate", Scope.node,
       needs="nodes with infiniband/roce NICs in the inventory")
def check_ports(ctx: Context) -> Iterator[Finding]:
    for node in ctx.reachable():
        view, nics = rdma_view(ctx.facts[node.name]), rdma_nics(node)
        finding = partial(Finding, "ib.port", node=node.name)
        active = _names(view.active() - {(n.hca or "", n.port) for n in nics})
        if not nics:
            extra = f" (but {', '.join(active)} active on the node)" if active else ""
            yield finding(Verdict.skipped, f"{node.name}: no InfiniBand/RoCE NICs listed{extra}",
                          data={"unlisted": active} if active else {})
            continue
        for tool, (section, exc) in view.errors.items():
            yield finding(Verdict.warned, f"{node.name}: {tool} printed output doctor does not understand: {exc}",
                          subject=tool, hint=f"run `{section.command}` on {node.name} and compare with the evidence; "
                          "the other RDMA sources were used where they had the answer",
                          evidence=(section.evidence(node.name),), data={"exit_code": section.exit_code})
        if not view.parsed and view.netdevs is None and (
                view.sys_ports == {} or (view.sys_ports is None and not view.errors)):
            sysfs = "is empty" if view.sys_ports == {} else "could not be read"
            tools = "ibstat/ibv_devinfo not installed" if not view.errors else f"no tool output ({view.unread()})"
            yield finding(Verdict.failed, f"{node.name}: {tools} on {node.name} and /sys/class/infiniband {sysfs} "
                          "(install infiniband-diags / rdma-core)", hint=NO_DEVICE_HINT + "; " + INSTALL_HINT,
                          subject=", ".join(_names((n.hca or "", n.port) for n in nics)),
                          evidence=_evidence(node.name, [view.sys_section]))
            continue
        for nic in nics:
            port_finding = _port_finding(node.name, nic, view)
            yield port_finding
            yield from _netdev_findings(node.name, nic, view, port_finding)
        if active:
            yield finding(Verdict.passed, f"{node.name}: active RDMA ports not in the inventory: {', '.join(active)} "
                          "(clusterrun jobs do not use them)", subject=", ".join(active), data={"unlisted": active},
                          hint="list them under the node's nics (kind infiniband or roce, with hca and port) for "
                          "NCCL to use them", evidence=_evidence(node.name, [s for s, _ in view.parsed.values()]))


def _port_finding(node: str, nic: Nic, view: RdmaView) -> Finding:
    hca, number, want = nic.hca or "", nic.port, _LAYER[nic.kind]
    name = f"{hca} port {number}"
    finding = partial(Finding, "ib.port", node=node, subject=f"{hca}/{number}")
    data: dict[str, object] = {"hca": hca, "port": number, "nic": nic.name}
    found, listed = view.port(hca, number), view.listed()
    if found is None and view.sys_ports is not None and (hca, number) in view.sys_ports:
        sys_layer, evidence = view.sys_ports[(hca, number)], _evidence(node, [view.sys_section])
        if sys_layer and sys_layer != want.value:
            return _layer_mismatch(finding, node, nic, name, sys_layer, evidence, data)
        return finding(Verdict.warned, f"{node}: {name} exists ({sys_layer or 'link layer unknown'}) but its state "
                       f"could not be read: {view.unread()}", hint=INSTALL_HINT, evidence=evidence,
                       data={**data, "source": "rdma_sys"})
    if found is None and listed is None:
        return finding(Verdict.warned, f"{node}: the state of {name} could not be read: {view.unread()}",
                       hint=INSTALL_HINT, evidence=_evidence(node, [s for s, _ in view.errors.values()]), data=data)
    if found is None:
        source, ports, where = listed or ("", set(), [])
        hcas = sorted({h for h, _ in ports})
        if hca in hcas:
            what = f"{hca} has no port {number} (ports: {', '.join(str(p) for h, p in sorted(ports) if h == hca)})"
        else:
            what = f"{hca} not found ({source} lists {', '.join(hcas) or 'no RDMA devices'})"
        hint = ("check `hca`/`port` in the inventory against `ibstat -l` or `ibdev2netdev`, and that the driver is "
                "loaded (`lsmod | grep mlx5_ib`)") if hcas else NO_DEVICE_HINT
        if (owner := view.owner(nic.name)) is not None and (owner.hca, owner.port) != (hca, number):
            hint = (f"ibdev2netdev shows {nic.name} on {owner.hca} port {owner.port}: set hca: {owner.hca}"
                    + (f" and port: {owner.port}" if owner.port != number else "") + f" for {nic.name}; " + hint)
            where = [*where, view.netdev_section] if view.netdev_section not in where else where
            data["ibdev2netdev"] = f"{owner.hca}/{owner.port}"
        return finding(Verdict.failed, f"{node}: {what}", measured=", ".join(hcas) or "none",
                       expected=f"{hca}/{number}", hint=hint, evidence=_evidence(node, where), data=data)
    port, sections = found
    evidence = _evidence(node, sections)
    phys = _PHYS_WORD.get(port.physical_state) if port.physical_state else None
    layer = port.link_layer.value if port.link_layer else None
    data.update(state=port.state.value, physical_state=phys, link_layer=layer, rate_gbps=port.rate_gbps)
    if layer and port.link_layer not in (want, LinkLayer.UNSPECIFIED):
        return _layer_mismatch(finding, node, nic, name, layer, evidence, data)
    measured, expected = f"{port.state.value}/{phys or '?'}", "ACTIVE/LinkUp"
    if port.state not in _ACTIVE or (phys and port.physical_state is not PhysState.LINK_UP):
        if port.state in _ACTIVE:
            state = f"ACTIVE but its physical state is {phys}"
        else:
            state = port.state.value + (f" (physical state {phys})" if phys else "")
        hint = _down_hint(port, nic)
        entry = view.netdevs.port(hca, number) if view.netdevs is not None else None
        if entry is not None and entry.state is NetdevState.DOWN and nic.kind is NicKind.roce:
            data["netdev"], data["netdev_state"] = entry.netdev, entry.state.value
            hint += (f"; its interface {entry.netdev} is Down too (ibdev2netdev): if it was taken down, "
                     f"`ip link set {entry.netdev} up`")
        return finding(Verdict.failed, f"{node}: {name} is {state}", measured=measured, expected=expected,
                       hint=hint, evidence=evidence, data=data)
    rate, listed_gbps = port.rate_gbps, (nic.speed / 1e9 if nic.speed else None)
    if rate is not None and listed_gbps is not None and rate < listed_gbps * 0.99:
        return finding(Verdict.warned, f"{node}: {name} runs at {rate:g} Gb/s, below the listed {listed_gbps:g} Gb/s",
                       measured=f"{rate:g} Gb/s", expected=f"{listed_gbps:g} Gb/s", hint="the link trained at a lower "
                       "speed or width: reseat or replace the cable or transceiver, check the switch port (`mlxlink -d "
                       f"{hca} -p {number}`), or correct `speed` in the inventory", evidence=evidence, data=data)
    rate_text = f", {rate:g} Gb/s" if rate is not None else ""
    return finding(Verdict.passed, f"{node}: {name} is {port.state.value} ({phys or 'physical state not shown'}, "
                   f"{layer or want.value}{rate_text})", measured=measured + rate_text, evidence=evidence, data=data,
                   expected=expected + (f", {listed_gbps:g} Gb/s" if listed_gbps else ""))


def _netdev_findings(node: str, nic: Nic, view: RdmaView, port_finding: Finding) -> Iterator[Finding]:
    """What ``ibdev2netdev`` adds about a listed port: it drives another netdev than the inventory's, or its
    netdev is Down while the port itself did not fail. Nothing where ibdev2netdev does not list the port."""
    hca, number = nic.hca or "", nic.port
    entry = view.netdevs.port(hca, number) if view.netdevs is not None else None
    if entry is None:
        return
    finding = partial(Finding, "ib.port", node=node, subject=f"{hca}/{number}")
    data: dict[str, object] = {"hca": hca, "port": number, "nic": nic.name, "netdev": entry.netdev,
                               "netdev_state": entry.state.value, "source": "ibdev2netdev"}
    if entry.netdev != nic.name and nic.name not in view.sys_netdevs.get((hca, number), ()):
        owner = view.owner(nic.name)
        where = f" ({nic.name} is on {owner.hca} port {owner.port})" if owner is not None else ""
        fix = (f"set hca: {owner.hca}" + (f" and port: {owner.port}" if owner.port != number else "")
               + f" for {nic.name}, or name the NIC {entry.netdev}") if owner is not None else (
            f"name the NIC on {hca} port {number} {entry.netdev}, or correct its hca/port")
        yield finding(Verdict.warned, f"{node}: {hca} port {number} drives {entry.netdev}, not {nic.name} as the "
                      f"inventory lists it{where}", measured=entry.netdev, expected=nic.name,
                      evidence=_evidence(node, [view.netdev_section, view.sys_section]), data=data,
                      hint=f"{fix} in the inventory (`ibdev2netdev` lists each port's interface): NCCL_IB_HCA and "
                      "NCCL_SOCKET_IFNAME come from these pairs, so a wrong one puts RDMA traffic on another port "
                      "than the address it is given")
        return
    if entry.state is not NetdevState.DOWN or port_finding.verdict is Verdict.failed:
        return
    evidence = _evidence(node, [view.netdev_section])
    if nic.kind is NicKind.roce:
        yield finding(Verdict.failed, f"{node}: {entry.netdev}, the interface of {hca} port {number}, is Down "
                      "(ibdev2netdev): RoCE runs over it", measured="Down", expected="Up", evidence=evidence,
                      data=data, hint=f"bring it up (`ip link set {entry.netdev} up`) and check its cable and switch "
                      f"port (`ethtool {entry.netdev}` shows whether a link is detected)")
    elif nic.address:
        yield finding(Verdict.warned, f"{node}: the IPoIB interface {entry.netdev} of {hca} port {number} is Down "
                      f"(ibdev2netdev), so {nic.address} does not answer", measured="Down", expected="Up",
                      evidence=evidence, data=data, hint=f"RDMA does not need it, but the inventory gives "
                      f"{entry.netdev} an address: bring it up (`ip link set {entry.netdev} up`, `modprobe ib_ipoib`) "
                      "or leave the ip out of the inventory")


def _layer_mismatch(finding: partial[Finding], node: str, nic: Nic, name: str, layer: str,
                    evidence: tuple[Evidence, ...], data: dict[str, object]) -> Finding:
    want, other = _LAYER[nic.kind].value, ("roce" if layer == LinkLayer.ETHERNET.value else "infiniband")
    return finding(Verdict.failed, f"{node}: {name} has link layer {layer}, but the inventory lists {nic.name} as "
                   f"{nic.kind.value} ({want})", measured=layer, expected=want, hint=f"set kind: {other} for "
                   f"{nic.name} in the inventory, or switch the port's type (`mlxconfig -d <pci> set "
                   f"LINK_TYPE_P{nic.port}=...`, then reboot)", evidence=evidence, data={**data, "link_layer": layer})


def _down_hint(port: Port, nic: Nic) -> str:
    phys, up = port.physical_state, port.state in _ACTIVE
    if phys is PhysState.POLLING:
        return ("no link: check the cable and transceiver are seated, and that the switch port (or the peer, when "
                f"cabled back to back) is up; `ibstat {nic.hca} {nic.port}` shows when it trains")
    if phys is PhysState.DISABLED:
        return (f"the port is disabled: enable it (`ibportstate -C {nic.hca} -D 0 {nic.port} enable`, or `ip link set "
                "<netdev> up` for RoCE) and check the switch port is not shut")
    if phys is PhysState.LINK_UP and not up and nic.kind is NicKind.infiniband:
        return ("the cable is up but no subnet manager configured the port: run opensm on one node of the fabric or "
                "enable the switch's SM (`sminfo` shows whether one answers)")
    if phys is PhysState.LINK_UP and not up:
        return "the link is up but the RDMA port is not: check its netdev is up (`ibdev2netdev`, `ip link`) and `dmesg`"
    return "check the cable, the switch port and `dmesg | grep -i mlx` on the node"


def _gid_address(gid: str) -> ipaddress.IPv6Address | None:
    try:
        return ipaddress.IPv6Address(gid)
    except ValueError:
        return None


@check("roce.gid", "each listed RoCE address has a RoCE v2 GID", Scope.node,
       needs="nodes with roce NICs in the inventory")
def check_gids(ctx: Context) -> Iterator[Finding]:
    for node in ctx.reachable():
        nics = [n for n in node.nics if n.kind is NicKind.roce]
        finding = partial(Finding, "roce.gid", node=node.name)
        if not nics:
            yield finding(Verdict.skipped, f"{node.name}: no RoCE NICs listed")
            continue
        table = _gid_table(ctx.facts[node.name])
        if isinstance(table, Finding):
            yield table
            continue
        for nic in nics:
            yield _gid_finding(node.name, nic, table)


@dataclass(frozen=True)
class GidTable:
    """A node's GID tables from one tool: ``ibv_devinfo -v``, or ``show_gids`` where ibv_devinfo has none.

    ``netdevs`` maps (hca, port, index) to the GID's netdev; only show_gids prints it.
    """

    tool: str
    section: Section
    ports: dict[tuple[str, int], tuple[Gid, ...]]
    netdevs: dict[tuple[str, int, int], str] = field(default_factory=dict)


def _gid_table(facts: NodeFacts) -> GidTable | Finding:
    """The GID table of ``ibv_devinfo -v``; else that of ``show_gids`` when it ran to the end and is understood;
    else the warning that ibv_devinfo gave none."""
    node, section = facts.node, facts.section("ibv_devinfo")
    problem: Finding
    if section is None or section.missing:
        problem = Finding("roce.gid", Verdict.warned, f"{node}: ibv_devinfo is not installed, so the RoCE GID tables "
                          "could not be read", node=node, subject="ibv_devinfo", evidence=_evidence(node, [section]),
                          hint="install rdma-core's ibverbs-utils (ibv_devinfo); meanwhile `show_gids` lists the GIDs")
    else:
        try:
            devices = ibstat.parse_devinfo(section.output)
        except ParseError as exc:
            problem = Finding("roce.gid", Verdict.warned, f"{node}: ibv_devinfo printed output doctor does not "
                              f"understand: {exc}", node=node, subject="ibv_devinfo",
                              evidence=(section.evidence(node),),
                              hint=f"run `{section.command}` on {node}, or `show_gids`, to find the RoCE v2 GIDs")
        else:
            return GidTable("ibv_devinfo", section, {(ca.name, p.number): p.gids for ca in devices.cas
                                                     for p in ca.ports})
    fallback = facts.section("show_gids")
    if fallback is None or not fallback.ok:
        return problem  # not installed, or cut short by its time limit: a partial table would mislead
    try:
        rows = show_gids.parse(fallback.output).rows
    except ParseError:
        return problem
    ports: dict[tuple[str, int], tuple[Gid, ...]] = {}
    for row in rows:
        kind = {"v1": "RoCE v1", "v2": "RoCE v2"}.get(row.version or "")
        ports[(row.hca, row.port)] = (*ports.get((row.hca, row.port), ()), Gid(row.index, row.gid, kind))
    return GidTable("show_gids", fallback, ports,
                    {(r.hca, r.port, r.index): r.netdev for r in rows if r.netdev is not None})


def _gid_finding(node: str, nic: Nic, table: GidTable) -> Finding:
    hca, number, address, tool = nic.hca or "", nic.port, nic.address, table.tool
    finding = partial(Finding, "roce.gid", node=node, subject=f"{hca}/{number}",
                      evidence=(table.section.evidence(node),))
    if not address:
        return finding(Verdict.skipped, f"{node}: {nic.name} ({hca}) has no ip in the inventory, so its GID cannot "
                       "be matched", evidence=())
    gids = table.ports.get((hca, number))
    if gids is None:
        return finding(Verdict.failed, f"{node}: {hca} port {number} is not in the {tool} output",
                       hint="check `hca`/`port` in the inventory against `ibdev2netdev`")
    ip = ipaddress.ip_address(address)
    target = ipaddress.IPv6Address(f"::ffff:{ip}") if ip.version == 4 else ip
    same = [g for g in gids if _gid_address(g.gid) == target]
    v2 = [g.index for g in same if (g.kind or "").lower().replace(" ", "") == "rocev2"]
    data: dict[str, object] = {"address": address, "gid_indices": v2, "hca": hca, "port": number}
    if tool != "ibv_devinfo":
        data["source"] = tool
    # show_gids names each GID's netdev: where the address is on several (a bond and a VXLAN over it), the GID of
    # the inventory's interface is the one to use.
    on_nic = [i for i in v2 if table.netdevs.get((hca, number, i)) == nic.name]
    off_nic = {i: table.netdevs[(hca, number, i)] for i in v2 if i not in on_nic and (hca, number, i) in table.netdevs}
    if on_nic and off_nic:
        data["gid_netdevs"] = {str(i): table.netdevs.get((hca, number, i)) for i in v2}
        v2 = on_nic
    if v2:
        index = nic.gid_index if nic.gid_index in v2 else v2[0]
        data["gid_index"] = index
        if nic.gid_index is not None and nic.gid_index not in v2:
            elsewhere = (f" (index {nic.gid_index} is on {off_nic[nic.gid_index]})"
                         if on_nic and nic.gid_index in off_nic else "")
            return finding(Verdict.warned, f"{node}: the RoCE v2 GID for {address} on {hca} port {number} is index "
                           f"{index}, but the inventory says gid_index {nic.gid_index}{elsewhere}", measured=str(index),
                           expected=str(nic.gid_index), data=data, hint=f"set gid_index: {index} for {nic.name} "
                           "(NCCL_IB_GID_INDEX), or remove it to let NCCL choose; a wrong index hangs NCCL's connect")
        note = "" if nic.gid_index is not None else " (gid_index not set in the inventory: NCCL picks one itself)"
        return finding(Verdict.passed, f"{node}: {hca} port {number} has RoCE v2 GID index {index} for {address}{note}",
                       measured=str(index), expected=None if nic.gid_index is None else str(nic.gid_index), data=data)
    if same and all(g.kind is None for g in same):
        indices = ", ".join(str(g.index) for g in same)
        return finding(Verdict.warned, f"{node}: {address} has GID index {indices} on {hca} port {number}, but "
                       f"{tool} does not show GID types", measured=indices, data=data, hint="read the types from "
                       f"/sys/class/infiniband/{hca}/ports/{number}/gid_attrs/types/<index> (or `show_gids`) and set "
                       "gid_index to the RoCE v2 one")
    others = sorted({str(a.ipv4_mapped) for g in gids if (a := _gid_address(g.gid)) and a.ipv4_mapped})
    if same:
        what = "only " + ", ".join(f"GID {g.index} ({g.kind})" for g in same) + " carries it"
    else:
        what = f"its GIDs carry {', '.join(others)}" if others else "its GID table has no IPv4 entry"
    return finding(Verdict.failed, f"{node}: {hca} port {number} has no RoCE v2 GID for {address}: {what}",
                   measured=", ".join(others) or "none", expected=f"::ffff:{address}", data=data,
                   hint=f"the GID table follows the addresses of the port's netdev: check that {address} is configured "
                   f"on the interface of {hca} (`ibdev2netdev`, `ip addr`) and that the inventory's ip is right; RoCE "
                   f"v2 must be enabled (`cma_roce_mode -d {hca} -p {number} -m 2`)")


@check("ib.peermem", "nvidia_peermem is loaded (GPUDirect RDMA)", Scope.node,
       needs="nodes with GPUs and infiniband/roce NICs in the inventory")
def check_peermem(ctx: Context) -> Iterator[Finding]:
    for node in ctx.reachable():
        finding = partial(Finding, "ib.peermem", node=node.name)
        missing = [what for what, have in (("GPUs", node.gpus), ("InfiniBand/RoCE NICs", rdma_nics(node))) if not have]
        if missing:
            yield finding(Verdict.skipped, f"{node.name}: no {' and no '.join(missing)} listed")
            continue
        section = ctx.facts[node.name].section("peermem")
        state = section.output.strip() if section is not None and section.ok else None
        finding = partial(finding, subject="nvidia_peermem", measured=state or "unknown", expected="loaded",
                          evidence=_evidence(node.name, [section]))
        if state == "loaded":
            yield finding(Verdict.passed, f"{node.name}: nvidia_peermem is loaded (GPUDirect RDMA)")
            continue
        what = "is not loaded" if state == "absent" else "could not be checked"
        yield finding(Verdict.warned, f"{node.name}: nvidia_peermem {what}: GPUDirect RDMA is off unless NCCL uses "
                      "DMA-BUF, and GPU buffers are staged through host memory", hint="`modprobe nvidia_peermem` (and "
                      "list it in /etc/modules-load.d/ for reboots); with NCCL 2.19+, kernel 5.12+ and the open GPU "
                      "kernel modules, DMA-BUF works without it")
