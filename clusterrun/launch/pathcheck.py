"""The quick connectivity check ``up`` runs after preflight and before torchrun starts.

Rank 0's node holds a listener on the master port; at the same moment every other node connects
to it over the data network, from its own data address, and rank 0's node pings every node's
data address. The nodes' agents, already started and waiting for the job, do it: no program is
started for the check, and all nodes at once cost about one round trip for any cluster size. A node
that cannot reach the master (or that rank 0 cannot reach) is named with its NIC and address,
and nothing is started: the alternative is an NCCL or Gloo hang minutes later.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from clusterrun.agents.link import AgentLink
from clusterrun.errors import ClusterrunError
from clusterrun.plan import LaunchPlan, NodePlan
from clusterrun.remote import session

CONNECT_TIMEOUT = 3.0


@dataclass
class PathReport:
    seconds: float = 0.0
    problems: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {"seconds": round(self.seconds, 3), "passed": not self.problems, "problems": self.problems,
                "notes": self.notes}


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _where(node: NodePlan) -> str:
    return f"{node.data_nic} ({node.data_address})" if node.data_nic else node.data_address


def _reach_problem(node: NodePlan, master: NodePlan, port: int, answer: dict[str, object]) -> str | None:
    """None when ``node`` reached the master port, else why not (with what ping says of the path)."""
    if answer.get("tcp") is None:
        return None
    ping = answer.get("ping")
    if ping == "ok":
        diagnosis = "the master answers ping, so something blocks the port (firewall)"
    elif ping == "failed":
        diagnosis = "no ping reply either: this NIC or the path to the master is down"
    else:
        diagnosis = ""
    return (f"cannot reach {master.name}'s master address {master.data_address}:{port} from {_where(node)}: "
            f"{answer['tcp']}" + (f"; {diagnosis}" if diagnosis else ""))


def quick_check(plan: LaunchPlan, links: Mapping[str, AgentLink]) -> PathReport:
    """Check the data paths the job will use, through each node's waiting agent (no program is started for it).
    Never raises for node problems: they are in ``problems``."""
    report = PathReport()
    if plan.nnodes < 2:
        report.notes.append("single node: no network path to check")
        return report
    started = time.monotonic()
    master = plan.master
    port = plan.master_port
    try:
        held = links[master.name].ask(session.LISTEN, json.dumps({"port": port}), (session.LISTENING,), 20)
    except ClusterrunError as exc:
        held = {"error": getattr(exc, "reason", str(exc))}
    if held.get("error"):
        report.problems[master.name] = f"cannot hold master port {port} for the check: {held['error']}"
        report.seconds = time.monotonic() - started
        return report
    others = [n for n in plan.nodes if n is not master]
    # Every question goes out at once; the answers are then taken in turn (each node's agent answers on its own).
    deadline = time.monotonic() + CONNECT_TIMEOUT + 20
    asked: dict[str, str | None] = {}
    for node in others:
        source = node.data_address if _is_ip(node.data_address) else None
        question = {"address": master.data_address, "port": port, "source": source, "timeout": CONNECT_TIMEOUT}
        sent = links[node.name].send(f"{session.REACH} {json.dumps(question)}")
        asked[node.name] = None if sent else "the check could not run: the node agent's connection closed"
    targets = [n.data_address for n in others]
    pinging = links[master.name].send(f"{session.PING} {json.dumps({'addresses': targets, 'timeout': CONNECT_TIMEOUT})}")
    for node in others:
        problem = asked[node.name]
        if problem is None:
            try:
                problem = _reach_problem(node, master, port, links[node.name].answer((session.REACHED,), deadline))
            except ClusterrunError as exc:
                problem = f"the check could not run: {getattr(exc, 'reason', exc)}"
        if problem:
            report.problems[node.name] = problem
    pinged: dict[str, object] = {}
    if pinging:
        try:
            pinged = links[master.name].answer((session.PINGED,), deadline)
        except ClusterrunError as exc:
            report.notes.append(f"{master.name} could not ping the nodes: {getattr(exc, 'reason', exc)}")
    if pinged.get("missing"):
        report.notes.append(f"{master.name} has no ping command: the way back to each node was not tested")
    results = pinged.get("results") or {}
    assert isinstance(results, dict)
    for node in others:
        if results.get(node.data_address) == "failed" and node.name not in report.problems:
            report.problems[node.name] = (f"{master.name} gets no ping reply from {node.name}'s data address "
                                          f"{_where(node)}")
    report.seconds = time.monotonic() - started
    return report
