"""RDMA bandwidth between pairs of nodes with perftest's ``ib_write_bw``, per HCA pair, against line rate.

For each pair of a round-robin round (pairs of one round run at once), the i-th listed RDMA NIC of
one node is tested against the i-th of the other: a server on one side (``ib_write_bw -d HCA -i PORT
-p TCPPORT -D SECONDS --report_gbits``, a free TCP port chosen on that node first), the client on
the other with the server's address; both under ``timeout``. The client's average, in Gbit/s, is
compared with the line rate (the inventory ``speed`` of either end): pass at 80% or more.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from clusterrun import remote
from clusterrun.doctor.checks.paths import has_tool, parallel
from clusterrun.doctor.contradictions import Contradiction, contradictions
from clusterrun.doctor.model import Evidence, Finding, Scope, Verdict
from clusterrun.doctor.probe import path_prefix
from clusterrun.doctor.registry import Context, check
from clusterrun.doctor.schedule import round_robin
from clusterrun.errors import ClusterrunError, ParseError, PlanError
from clusterrun.facts.parsers import ib_write_bw
from clusterrun.inventory.models import Nic, Node
from clusterrun.planning.network import resolve_data_network
from clusterrun.transport.reader import LineReader

PASS_RATIO = 0.8


@dataclass(frozen=True)
class Measure:
    client: str
    server: str
    nics: tuple[Nic, Nic]
    gbps: float | None
    error: str | None
    evidence: tuple[Evidence, ...]

    @property
    def subject(self) -> str:
        return f"{self.nics[0].hca}/{self.nics[0].port}->{self.nics[1].hca}/{self.nics[1].port}"


def rdma_nics(node: Node) -> list[Nic]:
    return [n for n in node.nics if n.kind.is_rdma and n.hca]


def _server_address(ctx: Context, node: Node, nic: Nic) -> str:
    if nic.address:
        return nic.address  # IPoIB / the RoCE netdev
    try:
        return resolve_data_network(ctx.inventory).path_of(node.name).address
    except PlanError:
        return node.host


def _wrong_address(ctx: Context, node: Node, nic: Nic) -> Contradiction | None:
    """The contradiction that makes :func:`_server_address` the inventory's mistake, if any."""
    if nic.address:
        return contradictions(ctx).get((node.name, nic.name))
    try:
        path = resolve_data_network(ctx.inventory).path_of(node.name)
    except PlanError:
        return None
    return contradictions(ctx).get((node.name, path.nic)) if path.nic else None


def _argv(ctx: Context, nic: Nic, tcp_port: int, seconds: float, *tail: str) -> list[str]:
    args = ["ib_write_bw", "-d", str(nic.hca), "-i", str(nic.port), "-p", str(tcp_port), "-D", f"{seconds:g}", "-F"]
    if nic.gid_index is not None:
        args += ["-x", str(nic.gid_index)]
    command = " ".join(shlex.quote(a) for a in [*args, "--report_gbits", *tail])
    return ["sh", "-c", f"{path_prefix(ctx.options.path)}exec timeout {int(seconds + 30)} {command}"]


def _measure(ctx: Context, client: Node, server: Node, nics: tuple[Nic, Nic]) -> Measure:
    seconds = ctx.options.ib_seconds
    address = _server_address(ctx, server, nics[1])
    # A free TCP port on the server node for perftest's handshake: the probe's listener picks one and lets it go.
    reader_stream = ctx.transports[server.name].start(
        remote.argv(ctx.inventory.python_of(server), "netprobe", "listen", "0.0.0.0", 0, 1))
    line = LineReader(reader_stream).wait_for("LISTENING", 20)
    reader_stream.abort()
    if line is None or not line.startswith("LISTENING"):
        return Measure(client.name, server.name, nics, None, f"no free TCP port on {server.name}: {line}", ())
    port = int(line.split()[1])
    server_argv = _argv(ctx, nics[1], port, seconds)
    srv = ctx.transports[server.name].start(server_argv)
    client_argv = _argv(ctx, nics[0], port, seconds, address)
    try:
        deadline = time.monotonic() + 10  # the server takes a moment to listen: a refused connect is retried
        while True:
            started = time.monotonic()
            res = ctx.transports[client.name].run(client_argv, timeout=seconds + 40)
            refused = "Couldn't connect" in res.stdout + res.stderr and time.monotonic() - started < 3
            if not refused or time.monotonic() > deadline:
                break
            time.sleep(0.3)
    except ClusterrunError as exc:
        return Measure(client.name, server.name, nics, None, getattr(exc, "reason", None) or str(exc), ())
    finally:
        srv.abort()
    output = res.stdout + res.stderr
    evidence = (Evidence(client_argv[-1], output, res.exit_code, client.name),
                Evidence(server_argv[-1], srv.stderr_text()[-2000:], None, server.name))
    try:
        report = ib_write_bw.parse(output)
    except ParseError as exc:
        return Measure(client.name, server.name, nics, None, str(exc), evidence)
    if report.errors or not report.rows:
        why = "; ".join(report.errors) or f"no result (exit {res.exit_code})"
        return Measure(client.name, server.name, nics, None, why + (f" ({report.hint})" if report.hint else ""),
                       evidence)
    # The parser owns the units: a MB/sec or MiB/sec table (2**20 bytes/s) is not Gb/s.
    return Measure(client.name, server.name, nics, report.average_gbps, None, evidence)


