"""A doctor round as its directory holds it (``runs/doctor-<time>/``): ``report.json`` and each node's probe output
under ``evidence/<node>/<section>.txt``, read back whatever state the round was left in (cut short, written by
an older clusterrun, a file half there). What cannot be read is said in :attr:`Round.missing`, never raised."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterrun.doctor.facts import GPU_SECTIONS, NodeFacts, Section
from clusterrun.doctor.probe import SECTIONS
from clusterrun.errors import ParseError
from clusterrun.facts.parsers import topo

_EVIDENCE = re.compile(r"\A\$ (?P<command>[^\n]*)\n# exit (?P<code>-?\d+)\n(?P<output>.*)\Z", re.S)


@dataclass(frozen=True)
class Measure:
    """One directed pair of :class:`clusterrun.doctor.model.PairMeasure`, as report.json holds it."""

    check: str
    network: str
    src: str
    dst: str
    value: float | None
    ok: bool | None
    src_nic: str | None
    dst_nic: str | None
    data_network: bool
    note: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Measure | None:
        if not isinstance(d, Mapping) or not d.get("src") or not d.get("dst"):
            return None
        value = d.get("value")
        ok = d.get("ok")
        return cls(str(d.get("check") or ""), str(d.get("network") or "?"), str(d["src"]), str(d["dst"]),
                   float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None,
                   ok if isinstance(ok, bool) else None, d.get("src_nic"), d.get("dst_nic"),
                   bool(d.get("data_network")), str(d.get("note") or ""))


@dataclass
class Round:
    directory: Path
    report: dict[str, Any] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    facts: dict[str, NodeFacts] = field(default_factory=dict)
    measures: list[Measure] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # what the page cannot show, and why

    @property
    def checks(self) -> list[dict[str, Any]]:
        """Each check, its findings those that are findings (a damaged report may hold anything)."""
        found = self.report.get("checks")
        return [{**c, "findings": [f for f in c.get("findings") or () if isinstance(f, Mapping)]
                 if isinstance(c.get("findings"), list) else []}
                for c in (found if isinstance(found, list) else ()) if isinstance(c, Mapping) and c.get("name")]

    def findings(self) -> list[dict[str, Any]]:
        return [{**f, "check": f.get("check") or c["name"]} for c in self.checks for f in c["findings"]]

    def topology(self, node: str) -> tuple[topo.Topology | None, str]:
        """The node's ``nvidia-smi topo -m`` matrix, or None and why not."""
        section = self.facts.get(node, NodeFacts(node)).section("nvidia_topo")
        if section is None:
            return None, "not probed"
        if section.missing:
            return None, "nvidia-smi is not installed"
        if not section.ok:
            return None, f"nvidia-smi topo -m failed (exit {section.exit_code}): {section.output.strip()[:160]}"
        try:
            return topo.parse(section.output), ""
        except ParseError as exc:
            return None, str(exc)


def _section(path: Path) -> Section | None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = _EVIDENCE.match(text)
    if m is None:
        return None
    return Section(path.stem, m["command"], int(m["code"]), m["output"].removesuffix("\n"))


def _facts(directory: Path, node: str) -> NodeFacts:
    where = directory / "evidence" / node
    error = where / "error.txt"
    if error.is_file():
        return NodeFacts(node, error=error.read_text(encoding="utf-8", errors="replace").strip() or "unreachable")
    sections = {}
    for path in sorted(where.glob("*.txt")):
        s = _section(path)
        if s is not None and (s.name in SECTIONS or s.name in ("facts", "python", *GPU_SECTIONS)):
            sections[s.name] = s
    return NodeFacts(node, sections)


def load_round(directory: Path) -> Round:
    """Whatever the round's directory holds; :attr:`Round.missing` says what it lacks."""
    found = Round(directory)
    path = directory / "report.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        found.report = data
    except FileNotFoundError:
        found.missing.append(f"{path} is not there: the round was cut short before it saved its report (or this is "
                             "not a doctor round); only the nodes' probe output is shown")
    except (OSError, ValueError) as exc:
        found.missing.append(f"{path} cannot be read ({exc}): it was cut short while being written; only the nodes' "
                             "probe output is shown")
    if found.report.get("cut_short"):
        found.missing.append(f"the round was cut short ({found.report['cut_short']}): the checks marked 'not run' "
                             "did not run")
    evidence = sorted(p.name for p in (directory / "evidence").glob("*") if p.is_dir())
    listed = found.report.get("nodes")
    nodes = [n for n in (listed if isinstance(listed, list) else ()) if isinstance(n, str)]
    found.nodes = nodes + [n for n in evidence if n not in nodes]
    for node in found.nodes:
        if (directory / "evidence" / node).is_dir():
            found.facts[node] = _facts(directory, node)
    if found.nodes and not evidence:
        found.missing.append("no node's probe output (evidence/) is there: no topology, GPU or NIC facts")
    measures = found.report.get("measures")
    found.measures = [m for m in (Measure.from_dict(d) for d in (measures if isinstance(measures, list) else ()))
                      if m]
    if found.report and "measures" not in found.report:
        found.missing.append("report.json has no pair measures (written by an older clusterrun): the network "
                             "matrices are drawn from the findings alone")
        found.measures = _from_findings(found)
    return found


def _from_findings(found: Round) -> list[Measure]:
    """An older report's bandwidth pairs, from the passing finding that lists them."""
    out = []
    for f in found.findings():
        for t in (f.get("data") or {}).get("transfers") or ():
            if isinstance(t, Mapping) and t.get("bps"):
                out.append(Measure("net.bandwidth", str(f.get("subject") or "data"), str(t.get("src")),
                                   str(t.get("dst")), float(t["bps"]), True, None, None, True, ""))
    return out


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
