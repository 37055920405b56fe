"""The summary at the end of a run: a row per rank on small runs; on large ones a row per way the ranks ended, the
failed ranks still one each, with the nodes written as a host list."""

from __future__ import annotations

from clusterrun.cli.render import FOLD_OVER, summary_rows
from clusterrun.launch.outcome import NodeOutcome, RankOutcome, RankState, RunOutcome


def outcome(nodes: int, per_node: int, state: RankState = RankState.succeeded) -> RunOutcome:
    run = RunOutcome("r1", {}, started=0.0)
    for n in range(nodes):
        ranks = {}
        for local in range(per_node):
            rank = n * per_node + local
            ranks[rank] = RankOutcome(rank, local, state, 0 if state is RankState.succeeded else None,
                                      started=1.0, ended=2.0 + n)
        run.nodes[f"gpu{n:02d}"] = NodeOutcome(f"gpu{n:02d}", ranks, state)
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
