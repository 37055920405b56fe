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
import time
from pathlib import Path
from typing import Any

from clusterrun.detached.links import Listener
from clusterrun.launch.console import Console
from clusterrun.launch.outcome import notify_end, notify_start
from clusterrun.launch.phase import STOP_SIGNAL
from clusterrun.launch.settings import SupervisorSettings
from clusterrun.launch.supervisor import Supervisor
from clusterrun.notify import Notifier, pending
from clusterrun.planfile import LaunchPlan
from clusterrun.remote import protocol
from clusterrun.runs.dirs import RunDir, atomic_write
from clusterrun.runs.record import RunRecord, RunState, write_record

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
        record = record.replace(stopped_by=by or "SIGTERM to the run's supervisor", interrupted_by="SIGTERM")
        if record.first_failure is None:
            record = record.replace(state=RunState.stopped, exit_code=128 + signal.SIGTERM)
    return record


def serve(spec: dict[str, Any]) -> int:
    plan = LaunchPlan.from_dict(spec["plan"])
    run_dir = RunDir(Path(os.path.expanduser(spec["record_dir"])))
    run_dir.path.mkdir(parents=True, exist_ok=True, mode=0o700)
    run_dir.write_json("plan.json", plan.to_dict())  # as here, with secrets redacted
    (run_dir.path / PID_FILE).write_text(f"{os.getpid()}\n", encoding="utf-8")
    listener = Listener(plan.run_id, spec["secret"], [n.name for n in plan.nodes])
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
    console = Console(out=console_file, err=console_file, color=False)
    settings = SupervisorSettings(**spec["settings"])
    supervisor = Supervisor(plan, links, run_dir, console, settings, stage=spec.get("stage") or {},
                            notifier=Notifier(spec.get("notify") or ()))
    supervisor.signals = (signal.SIGTERM, STOP_SIGNAL)
    started = float(spec.get("started") or time.time())
    write_record(run_dir, RunRecord(plan.run_id, RunState.running, started=started, detached=True))

    def going() -> None:
        _say({"ev": GOING, "time": time.time()})
        _leave_session(run_dir.path / HOST_LOG)
        if supervisor.notifier is not None:
            notify_start(supervisor.notifier, plan, str(run_dir.path))

    supervisor.after_start = going
    outcome = supervisor.run()
    outcome.started = started
    # The documents first: what could not go out is in the record's directory before the record says the run
    # ended (a look that sees the end sees them too).
    if supervisor.notifier is not None:
        notify_end(supervisor.notifier, outcome, plan, str(run_dir.path))
        missed = pending(supervisor.notifier.close(wait=NOTIFY_WAIT))
        if missed:  # this node may have no route out: the next look from clusterrun's machine sends them
            console.info(f"--notify: {len(missed)} document(s) not delivered from {plan.master.name}; the next "
                         "`clusterrun status`, `logs`, `attach` or `down` sends them from where it runs")
            atomic_write(run_dir.path / NOTIFY_PENDING, json.dumps(missed) + "\n")
    write_record(run_dir, final_record(outcome.record(), run_dir, outcome.interrupted_by))
    console.info(f"run {plan.run_id} {outcome.state.value}" + (f": {outcome.first_failure.describe()}"
                                                               if outcome.first_failure else ""))
    console_file.close()
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
