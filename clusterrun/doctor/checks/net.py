"""Network checks that send traffic over TCP: bandwidth between pairs on the data network, the master port.

Pairs are scheduled as a round-robin tournament (:mod:`clusterrun.doctor.schedule`): all pairs of a round
run at once, so N nodes take about N-1 rounds, not N(N-1)/2 tests one after the other. Every transfer first
connects within :data:`CONNECT_TIMEOUT`, so a peer that drops everything costs seconds, not the transfer's
whole time limit; and a node known dead on the data network (by net.ping, or by this check's own earlier
rounds, see :class:`PathLedger`) is left out of later rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass

from clusterrun import remote
from clusterrun.doctor.checks.paths import (
    Endpoint,
    Network,
    has_tool,
    ledger,
    live_pairs,
    networks,
    parallel,
    tool_argv,
)
from clusterrun.doctor.contradictions import contradictions, not_tested
from clusterrun.doctor.model import Evidence, Finding, PairMeasure, Scope, Verdict
from clusterrun.doctor.registry import Context, check
from clusterrun.doctor.schedule import round_robin
from clusterrun.errors import ClusterrunError, ParseError, PlanError
from clusterrun.facts.parsers import iperf3
from clusterrun.planning.network import resolve_data_network
from clusterrun.transport.base import Stream
from clusterrun.transport.reader import LineReader

#: Seconds a TCP connect between two nodes may take (the master port test, and before each transfer).
CONNECT_TIMEOUT = 3.0


# -------------------------------------------------------------------------------------- bandwidth


@dataclass(frozen=True)
class Transfer:
    src: str
    dst: str
    bps: float | None
    tool: str
    error: str | None
    evidence: tuple[Evidence, ...]
    connected: bool | None = None  # whether src's TCP connect to dst got through (None: not tried)


def _python(ctx: Context, node: str) -> str:
    return ctx.inventory.python_of(next(n for n in ctx.inventory.nodes if n.name == node))


def _serve(ctx: Context, dst: Endpoint, seconds: float) -> tuple[LineReader, object, int | None, str | None]:
    stream = ctx.transports[dst.node].start(remote.argv(_python(ctx, dst.node), "netprobe", "listen", dst.address, 0,
                                                        seconds + 30))
    reader = LineReader(stream)
    line = reader.wait_for("LISTENING", 20)
    if line is None or not line.startswith("LISTENING"):
        stream.abort()
        return reader, stream, None, (line or f"no listener: {stream.stderr_text().strip()[-200:]}")
    return reader, stream, int(line.split()[1]), None


def _no_connect(src: Endpoint, dst: Endpoint, port: int, reply: str) -> str:
    return f"{src.node} cannot connect to {dst.address}:{port} ({reply.removeprefix('FAILED ').strip()})"


def _builtin(ctx: Context, src: Endpoint, dst: Endpoint, seconds: float, vouched: bool = False) -> Transfer:
    reader, stream, port, err = _serve(ctx, dst, seconds)
    if port is None:
        return Transfer(src.node, dst.node, None, "builtin", err, ())
    try:
        argv = remote.argv(_python(ctx, src.node), "netprobe", "send", dst.address, port, seconds, CONNECT_TIMEOUT)
        res = ctx.transports[src.node].run(argv, timeout=seconds + CONNECT_TIMEOUT + 30)
        sent = res.stdout.strip().splitlines()[-1:] or [""]
        if sent[0].startswith("FAILED"):  # the connect did not get through: nothing will be received
            evidence = (Evidence(f"probe send {dst.address}:{port} {seconds:g}s", res.stdout + res.stderr,
                                 res.exit_code, src.node),)
            return Transfer(src.node, dst.node, None, "builtin", _no_connect(src, dst, port, sent[0]), evidence, False)
        got = reader.wait_for("RECEIVED", 15)
    except ClusterrunError as exc:
        return Transfer(src.node, dst.node, None, "builtin", getattr(exc, "reason", str(exc)), ())
    finally:
        stream.abort()
    evidence = (Evidence(f"probe send {dst.address}:{port} {seconds:g}s", res.stdout + res.stderr, res.exit_code,
                         src.node), Evidence(f"probe listen {dst.address}", got or "", None, dst.node))
    if not got or not got.startswith("RECEIVED"):
        return Transfer(src.node, dst.node, None, "builtin", (res.stderr or res.stdout).strip()[-300:] or got, evidence,
                        True)
    _, nbytes, secs = got.split()
    bps = int(nbytes) * 8 / float(secs) if float(secs) > 0 else None
    return Transfer(src.node, dst.node, bps, "builtin", None, evidence, True)


def _iperf(ctx: Context, src: Endpoint, dst: Endpoint, seconds: float, vouched: bool = False) -> Transfer:
    # Find a free port with the probe's listener and, unless this run already saw the pair reach each other
    # (``vouched``), connect to it from src first: iperf3 has no connect timeout before 3.5, and a client that
    # hangs on a dead path would hold the whole round. Then hand the port to iperf3's one-off server.
    _, stream, port, err = _serve(ctx, dst, 1)
    reply, evidence = "CONNECTED", ()
    try:
        if port is None:
            return Transfer(src.node, dst.node, None, "iperf3", err, ())
        if not vouched:
            argv = remote.argv(_python(ctx, src.node), "netprobe", "connect", dst.address, port, CONNECT_TIMEOUT)
            res = ctx.transports[src.node].run(argv, timeout=CONNECT_TIMEOUT + 20)
            reply = (res.stdout.strip().splitlines() or [f"FAILED no output: {res.tail(2)}"])[-1]
            evidence = (Evidence(f"probe connect {dst.address}:{port}", res.stdout + res.stderr, res.exit_code,
                                 src.node),)
    except ClusterrunError as exc:
        return Transfer(src.node, dst.node, None, "iperf3", getattr(exc, "reason", str(exc)), ())
    finally:
        stream.abort()  # type: ignore[attr-defined]
    if not reply.startswith("CONNECTED"):
        return Transfer(src.node, dst.node, None, "iperf3", _no_connect(src, dst, port, reply), evidence, False)
    return _iperf_run(ctx, src, dst, seconds, port)


#: Starts of iperf3's server on the port the probe's listener found: that listener may not have let go of it yet.
SERVER_TRIES = 3


def _server_argv(seconds: float, port: int, dst: Endpoint) -> list[str]:
    # --forceflush: without a terminal iperf3 holds "Server listening" back until it exits.
    return ["timeout", str(int(seconds + 30)), "iperf3", "-s", "-1", "--forceflush", "-p", str(port), "-B", dst.address]


def _start_server(ctx: Context, dst: Endpoint, seconds: float, port: int) -> tuple[Stream | None, str]:
    """iperf3's one-off server on ``port``, started and listening, or None and why not."""
    why = ""
    for _ in range(SERVER_TRIES):
        server = ctx.transports[dst.node].start(tool_argv(ctx, _server_argv(seconds, port, dst)))
        if LineReader(server).wait_for("Server listening", 15) is not None:
            return server, ""
        why = server.stderr_text().strip()[-200:]
        server.abort()
        if "Address already in use" not in why:
            break
    return None, f"iperf3 server did not start on {dst.node}: {why}"


