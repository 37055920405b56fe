"""`clusterrun metrics`: a run's series (NICs, RDMA ports, GPUs, ranks per node), its energy and its verdicts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from clusterrun.cli.run_args import RUN_ARG, RUNS_DIR

RECENT = 10  # samples folded into the text view's "recent" row of each node


def metrics_view(run_dir: Path, only: tuple[str, ...] = ()) -> dict[str, Any]:
    """The run's series as ``metrics --json`` prints it: per node its samples, the data NIC, the run's energy and
    the wrong-NIC verdicts found in the series. Raises UsageError for a node with no series."""
    from clusterrun.errors import UsageError
    from clusterrun.runs import series, traffic

    names = series.nodes(run_dir)
    missing = [n for n in only if n not in names]
    if missing:
        raise UsageError(f"no series of node {', '.join(missing)} in {run_dir}/ (nodes with one: "
                         f"{', '.join(names) or 'none'}); check --node")
    chosen = [n for n in names if not only or n in only]
    data = {n: series.read_series(run_dir, n) for n in chosen}
    try:
        plan = json.loads((run_dir / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        plan = {}
    judge = traffic.WrongNicJudge.from_plan(plan)
    verdicts = [v.to_dict() for n in chosen for s in data[n] for v in judge.feed(n, s)]
    used = traffic.energy(data)
    data_nics = {n.get("name"): n.get("data_nic") for n in plan.get("nodes") or []}
    return {"run_id": run_dir.name,
            "nodes": {n: {"data_nic": data_nics.get(n), "samples": data[n]} for n in chosen},
            "energy": {"total_j": round(used.total, 1), "per_node_j": used.per_node, "per_gpu_j": used.per_gpu,
                       "how": used.how},
            "verdicts": verdicts}


def _row(node: str, data_nic: str | None, samples: list[dict[str, Any]]) -> list[str]:
    from clusterrun.runs.series import fold
    from clusterrun.runs.traffic import rate_text

    recent = fold(samples[-RECENT:])
    nics = recent.get("nics") or {}
    data = nics.get(data_nic or "") or [None, None]
    others = sorted(((sum(v), k) for k, v in nics.items() if k not in (data_nic, "lo")), reverse=True)[:2]
    gpus = recent.get("gpus") or {}
    utils = [g["util"] for g in gpus.values() if "util" in g]
    power = sum(g.get("power") or 0 for g in gpus.values())
    cpus = [r["cpu"] for r in (recent.get("ranks") or {}).values() if "cpu" in r]
    return [node, time.strftime("%H:%M:%S", time.localtime(float(recent["t"]))),
            f"{data_nic or '?'} rx {rate_text(data[0])} tx {rate_text(data[1])}",
            ", ".join(f"{k} {rate_text(v)}" for v, k in others) or "-",
            f"{len(gpus)}x {sum(utils) / len(utils):.0f}% {power:.0f} W" if utils else "-",
            f"{min(cpus):.2f}-{max(cpus):.2f}" if cpus else "-",
            f"{recent['load']:.1f}" if "load" in recent else "-",
            str(len(samples))]


@click.command(epilog="""\b
Examples:
  clusterrun metrics                       # the last run: each node's recent rates and use
  clusterrun metrics 20261123-101500-a1b2 --node gpu02 --json | jq '.nodes.gpu02.samples[-1]'""")
@RUN_ARG
@RUNS_DIR
@click.option("--json", "as_json", is_flag=True, help="Print every sample of every node as JSON (NICs by name, GPUs "
              "by physical index, ranks by global rank), with the run's energy and verdicts.")
@click.option("--node", "only", multiple=True, metavar="NODE", help="Only this node (repeat for more).")
def metrics(run: str, runs_dir: Path, as_json: bool, only: tuple[str, ...]) -> int:
    """Show a run's series: per node the data NIC and the other NICs, GPU use and power, CPU per rank and load, as
    the node agents sampled them (``up --sample-every``); the run's GPU energy; traffic on the wrong NIC."""
    from clusterrun.cli.detached_cmd import refreshed
    from clusterrun.runs import find_run

    found = find_run(runs_dir, run)
    refreshed(found)  # a detached run: its series as its supervisor keeps them
    view = metrics_view(found.path, only)
    if as_json:
        click.echo(json.dumps(view, indent=1))
        return 0
    if not view["nodes"]:
        click.echo(f"no series in {found.path}/: the run sampled nothing (sampling was off, or the run is older "
                   "than sampling)")
        return 0
    head = ["node", "at", "data NIC (recent)", "other NICs", "GPUs", "rank CPU", "load", "samples"]
    rows = [head] + [_row(n, v["data_nic"], v["samples"]) for n, v in view["nodes"].items() if v["samples"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    energy = view["energy"]
    if energy["per_node_j"]:
        how = ", ".join(sorted(set(energy["how"].values())))
        click.echo(f"GPU energy: {energy['total_j'] / 3.6e6:.3f} kWh ({energy['total_j'] / 1000:.1f} kJ; {how}): "
                   + ", ".join(f"{n} {j / 1000:.1f} kJ" for n, j in energy["per_node_j"].items()))
    for verdict in view["verdicts"]:
        click.echo(f"wrong NIC: {verdict['text']}")
    return 0
