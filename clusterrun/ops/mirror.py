"""This machine's ``runs/<id>/`` of a detached run: a mirror of the record its supervisor keeps on rank 0's node.

While a detached run lives, its supervisor (clusterrun/detached/host.py) alone writes its record. Whatever here
looks at the run (``status``, ``logs``, ``attach``, ``down``, ``report``, ``runs``) first calls :func:`refresh`, which
reads the record through the node agent's ``mirror`` mode and writes it here as the supervisor has it: status.json
whole, every log (rank logs, launcher logs, the console) past what is here already. ``down`` asks the supervisor to
stop through the same call.

When the supervisor is gone and its record does not say how the run ended (SIGKILL, its node lost), the end is
judged from what the nodes themselves report (:func:`clusterrun.ops.logs.record_detached_end`), and the record says
so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from clusterrun.agents.link import run_mode
from clusterrun.agents.spec import mirror_spec
from clusterrun.detached.host import marker_node
from clusterrun.detached.start import SUPERVISOR_FILE, ClusterSupervisor
from clusterrun.errors import ClusterrunError, reason_of
from clusterrun.ops.down import run_inventory
from clusterrun.remote import mirror, protocol
from clusterrun.runs import RunDir, RunState, atomic_write, read_record
from clusterrun.transport.base import Transport
from clusterrun.transport.factory import transport_for

MIRROR_TIMEOUT = 60.0
#: Seconds between two looks at a running detached run (`attach`, `logs -f`, `down` waiting for the stop).
LOOK_EVERY = 1.0
#: Record files that stay as this machine has them (the stop request: the supervisor's own). The plan is the
#: supervisor's: a restart without a lost node (``--min-nodes``) runs on fewer nodes than this machine planned.
KEPT = ("inventory.json", mirror.STOP_REQUEST, "notify-sent.json")
#: The states a mirror has nothing more to learn in.
OVER = (RunState.succeeded, RunState.failed, RunState.stopped, RunState.interrupted, RunState.not_started)


@dataclass
class Mirrored:
    """What one look at the supervisor found."""

    alive: bool | None  # the supervisor still runs; None: its node could not be asked
    problem: str | None = None
    asked: bool = False  # the stop request reached it


def supervisor_of(run: RunDir) -> ClusterSupervisor | None:
    """Where the run's supervisor is, for a run detached to one (None for any other run)."""
    try:
        return ClusterSupervisor.from_dict(run.read_json(SUPERVISOR_FILE))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _have(run: RunDir) -> dict[str, list[int | str] | str]:
    """What this machine has of the record: the bytes of each log file, the digest of each other file (the series:
    sent again only when they changed)."""
    out: dict[str, list[int | str] | str] = {}
    for path in run.path.rglob("*"):
        rel = path.relative_to(run.path).as_posix()
        if not path.is_file() or rel in KEPT or rel == "status.json":
            continue
        if rel.endswith(".log"):
            with open(path, "rb") as fh:
                out[rel] = [path.stat().st_size, mirror.digest(fh.read(mirror.HEAD))]
        else:
            out[rel] = mirror.digest(path.read_bytes())
    return out


