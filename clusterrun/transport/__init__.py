"""How clusterrun runs commands on a node: one protocol, a local and an SSH implementation."""

from clusterrun.transport.base import CommandResult, Stream, Transport

__all__ = ["CommandResult", "Stream", "Transport"]
