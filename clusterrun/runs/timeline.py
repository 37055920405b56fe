"""A launch's timeline and a running node's live state, as status.json keeps them per node.

``nodes.<name>.timeline`` maps each launch phase to when it began and ended (epoch seconds; the phases the node
agent saw, on the node's clock, moved onto clusterrun's by the offset the ready check measured), plus what the
phase moved (``bytes`` copied by staging). The phases, in order (:data:`PHASES`)::

    connect     the SSH connection (TCP, handshake, authentication)
    agent       the node agent's command sent -> the agent running (its Python started, reading its commands)
    ready       the agent running -> its ready check's answer received (interpreter, torch, port, NICs, GPUs)
    staging     the files the node lacked copied to its cache (``bytes``; zero when it had them all)
    pathcheck   the connectivity check between the nodes (``--preflight``; the same span on every node)
    go          ``go`` sent -> torchrun started by the agent (the staged files placed, the environment made)
    torchrun    torchrun started -> the last of its ranks started (known once the node has ended)
    first_line  torchrun started -> the node's first rank line received by clusterrun

``nodes.<name>.live`` is what the supervisor last knew of a running node (rewritten every few seconds at most):
ranks running, when output last came (epoch), the ranks' CPU (a share of one CPU each), the data path's state.

:class:`Timeline` collects the phases as ``up`` goes: threads stamp at once (the ready check's fan-out), so every
stamp takes the lock. Times the node agent reports (its start, torchrun's start, its ranks' starts) are on the
node's clock; :meth:`Timeline.node_clock` learns, from the ready check, how far that clock is off clusterrun's: the
agent read its check after clusterrun started it and before its answer came back, so a time outside that window
is moved into it, and every later node time by as much. The rest is pure: it reads and writes nothing.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PHASES = ("connect", "agent", "ready", "staging", "pathcheck", "go", "torchrun", "first_line")

#: A phase is slow when it took at least this long ...
SLOW_AT_LEAST_S = 5.0
#: ... and this many times as long as the median node's (or, alone or on every node, SLOW_ALONE_S).
SLOW_FACTOR = 3.0
SLOW_ALONE_S = 20.0


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class PhaseSpan:
    """One phase of one node's launch: start and end (epoch seconds) and what it moved (``detail``)."""

    start: float | None = None
    end: float | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float | None:
        return self.end - self.start if self.start is not None and self.end is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, **{k: v for k, v in self.detail.items()
                                                         if k not in ("start", "end")}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PhaseSpan:
        return cls(_num(data.get("start")), _num(data.get("end")),
                   {k: v for k, v in data.items() if k not in ("start", "end")})


def timeline_from(data: object) -> dict[str, PhaseSpan]:
    """A node's timeline from status.json (anything else, as an older file has: empty)."""
    if not isinstance(data, Mapping):
        return {}
    return {str(k): PhaseSpan.from_dict(v) for k, v in data.items() if isinstance(v, Mapping)}


def timeline_dict(timeline: Mapping[str, PhaseSpan]) -> dict[str, Any]:
    """In the order of :data:`PHASES` (then any other)."""
    order = sorted(timeline, key=lambda p: PHASES.index(p) if p in PHASES else len(PHASES))
    return {p: timeline[p].to_dict() for p in order}


@dataclass(frozen=True)
class NodeLive:
    """What the supervisor last knew of a running node (see the module's docstring)."""

    updated: float | None = None  # when this was written
    ranks_running: int | None = None
    last_output: float | None = None  # epoch of the last rank output received
    cpu: Mapping[str, float] = field(default_factory=dict)  # global rank -> share of one CPU
    path: str | None = None  # "ok", "lost: <peer>, ...", "not watched", or None before the watch started

    def to_dict(self) -> dict[str, Any]:
        return {"updated": self.updated, "ranks_running": self.ranks_running, "last_output": self.last_output,
                "cpu": dict(self.cpu), "path": self.path}

    @classmethod
    def from_dict(cls, data: object) -> NodeLive | None:
        if not isinstance(data, Mapping):
            return None
        cpu = data.get("cpu") if isinstance(data.get("cpu"), Mapping) else {}
        ranks = _num(data.get("ranks_running"))
        return cls(_num(data.get("updated")), int(ranks) if ranks is not None else None,
                   _num(data.get("last_output")),
                   {str(k): float(v) for k, v in cpu.items() if _num(v) is not None},
                   str(data["path"]) if data.get("path") is not None else None)


def size(count: float) -> str:
    """Bytes as people read them: 2.1 GB, 340 MB, 12 kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} B"


def when(ts: float | None) -> str:
    """An epoch time as this machine's local time, to the second (``-`` for none)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def describe(node: str, phase: str, span: PhaseSpan) -> str:
    """``crn5: staging 31 s, 2.1 GB copied``."""
    text = f"{node}: {phase} {span.seconds or 0:.0f} s" if (span.seconds or 0) >= 10 else \
        f"{node}: {phase} {span.seconds or 0:.1f} s"
    copied = _num(span.detail.get("bytes"))
    return text + (f", {size(copied)} copied" if copied else "")


