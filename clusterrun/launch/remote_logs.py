"""Read a detached run's rank logs from its nodes (the node agent's ``collect`` mode, without stopping anything)."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from clusterrun.errors import ClusterrunError
from clusterrun.launch.agent_cmd import agent_argv
from clusterrun.launch.sweep import node_transport, run_inventory
from clusterrun.runs import RunDir

FETCH_TIMEOUT = 60.0


@dataclass
class NodeLogs:
    node: str
    lines: list[tuple[int, str, list[str]]] = field(default_factory=list)  # (rank, stream, new lines)
    alive: int | None = None  # processes of the run still there; None when unknown
    record: dict[str, Any] | None = None  # the node's exit.json once its torchrun ended
    problem: str | None = None


def fetch(run: RunDir, received: dict[tuple[str, int, str], int]) -> dict[str, NodeLogs]:
    """New lines of every rank log on every node (``received``: lines already read, updated here)."""
    inv = run_inventory(run)
    plan = run.read_json("plan.json")

    def one(node: dict[str, Any]) -> NodeLogs:
        out = NodeLogs(node["name"])
        skip = {f"{r}/{s}": n for (name, r, s), n in received.items() if name == node["name"]}
        spec = {"run_id": run.run_id, "node": node["name"], "run_dir": node["run_dir"], "sweep": False,
                "rank_offset": node["ranks"][0], "max_bytes": 64 << 20, "skip": skip}
        transport, local = node_transport(inv, node["name"])
        try:
            res = transport.run(agent_argv(node["python"], "collect",
                                           [base64.b64encode(json.dumps(spec).encode()).decode()], inline=not local),
                                timeout=FETCH_TIMEOUT)
        except ClusterrunError as exc:
            out.problem = getattr(exc, "reason", None) or str(exc)
            return out
        finally:
            transport.close()
        for line in res.stdout.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("ev") == "log":
                out.lines.append((int(event["rank"]), str(event["stream"]), list(event.get("lines") or [])))
            elif event.get("ev") == "alive":
                out.alive = len(event.get("pids") or [])
            elif event.get("ev") == "record":
                out.record = event.get("exit")
        if not res.ok and out.alive is None:
            out.problem = f"reading the logs failed (exit {res.exit_code}): {res.tail(2) or 'no output'}"
        return out

    with ThreadPoolExecutor(max_workers=min(64, len(plan["nodes"])), thread_name_prefix="logs") as pool:
        results = {r.node: r for r in pool.map(one, plan["nodes"])}
    for r in results.values():
        for rank, stream, lines in r.lines:
            received[(r.node, rank, stream)] = received.get((r.node, rank, stream), 0) + len(lines)
    return results
