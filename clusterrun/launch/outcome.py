"""What happened to a run (its :class:`~clusterrun.runs.record.RunRecord`, kept by the supervisor) and what follows:
whether a failed attempt is started again, on which nodes, and the run's record over all its attempts.

A failed attempt is started again (``--max-restarts``) unless a restart cannot help: the user stopped it,
it ran past its time limit, or it failed the same way twice in a row (the same rank, exit code and last
lines: a bug in the script, a missing file). :func:`untrusted_nodes` says which nodes the next attempt should
not be trusted with.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clusterrun.errors import EXIT_TIMEOUT
from clusterrun.notify import Notifier
from clusterrun.planning.planfile import LaunchPlan
from clusterrun.runs.record import AttemptRecord, Failure, RankState, RunRecord

__all__ = ["CannotContinue", "Failure", "RankState", "Signature", "logs_summary", "no_restart", "signature",
           "untrusted_nodes"]


def logs_summary(gaps: Sequence[Mapping[str, Any]] = (), unverified: Sequence[str] = (),
                 received: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """status.json's ``logs`` of a run: whether runs/ holds every rank's output, the gaps, the nodes that never said
    what their logs hold, and the bytes received per node, rank and stream."""
    return {"complete": not gaps and not unverified, "gaps": list(gaps), "unverified": list(unverified),
            "received": dict(received or {})}


@dataclass(frozen=True)
class Signature:
    """How an attempt failed, to tell a failure that repeats from a new one."""

    rank: int | None
    exit_code: int
    last_lines: tuple[str, ...]


def no_restart(outcome: RunRecord) -> str | None:
    """Why this outcome is final whatever the restart budget: None when a restart may help."""
    if outcome.first_failure is None:
        return "interrupted" if outcome.interrupted_by is not None else "succeeded"
    if outcome.interrupted_by is not None:
        return "stopped by the user"
    if outcome.first_failure.exit_code == EXIT_TIMEOUT and "time limit" in outcome.first_failure.detail:
        return "it ran past its time limit"
    return None


_NUMBERS = re.compile(r"\d+")


def signature(outcome: RunRecord, last_lines: Sequence[str]) -> Signature | None:
    """The failure as it repeats: numbers in the last lines (times, pids, step and attempt counts) and their order
    (stdout and stderr interleave as they please) do not count."""
    failure = outcome.first_failure
    if failure is None:
        return None
    return Signature(failure.rank, failure.exit_code,
                     tuple(sorted(_NUMBERS.sub("#", line.rstrip()) for line in last_lines)))


class CannotContinue(Exception):
    """Too few nodes are left to start the job again."""


def recompose(active: Sequence[str], spares: Sequence[str], drop: Mapping[str, str], min_nodes: int | None,
              no_spares: str = "no spare nodes in the inventory") -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The next attempt's nodes in rank order, ``{lost: spare}`` and ``{node: why}`` for those left out.

    A spare takes a dropped node's place in the order (so the master moves to a spare when rank 0's node was
    lost); without a spare the node is left out, as long as ``min_nodes`` remain (None: every node is needed).
    Raises :class:`CannotContinue` otherwise (``no_spares``: why there was no spare, when ``spares`` is empty).
    """
    free = [s for s in spares if s not in active and s not in drop]
    nodes, replaced, left_out = [], {}, {}
    for name in active:
        if name not in drop:
            nodes.append(name)
        elif free:
            replaced[name] = free.pop(0)
            nodes.append(replaced[name])
            left_out[name] = drop[name]
        else:
            left_out[name] = drop[name]
    need = len(active) if min_nodes is None else min_nodes
    if len(nodes) < need:
        gone = "; ".join(f"{n}: {why}" for n, why in left_out.items())
        limit = ("every node is needed (--min-nodes lets the job go on with fewer)" if min_nodes is None
                 else f"--min-nodes is {min_nodes}")
        raise CannotContinue(f"{len(nodes)} node(s) left after leaving out {gone}; {limit}"
                             + ("" if spares else f"; {no_spares}"))
    return nodes, replaced, left_out


def untrusted_nodes(outcome: RunRecord) -> dict[str, str]:
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


def notify_end(notifier: Notifier, outcome: RunRecord, plan: LaunchPlan, run_dir: str) -> None:
    """``--notify``'s ``end`` document: how the run ended, after how long, its first failure."""
    failure = outcome.first_failure
    duration = (outcome.ended or time.time()) - (outcome.started or time.time())
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


def next_attempt(outcome: RunRecord, number: int, max_restarts: int, last: Signature | None,
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


def whole_run(outcome: RunRecord, attempts: Sequence[AttemptRecord], events: Sequence[Mapping[str, Any]],
              listed: bool) -> RunRecord:
    """The run's record over all its attempts, from the last one's ``outcome``: every attempt's events, the attempts
    themselves when the run may restart (``listed``), and after a restart the first failure of all, each attempt
    described first in the notes (``outcome``'s notes get them too, for the summary)."""
    if len(attempts) > 1:
        outcome.notes[:0] = [a.describe() for a in attempts]
    first = next((a.first_failure for a in attempts if a.first_failure is not None), None)
    return outcome.replace(events=tuple(events), attempts=tuple(attempts) if listed else (),
                           first_failure=first if len(attempts) > 1 else outcome.first_failure)
