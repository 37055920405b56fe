"""The node agent's ``sweep`` and ``ps`` modes, from clusterrun's side: stop or list what is left of a run on a node
(every process of a run carries ``CLUSTERRUN_RUN_ID`` in its environment)."""

from __future__ import annotations

from clusterrun.agents.link import run_mode
from clusterrun.agents.spec import ps_spec, sweep_spec
from clusterrun.errors import ClusterrunError
from clusterrun.remote import protocol
from clusterrun.transport.base import Transport

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
          timeout: float = SWEEP_TIMEOUT) -> list[int]:
    """Stop every process of run ``run_id`` on ``node`` (SIGTERM, SIGKILL after ``grace`` seconds): the pids it
    signalled. Raises :class:`ClusterrunError` when the node cannot be reached or the sweep fails."""
    return _pids(transport, python, protocol.SWEEP, sweep_spec(run_id, node, grace), protocol.SWEPT,
                 timeout + grace)


def ps(transport: Transport, *, python: str, run_id: str, node: str, timeout: float = SWEEP_TIMEOUT) -> list[int]:
    """The processes of run ``run_id`` still on ``node``. Raises :class:`ClusterrunError` as :func:`sweep`."""
    return _pids(transport, python, protocol.PS, ps_spec(run_id, node), protocol.ALIVE, timeout)
