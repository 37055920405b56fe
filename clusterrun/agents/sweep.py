"""The node agent's ``sweep`` and ``ps`` modes, from clusterrun's side: stop or list what is left of a run on a node
(every process of a run carries ``CLUSTERRUN_RUN_ID`` in its environment)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from clusterrun.agents.link import run_mode
from clusterrun.agents.spec import Spec, container_spec, ps_spec, sweep_spec
from clusterrun.errors import ClusterrunError
from clusterrun.planning.planfile import NodePlan
from clusterrun.remote import protocol
from clusterrun.transport.base import Transport
from clusterrun.transport.fanout import FanOut, fan_out

#: Seconds a sweep may take beyond its grace period (starting the agent, finding the processes).
SWEEP_TIMEOUT = 30.0


def _pids(transport: Transport, python: str, kind: protocol.Spec, spec: dict, answer: str, timeout: float) -> list[int]:
    frames, res = run_mode(transport, python, kind, spec, timeout=timeout)
    events = [f.event for f in frames]
    found = next((e for e in events if e.get("ev") == answer), None)
    if res.exit_code != 0 or found is None:
        said = next((e.get("text") for e in events if e.get("ev") == protocol.ERROR), None)
        raise ClusterrunError(f"the {kind.mode} failed (exit {res.exit_code}): "
                              f"{said or res.tail(2) or 'no output'}")
    return [int(pid) for pid in found.get("pids") or []]


def sweep(transport: Transport, *, python: str, run_id: str, node: str, grace: float,
          timeout: float = SWEEP_TIMEOUT, container: Spec | None = None) -> list[int]:
    """Stop every process of run ``run_id`` on ``node`` (SIGTERM, SIGKILL after ``grace`` seconds) and remove its
    containers there (``container``: the node's, by label): the pids it signalled. Raises
    :class:`ClusterrunError` when the node cannot be reached or the sweep fails."""
    return _pids(transport, python, protocol.SWEEP, sweep_spec(run_id, node, grace, container), protocol.SWEPT,
                 timeout + grace)


def sweep_everywhere(run_id: str, nodes: Sequence[NodePlan], transport_of: Callable[[NodePlan], Transport],
                     grace: float, *, close: bool = False, slack: float = 15.0) -> FanOut[list[int]]:
    """:func:`sweep` on every node at once: per node the pids it stopped, or why it could not be checked.

    ``close``: close each node's transport afterwards (transports opened for this sweep); ``slack``: seconds the
    whole sweep may take beyond one node's bound (more where each node still has to be connected to)."""

    def one(node: NodePlan) -> list[int]:
        transport = transport_of(node)
        try:
            return sweep(transport, python=node.python, run_id=run_id, node=node.name, grace=grace,
                         container=container_spec(node))
        finally:
            if close:
                transport.close()

    return fan_out(nodes, lambda n: n.name, one, label="sweep", deadline=grace + SWEEP_TIMEOUT + slack)


def ps(transport: Transport, *, python: str, run_id: str, node: str, timeout: float = SWEEP_TIMEOUT,
       container: Spec | None = None) -> list[int]:
    """The processes of run ``run_id`` still on ``node``. Raises :class:`ClusterrunError` as :func:`sweep`."""
    return _pids(transport, python, protocol.PS, ps_spec(run_id, node, container), protocol.ALIVE, timeout)
