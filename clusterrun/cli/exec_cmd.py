"""`clusterrun exec`: run a command on every node at once (like pdsh), with a per-node summary."""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from clusterrun.cli.sources_options import load_nodes, source_options, uses_source


def _refuse_unknown_options(head: tuple[str, ...]) -> None:
    """Unknown options reach ``targets`` (the command's own are kept for it): before ``--`` or in INVENTORY's place
    they are clusterrun's, mistyped or another tool's (``--nnodes``), and would otherwise become the command."""
    from clusterrun.errors import UsageError

    flag = next((t.split("=", 1)[0] for t in head if t.startswith("-") and t != "-"), None)
    if flag is None:
        return
    from clusterrun.cli.foreign_flags import explain

    options = {name for param in exec_.params for name in param.opts}
    raise UsageError(explain(flag, options) or f"no such option: {flag} (clusterrun's options go before `--`; the "
                     "command follows it)")


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": True,
                                 "help_option_names": ["-h", "--help"], "max_content_width": 100},
               epilog="""\b
Examples:
  clusterrun exec cluster.yaml -- nvidia-smi --query-gpu=name,memory.used --format=csv
  clusterrun exec cluster.yaml --fold -- python -c 'import torch; print(torch.__version__)'
  clusterrun exec --ips 10.0.0.1,10.0.0.2 -- 'df -h /dev/shm'
  clusterrun exec cluster.yaml --nodes 'gpu0[1-2]' --timeout 10 -- uptime

One argument after `--` is a shell command line; several are quoted and joined. Exit code: 0
when the command succeeded on every node, 1 otherwise (each node's code is in the summary).""")
@source_options
@click.option("--fold", is_flag=True, help="Group nodes with identical output (like dshbak -c) instead of "
              "printing lines as they come.")
@click.option("--timeout", type=click.FloatRange(0.1, None), metavar="SECONDS",
              help="Stop the command on nodes where it runs longer (it is stopped everywhere on Ctrl-C anyway).")
@click.argument("targets", nargs=-1, type=click.UNPROCESSED, metavar="[INVENTORY] -- COMMAND...")
def exec_(targets: tuple[str, ...], fold: bool, timeout: float | None, **sources: Any) -> int:
    """Run COMMAND on every node of INVENTORY (or --ips/--hostfile/--slurm) at once.

    Output lines are prefixed [node]; a summary gives each node's exit code. The command runs
    in its own session on each node and is stopped there when it times out or when clusterrun
    is interrupted, so nothing is left behind.
    """
    from clusterrun.errors import UsageError

    targets = tuple(targets)
    _refuse_unknown_options(targets[:targets.index("--")] if "--" in targets else targets[:1])
    inventory = None
    if not uses_source(sources):
        if not targets:
            raise UsageError("missing INVENTORY and COMMAND: clusterrun exec cluster.yaml -- COMMAND")
        inventory, targets = Path(targets[0]), targets[1:]
    if targets and targets[0] == "--":
        targets = targets[1:]
    if not targets:
        raise UsageError("missing COMMAND: clusterrun exec cluster.yaml -- hostname")
    command = targets[0] if len(targets) == 1 else shlex.join(targets)
    inv = load_nodes(inventory, **sources)
    from clusterrun.ops.execute import run_everywhere
    from clusterrun.transport.factory import open_node_transports

    stop = threading.Event()
    width = max(len(n.name) for n in inv.nodes)

    def show(node: str, _stream: str, text: str) -> None:
        if not fold:
            sys.stdout.write(f"[{node}]{' ' * (width - len(node))} {text}\n")
            sys.stdout.flush()

    previous = signal.signal(signal.SIGINT, lambda *_: stop.set()) if threading.current_thread() is \
        threading.main_thread() else None
    transports = open_node_transports(inv)
    try:
        results = run_everywhere(inv, transports, command, timeout=timeout, on_line=show, stop=stop)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        for transport in transports.values():
            transport.close()
    if fold:
        # stdout, then stderr: how the two interleave differs from node to node, their content should not.
        groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[str]] = {}
        for name, result in results.items():
            key = tuple(tuple(text for s, text in result.lines if s == stream) for stream in ("stdout", "stderr"))
            groups.setdefault(key, []).append(name)  # type: ignore[arg-type]
        for (out, err), names in groups.items():
            click.echo(f"---------------- {','.join(names)} ({len(names)})")
            for line in (*out, *err):
                click.echo(line)
    failed = 0
    click.echo("", err=True)
    for name, result in results.items():
        if result.exit_code == 0:
            state = "ok"
        elif result.exit_code is None:
            state = f"no result: {result.error or ('interrupted' if stop.is_set() else 'connection lost')}"
        else:
            state = f"exit {result.exit_code}" + (f" ({result.reason})" if result.reason else "")
        failed += result.exit_code != 0
        click.echo(f"{name}:{' ' * (width - len(name))} {state}", err=True)
    click.echo(f"clusterrun: {len(results) - failed} of {len(results)} node(s) succeeded", err=True)
    if stop.is_set():
        return 130
    return 1 if failed else 0
