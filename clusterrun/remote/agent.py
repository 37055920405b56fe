"""The small program clusterrun runs on each node (standard library only, Python >= 3.8).

``python agent.py prepare`` is how a launch starts it: the checks before the job come first, as commands on stdin
(see session.py), then ``go`` with the spec. ``python agent.py run SPEC`` starts the node's torchrun in its own session and
then, until every process of it is gone:

* tails every rank's log file (torchrun ``--redirects 3 --log-dir``) and writes each
  complete line to stdout as one JSON event, so lines of different ranks never mix;
* watches stdin: ``ping`` keeps it alive, ``term`` stops the job (SIGTERM, then SIGKILL
  after the grace period), ``kill`` stops it at once; end of input (the ssh channel or
  the orchestrator is gone) or no ``ping`` within the heartbeat timeout stops it too;
* on exit, reports torchrun's exit code and each failed rank's code (from torchrun's
  failure summary) as a final ``exit`` event and in ``exit.json`` in the run directory.

It is a child subreaper, so workers that torchrun started in their sessions stay its
descendants even if torchrun dies, and every process carries ``CLUSTERRUN_RUN_ID`` in
its environment: ``python agent.py sweep RUN_ID`` finds and stops anything of a
run that is left, and ``ps RUN_ID`` lists it. ``collect SPEC`` does the sweep and then sends
the rank log lines clusterrun did not receive (after a broken stream).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time

if __package__:  # imported as part of clusterrun (by clusterrun itself, by tests)
    from clusterrun.remote import flight, pathwatch, protocol, session, stacks, tailing, wire
else:  # run on a node: as a file beside its modules, or sent inline with them (see clusterrun.remote.argv)
    import flight
    import pathwatch
    import protocol
    import session
    import stacks
    import tailing
    import wire

RUN_ID_VAR = "CLUSTERRUN_RUN_ID"
NODE_VAR = "CLUSTERRUN_NODE"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# ---------------------------------------------------------------- processes


def _proc_ppids() -> dict:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # the command name may contain spaces and parentheses: split after the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1:
            out[int(name)] = int(fields[1])
    return out


def _children(pid: int):
    """``pid``'s children from /proc/<pid>/task/*/children; None where the kernel does not offer that file."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone
    out = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None  # a kernel without the file
        except (OSError, ValueError):
            continue
    return out


def descendants(root: int) -> list:
    """Every process under ``root``. Walks the tree from ``root`` down where the kernel lists each process's
    children (read every few seconds for the CPU reports: reading every process's stat on a busy machine costs
    milliseconds each time); else from every process's parent."""
    found, todo = [], [root]
    while todo and len(found) < 100000:
        kids = _children(todo.pop())
        if kids is None:
            return _descendants_by_scan(root)
        found.extend(kids)
        todo.extend(kids)
    return found


def _descendants_by_scan(root: int) -> list:
    ppids = _proc_ppids()
    children: dict = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def marked(run_id: str, exclude: set, node: str = "") -> list:
    """Processes of our user whose environment carries this run's marker (and this node's, when given:
    two inventory nodes may be one machine)."""
    needle = f"{RUN_ID_VAR}={run_id}".encode()
    node_needle = f"{NODE_VAR}={node}".encode()
    uid = os.getuid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        items = env.split(b"\0")
        if needle in items and (not node or node_needle in items):
            found.append(int(name))
    return found


