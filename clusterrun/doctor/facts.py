"""What one probe of a node found: the raw output of each tool, by section name.

Doctor gathers facts with one shell command per node (see :mod:`clusterrun.doctor.probe`);
each tool's output lands in a :class:`Section`. Checks parse sections with the pure
parsers of :mod:`clusterrun.facts.parsers`, so every check can be tested on recorded
real output by building :class:`NodeFacts` by hand. The node's NICs, RDMA ports and GPUs come from the
section ``facts``: the node reporter that ``up``, ``plan --probe`` and ``init`` run too, read through the same
parser (:attr:`NodeFacts.report`); its nvidia-smi calls (the node's one nvidia-smi round) are shown as sections of
their own (:data:`GPU_SECTIONS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from clusterrun.doctor.model import Evidence
from clusterrun.errors import ParseError
from clusterrun.facts.gpus import NodeGpus
from clusterrun.facts.node import IP_COMMAND, RDMA_SOURCE, NodeReport, parse_output
from clusterrun.remote import gpufacts

#: Exit code a section gets when its tool is not installed on the node (as a shell says it).
MISSING = 127
#: The section that holds the node reporter's output.
FACTS = "facts"
#: What the reporter's RDMA listing is shown as in the evidence.
RDMA_COMMAND = f"{RDMA_SOURCE}/*/ports/*"
#: The sections the reporter's nvidia-smi calls are shown as: section name -> its call.
GPU_SECTIONS = {"nvidia_smi": "query", "nvidia_apps": "apps", "nvidia_topo": "topo"}


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
        """The section ``name``; for a GPU section the probe did not hold, the reporter's call (see
        :meth:`gpu_section`)."""
        found = self.sections.get(name)
        return self.gpu_section(name) if found is None and name in GPU_SECTIONS else found

    def output(self, name: str) -> str | None:
        """The section's output when its command succeeded, else None."""
        s = self.sections.get(name)
        return s.output if s is not None and s.ok else None

    @cached_property
    def _read_report(self) -> tuple[NodeReport | None, str]:
        section = self.sections.get(FACTS)
        if section is None:
            return None, "the node's facts were not gathered"
        if section.missing:
            return None, ("no python on the node to read them with (neither the inventory's python nor python3 "
                          "is there)")
        if not section.ok:
            last = section.output.strip().splitlines()[-1:] or ["no output"]
            return None, f"the node's facts reporter failed (exit {section.exit_code}): {last[0][:200]}"
        try:
            return parse_output(self.node, section.output), ""
        except ParseError as exc:
            return None, str(exc)

    @property
    def report(self) -> NodeReport | None:
        """The node reporter's record (NICs, RDMA ports, GPUs): None when it did not run or said nothing usable
        (:attr:`report_problem` says why)."""
        return self._read_report[0]

    @property
    def report_problem(self) -> str:
        """Why :attr:`report` is None ("" when it is not)."""
        return self._read_report[1]

    @property
    def gpus(self) -> NodeGpus | None:
        """The node's GPUs as the reporter read them (the model ``up`` chooses from); None without nvidia-smi and
        CUDA_VISIBLE_DEVICES there, or without the reporter's record (:attr:`report_problem`)."""
        return self.report.gpu if self.report is not None else None

    def gpu_section(self, name: str) -> Section | None:
        """The reporter's nvidia-smi call ``name`` (a key of :data:`GPU_SECTIONS`) as a section of its own, for
        evidence: exit 127 where nvidia-smi is not there; None without the reporter's record."""
        if self.report is None:
            return None
        call = self.gpus.calls.get(GPU_SECTIONS[name]) if self.gpus is not None else None
        if call is None:
            command = " ".join(gpufacts.commands(gpufacts.TOOL)[GPU_SECTIONS[name]])
            return Section(name, command, MISSING, f"{gpufacts.TOOL}: not installed")
        return Section(name, call.command, call.exit_code, call.output.rstrip("\n"))

    def ip_section(self) -> Section | None:
        """What the reporter's ``ip -j addr show`` printed, as a section of its own (for evidence)."""
        report = self.report
        if report is None:
            return self.sections.get(FACTS)
        error = "" if report.ip_ran else str(report.ip_error or "")
        return Section("ip_addr", IP_COMMAND, 0 if report.ip_ran else 1, report.ip_output or error)

    def rdma_section(self) -> Section | None:
        """The reporter's listing of the RDMA ports, one line each, as a section of its own (for evidence)."""
        report = self.report
        return None if report is None else Section("rdma_sys", RDMA_COMMAND, 0, report.rdma_listing())
