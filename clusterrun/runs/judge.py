"""How a node and a run ended: one pure judge for attached runs (the supervisor, live) and detached ones
(``clusterrun logs``, from each node's ``exit.json``).

A node's end report (the agent's ``exit`` event, also written as ``exit.json``) says torchrun's exit code and,
per global rank, ``rc``, ``signal``, ``time`` (torchrun's failure time, to the second) and ``root_cause``
(torchrun listed it as the first observed failure). The judge speaks in the run record's types
(:mod:`clusterrun.runs.record`): a node's end is a :class:`NodeRecord` with its ranks and its own failure. The rules:

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

import time
from collections.abc import Mapping, Sequence
from typing import Any

from clusterrun.remote.answers import Exit, RankReport
from clusterrun.runs.record import Failure, NodeRecord, RankRecord, RankState

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
               failed_early: Mapping[int, RankRecord] | None = None) -> NodeRecord:
    """The end of node ``name`` (global ``ranks``, in local rank order) from its end ``report``. ``stopping``:
    clusterrun had asked it to stop (another node failed first, or the user stopped the run); ``failed_early``: ranks
    already known to have failed while the others ran (the agent said so at once)."""
    failed_early = failed_early or {}
    node_rc = report.rc
    ended = report.time
    reported = {int(k): v for k, v in report.ranks.items() if k.isdigit()}
    root_failed = any(v.root_cause for v in reported.values())
    out: dict[int, RankRecord] = {}
    for local, rank in enumerate(ranks):
        info = reported.get(rank, _NOTHING)
        started = info.started
        early = failed_early.get(rank)
        if early is not None:
            out[rank] = RankRecord(rank, local, RankState.failed, early.exit_code, early.signal,
                                   started or early.started, early.ended or ended)
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
        out[rank] = RankRecord(rank, local, state, code, signum, started, ended)
    failed = [r for r in out.values() if r.state is RankState.failed]
    reason = report.reason
    if failed:
        root = next((r for r in failed if reported.get(r.rank, _NOTHING).root_cause), failed[0])
        at = torchrun_time(reported.get(root.rank, _NOTHING).time)
        failure = Failure(name, root.rank, root.exit_code or 1, root.signal, "")
        return NodeRecord(RankState.failed, node_rc, reason, ended=ended, ranks=out, failure=failure, failed_at=at)
    if node_rc == 0 or stopping:
        return NodeRecord(RankState.succeeded if node_rc == 0 else RankState.stopped, node_rc, reason, ended=ended,
                          ranks=out)
    failure = Failure(name, None, node_rc or 1, None, reason or "torchrun failed")
    return NodeRecord(RankState.failed, node_rc, reason, ended=ended, ranks=out, failure=failure)


def unreported_node(name: str, ranks: Sequence[int], reason: str) -> NodeRecord:
    """A node that left no end report (lost, or its record is gone): its ranks' fate is unknown and it failed."""
    return NodeRecord(RankState.unknown, None, reason, ranks={r: RankRecord(r, i, RankState.unknown)
                                                              for i, r in enumerate(ranks)},
                      failure=Failure(name, None, 1, None, reason))


def first_failure(nodes: Sequence[NodeRecord]) -> Failure | None:
    """The run's first failure: the earliest of the nodes' failures (see the module's rules); None when none
    failed."""
    failed = [(i, n) for i, n in enumerate(nodes) if n.failure is not None]
    if not failed:
        return None

    def when(item: tuple[int, NodeRecord]) -> tuple[float, float, int]:
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
