"""doctor tells a problem found on several nodes or pairs once: the real checks' findings (``limits.nofile`` on
eight nodes from their ``ulimit -n`` output, ``net.bandwidth`` judging 24 transfers under half the line rate),
folded by ``Report.problems`` and printed by ``print_report``; the saved report keeps every finding.

Nothing runs on a node: probes are built from their output text, transfers by hand (the bandwidth a
tournament of three rounds between eight nodes would measure).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

import clusterrun.doctor.checks.limits  # noqa: F401  (registers the checks)
from clusterrun.doctor.checks.net import Transfer, _judge_bandwidth
from clusterrun.doctor.checks.paths import Endpoint, Network
from clusterrun.doctor.facts import NodeFacts, Section
from clusterrun.doctor.fold import fold
from clusterrun.doctor.model import Evidence, Finding, Verdict
from clusterrun.doctor.probe import SECTIONS
from clusterrun.doctor.registry import CHECKS, Context
from clusterrun.doctor.render import print_report
from clusterrun.doctor.report import Report
from clusterrun.doctor.schedule import round_robin
from clusterrun.inventory.models import Inventory

NODES = [f"crn{i}" for i in range(8)]
GBIT = 1e9


def eight_nodes(nofile: dict[str, str] | None = None) -> Context:
    """crn0..crn7, each with eth1 at 10gbit on 10.0.0.0/24 and the ``ulimit -n`` output ``nofile`` gives (1024)."""
    nofile = nofile or {}
    inv = Inventory.model_validate({"nodes": [
        {"name": n, "host": f"192.168.1.{10 + i}", "nics": [{"name": "eth1", "ip": f"10.0.0.{10 + i}/24",
                                                            "speed": "10gbit"}]}
        for i, n in enumerate(NODES)]})
    facts = {n: NodeFacts(n, {"ulimit_nofile": Section("ulimit_nofile", SECTIONS["ulimit_nofile"], 0,
                                                       nofile.get(n, "1024\n"))}) for n in NODES}
    return Context(inv, facts)


def nofile_findings(ctx: Context) -> list[Finding]:
    return list(CHECKS["limits.nofile"].run(ctx))


def bandwidth_findings(ctx: Context, rates: dict[tuple[str, str], float | None] | None = None) -> list[Finding]:
    """``net.bandwidth``'s verdict on three rounds of the tournament (24 transfers), each a little under
    4 Gbit/s on 10 Gbit/s NICs unless ``rates`` says otherwise."""
    rates = rates or {}
    data = Network("10.0.0.0/24", {n: Endpoint(n, "eth1", f"10.0.0.{10 + i}") for i, n in enumerate(NODES)},
                   data=True)
    transfers = []
    for k, (a, b) in enumerate(pair for rnd in round_robin(NODES)[:3] for pair in rnd):
        for s, d in ((a, b), (b, a)):
            bps = rates.get((s, d), (3.9 + 0.01 * k) * GBIT)
            transfers.append(Transfer(s, d, bps, "iperf3", None if bps else "iperf3 server did not start",
                                      (Evidence(f"iperf3 -c {d} -J", "{}", 0, s),)))
    assert len(transfers) == 24
    return list(_judge_bandwidth(ctx, data, transfers, "iperf3"))


def report_of(findings: list[Finding], tmp_path: Path | None = None) -> Report:
    checks = [CHECKS[name] for name in dict.fromkeys(f.check for f in findings)]
    report = Report(nodes=list(NODES), checks=checks, findings=findings)
    if tmp_path is not None:
        report.save(tmp_path / "doctor-report")
    return report


def printed(report: Report, *, verbose: bool = False) -> str:
    out = io.StringIO()
    print_report(report, out, verbose=verbose)
    return out.getvalue()


def problems_section(text: str) -> str:
    return text.split("Problems", 1)[1].split("\ndoctor: ", 1)[0]


# --- the two cases doctor used to repeat ---------------------------------------------------------------------------


def test_same_nofile_warning_on_eight_nodes_is_told_once_with_the_nodes_compact() -> None:
    findings = nofile_findings(eight_nodes())
    assert [f.verdict for f in findings] == [Verdict.warned] * 8

    (problem,) = report_of(findings).problems()

    assert problem.summary == "crn[0-7] (8 nodes): open-files limit is 1024 (ulimit -n), below 65536"
    assert problem.hint == findings[0].hint
    assert problem.findings == tuple(findings)
    text = problems_section(printed(report_of(findings)))
    assert text.count("open-files limit is") == 1 and text.count("limits.conf") == 1


def test_same_bandwidth_warning_on_24_pairs_is_told_once_with_the_pairs_and_the_range() -> None:
    findings = bandwidth_findings(eight_nodes())
    warned = [f for f in findings if f.verdict is Verdict.warned]
    assert len(warned) == 24  # each transfer under half the line rate, no node an outlier

    (problem,) = fold(warned, NODES)

    assert problem.summary.endswith(" (24 pairs): 3.90-4.01 Gbit/s, under half the listed 10.00 Gbit/s")
    # Grouped by sender, in inventory order, cut to a screen line: crn0 sent to its partners of three rounds.
    assert problem.summary.startswith("crn0->crn[5-7], crn1->crn[2,4,6], ")
    assert problem.hint == warned[0].hint
    assert len(problem.findings) == 24


def test_nodes_and_pairs_with_a_different_value_fold_with_its_range() -> None:
    findings = nofile_findings(eight_nodes({"crn3": "4096\n"}))

    (problem,) = fold(findings, NODES)

    assert problem.summary == "crn[0-7] (8 nodes): open-files limit is 1024-4096 (ulimit -n), below 65536"


# --- the report around it -------------------------------------------------------------------------------------------


def test_a_failure_is_printed_before_the_folded_warnings(tmp_path: Path) -> None:
    findings = [*nofile_findings(eight_nodes()), *bandwidth_findings(eight_nodes(), {("crn2", "crn5"): None})]

    text = problems_section(printed(report_of(findings, tmp_path)))
    lines = [line for line in text.splitlines() if re.match(r"\s*(FAIL|WARN) ", line)]

    assert lines[0].startswith("FAIL net.bandwidth: crn2 -> crn5 on 10.0.0.0/24: no measure")
    assert [line.split()[0] for line in lines] == ["FAIL", "WARN", "WARN"]
    assert len(text.splitlines()) < 15  # 31 problems, told in three


def test_saved_report_keeps_every_finding(tmp_path: Path) -> None:
    findings = [*nofile_findings(eight_nodes()), *bandwidth_findings(eight_nodes())]
    report = report_of(findings, tmp_path)

    saved = json.loads((tmp_path / "doctor-report" / "report.json").read_text())

    kept = {c["name"]: [f["verdict"] for f in c["findings"]] for c in saved["checks"]}
    assert kept["limits.nofile"] == ["warn"] * 8
    assert kept["net.bandwidth"].count("warn") == 24
    assert report.counts()["warn"] == 2


def test_verbose_lists_each_folded_finding_under_its_line() -> None:
    report = report_of(nofile_findings(eight_nodes()))

    text = problems_section(printed(report, verbose=True))

    assert "crn[0-7] (8 nodes): open-files limit is 1024" in text
    for node in NODES:
        assert f"         {node}: open-files limit is 1024 (ulimit -n), below 65536" in text
    assert text.count("limits.conf") == 1


# --- what folds and what does not ---------------------------------------------------------------------------------


def warn(summary: str, node: str | None = None, hint: str | None = "fix it", check: str = "x.y") -> Finding:
    return Finding(check, Verdict.warned, summary, node=node, hint=hint)


@pytest.mark.parametrize(
    ("summaries", "expected"),
    [
        # One finding is told as it is.
        (["crn1: eth1 is down"], ["crn1: eth1 is down"]),
        # Something other than the node differs (the NIC): told apart.
        (["crn1: eth1 is down", "crn2: eth2 is down"], ["crn1: eth1 is down", "crn2: eth2 is down"]),
        # A name inside a longer one is not that node; addresses are not numbers.
        (["crn1: crn10-ib is down", "crn2: crn10-ib is down"], ["crn[1-2] (2 nodes): crn10-ib is down"]),
        (["crn1: no reply from 10.0.0.2", "crn3: no reply from 10.0.0.4"],
         ["crn1: no reply from 10.0.0.2", "crn3: no reply from 10.0.0.4"]),
        # Nodes listed in inventory order whatever order they were found in.
        (["crn5: x", "crn0: x", "crn1: x"], ["crn[0-1,5] (3 nodes): x"]),
        # The same node named twice in each, and a peer that stays the same.
        (["crn1 -> crn0: slow", "crn2 -> crn0: slow"], ["crn[1-2] (2 nodes) -> crn0: slow"]),
        # One node named twice in each.
        (["crn1: add gpus to crn1", "crn2: add gpus to crn2"], ["crn[1-2] (2 nodes): add gpus to crn[1-2]"]),
        # Two names that both vary but are not a pair ("and" would be; "sees" is not).
        (["crn1 sees crn2", "crn3 sees crn4"], ["crn1 sees crn2", "crn3 sees crn4"]),
        # The very same line twice.
        (["clock skew unknown", "clock skew unknown"], ["clock skew unknown (2 times)"]),
    ],
)
def test_what_folds(summaries: list[str], expected: list[str]) -> None:
    assert [p.summary for p in fold([warn(s) for s in summaries], [*NODES, "crn10"])] == expected


def test_different_hints_keep_findings_apart_but_node_names_in_the_hint_fold() -> None:
    apart = fold([warn("crn1: x", hint="a"), warn("crn2: x", hint="b")], NODES)
    together = fold([warn("crn1: x", hint="drain crn1"), warn("crn2: x", hint="drain crn2")], NODES)

    assert [p.hint for p in apart] == ["a", "b"]
    assert [(p.summary, p.hint) for p in together] == [("crn[1-2] (2 nodes): x", "drain crn[1-2]")]


def test_every_pair_of_a_set_is_said_so() -> None:
    pairs = [warn(f"{a} -> {b}: slow") for a in NODES[:4] for b in NODES[:4] if a != b]

    assert [p.summary for p in fold(pairs, NODES)] == ["every pair of crn[0-3] (12 pairs): slow"]


def test_long_node_lists_are_cut_with_a_count() -> None:
    names = [f"node-{word}" for word in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
                                         "india", "juliet")]

    (problem,) = fold([warn(f"{n}: x") for n in names], names)

    assert problem.summary.startswith("10 nodes: node-alpha, node-bravo, ")
    assert problem.summary.endswith(", ...: x")
