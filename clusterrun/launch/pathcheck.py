"""The quick connectivity check ``up`` runs after preflight and before torchrun starts.

Rank 0's node holds a listener on the master port; at the same moment every other node connects
to it over the data network, from its own data address, and rank 0's node pings every node's
data address. All nodes at once, so it costs about one round trip for any cluster size. A node
that cannot reach the master (or that rank 0 cannot reach) is named with its NIC and address,
and nothing is started: the alternative is an NCCL or Gloo hang minutes later.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from clusterrun import remote
from clusterrun.errors import ClusterrunError
from clusterrun.plan import LaunchPlan, NodePlan
from clusterrun.transport.base import Transport
from clusterrun.transport.reader import LineReader

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


def _reach(node: NodePlan, master: NodePlan, port: int, transport: Transport) -> str | None:
    """None when ``node`` reaches the master port from its data address, else why not."""
    src = node.data_address if _is_ip(node.data_address) else "-"
    argv = remote.argv(node.python, "netprobe", "reach", master.data_address, port, src, CONNECT_TIMEOUT)
    try:
        res = transport.run(argv, timeout=CONNECT_TIMEOUT + 20)
    except ClusterrunError as exc:
        return f"the check could not run: {getattr(exc, 'reason', exc)}"
    lines = res.stdout.splitlines()
    if "TCP OK" in lines:
        return None
    tcp = next((line for line in lines if line.startswith("TCP FAILED")), f"TCP FAILED {res.tail(2) or 'no output'}")
    ping = next((line for line in lines if line.startswith("PING")), "")
    why = tcp.removeprefix("TCP FAILED ")
    if ping.endswith(" OK"):
        diagnosis = "the master answers ping, so something blocks the port (firewall)"
    elif ping.endswith("FAILED"):
        diagnosis = "no ping reply either: this NIC or the path to the master is down"
    else:
        diagnosis = ""
    return (f"cannot reach {master.name}'s master address {master.data_address}:{port} from {_where(node)}: {why}"
            + (f"; {diagnosis}" if diagnosis else ""))


def quick_check(plan: LaunchPlan, transports: Mapping[str, Transport]) -> PathReport:
    """Check the data paths the job will use. Never raises for node problems: they are in ``problems``."""
    report = PathReport()
    if plan.nnodes < 2:
        report.notes.append("single node: no network path to check")
        return report
    started = time.monotonic()
    master = plan.master
    port = plan.master_port
    listener = transports[master.name].start(remote.argv(master.python, "netprobe", "listen", "0.0.0.0", port, 60))
    try:
        line = LineReader(listener).wait_for("LISTENING", 20)
        if line is None or not line.startswith("LISTENING"):
            report.problems[master.name] = (f"cannot hold master port {port} for the check: "
                                            f"{(line or listener.stderr_text()[-200:]).removeprefix('FAILED ')}")
            return report
        others = [n for n in plan.nodes if n is not master]
        with ThreadPoolExecutor(max_workers=min(64, len(others) + 1), thread_name_prefix="pathcheck") as pool:
            reached = {n.name: pool.submit(_reach, n, master, port, transports[n.name]) for n in others}
            targets = [n.data_address for n in others]
            pinged = pool.submit(transports[master.name].run,
                                 remote.argv(master.python, "netprobe", "ping", "-", CONNECT_TIMEOUT, *targets),
                                 timeout=CONNECT_TIMEOUT + 20)
            for name, future in reached.items():
                problem = future.result()
                if problem:
                    report.problems[name] = problem
            try:
                lines = pinged.result().stdout.splitlines()
            except ClusterrunError as exc:
                lines = [f"PING ERROR {getattr(exc, 'reason', exc)}"]
        if "PING MISSING" in lines:
            report.notes.append(f"{master.name} has no ping command: the way back to each node was not tested")
        for node in others:
            if f"PING {node.data_address} FAILED" in lines and node.name not in report.problems:
                report.problems[node.name] = (f"{master.name} gets no ping reply from {node.name}'s data address "
                                              f"{_where(node)}")
    finally:
        listener.abort()
        listener.wait(5.0)  # the port must be free again before torchrun's store binds it
        report.seconds = time.monotonic() - started
    return report
