"""`clusterrun doctor`: prove the cluster can train before it trains."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from clusterrun.cli.sources_options import load_nodes, source_options, uses_source


def _names(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _this_machine() -> Any:
    import socket

    from clusterrun.inventory.models import Inventory

    return Inventory.model_validate({"defaults": {"transport": "local"},
                                     "nodes": [{"name": socket.gethostname() or "localhost", "host": "127.0.0.1"}]})


def _list_checks() -> None:
    from clusterrun.doctor.registry import all_checks

    for c in all_checks().values():
        needs = f" (needs {c.needs})" if c.needs else ""
        kind = "runs traffic" if c.active else "reads facts"
        click.echo(f"{c.name:20s} {c.scope.value:8s} {kind:13s} {c.title}{needs}")


@click.command(epilog="""\b
Examples:
  clusterrun doctor cluster.yaml
  clusterrun doctor cluster.yaml --checks net,cluster     # network and all-reduce only
  clusterrun doctor cluster.yaml --skip net.bandwidth --json > report.json
  clusterrun doctor --ips 10.0.0.1,10.0.0.2 --gpus 0-7      # without an inventory file
  clusterrun doctor                                        # this machine alone
  clusterrun doctor --list

Exit code: 0 when every check passed (or did not apply), 3 when there are warnings
but no failure, 1 when a check failed, 2 for bad input. The whole report, with the
commands run and their output, is saved in runs/doctor-<time>/, with report.html:
the same on one page, with each network's matrix of measured pairs.""")
@click.argument("inventory", required=False, type=click.Path(dir_okay=False, path_type=Path))
@source_options
@click.option("--checks", "only", metavar="NAMES", help="Run only these checks or groups, e.g. net,gpu.busy.")
@click.option("--skip", metavar="NAMES", help="Skip these checks or groups, e.g. net.bandwidth,cluster.")
@click.option("--list", "list_checks", is_flag=True, help="List every check and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON on stdout.")
@click.option("-v", "--verbose", is_flag=True, help="Also list every passing finding.")
@click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Where the report directory doctor-<time>/ goes.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the round's HTML page here (default: report.html in the report directory).")
@click.option("--master-port", type=click.IntRange(1, 65535), help="Port to test on rank 0 (default: the inventory's).")
@click.option("--bandwidth-seconds", type=click.FloatRange(0.5, 60), default=2.0, show_default=True,
              help="Length of each bandwidth transfer (per direction of a pair).")
@click.option("--bandwidth-rounds", type=click.IntRange(0, 1000), default=3, show_default=True,
              help="Rounds of pairs to measure (0: every pair). Two or more tell a slow node from a slow pair.")
@click.option("--bandwidth-tool", type=click.Choice(["auto", "iperf3", "builtin"]), default="auto", show_default=True,
              help="auto: iperf3 where every node has it, else a built-in TCP probe.")
@click.option("--allreduce-mib", type=click.FloatRange(0.001, 4096), default=16.0, show_default=True,
              help="Size of the all-reduce smoke test.")
@click.option("--timeout", type=click.FloatRange(5, 3600), default=120.0, show_default=True, metavar="SECONDS",
              help="Time limit of the all-reduce smoke test (it fails, not hangs).")
@click.option("--path", "tool_path", metavar="DIRS",
              help="Directories (colon-separated) searched first for tools on the nodes, e.g. a perftest build.")
def doctor(inventory: Path | None, only: str | None, skip: str | None, list_checks: bool, as_json: bool,
           verbose: bool, runs_dir: Path, html_file: Path | None, master_port: int | None, bandwidth_seconds: float, bandwidth_rounds: int,
           bandwidth_tool: str, allreduce_mib: float, timeout: float, tool_path: str | None,
           **sources: Any) -> int:
    """Check that every node of INVENTORY can take part in training, and say what to fix.

    doctor SSHes into every node at once and checks reachability, OS, python/torch and their
    versions, GPUs (present, same model, busy, ECC), topology, NICs (present, up, address, MTU),
    InfiniBand/RoCE ports, limits (memlock, /dev/shm, open files), clock skew and leftover NCCL
    settings; then pings every pair on each network (round-robin, N-1 rounds), measures
    bandwidth on the data network, tests the master port, and runs a real all-reduce through
    the same launch path as `up`. Without INVENTORY it checks this machine alone.
    """
    from clusterrun.doctor.registry import Options, all_checks, select
    from clusterrun.errors import UsageError

    if list_checks:
        _list_checks()
        return 0
    try:
        checks = select(_names(only), _names(skip))
    except ValueError as exc:
        raise UsageError(f"--checks/--skip: {exc}") from None
    if not checks:
        raise UsageError("--checks/--skip: no check left to run")
    ssh = all_checks()["node.ssh"]
    if ssh not in checks and "node.ssh" not in _names(skip) and "node" not in _names(skip):
        checks.insert(0, ssh)  # an unreachable node must be named, whatever else was chosen
    # Without any source: this machine alone (no GPUs or NICs listed: what needs them is skipped).
    inv = _this_machine() if inventory is None and not uses_source(sources) else load_nodes(inventory, **sources)
    options = Options(master_port=master_port, bandwidth_seconds=bandwidth_seconds, bandwidth_rounds=bandwidth_rounds,
                      bandwidth_tool=bandwidth_tool, allreduce_mib=allreduce_mib, allreduce_timeout=timeout,
                      path=tuple(d for d in (tool_path or "").split(":") if d),
                      inventory_file=str(inventory) if inventory is not None else None)
    report_dir = runs_dir / f"doctor-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while report_dir.exists():
        n += 1
        report_dir = runs_dir / f"doctor-{time.strftime('%Y%m%d-%H%M%S')}-{n}"
    from clusterrun.doctor.run import run_doctor

    interactive = sys.stderr.isatty() and not as_json
    try:
        if interactive:
            from rich.console import Console

            with Console(stderr=True).status("doctor: starting") as status:
                report = run_doctor(inv, checks, options, report_dir, lambda m: status.update(f"doctor: {m}"))
        else:
            report = run_doctor(inv, checks, options, report_dir,
                                lambda m: click.echo(f"clusterrun: doctor: {m}", err=True))
    except KeyboardInterrupt:
        _write_page(report_dir, html_file, as_json)  # what the round found before it was cut short
        raise
    if as_json:
        import json

        click.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        from clusterrun.doctor.render import print_report

        print_report(report, sys.stdout, verbose=verbose)
    _write_page(report_dir, html_file, as_json)
    return report.exit_code


def _write_page(report_dir: Path, html_file: Path | None, as_json: bool) -> None:
    """The round's HTML page; its path on stdout (stderr with --json, whose stdout is the report)."""
    if not report_dir.is_dir():
        return
    from clusterrun.report import write_doctor_page

    try:
        page = write_doctor_page(report_dir, html_file)
    except OSError as exc:
        click.echo(f"clusterrun: doctor: cannot write the HTML page: {exc}", err=True)
        return
    # With --json stdout is the report: the path goes to stderr, as doctor's progress does.
    click.echo(f"clusterrun: doctor: page: {page}" if as_json else f"page: {page}", err=as_json)
