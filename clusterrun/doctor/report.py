"""A doctor report: every finding, each check's verdict, the recommended settings, the exit code."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterrun.doctor.facts import GPU_SECTIONS, NodeFacts
from clusterrun.doctor.fold import Folded, fold
from clusterrun.doctor.model import Finding, PairMeasure, Verdict, worst
from clusterrun.doctor.registry import Check

#: Exit codes: every check passed (or was skipped) / a warning but no failure / a failure.
EXIT_PASS, EXIT_FAIL, EXIT_WARN = 0, 1, 3


@dataclass
class Report:
    nodes: list[str]
    checks: list[Check]
    findings: list[Finding] = field(default_factory=list)
    facts: dict[str, NodeFacts] = field(default_factory=dict)
    recommended: str = ""  # an inventory snippet
    started: float = 0.0
    duration: float = 0.0
    directory: Path | None = None
    measures: list[PairMeasure] = field(default_factory=list)  # every pair measured, for the matrices of the page
    ran: list[str] = field(default_factory=list)  # the checks that ran to their end
    cut_short: str | None = None  # why the round ended before every check ran (Ctrl-C, an error)

    def problems(self) -> list[Folded]:
        """Failures, then warnings, each told once for all the nodes or pairs it was found on."""
        return fold([f for f in self.findings if f.verdict in (Verdict.failed, Verdict.warned)], self.nodes)

    def of(self, check: str) -> list[Finding]:
        return [f for f in self.findings if f.check == check]

    def verdict_of(self, check: str) -> Verdict:
        found = self.of(check)
        return worst([f.verdict for f in found]) if found else Verdict.skipped

    @property
    def verdict(self) -> Verdict:
        """fail, warn, or pass (checks that did not apply count as passed)."""
        v = worst([f.verdict for f in self.findings])
        return Verdict.passed if v is Verdict.skipped else v

    @property
    def exit_code(self) -> int:
        v = self.verdict
        return EXIT_FAIL if v is Verdict.failed else EXIT_WARN if v is Verdict.warned else EXIT_PASS

    def counts(self) -> dict[str, int]:
        out = {v.value: 0 for v in Verdict}
        for c in self.checks:
            out[self.verdict_of(c.name).value] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value, "exit_code": self.exit_code, "nodes": self.nodes,
            "started": self.started, "duration_s": self.duration, "counts": self.counts(),
            "checks": [{"name": c.name, "title": c.title, "scope": c.scope.value, "verdict": self.verdict_of(c.name).value,
                        "findings": [f.to_dict() for f in self.of(c.name)],
                        **({} if c.name in self.ran or not self.cut_short else {"ran": False})}
                       for c in self.checks],
            "recommended": self.recommended,
            "directory": str(self.directory) if self.directory else None,
            "measures": [m.to_dict() for m in self.measures],
            **({"cut_short": self.cut_short} if self.cut_short else {}),
        }

    def save(self, directory: Path) -> None:
        """report.json, plus every node's raw probe output under evidence/<node>/<section>.txt."""
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory.resolve()
        for name, facts in self.facts.items():
            node_dir = directory / "evidence" / name
            node_dir.mkdir(parents=True, exist_ok=True)
            if facts.error:
                (node_dir / "error.txt").write_text(facts.error + "\n", encoding="utf-8")
            # The reporter's `ip -j addr`, RDMA listing and nvidia-smi calls also get files of their own, readable
            # without its JSON.
            derived = [s for s in (facts.ip_section(), facts.rdma_section(), *map(facts.gpu_section, GPU_SECTIONS))
                       if s and s.name not in facts.sections]
            for section in (*facts.sections.values(), *derived):
                (node_dir / f"{section.name}.txt").write_text(
                    f"$ {section.command}\n# exit {section.exit_code}\n{section.output}\n", encoding="utf-8")
        (directory / "report.json").write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n",
                                               encoding="utf-8")
