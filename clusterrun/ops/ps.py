"""What runs on the nodes (``clusterrun ps``), whoever started it: the node agent's ``ps`` mode on every node.

Each node answers with the GPU and master-port leases held there (every user's: see
``clusterrun/remote/leases.py``) and the processes of this user's runs (another user's process environment is
not readable: their runs show through their leases). :func:`runs_on_nodes` joins the two per run and node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from clusterrun.agents.link import run_mode
from clusterrun.agents.spec import ps_spec
from clusterrun.errors import ClusterrunError
from clusterrun.facts.leases import parse_leases
from clusterrun.inventory.models import Inventory
from clusterrun.remote import protocol
from clusterrun.remote.answers import Alive, Leases
from clusterrun.transport.factory import transport_for
from clusterrun.transport.fanout import fan_out

#: Seconds one node may take to answer (connect, start the agent, look), unless ``ps --timeout`` says otherwise.
PS_TIMEOUT = 30.0


@dataclass(frozen=True)
class RunOnNode:
    """One run seen on one node: by its leases, its processes, or both."""

    node: str  # the inventory node asked
    run: str
    user: str
    gpus: tuple[int, ...] = ()
    ports: tuple[int, ...] = ()
    since: float | None = None  # the earliest lease or process of the run there (seconds since the epoch)
    processes: int | None = None  # None: not visible to this user (another user's run)
    nodes: tuple[str, ...] = field(default=())  # the run's own names for this machine (CLUSTERRUN_NODE)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "run": self.run, "user": self.user, "gpus": list(self.gpus),
                "ports": list(self.ports), "since": self.since, "processes": self.processes,
                "run_nodes": list(self.nodes)}


def join(node: str, answer: Alive) -> list[RunOnNode]:
    """The runs of one node's ``alive`` answer (leases and processes), one entry per run id, oldest first."""
    leases = answer.leases or Leases()
    gpus = parse_leases(leases.gpus)
    ports = parse_leases(leases.ports)
    procs = answer.runs
    ids = {lease.run for lease in (*gpus.values(), *ports.values())} | set(procs)
    out = []
    for run in ids:
        mine = [lease for lease in (*gpus.values(), *ports.values()) if lease.run == run]
        seen = procs.get(run)
        times = [t for t in (*(lease.since for lease in mine), seen and seen.since) if isinstance(t, (int, float))]
        out.append(RunOnNode(
            node=node, run=run, user=seen.user if seen else next((lease.user for lease in mine), "?"),
            gpus=tuple(sorted(g for g, lease in gpus.items() if lease.run == run)),
            ports=tuple(sorted(p for p, lease in ports.items() if lease.run == run)),
            since=min(times) if times else None,
            processes=len(seen.pids) if seen else None,
            nodes=tuple(seen.nodes if seen and seen.nodes else sorted({lease.node for lease in mine if lease.node}))))
    return sorted(out, key=lambda r: (r.since is None, r.since or 0.0, r.run))


def _ask(inv: Inventory, name: str, timeout: float) -> list[RunOnNode]:
    node = inv.node(name)
    transport = transport_for(inv, node)
    try:
        frames, res = run_mode(transport, inv.python_of(node), protocol.PS, ps_spec("", name), timeout=timeout)
    finally:
        transport.close()
    answer = next((f.event for f in frames if f.event.ev == protocol.ALIVE), None)
    if res.exit_code != 0 or answer is None:
        said = next((f.event.text for f in frames if f.event.ev == protocol.ERROR), None)
        raise ClusterrunError(f"the node's ps failed (exit {res.exit_code}): {said or res.tail(2) or 'no output'}")
    return join(name, answer)


def runs_on_nodes(inv: Inventory, timeout: float = PS_TIMEOUT) -> tuple[list[RunOnNode], dict[str, str]]:
    """Every run on every node of ``inv``, asked in parallel, and per node that could not be asked, why."""
    names = [n.name for n in inv.nodes]
    got = fan_out(names, lambda n: n, lambda n: _ask(inv, n, timeout), label="ps", deadline=timeout + 5.0)
    rows = [row for name in names for row in got.results.get(name, [])]
    return rows, {name: got.problems[name] for name in names if name in got.problems}


def since_words(since: float | None, now: float | None = None) -> str:
    """``17:00:03 (2h05m ago)``: when a run took its leases or started its processes."""
    if since is None:
        return "?"
    ago = max(0, int((now if now is not None else time.time()) - since))
    span = f"{ago // 3600}h{ago % 3600 // 60:02d}m" if ago >= 3600 else f"{ago // 60}m{ago % 60:02d}s"
    return f"{time.strftime('%H:%M:%S', time.localtime(since))} ({span} ago)"
