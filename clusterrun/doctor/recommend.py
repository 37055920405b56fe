"""The settings doctor recommends from what it found: the data network, and each node's NIC and HCAs there.

Built from what the nodes have, not what the inventory says: a NIC the inventory gets wrong (see
:mod:`clusterrun.doctor.contradictions`) is written with the node's own name and address, and a network is
never given up for a slower one because of such a NIC: its pairs were not tested, so they are no evidence.
"""

from __future__ import annotations

import ipaddress

from clusterrun.doctor.checks.paths import Network, networks
from clusterrun.doctor.contradictions import contradictions
from clusterrun.doctor.model import Finding, Verdict
from clusterrun.doctor.registry import Context


def _broken(findings: list[Finding], check: str) -> set[tuple[str | None, str | None]]:
    return {(f.node, f.subject) for f in findings if f.check == check and f.verdict is Verdict.failed}


def choose_network(ctx: Context, findings: list[Finding]) -> tuple[Network | None, str]:
    """The data network to use: the planned one unless pings failed on it, else one on which every ping answered."""
    nets = networks(ctx, as_the_nodes_say=True)
    pinged = any(f.check == "net.ping" and f.verdict is not Verdict.skipped for f in findings)
    bad_nics = _broken(findings, "net.ping")  # (node, NIC) of every failed ping finding

    def healthy(net: Network) -> bool:
        return not any((ep.node, ep.nic) in bad_nics for ep in net.members.values())

    wrong = {(c.node, c.real_nic) for c in contradictions(ctx).values()}
    for net in nets:  # data network first
        if healthy(net):
            if not pinged:
                return net, "the planned data network (run net.ping to test it)"
            why = "the planned data network, and every pair answered" if net.data else \
                "every pair answered on it (the planned data network did not pass)"
            untested = sorted(ep.node for ep in net.members.values() if (ep.node, ep.nic) in wrong)
            if untested and net.data:
                why = f"the planned data network; {', '.join(untested)} not tested (see nic.present)" + (
                    ", every other pair answered" if len(net.members) - len(untested) > 1 else "")
            return net, why
    return None, "no network passed the pairwise ping"


def recommend(ctx: Context, findings: list[Finding]) -> str:
    """An inventory snippet to paste (comments say where each value came from); empty when nothing is known."""
    if len(ctx.inventory.nodes) < 2 or not networks(ctx, as_the_nodes_say=True):
        return ""  # one node, or no NIC known: nothing to recommend from evidence
    net, why = choose_network(ctx, findings)
    if net is None:
        return f"# {why}: fix the NICs named above, then run doctor again\n"
    bad_ports = _broken(findings, "ib.port")
    wrong = contradictions(ctx)
    prefix = ipaddress.ip_network(net.subnet).prefixlen
    lines = [f"network:\n  data: {net.subnet}   # {why}", "nodes:"]
    for node in ctx.inventory.nodes:
        ep = net.members.get(node.name)
        if ep is None:
            lines.append(f"  - name: {node.name}   # not on {net.subnet} (unreachable or no NIC there)")
            continue
        hcas = [f"{nic.hca}:{nic.port}" for nic in node.nics
                if nic.kind.is_rdma and nic.hca and (node.name, nic.name) not in bad_ports
                and (node.name, f"{nic.hca}/{nic.port}") not in bad_ports]
        env = f"NCCL_SOCKET_IFNAME={ep.nic}" + (f", NCCL_IB_HCA={','.join(hcas)}" if hcas else "")
        lines.append(f"  - name: {node.name}   # {env}")
        fixed = next((c for c in wrong.values() if c.node == node.name and c.real_address == ep.address), None)
        said = f"   # the node's own; {fixed.where} says {fixed.listed} (not tested)" if fixed else ""
        lines.append(f"    nics: [{{name: {ep.nic}, ip: {ep.address}/{prefix}}}]{said}")
    return "\n".join(lines) + "\n"
