"""The facts of every node, without starting anything there: the node reporter run over each node's transport
(``plan --probe``, ``init``), beside the agents' collect and sweep."""

from __future__ import annotations

import json
from collections.abc import Mapping

from clusterrun import remote
from clusterrun.errors import ClusterrunError, StartError
from clusterrun.facts.node import LINE, ProbedNode
from clusterrun.planning.plan import LaunchPlan, NodePlan
from clusterrun.transport.base import Transport
from clusterrun.transport.fanout import on_every_node


def gather(plan: LaunchPlan, transports: Mapping[str, Transport]) -> dict[str, ProbedNode]:
    """Only the facts of every node, in parallel, from the node reporter (``plan --probe``, ``init``: nothing is
    created on the nodes).

    Raises :class:`StartError` naming every node that could not be probed.
    """
    def one(node: NodePlan) -> ProbedNode:
        res = transports[node.name].run(remote.argv(node.python, "nodefacts"), timeout=60)
        line = next((x for x in res.stdout.splitlines() if x.startswith(LINE)), None)
        if line is None:
            raise ClusterrunError(f"probing with {node.python} failed (exit {res.exit_code}): {res.tail(2) or 'no output'}")
        facts = json.loads(line[len(LINE):])
        return ProbedNode(node.name, net=facts.get("net"), ssh_address=transports[node.name].peer_address(),
                          gpus=facts.get("gpus"), gpu_model=facts.get("gpu_model"), gpu=facts.get("gpu"))

    out, problems = on_every_node(plan.nodes, lambda n: n.name, one, "facts")
    if problems:
        raise StartError(problems, hint="the nodes named could not be probed")
    return out
