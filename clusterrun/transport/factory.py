"""Open one transport per node: local nodes run subprocesses, srun nodes Slurm job steps, the others SSH."""

from __future__ import annotations

from typing import Any

from clusterrun.inventory.models import Inventory, Node
from clusterrun.inventory.models import Transport as TransportKind
from clusterrun.planning.plan import LaunchPlan
from clusterrun.transport.base import Transport
from clusterrun.transport.local import LocalTransport


def transport_for(inv: Inventory, node: Node, **ssh_options: Any) -> Transport:
    """The node's transport; an SSH connection is opened lazily by the transport itself."""
    kind = inv.transport_of(node)
    if kind is TransportKind.local:
        return LocalTransport(node.name)
    if kind is TransportKind.srun:
        from clusterrun.transport.srun import SrunTransport

        return SrunTransport(node.name, node.host)
    from clusterrun.transport.ssh.transport import SshTransport

    return SshTransport(node.name, node.host, inv.ssh_of(node), **ssh_options)


def open_transports(inv: Inventory, plan: LaunchPlan, **ssh_options: Any) -> dict[str, Transport]:
    """``{node name: transport}`` for the nodes of a plan."""
    nodes = {n.name: n for n in inv.nodes}
    return {node.name: transport_for(inv, nodes[node.name], **ssh_options) for node in plan.nodes}


def open_node_transports(inv: Inventory) -> dict[str, Transport]:
    """``{node name: transport}`` for every node of the inventory (no plan needed: exec, doctor, init)."""
    return {node.name: transport_for(inv, node) for node in inv.nodes}
