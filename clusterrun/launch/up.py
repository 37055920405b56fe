"""Execute a launch plan: run directory, transports, the supervisor, the status file."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from clusterrun import redact
from clusterrun.agents.link import AgentLink
from clusterrun.errors import ClusterrunError, GpusLeased, StartError
from clusterrun.inventory.models import Inventory
from clusterrun.inventory.models import Transport as TransportKind
from clusterrun.launch.console import Console
from clusterrun.launch.outcome import (
    CannotContinue,
    RankState,
    Signature,
    backoff,
    next_attempt,
    notify_end,
    notify_start,
    recompose,
    untrusted_nodes,
    whole_run,
)
from clusterrun.launch.pathcheck import FullCheck, check_paths
from clusterrun.launch.ready import GpuWait, NodeReady, check_ready, drop, image_lines, remove_archives
from clusterrun.launch.recover import complete_logs, sweep_nodes
from clusterrun.launch.settings import LaunchRequest
from clusterrun.launch.supervisor import Supervisor
from clusterrun.notify import Notifier
from clusterrun.planning.complete import plan_with_facts, with_restarts
from clusterrun.planning.plan import JobSpec, LaunchPlan, build_plan
from clusterrun.runs import NodeRecord, RunDir, RunRecord, RunState, new_run_id, read_record, write_record
from clusterrun.runs.record import AttemptRecord, tag_events
from clusterrun.runs.timeline import Timeline, slow_phases
from clusterrun.transport.base import Transport
from clusterrun.transport.early import EarlyConnections
from clusterrun.transport.factory import transport_for
from clusterrun.waits import ctrl_c_whole


def _new_run_dir(runs_dir: str | Path, inv: Inventory, plan: LaunchPlan) -> tuple[RunDir, LaunchPlan]:
    """The run's directory; on the rare id collision (two runs started in the same second drew the same
    suffix), a new id and the plan made again with it."""
    for _ in range(8):
        try:
            return RunDir.create(runs_dir, plan.run_id), plan
        except FileExistsError:
            plan = build_plan(inv, dataclasses.replace(plan.job, run_id=new_run_id()))
    raise ClusterrunError(f"cannot find a free run id in {runs_dir} (8 tries); is something creating run "
                          "directories there?")


def execute(inv: Inventory, plan: LaunchPlan, runs_dir: Path, console: Console,
            request: LaunchRequest | None = None, *, full_check: FullCheck | None = None,
            early: EarlyConnections | None = None, on_attempt: Callable[[Path], None] | None = None,
            on_open: Callable[[RunDir], None] | None = None) -> tuple[RunRecord | None, RunDir]:
    """Run ``plan`` as ``request`` asks (:class:`LaunchRequest`; its defaults without one). Returns the outcome (of
    the last attempt) and the run directory really used (a new id after a collision, see ``on_open``).

    Before each attempt: preflight (every node ready), the plan completed from the nodes' facts, and the
    connectivity check of ``request.preflight``. With ``request.detach`` the job is started and left running on
    its own: the outcome is None. With ``request.restarts`` a failed attempt is started again (see
    :mod:`clusterrun.launch.outcome` for when not) after what is left of it is gone from every node; nodes
    that were lost or fail the checks are replaced by spares or left out (:func:`recompose`). ``full_check``:
    doctor's network checks, for ``--preflight full``. ``early``: the nodes' connections, under way since the
    plan was made (closed here at the end). ``on_attempt``: called with the run directory after each failed
    attempt that is restarted (its page is written there); ``on_open``: with the run directory once it exists.

    Raises :class:`StartError` when the first attempt could not be started (then nothing runs anywhere).
    ``status.json`` always ends up describing what happened, written atomically.
    """
    request = request or LaunchRequest()
    plan = with_restarts(inv, plan, request.restarts.max_restarts)
    try:
        run_dir, plan = _new_run_dir(runs_dir, inv, plan)
        if on_open is not None:
            on_open(run_dir)
        run_dir.write_json("plan.json", plan.to_dict())
        # How to reach the nodes again later (`clusterrun down`, `logs -f`), whatever the source of the nodes was.
        run_dir.write_json("inventory.json",
                           redact.inventory_dump(inv.model_dump(mode="json", exclude_defaults=True)))
        write_record(run_dir, RunRecord(run_dir.run_id, RunState.starting, started=time.time(), pid=os.getpid()))
    except OSError as exc:  # nothing has started: say where and why, and start nothing
        raise ClusterrunError(f"cannot write the run directory in {runs_dir}: {exc.strerror or exc}; free space "
                              "there or choose another with --runs-dir") from exc
    run = _Run(inv, run_dir, console, request, full_check, early, on_attempt)
    try:
        return run.first(plan)
    finally:
        remove_archives()
        for transport in [*run.transports.values(), *([early] if early else [])]:
            transport.close()  # the early connections' threads too


def _links(ready: Mapping[str, NodeReady]) -> dict[str, AgentLink]:
    """The nodes' agents, started by the ready check and waiting for the job."""
    links = {name: r.link for name, r in ready.items()}
    missing = [name for name, link in links.items() if link is None]
    if missing:
        raise ClusterrunError(f"no node agent for {', '.join(missing)} (the ready check did not start one)")
    return {name: link for name, link in links.items() if link is not None}


