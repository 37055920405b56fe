"""The data-path watch: who watches whom, which node a set of lost paths blames, and the probes themselves; the
hang watch's verdict from real stacks and flight recorder dumps."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from loadscale import scaled, until

from clusterrun.launch.settings import OnHang
from clusterrun.launch.watch import DataPathWatch, Endpoint, HangWatch, PathLoss, PathWatchState
from clusterrun.remote.answers import Flight, Stack
from clusterrun.remote.decode import decode
from clusterrun.remote.pathwatch import PathWatch
from clusterrun.runs.judge import Failure


def _state(n: int) -> PathWatchState:
    names = [f"n{i}" for i in range(n)]
    state = PathWatchState({m: Endpoint(m, f"10.0.0.{i + 1}", "eth1") for i, m in enumerate(names)}, names, settle=2.0)
    for i, m in enumerate(names):
        state.ports[m] = 40000 + i
    return state


def _loss(node: str, peer: str, since: float = 1_700_000_000.0) -> PathLoss:
    return PathLoss(node, "eth1", peer, f"10.0.0.{int(peer[1:]) + 1}", since)


def test_every_node_watches_the_master_and_its_ring_neighbour() -> None:
    state = _state(4)
    assert [t["node"] for t in state.targets_of("n0")] == ["n1"]
    assert [t["node"] for t in state.targets_of("n2")] == ["n0", "n3"]
    assert [t["node"] for t in state.targets_of("n3")] == ["n0"]
    assert state.targets_of("n1")[0] == {"node": "n0", "address": "10.0.0.1", "port": 40000}
    assert state.ready()


@pytest.mark.parametrize(("dead", "reports"), [
    ("n2", [("n2", "n0"), ("n2", "n3"), ("n1", "n2")]),  # a worker's NIC: its own paths and its watcher's
    ("n0", [("n1", "n0"), ("n2", "n0"), ("n3", "n0"), ("n0", "n1")]),  # the master's NIC
])
def test_the_node_in_most_lost_paths_is_blamed_after_the_settle_time(dead: str, reports: list[tuple[str, str]]) -> None:
    state = _state(4)
    for node, peer in reports:
        state.lost(_loss(node, peer), now=100.0)
    assert state.verdict(101.0, ended=set()) is None  # still gathering the other ends
    verdict = state.verdict(102.5, ended=set())
    assert verdict is not None and verdict.node == dead and not verdict.also
    text = verdict.describe()
    assert text.startswith(f"{dead}: eth1 stopped reaching ") and text.endswith("the job is waiting on it")
    state.lost(_loss(reports[0][0], reports[0][1]), now=103.0)
    assert state.verdict(106.0, ended=set()) is None  # blamed once


def test_a_node_that_fell_off_every_network_is_blamed_not_its_only_watcher() -> None:
    """n3 is watched by n2 alone and cannot report anything itself; clusterrun does not hear it either."""
    state = _state(4)
    state.lost(_loss("n2", "n3"), now=100.0)
    verdict = state.verdict(102.5, ended=set(), silent={"n3"})
    assert verdict is not None and verdict.node == "n3" and not verdict.also
    assert verdict.describe().startswith("n3: stopped answering on its data address")
    alone = _state(4)  # without the silence, the watcher's own path is as likely: the reporter is named
    alone.lost(_loss("n2", "n3"), now=100.0)
    verdict = alone.verdict(102.5, ended=set())
    assert verdict is not None and verdict.node == "n2"


def test_two_nodes_that_lost_each_other_are_both_named() -> None:
    state = _state(2)
    state.lost(_loss("n0", "n1"), 10.0)
    state.lost(_loss("n1", "n0"), 10.5)
    verdict = state.verdict(13.0, ended=set())
    assert verdict is not None and {verdict.node, *verdict.also} == {"n0", "n1"}
    assert verdict.describe().startswith("n0: it and n1 stopped reaching each other")


def test_a_peer_whose_job_ended_is_not_a_dead_path() -> None:
    state = _state(3)
    state.lost(_loss("n1", "n2"), 10.0)
    assert state.verdict(20.0, ended={"n2"}) is None


def _watch_pair(dead_after: float) -> tuple[PathWatch, PathWatch, list[tuple[str, bool]]]:
    """Two path watches on this machine, a watching b; ``dead_after`` scaled with the machine's load, so a busy
    machine's late answer is not a lost path."""
    dead_after = scaled(dead_after)
    changes: list[tuple[str, bool]] = []
    a = PathWatch("127.0.0.1", lambda t, lost: changes.append((t.node, lost)), interval=0.05, dead_after=dead_after)
    b = PathWatch("127.0.0.1", lambda t, lost: None, interval=0.05, dead_after=dead_after)
    a.set_targets([{"node": "b", "address": "127.0.0.1", "port": b.port}])
    return a, b, changes