def slow_phases(timelines: Mapping[str, Mapping[str, PhaseSpan]]) -> list[str]:
    """The phases that were slow, one line each (:func:`describe`): a phase of a node that took at least
    SLOW_AT_LEAST_S and SLOW_FACTOR times the median node's, or SLOW_ALONE_S where no other node tells what is
    usual (one node, or the phase as slow on most nodes). The path check is one step of all nodes: said once."""
    found: list[str] = []
    for phase in PHASES:
        took = {n: t[phase].seconds for n, t in timelines.items() if phase in t and t[phase].seconds is not None}
        if not took:
            continue
        median = statistics.median(took.values())
        for node, seconds in took.items():
            assert seconds is not None
            if seconds < SLOW_AT_LEAST_S:
                continue
            others_fast = len(took) > 2 and seconds >= SLOW_FACTOR * median
            if others_fast or seconds >= SLOW_ALONE_S:
                if phase == "pathcheck":
                    found.append(f"the path check took {seconds:.0f} s")
                    break
                found.append(describe(node, phase, timelines[node][phase]))
    return found


def ordered(timeline: Mapping[str, PhaseSpan], phases: Iterable[str] = PHASES) -> list[str]:
    """What is out of order in one node's timeline (empty when each phase that is there ends after it starts
    and starts no earlier than the phase before it)."""
    wrong: list[str] = []
    last: tuple[str, float] | None = None
    for phase in phases:
        span = timeline.get(phase)
        if span is None or span.start is None:
            continue
        if span.end is not None and span.end < span.start:
            wrong.append(f"{phase} ends before it starts")
        if last is not None and span.start < last[1]:
            wrong.append(f"{phase} starts before {last[0]}")
        last = (phase, span.start)
    return wrong



class Timeline:
    """Every node's phases of one attempt's launch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[str, dict[str, dict[str, Any]]] = {}
        self._offset: dict[str, float] = {}  # node -> seconds to add to the node's clock

    def begin(self, node: str, phase: str, at: float | None = None, **detail: Any) -> float:
        """``phase`` of ``node`` began ``at`` (epoch seconds; now by default), as ``detail`` says. Returns the
        time."""
        at = time.time() if at is None else at
        with self._lock:
            self._spans.setdefault(node, {})[phase] = {"start": at, "end": None, **detail}
        return at

    def end(self, node: str, phase: str, at: float | None = None, **detail: Any) -> float:
        """``phase`` of ``node`` ended ``at`` (now by default), having moved ``detail`` (``bytes=...``). A phase
        that was never begun begins there too."""
        at = time.time() if at is None else at
        with self._lock:
            span = self._spans.setdefault(node, {}).setdefault(phase, {"start": at})
            span["end"] = at
            span.update(detail)
        return at

    def span(self, nodes: Iterable[str], phase: str, start: float, end: float, **detail: Any) -> None:
        """One step of every node in ``nodes`` (the path check): the same span for each."""
        for node in nodes:
            self.begin(node, phase, start)
            self.end(node, phase, end, **detail)

    def started(self, node: str, phase: str) -> float | None:
        with self._lock:
            return self._spans.get(node, {}).get(phase, {}).get("start")

    def ended(self, node: str, phase: str) -> float | None:
        with self._lock:
            return self._spans.get(node, {}).get(phase, {}).get("end")

    # ------------------------------------------------------------ the node's clock

    def node_clock(self, node: str, sent: float, node_time: float | None, received: float) -> float:
        """Learn the node's clock offset from one exchange (``sent`` and ``received`` on clusterrun's clock,
        ``node_time`` the node's stamp in between). Returns ``node_time`` on clusterrun's clock."""
        if node_time is None:
            return received
        offset = sent - node_time if node_time < sent else received - node_time if node_time > received else 0.0
        with self._lock:
            self._offset[node] = offset
        return node_time + offset

    def on_our_clock(self, node: str, node_time: float | None) -> float | None:
        """A time the node stamped, on clusterrun's clock (as learnt by :meth:`node_clock`)."""
        if node_time is None:
            return None
        with self._lock:
            return node_time + self._offset.get(node, 0.0)

    # ------------------------------------------------------------ reading

    def of(self, node: str) -> dict[str, PhaseSpan]:
        """One node's phases so far."""
        with self._lock:
            spans = {p: dict(s) for p, s in self._spans.get(node, {}).items()}
        return {p: PhaseSpan(s.pop("start", None), s.pop("end", None), s) for p, s in spans.items()}

    def nodes(self) -> Mapping[str, dict[str, PhaseSpan]]:
        with self._lock:
            names = list(self._spans)
        return {name: self.of(name) for name in names}
