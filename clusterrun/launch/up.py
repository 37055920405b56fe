"""Execute a launch plan: run directory, transports, the supervisor, the status file."""

from __future__ import annotations

import time
from pathlib import Path

from clusterrun.errors import StartError
from clusterrun.inventory.models import Inventory
from clusterrun.inventory.models import Transport as TransportKind
from clusterrun.launch.console import Console
from clusterrun.launch.outcome import RunOutcome
from clusterrun.launch.preflight import preflight, remove_archives
from clusterrun.launch.recover import recover_lost
from clusterrun.launch.supervisor import Supervisor, SupervisorSettings
from clusterrun.launch.transports import open_transports
from clusterrun.plan import LaunchPlan
from clusterrun.runs import RunDir


def execute(inv: Inventory, plan: LaunchPlan, runs_dir: Path, console: Console,
            settings: SupervisorSettings | None = None) -> tuple[RunOutcome, RunDir]:
    """Run ``plan`` to its end. Returns the outcome and the run directory.

    Raises :class:`StartError` when a node could not be started (then nothing runs anywhere).
    ``status.json`` always ends up describing what happened, written atomically.
    """
    run_dir = RunDir.create(runs_dir, plan.run_id)
    run_dir.write_json("plan.json", plan.to_dict())
    run_dir.write_json("status.json", {"run_id": plan.run_id, "state": "starting", "started": time.time()})
    transports = open_transports(inv, plan)
    try:
        try:
            if any(n.transport is TransportKind.ssh for n in plan.nodes):
                console.info(f"checking {plan.nnodes} node(s)...")
            ready = preflight(plan, transports)
            copied = sum(len(r.copied) for r in ready.values())
            if copied:
                console.info(f"copied {copied} file(s) to the nodes")
            supervisor = Supervisor(plan, transports, run_dir, console, settings,
                                    stage={name: r.stage for name, r in ready.items()})
            console.info(f"run {plan.run_id}: {plan.nnodes} node(s), {plan.world_size} rank(s), "
                         f"logs in {run_dir.path}/")
            outcome = supervisor.run()
            recover_lost(plan, transports, run_dir, outcome, supervisor.received, console,
                         grace=supervisor.settings.grace, heartbeat_timeout=supervisor.settings.heartbeat_timeout)
        except StartError as exc:
            run_dir.write_json("status.json", {"run_id": plan.run_id, "state": "not-started",
                                               "problems": exc.problems, "ended": time.time()})
            raise
        run_dir.write_json("status.json", outcome.to_dict())
        return outcome, run_dir
    finally:
        remove_archives()
        for transport in transports.values():
            transport.close()