def _until(condition: Callable[[], bool]) -> bool:
    return until(condition, 5.0)  # scaled


def test_probes_get_answers_and_silence_is_a_lost_path_then_ok_again() -> None:
    a, b, changes = _watch_pair(dead_after=0.3)
    a.start()
    b.start()
    try:
        assert _until(lambda: a.received > 3)  # answers arrive: nothing to report
        assert changes == []
        b.stop()  # b's socket closes: no more answers
        assert _until(lambda: changes == [("b", True)])
        assert _until(lambda: not b.is_alive())
        c = PathWatch("127.0.0.1", lambda t, lost: None, interval=0.05, port=b.port)  # the peer answers again
        c.start()
        try:
            assert _until(lambda: changes[-1] == ("b", False))
        finally:
            c.stop()
    finally:
        a.stop()
        b.stop()


def test_a_node_whose_job_ended_still_answers_until_its_agent_ends() -> None:
    """Its job over, a node stops watching its own paths but answers the others while it sends its last logs."""
    a, b, changes = _watch_pair(dead_after=0.3)
    b_changes: list[tuple[str, bool]] = []
    b.on_change = lambda t, lost: b_changes.append((t.node, lost))
    b.set_targets([{"node": "a", "address": "127.0.0.1", "port": a.port}])
    a.start()
    b.start()
    try:
        assert _until(lambda: a.received > 3 and b.received > 3)
        b.answer_only()
        time.sleep(scaled(1.0))  # more than three times dead_after (both scaled)
        assert changes == []  # b still answers a
        a.stop()
        time.sleep(scaled(1.0))
        assert b_changes == []  # and no longer judges its own paths: a's silence is not reported
        b.stop()
    finally:
        a.stop()
        b.stop()


def test_a_loss_report_about_a_node_whose_job_ended_is_not_recorded() -> None:
    recorded: list[dict] = []
    watch = DataPathWatch(_state(3), send=lambda node, line: None, say=lambda text: None, lost=lambda v: None,
                          record=recorded.append)
    lost = {"ev": "path", "state": "lost", "peer": "n2", "address": "10.0.0.3", "nic": "eth1", "since": 1.0}
    watch.on_path("n1", decode(lost, "n1"), now=10.0, stopping=False, ended={"n2"})
    watch.on_path("n2", decode({**lost, "peer": "n0"}, "n2"), now=10.0, stopping=False, ended={"n2"})
    assert recorded == []
    assert watch.state.verdict(20.0, ended=set()) is None  # nor counted against anyone
    watch.on_path("n1", decode(lost, "n1"), now=10.0, stopping=False, ended=set())
    assert [e["kind"] for e in recorded] == ["path-lost"]


def test_the_verdict_names_the_path_to_the_master_whatever_came_first() -> None:
    state = _state(4)
    for node, peer in [("n2", "n3"), ("n1", "n2"), ("n2", "n0")]:  # the path to the master is reported last
        state.lost(_loss(node, peer), now=100.0)
    verdict = state.verdict(103.0, ended=set())
    assert verdict is not None and verdict.describe().startswith("n2: eth1 stopped reaching n0 (10.0.0.1)")


STACKS = Path(__file__).resolve().parent / "fixtures" / "real" / "stacks"
FLIGHT = Path(__file__).resolve().parent / "fixtures" / "real" / "flight"


