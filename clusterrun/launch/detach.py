"""``up --detach``: start every node's job and leave it running without clusterrun.

Each node agent is started with ``detached`` set: it no longer stops the job when its connection
closes or its heartbeats stop, and its rank logs stay in its run directory on the node. clusterrun
waits until every agent has started torchrun, then closes the connections. ``clusterrun logs RUN``
reads the logs from the nodes, ``clusterrun down RUN`` stops the run on every node.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from clusterrun.errors import ClusterrunError, StartError
from clusterrun.launch.agent_cmd import agent_spec, run_argv
from clusterrun.launch.fanout import on_every_node
from clusterrun.launch.frames import frames
from clusterrun.plan import LaunchPlan, NodePlan
from clusterrun.transport.base import Transport

START_TIMEOUT = 60.0


def start_detached(plan: LaunchPlan, transports: Mapping[str, Transport],
                   stage: Mapping[str, list[tuple[str, str, str]]], grace: float) -> dict[str, float]:
    """``{node: when its torchrun started}``. Raises :class:`StartError` (after stopping what did start)."""

    def one(node: NodePlan) -> float:
        spec = agent_spec(node, plan.run_id, grace=grace, heartbeat_timeout=0, stage=stage.get(node.name),
                          detached=True)
        stream = transports[node.name].start(run_argv(node, spec, inline=node.transport.value == "ssh"))
        deadline = time.monotonic() + START_TIMEOUT
        try:
            for frame in frames(stream.chunks()):
                event = frame.event
                if event.get("ev") == "started":
                    return float(event.get("time") or time.time())
                if event.get("ev") in ("error", "exit"):
                    raise ClusterrunError(event.get("text") or event.get("reason") or "torchrun did not start")
                if time.monotonic() > deadline:
                    break
            raise ClusterrunError(f"the node agent did not start torchrun within {START_TIMEOUT:g}s: "
                                  f"{stream.stderr_text().strip()[-200:] or 'no output'}")
        finally:
            stream.abort()  # a detached agent carries on without this connection

    launched, problems = on_every_node(plan.nodes, lambda n: n.name, one, "detach")
    if problems:
        raise StartError(problems, hint=f"the nodes that did start are still running it: `clusterrun down "
                                        f"{plan.run_id}` stops them")
    return launched
