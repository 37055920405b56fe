"""The run record: what ``status.json`` says, typed, and the only thing that composes or reads that file.

One family of types describes a run (rank, node, attempt, run, failure): the judge (:mod:`.judge`) returns them,
both supervisors update them while the run goes on (a node as a whole when the judge rules on its end), and
status.json is their ``to_dict`` (read back by ``from_dict``).

A run's record goes ``starting`` -> ``running`` -> its end (see :class:`RunState`); a restarted run keeps one
record over all its attempts: ``started`` is the first attempt's start, ``duration`` runs to the end of the
last, ``attempts`` lists each (nodes, start, end, state, exit code, first failure), ``events`` holds every
attempt's events (each with its ``attempt``), and ``first_failure`` is the run's first (the earliest of every
attempt; the last attempt's own is in ``attempts``). Reading is tolerant: a file written by an older clusterrun
(or one cut short) gives a record with sensible values for what it lacks, and keys this version does not know
are kept as they were.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clusterrun.errors import EXIT_INTERRUPTED
from clusterrun.runs.dirs import RunDir, atomic_write
from clusterrun.runs.timeline import NodeLive, PhaseSpan, timeline_dict, timeline_from

STATUS = "status.json"


class RankState(str, enum.Enum):
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    stopped = "stopped"  # ended because clusterrun or torchrun stopped it after another failure
    unknown = "unknown"  # the node's stream broke before it reported


def signal_name(signum: int | None) -> str | None:
    if not signum:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_number(name: object) -> int | None:
    """The inverse of :func:`signal_name` (None for what it cannot read)."""
    if not isinstance(name, str):
        return name if isinstance(name, int) and not isinstance(name, bool) else None
    try:
        return int(signal.Signals[name])
    except KeyError:
        tail = name.rsplit(" ", 1)[-1]
        return int(tail) if tail.isdigit() else None


#: The start of the detail of a failure found by ``--hang-timeout`` (the rank did not exit: the job was stopped).
HUNG = "hung: "


@dataclass(frozen=True)
class Failure:
    """The failure that ended a run (or an attempt): a rank, or a node as a whole."""

    node: str
    rank: int | None  # None when the node failed as a whole (lost connection, launcher error)
    exit_code: int
    signal: int | None
    detail: str

    def describe(self) -> str:
        who = f"{self.node} rank {self.rank}" if self.rank is not None else self.node
        if (self.rank is None or self.detail.startswith(HUNG)) and self.detail and not self.signal:
            return f"{who}: {self.detail}"  # a node as a whole (lost, its data path died), a hung rank: the why is all
        how = f"killed by {signal_name(self.signal)}" if self.signal else f"exit code {self.exit_code}"
        return f"{who}: {how}{f' ({self.detail})' if self.detail else ''}"

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "exit_code": self.exit_code,
                "signal": signal_name(self.signal), "detail": self.detail}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Failure:
        rank = data.get("rank")
        return cls(str(data.get("node") or "?"), int(rank) if rank is not None else None,
                   int(data.get("exit_code") or 1), signal_number(data.get("signal")), str(data.get("detail") or ""))



class RunState(str, enum.Enum):
    """A run's ``state`` in status.json.

    ``starting`` (nodes being checked) -> ``running`` -> ``succeeded`` | ``failed`` | ``interrupted``; or
    ``not-started`` (a node could not be started: nothing ran); ``starting`` -> ``detached`` (``up --detach``)
    -> ``succeeded`` | ``failed`` (recorded by ``clusterrun logs``); any of starting, running, detached ->
    ``stopped`` (recorded by ``clusterrun down``). ``lost`` is never written: :func:`run_record` says it of a run
    whose file says starting or running while its clusterrun is gone.
    """

    starting = "starting"
    running = "running"
    detached = "detached"
    not_started = "not-started"
    succeeded = "succeeded"
    failed = "failed"
    interrupted = "interrupted"
    stopped = "stopped"
    lost = "lost"
    unknown = "unknown"  # status.json is missing or unreadable

    @property
    def ended(self) -> bool:
        return self in (RunState.succeeded, RunState.failed, RunState.interrupted, RunState.stopped,
                        RunState.not_started)


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _rank_state(value: object) -> RankState | None:
    try:
        return RankState(value) if value is not None else None
    except ValueError:
        return RankState.unknown


@dataclass
class RankRecord:
    """How one rank runs or ended."""

    rank: int
    local_rank: int | None = None
    state: RankState = RankState.unknown
    exit_code: int | None = None
    signal: int | None = None
    started: float | None = None
    ended: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "state": self.state.value,
                "exit_code": self.exit_code, "signal": signal_name(self.signal),
                "started": self.started, "ended": self.ended}

    @classmethod
    def from_dict(cls, rank: int, data: Mapping[str, Any]) -> RankRecord:
        return cls(rank, _int(data.get("local_rank")), _rank_state(data.get("state")) or RankState.unknown,
                   _int(data.get("exit_code")), signal_number(data.get("signal")), _float(data.get("started")),
                   _float(data.get("ended")))


@dataclass
class NodeRecord:
    """How one node runs or ended: its ranks, its state, and (the judge's, not in status.json: the run's first
    failure is) its own failure and torchrun's time of it."""

    state: RankState | None = None  # None: not known yet (a detached run before its end)
    exit_code: int | None = None
    reason: str | None = None
    started: float | None = None
    launched: float | None = None  # when the node's agent had started torchrun (the node's clock)
    ended: float | None = None
    ranks: Mapping[int, RankRecord] = field(default_factory=dict)
    timeline: Mapping[str, PhaseSpan] = field(default_factory=dict)  # the launch's phases (runs/timeline.py)
    live: NodeLive | None = None  # while it runs: what the supervisor last knew
    failure: Failure | None = None  # None when it did not fail itself
    failed_at: float | None = None  # torchrun's time of the failure (to the second), when it said

    def unknown_end(self, reason: str | None) -> None:
        """The node can no longer say how it ended (lost, or given up on): it and its running ranks are unknown."""
        self.ended, self.state, self.reason = time.time(), RankState.unknown, reason
        for rank in self.ranks.values():
            if rank.state is RankState.running:
                rank.state = RankState.unknown

    def to_dict(self) -> dict[str, Any]:
        data = {"state": self.state.value if self.state else None, "exit_code": self.exit_code,
                "reason": self.reason, "started": self.started, "launched": self.launched, "ended": self.ended,
                "ranks": {str(r): o.to_dict() for r, o in sorted(self.ranks.items())}}
        if self.timeline:
            data["timeline"] = timeline_dict(self.timeline)
        if self.live is not None:
            data["live"] = self.live.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeRecord:
        ranks = {int(k): RankRecord.from_dict(int(k), v) for k, v in (data.get("ranks") or {}).items()
                 if str(k).lstrip("-").isdigit() and isinstance(v, Mapping)}
        return cls(_rank_state(data.get("state")), _int(data.get("exit_code")), data.get("reason"),
                   _float(data.get("started")), _float(data.get("launched")), _float(data.get("ended")), ranks,
                   timeline_from(data.get("timeline")), NodeLive.from_dict(data.get("live")))


