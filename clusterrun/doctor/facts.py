"""What one probe of a node found: the raw output of each tool, by section name.

Doctor gathers facts with one shell command per node (see :mod:`clusterrun.doctor.probe`);
each tool's output lands in a :class:`Section`. Checks parse sections with the pure
parsers of :mod:`clusterrun.facts.parsers`, so every check can be tested on recorded
real output by building :class:`NodeFacts` by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterrun.doctor.model import Evidence

#: Exit code a section gets when its tool is not installed on the node (as a shell says it).
MISSING = 127


@dataclass(frozen=True)
class Section:
    name: str
    command: str
    exit_code: int
    output: str

    @property
    def missing(self) -> bool:
        """The tool is not installed (command not found)."""
        return self.exit_code == MISSING

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def evidence(self, node: str | None = None) -> Evidence:
        return Evidence(self.command, self.output, self.exit_code, node)


@dataclass(frozen=True)
class NodeFacts:
    """One node's probe result. ``error`` is set (and ``sections`` empty) when the node could not be probed."""

    node: str
    sections: Mapping[str, Section] = field(default_factory=dict)
    error: str | None = None
    latency_ms: float | None = None  # one round trip over the open connection
    connect_ms: float | None = None  # opening the connection (SSH handshake and auth)
    clock_offset_s: float | None = None  # node clock minus ours, at the middle of the probe's round trip
    python: Mapping[str, Any] = field(default_factory=dict)  # the inventory python's report (see probe.PYTHON_REPORT)

    @property
    def reachable(self) -> bool:
        return self.error is None

    def section(self, name: str) -> Section | None:
        return self.sections.get(name)

    def output(self, name: str) -> str | None:
        """The section's output when its command succeeded, else None."""
        s = self.sections.get(name)
        return s.output if s is not None and s.ok else None