def _iperf_run(ctx: Context, src: Endpoint, dst: Endpoint, seconds: float, port: int) -> Transfer:
    server, why = _start_server(ctx, dst, seconds, port)
    if server is None:
        return Transfer(src.node, dst.node, None, "iperf3", why, (), True)
    try:
        argv = ["timeout", str(int(seconds + 20)), "iperf3", "-c", dst.address, "-p", str(port), "-t", f"{seconds:g}",
                "-B", src.address, "-J"]
        res = ctx.transports[src.node].run(tool_argv(ctx, argv), timeout=seconds + 30)
    except ClusterrunError as exc:
        return Transfer(src.node, dst.node, None, "iperf3", getattr(exc, "reason", str(exc)), (), True)
    finally:
        server.abort()
    # The server's own complaints (iperf3 prints "iperf3: error - ...: Bad file descriptor" when its client goes
    # away early) belong with the transfer they are about, in the report's evidence.
    noise = server.stderr_text().strip()
    evidence = (Evidence(" ".join(argv), res.stdout[-4000:] + res.stderr, res.exit_code, src.node),
                *([Evidence(" ".join(_server_argv(seconds, port, dst)), noise[-2000:], None, dst.node)] if noise else []))
    try:
        parsed = iperf3.parse(res.stdout)
    except ParseError as exc:
        return Transfer(src.node, dst.node, None, "iperf3", str(exc), evidence, True)
    if parsed.error:
        return Transfer(src.node, dst.node, None, "iperf3", parsed.error, evidence, True)
    return Transfer(src.node, dst.node, parsed.receiver_bps, "iperf3", None, evidence, True)


def _gbit(bps: float | None) -> str:
    return "n/a" if bps is None else (f"{bps / 1e9:.2f} Gbit/s" if bps >= 1e9 else f"{bps / 1e6:.0f} Mbit/s")


@check("net.bandwidth", "TCP bandwidth between pairs on the data network", Scope.pair, active=True)
def bandwidth(ctx: Context) -> Iterator[Finding]:
    data = next((n for n in networks(ctx) if n.data), None)
    planned = next((n for n in networks(ctx, as_the_nodes_say=True) if n.data), None)
    yield from not_tested(ctx, "net.bandwidth", [planned.subnet] if planned else [])
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
    book = ledger(ctx)
    transfers: list[Transfer] = []
    untried: dict[str, set[str]] = {}  # a node known dead -> the peers it was not measured with
    for i, pairs in enumerate(rounds, 1):
        for direction in (0, 1):  # both ways, one direction at a time: each NIC's send and receive side
            live, left_out = live_pairs(pairs, book.dead(data.subnet))
            for a, b in left_out:
                untried.setdefault(a, set()).add(b)
                untried.setdefault(b, set()).add(a)
            if direction == 0:
                ctx.progress(f"bandwidth round {i}/{len(rounds)} ({tool}, {len(live)} pair(s) at once)")
            jobs = [(lambda s=s, d=d: measure(ctx, data.members[s], data.members[d], seconds,
                                              d in book.reached[data.subnet][s]))
                    for a, b in live for s, d in ((a, b), (b, a))[direction:direction + 1]]
            done = parallel(jobs)
            for t in done:
                if t.connected is not None:
                    book.record(data.subnet, t.src, t.dst, t.connected)
            transfers += done
    ctx.measures += [PairMeasure("net.bandwidth", data.subnet, t.src, t.dst, t.bps or None, bool(t.bps),
                                 data.members[t.src].nic, data.members[t.dst].nic, True,
                                 "" if t.bps else (t.error or "nothing got through")) for t in transfers]
    ctx.measures += [PairMeasure("net.bandwidth", data.subnet, a, b, None, None, data.members[a].nic,
                                 data.members[b].nic, True, "not tried: an end is known dead")
                     for a, peers in untried.items() for b in sorted(peers)]
    yield from _judge_bandwidth(ctx, data, transfers, tool, book.dead(data.subnet), untried)


