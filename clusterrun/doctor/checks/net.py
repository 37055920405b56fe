"""Network checks that send traffic: pairwise ping per network, bandwidth on the data network, the master port.

Pairs are scheduled as a round-robin tournament (:mod:`clusterrun.doctor.schedule`): all pairs of a round
run at once, so N nodes take about N-1 rounds, not N(N-1)/2 tests one after the other.
"""

from __future__ import annotations

import ipaddress
import shlex
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from clusterrun import remote
from clusterrun.doctor.checks.nics import interfaces
from clusterrun.doctor.model import Evidence, Finding, Scope, Verdict
from clusterrun.doctor.probe import path_prefix
from clusterrun.doctor.registry import Context, check
from clusterrun.doctor.schedule import round_robin
from clusterrun.errors import ClusterrunError, ParseError, PlanError
from clusterrun.facts.parsers import iperf3, ping
from clusterrun.network import resolve_data_network
from clusterrun.transport.reader import LineReader

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


def networks(ctx: Context) -> list[Network]:
    """Subnets that two or more reachable nodes have an inventory NIC on, from the inventory and ``ip addr``."""
    try:
        data = resolve_data_network(ctx.inventory)
        data_addresses = {p.address for p in data.paths}
    except PlanError:
        data_addresses = set()
    found: dict[str, dict[str, Endpoint]] = defaultdict(dict)
    for node in ctx.reachable():
        ifaces = interfaces(ctx, node.name)
        for nic in node.nics:
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


# ------------------------------------------------------------------------------------------- ping


@dataclass(frozen=True, eq=False)  # compared and hashed by identity
class PingOutcome:
    net: Network
    src: Endpoint
    dst: Endpoint
    result: ping.PingResult | None
    error: str | None
    evidence: Evidence

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.received > 0


def _ping(ctx: Context, net: Network, src: Endpoint, dst: Endpoint) -> PingOutcome:
    count = ctx.options.ping_count
    argv = ["ping", "-n", "-c", str(count), "-i", "0.2", "-W", "1", "-w", str(count + 2), "-I", src.address,
            dst.address]
    command = " ".join(shlex.quote(a) for a in argv)
    try:
        res = ctx.transports[src.node].run(tool_argv(ctx, ["env", "LC_ALL=C", *argv]), timeout=count + 10)
    except ClusterrunError as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        return PingOutcome(net, src, dst, None, reason, Evidence(command, reason, None, src.node))
    evidence = Evidence(command, res.stdout + res.stderr, res.exit_code, src.node)
    try:
        return PingOutcome(net, src, dst, ping.parse(res.stdout + res.stderr), None, evidence)
    except ParseError as exc:
        return PingOutcome(net, src, dst, None, str(exc), evidence)


@check("net.ping", "every node reaches every other on each network (ping)", Scope.pair, active=True)
def pairwise_ping(ctx: Context) -> Iterator[Finding]:
    nets = networks(ctx)
    if not nets:
        yield Finding("net.ping", Verdict.skipped, "no network with two or more nodes whose NICs and addresses are "
                                                   "known (list `nics` with `ip` in the inventory)")
        return
    without = [n.name for n in ctx.reachable() if not has_tool(ctx, n.name, "ping")]
    if without:
        yield Finding("net.ping", Verdict.skipped, f"ping is not installed on {', '.join(without)}; pairs from "
                      "there are not tested", hint="install iputils-ping", data={"nodes": without})
    nodes = [n.name for n in ctx.reachable()]
    outcomes: list[PingOutcome] = []
    rounds = round_robin(nodes)
    for i, pairs in enumerate(rounds, 1):
        ctx.progress(f"ping round {i}/{len(rounds)}")
        jobs: list[Callable[[], PingOutcome]] = []
        for a, b in pairs:
            for net in nets:
                if a in net.members and b in net.members:
                    for s, d in ((a, b), (b, a)):
                        if s not in without:
                            jobs.append(lambda net=net, s=s, d=d: _ping(ctx, net, net.members[s], net.members[d]))
        outcomes += parallel(jobs)
    yield from _judge_pings(nets, outcomes)


