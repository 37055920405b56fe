"""What happened to a run: per rank, per node, the first failure, and each attempt when it was restarted.

A failed attempt is started again (``--max-restarts``) unless a restart cannot help: the user stopped it,
it ran past its time limit, or it failed the same way twice in a row (the same rank, exit code and last
lines: a bug in the script, a missing file). :func:`lost_nodes` says which nodes the next attempt should
not be trusted with.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clusterrun.errors import EXIT_INTERRUPTED, EXIT_TIMEOUT
from clusterrun.notify import Notifier
from clusterrun.planning.planfile import LaunchPlan
from clusterrun.runs.judge import Failure, RankEnd, RankState, signal_name
from clusterrun.runs.record import AttemptRecord, NodeRecord, RankRecord, RunRecord, RunState
from clusterrun.runs.timeline import PhaseSpan

__all__ = ["Attempt", "Failure", "NodeOutcome", "RankOutcome", "RankState", "RunOutcome", "Signature", "no_restart",
           "signal_name", "signature", "untrusted_nodes"]


@dataclass
class RankOutcome:
    rank: int
    local_rank: int
    state: RankState = RankState.running
    exit_code: int | None = None
    signal: int | None = None
    started: float | None = None
    ended: float | None = None

    def record(self) -> RankRecord:
        return RankRecord(self.rank, self.local_rank, self.state, self.exit_code, self.signal, self.started,
                          self.ended)

    def to_dict(self) -> dict[str, Any]:
        return self.record().to_dict()

    def judged(self) -> RankEnd:
        return RankEnd(self.rank, self.state, self.exit_code, self.signal, self.started, self.ended)


@dataclass
class NodeOutcome:
    name: str
    ranks: dict[int, RankOutcome]
    state: RankState = RankState.running
    exit_code: int | None = None
    reason: str | None = None
    started: float | None = None
    launched: float | None = None  # when the node's agent had started torchrun (the node's clock)
    ended: float | None = None
    timeline: dict[str, PhaseSpan] = field(default_factory=dict)  # the launch's phases (runs/timeline.py)

    def record(self) -> NodeRecord:
        return NodeRecord(self.state, self.exit_code, self.reason, self.started, self.launched, self.ended,
                          {r: o.record() for r, o in self.ranks.items()}, dict(self.timeline))

    def unknown_end(self, reason: str | None) -> None:
        """The node can no longer say how it ended (lost, or given up on): it and its running ranks are unknown."""
        self.ended, self.state, self.reason = time.time(), RankState.unknown, reason
        for rank in self.ranks.values():
            if rank.state is RankState.running:
                rank.state = RankState.unknown


@dataclass
class RunOutcome:
    run_id: str
    nodes: dict[str, NodeOutcome]
    started: float
    ended: float | None = None
    first_failure: Failure | None = None
    interrupted_by: int | None = None  # the signal that made the user stop the run
    notes: list[str] = field(default_factory=list)
    log_gaps: list[dict[str, Any]] = field(default_factory=list)  # rank output that never reached runs/
    logs_unverified: list[str] = field(default_factory=list)  # nodes that never said what their logs hold
    log_totals: dict[str, dict[str, int | None]] = field(default_factory=dict)  # received per node/rank/stream
    events: list[dict[str, Any]] = field(default_factory=list)  # what the watch saw, in order: time, node, kind, text
    watch_cost: dict[str, dict[str, int]] = field(default_factory=dict)  # per node: the watch's datagrams
    path_blame: dict[str, Any] | None = None  # the dead data path that stopped it: node, other_end, also
    energy: dict[str, Any] | None = None  # the GPUs' energy from the run's series (runs/traffic.py run_energy)

    @property
    def logs_complete(self) -> bool:
        return not self.log_gaps and not self.logs_unverified

    @property
    def state(self) -> RunState:
        if self.ended is None:
            return RunState.running
        if self.interrupted_by is not None and self.first_failure is None:
            return RunState.interrupted
        if self.first_failure is not None:
            return RunState.failed
        return RunState.succeeded

    @property
    def exit_code(self) -> int:
        """0 on success, the first failing rank's code, or 128+signal when interrupted."""
        if self.first_failure is not None:
            return self.first_failure.exit_code or 1
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by if self.interrupted_by else EXIT_INTERRUPTED
        return 0

    def record(self) -> RunRecord:
        """This outcome as the run's record (of one attempt: :class:`clusterrun.launch.up` adds the others)."""
        logs = {"complete": self.logs_complete, "gaps": self.log_gaps, "unverified": self.logs_unverified,
                "received": self.log_totals}
        return RunRecord(self.run_id, self.state, self.started, self.ended, self.exit_code,
                         interrupted_by=signal_name(self.interrupted_by), first_failure=self.first_failure,
                         notes=tuple(self.notes), events=tuple(self.events), watch=self.watch_cost, logs=logs,
                         nodes={name: n.record() for name, n in self.nodes.items()}, energy=self.energy)

    def to_dict(self) -> dict[str, Any]:
        return self.record().to_dict()


