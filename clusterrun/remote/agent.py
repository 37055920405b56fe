"""The small program clusterrun runs on each node (standard library only, Python >= 3.8): one entry, six modes.

=========== =================================================================================================
``prepare`` how a launch starts it: the checks before the job come first, as commands on stdin (session.py),
            then ``go`` with the run's spec, and the job runs as in ``run``
``run``     one node's torchrun from its start to its end, its rank logs relayed as events (job.py)
``exec``    one shell command, its output relayed as ``line`` events (execmode.py)
``collect`` after a broken stream: stop what is left of a run, send the log lines clusterrun lacks (collect.py)
``sweep``   stop every process of a run on this node (its environment carries ``CLUSTERRUN_RUN_ID``)
``ps``      list them; without a run id, every run on the node (its processes, every user's leases)
``mirror``  a detached run's record, from its supervisor's directory on this node (mirror.py)
=========== =================================================================================================

Every mode but ``prepare`` reads its spec as the first line of stdin (base64 JSON, see protocol.py), never
from the command line, and answers only in protocol events. A spec that does not fit its mode is refused with
an ``error`` event and exit code 2.
"""

from __future__ import annotations

import os
import signal
import sys

if __package__:  # imported as part of clusterrun (by clusterrun itself, by tests)
    from clusterrun.remote import collect, containers, execmode, job, leases, mirror, procs, protocol, session, wire
else:  # run on a node: as a file beside its modules, or sent inline with them (see clusterrun.remote.argv)
    import collect
    import containers
    import execmode
    import job
    import leases
    import mirror
    import procs
    import protocol
    import session
    import wire

USAGE = "usage: agent.py prepare | run | exec | collect | sweep | ps | mirror (each but prepare: its spec, base64 JSON, " \
        "as the first line of stdin)\n"


def sweep(spec: dict) -> int:
    """Stop every process of the run on this node (SIGTERM, SIGKILL after the grace period): ``swept`` (pids)."""
    exclude = {os.getpid(), os.getppid()}
    pids = procs.stop_processes(lambda: procs.marked(spec["run_id"], exclude, spec["node"]), spec["grace"])
    container = spec["container"]
    # A container's processes were stopped above (they carry the run's marker too); its record goes by label.
    extra = {"containers": containers.remove(container["runtime"], container["labels"])} if container else {}
    wire.emit({"ev": protocol.SWEPT, "pids": pids, **extra})
    return 0


def ps(spec: dict) -> int:
    """The processes of the run on this node: ``alive`` (pids, and the run's containers here). Without a run id,
    every run here: ``alive`` with ``runs`` (this user's runs by their processes, see procs.runs) and ``leases``
    (every user's, by their GPU and master-port leases: {"gpus": {index: holder}, "ports": {port: holder}})."""
    exclude = {os.getpid(), os.getppid()}
    if not spec["run_id"]:
        wire.emit({"ev": protocol.ALIVE, "pids": [], "runs": procs.runs(exclude),
                   "leases": {"gpus": leases.held(leases.GPU), "ports": leases.held(leases.PORT)}})
        return 0
    container = spec["container"]
    extra = {"containers": containers.listed(container["runtime"], container["labels"])} if container else {}
    wire.emit({"ev": protocol.ALIVE, "pids": procs.marked(spec["run_id"], exclude, spec["node"]), **extra})
    return 0


#: mode -> (its spec, what runs it).
MODES = {
    "run": (protocol.RUN, job.start_run),
    "exec": (protocol.EXEC, execmode.exec_command),
    "collect": (protocol.COLLECT, collect.collect),
    "sweep": (protocol.SWEEP, sweep),
    "ps": (protocol.PS, ps),
    "mirror": (protocol.MIRROR, mirror.mirror),
}


def refuse(kind: protocol.Spec, why: str) -> int:
    """Say why a spec was refused, as events; a run also ends with an ``exit`` carrying that reason."""
    text = f"clusterrun agent: {why}"
    wire.emit({"ev": protocol.ERROR, "text": text})
    if kind is protocol.RUN:
        wire.emit({"ev": protocol.EXIT, "rc": 2, "signal": None, "ranks": {}, "reason": text, "logs": {},
                   "watch": None})
    return 2


def start(kind: protocol.Spec, raw: bytes | str) -> int:
    """Run mode ``kind`` with the spec of line ``raw``, or refuse it."""
    try:
        spec = protocol.decode_spec(kind, raw)
    except protocol.SpecError as exc:
        return refuse(kind, str(exc))
    return MODES[kind.mode][1](spec)


def main(argv: list) -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a broken stream must not kill the agent
    if argv == ["prepare"]:
        # A launch's one program per node: the checks before the job, then the job (see session.py).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return session.serve(sys.stdin.buffer, lambda raw: start(protocol.RUN, raw))
    if len(argv) == 1 and argv[0] in MODES:
        return start(MODES[argv[0]][0], sys.stdin.buffer.readline())
    sys.stderr.write(USAGE)
    return 2


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    # Daemon threads may still block on stdin; skip interpreter finalisation, which would wait on them.
    os._exit(code)
