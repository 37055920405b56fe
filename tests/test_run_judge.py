"""The one judge of how a node and a run ended (attached and detached runs alike): pure rules over end reports."""

from __future__ import annotations

import signal

from clusterrun.remote.answers import Exit
from clusterrun.remote.decode import decode
from clusterrun.runs.judge import (
    Failure,
    RankRecord,
    RankState,
    first_failure,
    judge_node,
    torchrun_time,
    unreported_node,
)


def report(rc: int, ranks: dict[int, dict], *, time: float = 100.0, reason: str = "finished") -> Exit:
    """A node's ``exit`` answer as clusterrun reads it (decoded with its spec)."""
    return decode({"ev": "exit", "rc": rc, "time": time, "reason": reason,
                   "ranks": {str(r): v for r, v in ranks.items()}}, "a")


def test_every_rank_of_a_node_that_exited_0_succeeded() -> None:
    end = judge_node("a", [0, 1], report(0, {0: {"rc": 0}, 1: {"rc": 0}}), stopping=False)
    assert end.state is RankState.succeeded and end.failure is None
    assert {r.state for r in end.ranks.values()} == {RankState.succeeded}


def test_torchruns_root_cause_is_the_nodes_failure_and_the_ranks_it_killed_are_stopped() -> None:
    ranks = {0: {"rc": 128 + 15, "signal": 15, "root_cause": False},
             1: {"rc": 3, "signal": None, "root_cause": True, "time": "2026-11-25_14:30:01"}}
    end = judge_node("a", [0, 1], report(1, ranks), stopping=False)
    assert end.failure == Failure("a", 1, 3, None, "")
    assert end.ranks[0].state is RankState.stopped and end.ranks[1].state is RankState.failed
    assert end.failed_at == torchrun_time("2026-11-25_14:30:01")


def test_ranks_of_a_node_clusterrun_was_stopping_are_not_failures() -> None:
    end = judge_node("b", [2, 3], report(1, {2: {"rc": 128 + 15, "signal": int(signal.SIGTERM)}, 3: {"rc": None}}),
                     stopping=True)
    assert end.state is RankState.stopped and end.failure is None
    assert {r.state for r in end.ranks.values()} == {RankState.stopped}


def test_a_rank_that_failed_while_the_others_ran_stays_failed() -> None:
    early = {1: RankRecord(1, 1, RankState.failed, 4, None, 1.0, 2.0)}
    end = judge_node("a", [0, 1], report(1, {0: {"rc": None}}), stopping=True, failed_early=early)
    assert end.ranks[1] == RankRecord(1, 1, RankState.failed, 4, None, 1.0, 2.0)
    assert end.failure == Failure("a", 1, 4, None, "")


def test_a_torchrun_that_failed_with_no_rank_to_blame_fails_the_node() -> None:
    end = judge_node("a", [0], report(1, {0: {"rc": None}}, reason="torchrun: bad argument"), stopping=False)
    assert end.failure == Failure("a", None, 1, None, "torchrun: bad argument")


def test_the_runs_first_failure_is_the_earliest_not_the_first_node() -> None:
    late = judge_node("node0", [0], report(1, {0: {"rc": 5, "root_cause": True, "time": "2026-11-25_14:30:04"}},
                                           time=1795412404.5), stopping=False)
    early = judge_node("node1", [1], report(1, {1: {"rc": 3, "root_cause": True, "time": "2026-11-25_14:30:01"}},
                                            time=1795412401.2), stopping=False)
    assert first_failure([late, early]) == Failure("node1", 1, 3, None, "")


def test_within_the_same_second_the_node_that_ended_first_failed_first() -> None:
    a = judge_node("a", [0], report(1, {0: {"rc": 1, "root_cause": True, "time": "2026-11-25_14:30:01"}},
                                    time=torchrun_time("2026-11-25_14:30:01") + 0.9), stopping=False)
    b = judge_node("b", [1], report(1, {1: {"rc": 3, "root_cause": True, "time": "2026-11-25_14:30:01"}},
                                    time=torchrun_time("2026-11-25_14:30:01") + 0.1), stopping=False)
    assert first_failure([a, b]) == Failure("b", 1, 3, None, "")


def test_a_node_without_a_report_fails_but_after_the_ones_that_said_when() -> None:
    gone = unreported_node("a", [0], "no record")
    failed = judge_node("b", [1], report(1, {1: {"rc": 2}}), stopping=False)
    assert first_failure([gone, failed]) == Failure("b", 1, 2, None, "")
    assert first_failure([gone]) == Failure("a", None, 1, None, "no record")
    assert gone.ranks[0].state is RankState.unknown


def test_no_failure_when_every_node_succeeded() -> None:
    assert first_failure([judge_node("a", [0], report(0, {0: {"rc": 0}}), stopping=False)]) is None


def test_failures_read_back_from_their_dict() -> None:
    failure = Failure("a", 1, 143, int(signal.SIGTERM), "x")
    assert Failure.from_dict(failure.to_dict()) == failure
    assert Failure.from_dict({"node": "a", "rank": None, "exit_code": 1, "signal": "signal 77", "detail": ""}).signal == 77


def test_a_gpu_still_used_after_the_run_is_named_with_its_process() -> None:
    # nvidia-smi's words as the agent gathers them at the end (remote/gpufacts.py): GPU 1 of the run still holds a
    # process's memory; GPU 3 is not the run's.
    from clusterrun.runs.judge import gpus_left_busy

    query = ("0, GPU-aaaa, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 550.54.15, 81559, 0, 0\n"
             "1, GPU-bbbb, NVIDIA H100 80GB HBM3, 00000000:2A:00.0, 550.54.15, 81559, 20480, 0\n"
             "3, GPU-dddd, NVIDIA H100 80GB HBM3, 00000000:5D:00.0, 550.54.15, 81559, 9000, 0\n")
    apps = "GPU-bbbb, 4242, python3, 20480\nGPU-dddd, 5151, llama-server, 9000\n"
    report = {"query": query, "apps": apps, "owners": {"4242": {"user": "ann", "run_id": "r1"}}}
    said = gpus_left_busy("gpu01", report, [0, 1])
    assert said == ["gpu01: GPU 1 still has 20480 MiB used by pid 4242 (python3, ann, run r1) after the run; it slows "
                    "or blocks the next job there: stop it (`clusterrun ps` shows what runs on the nodes)"]
    assert gpus_left_busy("gpu01", {**report, "apps": ""}, [0, 1]) == []  # nothing left: nothing said
    assert gpus_left_busy("gpu01", {"query_error": "no answer within 5s"}, [0, 1]) == []
    assert gpus_left_busy("gpu01", None, [0, 1]) == []
