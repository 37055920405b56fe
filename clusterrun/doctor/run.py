"""Run doctor: probe every node in parallel, run the chosen checks, build and save the report."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

from clusterrun.doctor.facts import NodeFacts
from clusterrun.doctor.model import Finding, Verdict
from clusterrun.doctor.probe import probe_node
from clusterrun.doctor.recommend import recommend
from clusterrun.doctor.registry import Check, Context, Options
from clusterrun.doctor.report import Report
from clusterrun.inventory.models import Inventory
from clusterrun.transport.base import Transport
from clusterrun.transport.factory import open_node_transports
from clusterrun.transport.fanout import fan_out


def probe_all(inv: Inventory, transports: dict[str, Transport], path: tuple[str, ...] = ()) -> dict[str, NodeFacts]:
    got = fan_out(inv.nodes, lambda n: n.name, lambda n: probe_node(n.name, inv.python_of(n), transports[n.name],
                                                                     path=path), label="probe")
    return got.results  # probe_node turns a node's failure into its facts; nothing lands in got.errors


def with_probed_nics(inv: Inventory, facts: dict[str, NodeFacts]) -> Inventory:
    """Nodes that list no NICs (one-liners) get the ones their probe saw, so the network checks have networks."""
    from clusterrun.errors import ParseError
    from clusterrun.facts.nics import NetFacts, RdmaPort, reconcile
    from clusterrun.facts.parsers import ip

    found: dict[str, NetFacts] = {}
    for node in inv.nodes:
        f = facts.get(node.name)
        text = f.output("ip_addr") if f is not None and not node.nics else None
        if not text:
            continue
        try:
            interfaces = ip.parse(text)
        except ParseError:
            continue
        speeds = {}
        for line in (f.output("net_speed") or "").splitlines():
            name, _, value = line.partition(" ")
            if value.strip().lstrip("-").isdigit():
                speeds[name] = int(value)
        rdma = []
        for line in (f.output("rdma_sys") or "").splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1].isdigit():
                netdevs = tuple(d for d in (parts[3] if len(parts) > 3 else "").split(",") if d)
                rdma.append(RdmaPort(parts[0], int(parts[1]), "", parts[2], netdevs))  # state unknown: not RDMA here
        found[node.name] = NetFacts(node.name, interfaces, speeds, tuple(rdma))
    return reconcile(inv, found).inventory if found else inv


def run_check(check: Check, ctx: Context) -> list[Finding]:
    """A check's findings; a check that raises is reported as a failure of clusterrun, not a crash of doctor."""
    try:
        found = list(check.run(ctx))
    except Exception as exc:  # a bug in a check must not hide the other checks' results
        tb = traceback.format_exc(limit=4)
        return [Finding(check.name, Verdict.failed, f"the check itself failed: {type(exc).__name__}: {exc}",
                        hint="this is a clusterrun bug; please report it with report.json", data={"traceback": tb})]
    return found or [Finding(check.name, Verdict.skipped, "nothing to check")]


def run_doctor(inv: Inventory, checks: list[Check], options: Options, report_dir: Path,
               progress: Callable[[str], None] = lambda _m: None,
               transports: Mapping[str, Transport] | None = None) -> Report:
    """Probe, run ``checks``, save the report in ``report_dir``. ``transports``: connections that are already
    open (``up --preflight full``) and stay open; by default doctor opens its own and closes them."""
    report = Report(nodes=[n.name for n in inv.nodes], checks=checks, started=time.time())
    t0 = time.monotonic()
    own = transports is None
    transports = open_node_transports(inv) if transports is None else transports
    try:
        progress(f"probing {len(inv.nodes)} node(s)")
        report.facts = probe_all(inv, dict(transports), options.path)
        inv = with_probed_nics(inv, report.facts)
        ctx = Context(inv, report.facts, options, transports, report_dir, progress)
        for check in sorted(checks, key=lambda c: c.active):  # facts-only checks first: they take no time
            if check.active:
                progress(check.title)
            report.findings += run_check(check, ctx)
        report.recommended = recommend(ctx, report.findings)
    finally:
        if own:
            for transport in transports.values():
                transport.close()
    report.duration = time.monotonic() - t0
    report.save(report_dir)
    return report
