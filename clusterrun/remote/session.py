"""The node agent's first phase (``agent.py prepare``): everything before the job, in the one program per node.

A launch starts the agent once on each node. Before the job it answers commands on stdin, one line each,
with one event each (see protocol.py), and then becomes the job's agent on ``go``:

* ``check <spec>``: the ready check (ready.py; its spec is ``protocol.CHECK``): python, torch, run directory,
  master port, staged files, the node's NICs and GPUs; answered by ``ready`` (report, time), or ``error`` (text)
  when the spec does not fit. With ``warm`` in its spec, the job's torchrun starts first, importing torch
  until ``go`` hands it the job (warm.py).
* ``probe-listen <json>``: hold the master port (``port``) open and accept connections on it until ``go``
  or the end; answered by ``listening`` (port, or error).
* ``probe-reach <json>``: one TCP connect to ``address``:``port`` from ``source`` (null: any) within
  ``timeout`` seconds, and a ping of ``address`` when it fails (a blocked port or a dead path);
  answered by ``reached`` (tcp: null or why not, ping: ok, failed, missing or null).
* ``probe-ping <json>``: one ping to each of ``addresses`` at once; answered by ``pinged`` (results:
  {address: ok or failed}, or missing: true without a ping command).
* ``go <spec>``: the run's spec (``protocol.RUN``, base64 JSON, as ``agent.py run`` reads it); the listener closes (the
  port is torchrun's now) and the job starts.
* ``relay <json>``: a detached run: connect to its supervisor on rank 0's node (relay.py) and take every later
  command from that connection and send every later event to it; answered by ``relayed`` (here, before the
  move; with ``error`` when the supervisor cannot be reached or proven). The end of stdin is no longer the end.
* ``ping``: answered by ``pong``.

The end of stdin (clusterrun went away), ``stop``, or no command for ``idle`` seconds (from the check's
spec) ends the program without starting anything. Standard library only, like the rest of the agent.
"""

import io
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

if __package__:
    from clusterrun.remote import procs, protocol, ready, relay, warm, wire
else:
    import procs
    import protocol
    import ready
    import relay
    import warm
    import wire

CHECK, GO, STOP = "check", "go", "stop"
LISTEN, REACH, PING = "probe-listen", "probe-reach", "probe-ping"
# Events (node -> clusterrun) of this phase.
READY, LISTENING, REACHED, PINGED = "ready", "listening", "reached", "pinged"
DEFAULT_IDLE = 900.0
_MAX_WAIT = 30.0  # a probe's own timeout is capped here: nothing in this phase waits longer


def _lines(stdin, out: "queue.Queue", source: int = 0) -> None:
    """Read command lines until ``go`` (whose line is the last this thread takes: the job's agent reads the rest
    from the same buffer) or the end of stdin. Each line goes out as ``(source, line)``."""
    while True:
        try:
            line = stdin.readline()
        except (OSError, ValueError):
            line = b""
        out.put((source, line))
        if not line or line.split(b" ", 1)[0].strip() == GO.encode():
            return


def _relay(arg: str, lines: "queue.Queue", source: int) -> bool:
    """Move this agent's stream to the run's supervisor (``relay`` command): True once it is there."""
    try:
        args = json.loads(arg)
        sock = relay.connect(str(args["address"]), int(args["port"]), str(args["secret"]), str(args["run_id"]),
                             str(args["node"]), min(float(args.get("timeout", relay.HANDSHAKE_TIMEOUT)), _MAX_WAIT))
    except (ValueError, KeyError, TypeError, OSError, relay.HandshakeError) as exc:
        wire.emit({"ev": protocol.ERROR, "text": "clusterrun agent: cannot reach the run's supervisor: %s"
                   % (getattr(exc, "strerror", None) or exc)})
        return False
    wire.emit({"ev": relay.RELAYED})
    # The session that started this agent may end from now on: its hang-up and its end of stdin change nothing.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    reader = sock.makefile("rb")
    wire.OUT_FD = sock.fileno()
    wire.keep(sock)
    sys.stdin = io.TextIOWrapper(reader, encoding="utf-8", errors="replace")  # the job's agent reads its commands here
    threading.Thread(target=_lines, args=(reader, lines, source), daemon=True, name="relayed-commands").start()
    return True


