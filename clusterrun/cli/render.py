"""Human-readable views of a plan and of a run's outcome (rich tables)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, TextIO

from clusterrun import redact
from clusterrun.inventory.hostlist import compress_hostlist, compress_numbers
from clusterrun.transport.base import shell_command

if TYPE_CHECKING:
    from clusterrun.planning.plan import LaunchPlan
    from clusterrun.runs import RunDir, RunRecord


def plan_json(plan: LaunchPlan) -> str:
    return json.dumps(plan.to_dict(), indent=2)


def print_plan(plan: LaunchPlan, file: TextIO | None = None) -> None:
    """One header, then a table per node: rank, GPUs, data NIC, the torchrun command, the environment."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file, highlight=False, soft_wrap=False)
    console.print(
        f"[bold]run {plan.run_id}[/]: {plan.nnodes} node(s), world size {plan.world_size}, "
        f"master {plan.master_addr}:{plan.master_port} ({plan.master.name}), data network {plan.data_network}"
    )
    if plan.choose_port:
        console.print(f"[cyan]master port:[/] {plan.master_port} unless another run holds it: `up` takes the first "
                      "free port from there on the master (--master-port or network.master_port to fix one)")
    if plan.rank_order != "inventory":
        console.print(f"[cyan]node ranks:[/] {plan.rank_order}: " + ", ".join(
            f"{n.node_rank} {n.name}" for n in sorted(plan.nodes, key=lambda n: n.node_rank)))
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    for line in plan.probed:
        console.print(f"[cyan]from the node:[/] {line}")
    if plan.spares:
        console.print(f"[cyan]spares:[/] {', '.join(plan.spares)} (take a lost node's place on a restart: "
                      "`up --max-restarts N`)")
    if plan.facts_pending:
        console.print(f"[cyan]note:[/] the inventory gives no NICs for {', '.join(plan.facts_pending)}: `up` completes "
                      "this plan with the NICs the nodes report (data NIC, master address, NCCL/Gloo interface); "
                      "`clusterrun plan --probe` shows the completed plan")
    for node in plan.nodes:
        table = Table(title=f"{node.name} ({node.host}, {node.transport.value})", title_justify="left",
                      show_header=False, box=None, padding=(0, 1))
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        ranks = f"{node.ranks.start}..{node.ranks.stop - 1}" if node.nproc_per_node > 1 else str(node.ranks.start)
        table.add_row("node_rank", f"{node.node_rank}   (global ranks {ranks})")
        table.add_row("processes", f"{node.nproc_per_node}" + (f" on GPUs {list(node.gpus)}" if node.gpus else " (CPU)"))
        table.add_row("data NIC", f"{node.data_nic or '?'} {node.data_address}")
        table.add_row("cwd", node.cwd)
        if node.container is not None:
            table.add_row("image", f"{node.container.image} ({node.container.runtime.value}, pull: "
                                   f"{node.container.pull})")
            table.add_row("command", shell_command(node.container.argv(node.argv)))
            if node.container.env:
                table.add_row("in the image", " ".join(f"{k}={v}" for k, v in node.container.env))
        else:
            table.add_row("command", shell_command(node.argv))
        env = Table(show_header=False, box=None, padding=(0, 1))
        env.add_column(no_wrap=True)
        env.add_column(overflow="fold", min_width=24)
        env.add_column(style="dim", no_wrap=True)
        for var in node.env:
            env.add_row(var.name, redact.shown(var.name, var.value), var.source)
        table.add_row("env", env)
        console.print()
        console.print(table)


def _span(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}min"


#: Past this many ranks, the summary gives one row per outcome (the failed ranks still one each).
FOLD_OVER = 32


def _nodes(names: list[str]) -> str:
    unique = list(dict.fromkeys(names))
    try:
        text = compress_hostlist(unique)
    except ValueError:
        text = ",".join(unique)
    return text if len(unique) == 1 else f"{text} ({len(unique)} nodes)"


