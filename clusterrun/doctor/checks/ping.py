"""Pairwise ping on every network, as a round-robin tournament: all pairs of a round at once, N-1 rounds.

A ping that gets no reply waits out its deadline; a node whose NIC drops everything would make every round
wait for it. Once the tests show a node dead on a network (see :class:`PathLedger`), its pairs in later
rounds on that network are left out: the finding names the node, its NIC, and the peers not tried.
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from clusterrun.doctor.checks.paths import Endpoint, Network, has_tool, ledger, networks, parallel, tool_argv
from clusterrun.doctor.model import Evidence, Finding, Scope, Verdict
from clusterrun.doctor.registry import Context, check
from clusterrun.doctor.schedule import round_robin
from clusterrun.errors import ClusterrunError, ParseError
from clusterrun.facts.parsers import ping

#: Seconds between the packets of one ping, and how long a ping waits past its last packet for replies.
PING_INTERVAL = 0.2
PING_GRACE = 1.0
#: Pings of one round that run at once (two per pair and network; each is a thread waiting on its node).
PING_JOBS_AT_ONCE = 512


@dataclass(frozen=True, eq=False)  # compared and hashed by identity
class PingOutcome:
    net: Network
    src: Endpoint
    dst: Endpoint
    result: ping.PingResult | None
    error: str | None
    evidence: Evidence
    answered: bool = False  # ping's exit status said every packet was answered though its output was cut short

    @property
    def ok(self) -> bool:
        return self.answered or (self.result is not None and self.result.received > 0)


def ping_deadline(count: int) -> int:
    """Whole seconds a ping of ``count`` packets may take (``ping -w``): its packets, then one second for
    the last replies. A path that answers returns as soon as every packet is answered."""
    return max(1, math.ceil((count - 1) * PING_INTERVAL + PING_GRACE))


def _ping(ctx: Context, net: Network, src: Endpoint, dst: Endpoint) -> PingOutcome:
    count = ctx.options.ping_count
    deadline = ping_deadline(count)
    argv = ["ping", "-n", "-c", str(count), "-i", f"{PING_INTERVAL:g}", "-W", "1", "-w", str(deadline),
            "-I", src.address, dst.address]
    command = " ".join(shlex.quote(a) for a in argv)
    try:
        res = ctx.transports[src.node].run(tool_argv(ctx, ["env", "LC_ALL=C", *argv]), timeout=deadline + 10)
    except ClusterrunError as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        return PingOutcome(net, src, dst, None, reason, Evidence(command, reason, None, src.node))
    evidence = Evidence(command, res.stdout + res.stderr, res.exit_code, src.node)
    try:
        return PingOutcome(net, src, dst, ping.parse(res.stdout + res.stderr), None, evidence)
    except ParseError as exc:
        # ping exits 0 only when every packet was answered (with -c and -w); when the output that came back lacks
        # its statistics (cut short on the way), that exit status is still ping's own verdict.
        if res.exit_code == 0:
            return PingOutcome(net, src, dst, None, None, evidence, answered=True)
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
    book = ledger(ctx)
    outcomes: list[PingOutcome] = []
    untried: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))  # subnet -> node -> peers
    rounds = round_robin([n.name for n in ctx.reachable()])
    for i, pairs in enumerate(rounds, 1):
        ctx.progress(f"ping round {i}/{len(rounds)}")
        jobs: list[Callable[[], PingOutcome]] = []
        for net in nets:
            dead = book.dead(net.subnet)
            for a, b in pairs:
                if a not in net.members or b not in net.members:
                    continue
                if a in dead or b in dead:  # its NIC is known dead: waiting for it again tells nothing new
                    untried[net.subnet][a].add(b)
                    untried[net.subnet][b].add(a)
                    continue
                for s, d in ((a, b), (b, a)):
                    if s not in without:
                        jobs.append(lambda net=net, s=s, d=d: _ping(ctx, net, net.members[s], net.members[d]))
        done = parallel(jobs, limit=PING_JOBS_AT_ONCE)
        for o in done:
            book.record(o.net.subnet, o.src.node, o.dst.node, o.ok)
        outcomes += done
    yield from _judge_pings(nets, outcomes, untried)


def _judge_pings(nets: list[Network], outcomes: list[PingOutcome],
                 untried: Mapping[str, Mapping[str, set[str]]] | None = None) -> Iterator[Finding]:
    """Findings from the pings that ran; ``untried``: per subnet, the peers each dead node was not tried with."""
    untried = untried or {}
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
            skipped = sorted(untried.get(net.subnet, {}).get(name, set()))
            rest = f"; {len(skipped)} more not tried" if skipped else ""
            advice = (f"; until it is fixed, use {fallback.subnet} (set `network.data: {fallback.subnet}` in the "
                      f"inventory, which sets NCCL_SOCKET_IFNAME to each node's NIC there)" if fallback and net.data
                      else "")
            yield Finding("net.ping", Verdict.failed,
                          f"{name}: {ep.nic} ({ep.address}) reaches no peer on {net.subnet} "
                          f"({len(peers[name])} peer(s) tried both ways{rest})", node=name, subject=ep.nic,
                          measured=f"0/{len(tested[name])} peers", expected="all peers",
                          hint=f"the NIC is up but its traffic is dropped: check its cable, switch port, VLAN and "
                               f"firewall (iptables/nft) on {name}{advice}",
                          evidence=tuple(o.evidence for o in failed if name in (o.src.node, o.dst.node))[:4],
                          data={"unreachable_peers": sorted(peers[name]), **({"untried_peers": skipped} if skipped else {})})
        for o in failed:
            if o in explained:
                continue
            why = o.error or (o.result.error if o.result and o.result.error else "no reply")
            yield Finding("net.ping", Verdict.failed,
                          f"{o.src.node} -> {o.dst.node} on {net.subnet}: {o.src.nic} gets no reply from "
                          f"{o.dst.address} ({why})", node=o.src.node, subject=o.src.nic,
                          hint=f"check routing and firewalls between {o.src.node} and {o.dst.node} on this network",
                          evidence=(o.evidence,))
