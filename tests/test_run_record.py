"""The run record: status.json written and read back through RunRecord, older files read with sensible values,
and the rank logs of a restarted run found in the attempt that holds them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from clusterrun.runs import (
    AttemptRecord,
    NodeRecord,
    RankRecord,
    RunDir,
    RunRecord,
    RunState,
    read_record,
    run_record,
    write_record,
)
from clusterrun.runs.judge import Failure, RankState


def full_record() -> RunRecord:
    failure = Failure("node3", None, 1, None, "its data path died: stopped answering")
    return RunRecord(
        "20261125-100000-abcd", RunState.succeeded, started=100.0, ended=187.0, exit_code=0,
        first_failure=failure, notes=("attempt 0 on 4 node(s): failed",),
        events=({"time": 130.0, "node": "node3", "kind": "path-lost", "text": "eth1 down", "attempt": 0},),
        watch={"node0": {"sent": 3, "received": 3}},
        logs={"complete": True, "gaps": [], "unverified": [], "received": {}},
        nodes={"node0": NodeRecord(RankState.succeeded, 0, "finished", 140.0, 140.5, 187.0,
                                   {0: RankRecord(0, 0, RankState.succeeded, 0, None, 140.6, 186.9)})},
        attempts=(AttemptRecord(0, ("node0", "node1", "node2", "node3"), 100.0, 135.0, "failed", 1,
                                "node3: its data path died", first_failure=failure),
                  AttemptRecord(1, ("node0", "node1", "node2"), 140.0, 187.0, "succeeded", 0,
                                left_out={"node3": "its data path died"})))


def test_a_record_reads_back_as_it_was_written(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "20261125-100000-abcd")
    record = full_record()
    write_record(run, record)
    assert read_record(run) == record
    data = json.loads((run.path / "status.json").read_text())
    assert data["duration"] == 87.0 and data["restart_count"] == 1 and data["started"] == 100.0
    assert [a["duration"] for a in data["attempts"]] == [35.0, 47.0]
    assert data["events"][0]["kind"] == "path-lost" and data["first_failure"]["node"] == "node3"
    assert (run.path / "status.json").stat().st_mode & 0o777 == 0o600


def test_an_older_restarted_runs_file_gets_the_first_attempts_start(tmp_path: Path) -> None:
    """Before the record covered every attempt, the top said the last attempt's start and kept no events."""
    run = RunDir.create(tmp_path, "20261120-090000-0001")
    (run.path / "status.json").write_text(json.dumps({
        "run_id": run.run_id, "state": "succeeded", "exit_code": 0, "started": 150.0, "ended": 190.0,
        "duration": 40.0, "first_failure": None, "events": [], "notes": [],
        "nodes": {"a": {"state": "succeeded", "exit_code": 0, "ranks": {"0": {"rank": 0, "state": "succeeded"}}}},
        "restart_count": 1,
        "attempts": [{"attempt": 0, "nodes": ["a", "b"], "started": 100.0, "ended": 140.0, "state": "failed"},
                     {"attempt": 1, "nodes": ["a"], "started": 150.0, "ended": 190.0, "state": "succeeded"}],
        "something_new": {"kept": True}}))
    record = read_record(run)
    assert record.started == 100.0 and record.duration == 90.0 and record.restart_count == 1
    assert record.nodes["a"].ranks[0].local_rank is None and record.nodes["a"].launched is None
    assert record.to_dict()["something_new"] == {"kept": True}  # what this version does not know is kept


def test_older_files_with_few_keys_read_with_sensible_values(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "20261120-090000-0002")
    (run.path / "status.json").write_text(json.dumps({"started": 5.0, "pid": 1, "state": "starting"}))
    record = read_record(run)
    assert record.run_id == run.run_id and record.state is RunState.starting and record.events == ()
    assert record.duration is None and record.attempts == () and record.first_failure is None
    (run.path / "status.json").write_text(json.dumps({"state": "not-started", "problems": ["no such host"]}))
    assert read_record(run).problems == {"clusterrun": "no such host"}
    (run.path / "status.json").write_text("{half a fi")
    assert read_record(run).state is RunState.unknown
    (run.path / "status.json").write_text(json.dumps({"state": "detached", "detached": True,
                                                      "nodes": {"n": {"launched": 7.0}}}))
    assert read_record(run).nodes["n"] == NodeRecord(launched=7.0) and read_record(run).detached


def test_a_running_record_whose_clusterrun_is_gone_is_lost(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "20261120-090000-0003")
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)
    write_record(run, RunRecord(run.run_id, RunState.running, started=1.0, pid=gone))
    assert run_record(run).state is RunState.lost and read_record(run).state is RunState.running
    write_record(run, RunRecord(run.run_id, RunState.running, started=1.0, pid=os.getpid()))
    assert run_record(run).state is RunState.running


def test_a_nodes_logs_are_found_in_the_attempt_that_holds_them(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "20261120-090000-0004")
    for node, rank in (("a", 0), ("b", 1)):
        run.node_dir(node)
        run.rank_log(node, rank).write_text(f"attempt 0 {node}\n")
    run.archive_attempt(0)
    run.node_dir("a")
    run.rank_log("a", 0).write_text("attempt 1 a\n")
    found = {(n, r): p.read_text() for n, r, p in run.rank_logs()}
    assert found == {("a", 0): "attempt 1 a\n", ("b", 1): "attempt 0 b\n"}  # b was left out of attempt 1
    assert [p.parent.parent.name for _n, _r, p in run.rank_logs(node="b")] == ["attempt-0"]
    assert run.rank_logs(node="c") == []


def test_the_layout_names_every_file_a_run_directory_keeps() -> None:
    # runs/dirs.py's docstring is where a reader looks up a file of runs/<id>/: a file added without a line there fails.
    from clusterrun.report.write import PAGE
    from clusterrun.runs import dirs, series

    layout = {line.split()[0] for line in (dirs.__doc__ or "").splitlines() if line.startswith("    ")}
    assert {*RunDir.RUN_FILES, PAGE, f"<node>/{series.RAW}"} <= layout, sorted(layout)
