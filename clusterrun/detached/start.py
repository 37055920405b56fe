"""``up --detach``: hand a checked run to its supervisor on rank 0's node, then leave.

Every node was checked and its agent waits for the job, as for an attached run. :func:`start_on_cluster` then

1. starts the cluster supervisor (clusterrun/detached/host.py) on rank 0's node from a bundle of clusterrun's own
   modules, with its spec on stdin: the plan with its secrets, the supervisor's settings, the staged files, a
   fresh secret for this run and the webhooks;
2. tells every node's agent ``relay`` (the supervisor's address and port, the secret): each connects to the
   supervisor over the nodes' host network (not the data network: a dead data NIC stays a NIC verdict, not a lost
   node) and proves the secret;
3. waits until the supervisor says every node was told to start (``going``), and drops its connections: the run
   is the supervisor's from then on.

Raises :class:`StartError` when any step fails; then nothing runs (the supervisor and the agents stop when their
connections drop before ``go``).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

from clusterrun.agents.link import AgentLink
from clusterrun.detached.host import CONNECT_TIMEOUT, GOING, LISTENING, RECORD_DIR, marker_node
from clusterrun.errors import ClusterrunError, StartError
from clusterrun.launch.settings import RestartSettings, SupervisorSettings
from clusterrun.planning.plan import LaunchPlan
from clusterrun.remote import bundle, protocol, relay
from clusterrun.remote.procs import NODE_VAR, RUN_ID_VAR
from clusterrun.transport.base import Transport

#: Seconds the supervisor may take to start and listen (Python's start and the bundle's compile on a busy node).
LISTEN_TIMEOUT = 60.0
#: What a local record of a detached run says about where its supervisor is (runs/<id>/supervisor.json).
SUPERVISOR_FILE = "supervisor.json"


@dataclasses.dataclass(frozen=True)
class ClusterSupervisor:
    """Where a detached run's supervisor runs: the node, its pid there, its port and its record directory."""

    node: str
    pid: int
    port: int
    record_dir: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterSupervisor:
        return cls(str(data["node"]), int(data["pid"]), int(data["port"]), str(data["record_dir"]))


def record_dir(plan: LaunchPlan) -> str:
    """The supervisor's run directory on rank 0's node: beside the node's own directory of the run."""
    run_dir = plan.master.run_dir
    if plan.job.attempt:
        run_dir = posixpath.dirname(run_dir)
    return posixpath.join(posixpath.dirname(run_dir), RECORD_DIR)


def _address(plan: LaunchPlan, transport: Transport) -> str:
    """The address the other nodes reach rank 0's node at on the host network: the one this machine's connection
    reached (a name in ~/.ssh/config may mean nothing on the nodes), else the inventory's host."""
    if transport.is_local:
        return "127.0.0.1"
    return transport.peer_address() or plan.master.host


def start_on_cluster(plan: LaunchPlan, links: Mapping[str, AgentLink], transport: Transport,
                     stage: Mapping[str, Sequence[Sequence[str]]], settings: SupervisorSettings,
                     notify: Sequence[str], started: float, restarts: RestartSettings,
                     fold: bool = False) -> ClusterSupervisor:
    """Start the run's supervisor on rank 0's node and move every node's agent to it (see the module's docstring).
    ``transport``: rank 0's node's; ``restarts``: ``--max-restarts`` and its backoff (on the same nodes); ``fold``:
    its console folds identical lines, as ``up``'s would (what ``attach`` shows). Raises
    :class:`StartError`."""
    master = plan.master
    secret = secrets.token_hex(32)
    where = record_dir(plan)
    try:
        stream = transport.start(bundle.argv(master.python),
                                 env={RUN_ID_VAR: plan.run_id, NODE_VAR: marker_node(master.name)})
    except ClusterrunError as exc:
        raise StartError({master.name: f"cannot start the run's supervisor: {exc}"}) from exc
    host = AgentLink(master.name, stream)
    spec = {"plan": plan.to_dict(secrets=True), "record_dir": where, "settings": dataclasses.asdict(settings),
            "stage": {name: [list(item) for item in items] for name, items in stage.items()}, "secret": secret,
            "notify": list(notify), "started": started, "connect_timeout": CONNECT_TIMEOUT,
            "max_restarts": restarts.max_restarts, "backoff": restarts.backoff, "fold": fold}
    try:
        host.send(bundle.payload() + "\n")
        host.send(protocol.encode_spec(spec) + "\n")
        listening = host.answer((LISTENING, protocol.ERROR), time.monotonic() + LISTEN_TIMEOUT)
        if listening.get("ev") != LISTENING:
            raise StartError({master.name: f"the run's supervisor did not start: {listening.get('text')}"})
        address = _address(plan, transport)
        problems = _relay(plan, links, address, int(listening["port"]), secret)
        if problems:
            raise StartError(problems, hint=f"the agents reach the run's supervisor at {address}:"
                                            f"{listening['port']} on rank 0's node ({master.name}) over the nodes' "
                                            "host network: a firewall between the nodes blocks it")
        going = host.answer((GOING, protocol.ERROR), time.monotonic() + CONNECT_TIMEOUT + 30)
        if going.get("ev") != GOING:
            raise StartError({master.name: f"the run's supervisor could not start the job: {going.get('text')}"})
    except ClusterrunError as exc:
        host.abort()  # before ``go``, the supervisor and the agents end when their connections drop
        if isinstance(exc, StartError):
            raise
        raise StartError({master.name: f"the run's supervisor: {getattr(exc, 'reason', exc)}"}) from exc
    finally:
        for link in links.values():
            link.abort()  # a relayed agent answers to its supervisor only
    host.abort()
    return ClusterSupervisor(master.name, int(listening.get("pid") or 0), int(listening["port"]), where)


def _relay(plan: LaunchPlan, links: Mapping[str, AgentLink], address: str, port: int, secret: str) -> dict[str, str]:
    """Tell every agent to move to the supervisor, all at once; the nodes that could not, and why."""
    problems: dict[str, str] = {}
    for node in plan.nodes:
        words = {"address": address, "port": port, "secret": secret, "run_id": plan.run_id, "node": node.name,
                 "timeout": relay.HANDSHAKE_TIMEOUT}
        if not links[node.name].send(f"{relay.RELAY} {json.dumps(words)}"):
            problems[node.name] = "the node agent's connection closed"
    deadline = time.monotonic() + relay.HANDSHAKE_TIMEOUT + 20
    for node in plan.nodes:
        if node.name in problems:
            continue
        try:
            answer = links[node.name].answer((relay.RELAYED, protocol.ERROR), deadline)
        except ClusterrunError as exc:
            problems[node.name] = getattr(exc, "reason", str(exc))
            continue
        if answer.get("ev") != relay.RELAYED:
            problems[node.name] = str(answer.get("text") or "the agent could not reach the run's supervisor")
    return problems
