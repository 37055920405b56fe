"""When a run is started again and on which nodes: the pure decisions behind --max-restarts and --min-nodes."""

from __future__ import annotations

import pytest

from clusterrun.errors import EXIT_TIMEOUT
from clusterrun.launch.outcome import (
    CannotContinue,
    Failure,
    RankState,
    backoff,
    no_restart,
    recompose,
    signature,
    untrusted_nodes,
)
from clusterrun.runs import NodeRecord, RunRecord, RunState


def outcome(failure: Failure | None = None, lost: tuple[str, ...] = (), interrupted: int | None = None) -> RunRecord:
    nodes = {n: NodeRecord(state=RankState.unknown if n in lost else RankState.stopped)
             for n in ("a", "b", "c", "d")}
    run = RunRecord("r1", RunState.running, nodes=nodes, started=0.0, first_failure=failure, interrupted_by=interrupted)
    run.end(1.0)
    return run


def test_what_a_restart_cannot_help() -> None:
    assert no_restart(outcome()) == "succeeded"
    assert no_restart(outcome(interrupted=2)) == "interrupted"
    assert no_restart(outcome(Failure("a", None, EXIT_TIMEOUT, None, "the job ran past its 60s time limit"))) == (
        "it ran past its time limit")
    assert no_restart(outcome(Failure("a", 1, 3, None, "exited while others ran"))) is None


def test_a_repeated_failure_is_the_same_whatever_the_numbers_and_the_order() -> None:
    failed = outcome(Failure("b", 1, 4, None, "exited while others ran"))
    first = signature(failed, ["[W1124 08:06:31.32] socket warning", "step 120", "cannot open shard-7.bin"])
    again = signature(failed, ["step 480", "cannot open shard-7.bin", "[W1124 09:01:02.77] socket warning"])
    other = signature(failed, ["step 480", "CUDA out of memory", "[W1124 09:01:02.77] socket warning"])
    assert first == again and first != other


def test_a_lost_node_and_a_dead_path_are_not_trusted_again() -> None:
    lost = outcome(Failure("a", None, 1, None, "its agent stopped answering"), lost=("c",))
    assert list(untrusted_nodes(lost)) == ["c"]
    path = outcome(Failure("b", None, 1, None, "its data path died: eth1 stopped reaching c"))
    path.path_blame = {"node": "b", "other_end": "c", "also": []}
    assert list(untrusted_nodes(path)) == ["b"]
    # ... unless the other end was lost altogether: then it explains the dead path
    both = outcome(Failure("b", None, 1, None, "its data path died: eth1 stopped reaching c"), lost=("c",))
    both.path_blame = {"node": "b", "other_end": "c", "also": []}
    assert list(untrusted_nodes(both)) == ["c"]


def test_a_spare_takes_the_lost_nodes_place_in_the_order() -> None:
    nodes, replaced, left_out = recompose(["a", "b", "c"], ["s1", "s2"], {"a": "lost"}, None)
    assert (nodes, replaced, left_out) == (["s1", "b", "c"], {"a": "s1"}, {"a": "lost"})


def test_without_a_spare_the_job_goes_on_with_fewer_down_to_min_nodes() -> None:
    assert recompose(["a", "b", "c", "d"], [], {"d": "lost"}, 3)[0] == ["a", "b", "c"]
    with pytest.raises(CannotContinue, match=r"2 node.s. left .* --min-nodes is 3"):
        recompose(["a", "b", "c", "d"], [], {"c": "lost", "d": "lost"}, 3)
    with pytest.raises(CannotContinue, match="every node is needed"):
        recompose(["a", "b"], [], {"b": "lost"}, None)


def test_backoff_doubles_up_to_a_minute() -> None:
    assert [backoff(k, 5.0) for k in (1, 2, 3, 4, 5)] == [5.0, 10.0, 20.0, 40.0, 60.0]
    assert backoff(3, 0.0) == 0.0
