"""The summary at the end of a run: a row per rank on small runs; on large ones a row per way the ranks ended, the
failed ranks still one each, with the nodes written as a host list."""

from __future__ import annotations

import io
from pathlib import Path

from clusterrun.cli.render import FOLD_OVER, print_summary, summary_rows
from clusterrun.launch.outcome import Failure, RankState
from clusterrun.runs import NodeRecord, RankRecord, RunDir, RunRecord, RunState

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "torchrun"


def outcome(nodes: int, per_node: int, state: RankState = RankState.succeeded) -> RunRecord:
    run = RunRecord("r1", RunState.running, started=0.0)
    for n in range(nodes):
        ranks = {}
        for local in range(per_node):
            rank = n * per_node + local
            ranks[rank] = RankRecord(rank, local, state, 0 if state is RankState.succeeded else None,
                                     started=1.0, ended=2.0 + n)
        run.nodes[f"gpu{n:02d}"] = NodeRecord(state, ranks=ranks)
    return run


def test_small_runs_list_every_rank() -> None:
    rows = summary_rows(outcome(2, 4))
    assert len(rows) == 8 and rows[0] == ("gpu00", "0", "succeeded", "0", "1.0s")
    assert len(summary_rows(outcome(8, FOLD_OVER // 8))) == FOLD_OVER


def test_large_runs_fold_ranks_that_ended_alike() -> None:
    rows = summary_rows(outcome(128, 8))
    assert rows == [("gpu[00-127] (128 nodes)", "0-1023", "succeeded", "0", "1.0s-2.1min")]


def test_failed_ranks_keep_their_rows_and_a_lost_nodes_reason_stays() -> None:
    run = outcome(16, 4, RankState.stopped)
    failed = run.nodes["gpu03"].ranks[13]
    failed.state, failed.exit_code = RankState.failed, 7
    lost = run.nodes["gpu09"]
    lost.state, lost.reason = RankState.unknown, "no word from the node for 16s"
    for rank in lost.ranks.values():
        rank.state = RankState.unknown
    rows = summary_rows(run)
    assert ("gpu03", "13", "failed", "7", "4.0s") in rows
    assert ("gpu09", "-", "unknown", "", "no word from the node for 16s") in rows
    stopped = next(r for r in rows if r[2] == "stopped")
    assert stopped[0] == "gpu[00-08,10-15] (15 nodes)"
    assert stopped[1] == "0-12,14-35,40-63"
    assert ("gpu09", "36-39", "unknown", "", "10.0s") in rows


STOPPED = (FIXTURES / "stopped_by_clusterrun.txt").read_text()


def failed_summary(tmp_path: Path, launcher: str) -> str:
    """The summary of a run that failed as a whole on gpu00 (it ran past its time limit), whose launcher.log is
    ``launcher``."""
    run_dir = RunDir.create(tmp_path, "r1")
    run_dir.launcher_log("gpu00").write_text(launcher)
    run = outcome(2, 2, RankState.stopped)
    run.first_failure = Failure("gpu00", None, 124, None, "the job ran past its 8s time limit")
    run.end(9.0)
    out = io.StringIO()
    print_summary(run, run_dir, file=out)
    return out.getvalue()


def test_a_node_failures_pointer_skips_torchruns_report_of_being_stopped(tmp_path: Path) -> None:
    said = failed_summary(tmp_path, STOPPED)
    assert "SignalException" not in said and "death signal" not in said
    assert "holds only torchrun's banner and its report of being stopped" in " ".join(said.split())
    assert "rank*.log" in said


def test_a_node_failures_pointer_names_the_launcher_lines_that_hold_the_cause(tmp_path: Path) -> None:
    lines = STOPPED.splitlines()
    cause = ["E1125 15:25:40.000000 31590 site-packages/torch/distributed/elastic/rendezvous/api.py:1] "
             "rendezvous closed: gpu07 left"]
    said = " ".join(failed_summary(tmp_path, "\n".join([*lines[:5], *cause, *lines[5:]]) + "\n").split())
    assert "launcher.log line 6 (what torchrun said before it was stopped):" in said
    assert "rendezvous closed: gpu07 left" in said
    assert "SignalException" not in said and "death signal" not in said
