"""The node agent's ``mirror`` mode: a detached run's record, as its supervisor on this node keeps it.

The supervisor of a detached run (clusterrun/detached/host.py) alone writes the run's record in its directory on
rank 0's node. ``clusterrun status``, ``logs``, ``attach``, ``down`` and ``report`` read it through this mode and keep
a copy in this machine's ``runs/<id>/``:

* each log file (``*.log``: rank logs, launcher logs, the console) past the bytes the caller already has
  (``have``: its size and the :func:`digest` of its first :data:`HEAD` bytes; another start is another file,
  sent from its start), at most ``max_bytes`` per file a call, cut at a line's end unless the run is over;
* every other file whole (status.json, the series and the like, which the supervisor rewrites), unless the caller
  has it as it is (``have``: :func:`digest` of its copy);
* with ``stop`` set, first the request to stop (who asks, in stop-request.json) and the supervisor's
  STOP_SIGNAL, sent only to the process that carries the run's supervisor markers.

It answers with one ``file`` event per file (its path under the record, ``offset``, ``whole``; the bytes as
payload), then ``supervisor`` (``alive``: the supervisor still runs; ``pid``; ``asked``: the stop went to it).

Standard library only: this module travels to the nodes with the agent.
"""

import hashlib
import json
import os
import signal

if __package__:
    from clusterrun.remote import procs, protocol, wire
else:
    import procs
    import protocol
    import wire

FILE, SUPERVISOR = "file", "supervisor"
PID_FILE, STOP_REQUEST = "supervisor.pid", "stop-request.json"
STOP_SIGNAL = signal.SIGUSR1  # the supervisor's stop request (clusterrun.launch.phase.STOP_SIGNAL)
MAX_FILES = 4096  # a record holds a few files per node; more is not a record
HEAD = 4096  # the bytes of a log file's start that say it is the same file as the caller's


def _supervisor_pid(folder: str, run_id: str, node: str):
    """The supervisor's pid when it still runs: read from its pid file, and checked against the run's markers (a
    pid taken again by another process is not the supervisor)."""
    try:
        with open(os.path.join(folder, PID_FILE)) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return pid if pid in procs.marked(run_id, set(), node) else None


def _files(folder: str) -> list:
    """The record's files, status.json first: what it says was written after every line the others hold then, so a
    caller that sees the run's end in it has all of its output from the same call."""
    out = ["status.json"] if os.path.isfile(os.path.join(folder, "status.json")) else []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if name == PID_FILE or rel == "status.json" or not os.path.isfile(path):
                continue
            out.append(rel)
            if len(out) >= MAX_FILES:
                return out
    return out


def digest(data: bytes) -> str:
    """What the caller has of a whole file, as it says it in ``have`` (the file is sent only when it differs)."""
    return hashlib.sha1(data).hexdigest()


def _same_start(f, have) -> int:
    """The bytes the caller has of a log file, as ``[size, digest of its first HEAD bytes]``: 0 when the file here
    begins otherwise (a restart put a new attempt's log in its place), so that it is sent again from its start."""
    if not isinstance(have, list) or len(have) != 2 or not isinstance(have[0], int):
        return 0
    start = f.read(min(have[0], HEAD))
    return have[0] if digest(start) == have[1] else 0


def _send(folder: str, rel: str, have, max_bytes: int, partial: bool) -> None:
    path = os.path.join(folder, rel)
    whole = not rel.endswith(".log")
    try:
        with open(path, "rb") as f:
            if whole:
                data, offset = f.read(), 0
                if have == digest(data):
                    return  # the caller has it as it is
            else:
                size = os.fstat(f.fileno()).st_size
                have = _same_start(f, have)
                f.seek(0)
                if size <= have:
                    return
                offset = have
                f.seek(offset)
                data = f.read(min(max_bytes, size - offset))
                if not partial and offset + len(data) >= size and not data.endswith(b"\n"):
                    data = data[:data.rfind(b"\n") + 1]  # a line being written: it comes whole next time
    except OSError:
        return
    if data or whole:
        wire.emit({"ev": FILE, "path": rel, "offset": offset, "whole": whole}, data)


def mirror(spec: dict) -> int:
    folder = os.path.expanduser(spec["dir"])
    marker = spec["node"]
    if not os.path.isdir(folder):
        wire.emit({"ev": protocol.ERROR, "text": "no record of run %s on this node (%s)" % (spec["run_id"], folder)})
        return 1
    pid = _supervisor_pid(folder, spec["run_id"], marker)
    asked = False
    if spec["stop"] and pid is not None:
        try:
            with open(os.path.join(folder, STOP_REQUEST), "w") as f:
                json.dump({"by": spec["stop"]}, f)
            os.kill(pid, STOP_SIGNAL)
            asked = True
        except OSError:
            pass
    for rel in _files(folder):
        _send(folder, rel, spec["have"].get(rel, 0), spec["max_bytes"], pid is None)
    wire.emit({"ev": SUPERVISOR, "alive": pid is not None, "pid": pid, "asked": asked})
    return 0
