"""What `up` does while a job runs that an exported job does without: listed in every exported document.

An sbatch script or a Kubeflow job starts torchrun and leaves the rest to the engine. clusterrun's own work
around the job (its checks before the start, the watch of the data paths, the stacks of a hang, the run
record, its restarts and spare nodes) does not travel with it; the document says so instead of letting a
user believe it does.
"""

from __future__ import annotations

from clusterrun.inventory.models import Inventory
from clusterrun.planning.plan import LaunchPlan


def runtime_only(plan: LaunchPlan, inv: Inventory) -> tuple[str, ...]:
    """One line per clusterrun feature the exported job runs without, naming the inventory's settings that are lost."""
    lines = [
        "clusterrun's checks before the start (torch on every node, the master port reachable on the data network); "
        "run `clusterrun doctor` on the nodes instead",
        "the watch of the job's data paths (a NIC that stops passing traffic stopping the job within seconds)",
        "the stacks of every rank when the job goes silent (--hang-timeout)"
        + (f"; the inventory sets run.hang_timeout: {inv.run.hang_timeout:g}" if inv.run.hang_timeout else ""),
        "the run record (runs/<run-id>/ with one log per rank, `clusterrun logs`, `status`, `down`)",
    ]
    if inv.run.notify:
        lines.append(f"webhooks (run.notify: {len(inv.run.notify)} URL(s))")
    if inv.run.max_restarts:
        lines.append(f"clusterrun's restarts of the whole job (run.max_restarts: {inv.run.max_restarts})")
    if plan.spares:
        lines.append(f"spare nodes ({', '.join(plan.spares)}): they take a lost node's place only under `up`")
    return tuple(lines)
