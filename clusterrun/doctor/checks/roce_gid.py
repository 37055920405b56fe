"""RoCE GID check: each listed RoCE address has a RoCE v2 GID (NCCL_IB_GID_INDEX), from ``ibv_devinfo -v`` or,
where that has none, MLNX_OFED's ``show_gids``."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

from clusterrun.doctor.checks.rdma_view import evidence_of
from clusterrun.doctor.facts import NodeFacts, Section
from clusterrun.doctor.model import Finding, Scope, Verdict
from clusterrun.doctor.registry import Context, check
from clusterrun.errors import ParseError
from clusterrun.facts.parsers import ibstat, show_gids
from clusterrun.facts.parsers.ibstat import Gid
from clusterrun.inventory.models import Nic, NicKind


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
                          "could not be read", node=node, subject="ibv_devinfo", evidence=evidence_of(node, [section]),
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
