"""Pairwise ping on every network: every node pings all its peers at once, one program per node.

ICMP echo is light, so unlike the bandwidth tests pings need no rounds: each node runs one short shell program
over SSH that starts its pings (both directions of every pair are covered, each from its own source), up to
:data:`PINGS_AT_ONCE` at a time, and prints each ping's output and exit status between markers. The whole
check takes about one ping's deadline however many nodes there are; a NIC that drops everything costs that
same deadline once, not once per round. Nodes already known dead on a network (see :class:`PathLedger`) are
left out; the finding names them with the peers not tried.
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from clusterrun.doctor.checks.paths import Endpoint, Network, has_tool, ledger, networks, parallel, tool_argv
from clusterrun.doctor.contradictions import not_tested
from clusterrun.doctor.model import Evidence, Finding, PairMeasure, Scope, Verdict
from clusterrun.doctor.registry import Context, check
from clusterrun.errors import ClusterrunError, ParseError
from clusterrun.facts.parsers import ping

#: Seconds between the packets of one ping, and how long a ping waits past its last packet for replies.
PING_INTERVAL = 0.2
PING_GRACE = 1.0
#: Pings one node runs at once (a node with more peers runs the rest in turns), and nodes driven at once.
PINGS_AT_ONCE = 64
NODES_AT_ONCE = 256
#: Starts each ping's section in the output of a node's program: ``MARK <index> <exit status>``.
MARK = "@@clusterrun-ping"

# $1..$4: packets, interval, deadline, pings at once; then pairs of (source address, destination address).
_SCRIPT = f"""\
c=$1 i=$2 w=$3 k=$4; shift 4
t=$(mktemp -d) || exit 125
trap 'rm -rf "$t"' EXIT
n=0
while [ $# -ge 2 ]; do
  (LC_ALL=C ping -n -c "$c" -i "$i" -W 1 -w "$w" -I "$1" "$2" >"$t/$n" 2>&1; echo $? >"$t/$n.rc") &
  n=$((n + 1)); shift 2
  if [ $((n % k)) -eq 0 ]; then wait; fi
done
wait
j=0
while [ $j -lt $n ]; do
  echo "{MARK} $j $(cat "$t/$j.rc" 2>/dev/null || echo 255)"; cat "$t/$j"; j=$((j + 1))
done
"""


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


def ping_argv(count: int, src: Endpoint, dst: Endpoint) -> list[str]:
    """One ping as the node's program runs it (shown as the evidence's command)."""
    return ["ping", "-n", "-c", str(count), "-i", f"{PING_INTERVAL:g}", "-W", "1", "-w", str(ping_deadline(count)),
            "-I", src.address, dst.address]


def split_sections(text: str, expected: int) -> dict[int, tuple[int | None, str]]:
    """``{index: (exit status, output)}`` from a node's program output; a section cut off is missing."""
    sections: dict[int, tuple[int | None, str]] = {}
    current: int | None = None
    lines: list[str] = []
    for line in text.splitlines(keepends=True):
        words = line.split()
        if len(words) == 3 and words[0] == MARK and words[1].isdigit():
            if current is not None:
                sections[current] = (sections[current][0], "".join(lines))
            current, lines = int(words[1]), []
            if current < expected:
                sections[current] = (int(words[2]) if words[2].isdigit() else None, "")
            else:
                current = None
        elif current is not None:
            lines.append(line)
    if current is not None:
        sections[current] = (sections[current][0], "".join(lines))
    return sections


def _outcome(net: Network, src: Endpoint, dst: Endpoint, command: str, code: int | None, text: str) -> PingOutcome:
    evidence = Evidence(command, text, code, src.node)
    try:
        return PingOutcome(net, src, dst, ping.parse(text), None, evidence)
    except ParseError as exc:
        # ping exits 0 only when every packet was answered (with -c and -w); when the output that came back lacks
        # its statistics (cut short on the way), that exit status is still ping's own verdict.
        if code == 0:
            return PingOutcome(net, src, dst, None, None, evidence, answered=True)
        return PingOutcome(net, src, dst, None, str(exc), evidence)