def _signal_all(pids: list, sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"  # a zombie is already dead


def stop_processes(find, grace: float) -> list:
    """SIGTERM what ``find()`` returns, SIGKILL what is left after ``grace`` seconds. Returns the pids signalled."""
    pids = find()
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = pids
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        _reap()
        left = [p for p in find() if _alive(p)]
    if left:
        _signal_all(left, signal.SIGKILL)
        end = time.monotonic() + 2.0
        while time.monotonic() < end and any(_alive(p) for p in left):
            time.sleep(0.02)
            _reap()
    return sorted(set(pids) | set(left))


def wait_for(pid: int) -> int:
    """Reap children (this process is a subreaper: orphans come here too) until ``pid`` ends; its wait status."""
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if got == pid:
            return status


def _reap() -> None:
    """Collect exited children (we are a subreaper: orphans of the job become ours)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# ---------------------------------------------------------------- log tailing


# ---------------------------------------------------------------- torchrun's summary

_WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: \d+\)")
_FAIL_FIELD = re.compile(r"^\s*(time|rank|exitcode)\s*:\s*(.*?)\s*$")


def parse_failures(lines: list) -> dict:
    """Global rank -> {"rc", "time"} from torchrun's ``ChildFailedError`` summary."""
    out: dict = {}
    current: dict = {}
    in_root = False
    for line in lines:
        if "Root Cause" in line:
            in_root = True  # torchrun lists the first observed failure under this heading
        m = _FAIL_FIELD.match(line)
        if not m:
            continue
        key, value = m.group(1), m.group(2)
        if key == "time":
            current = {"time": value}
        elif key == "rank":
            rm = re.match(r"(\d+)", value)
            if rm:
                current["rank"] = int(rm.group(1))
        elif key == "exitcode" and "rank" in current:
            em = re.match(r"(-?\d+)", value)
            if em:
                code = int(em.group(1))
                sig = -code if code < 0 else None
                out[current["rank"]] = {"rc": 128 + sig if sig else code, "signal": sig,
                                        "time": current.get("time"), "root_cause": in_root}
            current = {}
    return out


# ---------------------------------------------------------------- the run


class Agent:
    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.run_id = spec["run_id"]
        self.node = str(spec.get("node", ""))
        self.grace = float(spec.get("grace", 2.0))
        self.heartbeat_timeout = float(spec.get("heartbeat_timeout", 0) or 0)
        self.detached = bool(spec.get("detached"))
        self.run_dir = os.path.expanduser(spec["run_dir"])
        self.launcher_lines: list = []
        self.stop_reason = None
        self.stopping = threading.Event()
        self.last_ping = time.monotonic()
        self.watch = None  # the data-path watch (pathwatch.PathWatch), when clusterrun asked for one
        self.flight = False  # torch's flight recorder is on in the workers

    def _argv(self) -> list:
        # A leading '~/' in clusterrun's part (python, torchrun's flags, the script's path) means the node user's
        # home, as a shell would expand it; the script's own arguments are passed exactly as typed.
        argv = list(self.spec["argv"])
        own = len(argv) - int(self.spec.get("script_args", 0))
        return [os.path.expanduser(a) if i < own and a.startswith("~/") else a for i, a in enumerate(argv)]

    def stop(self, reason: str, grace: float) -> None:
        if self.stopping.is_set() and grace > 0:
            return
        self.stop_reason = self.stop_reason or reason
        self.stopping.set()
        me = os.getpid()
        threading.Thread(target=stop_processes, args=(lambda: descendants(me), grace), daemon=True).start()

    def _watch_stdin(self) -> None:
        while True:
            try:
                line = sys.stdin.buffer.readline()
            except (OSError, ValueError):
                line = b""
            if not line:
                if not self.detached:  # a detached run outlives the connection that started it
                    self.stop("the connection to clusterrun closed", self.grace)
                return
            cmd = line.strip().decode(errors="replace")
            if cmd == protocol.PING:
                self.last_ping = time.monotonic()
                wire.emit({"ev": protocol.PONG})  # lets clusterrun tell a silent node from a quiet one
            elif cmd == protocol.TERM:
                self.stop("stopped by clusterrun", self.grace)
            elif cmd == protocol.KILL:
                self.stop("killed by clusterrun", 0.0)
            elif cmd == protocol.STACKS:
                threading.Thread(target=self._dump_stacks, daemon=True, name="stacks").start()
            elif cmd.startswith(protocol.WATCH + " ") and self.watch is not None:
                try:
                    self.watch.set_targets(json.loads(cmd.split(" ", 1)[1]))
                except (ValueError, KeyError, TypeError) as exc:
                    wire.emit({"ev": protocol.WATCHING, "error": f"bad targets: {exc}"})

    def _report_load(self, every: float) -> None:
        """Every ``every`` seconds, each worker's share of one CPU since the last report (``load`` events)."""
        last = {}
        while not self.stopping.wait(every):
            now = time.monotonic()
            offset = int(self.spec.get("rank_offset", 0))
            cpu = {}
            for local_rank, pid in stacks.workers(descendants(os.getpid())).items():
                used = stacks.cpu_seconds(pid)
                if used is None:
                    continue
                before = last.get(pid)
                last[pid] = (now, used)
                if before is not None and now > before[0]:
                    cpu[str(offset + local_rank)] = round((used - before[1]) / (now - before[0]), 3)
            if cpu:
                wire.emit({"ev": protocol.LOAD, "cpu": cpu, "time": time.time()})

    def _dump_stacks(self) -> None:
        """Every worker's stack, one ``stack`` event each (the dump as payload), then, where the flight recorder
        is on, every worker's recent collectives (``flight`` events), then ``stacks_done``."""
        found = stacks.workers(descendants(os.getpid()))
        offset = int(self.spec.get("rank_offset", 0))
        folder = os.path.join(self.run_dir, "stacks")
        for local_rank, pid in sorted(found.items()):
            how, text = stacks.dump(pid, folder)
            wire.emit({"ev": protocol.STACK, "rank": offset + local_rank, "how": how, "pid": pid},
                 text.encode(errors="replace"))
        if self.flight:
            by_pid = {pid: local_rank for local_rank, pid in found.items()}
            for pid, (data, why) in sorted(flight.request(sorted(by_pid), flight.folder(self.run_dir)).items()):
                wire.emit({"ev": protocol.FLIGHT, "rank": offset + by_pid[pid], "pid": pid, "why": why,
                           "format": "json"}, data or b"")
        wire.emit({"ev": protocol.STACKS_DONE, "count": len(found)})

    def _send_timeout_dumps(self) -> None:
        """What torch's watchdog dumped itself when a collective timed out (``flight`` events, torch's format)."""
        for rank, path in flight.timeout_dumps(flight.folder(self.run_dir)):
            data, why = flight.read_dump(path)
            wire.emit({"ev": protocol.FLIGHT, "rank": rank, "why": why, "format": "timeout", "path": path},
                      data or b"")

    def _start_watch(self) -> None:
        """Bind the data-path watch on this node's data address and tell clusterrun its port."""
        spec = self.spec.get("watch") or {}
        if not spec.get("address") or self.detached:
            return
        nic = spec.get("nic")

        def changed(target, lost: bool) -> None:
            wire.emit({"ev": protocol.PATH, "peer": target.node, "address": target.address, "nic": nic,
                  "state": "lost" if lost else "ok", "since": target.last_answer_wall, "answered": target.answered,
                  "time": time.time()})

        try:
            self.watch = pathwatch.PathWatch(spec["address"], changed, float(spec.get("interval", 1.0)),
                                             float(spec.get("dead_after", 5.0)))
        except OSError as exc:
            wire.emit({"ev": protocol.WATCHING, "error": f"cannot listen on {spec['address']}: {exc.strerror or exc}"})
            return
        self.watch.start()
        wire.emit({"ev": protocol.WATCHING, "port": self.watch.port, "address": spec["address"], "nic": nic})

    def _watch_heartbeat(self) -> None:
        while not self.stopping.wait(0.5):
            silent = time.monotonic() - self.last_ping
            if silent > self.heartbeat_timeout:
                self.stop(f"no word from clusterrun for {silent:.0f}s (watchdog)", self.grace)
                return

    def _read_launcher(self, pipe) -> None:
        for raw in iter(pipe.readline, b""):
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.launcher_lines.append(text)
            del self.launcher_lines[:-400]  # keep the tail: the failure summary is at the end
            wire.emit({"ev": protocol.LAUNCHER, "text": text})
            m = _WORKER_FAILED.search(text)
            if m:
                # torchrun saw a worker fail; say so now, before it finishes stopping the others.
                local_rank = int(m.group(2))
                code = int(m.group(1))
                wire.emit({"ev": protocol.RANK_FAILED, "local_rank": local_rank, "time": time.time(),
                      "rank": int(self.spec.get("rank_offset", 0)) + local_rank,
                      "rc": 128 - code if code < 0 else code, "signal": -code if code < 0 else None})
        pipe.close()

    def run(self) -> int:
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)  # the ranks' logs: the user's only
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        env = dict(os.environ)
        env.update(self.spec.get("env", {}))
        env[RUN_ID_VAR] = self.run_id
        env[NODE_VAR] = self.node
        if (self.spec.get("stacks") or {}).get("hook"):
            try:  # the workers' stack hook, for hang diagnosis without py-spy
                env.update(stacks.hook_env(self.run_dir, self.spec["stacks"]["hook"], env))
                if self.spec["stacks"].get("flight"):
                    env.update(flight.env(self.run_dir, env, flight.torch_version()))
                    self.flight = True
            except OSError as exc:
                wire.emit({"ev": protocol.LAUNCHER, "text": f"clusterrun: no stack hook ({exc}); stacks need py-spy"})
        cwd = os.path.expanduser(self.spec.get("cwd") or self.run_dir)
        for src, dest, *kind in self.spec.get("stage", []):
            # Staged files arrive in the node's content cache; each run gets its own copy.
            dest = os.path.expanduser(dest)
            if kind and kind[0] == "tree":  # a --sync directory, as a tar archive
                os.makedirs(dest, exist_ok=True)
                with tarfile.open(os.path.expanduser(src)) as archive:
                    try:
                        archive.extractall(dest, filter="data")
                    except TypeError:  # Python < 3.12 without the filter backport
                        archive.extractall(dest)
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(os.path.expanduser(src), dest)
        argv = self._argv()
        log_dir = os.path.join(self.run_dir, "torchrun")
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
                # torchrun gets SIGTERM if this agent dies, and then stops its workers.
                preexec_fn=lambda: _prctl(PR_SET_PDEATHSIG, signal.SIGTERM),
            )
        except OSError as exc:
            wire.emit({"ev": protocol.ERROR, "text": f"cannot start {argv[0]}: {exc.strerror or exc}", "time": time.time()})
            return self._finish(127, None, {}, reason=f"could not start: {exc}")
        wire.emit({"ev": protocol.STARTED, "pid": proc.pid, "time": time.time()})
        reader = threading.Thread(target=self._read_launcher, args=(proc.stdout,), daemon=True)
        reader.start()
        tailer = tailing.Tailer(log_dir, int(self.spec.get("rank_offset", 0)))
        tailer.start()
        self._start_watch()
        if float(self.spec.get("load_every") or 0) > 0 and not self.detached:
            threading.Thread(target=self._report_load, args=(float(self.spec["load_every"]),), daemon=True,
                             name="load").start()
        threading.Thread(target=self._watch_stdin, daemon=True).start()
        if self.heartbeat_timeout > 0 and not self.detached:
            threading.Thread(target=self._watch_heartbeat, daemon=True).start()
        status = wait_for(proc.pid)
        proc.returncode = status  # reaped here, not by Popen
        if self.watch is not None:
            self.watch.answer_only()  # the job is over: its paths no longer matter, the others' still do
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            rc, signum = 128 + sig, sig
        else:
            rc, signum = os.WEXITSTATUS(status), None
        # Whatever torchrun left behind (it died, or a worker escaped) goes now.
        me = os.getpid()
        stop_processes(lambda: descendants(me), self.grace)
        stop_processes(lambda: marked(self.run_id, {me}, self.node), 0.5)
        reader.join(timeout=2.0)
        # The end is a handshake: every byte of every rank file goes out before the exit event. The drain is
        # bounded by progress, not by time: it may take long on a slow link, but a stream that stops moving
        # (clusterrun frozen, the link dead) for the heartbeat timeout ends it; the files stay on the node.
        tailer.stop_event.set()
        stall = max(self.heartbeat_timeout, 15.0)
        while not tailer.done.wait(0.5):
            if time.monotonic() - max(tailer.progress, wire.last_progress()) > stall:
                break
        if self.flight:
            self._send_timeout_dumps()
        ranks = parse_failures(self.launcher_lines)
        for rank, started in tailer.started_at.items():
            # torchrun's 0 says every rank ended well, unless the job was stopped (then torchrun's code says little).
            ranks.setdefault(rank, {"rc": 0 if rc == 0 and self.stop_reason is None else None, "signal": None,
                                    "time": None})
            ranks[rank]["started"] = started
        watch = {"sent": self.watch.sent, "received": self.watch.received} if self.watch is not None else None
        try:
            return self._finish(rc, signum, ranks, reason=self.stop_reason or "finished", logs=tailer.sizes(),
                                watch=watch)
        finally:
            if self.watch is not None:
                self.watch.stop()

    def _finish(self, rc: int, signum, ranks: dict, reason: str, logs: dict | None = None,
                watch: dict | None = None) -> int:
        result = {"ev": protocol.EXIT, "rc": rc, "signal": signum, "ranks": {str(k): v for k, v in ranks.items()},
                  "reason": reason, "time": time.time(), "logs": logs or {}, "watch": watch}
        try:
            with open(os.path.join(self.run_dir, "exit.json"), "w") as f:
                json.dump(result, f)
        except OSError:
            pass
        wire.emit(result)
        return 0


