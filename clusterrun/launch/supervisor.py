"""Run a launch plan on its nodes and supervise it to the end (attached, or on rank 0's node for a detached run).

Each node's agent waits (see :mod:`clusterrun.agents.link`); ``go`` starts the job on every node, and each link's
reader turns the agent's output into frames (events, rank output as raw payloads) on one bounded queue; the calling
thread alone writes logs and the terminal (:class:`~clusterrun.launch.relay.LogRelay`), so lines are never split or
mixed. The end of a node is a handshake: its agent sends every byte of every rank file, then its ``exit`` event
with each file's size, then closes the stream (or, kept for another attempt, stays). The first failure (a rank
exits non-zero, a node's connection drops) stops every other node: ``term`` to each agent, which sends SIGTERM to
its processes and SIGKILL after the grace period; Ctrl-C or SIGTERM does the same; a second Ctrl-C sends ``kill``
(:mod:`clusterrun.launch.phase`). Heartbeats tell each agent we are still here; an agent that stops hearing them
stops its node by itself. What each node is doing goes to status.json every few seconds (:mod:`clusterrun.runs.live`).
"""

from __future__ import annotations

import dataclasses
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from clusterrun.agents.link import AgentLink
from clusterrun.agents.spec import run_spec
from clusterrun.errors import EXIT_TIMEOUT, ClusterrunError, StartError
from clusterrun.launch.console import Console
from clusterrun.launch.outcome import logs_summary
from clusterrun.launch.phase import Phase, RunPhase, signal_order
from clusterrun.launch.relay import LogRelay
from clusterrun.launch.settings import OnPathLoss, SupervisorSettings
from clusterrun.launch.watch import DataPathWatch, Endpoint, HangWatch, PathWatchState, StragglerWatch, Verdict
from clusterrun.notify import Notifier
from clusterrun.planning.planfile import LaunchPlan, NodePlan
from clusterrun.remote import answers, protocol
from clusterrun.remote.protocol import Frame
from clusterrun.runs import RunDir
from clusterrun.runs.judge import gpus_left_busy, judge_node
from clusterrun.runs.live import LiveNodes
from clusterrun.runs.record import Failure, NodeRecord, RankRecord, RankState, RunRecord, RunState
from clusterrun.runs.series import SeriesWriter
from clusterrun.runs.timeline import Timeline
from clusterrun.runs.traffic import WrongNicJudge, run_energy

#: Events handled in one turn of the loop at most, before its work over every node (ticks, silence, heartbeats).
EVENTS_PER_TURN = 256


