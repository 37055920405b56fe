"""Stop whatever is left of a past run on its nodes (``clusterrun down``), through the node agent's ``sweep`` mode."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from clusterrun.errors import ClusterrunError, UsageError
from clusterrun.inventory.models import Inventory
from clusterrun.inventory.models import Transport as TransportKind
from clusterrun.launch.agent_cmd import agent_argv
from clusterrun.launch.transports import transport_for
from clusterrun.runs import RunDir
from clusterrun.transport.base import Transport

SWEEP_TIMEOUT = 30.0


def run_inventory(run: RunDir) -> Inventory:
    """The inventory a run was started with (saved in its directory), to reach its nodes again."""
    try:
        return Inventory.model_validate(run.read_json("inventory.json"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{run.path}/inventory.json is missing or unreadable ({exc}); this run was made by an "
                         "older clusterrun: look on the nodes yourself (its processes carry "
                         f"CLUSTERRUN_RUN_ID={run.run_id} in their environment)") from None


def node_transport(inv: Inventory, name: str) -> tuple[Transport, bool]:
    """A transport to node ``name`` and whether it is local."""
    node = next(n for n in inv.nodes if n.name == name)
    return transport_for(inv, node), inv.transport_of(node) is TransportKind.local


def sweep_run(run: RunDir, grace: float) -> dict[str, tuple[list[int], str | None]]:
    """``{node: (pids stopped, problem or None)}`` for every node of the run, swept in parallel."""
    inv = run_inventory(run)
    plan = run.read_json("plan.json")
    nodes = {n["name"]: n for n in plan["nodes"]}

    def one(name: str) -> tuple[list[int], str | None]:
        transport, local = node_transport(inv, name)
        try:
            argv = agent_argv(nodes[name]["python"], "sweep", [run.run_id, f"{grace:g}", name], inline=not local)
            res = transport.run(argv, timeout=SWEEP_TIMEOUT + grace)
            line = next((x for x in res.stdout.splitlines() if x.startswith("{")), None)
            if line is None:
                return [], f"the sweep failed (exit {res.exit_code}): {res.tail(2) or 'no output'}"
            return list(json.loads(line).get("pids", [])), None
        except ClusterrunError as exc:
            return [], getattr(exc, "reason", None) or str(exc)
        finally:
            transport.close()

    with ThreadPoolExecutor(max_workers=min(64, len(nodes)), thread_name_prefix="sweep") as pool:
        return dict(zip(nodes, pool.map(one, nodes), strict=True))
