"""What a running run's nodes are doing, kept by the supervisor (:mod:`clusterrun.launch.supervisor`) for
status.json: the launch timeline's phases after ``go`` (go, torchrun, first_line) and each node's live state (ranks
running, last output, CPU, data path), for ``clusterrun status --watch`` in another terminal.

The supervisor's loop hands every event here (:meth:`LiveNodes.on_event`: a dict lookup or two for rank output, the
busiest kind) and calls :meth:`LiveNodes.tick`; status.json is rewritten at most every ``write_every`` seconds
(longer with more nodes), so its cost stays bounded whatever the rate of events.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from clusterrun.remote import protocol
from clusterrun.runs.dirs import RunDir
from clusterrun.runs.record import NodeRecord, RankState, RunState, read_record, write_record
from clusterrun.runs.timeline import NodeLive, Timeline

#: Seconds between two live writes of status.json at least; a run of many nodes writes less often.
WRITE_EVERY = 2.0
WRITE_PER_NODE = 0.02


class LiveNodes:
    """The nodes of one attempt, as the supervisor sees them run."""

    def __init__(self, run_dir: RunDir, nodes: Mapping[str, NodeRecord], timeline: Timeline,
                 watched: bool, failed: Callable[[str, OSError], None], write_every: float = WRITE_EVERY) -> None:
        self.run_dir, self.nodes, self.timeline, self._failed = run_dir, nodes, timeline, failed
        self.write_every = max(write_every, WRITE_PER_NODE * len(nodes))
        self._watched = watched
        self._last_output: dict[str, float] = {}
        self._cpu: dict[str, dict[str, float]] = {}
        self._lost: dict[str, set[str]] = {}  # node -> the peers its data path watch hears nothing from
        self._path: dict[str, str] = {}
        self._torchrun: set[str] = set()
        self._next_write = time.monotonic() + self.write_every

    def go(self, name: str) -> None:
        """``go`` is being sent to ``name``."""
        self.timeline.begin(name, "go")

    def on_event(self, name: str, event: Any) -> None:
        """One answer of node ``name``'s agent (clusterrun/remote/answers.py), as it arrives."""
        kind = event.ev
        if kind == protocol.OUT:
            if name not in self._last_output:
                self.timeline.end(name, "first_line")
            self._last_output[name] = time.time()
        elif kind == protocol.STARTED:
            started = self.timeline.on_our_clock(name, event.time) or time.time()
            self.timeline.end(name, "go", started)
            # warm: importing torch since the ready check (since: when, remote/warm.py); cold: why it was not used.
            how: dict[str, Any] = {"warm": event.warm, **({"cold": event.cold} if event.cold is not None else {})}
            if event.since is not None:
                how["since"] = self.timeline.on_our_clock(name, event.since)
            self.timeline.begin(name, "torchrun", started, **how)
            self.timeline.begin(name, "first_line", started)
            self._torchrun.add(name)
        elif kind == protocol.LOAD:
            self._cpu[name] = event.cpu
        elif kind == protocol.WATCHING:
            self._path[name] = f"not watched: {event.error}" if event.error else "ok"
        elif kind == protocol.PATH:
            lost = self._lost.setdefault(name, set())
            (lost.add if event.state == "lost" else lost.discard)(event.peer)
            self._path[name] = f"lost: {', '.join(sorted(lost))}" if lost else "ok"
        elif kind == protocol.EXIT:
            starts = [r.started for r in event.ranks.values() if r.started is not None]
            if starts and self.timeline.started(name, "torchrun") is not None:
                self.timeline.end(name, "torchrun", self.timeline.on_our_clock(name, max(starts)))

    def live(self, name: str, now: float) -> NodeLive:
        node = self.nodes[name]
        running = sum(r.state is RankState.running for r in node.ranks.values()) if (
            name in self._torchrun and node.ended is None) else 0
        return NodeLive(now, running, self._last_output.get(name), self._cpu.get(name, {}),
                        self._path.get(name) or (None if self._watched else "not watched"))

    def tick(self, now: float) -> None:
        """Rewrite status.json's nodes when it is time (``now``: monotonic)."""
        if now < self._next_write:
            return
        self._next_write = now + self.write_every
        self.write()

    def write(self) -> None:
        """status.json's nodes as they are now, while the record says the run is running."""
        current = read_record(self.run_dir)
        if current.state is not RunState.running:
            return
        wall = time.time()
        nodes = {name: dataclasses.replace(node, timeline=self.timeline.of(name), live=self.live(name, wall))
                 for name, node in self.nodes.items()}
        try:
            write_record(self.run_dir, current.replace(nodes=nodes))
        except OSError as exc:
            self._failed("status.json", exc)

    def add_event(self, event: dict[str, Any], attempt: int) -> None:
        """An event of the run into status.json at once (after the earlier attempts' events it holds)."""
        current = read_record(self.run_dir)
        if current.state is not RunState.running:
            return
        try:
            write_record(self.run_dir, current.with_event({**event, "attempt": attempt} if current.attempts else event))
        except OSError as exc:
            self._failed("status.json", exc)

    def finish(self) -> None:
        """The timeline of every node into its outcome (for the run's end in status.json)."""
        for name, node in self.nodes.items():
            node.timeline = self.timeline.of(name)
