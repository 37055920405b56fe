"""Stop whatever is left of a past run on its nodes (``clusterrun down``), through the node agent's ``sweep`` mode."""

from __future__ import annotations

import time

from clusterrun.agents.sweep import sweep_everywhere
from clusterrun.errors import UsageError
from clusterrun.inventory.models import Inventory
from clusterrun.remote import protocol
from clusterrun.runs import RunDir, RunState, run_record, write_record
from clusterrun.transport.factory import transport_for


def run_inventory(run: RunDir) -> Inventory:
    """The inventory a run was started with (saved in its directory), to reach its nodes again."""
    try:
        return Inventory.model_validate(run.read_json("inventory.json"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{run.path}/inventory.json is missing or unreadable ({exc}); this run was made by an "
                         "older clusterrun: look on the nodes yourself (its processes carry "
                         f"{protocol.RUN_ID_VAR}={run.run_id} in their environment)") from None


def sweep_run(run: RunDir, grace: float) -> dict[str, tuple[list[int], str | None]]:
    """``{node: (pids stopped, problem or None)}`` for every node of the run, swept in parallel."""
    inv = run_inventory(run)
    plan = run.read_plan()
    got = sweep_everywhere(run.run_id, plan.nodes, lambda n: transport_for(inv, inv.node(n.name)), grace,
                           close=True, slack=30.0)
    return {n.name: (got.results[n.name], None) if n.name in got.results else
            ([], got.problems.get(n.name, "no answer")) for n in plan.nodes}


def record_stopped(run: RunDir) -> None:
    """After a sweep that reached every node: record the end that the run's own clusterrun could not write."""
    record = run_record(run)
    if record.state in (RunState.starting, RunState.running, RunState.lost, RunState.detached):
        write_record(run, record.replace(state=RunState.stopped, ended=time.time(), stopped_by="clusterrun down",
                                         pid=None))
