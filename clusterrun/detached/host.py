"""A detached run's supervisor, on rank 0's node: clusterrun's own supervisor, run where the job runs.

``up --detach`` checks every node from this machine as an attached run does, then starts this program on rank 0's
node (the node that already holds torch's rendezvous store: no new single point of failure), from a bundle of
clusterrun's modules (clusterrun/remote/bundle.py), with its spec on stdin: the plan (secrets included: it goes on
stdin only), the supervisor's settings, the staged files, the run's secret and the webhooks. It then:

1. listens on a port of the node's host network and says ``listening`` (port, pid) on its stdout;
2. takes each node's agent as it connects and proves the run's secret (clusterrun/detached/links.py), the agents
   having been told ``relay`` by clusterrun over their ssh channels;
3. runs :class:`clusterrun.launch.supervisor.Supervisor`, the same object an attached ``up`` runs, over those
   connections: fail-fast, the data-path watch, the hang watch, the time limit, ``--notify``, the live state and
   every rank's log, into its run directory on this node (:data:`RECORD_DIR`), which it alone writes;
4. says ``going`` once every node was told to start, and from then on needs no one: its stdin, stdout and stderr
   leave the ssh session (rank output and its own lines go to ``console.log``, as an attached ``up`` prints them).

``clusterrun down`` asks it to stop with :data:`clusterrun.launch.phase.STOP_SIGNAL` (who asked, in
:data:`STOP_REQUEST`); SIGTERM stops the run too. When it dies, every agent sees its connection end and stops its
node's job by itself, as when an attached ``up`` dies. Standard library only.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from clusterrun.detached.links import Listener
from clusterrun.errors import StartError
from clusterrun.launch.console import Console
from clusterrun.launch.outcome import (
    CannotContinue,
    Failure,
    Signature,
    backoff,
    next_attempt,
    notify_end,
    notify_start,
    recompose,
    untrusted_nodes,
    whole_run,
)
from clusterrun.launch.phase import STOP_SIGNAL
from clusterrun.launch.settings import SupervisorSettings
from clusterrun.launch.supervisor import Supervisor
from clusterrun.notify import Notifier, pending
from clusterrun.planning.planfile import LaunchPlan
from clusterrun.remote import protocol
from clusterrun.runs.dirs import RunDir, atomic_write
from clusterrun.runs.record import AttemptRecord, RunRecord, RunState, tag_events, write_record

#: The run's record on rank 0's node, relative to the run's own directory there (``<remote runs>/<run id>/``).
RECORD_DIR = "record"
#: Files of the record directory besides the run's usual ones.
PID_FILE, STOP_REQUEST, CONSOLE_LOG, HOST_LOG = "supervisor.pid", "stop-request.json", "console.log", "supervisor.log"
#: Events on the supervisor's stdout, before it leaves the ssh session.
LISTENING, GOING = "listening", "going"
def marker_node(node: str) -> str:
    """The node marker of the supervisor's process (``CLUSTERRUN_NODE``): not the node's own, so that the node's
    agent, which stops whatever of the run is left on its node when its job ends, leaves the supervisor alone."""
    return f"{node}/supervisor"


#: Notifications the supervisor could not deliver (a node with no route out), for clusterrun's machine to send.
NOTIFY_PENDING = "notify-pending.json"
#: Seconds the end of the run waits for its last documents to go out (no terminal waits on this one).
NOTIFY_WAIT = 10.0

#: Seconds between the pings that keep the spares' agents waiting and tell whether they are still there.
PING_EVERY = 20.0

#: Seconds the agents get to connect after ``listening``.
CONNECT_TIMEOUT = 60.0


def _say(event: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # clusterrun went away: the record says what happened
        os.write(1, protocol.encode(event))


def _leave_session(log: Path) -> None:
    """From now on nothing of this process depends on the ssh session that started it."""
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        err = devnull
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(err, 2)


def _stopped_by(run_dir: RunDir) -> str | None:
    try:
        return str(json.loads((run_dir.path / STOP_REQUEST).read_text(encoding="utf-8")).get("by") or "clusterrun down")
    except (OSError, ValueError, AttributeError):
        return None


def final_record(outcome_record: RunRecord, run_dir: RunDir, signalled: int | None) -> RunRecord:
    """The run's end as this supervisor writes it: stopped (by whom) when `clusterrun down` asked and nothing had
    failed before; a first failure that came before the stop is kept."""
    record = outcome_record.replace(detached=True, pid=None)
    by = (_stopped_by(run_dir) or "clusterrun down") if signalled == STOP_SIGNAL else None
    if signalled in (STOP_SIGNAL, signal.SIGTERM):
        # The ranks got SIGTERM, whoever asked: the exit code says so, the record says who.
        record = record.replace(stopped_by=by or "SIGTERM to the run's supervisor", interrupted_by=signal.SIGTERM)
        if record.first_failure is None:
            record = record.replace(state=RunState.stopped, exit_code=128 + signal.SIGTERM)
    return record


def serve(spec: dict[str, Any]) -> int:
    plan = LaunchPlan.from_dict(spec["plan"])
    run_dir = RunDir(Path(os.path.expanduser(spec["record_dir"])))
    run_dir.path.mkdir(parents=True, exist_ok=True, mode=0o700)
    run_dir.write_json("plan.json", plan.to_dict())  # as here, with secrets redacted
    (run_dir.path / PID_FILE).write_text(f"{os.getpid()}\n", encoding="utf-8")
    listener = Listener(plan.run_id, spec["secret"], [n.name for n in (*plan.nodes, *plan.standby)])
    _say({"ev": LISTENING, "port": listener.port, "pid": os.getpid()})
    links, missing = listener.links(time.monotonic() + float(spec.get("connect_timeout") or CONNECT_TIMEOUT))
    listener.close()
    if missing:
        for link in links.values():
            link.abort()
        why = "; ".join(listener.refused[-3:])
        _say({"ev": protocol.ERROR, "text": f"no agent connected from {', '.join(missing)} in time"
                                            + (f" (refused: {why})" if why else "")})
        return 1
    console_file = open(run_dir.path / CONSOLE_LOG, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - the run's
    try:
        console = Console(out=console_file, err=console_file, color=False, fold=bool(spec.get("fold")))
        return _supervise(spec, plan, links, run_dir, console)
    finally:
        for link in links.values():
            link.abort()  # every agent ends with its connection
        console_file.close()


def _restage(stage: dict[str, list[list[str]]], before: LaunchPlan, after: LaunchPlan) -> dict[str, list[list[str]]]:
    """The staged files' destinations in the next attempt's directories (the node's cache holds the files)."""
    out = {}
    for node in after.nodes:
        old, new = before.member(node.name).run_dir, node.run_dir
        out[node.name] = [[src, new + dest[len(old):] if dest.startswith(old + "/") else dest, *rest]
                          for src, dest, *rest in stage.get(node.name, [])]
    return out


class Standby:
    """The spares' agents, checked at the start and waiting for a lost node's place: pinged every
    :data:`PING_EVERY` seconds from a thread of their own (an agent that hears nothing for its idle time ends);
    one that has not answered for three pings is not counted on."""

    def __init__(self, plan: LaunchPlan, links: dict[str, Any]) -> None:
        self.names, self.links = [n.name for n in plan.standby], links
        self.lock, self.stopped = threading.Lock(), threading.Event()
        if self.names:
            threading.Thread(target=self._ping, daemon=True, name="standby").start()

    def _ping(self) -> None:
        while not self.stopped.wait(PING_EVERY):
            with self.lock:
                for name in self.names:
                    self.links[name].send(protocol.PING)

    def ready(self) -> list[str]:
        """The spares that answered lately, in the inventory's order."""
        with self.lock:
            return [n for n in self.names if time.monotonic() - self.links[n].heard < 3 * PING_EVERY + 5]

    def waiting(self) -> list[str]:
        """Every spare still standing by (answering or not)."""
        with self.lock:
            return list(self.names)

    def take(self, names: Collection[str]) -> None:
        """These join the job: no longer pinged here (the attempt's supervisor talks to them)."""
        with self.lock:
            self.names = [n for n in self.names if n not in names]

    def close(self) -> None:
        self.stopped.set()


def _recomposed(plan: LaunchPlan, lost: dict[str, str], spares: list[str], min_nodes: int | None
                ) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The next attempt's nodes, ``{lost: spare}`` and those left out (``recompose``, as an attached ``up``);
    CannotContinue when rank 0's node is lost (this supervisor lives there: an attached ``up`` can move the
    master, this one cannot)."""
    nodes, replaced, left_out = recompose([n.name for n in plan.nodes], spares, lost, min_nodes,
                                          "none stands by" if plan.spares else "no spare nodes in the inventory")
    if plan.master.name in left_out:
        raise CannotContinue(f"rank 0's node {plan.master.name} is lost ({left_out[plan.master.name]}) and a "
                             "detached run's supervisor runs there; run attached (without --detach) to go on "
                             "with another master")
    return nodes, replaced, left_out


def _supervise(spec: dict[str, Any], plan: LaunchPlan, links: dict[str, Any], run_dir: RunDir,
               console: Console) -> int:
    """Every attempt of the run, then its record: the same supervisor and the same restart rule as an attached
    ``up`` (launch/outcome.py ``next_attempt``, ``recompose``): on the same nodes, with a spare standing by in a
    lost node's place, or without it as long as ``--min-nodes`` remain."""
    settings = SupervisorSettings(**spec["settings"])
    max_restarts, base = int(spec.get("max_restarts") or 0), float(spec.get("backoff") or 0.0)
    min_nodes = int(spec["min_nodes"]) if spec.get("min_nodes") else None
    notifier, stage = Notifier(spec.get("notify") or ()), spec.get("stage") or {}
    started = float(spec.get("started") or time.time())
    asked: list[int] = []  # a stop asked for between attempts (while a supervisor runs, it hears it itself)
    for sig in (signal.SIGTERM, STOP_SIGNAL):
        signal.signal(sig, lambda signum, _frame: asked.append(signum))
    attempts: list[AttemptRecord] = []
    events: tuple[dict[str, Any], ...] = ()
    last: Signature | None = None
    between = None  # the stop that came during a restart's backoff: the run is stopped, its failure kept
    left_out: dict[str, str] = {}
    replaced: dict[str, str] = {}
    standby = Standby(plan, links)
    while True:
        number = plan.job.attempt
        supervisor = Supervisor(plan, links, run_dir, console, settings, stage=stage, notifier=notifier)
        # The agents stay connected after their job (another attempt may follow): each one's exit is its end here.
        supervisor.signals, supervisor.keep_links = (signal.SIGTERM, STOP_SIGNAL), True
        attempts.append(AttemptRecord(number, [n.name for n in plan.nodes], started=supervisor.outcome.started,
                                      left_out=left_out, replaced=replaced))
        write_record(run_dir, RunRecord(plan.run_id, RunState.running, started=started, detached=True, events=events,
                                        attempts=tuple(attempts) if max_restarts else ()))
        if number == 0:
            def going(first: LaunchPlan = plan) -> None:
                _say({"ev": GOING, "time": time.time()})
                _leave_session(run_dir.path / HOST_LOG)
                notify_start(notifier, first, str(run_dir.path))

            supervisor.after_start = going
        try:
            outcome = supervisor.run()
        except StartError as exc:  # an agent gone between attempts: every link was dropped, no attempt follows
            outcome = supervisor.outcome
            node, why = next(iter(exc.problems.items()))
            outcome.first_failure = Failure(node, None, 1, None, f"attempt {number} could not start there: {why}")
            outcome.end(time.time())
            console.info(f"{node}: attempt {number} could not start: {why}")
        attempt = attempts[-1]
        attempt.ended_with(outcome)
        events += tag_events(outcome.events, number) if max_restarts else tuple(outcome.events)
        failure = outcome.first_failure
        tail = run_dir.tail(failure.node, failure.rank, 5) if failure and failure.rank is not None else []
        decision = next_attempt(outcome, number, max_restarts, last, tail)
        nodes, replaced, left_out = [n.name for n in plan.nodes], {}, {}
        if decision.restart and not asked:
            try:
                nodes, replaced, left_out = _recomposed(plan, untrusted_nodes(outcome), standby.ready(), min_nodes)
            except CannotContinue as exc:
                outcome.notes.append(f"could not start attempt {number + 1}: {exc}")
                console.info(outcome.notes[-1])
                break
        if not decision.restart or asked:
            outcome.notes += [decision.note] if decision.note else []
            break
        last, wait = decision.signature, backoff(number + 1, base)
        console.info(f"attempt {number} failed ({attempt.cause}); restarting in {wait:g}s (restart {number + 1} of "
                     f"{max_restarts})" + "".join(f"; {n} left out ({why})" + (f", spare {replaced[n]} takes its place"
                                                                                if n in replaced else "")
                                                  for n, why in left_out.items()))
        notifier.send("restart", f"clusterrun: run {plan.run_id} attempt {number} failed ({attempt.cause}); "
                                 "restarting", run_id=plan.run_id, attempt=number + 1)
        run_dir.archive_attempt(number)
        for name in left_out:
            links.pop(name).abort()  # that node's agent ends with its connection (and stops what is left there)
        deadline = time.monotonic() + wait
        while not asked and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))  # a `down` during the backoff ends the run
        if asked:
            outcome.interrupted_by = between = asked[0]
            outcome.notes.append(f"stopped before attempt {number + 1} started")
            break
        standby.take(nodes)
        following = plan.on_nodes(nodes, standby.waiting()).for_attempt(number + 1)
        plan, stage = following, _restage(stage, plan, following)
        run_dir.write_json("plan.json", plan.to_dict())
    standby.close()
    outcome.started = started
    record = whole_run(outcome, attempts, events, bool(max_restarts))
    # The documents first: what could not go out is in the record's directory before the record says the run
    # ended (a look that sees the end sees them too).
    notify_end(notifier, outcome, plan, str(run_dir.path))
    missed = pending(notifier.close(wait=NOTIFY_WAIT))
    if missed:  # this node may have no route out: the next look from clusterrun's machine sends them
        console.info(f"--notify: {len(missed)} document(s) not delivered from {plan.master.name}; the next "
                     "`clusterrun status`, `logs`, `attach` or `down` sends them from where it runs")
        atomic_write(run_dir.path / NOTIFY_PENDING, json.dumps(missed) + "\n")
    record = final_record(record, run_dir, outcome.interrupted_by)
    write_record(run_dir, record.replace(state=RunState.stopped) if between is not None else record)
    console.info(f"run {plan.run_id} {record.state.value}" + (f": {record.first_failure.describe()}"
                                                              if record.first_failure else ""))
    return 0


def main(args: list[str]) -> int:
    """Read the spec (base64 JSON, one line of stdin) and supervise the run; see the module's docstring."""
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # the session that started it ends; only `down` and SIGTERM stop it
    try:
        spec = json.loads(base64.b64decode(sys.stdin.buffer.readline().strip(), validate=True).decode())
    except ValueError as exc:
        _say({"ev": protocol.ERROR, "text": f"clusterrun supervisor: a spec that is not base64 JSON ({exc})"})
        return 2
    try:
        return serve(spec)
    except OSError as exc:
        _say({"ev": protocol.ERROR, "text": f"clusterrun supervisor: {exc.strerror or exc}"})
        return 1