# ---------------------------------------------------------------- after a broken stream


def collect(spec: dict) -> int:
    """Stop what is left of a run on this node, then send what its rank logs hold beyond what clusterrun got.

    ``spec``: run_id, node, grace, run_dir, rank_offset, max_bytes, ``skip``: {"<rank>/<stream>": bytes already
    received}, ``partial``: send an unfinished last line too (the run is over). Prints ``swept`` (or ``alive``),
    then per rank file one ``log`` event (its size and lines, where sending starts, what is left out: at most
    ``max_bytes`` from the end are sent, cut at a line start) followed by its ``out`` events, then ``record``.
    """
    me = os.getpid()
    exclude = {me, os.getppid()}
    if spec.get("sweep", True):
        pids = stop_processes(lambda: marked(spec["run_id"], exclude, spec.get("node", "")),
                              float(spec.get("grace", 2)))
        wire.emit({"ev": protocol.SWEPT, "pids": pids})
    else:  # only reading the logs of a run that goes on (a detached one): say whether it still runs
        wire.emit({"ev": protocol.ALIVE, "pids": marked(spec["run_id"], exclude, spec.get("node", ""))})
    run_dir = os.path.expanduser(spec["run_dir"])
    log_dir = os.path.join(run_dir, "torchrun")
    skip = spec.get("skip", {})
    limit = int(spec.get("max_bytes", 8 << 20))
    partial = bool(spec.get("partial", True))
    for top, _dirs, names in sorted(os.walk(log_dir)) if os.path.isdir(log_dir) else ():
        for name in sorted(names):
            path = os.path.join(top, name)
            m = tailing.Tailer._PATH.search(path)
            if not m:
                continue
            local_rank = int(m.group(2))
            rank = int(spec.get("rank_offset", 0)) + local_rank
            key = f"{rank}/{m.group(3)}"
            try:
                fh = open(path, "rb")  # noqa: SIM115 - closed below
            except OSError:
                continue
            with fh:
                size = os.fstat(fh.fileno()).st_size
                start = min(int(skip.get(key, 0)), size)
                begin = tailing._line_start_after(fh, size - limit) if size - start > limit else start
                wire.emit({"ev": protocol.LOG, "rank": rank, "stream": m.group(3), "bytes": size,
                      "lines": tailing._count_lines(fh, 0, size), "from": begin, "skipped_bytes": begin - start,
                      "skipped_lines": tailing._count_lines(fh, start, begin)})
            f = tailing.RankFile(path, rank, local_rank, m.group(3), offset=begin)
            while f.offset < size and not wire.is_broken():
                if not f.pump() and not f.pending:
                    break
            for _ in range(64 if partial else 0):  # its writers are gone: what is left is its unfinished end
                if not f.pump(final=True):
                    break
            f.close()
    try:
        with open(os.path.join(run_dir, "exit.json")) as fh:
            wire.emit({"ev": protocol.RECORD, "exit": json.load(fh)})
    except (OSError, ValueError):
        wire.emit({"ev": protocol.RECORD, "exit": None})
    return 0