def _hang(stacks: dict[int, str], flights: dict[int, bytes]) -> tuple[list[Failure], list[str]]:
    """A HangWatch given the real dumps of a 4-rank job on two nodes (2 ranks each): what it stopped the job with
    and what it said."""
    stopped: list[Failure] = []
    said: list[str] = []
    hang = HangWatch(10.0, OnHang.stop, lambda line: None, lambda rel, data: f"/runs/r1/{rel}", said.append,
                     lambda event: None, stopped.append, "n0")
    hang.last_output = 0.0
    hang.tick(10.0, {"n0", "n1"}, stopping=False)  # the silence: every rank's stack is asked for
    for rank in range(4):
        node = f"n{rank // 2}"
        if rank in stacks:
            hang.on_stack(node, Stack(rank, "faulthandler"), stacks[rank].encode())
        if rank in flights:
            hang.on_flight(node, Flight(rank), flights[rank])
    hang.on_done("n0")
    hang.on_done("n1")
    hang.tick(11.0, {"n0", "n1"}, stopping=False)
    return stopped, said


def test_a_hang_before_any_collective_fails_the_stuck_ranks_node_and_rank() -> None:
    waiting = (STACKS / "faulthandler_rank0_all_reduce.txt").read_text()
    stuck = (STACKS / "faulthandler_rank1_stuck.txt").read_text()
    flights = {int(p.stem.removeprefix("rank")): p.read_bytes() for p in (FLIGHT / "first").glob("rank*.json")}
    stopped, said = _hang({0: waiting, 1: waiting, 2: waiting, 3: stuck}, flights)
    report = said[-1]
    assert "rank 3 in stuck_here (hang.py:7)   <- the odd one out" in report
    assert "rank 3 never called it (last collective: none)" in report and "no rank is missing" not in report
    assert [(f.node, f.rank) for f in stopped] == [("n1", 3)]
    assert stopped[0].describe().startswith("n1 rank 3: hung: no rank printed anything for 11s")


def test_a_hang_the_evidence_pins_on_no_one_rank_stays_on_the_master() -> None:
    waiting = (STACKS / "faulthandler_rank0_all_reduce.txt").read_text()
    flights = {int(p.stem.removeprefix("rank")): p.read_bytes() for p in (FLIGHT / "first").glob("rank*.json")}
    del flights[3]
    stopped, said = _hang({r: waiting for r in range(4)}, flights)
    assert "rank 3: no flight recorder dump came back" in said[-1]
    assert [(f.node, f.rank) for f in stopped] == [("n0", None)]
    assert stopped[0].describe().startswith("n0: hung: no rank printed anything")


def test_output_while_the_stacks_are_taken_ends_that_silence_and_the_next_one_is_diagnosed() -> None:
    # The job's workers came up just after a silence was judged (containers slow to start): their first line
    # arrives while the stacks are being taken. That job is not hung; its next silence is.
    stopped: list[Failure] = []
    said: list[str] = []
    asked: list[str] = []
    hang = HangWatch(3.0, OnHang.stop, asked.append, lambda rel, data: f"/runs/r1/{rel}", said.append,
                     lambda event: None, stopped.append, "n0")
    hang.last_output = 0.0
    hang.tick(3.0, {"n0", "n1"}, stopping=False)
    assert len(asked) == 1  # every rank's stack asked for
    hang.output(3.2)  # a rank prints while they are taken
    hang.on_done("n0")
    hang.on_done("n1")
    hang.tick(3.4, {"n0", "n1"}, stopping=False)
    assert stopped == [] and said[-1] == "the job prints again"
    hang.tick(6.1, {"n0", "n1"}, stopping=False)  # 2.9 s since that line: not yet
    assert len(asked) == 1
    hang.tick(6.3, {"n0", "n1"}, stopping=False)  # the real silence: asked again, and this one stops the job
    assert len(asked) == 2 and said[-1].startswith("no rank has printed anything for 3s")
    hang.on_done("n0")
    hang.on_done("n1")
    hang.tick(6.5, {"n0", "n1"}, stopping=False)
    assert [(f.node, f.rank) for f in stopped] == [("n0", None)]
