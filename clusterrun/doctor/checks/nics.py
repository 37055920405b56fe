"""NIC checks from ``ip -j addr``: each inventory NIC exists, is up and has its address; MTU equal per network;
NICs that are up but not in the inventory (what NCCL may pick by mistake)."""

from __future__ import annotations

import ipaddress
from collections import Counter, defaultdict
from collections.abc import Iterator

from clusterrun.doctor.contradictions import contradictions
from clusterrun.doctor.model import Finding, Scope, Verdict
from clusterrun.doctor.registry import Context, check
from clusterrun.facts.nics import VIRTUAL_PREFIXES
from clusterrun.facts.parsers import ip


def interfaces(ctx: Context, node: str) -> ip.Interfaces | None:
    """The node's interfaces as its reporter gave them, or None when they are unknown (reported by
    ``nic.present``)."""
    report = ctx.facts[node].report
    return report.interfaces if report is not None else None


def _state(iface: ip.Interface) -> str:
    return f"{iface.operstate}{'' if 'LOWER_UP' in iface.flags else ', no carrier'}"


@check("nic.present", "inventory NICs exist, are up and have their address", Scope.node)
def nics_present(ctx: Context) -> Iterator[Finding]:
    for node in ctx.reachable():
        facts = ctx.facts[node.name]
        section = facts.ip_section()
        evidence = (section.evidence(node.name),) if section else ()
        if not node.nics:
            yield Finding("nic.present", Verdict.skipped, f"{node.name}: no NICs listed in the inventory",
                          node=node.name)
            continue
        report = facts.report
        if report is None:
            yield Finding("nic.present", Verdict.warned, f"{node.name}: NICs not checked: {facts.report_problem}",
                          node=node.name, evidence=evidence, hint="set `python` in the inventory to an interpreter "
                          "the node has (clusterrun reads a node's NICs with it), or install python3 there")
            continue
        ifaces = report.interfaces
        if ifaces is None and report.ip_ran:
            yield Finding("nic.present", Verdict.warned, f"{node.name}: cannot read `ip -j addr`: {report.ip_error}",
                          node=node.name, evidence=evidence)
            continue
        if ifaces is None:
            yield Finding("nic.present", Verdict.warned, f"{node.name}: `ip -j addr` failed; NICs not checked",
                          node=node.name, evidence=evidence, hint="install iproute2 on the node")
            continue
        for nic in node.nics:
            iface = ifaces.get(nic.name)
            found = contradictions(ctx).get((node.name, nic.name))
            if iface is None:
                holder = ifaces.with_address(nic.address) if nic.address else None
                where = f"; {nic.address} is on {holder.name}" if holder else ""
                known = ", ".join(i.name for i in ifaces.interfaces if i.name != "lo")
                fix = f" at {found.where}: {found.snippet} is what the node has" if found else ""
                yield Finding("nic.present", Verdict.failed, f"{node.name}: no interface {nic.name}{where}",
                              node=node.name, subject=nic.name, measured=known, expected=nic.name, evidence=evidence,
                              hint=f"fix the NIC name in the inventory{fix} (this node has: {known})",
                              data=found.to_data() if found else {})
                continue
            if not iface.is_up:
                yield Finding("nic.present", Verdict.failed, f"{node.name}: {nic.name} is down ({_state(iface)})",
                              node=node.name, subject=nic.name, measured=_state(iface), expected="UP",
                              evidence=evidence, hint=f"bring it up (`ip link set {nic.name} up`) or check its cable")
                continue
            addresses = [a.local for a in iface.addresses]
            if nic.address and ipaddress.ip_address(nic.address) not in {ipaddress.ip_address(a) for a in addresses}:
                holder = ifaces.with_address(nic.address)
                where = f" ({nic.address} is on {holder.name})" if holder else ""
                at = f" ({found.where})" if found and found.where != "the inventory" else ""
                fix = f" to {found.snippet}, what the node has" if found and found.real_address else ""
                yield Finding("nic.present", Verdict.failed,
                              f"{node.name}: {nic.name} does not have {nic.address}{where}; it has "
                              f"{', '.join(addresses) or 'no address'}{at}", node=node.name, subject=nic.name,
                              measured=", ".join(addresses) or "none", expected=nic.address, evidence=evidence,
                              hint=f"an inventory problem: fix `ip` of this NIC in the inventory{at}{fix}, or the "
                                   f"node's address; the checks that use this address do not test it until then",
                              data=found.to_data() if found else {})
                continue
            yield Finding("nic.present", Verdict.passed,
                          f"{node.name}: {nic.name} up, {', '.join(addresses) or 'no address'}, mtu {iface.mtu}",
                          node=node.name, subject=nic.name, measured=", ".join(addresses), evidence=evidence,
                          data={"mtu": iface.mtu, "addresses": addresses})


@check("nic.mtu", "same MTU on every node of a network", Scope.cluster)
def same_mtu(ctx: Context) -> Iterator[Finding]:
    by_network: dict[str, dict[str, tuple[str, int]]] = defaultdict(dict)
    for node in ctx.reachable():
        ifaces = interfaces(ctx, node.name)
        if ifaces is None:
            continue
        for nic in node.nics:
            iface = ifaces.get(nic.name)
            if nic.network is None or iface is None:
                continue
            by_network[str(nic.network)][node.name] = (nic.name, iface.mtu)
    if not by_network:
        yield Finding("nic.mtu", Verdict.skipped, "no inventory NIC with an address and prefix (ip: a.b.c.d/NN) found")
        return
    for network, members in by_network.items():
        mtus = Counter(mtu for _, mtu in members.values())
        if len(mtus) == 1:
            yield Finding("nic.mtu", Verdict.passed, f"{network}: mtu {next(iter(mtus))} on all {len(members)} nodes",
                          subject=network, measured=str(next(iter(mtus))))
            continue
        common = mtus.most_common(1)[0][0]
        odd = {n: v for n, v in members.items() if v[1] != common}
        for name, (nic, mtu) in odd.items():
            yield Finding("nic.mtu", Verdict.warned,
                          f"{name}: {nic} has mtu {mtu} on {network}, the other nodes {common}", node=name, subject=nic,
                          measured=str(mtu), expected=str(common),
                          hint=f"set the same MTU on every node of {network} (`ip link set {nic} mtu {common}` on "
                               f"{name}, and on the switch): larger packets are dropped and transfers hang")


@check("nic.unlisted", "NICs that are up but not in the inventory", Scope.node)
def unlisted(ctx: Context) -> Iterator[Finding]:
    for node in ctx.reachable():
        ifaces = interfaces(ctx, node.name)
        if ifaces is None:
            continue
        listed = {nic.name for nic in node.nics}
        extra = [i for i in ifaces.interfaces
                 if i.name not in listed and i.is_up and not i.name.startswith(VIRTUAL_PREFIXES) and i.master is None
                 and any(a.family == "inet" for a in i.addresses)]
        if not extra:
            yield Finding("nic.unlisted", Verdict.passed, f"{node.name}: no other NIC with an IPv4 address is up",
                          node=node.name)
            continue
        text = ", ".join(f"{i.name} ({', '.join(a.local for a in i.addresses if a.family == 'inet')})" for i in extra)
        yield Finding("nic.unlisted", Verdict.passed, f"{node.name}: also up, not in the inventory: {text}",
                      node=node.name, subject=", ".join(i.name for i in extra), measured=text,
                      hint="clusterrun sets NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to the data NIC, so jobs it starts do "
                           "not use these; list them under `nics` if one of them is the fast network",
                      data={"unlisted": [i.name for i in extra]})
