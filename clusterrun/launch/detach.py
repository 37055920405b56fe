"""``up --detach``: start every node's job and leave it running without clusterrun.

Each node agent is started with ``detached`` set: it no longer stops the job when its connection
closes or its heartbeats stop, and its rank logs stay in its run directory on the node. clusterrun
waits until every agent has started torchrun, then closes the connections. ``clusterrun logs RUN``
reads the logs from the nodes, ``clusterrun down RUN`` stops the run on every node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from clusterrun.errors import NodeNotReady, StartError
from clusterrun.launch.agent_cmd import agent_spec, start_agent
from clusterrun.plan import LaunchPlan, NodePlan
from clusterrun.remote import protocol
from clusterrun.remote.protocol import frames
from clusterrun.transport.base import Transport
from clusterrun.transport.fanout import on_every_node

START_TIMEOUT = 60.0


def start_detached(plan: LaunchPlan, transports: Mapping[str, Transport],
                   stage: Mapping[str, list[tuple[str, str, str]]], grace: float) -> dict[str, float]:
    """``{node: when its torchrun started}``. Raises :class:`StartError` (after stopping what did start)."""

    def one(node: NodePlan) -> float:
        spec = agent_spec(node, plan.run_id, grace=grace, heartbeat_timeout=0, stage=stage.get(node.name),
                          detached=True, script_args=len(plan.job.args))
        stream = start_agent(transports[node.name], node, spec)
        # The stream is dropped at the deadline whether or not anything arrives: the read below ends then.
        timer = threading.Timer(START_TIMEOUT, stream.abort)
        timer.daemon = True
        timer.start()
        try:
            for frame in frames(stream.chunks()):
                event = frame.event
                if event.get("ev") == protocol.STARTED:
                    return float(event.get("time") or time.time())
                if event.get("ev") in (protocol.ERROR, protocol.EXIT):
                    raise NodeNotReady(node.name, event.get("text") or event.get("reason") or "torchrun did not start")
            raise NodeNotReady(node.name, f"the node agent did not start torchrun within {START_TIMEOUT:g}s: "
                                          f"{stream.stderr_text().strip()[-200:] or 'no output'}")
        finally:
            timer.cancel()
            stream.abort()  # a detached agent carries on without this connection

    launched, problems = on_every_node(plan.nodes, lambda n: n.name, one, "detach")
    if problems:
        raise StartError(problems, hint=f"the nodes that did start are still running it: `clusterrun down "
                                        f"{plan.run_id}` stops them")
    return launched
