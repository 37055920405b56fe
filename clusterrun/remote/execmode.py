"""The node agent's ``exec`` mode (``clusterrun exec``): one shell command, its output relayed as ``line`` events.

Its spec is ``protocol.EXEC``, filled before it gets here: every key is present.

Standard library only: this module travels to the nodes with the agent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

if __package__:
    from clusterrun.remote import procs, protocol, wire
else:
    import procs
    import protocol
    import wire

GRACE = 2.0  # seconds between SIGTERM and SIGKILL when the command is stopped


def exec_command(spec: dict) -> int:
    """Run ``spec["command"]`` with ``sh -c`` in its own session; relay its output as ``line`` events.

    It stops (SIGTERM to its process group, SIGKILL GRACE seconds later) when clusterrun goes away (end of
    input) or after ``spec["timeout"]`` seconds; the final ``exit`` event carries the exit status.
    """
    procs.prctl(procs.PR_SET_CHILD_SUBREAPER, 1)
    try:
        proc = subprocess.Popen(["sh", "-c", spec["command"]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=lambda: procs.prctl(procs.PR_SET_PDEATHSIG, signal.SIGTERM))
    except OSError as exc:
        wire.emit({"ev": protocol.EXIT, "rc": 127, "error": str(exc)})
        return 0
    why = []
    me = os.getpid()

    def stop(reason: str) -> None:
        if not why:
            why.append(reason)
            threading.Thread(target=procs.stop_processes, args=(lambda: procs.descendants(me), GRACE),
                             daemon=True).start()

    def relay(pipe, stream: str) -> None:
        for raw in iter(pipe.readline, b""):
            wire.emit({"ev": protocol.LINE, "stream": stream,
                       "text": raw.decode("utf-8", errors="replace").rstrip("\r\n")})
        pipe.close()

    def watch_stdin() -> None:
        while sys.stdin.buffer.readline():
            pass
        stop("the connection to clusterrun closed")

    readers = [threading.Thread(target=relay, args=(proc.stdout, "stdout"), daemon=True),
               threading.Thread(target=relay, args=(proc.stderr, "stderr"), daemon=True)]
    for t in readers:
        t.start()
    threading.Thread(target=watch_stdin, daemon=True).start()
    timeout = spec["timeout"]
    if timeout > 0:
        timer = threading.Timer(timeout, stop, args=(f"timed out after {timeout:g}s",))
        timer.daemon = True
        timer.start()
    status = procs.wait_for(proc.pid)
    proc.returncode = status
    for t in readers:
        t.join(timeout=2.0)
    rc = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    procs.stop_processes(lambda: procs.descendants(me), 0.5)  # anything the command left in the background
    wire.emit({"ev": protocol.EXIT, "rc": rc, "reason": why[0] if why else None})
    return 0
