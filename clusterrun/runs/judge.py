"""How a node and a run ended: one pure judge for attached runs (the supervisor, live) and detached ones
(``clusterrun logs``, from each node's ``exit.json``).

A node's end report (the agent's ``exit`` event, also written as ``exit.json``) says torchrun's exit code and,
per global rank, ``rc``, ``signal``, ``time`` (torchrun's failure time, to the second) and ``root_cause``
(torchrun listed it as the first observed failure). The rules:

* a rank that exited 0, or whose torchrun exited 0 while nothing stopped it, succeeded;
* a rank killed by a signal while another rank of its node was torchrun's root cause was stopped by torchrun:
  not a failure; so is every rank of a node that clusterrun was already stopping (another node had failed);
* otherwise a non-zero code is a failure; of a node's failed ranks the root cause is its failure (else the
  first reported);
* a node whose torchrun failed with no rank to blame failed as a whole (its reason says why);
* the run's first failure is the earliest node failure: by torchrun's failure time (seconds), then by when the
  node ended, then in the order given (plan order).
"""

from __future__ import annotations

import enum
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clusterrun.remote.answers import Exit, RankReport


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


def signal_number(name: str | int | None) -> int | None:
    """The inverse of :func:`signal_name` (None for what it cannot read)."""
    if name is None or isinstance(name, int):
        return name
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


@dataclass(frozen=True)
class RankEnd:
    """How one rank ended, as the judge sees it."""

    rank: int
    state: RankState
    exit_code: int | None = None
    signal: int | None = None
    started: float | None = None
    ended: float | None = None


@dataclass(frozen=True)
class NodeEnd:
    """How one node ended: its ranks, its state, and its failure (None when it did not fail itself)."""

    name: str
    state: RankState
    exit_code: int | None
    reason: str | None
    ended: float | None
    ranks: Mapping[int, RankEnd]
    failure: Failure | None = None
    failed_at: float | None = None  # torchrun's time of the failure (to the second), when it said


_NOTHING = RankReport()  # a rank the end report does not name


def torchrun_time(text: object) -> float | None:
    """torchrun's failure time (``2026-11-25_14:30:01``, the node's local time) as seconds since the epoch."""
    if isinstance(text, (int, float)):
        return float(text)
    try:
        return time.mktime(time.strptime(str(text), "%Y-%m-%d_%H:%M:%S"))
    except (TypeError, ValueError, OverflowError):
        return None


def judge_node(name: str, ranks: Sequence[int], report: Exit, *, stopping: bool,
               failed_early: Mapping[int, RankEnd] | None = None) -> NodeEnd:
    """The end of node ``name`` (global ``ranks``) from its end ``report``. ``stopping``: clusterrun had asked it to
    stop (another node failed first, or the user stopped the run); ``failed_early``: ranks already known to have
    failed while the others ran (the agent said so at once)."""
    failed_early = failed_early or {}
    node_rc = report.rc
    ended = report.time
    reported = {int(k): v for k, v in report.ranks.items() if k.isdigit()}
    root_failed = any(v.root_cause for v in reported.values())
    out: dict[int, RankEnd] = {}
    for rank in ranks:
        info = reported.get(rank, _NOTHING)
        started = info.started
        early = failed_early.get(rank)
        if early is not None:
            out[rank] = RankEnd(rank, RankState.failed, early.exit_code, early.signal, started or early.started,
                                early.ended or ended)
            continue
        code, signum = info.rc, info.signal
        # Killed by a signal while another rank of the node was the root cause: torchrun stopped it.
        stopped_by_torchrun = root_failed and signum and not info.root_cause
        if code == 0 or (code is None and node_rc == 0 and not stopping):
            state, code, signum = RankState.succeeded, 0, None
        elif code is not None and not stopping and not stopped_by_torchrun:
            state = RankState.failed
        else:
            state = RankState.stopped
        out[rank] = RankEnd(rank, state, code, signum, started, ended)
    failed = [r for r in out.values() if r.state is RankState.failed]
    reason = report.reason
    if failed:
        root = next((r for r in failed if reported.get(r.rank, _NOTHING).root_cause), failed[0])
        at = torchrun_time(reported.get(root.rank, _NOTHING).time)
        failure = Failure(name, root.rank, root.exit_code or 1, root.signal, "")
        return NodeEnd(name, RankState.failed, node_rc, reason, ended, out, failure, at)
    if node_rc == 0:
        return NodeEnd(name, RankState.succeeded, node_rc, reason, ended, out)
    if stopping:
        return NodeEnd(name, RankState.stopped, node_rc, reason, ended, out)
    failure = Failure(name, None, node_rc or 1, None, reason or "torchrun failed")
    return NodeEnd(name, RankState.failed, node_rc, reason, ended, out, failure)


def unreported_node(name: str, ranks: Sequence[int], reason: str) -> NodeEnd:
    """A node that left no end report (lost, or its record is gone): its ranks' fate is unknown and it failed."""
    return NodeEnd(name, RankState.unknown, None, reason, None, {r: RankEnd(r, RankState.unknown) for r in ranks},
                   Failure(name, None, 1, None, reason))


def first_failure(nodes: Sequence[NodeEnd]) -> Failure | None:
    """The run's first failure: the earliest of the nodes' failures (see the module's rules); None when none
    failed."""
    failed = [(i, n) for i, n in enumerate(nodes) if n.failure is not None]
    if not failed:
        return None

    def when(item: tuple[int, NodeEnd]) -> tuple[float, float, int]:
        i, node = item
        end = node.ended if node.ended is not None else float("inf")
        at = node.failed_at if node.failed_at is not None else end
        return (int(at) if at != float("inf") else at, end, i)

    return min(failed, key=when)[1].failure


def gpus_left_busy(node: str, report: Mapping[str, Any] | None, gpus: Sequence[int]) -> list[str]:
    """The run's GPUs on ``node`` that a process still holds memory on once the job is over, one sentence each,
    from the node reporter's GPU facts the agent gathered at the end (remote/gpufacts.py; None: not gathered)."""
    from clusterrun.errors import ParseError
    from clusterrun.facts.parsers.nvidia_smi import parse, parse_compute_apps

    if not report or not gpus or not report.get("query") or not report.get("apps"):
        return []
    try:
        by_uuid = {g.uuid: g.index for g in parse(report["query"]).gpus if g.uuid and g.index in gpus}
        apps = parse_compute_apps(report["apps"]).processes
    except ParseError:
        return []
    owners = report.get("owners") or {}
    out = []
    for app in apps:
        if app.gpu_uuid in by_uuid and (app.used_memory_mib or 0) > 0:
            owner = owners.get(str(app.pid)) or {}
            who = ", ".join(x for x in (owner.get("user"), f"run {owner['run_id']}" if owner.get("run_id") else None) if x)
            out.append(f"{node}: GPU {by_uuid[app.gpu_uuid]} still has {app.used_memory_mib} MiB used by pid {app.pid} "
                       f"({app.process_name or '?'}{', ' + who if who else ''}) after the run; it slows or blocks the "
                       "next job there: stop it (`clusterrun ps` shows what runs on the nodes)")
    return out
