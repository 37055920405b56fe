"""The node agent's ``run`` mode (also ``go`` after ``prepare``): one node's torchrun, from its start to its end.

:class:`Agent` starts torchrun in its own session and then, until every process of it is gone:

* tails every rank's log file (torchrun ``--redirects 3 --log-dir``) and writes each complete line to stdout
  as one ``out`` event, so lines of different ranks never mix (tailing.py);
* watches stdin: ``ping`` keeps it alive, ``term`` stops the job (SIGTERM, then SIGKILL after the grace
  period), ``kill`` stops it at once; end of input (the ssh channel or the orchestrator is gone) or no
  ``ping`` within the heartbeat timeout stops it too, unless the run is detached;
* on exit, reports torchrun's exit code and each failed rank's code (from torchrun's failure summary) as a
  final ``exit`` event and in ``exit.json`` in the run directory.

Its spec is ``protocol.RUN``, filled before it gets here: every key is present.

Standard library only: this module travels to the nodes with the agent.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

if __package__:
    from clusterrun.remote import (
        containers,
        flight,
        gpufacts,
        leases,
        pathwatch,
        procs,
        protocol,
        relay,
        sampler,
        stacks,
        tailing,
        torchrun_summary,
        warm,
        wire,
    )
else:
    import containers
    import flight
    import gpufacts
    import leases
    import pathwatch
    import procs
    import protocol
    import relay
    import sampler
    import stacks
    import tailing
    import torchrun_summary
    import warm
    import wire

# ---------------------------------------------------------------- the run


class Agent:
    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.run_id = spec["run_id"]
        self.node = spec["node"]
        self.grace = float(spec["grace"])
        self.heartbeat_timeout = float(spec["heartbeat_timeout"])
        self.detached = spec["detached"]
        self.ended = None  # when torchrun ended
        self.run_dir = os.path.expanduser(spec["run_dir"])
        self.launcher_lines: list = []
        self.stop_reason = None
        self.stopping = threading.Event()
        self.done = threading.Event()  # the job is over and its processes gone: nothing of this agent acts on any more
        self.last_ping = time.monotonic()
        self.watch = None  # the data-path watch (pathwatch.PathWatch), when clusterrun asked for one
        self.flight = False  # torch's flight recorder is on in the workers

    def _argv(self) -> list:
        # A leading '~/' in clusterrun's part (python, torchrun's flags, the script's path) means the node user's
        # home, as a shell would expand it; the script's own arguments are passed exactly as typed.
        argv = list(self.spec["argv"])
        own = len(argv) - self.spec["script_args"]
        return [os.path.expanduser(a) if i < own and a.startswith("~/") else a for i, a in enumerate(argv)]

    def stop(self, reason: str, grace: float) -> None:
        if self.stopping.is_set() and grace > 0:
            return
        self.stop_reason = self.stop_reason or reason
        self.stopping.set()
        me = os.getpid()
        # Only this job's processes: once it is over (done), a later attempt's torchrun is this agent's child too.
        threading.Thread(target=procs.stop_processes, args=(lambda: [] if self.done.is_set() else procs.descendants(me),
                                                            grace), daemon=True).start()

    def _watch_stdin(self) -> None:
        while True:
            try:
                line = sys.stdin.buffer.readline()
            except (OSError, ValueError):
                line = b""
            self.command(line)
            if not line:
                return

    def command(self, line: bytes) -> None:
        """One command line from clusterrun (or the run's supervisor); empty: the connection ended."""
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
            offset = self.spec["rank_offset"]
            cpu = {}
            for local_rank, pid in stacks.workers(procs.descendants(os.getpid())).items():
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
        found = stacks.workers(procs.descendants(os.getpid()))
        offset = self.spec["rank_offset"]
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
        spec = self.spec["watch"]
        if spec is None or not spec["address"] or self.detached:
            return
        nic = spec["nic"]

        def changed(target, lost: bool) -> None:
            wire.emit({"ev": protocol.PATH, "peer": target.node, "address": target.address, "nic": nic,
                  "state": "lost" if lost else "ok", "since": target.last_answer_wall, "answered": target.answered,
                  "time": time.time()})

        try:
            self.watch = pathwatch.PathWatch(spec["address"], changed, float(spec["interval"]),
                                             float(spec["dead_after"]))
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
            m = torchrun_summary.WORKER_FAILED.search(text)
            if m:
                # torchrun saw a worker fail; say so now, before it finishes stopping the others.
                local_rank = int(m.group(2))
                code = int(m.group(1))
                wire.emit({"ev": protocol.RANK_FAILED, "local_rank": local_rank, "time": time.time(),
                      "rank": self.spec["rank_offset"] + local_rank,
                      "rc": 128 - code if code < 0 else code, "signal": -code if code < 0 else None})
        pipe.close()

    def _environment(self) -> dict:
        """The job's environment: the node's, the spec's, the run's markers, and the workers' stack hook."""
        env = procs.job_environ(self.spec["env"], self.run_id, self.node)
        if self.spec["stacks"] is not None:
            try:  # the workers' stack hook, for hang diagnosis without py-spy
                env.update(stacks.hook_env(self.run_dir, self.spec["stacks"]["hook"], env))
                if self.spec["stacks"]["flight"]:
                    env.update(flight.env(self.run_dir, env, flight.torch_version()))
                    self.flight = True
            except OSError as exc:
                wire.emit({"ev": protocol.LAUNCHER, "text": f"clusterrun: no stack hook ({exc}); stacks need py-spy"})
        return env

    def _stage(self) -> None:
        """Staged files arrive in the node's content cache; each run gets its own copy."""
        for src, dest, *kind in self.spec["stage"]:
            dest = os.path.expanduser(dest)
            if kind and kind[0] == "tree":  # a --sync directory, as a tar archive
                import tarfile  # only for --sync: not at every agent's start

                os.makedirs(dest, exist_ok=True)
                with tarfile.open(os.path.expanduser(src)) as archive:
                    try:
                        archive.extractall(dest, filter="data")
                    except TypeError:  # Python < 3.12 without the filter backport
                        archive.extractall(dest)
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(os.path.expanduser(src), dest)

    def _start_watchers(self) -> None:
        """The threads beside the job: the path watch, CPU reports, stdin's commands, the heartbeat watchdog."""
        self._start_watch()
        if self.spec["load_every"] > 0 and not self.detached:
            threading.Thread(target=self._report_load, args=(float(self.spec["load_every"]),), daemon=True,
                             name="load").start()
        if relay.FEED is not None:  # relayed: the one reader of the supervisor's connection hands us the lines
            relay.FEED.attach(self)
        else:
            threading.Thread(target=self._watch_stdin, daemon=True).start()
        every = float(self.spec["sample_every"])
        if every > 0:  # the node's series (sampler.py): NICs, RDMA ports, ranks, load, the run's GPUs
            me, offset = os.getpid(), self.spec["rank_offset"]
            sampler.Sampler(lambda: {offset + r: p for r, p in stacks.workers(procs.descendants(me)).items()},
                            self.spec["gpus"], run_id=self.run_id, every=every).start(
                every, lambda s: wire.emit(dict(s, ev=protocol.SAMPLE)), self.stopping, lambda: self.ended is not None or wire.is_broken())
        if self.heartbeat_timeout > 0 and not self.detached:
            threading.Thread(target=self._watch_heartbeat, daemon=True).start()

    def run(self) -> int:
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)  # the ranks' logs: the user's only
        procs.prctl(procs.PR_SET_CHILD_SUBREAPER, 1)
        env = self._environment()
        cwd = os.path.expanduser(self.spec["cwd"] or self.run_dir)
        self._stage()
        argv = self._argv()
        # The run's GPUs are leased until this agent ends (SIGKILL included): no other run gets them meanwhile.
        taken = leases.take_gpus(self.spec["gpus"], leases.holder(self.run_id, self.node))
        if taken:
            wire.emit({"ev": protocol.ERROR, "text": "not started: %s" % taken, "time": time.time()})
            return self._finish(125, None, {}, reason="not started: %s" % taken)
        container = self.spec["container"]
        if container is not None:
            # torchrun is the container's main process; the runtime's client stays this agent's child, and the
            # variables go by name only (their values from the client's environment, never in an argv).
            names = [k for k in env if k in self.spec["env"] or os.environ.get(k) != env[k]]
            env.update(container["env"])
            argv = containers.argv(container, names, argv)
        # torchrun warmed at the ready check (warm.py), where it fits this job exactly; else a cold start.
        proc, how = (None, {"warm": False}) if container is not None else warm.take(
            argv, env, cwd, stacks.hooks_dir(self.run_dir))
        try:
            proc = proc or subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
                # torchrun gets SIGTERM if this agent dies, and then stops its workers.
                preexec_fn=lambda: procs.prctl(procs.PR_SET_PDEATHSIG, signal.SIGTERM),
            )
        except OSError as exc:
            wire.emit({"ev": protocol.ERROR, "text": f"cannot start {argv[0]}: {exc.strerror or exc}", "time": time.time()})
            return self._finish(127, None, {}, reason=f"could not start: {exc}")
        wire.emit({"ev": protocol.STARTED, "pid": proc.pid, "time": time.time(), **how})
        reader = threading.Thread(target=self._read_launcher, args=(proc.stdout,), daemon=True)
        reader.start()
        tailer = tailing.Tailer(os.path.join(self.run_dir, "torchrun"), self.spec["rank_offset"])
        tailer.start()
        self._start_watchers()
        status = procs.wait_for(proc.pid)
        proc.returncode = status  # reaped here, not by Popen
        self.ended = time.time()  # the node's end, in its exit event: not when its logs finished going out
        if self.watch is not None:
            self.watch.answer_only()  # the job is over: its paths no longer matter, the others' still do
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            rc, signum = 128 + sig, sig
        else:
            rc, signum = os.WEXITSTATUS(status), None
        # Whatever torchrun left behind (it died, or a worker escaped) goes now.
        me = os.getpid()
        procs.stop_processes(lambda: procs.descendants(me), self.grace)
        procs.stop_processes(lambda: procs.marked(self.run_id, {me}, self.node), 0.5)
        if container is not None:  # what the runtime keeps of it (``--rm`` alone misses a killed client)
            containers.remove(container["runtime"], container["labels"], env=env)
        reader.join(timeout=2.0)
        self._drain(tailer)
        if self.flight:
            self._send_timeout_dumps()
        ranks = torchrun_summary.parse_failures(self.launcher_lines)
        for rank, started in tailer.started_at.items():
            # torchrun's 0 says every rank ended well, unless the job was stopped (then torchrun's code says little).
            ranks.setdefault(rank, {"rc": 0 if rc == 0 and self.stop_reason is None else None, "signal": None,
                                    "time": None})
            ranks[rank]["started"] = started
        watch = {"sent": self.watch.sent, "received": self.watch.received} if self.watch is not None else None
        # The run's GPUs once it is over, through the node reporter's GPU facts: a process still on one is named.
        after = gpufacts.gather(timeout=5.0) if self.spec["gpus"] else None
        try:
            return self._finish(rc, signum, ranks, reason=self.stop_reason or "finished", logs=tailer.sizes(),
                                watch=watch, gpus_after=after)
        finally:
            if self.watch is not None:
                self.watch.stop()

    def _drain(self, tailer) -> None:
        """The end is a handshake: every byte of every rank file goes out before the exit event. The drain is
        bounded by progress, not by time: it may take long on a slow link, but a stream that stops moving
        (clusterrun frozen, the link dead) for the heartbeat timeout ends it; the files stay on the node."""
        tailer.stop_event.set()
        if self.detached and wire.is_broken():
            return  # no one reads this stream any more: the files stay on the node for `clusterrun logs`
        stall = max(self.heartbeat_timeout, 15.0)
        while not tailer.done.wait(0.5):
            if time.monotonic() - max(tailer.progress, wire.last_progress()) > stall:
                break

    def _finish(self, rc: int, signum, ranks: dict, reason: str, logs: dict | None = None,
                watch: dict | None = None, gpus_after: dict | None = None) -> int:
        if relay.FEED is not None:  # before the exit goes out: the supervisor's next command is the next attempt's
            relay.FEED.attach(None)
        result = {"ev": protocol.EXIT, "rc": rc, "signal": signum, "ranks": {str(k): v for k, v in ranks.items()},
                  "reason": reason, "time": self.ended or time.time(), "logs": logs or {}, "watch": watch,
                  "gpus_after": gpus_after}
        try:
            with open(os.path.join(self.run_dir, "exit.json"), "w") as f:
                json.dump(result, f)
        except OSError:
            pass
        wire.emit(result)
        return 0


def start_run(spec: dict) -> int:
    """Run the job of ``spec`` to its end (``run``, or ``go`` after ``prepare``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only clusterrun's 'term'/'kill' stop the job
    if spec["detached"]:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the session that started it may end
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a broken stream must not kill the agent
    agent = Agent(spec)
    try:
        return agent.run()
    finally:
        agent.done.set()
        agent.stopping.set()  # the job's threads (heartbeat watchdog, CPU reports) end with it: another may follow
