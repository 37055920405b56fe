"""The end-to-end proof: a real all-reduce across every node, launched exactly as ``clusterrun up`` launches."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from clusterrun import remote
from clusterrun.doctor.checks.paths import Endpoint, ledger, networks
from clusterrun.doctor.contradictions import contradictions, on_network
from clusterrun.doctor.model import Evidence, Finding, Scope, Verdict
from clusterrun.doctor.registry import Context, check
from clusterrun.errors import ClusterrunError, StartError

if TYPE_CHECKING:
    from clusterrun.planning.plan import LaunchPlan

SMOKE = remote.path("allreduce_smoke")
MARK = "CLUSTERRUN-ALLREDUCE "


def _dead_on_data_network(ctx: Context) -> list[Endpoint]:
    """Endpoints that this run's pair checks found dead on the data network (none when it was not tested)."""
    book = ledger(ctx)
    data = next((n for n in networks(ctx) if n.data), None)
    return [] if data is None else [ep for node, ep in data.members.items() if node in book.dead(data.subnet)]


def _nics_of(plan: LaunchPlan, ctx: Context, name: str) -> list[tuple[str, str]]:
    planned = [(p.data_nic, p.data_address) for p in plan.nodes if p.name == name and p.data_nic]
    listed = [(nic.name, str(nic.ip)) for n in ctx.inventory.nodes if n.name == name for nic in n.nics if nic.ip]
    return planned + listed


@check("cluster.allreduce", "all-reduce across all nodes through the launch path of `up`", Scope.cluster,
       active=True, needs="every node reachable")
def allreduce(ctx: Context) -> Iterator[Finding]:
    from clusterrun.facts.hints import failure_hints
    from clusterrun.launch.console import Console
    from clusterrun.launch.settings import LaunchRequest, SupervisorSettings
    from clusterrun.launch.up import execute
    from clusterrun.planning.plan import JobSpec, build_plan

    down = [n.name for n in ctx.inventory.nodes if n.name not in {r.name for r in ctx.reachable()}]
    if down:
        yield Finding("cluster.allreduce", Verdict.skipped, f"not every node is reachable ({', '.join(down)})")
        return
    dead = _dead_on_data_network(ctx)
    if dead:  # the job would only wait for them until its time limit
        names = ", ".join(f"{ep.node} ({ep.nic})" for ep in dead)
        verb, them = ("reaches", "it") if len(dead) == 1 else ("reach", "them")
        yield Finding("cluster.allreduce", Verdict.skipped,
                      f"not run: {names} {verb} no peer on the data network (see net.ping and net.bandwidth); "
                      f"the job would only wait for {them}", data={"dead": [ep.node for ep in dead]})
        return
    planned = next((n for n in networks(ctx, as_the_nodes_say=True) if n.data), None)
    wrong = [c for c in contradictions(ctx).values() if planned is not None and on_network(c, ctx, planned.subnet)]
    if wrong:  # `up` would refuse the same inventory: an inventory problem, told by nic.present
        yield Finding("cluster.allreduce", Verdict.skipped, "not tested: " + "; ".join(
                      f"{c.node}: {c.nic}: {c.said} ({c.where})" for c in wrong),
                      hint="an inventory problem (see nic.present): fix it and run doctor again",
                      data={"inventory": [c.to_data() for c in wrong]})
        return
    opts = ctx.options
    runs_dir = ctx.report_dir or Path("runs")
    cpu_only = not any(n.gpus for n in ctx.inventory.nodes)
    job = JobSpec(script=str(SMOKE), run_id=f"allreduce-{time.strftime('%H%M%S')}",
                  args=("--mib", f"{opts.allreduce_mib:g}", "--timeout", f"{min(60.0, opts.allreduce_timeout):g}"),
                  nproc_per_node=1 if cpu_only else None, master_port=opts.master_port,
                  local_runs_dir=str(runs_dir.resolve()), local_cwd=str(SMOKE.parent))
    try:
        plan = build_plan(ctx.inventory, job)
    except ClusterrunError as exc:
        yield Finding("cluster.allreduce", Verdict.failed, f"cannot plan the test: {exc}",
                      hint="fix the inventory (`clusterrun plan` shows the same error)")
        return
    ctx.progress(f"all-reduce of {opts.allreduce_mib:g} MiB on {plan.world_size} rank(s)")
    out = io.StringIO()
    console = Console(out, out, color=False, quiet=True)
    request = LaunchRequest(SupervisorSettings(timeout=opts.allreduce_timeout))
    started = time.monotonic()
    try:
        outcome, run_dir = execute(ctx.inventory, plan, runs_dir, console, request)
    except StartError as exc:
        problems = "; ".join(f"{n}: {p}" for n, p in exc.problems.items())
        yield Finding("cluster.allreduce", Verdict.failed, f"could not start the test: {problems}",
                      hint="the same would stop `clusterrun up`; see the node checks above")
        return
    wall = time.monotonic() - started
    rank0 = plan.nodes[0].name
    lines = run_dir.tail(rank0, 0, 200)
    evidence = (Evidence(" ".join(plan.nodes[0].argv), "\n".join(lines[-40:]), outcome.exit_code, rank0),)
    report = next((json.loads(line.split(MARK, 1)[1]) for line in reversed(lines) if MARK in line), None)
    if outcome.first_failure is not None or report is None:
        failure = outcome.first_failure
        where = failure.describe() if failure else "rank 0 printed no result"
        node, rank = (failure.node, failure.rank) if failure else (rank0, 0)
        log = run_dir.tail(node, rank if rank is not None else plan.nodes[0].rank_offset, 400)
        tail = log[-20:]
        # The whole tail: NCCL names its interfaces at the start. The node's NICs, data NIC first, let a hint
        # name a real interface of it rather than one NCCL listed.
        hints = failure_hints(log, nics=_nics_of(plan, ctx, node)) if log else []
        yield Finding("cluster.allreduce", Verdict.failed, f"all-reduce failed after {wall:.1f}s: {where}", node=node,
                      hint="; ".join(hints) or f"see {run_dir.path}/ for every rank's log",
                      evidence=(Evidence(" ".join(plan.nodes[0].argv), "\n".join(tail), outcome.exit_code, node),),
                      data={"run_dir": str(run_dir.path.resolve())})
        return
    yield Finding("cluster.allreduce", Verdict.passed,
                  f"{report['backend']} all-reduce of {report['bytes'] / (1 << 20):g} MiB on {report['world_size']} "
                  f"rank(s): busbw {report['busbw_gbps']:.2f} Gbit/s, {report['best_s'] * 1000:.1f} ms per call; "
                  f"launch to result {wall:.1f}s", measured=f"busbw {report['busbw_gbps']:.2f} Gbit/s",
                  evidence=evidence, data={**report, "wall_s": wall, "run_dir": str(run_dir.path.resolve())})