def _judge_bandwidth(ctx: Context, data: Network, transfers: list[Transfer], tool: str,
                     dead: Collection[str] = (), untried: Mapping[str, set[str]] | None = None) -> Iterator[Finding]:
    """Findings from ``transfers``; ``dead``: nodes known to reach no peer on the data network (one finding each,
    which stands for their failed transfers), ``untried``: the peers each was then not measured with."""
    untried = untried or {}
    for name in sorted(set(dead) & set(data.members), key=list(data.members).index):
        ep = data.members[name]
        failed = [t for t in transfers if name in (t.src, t.dst) and not t.bps]
        failed_peers = sorted({t.src if t.dst == name else t.dst for t in failed})
        skipped = sorted(untried.get(name, set()) - set(failed_peers))
        counts = ", ".join(([f"{len(failed)} transfer(s) failed"] if failed else [])
                           + ([f"{len(skipped)} peer(s) not tried"] if skipped else []))
        yield Finding("net.bandwidth", Verdict.failed,
                      f"{name}: {ep.nic} ({ep.address}) connects to no peer on {data.subnet}; not measured "
                      f"({counts})", node=name, subject=ep.nic, measured="0 transfers", expected="every peer",
                      hint=f"the NIC is up but its traffic is dropped (net.ping names it too): check its cable, switch "
                           f"port, VLAN and firewall (iptables/nft) on {name}",
                      evidence=tuple(e for t in failed for e in t.evidence)[:4],
                      data={k: v for k, v in (("failed_peers", failed_peers), ("untried_peers", skipped)) if v})
    for t in transfers:
        if t.src in dead or t.dst in dead:
            continue  # told above, once for the node
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
    wrong = contradictions(ctx).get((master.node, master.nic)) if master.nic else None
    if wrong is not None:  # every node would connect to an address the master does not have
        yield Finding("net.port", Verdict.skipped, f"{master.node}: master port {port} not tested on {master.nic}: "
                      f"{wrong.said} ({wrong.where})", node=master.node, subject=f"{master.address}:{port}",
                      hint=f"an inventory problem (see nic.present), not a network fault: set {wrong.snippet} at "
                           f"{wrong.where} and run doctor again", data=wrong.to_data())
        return
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
                argv = remote.argv(py, "netprobe", "connect", master.address, port, CONNECT_TIMEOUT)
                res = ctx.transports[node].run(argv, timeout=CONNECT_TIMEOUT + 20)
                return node, (res.stdout.strip().splitlines() or ["FAILED no output"])[-1]
            except ClusterrunError as exc:
                return node, f"FAILED {getattr(exc, 'reason', exc)}"

        results = parallel([lambda n=n.name: connect(n) for n in reachable[1:]])
    finally:
        stream.abort()
    bad = [(n, r) for n, r in results if not r.startswith("CONNECTED")]
    dead = _dead_on(ctx, master.address)
    for node, reply in bad:
        culprit = node if node in dead else master.node if master.node in dead else None
        hint = (f"{culprit}'s NIC on the data network reaches no peer (see net.ping): fix it first" if culprit else
                f"a firewall on {master.node} (or between) drops it: allow TCP {port} and the ports NCCL "
                f"and gloo pick (or the whole data subnet) between the nodes")
        yield Finding("net.port", Verdict.failed,
                      f"{node}: cannot connect to {master.node}'s master port {master.address}:{port} "
                      f"({reply.removeprefix('FAILED ')})", node=node, subject=f"{master.address}:{port}", hint=hint)
    if not bad:
        yield Finding("net.port", Verdict.passed,
                      f"{master.node}: master port {port} free, reached from {len(results)} node(s) at {master.address}",
                      node=master.node, subject=f"{master.address}:{port}")


def _dead_on(ctx: Context, address: str) -> set[str]:
    """Nodes the pair checks found dead on the network that has ``address`` (none when it was not tested)."""
    book = ledger(ctx)
    for net in networks(ctx):
        if any(ep.address == address for ep in net.members.values()):
            return book.dead(net.subnet)
    return set()