class Listener:
    """The master port held open while the other nodes try to reach it."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torchrun's store does
        try:
            self.sock.bind(("", port))
            self.sock.listen(256)
        except OSError:
            self.sock.close()
            raise
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="probe-listen")
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        self._closed.set()
        try:  # wakes the accept at once: the port is torchrun's next, and every node's start waits for it
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(timeout=2.0)
        self.sock.close()


def _why(exc: OSError, timeout: float) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out after %gs" % timeout
    return str(exc.strerror or exc)


def ping(addresses: list, timeout: float) -> "dict | None":
    """{address: "ok" | "failed"} for one ping each, all at once; None without a ping command."""
    if shutil.which("ping") is None:
        return None
    wait = str(max(1, int(timeout)))
    procs = []
    for address in addresses:
        try:
            procs.append((address, subprocess.Popen(["ping", "-n", "-c", "1", "-W", wait, address],
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        except OSError:
            procs.append((address, None))
    results = {}
    deadline = time.monotonic() + timeout + 5
    for address, proc in procs:
        if proc is None:
            results[address] = "failed"
            continue
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = 1
        results[address] = "ok" if code == 0 else "failed"
    return results


def reach(address: str, port: int, source, timeout: float) -> dict:
    """A TCP connect to address:port (from ``source``); on failure, whether the address answers ping."""
    try:
        socket.create_connection((address, port), timeout=timeout,
                                 source_address=(source, 0) if source else None).close()
        return {"tcp": None, "ping": None}
    except OSError as exc:
        why = _why(exc, timeout)
    pinged = ping([address], timeout)
    return {"tcp": why, "ping": "missing" if pinged is None else pinged[address]}


def _warm_up(spec) -> None:
    """Start the job's torchrun now where the check asks for it (warm.py): torch imports while the check runs."""
    if spec["warm"] is None:
        return
    run_dir = os.path.expanduser(spec["run_dir"])
    cwd = os.path.expanduser(spec["warm"]["cwd"] or run_dir)
    try:
        os.makedirs(run_dir, mode=0o700, exist_ok=True)  # the ranks' logs: the user's only
        if cwd.startswith(run_dir.rstrip("/") + "/"):
            os.makedirs(cwd, exist_ok=True)  # the run's copy of the script (staged at go) goes there
    except OSError:
        return  # the check says why
    python = spec["warm"]["python"]
    python = os.path.expanduser(python) if python.startswith("~/") else python
    warm.start(python, procs.job_environ(spec["warm"]["env"], spec["run_id"], spec["node"]), cwd)


def serve(stdin, start_run) -> int:
    """Answer commands until ``go`` (then ``start_run(spec_line)`` runs the job and its code is returned) or the
    end. A check spec that does not fit ``protocol.CHECK`` is answered by an ``error`` event."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(stdin, lines), daemon=True, name="commands").start()
    idle = DEFAULT_IDLE
    listener = None
    source = 0  # where commands come from: stdin (0), then the supervisor's connection (1) after ``relay``
    try:
        while True:
            try:
                came, raw = lines.get(timeout=idle)
            except queue.Empty:
                return 3  # clusterrun said nothing for too long: nothing was started here
            if came != source:
                continue  # the stream this agent left (after ``relay``): its end is not this agent's end
            if not raw:
                return 0
            word, _, arg = raw.decode("utf-8", errors="replace").strip().partition(" ")
            if word == CHECK:
                running = time.time()  # the agent is up and reading its commands: the launch timeline's stamp
                try:
                    spec = protocol.decode_spec(protocol.CHECK, arg)
                except protocol.SpecError as exc:
                    wire.emit({"ev": protocol.ERROR, "text": "clusterrun agent: %s" % exc})
                    continue
                idle = spec["idle"]
                _warm_up(spec)
                wire.emit({"ev": READY, "report": ready.check(spec), "time": running})
            elif word == LISTEN:
                args = json.loads(arg)
                if listener is not None:
                    listener.close()
                    listener = None
                try:
                    listener = Listener(int(args["port"]))
                    wire.emit({"ev": LISTENING, "port": listener.port})
                except OSError as exc:
                    wire.emit({"ev": LISTENING, "error": str(exc.strerror or exc)})
            elif word == REACH:
                args = json.loads(arg)
                timeout = min(float(args.get("timeout", 3.0)), _MAX_WAIT)
                wire.emit({"ev": REACHED, **reach(args["address"], int(args["port"]), args.get("source"), timeout)})
            elif word == PING:
                args = json.loads(arg)
                results = ping(list(args["addresses"]), min(float(args.get("timeout", 3.0)), _MAX_WAIT))
                wire.emit({"ev": PINGED, "results": results or {}, "missing": results is None})
            elif word == protocol.PING:
                wire.emit({"ev": protocol.PONG})
            elif word == relay.RELAY and source == 0:
                if _relay(arg, lines, 1):
                    source = 1
            elif word == GO:
                if listener is not None:
                    listener.close()  # the master port is torchrun's from here on
                    listener = None
                return start_run(arg)
            elif word == STOP:
                return 0
            else:
                wire.emit({"ev": protocol.LAUNCHER, "text": "clusterrun agent: unknown command %r" % word[:40]})
    finally:
        if listener is not None:
            listener.close()
        warm.drop()  # a launch that ended before go: its torchrun goes