def _judge_pings(nets: list[Network], outcomes: list[PingOutcome]) -> Iterator[Finding]:
    good = [n for n in nets if any(o.net is n for o in outcomes) and all(o.ok for o in outcomes if o.net is n)]
    for net in nets:
        mine = [o for o in outcomes if o.net is net]
        failed = [o for o in mine if not o.ok]
        if not mine:
            yield Finding("net.ping", Verdict.skipped, f"{net.label}: no ping ran (ping missing on its nodes)",
                          subject=net.subnet)
            continue
        if not failed:
            rtts = [o.result.rtt_avg_ms for o in mine if o.result and o.result.rtt_avg_ms is not None]
            avg = f", average rtt {statistics.mean(rtts):.2f} ms" if rtts else ""
            yield Finding("net.ping", Verdict.passed, f"{net.label}: all {len(mine)} directed pairs answer{avg}",
                          subject=net.subnet, measured=f"{len(mine)}/{len(mine)}")
            continue
        peers: dict[str, set[str]] = defaultdict(set)  # node -> peers it failed with (either direction)
        tested: dict[str, set[str]] = defaultdict(set)
        for o in mine:
            tested[o.src.node].add(o.dst.node)
            tested[o.dst.node].add(o.src.node)
            if not o.ok:
                peers[o.src.node].add(o.dst.node)
                peers[o.dst.node].add(o.src.node)
        # A node that fails with every peer it was tested with, while others succeed among themselves, is the culprit.
        isolated = [n for n in peers if peers[n] == tested[n] and len(tested[n]) > 1]
        explained = {o for o in failed if o.src.node in isolated or o.dst.node in isolated}
        fallback = next((g for g in good if g is not net), None)
        for name in isolated:
            ep = net.members[name]
            advice = (f"; until it is fixed, use {fallback.subnet} (set `network.data: {fallback.subnet}` in the "
                      f"inventory, which sets NCCL_SOCKET_IFNAME to each node's NIC there)" if fallback and net.data
                      else "")
            yield Finding("net.ping", Verdict.failed,
                          f"{name}: {ep.nic} ({ep.address}) reaches no peer on {net.subnet} "
                          f"({len(peers[name])} peer(s) tried both ways)", node=name, subject=ep.nic,
                          measured=f"0/{len(tested[name])} peers", expected="all peers",
                          hint=f"the NIC is up but its traffic is dropped: check its cable, switch port, VLAN and "
                               f"firewall (iptables/nft) on {name}{advice}",
                          evidence=tuple(o.evidence for o in failed if name in (o.src.node, o.dst.node))[:4],
                          data={"unreachable_peers": sorted(peers[name])})
        for o in failed:
            if o in explained:
                continue
            why = o.error or (o.result.error if o.result and o.result.error else "no reply")
            yield Finding("net.ping", Verdict.failed,
                          f"{o.src.node} -> {o.dst.node} on {net.subnet}: {o.src.nic} gets no reply from "
                          f"{o.dst.address} ({why})", node=o.src.node, subject=o.src.nic,
                          hint=f"check routing and firewalls between {o.src.node} and {o.dst.node} on this network",
                          evidence=(o.evidence,))


# -------------------------------------------------------------------------------------- bandwidth


@dataclass(frozen=True)
class Transfer:
    src: str
    dst: str
    bps: float | None
    tool: str
    error: str | None
    evidence: tuple[Evidence, ...]


def _serve(ctx: Context, dst: Endpoint, seconds: float) -> tuple[LineReader, object, int | None, str | None]:
    python = ctx.inventory.python_of(next(n for n in ctx.inventory.nodes if n.name == dst.node))
    stream = ctx.transports[dst.node].start(remote.argv(python, "netprobe", "listen", dst.address, 0, seconds + 30))
    reader = LineReader(stream)
    line = reader.wait_for("LISTENING", 20)
    if line is None or not line.startswith("LISTENING"):
        stream.abort()
        return reader, stream, None, (line or f"no listener: {stream.stderr_text().strip()[-200:]}")
    return reader, stream, int(line.split()[1]), None


def _builtin(ctx: Context, src: Endpoint, dst: Endpoint, seconds: float) -> Transfer:
    reader, stream, port, err = _serve(ctx, dst, seconds)
    if port is None:
        return Transfer(src.node, dst.node, None, "builtin", err, ())
    try:
        python = ctx.inventory.python_of(next(n for n in ctx.inventory.nodes if n.name == src.node))
        argv = remote.argv(python, "netprobe", "send", dst.address, port, seconds)
        res = ctx.transports[src.node].run(argv, timeout=seconds + 30)
        got = reader.wait_for("RECEIVED", 15)
    except ClusterrunError as exc:
        return Transfer(src.node, dst.node, None, "builtin", getattr(exc, "reason", str(exc)), ())
    finally:
        stream.abort()
    evidence = (Evidence(f"probe send {dst.address}:{port} {seconds:g}s", res.stdout + res.stderr, res.exit_code,
                         src.node), Evidence(f"probe listen {dst.address}", got or "", None, dst.node))
    if not got or not got.startswith("RECEIVED"):
        return Transfer(src.node, dst.node, None, "builtin", (res.stderr or res.stdout).strip()[-300:] or got, evidence)
    _, nbytes, secs = got.split()
    bps = int(nbytes) * 8 / float(secs) if float(secs) > 0 else None
    return Transfer(src.node, dst.node, bps, "builtin", None, evidence)


