"""The quick connectivity check ``up`` runs after preflight and before torchrun starts.

Rank 0's node holds a listener on the master port; at the same moment every other node connects
to it over the data network, from its own data address, and rank 0's node pings every node's
data address. The nodes' agents, already started and waiting for the job, do it: no program is
started for the check, and all nodes at once cost about one round trip for any cluster size. A node
that cannot reach the master (or that rank 0 cannot reach) is named with its NIC and address,
and nothing is started: the alternative is an NCCL or Gloo hang minutes later. When paths are dead, the
workers also ping each other, and the watch's rule (:func:`clusterrun.launch.watch.at_fault`) names one suspect
where the evidence points at one: the master's NIC once when no worker reaches it, not each worker's.
:func:`check_paths` runs it for ``up`` (or first doctor's network checks, ``--preflight full``) and keeps what it
found in the run's preflight.json.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from clusterrun.agents.link import AgentLink
from clusterrun.errors import ClusterrunError, StartError, UsageError
from clusterrun.inventory.models import Inventory
from clusterrun.launch.console import Console
from clusterrun.launch.settings import Preflight
from clusterrun.launch.watch import Link, at_fault
from clusterrun.planning.plan import LaunchPlan, NodePlan
from clusterrun.remote import session
from clusterrun.remote.answers import Listening, Pinged, Reached
from clusterrun.runs import RunDir
from clusterrun.transport.base import Transport

CONNECT_TIMEOUT = 3.0


@dataclass
class PathReport:
    seconds: float = 0.0
    problems: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    suspect: str | None = None  # the one node the dead paths point at, when they point at one

    def to_dict(self) -> dict[str, object]:
        return {"seconds": round(self.seconds, 3), "passed": not self.problems, "problems": self.problems,
                "notes": self.notes, "suspect": self.suspect}


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _where(node: NodePlan) -> str:
    return f"{node.data_nic} ({node.data_address})" if node.data_nic else node.data_address


def _reach_problem(node: NodePlan, master: NodePlan, port: int, answer: Reached) -> str | None:
    """None when ``node`` reached the master port, else why not (with what ping says of the path)."""
    if answer.tcp is None:
        return None
    ping = answer.ping
    if ping == "ok":
        diagnosis = "the master answers ping, so something blocks the port (firewall)"
    elif ping == "failed":
        diagnosis = "no ping reply either: this NIC or the path to the master is down"
    else:
        diagnosis = ""
    return (f"cannot reach {master.name}'s master address {master.data_address}:{port} from {_where(node)}: "
            f"{answer.tcp}" + (f"; {diagnosis}" if diagnosis else ""))


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
        held = Listening(error=exc.reason)
    if held.error:
        report.problems[master.name] = f"cannot hold master port {port} for the check: {held.error}"
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
    reached: dict[str, Reached] = {}
    for node in others:
        problem = asked[node.name]
        if problem is None:
            try:
                reached[node.name] = links[node.name].answer((session.REACHED,), deadline)
                problem = _reach_problem(node, master, port, reached[node.name])
            except ClusterrunError as exc:
                problem = f"the check could not run: {exc.reason}"
        if problem:
            report.problems[node.name] = problem
    pinged = Pinged()
    if pinging:
        try:
            pinged = links[master.name].answer((session.PINGED,), deadline)
        except ClusterrunError as exc:
            report.notes.append(f"{master.name} could not ping the nodes: {exc.reason}")
    if pinged.missing:
        report.notes.append(f"{master.name} has no ping command: the way back to each node was not tested")
    results = pinged.results
    for node in others:
        if results.get(node.data_address) == "failed" and node.name not in report.problems:
            report.problems[node.name] = (f"{master.name} gets no ping reply from {node.name}'s data address "
                                          f"{_where(node)}")
    lost, working = _paths(master, others, reached, results)
    if lost:
        _ring_pings(plan, links, reached, lost, working)
        _name_suspect(plan, lost, working, report)
    report.seconds = time.monotonic() - started
    return report


def _paths(master: NodePlan, others: list[NodePlan], reached: Mapping[str, Reached],
           pinged: Mapping[str, str]) -> tuple[list[Link], list[Link]]:
    """The data paths found dead (no connection and no ping reply, or no ping reply back) and found working."""
    lost: list[Link] = []
    working: list[Link] = []
    for node in others:
        answer = reached.get(node.name)
        if answer is not None and answer.tcp is None:
            working.append((node.name, master.name))
        elif answer is not None and answer.ping == "failed":
            lost.append((node.name, master.name))
        back = pinged.get(node.data_address)
        if back in ("ok", "failed"):
            (working if back == "ok" else lost).append((master.name, node.name))
    return lost, working


def _ring_pings(plan: LaunchPlan, links: Mapping[str, AgentLink], reached: Mapping[str, object],
                lost: list[Link], working: list[Link]) -> None:
    """Only when a path is dead: each worker pings the next worker, so that a dead master NIC is told from a dead
    worker NIC (the workers reach each other) at the cost of one more round, on failure only."""
    workers = [n for n in plan.nodes if n is not plan.master and n.name in reached]
    if len(workers) < 2:
        return
    deadline = time.monotonic() + CONNECT_TIMEOUT + 20
    asked = []
    for i, node in enumerate(workers):
        peer = workers[(i + 1) % len(workers)]
        question = {"addresses": [peer.data_address], "timeout": CONNECT_TIMEOUT}
        if links[node.name].send(f"{session.PING} {json.dumps(question)}"):
            asked.append((node, peer))
    for node, peer in asked:
        try:
            got = links[node.name].answer((session.PINGED,), deadline).results
        except ClusterrunError:
            continue  # no evidence either way
        if got.get(peer.data_address) in ("ok", "failed"):
            (working if got[peer.data_address] == "ok" else lost).append((node.name, peer.name))


def _name_suspect(plan: LaunchPlan, lost: list[Link], working: list[Link], report: PathReport) -> None:
    """One node named when the dead paths point at it (:func:`clusterrun.launch.watch.at_fault`, the watch's rule):
    the master's NIC once, in place of one line per worker that cannot reach it; a worker's line gets the evidence."""
    master = plan.master
    suspects = at_fault(lost, [n.name for n in plan.nodes], working=working)
    if len(suspects) != 1:
        return  # two nodes that lost each other: which end is at fault cannot be told; each says what it saw
    suspect = suspects[0]
    workers = [n.name for n in plan.nodes if n is not master]
    among = [p for p in lost + working if master.name not in p]
    if suspect != master.name:
        others = [w for w in workers if w != suspect]
        evidence = ([f"the other workers reach {master.name}"]
                    if others and all((w, master.name) in working for w in others) else []) + [
            f"{peer} gets no ping reply from it" for peer, end in lost if end == suspect and peer != master.name]
        if suspect in report.problems:
            report.suspect = suspect
            if evidence:
                report.problems[suspect] += f" ({'; '.join(evidence)})"
        return
    if not all((w, master.name) in lost for w in workers):
        return  # some workers reach the master: its NIC works; each worker that does not says so
    back = [w for w in workers if (master.name, w) in lost]
    evidence = ["no worker reaches it (no connection to the master port, no ping reply)"]
    if back:
        evidence.append("it gets no ping reply from " + ("any worker" if len(back) == len(workers)
                                                         else ", ".join(back)))
    if among and all(p in working for p in among):
        evidence.append("the workers reach each other")
    for name in workers:
        report.problems.pop(name, None)  # explained by the master's NIC
    report.suspect = master.name
    report.problems[master.name] = (f"its data NIC {_where(master)} is the suspect: {'; '.join(evidence)}; check "
                                    "that NIC, its cable, switch port and VLAN, or run `clusterrun doctor`")


PATH_HINT = ("no node was started; `clusterrun doctor <inventory> --checks net` shows more; `--preflight off` skips "
             "this check (if ICMP is blocked on purpose, for example)")


#: ``--preflight full``: the network checks of ``clusterrun doctor`` (:func:`clusterrun.doctor.gate.full_check`),
#: given by the caller: (inventory, transports, report directory) -> (failures, report directory).
FullCheck = Callable[[Inventory, Mapping[str, Transport], Path], tuple[list[str], Path]]


def check_paths(inv: Inventory, plan: LaunchPlan, transports: dict[str, Transport], links: Mapping[str, AgentLink],
                run_dir: RunDir, console: Console, mode: Preflight, full_check: FullCheck | None = None) -> None:
    """The connectivity check before the start (``--preflight``), by the nodes' waiting agents (``links``); its
    result goes to preflight.json."""
    record: dict[str, object] = {"mode": mode.value}
    try:
        if mode is Preflight.off or plan.nnodes < 2:
            record["skipped"] = "--preflight off" if mode is Preflight.off else "single node"
            return
        if mode is Preflight.full:
            if full_check is None:
                raise UsageError("--preflight full needs doctor's network checks, which this caller did not give")
            console.info("running doctor's network checks (--preflight full)...")
            failures, where = full_check(inv, transports, run_dir.path / "doctor")
            record["doctor"] = {"report": str(where), "failures": failures}
            if failures:
                raise StartError({f"doctor {i + 1}": f for i, f in enumerate(failures)},
                                 hint=f"report in {where}/; {PATH_HINT}")
        report = quick_check(plan, links)
        record.update(report.to_dict())
        for note in report.notes:
            console.info(note)
        if report.problems:
            raise StartError(report.problems, hint=PATH_HINT)
        console.info(f"network paths to {plan.master.name} ok ({report.seconds:.1f}s)")
    finally:
        run_dir.write_json("preflight.json", record)
