"""Read a detached run's rank logs from its nodes (the node agent's ``collect`` mode, without stopping anything)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from clusterrun.errors import ClusterrunError
from clusterrun.launch.collect import collect
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
        transport, local = node_transport(inv, node["name"])
        try:
            got = collect(transport, node=node["name"], python=node["python"], inline=not local, run_id=run.run_id,
                          run_dir=node["run_dir"], rank_offset=node["ranks"][0], received=received, sweep=False,
                          grace=0.0, max_bytes=64 << 20, timeout=FETCH_TIMEOUT)
        except ClusterrunError as exc:
            out.problem = getattr(exc, "reason", None) or str(exc)
            return out
        finally:
            transport.close()
        out.lines, out.alive, out.record = got.lines, got.alive, got.record
        if got.exit_code != 0 and out.alive is None:
            out.problem = f"reading the logs failed (exit {got.exit_code}): {got.tail or 'no output'}"
        return out

    with ThreadPoolExecutor(max_workers=min(64, len(plan["nodes"])), thread_name_prefix="logs") as pool:
        results = {r.node: r for r in pool.map(one, plan["nodes"])}
    for r in results.values():
        for rank, stream, lines in r.lines:
            received[(r.node, rank, stream)] = received.get((r.node, rank, stream), 0) + len(lines)
    return results