def summary_rows(outcome: RunRecord) -> list[tuple[str, str, str, str, str]]:
    """The summary table's rows (node, rank, state, exit, time): one per rank, and a node's reason where its ranks
    do not explain its end. On a run of more than :data:`FOLD_OVER` ranks, ranks that ended alike share a row."""
    rows: list[tuple[str, str, str, str, str]] = []
    groups: dict[tuple[str, str], list[tuple[str, int, float | None]]] = {}
    fold = sum(len(n.ranks) for n in outcome.nodes.values()) > FOLD_OVER
    for name, node in outcome.nodes.items():
        for rank in node.ranks.values():
            how = rank.to_dict()["signal"] or ("" if rank.exit_code is None else str(rank.exit_code))
            took = (rank.ended - rank.started) if rank.ended and rank.started else None
            if fold and rank.state.value != "failed":
                groups.setdefault((rank.state.value, how), []).append((name, rank.rank, took))
            else:
                rows.append((name, str(rank.rank), rank.state.value, how, _span(took)))
        explained = any(r.state.value in ("failed", "stopped") for r in node.ranks.values())
        if node.reason and node.state is not None and node.state.value != "succeeded" and not explained:
            rows.append((name, "-", node.state.value, "", node.reason))
    for (state, how), members in groups.items():
        times = [t for _, _, t in members if t is not None]
        span = "?" if not times else _span(min(times)) if min(times) == max(times) else \
            f"{_span(min(times))}-{_span(max(times))}"
        rows.append((_nodes([n for n, _, _ in members]), compress_numbers([r for _, r, _ in members]), state, how, span))
    return rows


def _launcher_cause(run_dir: RunDir, node: str, tail_lines: int) -> list[str]:
    """Where a node's failure as a whole shows: the lines of its launcher.log that torchrun wrote before it was
    stopped (its banner left out), not its report of being stopped; or, when there are none, its rank logs."""
    from clusterrun.facts.torchrun_noise import cause_lines, stopped_at

    launcher = run_dir.launcher_log(node)
    try:
        lines = launcher.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    span, stopped = cause_lines(lines), stopped_at(lines) is not None
    before = " before it was stopped" if stopped else ""
    if span is None:
        return [f"{launcher} holds only torchrun's banner" + (" and its report of being stopped" if stopped else "")
                + f"; the ranks' output is in {run_dir.path / node}/rank*.log"] if lines else []
    first, last = span
    shown = lines[max(first - 1, last - tail_lines):last]
    where = f"line {first}" if first == last else f"lines {first}-{last}"
    return [f"{launcher} {where} (what torchrun said{before}):", *("  " + t for t in shown)]


def print_summary(outcome: RunRecord, run_dir: RunDir, file: TextIO | None = None, tail_lines: int = 20) -> None:
    """The one-screen end of a run: per node and rank what happened, then the first failure and its log's tail."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from clusterrun.runs import RunState

    console = Console(file=file, highlight=False, stderr=file is None)
    duration = outcome.duration
    colour = {"succeeded": "green", "failed": "red", "interrupted": "yellow"}.get(outcome.state.value, "white")
    console.print()
    console.print(f"[bold {colour}]run {outcome.run_id} {outcome.state.value}[/] after {_span(duration)} "
                  f"(exit code {outcome.exit_code})"
                  + ("" if outcome.logs_complete else "; [bold red]its logs in runs/ are incomplete[/] (see below)"))
    table = Table(box=None, padding=(0, 2), show_edge=False)
    for column in ("node", "rank", "state", "exit", "time"):
        table.add_column(column)
    for row in summary_rows(outcome):
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)
    failure = outcome.first_failure
    if failure is not None and outcome.state is RunState.failed:
        console.print(f"[bold red]first failure:[/] {escape(failure.describe())}")
        if failure.rank is not None:
            log = run_dir.rank_log(failure.node, failure.rank)
            lines = run_dir.tail(failure.node, failure.rank, tail_lines)
            if lines:
                console.print(f"last {len(lines)} lines of {log}:")
                for line in lines:
                    console.print("  " + escape(line), soft_wrap=True)
            else:
                console.print(f"rank {failure.rank} wrote nothing ({log} is empty)")
            from clusterrun.facts.hints import failure_hints

            try:  # the failed node's data NIC, so that a hint naming an interface names a real one
                nics = [(n.data_nic, n.data_address) for n in run_dir.read_plan().nodes
                        if n.name == failure.node and n.data_nic and n.data_address]
            except (OSError, ValueError, KeyError):
                nics = []
            for hint in failure_hints(run_dir.tail(failure.node, failure.rank, 400), nics=nics):
                console.print(f"[bold yellow]hint:[/] {escape(hint)}")
        else:
            for line in _launcher_cause(run_dir, failure.node, tail_lines):
                console.print(escape(line), soft_wrap=True)
    for note in outcome.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    from clusterrun.cli.status_text import energy_line

    if energy_line(outcome.energy):
        console.print(escape(energy_line(outcome.energy) or ""))
    for name in (outcome.logs or {}).get("unverified") or ():
        console.print(f"[bold red]logs:[/] {name} never said what its rank logs hold; runs/ may lack part of them")
    console.print(f"logs and status: {run_dir.path}/")
