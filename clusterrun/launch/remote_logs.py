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
    chunks: list[tuple[int, str, bytes]] = field(default_factory=list)  # (rank, stream, new bytes), in order
    alive: int | None = None  # processes of the run still there; None when unknown
    record: dict[str, Any] | None = None  # the node's exit.json once its torchrun ended
    problem: str | None = None

    def by_rank(self) -> dict[int, bytes]:
        """The new bytes of each rank, its streams one after the other."""
        out: dict[int, list[bytes]] = {}
        for rank, _stream, data in self.chunks:
            out.setdefault(rank, []).append(data)
        return {rank: b"".join(parts) for rank, parts in sorted(out.items())}


def fetch(run: RunDir, received: dict[tuple[str, int, str], int], *, partial: bool = False) -> dict[str, NodeLogs]:
    """New output of every rank on every node (``received``: bytes already read, updated here).

    Only whole lines come back unless ``partial`` (the run is over: its unfinished last lines too).
    """
    inv = run_inventory(run)
    plan = run.read_json("plan.json")

    def one(node: dict[str, Any]) -> NodeLogs:
        out = NodeLogs(node["name"])
        offsets = {f"{rank}/{stream}": n for (name, rank, stream), n in received.items() if name == node["name"]}
        transport, local = node_transport(inv, node["name"])
        try:
            got = collect(transport, node=node["name"], python=node["python"], inline=not local, run_id=run.run_id,
                          run_dir=node["run_dir"], rank_offset=node["ranks"][0], offsets=offsets, sweep=False,
                          grace=0.0, max_bytes=64 << 20, timeout=FETCH_TIMEOUT, partial=partial,
                          sink=lambda rank, stream, data, _more: out.chunks.append((rank, stream, data)))
        except ClusterrunError as exc:
            out.problem = getattr(exc, "reason", None) or str(exc)
            return out
        finally:
            transport.close()
        out.alive, out.record = got.alive, got.record
        if got.exit_code != 0 and out.alive is None:
            out.problem = f"reading the logs failed (exit {got.exit_code}): {got.tail or 'no output'}"
        return out

    with ThreadPoolExecutor(max_workers=min(64, len(plan["nodes"])), thread_name_prefix="logs") as pool:
        results = {r.node: r for r in pool.map(one, plan["nodes"])}
    for r in results.values():
        for rank, stream, data in r.chunks:
            received[(r.node, rank, stream)] = received.get((r.node, rank, stream), 0) + len(data)
    return results
