"""Run doctor: probe every node in parallel, run the chosen checks, build and save the report."""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

from clusterrun.doctor.facts import NodeFacts
from clusterrun.doctor.model import Finding, Verdict
from clusterrun.doctor.noise import kept_noise
from clusterrun.doctor.probe import probe_node
from clusterrun.doctor.recommend import recommend
from clusterrun.doctor.registry import Check, Context, Options
from clusterrun.doctor.report import Report
from clusterrun.inventory.models import Inventory, Node
from clusterrun.transport.base import Transport
from clusterrun.transport.factory import open_node_transports
from clusterrun.transport.fanout import fan_out


def probe_all(inv: Inventory, transports: dict[str, Transport], path: tuple[str, ...] = ()) -> dict[str, NodeFacts]:
    from clusterrun.doctor.in_image import image_command

    def one(node: Node) -> NodeFacts:
        inside, env = image_command(inv, node)
        return probe_node(node.name, inv.python_of(node), transports[node.name], path=path, inside=inside, env=env)

    got = fan_out(inv.nodes, lambda n: n.name, one, label="probe")
    return got.results  # probe_node turns a node's failure into its facts; nothing lands in got.errors


def with_probed_nics(inv: Inventory, facts: dict[str, NodeFacts]) -> Inventory:
    """Nodes that list no NICs (one-liners) get the ones their probe saw, as ``up`` would give them (the same
    report, read the same way: RDMA ports with their state), so the network checks have networks."""
    from clusterrun.errors import ParseError
    from clusterrun.facts.nics import NetFacts, reconcile

    found: dict[str, NetFacts] = {}
    for node in inv.nodes:
        f = facts.get(node.name)
        report = f.report if f is not None and not node.nics else None
        if report is None:
            continue
        try:
            found[node.name] = report.net()
        except ParseError:
            continue
    return reconcile(inv, found).inventory if found else inv


def with_probed_gpus(inv: Inventory, facts: dict[str, NodeFacts]) -> Inventory:
    """Nodes nobody listed GPUs for (one-liners without --gpus) get every GPU their reporter found, as ``up``
    gives them a process each, so the GPU checks look at the GPUs a run would use."""
    from clusterrun.planning.gpuchoice import every_gpu

    offered = {name: f.report.gpu_indices for name, f in facts.items() if f.report is not None}
    return every_gpu(inv, offered, nproc_given=False)[0]


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
    with kept_noise() as noise:  # the SSH library's complaints go to the evidence, not the terminal
        transports = open_node_transports(inv) if transports is None else transports
        try:
            progress(f"probing {len(inv.nodes)} node(s)")
            report.facts = probe_all(inv, dict(transports), options.path)
            inv = with_probed_gpus(with_probed_nics(inv, report.facts), report.facts)
            ctx = Context(inv, report.facts, options, transports, report_dir, progress, measures=report.measures)
            for check in sorted(checks, key=lambda c: c.active):  # facts-only checks first: they take no time
                if check.active:
                    progress(check.title)
                report.findings += run_check(check, ctx)
                report.ran.append(check.name)
            report.recommended = recommend(ctx, report.findings)
        except BaseException as exc:
            # Cut short (Ctrl-C, a lost terminal): what was found so far is saved, and says what did not run.
            report.cut_short = ("interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt)
                                else f"{type(exc).__name__}: {exc}")
            report.duration = time.monotonic() - t0
            with contextlib.suppress(OSError):
                report.save(report_dir)
            raise
        finally:
            if own:
                for transport in transports.values():
                    transport.close()
    report.duration = time.monotonic() - t0
    report.save(report_dir)
    if noise:
        (report_dir / "evidence").mkdir(parents=True, exist_ok=True)
        (report_dir / "evidence" / "transport.log").write_text("\n".join(noise) + "\n", encoding="utf-8")
    return report
