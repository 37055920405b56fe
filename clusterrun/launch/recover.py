"""After a run: fetch what a lost node's logs hold, and stop whatever of the run is left there.

A node is *lost* when its stream broke before it reported its end (agent killed, connection
dropped, heartbeats unanswered). The node itself may still be reachable: then one command (the
node agent's ``collect`` mode) stops any process of the run still alive there and sends the rank
log lines the stream never delivered, which are appended to ``runs/<id>/<node>/rank<R>.log``.
A node that cannot be reached is left to its agent's watchdog, and the notes say where its logs are.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from clusterrun.errors import ClusterrunError
from clusterrun.inventory.models import Transport as TransportKind
from clusterrun.launch.collect import collect
from clusterrun.launch.console import Console
from clusterrun.launch.outcome import RankState, RunOutcome
from clusterrun.plan import LaunchPlan, NodePlan
from clusterrun.runs import RunDir
from clusterrun.transport.base import Transport

COLLECT_TIMEOUT = 30.0
MAX_BYTES = 8 << 20  # per rank log file: the end of a huge log is what explains a failure


def lost_nodes(outcome: RunOutcome) -> list[str]:
    return [name for name, node in outcome.nodes.items() if node.state is RankState.unknown]


def _collect(plan: LaunchPlan, node: NodePlan, transport: Transport, run_dir: RunDir,
             received: Mapping[tuple[str, int, str], int], grace: float, heartbeat_timeout: float) -> str:
    try:
        got = collect(transport, node=node.name, python=node.python, inline=node.transport is TransportKind.ssh,
                      run_id=plan.run_id, run_dir=node.run_dir, rank_offset=node.rank_offset, received=received,
                      sweep=True, grace=grace, max_bytes=MAX_BYTES, timeout=COLLECT_TIMEOUT + grace)
    except ClusterrunError as exc:
        return (f"{node.name}: could not reach the node after its stream broke ({getattr(exc, 'reason', exc)}); "
                f"its agent stops the job there by itself within {heartbeat_timeout:g}s of losing clusterrun, and "
                f"its rank logs stay on the node in {node.run_dir}/torchrun/")
    for rank, _stream, lines in got.lines:
        if lines:
            with run_dir.open_rank_log(node.name, rank) as fh:
                fh.writelines(text + "\n" for text in lines)
    if got.exit_code != 0 and not got.fetched:
        return f"{node.name}: collecting its logs failed (exit {got.exit_code}): {got.tail or 'no output'}"
    parts = [f"{node.name}: its stream broke; fetched {got.fetched} log line(s) the stream had not delivered"]
    if got.skipped:
        parts.append(f"{got.skipped} older line(s) over {MAX_BYTES >> 20} MiB left in {node.run_dir}/torchrun/")
    if got.swept:
        parts.append(f"stopped {len(got.swept)} leftover process(es) of the run")
    if got.record:
        parts.append(f"the node recorded torchrun's exit code {got.record.get('rc')} ({got.record.get('reason')})")
    return "; ".join(parts)


def recover_lost(plan: LaunchPlan, transports: Mapping[str, Transport], run_dir: RunDir, outcome: RunOutcome,
                 received: Mapping[tuple[str, int, str], int], console: Console, *, grace: float,
                 heartbeat_timeout: float) -> None:
    """For every lost node, in parallel: sweep, fetch missing log lines, and add a note saying what was done."""
    names = lost_nodes(outcome)
    if not names:
        return
    console.info(f"collecting logs and checking for leftovers on {', '.join(names)}")
    nodes = {n.name: n for n in plan.nodes}
    with ThreadPoolExecutor(max_workers=min(32, len(names)), thread_name_prefix="collect") as pool:
        notes = list(pool.map(lambda name: _collect(plan, nodes[name], transports[name], run_dir, received,
                                                    grace, heartbeat_timeout), names))
    for name, note in zip(names, notes, strict=True):
        outcome.notes.append(note)
        with open(run_dir.launcher_log(name), "a", encoding="utf-8") as fh:
            fh.write(f"[clusterrun] {note}\n")
