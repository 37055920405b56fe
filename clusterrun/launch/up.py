"""Execute a launch plan: run directory, transports, the supervisor, the status file."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from clusterrun import redact
from clusterrun.errors import ClusterrunError, StartError, UsageError
from clusterrun.inventory.models import Inventory
from clusterrun.inventory.models import Transport as TransportKind
from clusterrun.launch.console import Console
from clusterrun.launch.detach import start_detached
from clusterrun.launch.outcome import RunOutcome
from clusterrun.launch.pathcheck import quick_check
from clusterrun.launch.ready import check_ready, remove_archives
from clusterrun.launch.recover import complete_logs
from clusterrun.launch.replan import plan_with_facts
from clusterrun.launch.supervisor import Supervisor, SupervisorSettings
from clusterrun.notify import Notifier
from clusterrun.plan import LaunchPlan, build_plan
from clusterrun.runs import RunDir, RunState, new_run_id
from clusterrun.transport.base import Transport
from clusterrun.transport.factory import open_transports

PREFLIGHT_MODES = ("quick", "full", "off")
PATH_HINT = ("no node was started; `clusterrun doctor <inventory> --checks net` shows more; `--preflight off` skips "
             "this check (if ICMP is blocked on purpose, for example)")


#: ``--preflight full``: the network checks of ``clusterrun doctor`` (:func:`clusterrun.doctor.gate.full_check`),
#: given by the caller: (inventory, transports, report directory) -> (failures, report directory).
FullCheck = Callable[[Inventory, Mapping[str, Transport], Path], tuple[list[str], Path]]


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


def check_paths(inv: Inventory, plan: LaunchPlan, transports: dict[str, Transport], run_dir: RunDir,
                console: Console, mode: str, full_check: FullCheck | None = None) -> None:
    """The connectivity check before the start (``--preflight``); its result goes to preflight.json."""
    record: dict[str, object] = {"mode": mode}
    try:
        if mode == "off" or plan.nnodes < 2:
            record["skipped"] = "--preflight off" if mode == "off" else "single node"
            return
        if mode == "full":
            if full_check is None:
                raise UsageError("--preflight full needs doctor's network checks, which this caller did not give")
            console.info("running doctor's network checks (--preflight full)...")
            failures, where = full_check(inv, transports, run_dir.path / "doctor")
            record["doctor"] = {"report": str(where), "failures": failures}
            if failures:
                raise StartError({f"doctor {i + 1}": f for i, f in enumerate(failures)},
                                 hint=f"report in {where}/; {PATH_HINT}")
        report = quick_check(plan, transports)
        record.update(report.to_dict())
        for note in report.notes:
            console.info(note)
        if report.problems:
            raise StartError(report.problems, hint=PATH_HINT)
        console.info(f"network paths to {plan.master.name} ok ({report.seconds:.1f}s)")
    finally:
        run_dir.write_json("preflight.json", record)


def _notify_end(notifier: Notifier, outcome: RunOutcome, plan: LaunchPlan, run_dir: RunDir, console: Console) -> None:
    failure = outcome.first_failure
    duration = (outcome.ended or time.time()) - outcome.started
    text = (f"clusterrun: run {plan.run_id} {outcome.state.value} after {duration:.0f}s (exit code "
            f"{outcome.exit_code})" + (f": {failure.describe()}" if failure else ""))
    notifier.send("end", text, run_id=plan.run_id, state=outcome.state.value, exit_code=outcome.exit_code,
                  nodes=[n.name for n in plan.nodes], first_failure=failure.to_dict() if failure else None,
                  run_dir=str(run_dir.path), duration=duration, logs_complete=outcome.logs_complete)
    for missed in notifier.close():  # waits a second at most: a slow webhook never holds the run
        console.info(f"--notify {missed.url}: the {missed.event!r} document "
                     + (f"was not delivered ({missed.error})" if missed.error else "was still on its way"))


def execute(inv: Inventory, plan: LaunchPlan, runs_dir: Path, console: Console,
            settings: SupervisorSettings | None = None, preflight_mode: str = "quick",
            detach: bool = False, full_check: FullCheck | None = None,
            notify: Sequence[str] = ()) -> tuple[RunOutcome | None, RunDir]:
    """Run ``plan`` to its end. Returns the outcome and the run directory.

    Before the start: preflight (every node ready), the plan completed from the nodes' facts, and the
    connectivity check of ``preflight_mode`` (quick, full or off). With ``detach`` the job is started and
    left running on its own: the outcome is None.

    Raises :class:`StartError` when a node could not be started (then nothing runs anywhere).
    ``status.json`` always ends up describing what happened, written atomically.
    """
    try:
        run_dir, plan = _new_run_dir(runs_dir, inv, plan)
        run_dir.write_json("plan.json", plan.to_dict())
        # How to reach the nodes again later (`clusterrun down`, `logs -f`), whatever the source of the nodes was.
        run_dir.write_json("inventory.json",
                           redact.inventory_dump(inv.model_dump(mode="json", exclude_defaults=True)))
        run_dir.write_status(RunState.starting, {"started": time.time(), "pid": os.getpid()})
    except OSError as exc:  # nothing has started: say where and why, and start nothing
        raise ClusterrunError(f"cannot write the run directory in {runs_dir}: {exc.strerror or exc}; free space "
                              "there or choose another with --runs-dir") from exc
    transports = open_transports(inv, plan)
    try:
        try:
            if any(n.transport is TransportKind.ssh for n in plan.nodes):
                console.info(f"checking {plan.nnodes} node(s)...")
            ready = check_ready(plan, transports)
            inv, plan = plan_with_facts(inv, plan, ready)
            run_dir.write_json("plan.json", plan.to_dict())
            for line in plan.probed:
                console.info(f"from the node: {line}")
            for warning in plan.warnings:
                console.info(f"warning: {warning}")
            check_paths(inv, plan, transports, run_dir, console, preflight_mode, full_check)
            copied = sum(len(r.copied) for r in ready.values())
            if copied:
                console.info(f"copied {copied} file(s) to the nodes")
            if detach:
                launched = start_detached(plan, transports, {name: r.stage for name, r in ready.items()},
                                          (settings or SupervisorSettings()).grace)
                run_dir.write_status(RunState.detached, {"started": time.time(),
                                                         "nodes": {n: {"launched": t} for n, t in launched.items()}})
                return None, run_dir
            notifier = Notifier(notify)
            supervisor = Supervisor(plan, transports, run_dir, console, settings,
                                    stage={name: r.stage for name, r in ready.items()}, notifier=notifier)
            run_dir.write_status(RunState.running, {"started": time.time(), "pid": os.getpid()})
            console.info(f"run {plan.run_id}: {plan.nnodes} node(s), {plan.world_size} rank(s), "
                         f"logs in {run_dir.path}/")
            notifier.send("start", f"clusterrun: run {plan.run_id} started on {plan.nnodes} node(s), "
                                   f"{plan.world_size} rank(s)", run_id=plan.run_id, state="running",
                          nodes=[n.name for n in plan.nodes], run_dir=str(run_dir.path))
            outcome = supervisor.run()
            complete_logs(plan, transports, run_dir, outcome, supervisor.relay, console,
                          grace=supervisor.settings.grace, heartbeat_timeout=supervisor.settings.heartbeat_timeout)
        except StartError as exc:
            run_dir.write_status(RunState.not_started, {"problems": exc.problems, "ended": time.time()})
            raise
        except KeyboardInterrupt:
            if run_dir.read_json_or_empty("status.json").get("state") == RunState.starting.value:
                run_dir.write_status(RunState.interrupted, {"ended": time.time(), "detail": "interrupted before "
                                                            "the job started (Ctrl-C during the checks)"})
            raise
        except ClusterrunError as exc:
            if run_dir.read_json_or_empty("status.json").get("state") == RunState.starting.value:
                run_dir.write_status(RunState.not_started, {"problems": [str(exc)], "ended": time.time()})
            raise
        try:
            run_dir.write_status(outcome.state, outcome.to_dict())
        except OSError as exc:
            console.info(f"cannot write {run_dir.path}/status.json: {exc.strerror or exc}; the summary below is the "
                         "run's only record")
        _notify_end(notifier, outcome, plan, run_dir, console)
        return outcome, run_dir
    finally:
        remove_archives()
        for transport in transports.values():
            transport.close()
