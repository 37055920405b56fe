"""The launch timeline and the live state in the run record: the node clock's correction, slow phases, reading
old and half-written files, and what `clusterrun status` draws of them (pure: records in, text out)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from clusterrun.cli.run_view import live_view, timeline_table
from clusterrun.runs.judge import RankState
from clusterrun.runs.record import NodeRecord, RankRecord, RunRecord, RunState
from clusterrun.runs.timeline import PHASES, NodeLive, PhaseSpan, Timeline, ordered, slow_phases

T0 = 1_800_000_000.0


def text(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=200, highlight=False, color_system=None).print(renderable)
    return out.getvalue()


def full_timeline(offset: float = 0.0, staging: float = 0.1, copied: int = 0) -> dict[str, PhaseSpan]:
    spans, at = {}, T0 + offset
    for phase in PHASES:
        took = staging if phase == "staging" else 0.2
        spans[phase] = PhaseSpan(at, at + took, {"bytes": copied} if phase == "staging" else {})
        at += took
    return spans


@pytest.mark.parametrize(("node_time", "expected"), [(T0 - 5.0, T0), (T0 + 9.0, T0 + 2.0), (T0 + 1.0, T0 + 1.0)])
def test_node_clock_is_moved_into_the_exchange_that_carried_it(node_time: float, expected: float) -> None:
    timeline = Timeline()
    assert timeline.node_clock("n1", T0, node_time, T0 + 2.0) == pytest.approx(expected)
    # every later time of that node moves by as much
    assert timeline.on_our_clock("n1", node_time + 3.0) == pytest.approx(expected + 3.0)
    assert timeline.on_our_clock("n2", node_time) == node_time  # another node's clock is not touched


def test_stamps_of_a_phase_make_one_span_with_what_it_moved() -> None:
    timeline = Timeline()
    timeline.begin("n1", "staging", T0)
    timeline.end("n1", "staging", T0 + 4.0, bytes=2048)
    timeline.span(["n1", "n2"], "pathcheck", T0 + 5.0, T0 + 6.0, mode="quick")
    spans = timeline.of("n1")
    assert spans["staging"] == PhaseSpan(T0, T0 + 4.0, {"bytes": 2048})
    assert spans["staging"].seconds == 4.0
    assert timeline.of("n2")["pathcheck"].detail == {"mode": "quick"}
    timeline.begin("n1", "torchrun", T0 + 6.5, warm=True)
    timeline.end("n1", "torchrun", T0 + 8.0)
    assert timeline.of("n1")["torchrun"] == PhaseSpan(T0 + 6.5, T0 + 8.0, {"warm": True})


def test_a_slow_staging_is_named_with_what_it_copied() -> None:
    timelines = {f"crn{i}": full_timeline() for i in range(4)}
    timelines["crn5"] = full_timeline(staging=31.0, copied=2_100_000_000)
    assert slow_phases(timelines) == ["crn5: staging 31 s, 2.1 GB copied"]


def test_phases_as_slow_on_every_node_are_named_only_when_slow_for_any_run() -> None:
    usual = {f"n{i}": full_timeline(staging=6.0) for i in range(4)}
    assert slow_phases(usual) == []  # 6 s everywhere: that is this cluster's normal
    alone = {"n0": full_timeline(staging=25.0, copied=5_000_000)}
    assert slow_phases(alone) == ["n0: staging 25 s, 5.0 MB copied"]
    shared = {f"n{i}": {"pathcheck": PhaseSpan(T0, T0 + 40.0)} for i in range(3)}
    assert slow_phases(shared) == ["the path check took 40 s"]  # one step of every node: said once


def test_out_of_order_phases_are_found() -> None:
    assert ordered(full_timeline()) == []
    wrong = {**full_timeline(), "go": PhaseSpan(T0 - 1.0, T0 - 2.0)}
    assert ordered(wrong) == ["go ends before it starts", "go starts before pathcheck"]


def test_timeline_and_live_state_survive_status_json() -> None:
    node = NodeRecord(ranks={0: RankRecord(0, 0, RankState.running)}, timeline=full_timeline(copied=10),
                      live=NodeLive(T0, 1, T0 - 3.0, {"0": 0.97}, "ok"))
    record = RunRecord("r1", RunState.running, started=T0, nodes={"n1": node})
    data = record.to_dict()
    assert list(data["nodes"]["n1"]["timeline"]) == list(PHASES)
    assert data["nodes"]["n1"]["timeline"]["staging"]["bytes"] == 10
    again = RunRecord.from_dict(data)
    assert again.nodes["n1"].timeline == node.timeline and again.nodes["n1"].live == node.live


def test_files_without_a_timeline_or_with_a_broken_one_still_read() -> None:
    old = RunRecord.from_dict({"run_id": "r", "state": "succeeded", "nodes": {"n1": {"state": "succeeded"}}})
    assert old.nodes["n1"].timeline == {} and old.nodes["n1"].live is None
    assert timeline_table(old) is None
    odd = RunRecord.from_dict({"run_id": "r", "state": "running", "nodes": {"n1": {
        "timeline": {"connect": {"start": "soon"}, "agent": 3}, "live": {"cpu": "lots", "ranks_running": "x"}}}})
    assert odd.nodes["n1"].timeline == {"connect": PhaseSpan()}
    assert odd.nodes["n1"].live == NodeLive()


def test_status_draws_a_row_per_node_with_each_phase() -> None:
    nodes = {"n0": NodeRecord(timeline=full_timeline()),
             "n1": NodeRecord(timeline=full_timeline(offset=0.5, staging=3.0, copied=4_000_000))}
    shown = text(timeline_table(RunRecord("r", RunState.succeeded, nodes=nodes)))
    header = shown.splitlines()[1]
    assert all(p.replace("_", " ") in header for p in PHASES)
    n1 = next(line for line in shown.splitlines() if line.startswith(" n1"))
    assert "3.00s 4.0 MB" in n1 and n1.split()[-1] == "4.90s"  # its first line came 4.9 s after the first connect
    nodes["n0"].timeline["torchrun"] = PhaseSpan(T0 + 1.2, T0 + 1.4, {"warm": True})
    n0 = next(line for line in text(timeline_table(RunRecord("r", RunState.succeeded, nodes=nodes))).splitlines()
              if line.startswith(" n0"))
    assert "0.20s warm" in n0  # its torchrun had imported torch since the ready check


def test_live_view_names_each_nodes_phase_output_cpu_and_path() -> None:
    spans = full_timeline()
    nodes = {
        "n0": NodeRecord(timeline=spans, live=NodeLive(T0 + 60, 2, T0 + 55, {"0": 0.9, "1": 0.5}, "ok")),
        "n1": NodeRecord(timeline={p: s for p, s in spans.items() if p != "first_line"} | {
            "first_line": PhaseSpan(T0 + 1, None)}, live=NodeLive(T0 + 60, 2, None, {}, "lost: n0")),
    }
    record = RunRecord("r", RunState.running, started=T0, nodes=nodes)
    shown = text(live_view(record, [("n0", 2), ("n1", 2), ("n2", 2)], now=T0 + 61))
    rows = {line.split()[0]: line for line in shown.splitlines()[2:] if line.strip()}
    assert "running" in rows["n0"] and "2/2" in rows["n0"] and "5s ago" in rows["n0"] and "70% (min 50%)" in rows["n0"]
    assert "first line..." in rows["n1"] and "lost: n0" in rows["n1"]
    assert "starting" in rows["n2"] and "-/2" in rows["n2"]  # not in the record yet
    assert shown.startswith("run r: running, 61s, 3 node(s), 6 rank(s)")
