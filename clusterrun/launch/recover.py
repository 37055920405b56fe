"""After a run: make ``runs/`` whole, and stop whatever of the run is left on a lost node.

Every node that ended normally said how many bytes and lines each of its rank files holds; a node is
*lost* when its stream broke before it said so (agent killed, connection dropped, heartbeats
unanswered). For each lost node, and for each node whose rank logs in ``runs/`` hold fewer bytes
than it reported, one command (the node agent's ``collect`` mode) stops any process of the run still
alive there (lost nodes only) and sends the bytes that never arrived, which are appended to
``runs/<id>/<node>/rank<R>.log``. What still cannot be had is listed, per rank, with the place on the
node where the whole log stays: in the notes, the summary and ``status.json``.

That one command is :func:`clusterrun.agents.collect.collect`; ``clusterrun logs`` of a detached run uses it
too (without stopping anything). What was already received is given as byte offsets per rank file, so nothing
arrives twice.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from clusterrun.agents.collect import collect
from clusterrun.agents.spec import container_spec
from clusterrun.agents.sweep import sweep_everywhere
from clusterrun.errors import ClusterrunError
from clusterrun.launch.console import Console
from clusterrun.launch.outcome import RankState, logs_summary
from clusterrun.launch.relay import LogRelay
from clusterrun.planning.plan import LaunchPlan, NodePlan
from clusterrun.runs import RunDir, RunRecord
from clusterrun.transport.base import Transport
from clusterrun.transport.fanout import fan_out

COLLECT_TIMEOUT = 120.0
MAX_BYTES = 64 << 20  # per rank file: past this, the end of a huge log is what explains a failure


def lost_nodes(outcome: RunRecord) -> list[str]:
    return [name for name, node in outcome.nodes.items() if node.state is RankState.unknown]


def _collect(plan: LaunchPlan, node: NodePlan, transport: Transport, relay: LogRelay, lock: threading.Lock,
             lost: bool, grace: float, heartbeat_timeout: float) -> str | None:
    """Fetch what ``node`` has beyond what ``relay`` received. Returns a note, or None when there is nothing to say."""

    def sink(rank: int, stream: str, data: bytes, more: bool) -> None:
        with lock:  # nodes are fetched in parallel; the relay has one writer at a time
            relay.write(node.name, rank, stream, data, more, show=False)

    with lock:
        offsets = relay.offsets(node.name)
    try:
        got = collect(transport, node=node.name, python=node.python, run_id=plan.run_id, run_dir=node.run_dir, rank_offset=node.rank_offset, offsets=offsets,
                      sweep=lost, grace=grace, max_bytes=MAX_BYTES, timeout=COLLECT_TIMEOUT + grace, sink=sink,
                      container=container_spec(node))
    except ClusterrunError as exc:
        why = exc.reason
        if lost:
            return (f"{node.name}: could not reach the node after its stream broke ({why}); its agent stops the job "
                    f"there by itself within {heartbeat_timeout:g}s of losing clusterrun, and its rank logs stay on "
                    f"the node in {node.run_dir}/torchrun/")
        return f"{node.name}: could not fetch the rest of its logs ({why})"
    with lock:
        relay.expect(node.name, got.sizes())
    if got.exit_code not in (0, None) and not got.fetched_bytes:
        return f"{node.name}: collecting its logs failed (exit {got.exit_code}): {got.tail or 'no output'}"
    head = "its stream broke" if lost else "runs/ lacked part of its logs"
    parts = [f"{node.name}: {head}; fetched {got.fetched_lines} line(s) ({got.fetched_bytes} bytes) from the node"]
    if got.skipped_bytes:
        parts.append(f"{got.skipped_lines} older line(s) beyond {MAX_BYTES >> 20} MiB per file left in "
                     f"{node.run_dir}/torchrun/")
    if got.swept:
        parts.append(f"stopped {len(got.swept)} leftover process(es) of the run")
    if lost and got.record:
        parts.append(f"the node recorded torchrun's exit code {got.record.rc} ({got.record.reason})")
    return "; ".join(parts)


def complete_logs(plan: LaunchPlan, transports: Mapping[str, Transport], run_dir: RunDir, outcome: RunRecord,
                  relay: LogRelay, console: Console, *, grace: float, heartbeat_timeout: float) -> None:
    """Fetch in parallel what lost or short nodes hold; record in ``outcome`` what is still missing."""
    lost = lost_nodes(outcome)
    relay.retry()  # rank files a full disk stopped: try again from what they hold
    short = sorted({gap.node for gap in relay.gaps()} - set(lost))
    names = lost + short
    if names:
        console.info(f"fetching the logs runs/ lacks from {', '.join(names)}"
                     + (f" and checking for leftovers on {', '.join(lost)}" if lost else ""))
        nodes = {n.name: n for n in plan.nodes}
        lock = threading.Lock()
        got = fan_out(names, str, lambda name: _collect(plan, nodes[name], transports[name], relay, lock,
                                                         name in lost, grace, heartbeat_timeout),
                      label="collect", deadline=COLLECT_TIMEOUT + grace + 10)
        relay.close()
        notes = {**got.results, **{name: f"{name}: fetching its logs did not finish: {why}"
                                   for name, why in got.problems.items()}}
        for name, note in notes.items():
            if note:
                outcome.notes.append(note)
                try:
                    with open(run_dir.launcher_log(name), "a", encoding="utf-8") as fh:
                        fh.write(f"[clusterrun] {note}\n")
                except OSError as exc:
                    relay.failed(f"{name}'s launcher.log", exc)
    if relay.trouble:
        outcome.notes.append(relay.trouble)
    outcome.logs = logs_summary([gap.to_dict() for gap in relay.gaps()],
                                [name for name in outcome.nodes if name not in relay.reported], relay.totals())
    for gap in relay.gaps():
        outcome.notes.append(gap.describe())


def sweep_nodes(plan: LaunchPlan, transports: Mapping[str, Transport], grace: float) -> tuple[dict[str, int],
                                                                                             dict[str, str]]:
    """Stop whatever of the run is left on every node of ``plan`` (before the next attempt starts).

    Returns ``({node: processes stopped}, {node: why it could not be checked})``."""
    got = sweep_everywhere(plan.run_id, plan.nodes, lambda n: transports[n.name], grace)
    return {name: len(pids) for name, pids in got.results.items()}, got.problems
