"""Read a detached run's rank logs from its nodes (the node agent's ``collect`` mode, without stopping anything)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from clusterrun.agents.collect import collect
from clusterrun.errors import ClusterrunError
from clusterrun.ops.down import run_inventory
from clusterrun.planning.plan import NodePlan
from clusterrun.remote.answers import Exit
from clusterrun.runs import RunDir, RunState, read_record, write_record
from clusterrun.runs.judge import first_failure, judge_node, unreported_node
from clusterrun.transport.factory import transport_for
from clusterrun.transport.fanout import fan_out

FETCH_TIMEOUT = 60.0


@dataclass
class NodeLogs:
    node: str
    chunks: list[tuple[int, str, bytes]] = field(default_factory=list)  # (rank, stream, new bytes), in order
    alive: int | None = None  # processes of the run still there; None when unknown
    record: Exit | None = None  # the node's exit.json once its torchrun ended
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
    plan = run.read_plan()

    def one(node: NodePlan) -> NodeLogs:
        out = NodeLogs(node.name)
        offsets = {f"{rank}/{stream}": n for (name, rank, stream), n in received.items() if name == node.name}
        transport = transport_for(inv, inv.node(node.name))
        try:
            got = collect(transport, node=node.name, python=node.python, run_id=run.run_id,
                          run_dir=node.run_dir, rank_offset=node.rank_offset, offsets=offsets, sweep=False,
                          grace=0.0, max_bytes=64 << 20, timeout=FETCH_TIMEOUT, partial=partial,
                          sink=lambda rank, stream, data, _more: out.chunks.append((rank, stream, data)))
        except ClusterrunError as exc:
            out.problem = exc.reason
            return out
        finally:
            transport.close()
        out.alive, out.record = got.alive, got.record
        if got.exit_code != 0 and out.alive is None:
            out.problem = f"reading the logs failed (exit {got.exit_code}): {got.tail or 'no output'}"
        return out

    got = fan_out(plan.nodes, lambda n: n.name, one, label="logs", deadline=FETCH_TIMEOUT + 30)
    results = {**got.results, **{name: NodeLogs(name, problem=why) for name, why in got.problems.items()}}
    for r in results.values():
        for rank, stream, data in r.chunks:
            received[(r.node, rank, stream)] = received.get((r.node, rank, stream), 0) + len(data)
    return results


def record_detached_end(run: RunDir, results: Mapping[str, NodeLogs], note: str | None = None) -> None:
    """Once nothing of a detached run is left: copy its rank logs into runs/ and record its end from the nodes.

    ``results``: the last :func:`fetch` (each node's exit record), judged as an attached run's nodes are
    (:mod:`clusterrun.runs.judge`): the run's first failure is the earliest, torchrun's root cause first, and
    ranks that torchrun stopped because of another are not failures. ``note``: why the end is judged here (a
    run whose supervisor on rank 0's node died before it recorded the end; its record says running).
    """
    record = read_record(run)
    if record.state not in (RunState.detached, RunState.running):
        return
    if note:
        record = record.replace(notes=(*record.notes, note))
    # The whole logs, so that runs/<id>/ holds them like any run's.
    for name, r in fetch(run, {}, partial=True).items():
        for rank, data in r.by_rank().items():
            run.node_dir(name)
            run.rank_log(name, rank).write_bytes(data)
    plan = run.read_plan()
    ends = []
    for node in plan.nodes:
        report = results[node.name].record if node.name in results else None
        ends.append(judge_node(node.name, list(node.ranks), report, stopping=False) if report else
                    unreported_node(node.name, list(node.ranks), "no record"))
    first = first_failure(ends)
    nodes = {}
    for node, end in zip(plan.nodes, ends, strict=True):
        before = record.nodes.get(node.name)
        nodes[node.name] = dataclasses.replace(end, launched=before.launched if before else None,
                                               started=record.started, timeline=before.timeline if before else {})
    # The run ended when its last node's job did (the nodes said when), not when someone looked.
    ended = max((end.ended for end in ends if end.ended is not None), default=None) or time.time()
    record = record.replace(first_failure=first, nodes=nodes)
    record.end(ended)  # failed with the first failure, else succeeded
    write_record(run, record)