@check("ib.bandwidth", "RDMA write bandwidth between pairs (ib_write_bw) against line rate", Scope.pair, active=True,
       needs="two or more nodes with infiniband/roce NICs in the inventory")
def ib_bandwidth(ctx: Context) -> Iterator[Finding]:
    nodes = [n for n in ctx.reachable() if rdma_nics(n)]
    if len(nodes) < 2:
        yield Finding("ib.bandwidth", Verdict.skipped, "fewer than two reachable nodes list InfiniBand/RoCE NICs")
        return
    without = [n.name for n in nodes if not has_tool(ctx, n.name, "ib_write_bw")]
    for name in without:
        yield Finding("ib.bandwidth", Verdict.failed,
                      f"{name}: ib_write_bw not installed, but the inventory lists InfiniBand/RoCE NICs there",
                      node=name, subject="ib_write_bw",
                      hint="install perftest (`apt install perftest` / `dnf install perftest`), or point "
                           "`doctor --path DIR` at where it is")
    nodes = [n for n in nodes if n.name not in without]
    rounds = round_robin(nodes)
    results: list[Measure] = []
    for i, pairs in enumerate(rounds, 1):
        ctx.progress(f"ib_write_bw round {i}/{len(rounds)}")
        jobs: list[Callable[[], Measure]] = []
        for a, b in pairs:
            for nic_a, nic_b in zip(rdma_nics(a), rdma_nics(b), strict=False):  # up to the shorter list
                wrong = _wrong_address(ctx, b, nic_b)  # the client would reach b at an address b does not have
                if wrong is not None:
                    yield Finding("ib.bandwidth", Verdict.skipped,
                                  f"{a.name} -> {b.name} {nic_a.hca}/{nic_a.port}->{nic_b.hca}/{nic_b.port} not "
                                  f"tested: {wrong.said} ({wrong.where})", node=a.name,
                                  hint="an inventory problem (see nic.present), not a fabric fault: set "
                                       f"{wrong.snippet} at {wrong.where} and run doctor again", data=wrong.to_data())
                    continue
                jobs.append(lambda a=a, b=b, na=nic_a, nb=nic_b: _measure(ctx, a, b, (na, nb)))
        results += parallel(jobs)
    for m in results:
        who = f"{m.client} -> {m.server} {m.subject}"
        if m.gbps is None:
            yield Finding("ib.bandwidth", Verdict.failed, f"{who}: ib_write_bw failed: {m.error}", node=m.client,
                          subject=m.subject, evidence=m.evidence,
                          hint="check ib.port for both ports; for RoCE the GID index (`gid_index`) and that the "
                               "TCP handshake port is not blocked between the nodes")
            continue
        line = min(filter(None, (m.nics[0].speed, m.nics[1].speed)), default=None)
        if line is None:
            yield Finding("ib.bandwidth", Verdict.passed, f"{who}: {m.gbps:.1f} Gbit/s (no `speed` listed to compare)",
                          node=m.client, subject=m.subject, measured=f"{m.gbps:.1f} Gbit/s", evidence=m.evidence,
                          data={"gbps": m.gbps})
            continue
        ratio = m.gbps * 1e9 / line
        verdict = Verdict.passed if ratio >= PASS_RATIO else Verdict.warned
        yield Finding("ib.bandwidth", verdict,
                      f"{who}: {m.gbps:.1f} Gbit/s, {ratio:.0%} of the listed {line / 1e9:g} Gbit/s",
                      node=m.client, subject=m.subject, measured=f"{m.gbps:.1f} Gbit/s",
                      expected=f">= {PASS_RATIO:.0%} of {line / 1e9:g} Gbit/s", evidence=m.evidence,
                      hint=None if verdict is Verdict.passed else
                      "below 80% of line rate: check the port's active rate and width (ibstat), PCIe slot width, "
                      "the MTU, and for RoCE PFC/ECN on the switch", data={"gbps": m.gbps, "ratio": ratio})