def _node_pings(ctx: Context, node: str, pairs: list[tuple[Network, Endpoint, Endpoint]]) -> list[PingOutcome]:
    """Every ping from ``node``, run at once by one program there."""
    count = ctx.options.ping_count
    deadline = ping_deadline(count)
    commands = [shlex.join(["env", "LC_ALL=C", *ping_argv(count, src, dst)]) for _, src, dst in pairs]
    args = [str(count), f"{PING_INTERVAL:g}", str(deadline), str(PINGS_AT_ONCE)]
    for _, src, dst in pairs:
        args += [src.address, dst.address]
    turns = math.ceil(len(pairs) / PINGS_AT_ONCE)
    try:
        res = ctx.transports[node].run(tool_argv(ctx, ["sh", "-c", _SCRIPT, "sh", *args]),
                                       timeout=turns * (deadline + 2) + 10)
    except ClusterrunError as exc:
        reason = exc.reason
        return [PingOutcome(net, src, dst, None, reason, Evidence(cmd, reason, None, node))
                for (net, src, dst), cmd in zip(pairs, commands, strict=True)]
    sections = split_sections(res.stdout, len(pairs))
    outcomes = []
    for i, ((net, src, dst), cmd) in enumerate(zip(pairs, commands, strict=True)):
        if i in sections:
            code, text = sections[i]
            outcomes.append(_outcome(net, src, dst, cmd, code, text))
        else:
            why = (f"the node's ping program ended (exit {res.exit_code}) before this ping's output: "
                   f"{(res.stderr.strip() or res.stdout.strip())[-300:]}")
            outcomes.append(PingOutcome(net, src, dst, None, why, Evidence(cmd, res.stdout + res.stderr,
                                                                           res.exit_code, node)))
    return outcomes


@check("net.ping", "every node reaches every other on each network (ping)", Scope.pair, active=True)
def pairwise_ping(ctx: Context) -> Iterator[Finding]:
    nets = networks(ctx)
    # A NIC the inventory gets wrong is not pinged: said once here, its cause told by nic.present.
    yield from not_tested(ctx, "net.ping", [n.subnet for n in networks(ctx, as_the_nodes_say=True)])
    if not nets:
        yield Finding("net.ping", Verdict.skipped, "no network with two or more nodes whose NICs and addresses are "
                                                   "known (list `nics` with `ip` in the inventory)")
        return
    without = [n.name for n in ctx.reachable() if not has_tool(ctx, n.name, "ping")]
    if without:
        yield Finding("net.ping", Verdict.skipped, f"ping is not installed on {', '.join(without)}; pairs from "
                      "there are not tested", hint="install iputils-ping", data={"nodes": without})
    book = ledger(ctx)
    untried: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))  # subnet -> node -> peers
    names = [n.name for n in ctx.reachable()]
    by_node: dict[str, list[tuple[Network, Endpoint, Endpoint]]] = defaultdict(list)
    for net in nets:
        dead = book.dead(net.subnet)  # known dead from an earlier check: waiting for it again tells nothing new
        for s in names:
            for d in names:
                if s == d or s not in net.members or d not in net.members:
                    continue
                if s in dead or d in dead:
                    untried[net.subnet][s].add(d)
                    continue
                if s not in without:
                    by_node[s].append((net, net.members[s], net.members[d]))
    total = sum(len(p) for p in by_node.values())
    ctx.progress(f"ping: {total} directed pair(s) on {len(nets)} network(s), every node at once")
    jobs: list[Callable[[], list[PingOutcome]]] = [lambda node=node, pairs=pairs: _node_pings(ctx, node, pairs)
                                                   for node, pairs in by_node.items()]
    outcomes = [o for done in parallel(jobs, limit=NODES_AT_ONCE) for o in done]
    for o in outcomes:
        book.record(o.net.subnet, o.src.node, o.dst.node, o.ok)
    ctx.measures += _measures(nets, outcomes, untried)
    yield from _judge_pings(nets, outcomes, untried)


def _measures(nets: list[Network], outcomes: list[PingOutcome],
              untried: Mapping[str, Mapping[str, set[str]]]) -> list[PairMeasure]:
    """Every directed pair's round trip (ms; None where no reply or no statistics), and the pairs not tried."""
    out = [PairMeasure("net.ping", o.net.subnet, o.src.node, o.dst.node,
                       o.result.rtt_avg_ms if o.result is not None and o.ok else None, o.ok, o.src.nic, o.dst.nic,
                       o.net.data, "" if o.ok else (o.error or "no reply")) for o in outcomes]
    for net in nets:
        for node, peers in untried.get(net.subnet, {}).items():
            for peer in sorted(peers):
                if node in net.members and peer in net.members:
                    out.append(PairMeasure("net.ping", net.subnet, node, peer, None, None, net.members[node].nic,
                                           net.members[peer].nic, net.data, "not tried: an end is known dead"))
    return out


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