def _iperf(ctx: Context, src: Endpoint, dst: Endpoint, seconds: float) -> Transfer:
    # Find a free port with the probe's listener, then hand it to iperf3's one-off server.
    _, stream, port, err = _serve(ctx, dst, 1)
    stream.abort()
    if port is None:
        return Transfer(src.node, dst.node, None, "iperf3", err, ())
    # --forceflush: without a terminal iperf3 holds "Server listening" back until it exits.
    server = ctx.transports[dst.node].start(tool_argv(ctx, ["timeout", str(int(seconds + 30)), "iperf3", "-s", "-1",
                                                         "--forceflush", "-p", str(port), "-B", dst.address]))
    sreader = LineReader(server)
    try:
        if sreader.wait_for("Server listening", 15) is None:
            return Transfer(src.node, dst.node, None, "iperf3", f"iperf3 server did not start on {dst.node}: "
                            f"{server.stderr_text().strip()[-200:]}", ())
        argv = ["timeout", str(int(seconds + 20)), "iperf3", "-c", dst.address, "-p", str(port), "-t", f"{seconds:g}",
                "-B", src.address, "-J"]
        res = ctx.transports[src.node].run(tool_argv(ctx, argv), timeout=seconds + 30)
    except ClusterrunError as exc:
        return Transfer(src.node, dst.node, None, "iperf3", getattr(exc, "reason", str(exc)), ())
    finally:
        server.abort()
    evidence = (Evidence(" ".join(argv), res.stdout[-4000:] + res.stderr, res.exit_code, src.node),)
    try:
        parsed = iperf3.parse(res.stdout)
    except ParseError as exc:
        return Transfer(src.node, dst.node, None, "iperf3", str(exc), evidence)
    if parsed.error:
        return Transfer(src.node, dst.node, None, "iperf3", parsed.error, evidence)
    return Transfer(src.node, dst.node, parsed.receiver_bps, "iperf3", None, evidence)


def _gbit(bps: float | None) -> str:
    return "n/a" if bps is None else (f"{bps / 1e9:.2f} Gbit/s" if bps >= 1e9 else f"{bps / 1e6:.0f} Mbit/s")


@check("net.bandwidth", "TCP bandwidth between pairs on the data network", Scope.pair, active=True)
def bandwidth(ctx: Context) -> Iterator[Finding]:
    data = next((n for n in networks(ctx) if n.data), None)
    if data is None:
        yield Finding("net.bandwidth", Verdict.skipped, "no data network with two or more reachable nodes and known NICs")
        return
    nodes = [n for n in data.members]
    rounds = round_robin(nodes)[: ctx.options.bandwidth_rounds or None]
    tool = ctx.options.bandwidth_tool
    if tool == "auto":
        tool = "iperf3" if all(has_tool(ctx, n, "iperf3") for n in nodes) else "builtin"
    measure = _iperf if tool == "iperf3" else _builtin
    seconds = ctx.options.bandwidth_seconds
    transfers: list[Transfer] = []
    for i, pairs in enumerate(rounds, 1):
        ctx.progress(f"bandwidth round {i}/{len(rounds)} ({tool}, {len(pairs)} pair(s) at once)")
        for direction in (0, 1):  # both ways, one direction at a time: each NIC's send and receive side
            jobs = [(lambda s=s, d=d: measure(ctx, data.members[s], data.members[d], seconds))
                    for a, b in pairs for s, d in ((a, b), (b, a))[direction:direction + 1]]
            transfers += parallel(jobs)
    yield from _judge_bandwidth(ctx, data, transfers, tool)