def _keep_timeline(run: RunDir, text: bytes) -> str:
    """The supervisor's status.json, with the launch's phases before ``go`` (this machine's) kept in each node."""
    try:
        theirs = json.loads(text)
        ours = json.loads((run.path / "status.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return text.decode("utf-8", errors="replace")
    for name, node in (theirs.get("nodes") or {}).items():
        before = ((ours.get("nodes") or {}).get(name) or {}).get("timeline") or {}
        if before:
            node["timeline"] = {**before, **(node.get("timeline") or {})}
    return json.dumps(theirs, indent=2) + "\n"


def _write(run: RunDir, rel: str, offset: int, whole: bool, data: bytes) -> bool:
    """One file of the record into runs/ (False: not a path of the record)."""
    path = (run.path / rel).resolve()
    if run.path.resolve() not in path.parents or rel in KEPT:
        return False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if rel == "status.json":
        atomic_write(path, _keep_timeline(run, data))
    elif whole:
        atomic_write(path, data.decode("utf-8", errors="replace"))
    else:
        with open(path, "ab") as fh:
            if fh.tell() != offset:  # never a hole or a line twice: this machine's copy is cut to what was asked
                fh.truncate(offset)
                fh.seek(offset)
            fh.write(data)
    return True


def refresh(run: RunDir, *, stop: str | None = None, transport: Transport | None = None) -> Mirrored:
    """Mirror the record of ``run`` from its supervisor's node (``stop``: first ask the supervisor to stop, saying
    who asks). Raises nothing: a node that cannot be asked is :attr:`Mirrored.problem`."""
    host = supervisor_of(run)
    if host is None:
        return Mirrored(None, "this run has no supervisor on its nodes (it was not detached, or by an older clusterrun)")
    own = transport is None
    try:
        inv = run_inventory(run)
        node = run.read_plan().node(host.node)
        transport = transport or transport_for(inv, inv.node(host.node))
        frames, result = run_mode(transport, node.python, protocol.MIRROR,
                                  mirror_spec(run.run_id, marker_node(host.node), host.record_dir, _have(run), stop),
                                  timeout=MIRROR_TIMEOUT)
    except (ClusterrunError, StopIteration) as exc:
        return Mirrored(None, f"{host.node}: cannot read the run's record there: {reason_of(exc)}")
    finally:
        if own and transport is not None:
            transport.close()
    out = Mirrored(None)
    for frame in frames:
        event = frame.event
        if event.ev == mirror.FILE:
            _write(run, event.path, event.offset, event.whole, frame.payload)
        elif event.ev == mirror.SUPERVISOR:
            out.alive, out.asked = event.alive, event.asked
        elif event.ev == protocol.ERROR:
            out.problem = f"{host.node}: {event.text}"
    if out.alive is None and out.problem is None:
        out.problem = f"{host.node}: no answer from the node agent (exit {result.exit_code}): {result.tail(3)}"
    return out


def over(run: RunDir) -> bool:
    """The mirrored record says how the run ended."""
    return read_record(run).state in OVER


def settle(run: RunDir, host: ClusterSupervisor) -> str:
    """The supervisor is gone and its record does not say how the run ended: judge the end from what the nodes
    report, once nothing of the run runs on any of them. Returns what was done, in words."""
    from clusterrun.ops.logs import fetch, record_detached_end

    results = fetch(run, {})
    problems = {name: r.problem for name, r in results.items() if r.problem}
    if problems:
        return ("the run's supervisor on {} is gone and these nodes could not be asked how the run ended: {}; "
                "`clusterrun down {}` stops what is left".format(host.node, "; ".join(
                    f"{n}: {why}" for n, why in sorted(problems.items())), run.run_id))
    running = sorted(name for name, r in results.items() if r.alive)
    if running:
        return (f"the run's supervisor on {host.node} is gone; {', '.join(running)} still run(s) the job, whose "
                "agents stop it when they stop hearing the supervisor (15 s); `clusterrun down "
                f"{run.run_id}` stops it now")
    record_detached_end(run, results, note=f"the run's supervisor on {host.node} ended before it recorded the run's "
                                           "end (killed, or its node lost): the end is judged from what the nodes "
                                           "reported")
    return f"the run's supervisor on {host.node} is gone: its end was judged from what the nodes reported"


#: What this machine did with the supervisor's undelivered notifications (one entry each, in order).
NOTIFY_SENT = "notify-sent.json"


def send_pending(run: RunDir) -> list[str]:
    """Send from here the notifications the supervisor could not deliver (its node has no route out, say), each
    once; what happened to each, in words. What was tried is kept in ``notify-sent.json``."""
    from clusterrun.detached.host import NOTIFY_PENDING
    from clusterrun.notify import send_now

    try:
        missed = json.loads((run.path / NOTIFY_PENDING).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    try:
        done = json.loads((run.path / NOTIFY_SENT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        done = []
    said = []
    for item in missed[len(done):]:
        why = send_now(str(item["url"]), str(item["body"]).encode())
        done.append({"event": item.get("event"), "sent": why is None, "error": why})
        said.append(f"--notify: the {item.get('event')!r} document the run's supervisor could not deliver "
                    f"({item.get('error')}) " + ("was sent from here" if why is None else f"failed from here too: {why}"))
    atomic_write(run.path / NOTIFY_SENT, json.dumps(done) + "\n")
    return said