@dataclass
class Attempt:
    """One start of the job, as the summary and status.json list it."""

    number: int
    nodes: list[str]
    started: float = field(default_factory=time.time)
    ended: float | None = None
    state: str = "running"
    exit_code: int | None = None
    cause: str | None = None  # what ended it, when it failed
    left_out: dict[str, str] = field(default_factory=dict)  # node -> why it is not in this attempt
    replaced: dict[str, str] = field(default_factory=dict)  # lost node -> the spare that took its place
    first_failure: Failure | None = None

    def ended_with(self, outcome: RunOutcome) -> None:
        """This attempt ended as ``outcome`` (the supervisor's of it) says."""
        self.ended, self.state, self.exit_code = outcome.ended, outcome.state.value, outcome.exit_code
        self.cause = outcome.first_failure.describe() if outcome.first_failure else None
        self.first_failure = outcome.first_failure

    def record(self) -> AttemptRecord:
        return AttemptRecord(self.number, tuple(self.nodes), self.started, self.ended, self.state, self.exit_code,
                             self.cause, dict(self.left_out), dict(self.replaced), self.first_failure)

    def to_dict(self) -> dict[str, Any]:
        return self.record().to_dict()

    def describe(self) -> str:
        what = self.state if not self.cause else f"{self.state}: {self.cause}"
        changes = [f"{lost} replaced by {spare}" for lost, spare in self.replaced.items()]
        changes += [f"without {node} ({why})" for node, why in self.left_out.items() if node not in self.replaced]
        return (f"attempt {self.number} on {len(self.nodes)} node(s)" + (f" ({'; '.join(changes)})" if changes else "")
                + f": {what}")


@dataclass(frozen=True)
class Signature:
    """How an attempt failed, to tell a failure that repeats from a new one."""

    rank: int | None
    exit_code: int
    last_lines: tuple[str, ...]


def no_restart(outcome: RunOutcome) -> str | None:
    """Why this outcome is final whatever the restart budget: None when a restart may help."""
    if outcome.first_failure is None:
        return "interrupted" if outcome.interrupted_by is not None else "succeeded"
    if outcome.interrupted_by is not None:
        return "stopped by the user"
    if outcome.first_failure.exit_code == EXIT_TIMEOUT and "time limit" in outcome.first_failure.detail:
        return "it ran past its time limit"
    return None


_NUMBERS = re.compile(r"\d+")


def signature(outcome: RunOutcome, last_lines: Sequence[str]) -> Signature | None:
    """The failure as it repeats: numbers in the last lines (times, pids, step and attempt counts) and their order
    (stdout and stderr interleave as they please) do not count."""
    failure = outcome.first_failure
    if failure is None:
        return None
    return Signature(failure.rank, failure.exit_code,
                     tuple(sorted(_NUMBERS.sub("#", line.rstrip()) for line in last_lines)))


