"""After a run: make ``runs/`` whole, and stop whatever of the run is left on a lost node.

Every node that ended normally said how many bytes and lines each of its rank files holds; a node is
*lost* when its stream broke before it said so (agent killed, connection dropped, heartbeats
unanswered). For each lost node, and for each node whose rank logs in ``runs/`` hold fewer bytes
than it reported, one command (the node agent's ``collect`` mode) stops any process of the run still
alive there (lost nodes only) and sends the bytes that never arrived, which are appended to
``runs/<id>/<node>/rank<R>.log``. What still cannot be had is listed, per rank, with the place on the
node where the whole log stays: in the notes, the summary and ``status.json``.

:func:`collect` is that one command; ``clusterrun logs`` of a detached run uses it too (without stopping
anything). What was already received is given as byte offsets per rank file, so nothing arrives twice.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterrun import remote
from clusterrun.errors import ClusterrunError, CommandTimeout
from clusterrun.launch.agent_link import encode_spec
from clusterrun.launch.console import Console
from clusterrun.launch.outcome import RankState, RunOutcome
from clusterrun.launch.relay import LogRelay
from clusterrun.plan import LaunchPlan, NodePlan
from clusterrun.remote import protocol
from clusterrun.remote.protocol import frames
from clusterrun.runs import RunDir
from clusterrun.transport.base import Transport
from clusterrun.transport.fanout import fan_out

#: Receives fetched output: (global rank, "stdout" | "stderr", bytes, more of this record follows).
OutSink = Callable[[int, str, bytes, bool], None]


@dataclass
class Collected:
    node: str
    files: list[dict[str, Any]] = field(default_factory=list)  # per rank file: rank, stream, bytes, lines, skipped_*
    fetched_bytes: int = 0
    fetched_lines: int = 0
    swept: list[int] = field(default_factory=list)  # processes stopped (sweep=True)
    alive: int | None = None  # processes of the run still there (sweep=False); None when unknown
    record: dict[str, Any] | None = None  # the node's exit.json once its torchrun ended
    exit_code: int | None = 0  # of the collect command itself (None: it did not say)
    tail: str = ""  # what it wrote to stderr last, for a failure message

    @property
    def skipped_bytes(self) -> int:
        return sum(int(f.get("skipped_bytes") or 0) for f in self.files)

    @property
    def skipped_lines(self) -> int:
        return sum(int(f.get("skipped_lines") or 0) for f in self.files)

    def sizes(self) -> dict[str, dict[str, Any]]:
        """``{"<rank>/<stream>": {"bytes", "lines"}}`` as the node reported its files."""
        return {f"{f['rank']}/{f['stream']}": {"bytes": f.get("bytes"), "lines": f.get("lines")} for f in self.files}


def collect(transport: Transport, *, node: str, python: str, run_id: str, run_dir: str,
            rank_offset: int, offsets: Mapping[str, int], sweep: bool, grace: float, max_bytes: int,
            timeout: float, sink: OutSink, partial: bool = True) -> Collected:
    """Run ``collect`` on ``node``; every fetched byte goes to ``sink`` as it arrives.

    ``offsets``: bytes already received per ``"<rank>/<stream>"``; ``partial``: also send a last line that has
    no newline yet (the run is over). Raises :class:`ClusterrunError` when the node cannot be reached and
    :class:`CommandTimeout` when it does not finish within ``timeout`` seconds.
    """
    spec = {"run_id": run_id, "node": node, "grace": grace, "run_dir": run_dir, "sweep": sweep,
            "rank_offset": rank_offset, "max_bytes": max_bytes, "skip": dict(offsets), "partial": partial}
    argv = remote.argv(python, "agent", "collect", encode_spec(spec), inline=not transport.is_local)
    stream = transport.start(argv)
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        stream.abort()

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    out = Collected(node)
    try:
        for frame in frames(stream.chunks()):
            event = frame.event
            kind = event.get("ev")
            if kind == protocol.OUT:
                sink(int(event["rank"]), str(event.get("stream", "stdout")), frame.payload, bool(event.get("open")))
                out.fetched_bytes += len(frame.payload)
                out.fetched_lines += frame.payload.count(b"\n")
            elif kind == protocol.LOG:
                out.files.append(event)
            elif kind == protocol.SWEPT:
                out.swept = list(event.get("pids") or [])
            elif kind == protocol.ALIVE:
                out.alive = len(event.get("pids") or [])
            elif kind == protocol.RECORD:
                out.record = event.get("exit")
            elif kind == protocol.LAUNCHER:
                out.tail = event.get("text", "")
    finally:
        timer.cancel()
    if timed_out.is_set():
        raise CommandTimeout(node, f"collecting the logs did not finish within {timeout:g}s "
                                   f"({out.fetched_bytes} bytes fetched)")
    out.exit_code = stream.wait(5.0)
    stream.abort()
    out.tail = (stream.stderr_text().strip().splitlines() or [out.tail])[-1]
    return out


COLLECT_TIMEOUT = 120.0
MAX_BYTES = 64 << 20  # per rank file: past this, the end of a huge log is what explains a failure


def lost_nodes(outcome: RunOutcome) -> list[str]:
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
                      sweep=lost, grace=grace, max_bytes=MAX_BYTES, timeout=COLLECT_TIMEOUT + grace, sink=sink)
    except ClusterrunError as exc:
        why = getattr(exc, "reason", None) or str(exc)
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
        parts.append(f"the node recorded torchrun's exit code {got.record.get('rc')} ({got.record.get('reason')})")
    return "; ".join(parts)


def complete_logs(plan: LaunchPlan, transports: Mapping[str, Transport], run_dir: RunDir, outcome: RunOutcome,
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
    outcome.log_gaps = [gap.to_dict() for gap in relay.gaps()]
    outcome.logs_unverified = [name for name in outcome.nodes if name not in relay.reported]
    outcome.log_totals = relay.totals()
    for gap in relay.gaps():
        outcome.notes.append(gap.describe())


def sweep_nodes(plan: LaunchPlan, transports: Mapping[str, Transport], grace: float) -> tuple[dict[str, int],
                                                                                             dict[str, str]]:
    """Stop whatever of the run is left on every node of ``plan`` (before the next attempt starts).

    Returns ``({node: processes stopped}, {node: why it could not be checked})``."""

    def one(node: NodePlan) -> int:
        transport = transports[node.name]
        argv = remote.argv(node.python, "agent", "sweep", plan.run_id, f"{grace:g}", node.name,
                           inline=not transport.is_local)
        res = transport.run(argv, timeout=grace + 30)
        line = next((x for x in reversed(res.stdout.splitlines()) if x.startswith("{")), None)
        if res.exit_code != 0 or line is None:
            raise ClusterrunError(f"the sweep failed (exit {res.exit_code}): {res.tail(2) or 'no output'}")
        return len(json.loads(line).get("pids") or [])

    got = fan_out(plan.nodes, lambda n: n.name, one, label="sweep", deadline=grace + 45)
    return got.results, got.problems