# ---------------------------------------------------------------- clusterrun exec


def exec_command(spec: dict) -> int:
    """Run ``spec["command"]`` with ``sh -c`` in its own session; relay its output as ``line`` events.

    It stops (SIGTERM to its process group, SIGKILL 2 s later) when clusterrun goes away (end of
    input) or after ``spec["timeout"]`` seconds; the final ``exit`` event carries the exit status.
    """
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        proc = subprocess.Popen(["sh", "-c", spec["command"]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=lambda: _prctl(PR_SET_PDEATHSIG, signal.SIGTERM))
    except OSError as exc:
        wire.emit({"ev": protocol.EXIT, "rc": 127, "error": str(exc)})
        return 0
    why = []
    me = os.getpid()

    def stop(reason: str) -> None:
        if not why:
            why.append(reason)
            threading.Thread(target=stop_processes, args=(lambda: descendants(me), 2.0), daemon=True).start()

    def relay(pipe, stream: str) -> None:
        for raw in iter(pipe.readline, b""):
            wire.emit({"ev": protocol.LINE, "stream": stream, "text": raw.decode("utf-8", errors="replace").rstrip("\r\n")})
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
    timeout = float(spec.get("timeout") or 0)
    if timeout > 0:
        timer = threading.Timer(timeout, stop, args=(f"timed out after {timeout:g}s",))
        timer.daemon = True
        timer.start()
    status = wait_for(proc.pid)
    proc.returncode = status
    for t in readers:
        t.join(timeout=2.0)
    rc = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    stop_processes(lambda: descendants(me), 0.5)  # anything the command left in the background
    wire.emit({"ev": protocol.EXIT, "rc": rc, "reason": why[0] if why else None})
    return 0


def start_run(spec: dict) -> int:
    """Run the job of ``spec`` to its end (``run``, or ``go`` after ``prepare``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only clusterrun's 'term'/'kill' stop the job
    if spec.get("detached"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the session that started it may end
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a broken stream must not kill the agent
    return Agent(spec).run()


def main(argv: list) -> int:
    if argv[:1] == ["prepare"]:
        # A launch's one program per node: the checks before the job, then the job (see session.py).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        return session.serve(sys.stdin.buffer, start_run)
    if len(argv) >= 2 and argv[0] == "run":
        # "-": the spec is the first line of stdin. It holds the job's environment (tokens, passwords), which a
        # command line would show to every user of the node (ps, /proc/<pid>/cmdline).
        raw = sys.stdin.buffer.readline() if argv[1] == "-" else argv[1].encode()
        if not raw.strip():
            sys.stderr.write("agent.py run -: no spec on stdin (clusterrun went away before sending it)\n")
            return 2
        return start_run(json.loads(base64.b64decode(raw).decode()))
    if len(argv) >= 2 and argv[0] == "exec":
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        return exec_command(json.loads(base64.b64decode(argv[1]).decode()))
    if len(argv) >= 2 and argv[0] == "collect":
        return collect(json.loads(base64.b64decode(argv[1]).decode()))
    if len(argv) >= 2 and argv[0] in ("sweep", "ps"):
        me = os.getpid()
        exclude = {me, os.getppid()}
        node = argv[3] if len(argv) > 3 else ""
        if argv[0] == "ps":
            print(json.dumps({"pids": marked(argv[1], exclude, node)}))
            return 0
        grace = float(argv[2]) if len(argv) > 2 else 2.0
        print(json.dumps({"pids": stop_processes(lambda: marked(argv[1], exclude, node), grace)}))
        return 0
    sys.stderr.write("usage: agent.py prepare | run - (SPEC_B64 on stdin) | run SPEC_B64 | exec SPEC_B64 | collect SPEC_B64 | sweep RUN_ID [GRACE [NODE]] | ps RUN_ID [GRACE [NODE]]\n")
    return 2


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    # Daemon threads may still block on stdin; skip interpreter finalisation, which would wait on them.
    os._exit(code)