class _Run:
    """The attempts of one run, from the first start to the last outcome."""

    def __init__(self, inv: Inventory, run_dir: RunDir, console: Console, request: LaunchRequest,
                 full_check: FullCheck | None, early: EarlyConnections | None = None,
                 on_attempt: Callable[[Path], None] | None = None) -> None:
        self.inv, self.run_dir, self.console, self.request = inv, run_dir, console, request
        self.settings, self.restarts = request.supervision, request.restarts
        self.full_check, self.notifier = full_check, Notifier(request.notify)
        self.early = early  # the first attempt's connections, under way
        self.on_attempt = on_attempt
        self.timeline = Timeline()  # the current attempt's launch, node by node
        self.transports: dict[str, Transport] = {}
        self.spares = [n.name for n in inv.nodes if n.spare]
        self.attempts: list[AttemptRecord] = []
        self.events: tuple[dict[str, object], ...] = ()  # of every attempt that ended, in order

    def first(self, plan: LaunchPlan) -> tuple[RunRecord | None, RunDir]:
        detach = self.request.detach
        try:
            with ctrl_c_whole():  # a Ctrl-C that tore a lock's wait is recorded as Ctrl-C (clusterrun.waits)
                nodes = [n.name for n in plan.nodes]
                if detach and self.restarts.max_restarts and self.spares:  # checked now, to stand by on the cluster
                    plan = self._planned(nodes, self.spares, plan.job)
                plan, ready, attempt = self._prepare(plan, AttemptRecord(0, nodes))
                if detach:
                    self._detach(plan, ready)
                    return None, self.run_dir
                notify_start(self.notifier, plan, str(self.run_dir.path))
                outcome = self._run(plan, ready, attempt)
        except StartError as exc:
            self._write(read_record(self.run_dir).replace(state=RunState.not_started, pid=None, ended=time.time(),
                                                          problems=dict(exc.problems)))
            raise
        except KeyboardInterrupt:
            current = read_record(self.run_dir)
            if current.state is RunState.starting:
                self._write(current.replace(state=RunState.interrupted, pid=None, ended=time.time(),
                                            detail="interrupted before the job started (Ctrl-C during the checks)"))
            raise
        except ClusterrunError as exc:
            current = read_record(self.run_dir)
            if current.state is RunState.starting:
                self._write(current.replace(state=RunState.not_started, pid=None, ended=time.time(),
                                            problems={"clusterrun": str(exc)}))
            raise
        outcome, plan = self._restarts(plan, outcome)
        self._finish(outcome)
        notify_end(self.notifier, outcome, plan, str(self.run_dir.path))
        for missed in self.notifier.close():  # waits a second at most: a slow webhook never holds the run
            self.console.info(f"--notify {missed.url}: the {missed.event!r} document "
                              + (f"was not delivered ({missed.error})" if missed.error else "was still on its way"))
        return outcome, self.run_dir

    def _detach(self, plan: LaunchPlan, ready: Mapping[str, NodeReady]) -> None:
        """Hand the checked run to its supervisor on rank 0's node (clusterrun/detached/start.py)."""
        from clusterrun.detached.start import SUPERVISOR_FILE, start_on_cluster

        started = time.time()
        host = start_on_cluster(plan, _links(ready), self.transports[plan.master.name],
                                {name: r.stage for name, r in ready.items()}, self.settings,
                                self.notifier.urls, started, self.restarts, self.console.folds)
        self.run_dir.write_json(SUPERVISOR_FILE, host.to_dict())
        self._write(read_record(self.run_dir).replace(
            state=RunState.detached, started=started, pid=None, detached=True,
            nodes={n.name: NodeRecord(timeline=self.timeline.of(n.name)) for n in plan.nodes}))

    # ------------------------------------------------------------ one attempt

    def _prepare(self, plan: LaunchPlan,
                 attempt: AttemptRecord) -> tuple[LaunchPlan, dict[str, NodeReady], AttemptRecord]:
        """Check the attempt's nodes and complete its plan. A node that fails the checks is replaced by a spare or
        left out (with ``--min-nodes``) and the others are checked again; otherwise :class:`StartError`."""
        wait = self.request.wait_gpus
        waits = GpuWait(wait, self.console.info) if wait is not None else None
        drops = 0
        while drops <= len(self.inv.nodes):
            self._open(plan)
            if any(n.transport is not TransportKind.local for n in plan.nodes):
                self.console.info(f"checking {plan.nnodes} node(s)...")
            self.timeline, early, self.early = Timeline(), self.early, None
            try:
                ready = check_ready(plan, self.transports, self.timeline, early,
                                    lambda node, what: self.console.info(f"{node}: {what}"))
            except StartError as exc:
                standby = [n.name for n in plan.nodes if n.name not in attempt.nodes]
                gone = {n: why for n, why in exc.problems.items() if n in standby}
                for name, why in gone.items():
                    self.console.info(f"spare {name} failed its checks ({why}): it does not stand by for this run")
                if gone:
                    plan = self._planned(attempt.nodes, [n for n in standby if n not in gone], plan.job)
                    continue
                failed = {n: why for n, why in exc.problems.items() if n in attempt.nodes}
                if not failed or len(failed) < len(exc.problems) or not (self.restarts.may_drop or self.spares):
                    raise
                plan, attempt = self._without(plan, attempt, failed, exc)
                drops += 1
                continue
            try:
                inv, plan = plan_with_facts(self._inventory([n.name for n in plan.nodes]), plan, ready)
                self.run_dir.write_json("plan.json", plan.to_dict())
                for line in plan.probed:
                    self.console.info(f"from the node: {line}")
                for warning in plan.warnings:
                    self.console.info(f"warning: {warning}")
                began = time.time()
                check_paths(inv, plan, self.transports, _links(ready), self.run_dir, self.console,
                            self.request.preflight, self.full_check)
                self.timeline.span(ready, "pathcheck", began, time.time(), mode=self.request.preflight.value)
            except GpusLeased as exc:  # other runs hold GPUs this one needs: refused, or queued (--wait-gpus)
                drop(ready)
                if waits is None or not waits.again(exc):
                    raise
                continue
            except BaseException:
                drop(ready)  # every agent waits for a job that will not come
                raise
            for line in image_lines(plan, ready):
                self.console.info(line)
            copied = sum(len(r.copied) for r in ready.values())
            if copied:
                self.console.info(f"copied {copied} file(s) to the nodes")
            standby = [n.name for n in plan.nodes if n.name not in attempt.nodes]
            if standby:  # checked with the nodes; the job runs on the nodes, the spares wait
                if plan.master.name in standby:
                    drop(ready)
                    raise StartError({plan.master.name: "a spare node would be the run's master"},
                                     hint="give the nodes' ranks so that a node, not a spare, is rank 0")
                plan = dataclasses.replace(plan.on_nodes([n.name for n in plan.nodes if n.name not in standby],
                                                         standby), spares=tuple(self.spares))
                self.run_dir.write_json("plan.json", plan.to_dict())
            return plan, ready, attempt
        raise StartError({"nodes": "every node failed the checks"}, hint="no node was started")

    def _without(self, plan: LaunchPlan, attempt: AttemptRecord, drop: Mapping[str, str],
                 cause: StartError) -> tuple[LaunchPlan, AttemptRecord]:
        try:
            nodes, replaced, left_out = recompose(attempt.nodes, self.spares, drop, self.restarts.min_nodes)
        except CannotContinue as exc:
            raise StartError(cause.problems, hint=f"{exc}; no node was started") from None
        for lost, why in left_out.items():
            self.console.info(f"{lost} is left out of attempt {attempt.number} ({why})"
                              + (f"; spare {replaced[lost]} takes its place" if lost in replaced else ""))
        attempt = AttemptRecord(attempt.number, nodes, left_out={**attempt.left_out, **left_out},
                                replaced={**attempt.replaced, **replaced})
        return build_plan(self._inventory(nodes), plan.job), attempt

    def _run(self, plan: LaunchPlan, ready: Mapping[str, NodeReady], attempt: AttemptRecord) -> RunRecord:
        supervisor = Supervisor(plan, _links(ready), self.run_dir, self.console, self.settings,
                                stage={name: r.stage for name, r in ready.items()}, notifier=self.notifier,
                                timeline=self.timeline)
        attempt.started = supervisor.outcome.started
        self.attempts.append(attempt)
        # The record of the whole run so far: the earlier attempts and their events (the supervisor adds this
        # one's events as they come).
        self._write(RunRecord(self.run_dir.run_id, RunState.running, started=self.attempts[0].started,
                              pid=os.getpid(), events=self.events, attempts=self._attempt_records()))
        self.console.info(f"run {plan.run_id}: {plan.nnodes} node(s), {plan.world_size} rank(s), "
                          f"logs in {self.run_dir.path}/" + (f" (attempt {attempt.number})" if attempt.number else ""))
        outcome = supervisor.run()
        outcome.notes += [f"slow launch: {s}" for s in slow_phases({n: o.timeline for n, o in outcome.nodes.items()})]
        complete_logs(plan, self.transports, self.run_dir, outcome, supervisor.relay, self.console,
                      grace=self.settings.grace, heartbeat_timeout=self.settings.heartbeat_timeout)
        attempt.ended_with(outcome)
        self.events += tag_events(outcome.events, attempt.number) if self.restarts.max_restarts else tuple(
            outcome.events)
        return outcome

    # ------------------------------------------------------------ restarts

    def _restarts(self, plan: LaunchPlan, outcome: RunRecord) -> tuple[RunRecord, LaunchPlan]:
        last: Signature | None = None
        while True:
            attempt = self.attempts[-1]
            failure = outcome.first_failure
            tail = self.run_dir.tail(failure.node, failure.rank, 5) if failure and failure.rank is not None else []
            decision = next_attempt(outcome, attempt.number, self.restarts.max_restarts, last, tail)
            if not decision.restart:
                if decision.note:
                    outcome.notes.append(decision.note)
                    if decision.signature is not None and decision.signature == last:
                        self.console.info(decision.note)
                return outcome, plan
            last = decision.signature
            try:
                with ctrl_c_whole():
                    plan, outcome = self._again(plan, outcome, attempt)
            except (StartError, CannotContinue) as exc:
                why = f"{exc}" if isinstance(exc, CannotContinue) else "; ".join(
                    f"{n}: {w}" for n, w in exc.problems.items())
                outcome.notes.append(f"could not start attempt {attempt.number + 1}: {why}")
                self.console.info(outcome.notes[-1])
                return outcome, plan
            except KeyboardInterrupt:
                outcome.interrupted_by = outcome.interrupted_by or 2
                outcome.notes.append(f"interrupted before attempt {attempt.number + 1} started")
                return outcome, plan

    def _again(self, plan: LaunchPlan, outcome: RunRecord, attempt: AttemptRecord) -> tuple[LaunchPlan, RunRecord]:
        number = attempt.number + 1
        lost = untrusted_nodes(outcome)
        # A node whose agent fell silent is not waited for (its agent stops the job there by itself, and it is
        # left out); every other node is checked for leftovers before the next attempt starts.
        silent = {n for n, o in outcome.nodes.items() if o.state is RankState.unknown}
        reachable = dataclasses.replace(plan, nodes=tuple(n for n in plan.nodes if n.name not in silent))
        swept, unchecked = sweep_nodes(reachable, self.transports, self.settings.grace)
        for node, count in swept.items():
            if count:
                self.console.info(f"{node}: stopped {count} leftover process(es) of attempt {attempt.number}")
        for node, why in unchecked.items():
            lost.setdefault(node, f"could not be checked for leftovers ({why})")
        nodes, replaced, left_out = (recompose(attempt.nodes, self.spares, lost, self.restarts.min_nodes) if lost
                                     else (list(attempt.nodes), {}, {}))
        wait = backoff(number, self.restarts.backoff)
        self.console.info(f"attempt {attempt.number} failed ({attempt.cause}); restarting in {wait:g}s "
                          f"(restart {number} of {self.restarts.max_restarts})"
                          + "".join(f"; {n} left out ({why})" + (f", spare {replaced[n]} takes its place"
                                                                  if n in replaced else "")
                                    for n, why in left_out.items()))
        self.notifier.send("restart", f"clusterrun: run {plan.run_id} attempt {attempt.number} failed "
                                      f"({attempt.cause}); restarting", run_id=plan.run_id, attempt=number)
        self.run_dir.archive_attempt(attempt.number)
        if self.on_attempt is not None:
            self.on_attempt(self.run_dir.path)
        time.sleep(wait)
        job = dataclasses.replace(plan.job, attempt=number)
        plan = build_plan(self._inventory(nodes), job)
        plan, ready, next_attempt = self._prepare(plan, AttemptRecord(number, nodes, left_out=left_out,
                                                                      replaced=replaced))
        return plan, self._run(plan, ready, next_attempt)

    # ------------------------------------------------------------ helpers

    def _planned(self, nodes: Sequence[str], standby: Sequence[str], job: JobSpec) -> LaunchPlan:
        """The plan of ``nodes`` with ``standby`` planned beside them (after them in rank order), checked with them
        and split off by :meth:`LaunchPlan.on_nodes` once checked; without them where they would move the master."""
        plan = build_plan(self._inventory([*nodes, *standby]), job)
        if standby and (plan.master.name != nodes[0] or
                        [n.name for n in plan.nodes if n.name in nodes] != list(nodes)):
            self.console.info(f"spare node(s) {', '.join(standby)} do not stand by: the rank order would change the "
                              "run's master or node order with them")
            return build_plan(self._inventory(nodes), job)
        return plan

    def _inventory(self, names: Sequence[str]) -> Inventory:
        """The inventory with the given nodes, in this order (spares become ordinary nodes)."""
        by_name = {n.name: n for n in self.inv.nodes}
        nodes = [by_name[name] for name in names]
        if any(n.spare for n in nodes):
            nodes = [n.model_copy(update={"spare": False}) for n in nodes]
        return self.inv.model_copy(update={"nodes": nodes})

    def _open(self, plan: LaunchPlan) -> None:
        """A transport for each node of ``plan`` that has none yet (a spare joining); open ones are kept."""
        nodes, made = {n.name: n for n in self.inv.nodes}, self.early.transports if self.early else {}
        for node in plan.nodes:
            if node.name not in self.transports:
                self.transports[node.name] = made.get(node.name) or transport_for(self.inv, nodes[node.name])

    def _attempt_records(self) -> tuple[AttemptRecord, ...]:
        """Every attempt so far, for a run that may restart (a run that may not has only one: none listed)."""
        return tuple(self.attempts) if self.restarts.max_restarts else ()

    def _write(self, record: RunRecord) -> None:
        write_record(self.run_dir, record)

    def _finish(self, outcome: RunRecord) -> None:
        """The run's end, over all its attempts: from the first start to the last end, every attempt's events, and
        the first failure of all (the last attempt's own stays in ``attempts``). ``outcome`` (the last attempt's)
        gets the run's start, so that its summary and ``--notify`` say how long the whole run took."""
        outcome.started = self.attempts[0].started if self.attempts else outcome.started
        record = whole_run(outcome, self.attempts, self.events, bool(self.restarts.max_restarts))
        try:
            self._write(record)
        except OSError as exc:
            self.console.info(f"cannot write {self.run_dir.path}/status.json: {exc.strerror or exc}; the summary "
                              "below is the run's only record")
