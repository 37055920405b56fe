"""Open one transport per node of a plan."""

from __future__ import annotations

from typing import Any

from clusterrun.inventory.models import Inventory
from clusterrun.inventory.models import Transport as TransportKind
from clusterrun.plan import LaunchPlan
from clusterrun.transport.base import Transport
from clusterrun.transport.local import LocalTransport


def open_transports(inv: Inventory, plan: LaunchPlan, **ssh_options: Any) -> dict[str, Transport]:
    """``{node name: transport}``; SSH connections are opened lazily by the transport itself."""
    transports: dict[str, Transport] = {}
    for node in plan.nodes:
        if node.transport is TransportKind.local:
            transports[node.name] = LocalTransport(node.name)
        else:
            from clusterrun.transport.ssh import SshTransport

            spec = next(n for n in inv.nodes if n.name == node.name)
            transports[node.name] = SshTransport(node.name, spec.host, inv.ssh_of(spec), **ssh_options)
    return transports


def open_node_transports(inv: Inventory) -> dict[str, Transport]:
    """``{node name: transport}`` for every node of the inventory (no plan needed: exec, down, doctor)."""
    transports: dict[str, Transport] = {}
    for node in inv.nodes:
        if inv.transport_of(node) is TransportKind.local:
            transports[node.name] = LocalTransport(node.name)
        else:
            from clusterrun.transport.ssh import SshTransport

            transports[node.name] = SshTransport(node.name, node.host, inv.ssh_of(node))
    return transports
