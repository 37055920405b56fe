"""nccl-tests' bus bandwidth on each node, where the nodes have nccl-tests, beside ``cluster.allreduce``.

``all_reduce_perf`` is the field's yardstick: its busbw is what NVIDIA and cloud vendors quote. Doctor
looks for it on each node (on PATH, ``doctor --path`` first, else beside the inventory's python), runs it
in one process over the GPUs the inventory lists for the node (``all_reduce_perf -b 8M -e 128M -f 2 -g
N``, under ``timeout``), and reports the best bus bandwidth and the one at the largest size. That is the
node's own GPU interconnect (NVLink, PCIe); across nodes it needs an MPI build of nccl-tests started by
mpirun, which doctor does not run: ``cluster.allreduce`` measures the path between nodes.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import dataclass

from clusterrun.doctor.checks.paths import parallel
from clusterrun.doctor.model import Evidence, Finding, Scope, Verdict
from clusterrun.doctor.probe import path_prefix
from clusterrun.doctor.registry import Context, check
from clusterrun.errors import ClusterrunError, ParseError
from clusterrun.facts.parsers import nccl_tests
from clusterrun.inventory.models import Node

NAME = "cluster.nccl_tests"
TOOL = "all_reduce_perf"
SIZES = ("-b", "8M", "-e", "128M", "-f", "2")
ABSENT = "nccl-tests not found on any node: skipped; install nccl-tests for busbw"


@dataclass(frozen=True)
class Run:
    node: str
    report: nccl_tests.NcclTestsReport | None
    error: str | None
    evidence: tuple[Evidence, ...]


def _locate(ctx: Context, node: Node) -> str | None:
    """Where ``all_reduce_perf`` is on the node: on PATH, else beside the inventory's python; None if nowhere."""
    assert ctx.transports is not None
    python = shlex.quote(ctx.inventory.python_of(node))
    script = (f"{path_prefix(ctx.options.path)}command -v {TOOL} && exit 0; py=$(command -v {python}) || exit 0; "
              f"p=\"$(dirname \"$py\")/{TOOL}\"; [ -x \"$p\" ] && echo \"$p\"; exit 0")
    try:
        res = ctx.transports[node.name].run(["sh", "-c", script], timeout=30)
    except ClusterrunError:
        return None  # an unreachable node: node.ssh says so
    found = res.stdout.strip().splitlines()
    return found[-1] if found else None


def _run(ctx: Context, node: Node, tool: str) -> Run:
    assert ctx.transports is not None
    limit = int(ctx.options.allreduce_timeout)
    command = " ".join(shlex.quote(a) for a in [tool, *SIZES, "-g", str(len(node.gpus))])
    argv = ["sh", "-c", f"{path_prefix(ctx.options.path)}exec timeout {limit} {command}"]
    try:
        res = ctx.transports[node.name].run(argv, timeout=limit + 30)
    except ClusterrunError as exc:
        return Run(node.name, None, exc.reason, ())
    output = res.stdout + res.stderr
    evidence = (Evidence(command, output[-20000:], res.exit_code, node.name),)
    try:
        return Run(node.name, nccl_tests.parse(output), None, evidence)
    except ParseError as exc:
        return Run(node.name, None, f"{exc} (exit {res.exit_code})", evidence)


def _finding(run: Run, gpus: int) -> Finding:
    report = run.report
    if report is None:
        return Finding(NAME, Verdict.failed, f"{run.node}: {TOOL} gave no result: {run.error}", node=run.node,
                       subject=TOOL, evidence=run.evidence, hint=f"run {TOOL} on the node by hand to see why")
    if report.failures:
        return Finding(NAME, Verdict.failed, f"{run.node}: {TOOL} failed after {len(report.rows)} size(s): "
                       f"{report.failures[0]}", node=run.node, subject=TOOL, evidence=run.evidence,
                       hint=f"rerun {TOOL} with NCCL_DEBUG=INFO on the node; the same failure would stop training",
                       data={"failures": list(report.failures)})
    if report.wrong_rows or report.out_of_bounds:
        sizes = ", ".join(str(r.size_bytes) for r in report.wrong_rows) or "see the table"
        return Finding(NAME, Verdict.failed, f"{run.node}: {TOOL} got wrong results ({sizes} bytes; out of bounds "
                       f"values: {report.out_of_bounds})", node=run.node, subject=TOOL, evidence=run.evidence,
                       hint="data corruption, not slowness: check the GPUs' Xid errors (dmesg), ECC (nvidia-smi -q "
                            "-d ECC) and NVLink errors (nvidia-smi nvlink -e)")
    if not report.complete or report.largest is None:
        where = f"inside the row {report.cut_line!r}" if report.cut_line else f"after {len(report.rows)} row(s)"
        return Finding(NAME, Verdict.failed, f"{run.node}: {TOOL}'s output ended {where}, before its average",
                       node=run.node, subject=TOOL, evidence=run.evidence,
                       hint=f"the test stopped early (killed, timed out after {TOOL}'s limit, or crashed): rerun it")
    peak, last = report.peak_busbw_gbs or 0.0, report.largest
    return Finding(NAME, Verdict.passed,
                   f"{run.node}: {TOOL} on {gpus} GPU(s): busbw {peak:.2f} GB/s ({peak * 8:.1f} Gbit/s) at best, "
                   f"{last.busbw_gbs:.2f} GB/s at {last.size_bytes} bytes; average {report.avg_busbw_gbs or 0:.2f} GB/s",
                   node=run.node, subject=TOOL, measured=f"busbw {peak:.2f} GB/s", evidence=run.evidence,
                   data={"busbw_gbs": peak, "largest_busbw_gbs": last.busbw_gbs, "largest_bytes": last.size_bytes,
                         "avg_busbw_gbs": report.avg_busbw_gbs, "rows": len(report.rows)})


@check(NAME, "nccl-tests all_reduce_perf bus bandwidth on each node's GPUs", Scope.node, active=True,
       needs="all_reduce_perf on a node (PATH, --path or beside the inventory python) and GPUs listed for it")
def nccl_tests_busbw(ctx: Context) -> Iterator[Finding]:
    nodes = ctx.reachable()
    found = dict(zip([n.name for n in nodes], parallel([lambda n=n: _locate(ctx, n) for n in nodes]), strict=True))
    if not any(found.values()):
        yield Finding(NAME, Verdict.skipped, ABSENT,
                      hint=f"nccl-tests (github.com/NVIDIA/nccl-tests) builds {TOOL}; put it on the nodes' PATH, "
                           "beside the inventory's python, or pass `doctor --path DIR`")
        return
    runnable = []
    for node in nodes:
        if not found[node.name]:
            yield Finding(NAME, Verdict.skipped, f"{node.name}: nccl-tests not found (PATH, beside "
                          f"{ctx.inventory.python_of(node)}): skipped", node=node.name, subject=TOOL)
        elif not node.gpus:
            yield Finding(NAME, Verdict.skipped, f"{node.name}: lists no GPUs: {TOOL} needs them", node=node.name,
                          subject=TOOL)
        else:
            runnable.append(node)
    ctx.progress(f"{TOOL} on {len(runnable)} node(s)")
    runs = parallel([lambda n=n: _run(ctx, n, str(found[n.name])) for n in runnable])
    for node, run in zip(runnable, runs, strict=True):
        yield _finding(run, len(node.gpus))