def _judge_bandwidth(ctx: Context, data: Network, transfers: list[Transfer], tool: str) -> Iterator[Finding]:
    for t in transfers:
        if not t.bps:  # None (no result) or 0 (nothing got through: an MTU black hole looks like this)
            why = t.error or ("nothing got through" if t.bps == 0 else "no result")
            yield Finding("net.bandwidth", Verdict.failed, f"{t.src} -> {t.dst} on {data.subnet}: no measure ({why})",
                          node=t.src, subject=data.members[t.src].nic, evidence=t.evidence,
                          hint="see net.ping for reachability; a firewall may drop the probe's port")
    measured = [t for t in transfers if t.bps]
    if not measured:
        return
    median = statistics.median(t.bps for t in measured)  # type: ignore[misc]
    speeds = {n.name: next((nic.speed for nic in n.nics if nic.name == data.members[n.name].nic and nic.speed), None)
              for n in ctx.inventory.nodes if n.name in data.members}
    slow: set[str] = set()
    for name in data.members:
        for side, picks in (("sends", [t for t in measured if t.src == name]),
                            ("receives", [t for t in measured if t.dst == name])):
            if len(picks) < 2 and len(data.members) > 2:
                continue
            best = max(t.bps for t in picks) if picks else None  # type: ignore[type-var]
            if best is not None and len(data.members) > 2 and best < 0.7 * median:
                slow.add(name)
                yield Finding("net.bandwidth", Verdict.warned,
                              f"{name}: {data.members[name].nic} {side} at {_gbit(best)} at best, the cluster's median "
                              f"is {_gbit(median)}", node=name, subject=data.members[name].nic, measured=_gbit(best),
                              expected=_gbit(median),
                              hint="a slow NIC slows every collective: check its negotiated speed (`ethtool`), "
                                   "cable, switch port, and traffic shaping or other jobs on the node",
                              evidence=tuple(e for t in picks for e in t.evidence)[:4])
    for t in measured:
        line = min(filter(None, (speeds.get(t.src), speeds.get(t.dst))), default=None)
        if line and t.bps < 0.5 * line and t.src not in slow and t.dst not in slow:  # type: ignore[operator]
            yield Finding("net.bandwidth", Verdict.warned,
                          f"{t.src} -> {t.dst}: {_gbit(t.bps)}, under half the listed {_gbit(line)}", node=t.src,
                          subject=data.members[t.src].nic, measured=_gbit(t.bps), expected=_gbit(line),
                          hint="one TCP stream rarely fills a fast link; compare with `iperf3 -P 4`, and check the "
                               "NIC's negotiated speed and MTU", evidence=t.evidence)
    rates = ", ".join(f"{t.src}->{t.dst} {_gbit(t.bps)}" for t in measured)
    yield Finding("net.bandwidth", Verdict.passed,
                  f"{data.subnet}: median {_gbit(median)} over {len(measured)} transfer(s) ({tool}): {rates}",
                  subject=data.subnet, measured=_gbit(median),
                  data={"median_bps": median, "tool": tool,
                        "transfers": [{"src": t.src, "dst": t.dst, "bps": t.bps} for t in measured]})


# ------------------------------------------------------------------------------------- master port


@check("net.port", "the master port is free on rank 0 and reachable from every node", Scope.cluster, active=True)
def master_port(ctx: Context) -> Iterator[Finding]:
    reachable = ctx.reachable()
    if len(reachable) < 2 or reachable[0].name != ctx.inventory.nodes[0].name:
        yield Finding("net.port", Verdict.skipped, "needs rank 0 and at least one other node reachable")
        return
    port = ctx.options.master_port or ctx.inventory.network.master_port
    try:
        data = resolve_data_network(ctx.inventory)
    except PlanError as exc:
        yield Finding("net.port", Verdict.skipped, f"no data network to test the port on: {exc}")
        return
    master = data.path_of(reachable[0].name)
    python = ctx.inventory.python_of(reachable[0])
    stream = ctx.transports[master.node].start(remote.argv(python, "netprobe", "listen", "0.0.0.0", port, 60))
    reader = LineReader(stream)
    try:
        line = reader.wait_for("LISTENING", 20)
        if line is None or not line.startswith("LISTENING"):
            yield Finding("net.port", Verdict.failed,
                          f"{master.node}: cannot listen on master port {port}: {line or stream.stderr_text()[-200:]}",
                          node=master.node, subject=str(port),
                          hint="another job (or a leftover one) holds it: stop it, or pick another with "
                               "`--master-port` / `network.master_port`")
            return

        def connect(node: str) -> tuple[str, str]:
            py = ctx.inventory.python_of(next(n for n in ctx.inventory.nodes if n.name == node))
            try:
                res = ctx.transports[node].run(remote.argv(py, "netprobe", "connect", master.address, port, 3), timeout=20)
                return node, (res.stdout.strip().splitlines() or ["FAILED no output"])[-1]
            except ClusterrunError as exc:
                return node, f"FAILED {getattr(exc, 'reason', exc)}"

        results = parallel([lambda n=n.name: connect(n) for n in reachable[1:]])
    finally:
        stream.abort()
    bad = [(n, r) for n, r in results if not r.startswith("CONNECTED")]
    for node, reply in bad:
        yield Finding("net.port", Verdict.failed,
                      f"{node}: cannot connect to {master.node}'s master port {master.address}:{port} "
                      f"({reply.removeprefix('FAILED ')})", node=node, subject=f"{master.address}:{port}",
                      hint=f"a firewall on {master.node} (or between) drops it: allow TCP {port} and the ports NCCL "
                           f"and gloo pick (or the whole data subnet) between the nodes")
    if not bad:
        yield Finding("net.port", Verdict.passed,
                      f"{master.node}: master port {port} free, reached from {len(results)} node(s) at {master.address}",
                      node=master.node, subject=f"{master.address}:{port}")
