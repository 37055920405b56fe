"""What the pair checks share: the networks they test, how they run jobs at once, and what they learned.

Pair tests run as a round-robin tournament (:mod:`clusterrun.doctor.schedule`). A node whose NIC drops
everything makes each test with it wait out its time limit, round after round; :class:`PathLedger` keeps
what the tests found so that, once a node is known dead on a network, later rounds (and later checks)
leave its pairs out instead of waiting for them again.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from clusterrun.doctor.checks.nics import interfaces
from clusterrun.doctor.contradictions import contradictions
from clusterrun.doctor.probe import path_prefix
from clusterrun.doctor.registry import Context
from clusterrun.errors import PlanError
from clusterrun.planning.network import resolve_data_network

T = TypeVar("T")


@dataclass(frozen=True)
class Endpoint:
    node: str
    nic: str
    address: str


@dataclass(frozen=True)
class Network:
    subnet: str
    members: dict[str, Endpoint]  # node -> its NIC on this subnet
    data: bool  # the data network clusterrun plans on

    @property
    def label(self) -> str:
        return f"{self.subnet} ({'data' if self.data else 'other'})"


def networks(ctx: Context, *, as_the_nodes_say: bool = False) -> list[Network]:
    """Subnets that two or more reachable nodes have an inventory NIC on, from the inventory and ``ip addr``.

    A NIC whose inventory entry the node contradicts (see :mod:`clusterrun.doctor.contradictions`) is left out:
    testing the inventory's address would blame the network for the inventory's mistake. With
    ``as_the_nodes_say`` it is in, with the node's own name and address (what a corrected inventory would say).
    """
    try:
        data = resolve_data_network(ctx.inventory)
        data_addresses = {p.address for p in data.paths}
    except PlanError:
        data_addresses = set()
    found: dict[str, dict[str, Endpoint]] = defaultdict(dict)
    wrong = contradictions(ctx)
    for node in ctx.reachable():
        ifaces = interfaces(ctx, node.name)
        for nic in node.nics:
            c = wrong.get((node.name, nic.name))
            if c is not None:
                if as_the_nodes_say and c.real_address and c.real_network:
                    found[c.real_network].setdefault(node.name, Endpoint(node.name, c.real_nic, c.real_address))
                continue
            iface = ifaces.get(nic.name) if ifaces else None
            candidates = [a for a in (iface.addresses if iface else ()) if a.family in ("inet", "inet6")
                          and a.scope != "link" and (nic.address is None or a.local == nic.address)]
            if candidates:
                a = candidates[0]
                subnet = str(ipaddress.ip_interface(f"{a.local}/{a.prefixlen}").network)
                found[subnet].setdefault(node.name, Endpoint(node.name, nic.name, a.local))
            elif nic.address and nic.network is not None:
                found[str(nic.network)].setdefault(node.name, Endpoint(node.name, nic.name, nic.address))
    nets = [Network(s, m, any(e.address in data_addresses for e in m.values())) for s, m in found.items() if len(m) > 1]
    return sorted(nets, key=lambda n: (not n.data, n.subnet))


def parallel(jobs: list[Callable[[], T]], limit: int = 64) -> list[T]:
    """Every job's result, in order; up to ``limit`` run at once (each job bounds its own waits)."""
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=min(limit, len(jobs)), thread_name_prefix="doctor") as pool:
        return list(pool.map(lambda job: job(), jobs))


def tool_argv(ctx: Context, argv: list[str]) -> list[str]:
    """``argv`` as the node runs it: through ``sh`` with ``doctor --path`` first in PATH when given."""
    if not ctx.options.path:
        return argv
    return ["sh", "-c", path_prefix(ctx.options.path) + "exec " + " ".join(shlex.quote(a) for a in argv)]


def has_tool(ctx: Context, node: str, tool: str) -> bool:
    for line in (ctx.facts[node].output("tools") or "").splitlines():
        name, _, path = line.partition(" ")
        if name == tool:
            return path.strip() not in ("", "-")
    return False


#: Distinct peers a node must have failed with (each of them working with someone else) to be called dead.
DEAD_AFTER_PEERS = 2


@dataclass
class PathLedger:
    """Per network (subnet): the peers each node reached, and those it could not reach in either direction.

    A node is **dead** on a network when it reached no peer there, failed with at least
    :data:`DEAD_AFTER_PEERS` distinct peers, and each of those peers reached some other node: the
    common factor of the failures is the node itself (its NIC, cable, switch port or firewall). Two
    nodes that only fail with each other are a pair problem and are never called dead.
    """

    reached: dict[str, dict[str, set[str]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(set)))
    failed: dict[str, dict[str, set[str]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(set)))

    def record(self, subnet: str, a: str, b: str, ok: bool) -> None:
        """One test between ``a`` and ``b`` (either direction) on ``subnet`` got through, or did not."""
        book = self.reached if ok else self.failed
        book[subnet][a].add(b)
        book[subnet][b].add(a)

    def dead(self, subnet: str) -> set[str]:
        """Nodes known dead on ``subnet`` (see the class docstring)."""
        reached, failed = self.reached[subnet], self.failed[subnet]
        return {node for node, peers in failed.items()
                if not reached[node] and len(peers) >= DEAD_AFTER_PEERS
                and all(reached[p] - {node} for p in peers)}

    def peers_failed(self, subnet: str, node: str) -> set[str]:
        return set(self.failed[subnet][node])


def ledger(ctx: Context) -> PathLedger:
    """This doctor run's ledger: the checks that test pairs share it (ping first, then bandwidth and port)."""
    found = ctx.extra.get("paths")
    if not isinstance(found, PathLedger):
        found = ctx.extra["paths"] = PathLedger()
    return found


def live_pairs(pairs: list[tuple[str, str]], dead: set[str]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``pairs`` split into those to test and those left out because a node of the pair is dead."""
    keep = [(a, b) for a, b in pairs if a not in dead and b not in dead]
    return keep, [p for p in pairs if p not in keep]