class Supervisor:
    def __init__(self, plan: LaunchPlan, links: Mapping[str, AgentLink], run_dir: RunDir,
                 console: Console, settings: SupervisorSettings | None = None,
                 stage: Mapping[str, list[tuple[str, str]]] | None = None, notifier: Notifier | None = None,
                 timeline: Timeline | None = None) -> None:
        self.plan, self.links, self.run_dir, self.console = plan, links, run_dir, console
        self.settings = (settings or SupervisorSettings()).paced(plan.nnodes)
        self.notifier = notifier
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=self.settings.queue_size)
        self._streams: dict[str, AgentLink] = {}
        self._ended: set[str] = set()
        self.relay = LogRelay(run_dir, console, {n.name: n.run_dir for n in plan.nodes})
        self.phase = RunPhase(self._send_running)
        self._signals: list[int] = []
        self._stage = stage or {}
        self._last_heard: dict[str, float] = {}
        self._last_progress: dict[str, float] = {}  # the last event other than a heartbeat's answer
        self.outcome = RunRecord(plan.run_id, RunState.running, started=time.time(), logs=logs_summary(), nodes={
            n.name: NodeRecord(RankState.running, ranks={r: RankRecord(r, r - n.rank_offset, RankState.running)
                                                         for r in n.ranks}) for n in plan.nodes})
        #: The signals that stop the run (see phase.signal_order); a detached run's supervisor has its own.
        self.signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        self.after_start: Callable[[], None] | None = None  # called once every node was told to start
        self.keep_links = False  # the agents stay connected after their exit, for another attempt (detached runs)
        self.hang: HangWatch | None = None
        if self.settings.hang_timeout:
            self.hang = HangWatch(self.settings.hang_timeout, self.settings.on_hang, self._send_running,
                                  self.relay.save, self.console.info, self._record, self._fail, plan.master.name)
        self.stragglers = StragglerWatch.for_plan(plan, self.console.info, self._record, notifier)
        self.watch: DataPathWatch | None = None
        if self.settings.path_watch and plan.nnodes > 1:
            ordered = sorted(plan.nodes, key=lambda n: n.node_rank)
            state = PathWatchState({n.name: Endpoint(n.name, n.data_address, n.data_nic) for n in ordered},
                                   [n.name for n in ordered])
            self.watch = DataPathWatch(state, lambda node, line: self._streams[node].send(line), self.console.info,
                                       self._path_lost, self._record)
        self.live = LiveNodes(run_dir, self.outcome.nodes, timeline or Timeline(), self.watch is not None,
                              self.relay.failed)
        # The nodes' samples into the run's series, judged for traffic on the wrong NIC (runs/series.py, traffic.py).
        self.series = SeriesWriter(run_dir.path, judge=WrongNicJudge.from_plan(plan.to_dict()))

    # ------------------------------------------------------------ start

    def _spec(self, node: NodePlan) -> dict[str, Any]:
        # The workers' hook (stacks): stacks and the flight recorder for the hang watch; on a restart it also gives
        # TORCHELASTIC_RESTART_COUNT and _MAX_RESTARTS clusterrun's (torchrun's own are 0 in every fresh torchrun).
        return run_spec(node, self.plan.run_id, grace=self.settings.grace,
                        heartbeat_timeout=self.settings.heartbeat_timeout, stage=self._stage.get(node.name),
                        script_args=len(self.plan.job.args), flight=self.hang is not None,
                        stacks=self.hang is not None or bool(self.plan.job.attempt or self.plan.job.restarts),
                        load_every=self.settings.load_every if self.stragglers is not None else 0.0,
                        watch_interval=self.settings.watch_interval if self.watch is not None else None,
                        watch_dead_after=self.settings.watch_dead_after, sample_every=self.settings.sample_every)

    def _start_all(self) -> None:
        """``go`` to every node's waiting agent: their frames come to the event queue from now on."""
        problems: dict[str, str] = {}
        earlier: list[tuple[str, Any]] = []
        for node in self.plan.nodes:
            link = self.links[node.name]
            left = link.hand_over(self._events)
            self._streams[node.name] = link
            if any(not isinstance(item, Frame) or item.event.ev == protocol.STREAM_ERROR for item in left):
                problems[node.name] = "the node agent's connection closed before it got the run's spec"
                continue
            earlier += [(node.name, item) for item in left]
            try:
                self.live.go(node.name)
                link.go(self._spec(node))
            except ClusterrunError as exc:  # a node that cannot be told is reported, the others stopped
                problems[node.name] = exc.reason
        if problems:
            for link in self._streams.values():
                link.abort()
            raise StartError(problems)
        self.phase.move(Phase.RUNNING)
        for name, item in earlier:  # what the agents said before the job (late answers are not events: ignored)
            self._handle(name, item)
        now, heard = time.time(), time.monotonic()
        for node in self.outcome.nodes.values():
            node.started = now
        for name in self._streams:  # a node's silence counts from the start of the job at the earliest
            self._last_heard.setdefault(name, heard)

    # ------------------------------------------------------------ events

    def _handle(self, name: str, item: Frame | object) -> None:
        node = self.outcome.nodes[name]
        now = time.monotonic()
        self._last_heard[name] = now
        if not isinstance(item, Frame):  # EOF: the stream ended
            self._ended.add(name)
            if node.ended is None:
                tail = self._streams[name].stderr_text().strip().splitlines()[-3:]
                self._lose(name, "connection lost before the node reported" + (f": {' | '.join(tail)}" if tail else ""))
            return
        event = item.event
        kind = event.ev
        if kind == protocol.PONG:
            return
        self._last_progress[name] = now
        self.live.on_event(name, event)
        if kind == protocol.OUT:
            if self.hang is not None:
                self.hang.output(now)
            # A payload cut short by a broken stream is the start of a record: shown once it is whole.
            self.relay.write(name, event.rank, event.stream, item.payload, event.open or event.cut)
        elif kind == protocol.STARTED:
            node.launched = event.time
        elif kind in (protocol.LAUNCHER, protocol.ERROR, protocol.STREAM_ERROR):
            text = event.text
            try:
                with open(self.run_dir.launcher_log(name), "a", encoding="utf-8") as fh:
                    fh.write(text + "\n")
            except OSError as exc:
                self.relay.failed(f"{name}'s launcher.log", exc)
            # Once stopping, torchrun's own report (a ChildFailedError traceback) only repeats what the
            # summary says; it stays in launcher.log.
            if not self.phase.stopping or kind == protocol.ERROR:
                self.console.node_line(name, text, node.ranks, error=kind != protocol.LAUNCHER, now=now)
            if kind == protocol.ERROR:
                node.reason = text
        elif kind == protocol.RANK_FAILED:
            rank = node.ranks.get(event.rank)
            if rank is not None:
                rank.state, rank.exit_code, rank.signal = RankState.failed, event.rc, event.signal
                rank.ended = event.time
                self._fail(Failure(name, rank.rank, rank.exit_code or 1, rank.signal, "exited while others ran"))
        elif kind == protocol.SAMPLE:
            for verdict in self.series.on_sample(name, event):
                self.console.info(verdict.message())
                self._record(verdict.record_event())
        elif kind == protocol.STACK and self.hang is not None:
            self.hang.on_stack(name, event, item.payload)
        elif kind == protocol.FLIGHT and self.hang is not None:
            self.hang.on_flight(name, event, item.payload)
        elif kind == protocol.STACKS_DONE and self.hang is not None:
            self.hang.on_done(name)
        elif kind == protocol.WATCHING and self.watch is not None:
            self.watch.on_watching(name, event)
        elif kind == protocol.PATH and self.watch is not None:
            self.watch.on_path(name, event, now, stopping=self.phase.stopping,
                               ended=self._jobs_ended())
        elif kind == protocol.EXIT:
            if self.keep_links:  # the agent stays for the next attempt: its exit, after every byte, is the end
                self._ended.add(name)
            self.relay.expect(name, event.logs)
            if event.watch:
                self.outcome.watch[name] = event.watch
            self._node_exit(name, event)
        if kind in (protocol.LOAD, protocol.SAMPLE) and self.stragglers is not None:  # work: who the others wait for
            self.stragglers.on_event(name, event)

    def _node_exit(self, name: str, event: answers.Exit) -> None:
        """The judge's node in place of what was known of it (its start, launch, timeline and a launcher error)."""
        known = self.outcome.nodes[name]
        end = judge_node(name, list(known.ranks), event, stopping=self.phase.stopping,
                         failed_early={r.rank: r for r in known.ranks.values() if r.state is RankState.failed})
        ended, reason, failure = end.ended or time.time(), known.reason or end.reason, end.failure
        if failure is not None and failure.rank is None and reason:
            failure = dataclasses.replace(failure, detail=reason)
        for rank in end.ranks.values():
            rank.ended = rank.ended or ended
        self.outcome.nodes[name] = dataclasses.replace(end, reason=reason, started=known.started, ended=ended,
                                                       launched=known.launched, timeline=known.timeline,
                                                       failure=failure)
        if failure is not None:
            self._fail(failure)
        for text in gpus_left_busy(name, event.gpus_after, self.plan.node(name).gpus):
            self.console.info(text)
            self._record({"time": time.time(), "node": name, "kind": "gpu-left-busy", "text": text})

    def _fail(self, failure: Failure) -> None:
        if not self.phase.stopping and self.outcome.first_failure is None:
            self.outcome.first_failure = failure
            self.console.info(f"{failure.describe()}; stopping all nodes")
            if self.notifier is not None:
                self.notifier.send("failure", f"clusterrun: run {self.plan.run_id} failed: {failure.describe()}",
                                   run_id=self.plan.run_id, state="failing", first_failure=failure.to_dict(),
                                   nodes=[n.name for n in self.plan.nodes], run_dir=str(self.run_dir.path))
        self.phase.stop(Phase.STOPPING)

    # ------------------------------------------------------------ signals

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals.append(signum)  # handled by the loop; nothing here may block

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_signal) for sig in self.signals}

    def _handle_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            to = signal_order(signum, first=self.outcome.interrupted_by is None)
            if to is Phase.STOPPING:
                self.outcome.interrupted_by = signum
                self.console.info(f"{signal.Signals(signum).name}: stopping all nodes (again to kill at once)")
            elif to is Phase.KILLING:
                self.console.info("killing all nodes now")
            if to is not None:
                self.phase.stop(to)

    # ------------------------------------------------------------ the loop

    def run(self) -> RunRecord:
        """Start, supervise, stop. Returns the outcome; raises StartError when nothing could be started."""
        previous = self._install_signals()
        try:
            self._start_all()
            if self.after_start is not None:
                self.after_start()
            self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for stream in () if self.keep_links else self._streams.values():
                stream.abort()
            for stream in () if self.keep_links else self._streams.values():
                stream.join(timeout=2.0)
            self.relay.close()
            self.live.finish()
            self.outcome.end(self.outcome.ended or time.time())
            self.outcome.energy = run_energy(self.run_dir.path)
        return self.outcome

    def _loop(self) -> None:
        started = time.monotonic()
        next_beat = started + self.settings.heartbeat_interval
        next_tick = started
        last_turn = started
        while len(self._ended) < len(self._streams):
            try:
                name, item = self._events.get(timeout=0.1)
                self._handle(name, item)
                for _ in range(EVENTS_PER_TURN - 1):  # what else waits, before the once-a-turn work over every node
                    name, item = self._events.get_nowait()
                    self._handle(name, item)
            except queue.Empty:
                pass
            self._handle_signals()
            now = time.monotonic()
            if now - last_turn > self.settings.heartbeat_timeout / 2:
                self._resumed(now - last_turn, now)
            last_turn = now
            if now >= next_tick:
                next_tick = now + 0.25
                self.console.tick(now)  # progress bars held back by the rate limit
                self.live.tick(now)
                if self.watch is not None:
                    quiet = 3 * self.settings.heartbeat_interval  # every node answers each heartbeat at once
                    self.watch.tick(now, self._jobs_ended(),
                                    {n for n in self._streams if now - self._heard(n) > quiet})
                if self.hang is not None:
                    self.hang.tick(now, set(self._streams) - self._ended, stopping=self.phase.stopping)
            if now >= next_beat:
                next_beat = now + self.settings.heartbeat_interval
                for name, stream in self._streams.items():
                    if name not in self._ended:
                        stream.send(f"{protocol.PING}\n")
            self._check_silent(now)
            if self.settings.timeout and not self.phase.stopping and now - started > self.settings.timeout:
                first = self.plan.nodes[0].name
                self._fail(Failure(first, None, EXIT_TIMEOUT, None, f"the job ran past its {self.settings.timeout:g}s "
                                                                    "time limit"))
            since = self.phase.since_stop(now)
            if since is not None and since > self.settings.stop_timeout:
                # A node still sending its logs is waited for (up to drain_timeout); a silent one is not.
                draining = since < self.settings.drain_timeout
                stuck = [n for n in self._streams if n not in self._ended and not (
                    draining and now - self._last_progress.get(n, 0.0) < self.settings.stop_timeout)]
                self._give_up(stuck)
            elif since is not None:
                # A node that had already stopped answering every heartbeat when the stop went out (it fell off
                # the network: the path watch named it) is not waited for the whole stop_timeout.
                quiet = 3 * self.settings.heartbeat_interval
                gone = [n for n in self._streams if n not in self._ended
                        and self._heard(n) < now - since - quiet
                        and now - self._heard(n) > 2 * quiet]
                if gone:
                    self._give_up(gone)
        self.phase.move(Phase.ENDED)
        self.outcome.ended = time.time()
        note = self.hang.timeout_dumps_note() if self.hang is not None else None
        if note:
            self.console.info(note)
            self._record({"time": time.time(), "node": "-", "kind": "flight-dump", "text": note})

    def _resumed(self, gap: float, now: float) -> None:  # clusterrun stood still (SIGSTOP, Ctrl-Z, a laptop asleep)
        self.console.info(f"clusterrun did not run for {gap:.0f}s (stopped or suspended); the nodes' agents stop the "
                          f"job when they hear nothing for {self.settings.heartbeat_timeout:g}s")
        for name in self._streams:
            self._last_heard[name] = now

    def _heard(self, name: str) -> float:
        """When the node was last heard from (monotonic): a frame handled, or bytes its reader got and queued."""
        return max(self._last_heard[name], self._streams[name].heard)

    def _jobs_ended(self) -> set[str]:  # the nodes whose job is over (their exit came, or they were given up on)
        return {n for n, o in self.outcome.nodes.items() if o.ended is not None}

    def _check_silent(self, now: float) -> None:
        """A node that answers no heartbeat for heartbeat_timeout is lost (network gone, node down)."""
        for name, stream in self._streams.items():
            if name in self._ended:
                continue
            heard = self._heard(name)
            if now - heard > self.settings.heartbeat_timeout:
                stream.abort()  # its agent stops the node's processes when it stops hearing us
                self._ended.add(name)
                self._lose(name, f"no word from the node for {now - heard:.0f}s (network down or node hung); "
                                 "its agent stops the job there by itself")

    def _send_running(self, line: str) -> None:
        for name in set(self._streams) - self._ended:
            self._streams[name].send(line)

    def _record(self, event: dict[str, Any]) -> None:
        """An event of the run (the watch's findings): kept in order, and in status.json at once."""
        self.outcome.events += (event,)
        self.live.add_event(event, self.plan.job.attempt)

    def _path_lost(self, verdict: Verdict) -> None:
        if self.settings.on_path_loss is OnPathLoss.warn:
            self.console.info(f"{verdict.describe()} (--on-path-loss warn: the job goes on)")
            self.outcome.notes.append(verdict.describe())
            return
        other = verdict.loss.peer if verdict.loss.node == verdict.node else verdict.loss.node
        self.outcome.path_blame = {"node": verdict.node, "other_end": other, "also": list(verdict.also)}
        self._fail(Failure(verdict.node, None, 1, None, f"its data path died: {verdict.detail()}"))

    def _lose(self, name: str, reason: str) -> None:
        """The node can no longer tell us what happened: its running ranks' fate is unknown, and the run fails."""
        self.outcome.nodes[name].unknown_end(reason)
        self._fail(Failure(name, None, 1, None, reason))

    def _give_up(self, names: list[str]) -> None:
        """Nodes that did not finish stopping in time: drop their streams (their agents then stop by themselves)."""
        for name in names:
            stream = self._streams[name]
            stream.abort()
            self._ended.add(name)
            node = self.outcome.nodes[name]
            silent = time.monotonic() - self._heard(name)
            node.unknown_end(f"did not confirm it stopped within {self.settings.stop_timeout:g}s"
                             if silent < self.settings.stop_timeout else
                             f"no word from the node for {silent:.0f}s (network down or node hung)")
            self.outcome.notes.append(
                f"{name}: {node.reason}; its agent stops the job there when it stops hearing clusterrun; to look "
                f"yourself: processes with {protocol.RUN_ID_VAR}={self.plan.run_id} in their environment")
