"""After a run: fetch what a lost node's logs hold, and stop whatever of the run is left there.

A node is *lost* when its stream broke before it reported its end (agent killed, connection
dropped, heartbeats unanswered). The node itself may still be reachable: then one command (the
node agent's ``collect`` mode) stops any process of the run still alive there and sends the rank
log lines the stream never delivered, which are appended to ``runs/<id>/<node>/rank<R>.log``.
A node that cannot be reached is left to its agent's watchdog, and the notes say where its logs are.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from clusterrun.errors import ClusterrunError
from clusterrun.inventory.models import Transport as TransportKind
from clusterrun.launch.agent_cmd import agent_argv
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
    skip = {f"{rank}/{stream}": n for (name, rank, stream), n in received.items() if name == node.name}
    spec = {"run_id": plan.run_id, "node": node.name, "grace": grace, "run_dir": node.run_dir,
            "rank_offset": node.rank_offset, "max_bytes": MAX_BYTES, "skip": skip}
    argv = agent_argv(node.python, "collect", [base64.b64encode(json.dumps(spec).encode()).decode()],
                      inline=node.transport is TransportKind.ssh)
    try:
        result = transport.run(argv, timeout=COLLECT_TIMEOUT + grace)
    except ClusterrunError as exc:
        return (f"{node.name}: could not reach the node after its stream broke ({getattr(exc, 'reason', exc)}); "
                f"its agent stops the job there by itself within {heartbeat_timeout:g}s of losing clusterrun, and "
                f"its rank logs stay on the node in {node.run_dir}/torchrun/")
    fetched, skipped, swept, record = 0, 0, [], None
    for line in result.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("ev") == "log" and event.get("lines"):
            with run_dir.open_rank_log(node.name, int(event["rank"])) as fh:
                fh.writelines(text + "\n" for text in event["lines"])
            fetched += len(event["lines"])
            skipped += int(event.get("skipped") or 0)
        elif event.get("ev") == "swept":
            swept = event.get("pids") or []
        elif event.get("ev") == "record":
            record = event.get("exit")
    if not result.ok and not fetched:
        return f"{node.name}: collecting its logs failed (exit {result.exit_code}): {result.tail(2) or 'no output'}"
    parts = [f"{node.name}: its stream broke; fetched {fetched} log line(s) the stream had not delivered"]
    if skipped:
        parts.append(f"{skipped} older line(s) over {MAX_BYTES >> 20} MiB left in {node.run_dir}/torchrun/")
    if swept:
        parts.append(f"stopped {len(swept)} leftover process(es) of the run")
    if record:
        parts.append(f"the node recorded torchrun's exit code {record.get('rc')} ({record.get('reason')})")
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
    for note in notes:
        outcome.notes.append(note)
        with open(run_dir.launcher_log(note.split(":", 1)[0]), "a", encoding="utf-8") as fh:
            fh.write(f"[clusterrun] {note}\n")