@dataclass
class AttemptRecord:
    """One start of the job of a restarted run, as the summary and status.json list it."""

    number: int
    nodes: Sequence[str]
    started: float | None = None
    ended: float | None = None
    state: str = "running"
    exit_code: int | None = None
    cause: str | None = None  # what ended it, when it failed
    left_out: Mapping[str, str] = field(default_factory=dict)  # node -> why it is not in this attempt
    replaced: Mapping[str, str] = field(default_factory=dict)  # lost node -> the spare that took its place
    first_failure: Failure | None = None

    @property
    def duration(self) -> float | None:
        return self.ended - self.started if self.ended is not None and self.started is not None else None

    def ended_with(self, run: RunRecord) -> None:
        """This attempt ended as ``run`` (the supervisor's record of it, ended) says."""
        self.ended, self.state, self.exit_code = run.ended, run.state.value, run.exit_code
        self.cause = run.first_failure.describe() if run.first_failure else None
        self.first_failure = run.first_failure

    def describe(self) -> str:
        what = self.state if not self.cause else f"{self.state}: {self.cause}"
        changes = [f"{lost} replaced by {spare}" for lost, spare in self.replaced.items()]
        changes += [f"without {node} ({why})" for node, why in self.left_out.items() if node not in self.replaced]
        return (f"attempt {self.number} on {len(self.nodes)} node(s)" + (f" ({'; '.join(changes)})" if changes else "")
                + f": {what}")

    def to_dict(self) -> dict[str, Any]:
        return {"attempt": self.number, "nodes": list(self.nodes), "started": self.started, "ended": self.ended,
                "duration": self.duration, "state": self.state, "exit_code": self.exit_code, "cause": self.cause,
                "first_failure": self.first_failure.to_dict() if self.first_failure else None,
                "left_out": dict(self.left_out), "replaced": dict(self.replaced)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttemptRecord:
        failure = data.get("first_failure")
        return cls(_int(data.get("attempt")) or 0, tuple(data.get("nodes") or ()), _float(data.get("started")),
                   _float(data.get("ended")), str(data.get("state") or "running"), _int(data.get("exit_code")),
                   data.get("cause"), dict(data.get("left_out") or {}), dict(data.get("replaced") or {}),
                   Failure.from_dict(failure) if isinstance(failure, Mapping) else None)


#: The keys :class:`RunRecord` reads; any other key of a file is kept in ``extra``.
_KNOWN = {"run_id", "state", "exit_code", "started", "ended", "duration", "pid", "interrupted_by", "first_failure",
          "notes", "events", "watch", "logs", "nodes", "problems", "detail", "detached", "stopped_by",
          "restart_count", "attempts", "energy"}


@dataclass
class RunRecord:
    """What status.json says of one run (see the module's docstring); also the supervisor's run (of one attempt)
    while it goes on, ended by :meth:`end`."""

    run_id: str
    state: RunState
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    pid: int | None = None  # the process of `clusterrun up`, while it runs
    interrupted_by: int | None = None  # the signal that made the user stop the run (its name in status.json)
    first_failure: Failure | None = None
    notes: list[str] = field(default_factory=list)  # kept as a list: the run adds to them as it goes
    events: tuple[Mapping[str, Any], ...] = ()  # what the watch saw, in order: time, node, kind, text (attempt)
    watch: dict[str, Any] = field(default_factory=dict)  # per node: the watch's datagrams
    logs: Mapping[str, Any] | None = None  # complete, gaps, unverified, received
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)  # not-started: node -> why
    detail: str | None = None
    detached: bool = False  # started with `up --detach`
    stopped_by: str | None = None
    attempts: tuple[AttemptRecord, ...] = ()  # a run with restarts: every attempt
    energy: Mapping[str, Any] | None = None  # the GPUs' energy in joules: total_j, per_node_j, per_gpu_j, how
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys of the file this version does not know
    path_blame: Mapping[str, Any] | None = None  # not in status.json: the dead path that stopped it (node, other_end)

    def __post_init__(self) -> None:
        self.notes = list(self.notes)

    @property
    def duration(self) -> float | None:
        """From the start (of the first attempt) to the end (of the last)."""
        return self.ended - self.started if self.ended is not None and self.started is not None else None

    @property
    def restart_count(self) -> int | None:
        return self.attempts[-1].number if self.attempts else None

    @property
    def logs_complete(self) -> bool:
        return bool((self.logs or {}).get("complete", True))

    def end(self, at: float) -> None:
        """The job ended at ``at``: failed (its first failure's exit code), else interrupted by the user (128 + the
        signal), else succeeded."""
        signum, self.ended = self.interrupted_by, at
        if self.first_failure is not None:
            self.state, self.exit_code = RunState.failed, self.first_failure.exit_code or 1
        elif signum is not None:
            self.state, self.exit_code = RunState.interrupted, 128 + signum if signum else EXIT_INTERRUPTED
        else:
            self.state, self.exit_code = RunState.succeeded, 0

    def replace(self, **changes: Any) -> RunRecord:
        return dataclasses.replace(self, **changes)

    def with_event(self, event: Mapping[str, Any]) -> RunRecord:
        return dataclasses.replace(self, events=(*self.events, dict(event)))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "run_id": self.run_id, "state": self.state.value, "exit_code": self.exit_code, "started": self.started,
            "ended": self.ended, "duration": self.duration, "interrupted_by": signal_name(self.interrupted_by),
            "first_failure": self.first_failure.to_dict() if self.first_failure else None,
            "notes": list(self.notes), "events": [dict(e) for e in self.events], "watch": dict(self.watch)}
        if self.logs is not None:
            data["logs"] = dict(self.logs)
        data["nodes"] = {name: n.to_dict() for name, n in self.nodes.items()}
        optional = {"pid": self.pid, "problems": dict(self.problems) or None, "detail": self.detail,
                    "detached": self.detached or None, "stopped_by": self.stopped_by, "energy": self.energy}
        data.update({k: v for k, v in optional.items() if v is not None})
        if self.attempts:
            data["restart_count"] = self.restart_count
            data["attempts"] = [a.to_dict() for a in self.attempts]
        data.update({k: v for k, v in self.extra.items() if k not in data})
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], run_id: str = "") -> RunRecord:
        """A record from status.json's content, whichever clusterrun wrote it."""
        try:
            state = RunState(data.get("state"))
        except ValueError:
            state = RunState.unknown
        attempts = tuple(AttemptRecord.from_dict(a) for a in data.get("attempts") or () if isinstance(a, Mapping))
        started = _float(data.get("started"))
        if attempts and attempts[0].started is not None:
            started = attempts[0].started  # older files: the top said the last attempt's start
        failure = data.get("first_failure")
        problems = data.get("problems") or {}
        if isinstance(problems, list):  # older files: one message, no node
            problems = {"clusterrun": "; ".join(str(p) for p in problems)}
        nodes = {str(k): NodeRecord.from_dict(v) for k, v in (data.get("nodes") or {}).items()
                 if isinstance(v, Mapping)}
        return cls(str(data.get("run_id") or run_id), state, started, _float(data.get("ended")),
                   _int(data.get("exit_code")), _int(data.get("pid")), signal_number(data.get("interrupted_by")),
                   Failure.from_dict(failure) if isinstance(failure, Mapping) else None,
                   [str(n) for n in data.get("notes") or ()],
                   tuple(e for e in data.get("events") or () if isinstance(e, Mapping)),
                   dict(data.get("watch") or {}), data.get("logs") if isinstance(data.get("logs"), Mapping) else None,
                   nodes, {str(k): str(v) for k, v in dict(problems).items()}, data.get("detail"),
                   bool(data.get("detached")), data.get("stopped_by"), attempts,
                   data.get("energy") if isinstance(data.get("energy"), Mapping) else None,
                   {k: v for k, v in data.items() if k not in _KNOWN})