def untrusted_nodes(outcome: RunOutcome) -> dict[str, str]:
    """Nodes of a failed attempt that should not be trusted with the next one, and why."""
    lost = {name: "its agent stopped answering (node down or unreachable)" for name, node in outcome.nodes.items()
            if node.state is RankState.unknown}
    blame, failure = outcome.path_blame, outcome.first_failure
    if blame and failure is not None and blame.get("other_end") not in lost:
        # A dead path to a node that was lost altogether is that node's fault, not the end that saw it die.
        for name in (blame["node"], *blame.get("also", ())):
            lost.setdefault(name, failure.detail if name == failure.node else f"its data path died ({failure.detail})")
    return lost


def notify_start(notifier: Notifier, plan: LaunchPlan, run_dir: str) -> None:
    """``--notify``'s ``start`` document (the run's, not an attempt's)."""
    notifier.send("start", f"clusterrun: run {plan.run_id} started on {plan.nnodes} node(s), {plan.world_size} "
                           "rank(s)", run_id=plan.run_id, state="running", nodes=[n.name for n in plan.nodes],
                  run_dir=run_dir)


def notify_end(notifier: Notifier, outcome: RunOutcome, plan: LaunchPlan, run_dir: str) -> None:
    """``--notify``'s ``end`` document: how the run ended, after how long, its first failure."""
    failure = outcome.first_failure
    duration = (outcome.ended or time.time()) - outcome.started
    text = (f"clusterrun: run {plan.run_id} {outcome.state.value} after {duration:.0f}s (exit code "
            f"{outcome.exit_code})" + (f": {failure.describe()}" if failure else ""))
    notifier.send("end", text, run_id=plan.run_id, state=outcome.state.value, exit_code=outcome.exit_code,
                  nodes=[n.name for n in plan.nodes], first_failure=failure.to_dict() if failure else None,
                  run_dir=run_dir, duration=duration, logs_complete=outcome.logs_complete)


#: Seconds before the first restart at most, doubling after it (``--restart-backoff``): at most a minute.
MAX_BACKOFF = 60.0


def backoff(restart: int, base: float) -> float:
    """Seconds to wait before restart number ``restart`` (1, 2, ...): doubling from ``base``, at most a minute."""
    return min(base * (2 ** max(restart - 1, 0)), MAX_BACKOFF) if base > 0 else 0.0


@dataclass(frozen=True)
class Decision:
    """Whether a failed attempt is started again; when not, the note that says why (None: nothing to say)."""

    restart: bool
    note: str | None
    signature: Signature | None  # the failure as it repeats, to compare the next attempt's with


def next_attempt(outcome: RunOutcome, number: int, max_restarts: int, last: Signature | None,
                 last_lines: Sequence[str]) -> Decision:
    """After attempt ``number`` ended with ``outcome``: restart, or not and why. The one rule for an attached run
    and a detached run's supervisor: no restart after a success, a stop by the user or the time limit, nor when
    none is left, nor when this attempt failed exactly as the one before (same rank, code and last lines)."""
    final = no_restart(outcome)
    if final is not None or number >= max_restarts:
        note = f"no restart left (--max-restarts {max_restarts})" if final is None and max_restarts else None
        return Decision(False, note, last)
    failure = outcome.first_failure
    assert failure is not None
    sig = signature(outcome, last_lines if failure.rank is not None else [failure.detail])
    if sig is not None and sig == last:
        return Decision(False, f"not restarted: attempts {number - 1} and {number} failed the same way "
                               f"({failure.describe()}, the same last lines); a restart cannot fix that: fix the "
                               "script or its data, then start again", sig)
    return Decision(True, None, sig)


def whole_run(outcome: RunOutcome, attempts: Sequence[Attempt], events: Sequence[Mapping[str, Any]],
              listed: bool) -> RunRecord:
    """The run's record over all its attempts, from the last one's ``outcome``: every attempt's events, the attempts
    themselves when the run may restart (``listed``), and after a restart the first failure of all, each attempt
    described first in the notes (``outcome``'s notes get them too, for the summary)."""
    record = outcome.record().replace(events=tuple(events),
                                      attempts=tuple(a.record() for a in attempts) if listed else ())
    if len(attempts) > 1:
        outcome.notes[:0] = [a.describe() for a in attempts]
        first = next((a.first_failure for a in attempts if a.first_failure is not None), None)
        record = record.replace(notes=tuple(outcome.notes), first_failure=first)
    return record
