"""``up --detach``: start every node's job and leave it running without clusterrun.

Each node agent is started with ``detached`` set: it no longer stops the job when its connection
closes or its heartbeats stop, and its rank logs stay in its run directory on the node. clusterrun
waits until every agent has started torchrun, then closes the connections. ``clusterrun logs RUN``
reads the logs from the nodes, ``clusterrun down RUN`` stops the run on every node.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from clusterrun.agents.link import AgentLink
from clusterrun.agents.spec import run_spec
from clusterrun.errors import ClusterrunError, NodeNotReady, StartError
from clusterrun.plan import LaunchPlan
from clusterrun.remote import protocol

START_TIMEOUT = 60.0


def start_detached(plan: LaunchPlan, links: Mapping[str, AgentLink],
                   stage: Mapping[str, list[tuple[str, str, str]]], grace: float) -> dict[str, float]:
    """``{node: when its torchrun started}``. Raises :class:`StartError` (after stopping what did start)."""
    problems: dict[str, str] = {}
    for node in plan.nodes:
        spec = run_spec(node, plan.run_id, grace=grace, heartbeat_timeout=0, stage=stage.get(node.name),
                        detached=True, script_args=len(plan.job.args))
        try:
            links[node.name].go(spec)
        except ClusterrunError as exc:
            problems[node.name] = getattr(exc, "reason", str(exc))
    deadline = time.monotonic() + START_TIMEOUT
    launched: dict[str, float] = {}
    for node in plan.nodes:
        link = links[node.name]
        try:
            if node.name in problems:
                continue
            event = link.answer((protocol.STARTED, protocol.ERROR, protocol.EXIT), deadline)
            if event.get("ev") == protocol.STARTED:
                launched[node.name] = float(event.get("time") or time.time())
            else:
                raise NodeNotReady(node.name, event.get("text") or event.get("reason") or "torchrun did not start")
        except ClusterrunError as exc:
            problems[node.name] = getattr(exc, "reason", str(exc))
        finally:
            link.abort()  # a detached agent carries on without this connection
    if problems:
        raise StartError(problems, hint=f"the nodes that did start are still running it: `clusterrun down "
                                        f"{plan.run_id}` stops them")
    return launched