def write_record(run: RunDir, record: RunRecord) -> RunRecord:
    """The one writer of status.json (atomic). Returns ``record``."""
    data = record.to_dict()
    atomic_write(run.path / STATUS, json.dumps(data, indent=2, sort_keys=False) + "\n",
                 smaller=lambda: json.dumps(data, separators=(",", ":")) + "\n")
    return record


def read_record(run: RunDir) -> RunRecord:
    """status.json as written; state ``unknown`` when it is missing or unreadable."""
    try:
        data = json.loads((run.path / STATUS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return RunRecord(run.run_id, RunState.unknown)
    return RunRecord.from_dict(data, run.run_id) if isinstance(data, dict) else RunRecord(run.run_id, RunState.unknown)


def run_record(run: RunDir) -> RunRecord:
    """status.json, with ``state`` corrected to ``lost`` when it says running but its clusterrun process is gone."""
    record = read_record(run)
    if record.state in (RunState.starting, RunState.running) and record.pid:
        try:
            os.kill(record.pid, 0)
        except ProcessLookupError:
            # killed without a chance to write its end; `clusterrun down` cleans up
            record = record.replace(state=RunState.lost)
        except PermissionError:
            pass
    return record


def tag_events(events: Sequence[Mapping[str, Any]], attempt: int) -> tuple[dict[str, Any], ...]:
    """Events of one attempt, each saying which."""
    return tuple({**e, "attempt": attempt} for e in events)
