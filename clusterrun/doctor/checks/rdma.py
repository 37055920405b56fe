"""InfiniBand/RoCE port checks: each listed port is up at its listed rate, with the link layer and netdev the
inventory says (the sources of a port's facts: :mod:`clusterrun.doctor.checks.rdma_view`)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from clusterrun.doctor.checks.rdma_view import ACTIVE, RdmaView, evidence_of, port_names, rdma_nics, rdma_view
from clusterrun.doctor.model import Evidence, Finding, Scope, Verdict
from clusterrun.doctor.registry import Context, check
from clusterrun.facts.node import RDMA_SOURCE
from clusterrun.facts.parsers.ibdev2netdev import NetdevState
from clusterrun.facts.parsers.ibstat import LinkLayer, PhysState, Port
from clusterrun.inventory.models import Nic, NicKind

_PHYS_WORD = {PhysState.SLEEP: "Sleep", PhysState.POLLING: "Polling", PhysState.DISABLED: "Disabled",
              PhysState.TRAINING: "PortConfigurationTraining", PhysState.LINK_UP: "LinkUp",
              PhysState.ERROR_RECOVERY: "LinkErrorRecovery", PhysState.PHY_TEST: "PhyTest"}
_LAYER = {NicKind.infiniband: LinkLayer.INFINIBAND, NicKind.roce: LinkLayer.ETHERNET}
NO_DEVICE_HINT = ("no RDMA device is visible: check the HCA is seen (`lspci | grep -i mellanox`) and its driver "
                  "loaded (`modprobe mlx5_ib`), and in a container that /dev/infiniband is passed in")
INSTALL_HINT = ("install infiniband-diags (ibstat) and rdma-core's ibverbs-utils (ibv_devinfo) on the node so doctor "
                "can read port state, rate and GIDs")


@check("ib.port", "listed InfiniBand/RoCE ports are up at their listed rate", Scope.node,
       needs="nodes with infiniband/roce NICs in the inventory")
def check_ports(ctx: Context) -> Iterator[Finding]:
    for node in ctx.reachable():
        view, nics = rdma_view(ctx.facts[node.name]), rdma_nics(node)
        finding = partial(Finding, "ib.port", node=node.name)
        active = port_names(view.active() - {(n.hca or "", n.port) for n in nics})
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
                          subject=", ".join(port_names((n.hca or "", n.port) for n in nics)),
                          evidence=evidence_of(node.name, [view.sys_section]))
            continue
        for nic in nics:
            port_finding = _port_finding(node.name, nic, view)
            yield port_finding
            yield from _netdev_findings(node.name, nic, view, port_finding)
        if active:
            yield finding(Verdict.passed, f"{node.name}: active RDMA ports not in the inventory: {', '.join(active)} "
                          "(clusterrun jobs do not use them)", subject=", ".join(active), data={"unlisted": active},
                          hint="list them under the node's nics (kind infiniband or roce, with hca and port) for "
                          "NCCL to use them", evidence=evidence_of(node.name, [s for s, _ in view.parsed.values()]))


def _port_finding(node: str, nic: Nic, view: RdmaView) -> Finding:
    hca, number, want = nic.hca or "", nic.port, _LAYER[nic.kind]
    name = f"{hca} port {number}"
    finding = partial(Finding, "ib.port", node=node, subject=f"{hca}/{number}")
    data: dict[str, object] = {"hca": hca, "port": number, "nic": nic.name}
    found, listed = view.port(hca, number), view.listed()
    if found is None and (stateless := view.stateless(hca, number)) is not None:
        # listed, but by a source without its state (plain ibdev2netdev, /sys without a readable state file)
        source, sys_layer, sections = stateless
        evidence = evidence_of(node, sections)
        if sys_layer and sys_layer != want.value:
            return _layer_mismatch(finding, node, nic, name, sys_layer, evidence, data)
        entry = view.netdevs.port(hca, number) if view.netdevs is not None else None
        seen = f"{sys_layer or 'link layer unknown'}" + (
            f"; ibdev2netdev: {entry.netdev} {entry.state.value}" if entry is not None else "")
        why = view.unread() + (", ibdev2netdev shows no port state for it (`ibdev2netdev -v` does)"
                               if entry is not None and entry.port_state is None else "")
        return finding(Verdict.warned, f"{node}: {name} exists ({seen}) but its state could not be read: {why}",
                       hint=INSTALL_HINT, evidence=evidence,
                       data={**data, "source": "rdma_sys" if source == RDMA_SOURCE else source})
    if found is None and listed is None:
        return finding(Verdict.warned, f"{node}: the state of {name} could not be read: {view.unread()}",
                       hint=INSTALL_HINT, evidence=evidence_of(node, [s for s, _ in view.errors.values()]), data=data)
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
                       expected=f"{hca}/{number}", hint=hint, evidence=evidence_of(node, where), data=data)
    port, sections = found
    evidence = evidence_of(node, sections)
    phys = _PHYS_WORD.get(port.physical_state) if port.physical_state else None
    layer = port.link_layer.value if port.link_layer else None
    data.update(state=port.state.value, physical_state=phys, link_layer=layer, rate_gbps=port.rate_gbps)
    if layer and port.link_layer not in (want, LinkLayer.UNSPECIFIED):
        return _layer_mismatch(finding, node, nic, name, layer, evidence, data)
    measured, expected = f"{port.state.value}/{phys or '?'}", "ACTIVE/LinkUp"
    if port.state not in ACTIVE or (phys and port.physical_state is not PhysState.LINK_UP):
        if port.state in ACTIVE:
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
                      evidence=evidence_of(node, [view.netdev_section, view.sys_section]), data=data,
                      hint=f"{fix} in the inventory (`ibdev2netdev` lists each port's interface): NCCL_IB_HCA and "
                      "NCCL_SOCKET_IFNAME come from these pairs, so a wrong one puts RDMA traffic on another port "
                      "than the address it is given")
        return
    if entry.state is not NetdevState.DOWN or port_finding.verdict is Verdict.failed:
        return
    evidence = evidence_of(node, [view.netdev_section])
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
    phys, up = port.physical_state, port.state in ACTIVE
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
