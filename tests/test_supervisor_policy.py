"""The supervisor's failure policy, on in-memory nodes (tests/fake_transport.py): who is stopped, when, and why.

Each node agent is played by a script speaking the real wire protocol; the supervisor runs unchanged with
small timings (heartbeats every 50 ms, a node silent for 0.5 s is lost, a stopped node that sends nothing for
0.25 s is given up). Those timeouts, and every span a scenario waits or stretches over, scale with the machine's
load (tests/loadscale.py: times 1 up to one runnable task per CPU), so a busy machine does not lose a node that
answered, and a scenario's spans keep their ratios to the timeouts. The tests check the outcome, the rank logs in
runs/, and what each node's agent received on its stdin.
"""

from __future__ import annotations

import functools
import io
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fake_transport import FakeAgent, FakeTransport
from loadscale import scaled

from clusterrun.agents.link import open_link
from clusterrun.errors import EXIT_TIMEOUT, StartError
from clusterrun.inventory.yaml_source import parse_inventory_text
from clusterrun.launch.console import Console
from clusterrun.launch.outcome import RankState
from clusterrun.launch.settings import SupervisorSettings
from clusterrun.launch.supervisor import Supervisor
from clusterrun.planning.plan import JobSpec, LaunchPlan, build_plan
from clusterrun.runs import RunDir, RunRecord, RunState

NPROC = 2
T = 3.0  # the longest any script waits for clusterrun (scaled); only reached when the supervisor misbehaves
FAST: dict[str, Any] = {"grace": 0.1, "heartbeat_interval": 0.05, "heartbeat_timeout": 0.5, "stop_timeout": 0.25}
SCALED = ("heartbeat_timeout", "stop_timeout")  # the timeouts that judge a node by how long it took: scaled


def fast() -> dict[str, Any]:
    """The test's supervisor timings: FAST, its timeouts scaled with the machine's load."""
    return {k: scaled(v) if k in SCALED else v for k, v in FAST.items()}

Script = Callable[[FakeAgent], None]


def make_plan(names: list[str]) -> LaunchPlan:
    hosts = "\n".join(f"  - {{name: {name}, host: 10.0.0.{i + 1}, gpus: {NPROC}}}" for i, name in enumerate(names))
    inventory = parse_inventory_text(f"nodes:\n{hosts}\n", "inv.yaml")
    return build_plan(inventory, JobSpec(script="train.py", run_id="r1", local_runs_dir="/tmp/runs",
                                         local_cwd="/work"))


class Harness:
    """A plan over the scripted nodes, their fake transports, a run directory and a console, and the supervisor."""

    def __init__(self, tmp_path: Path, scripts: dict[str, Script], **settings: Any) -> None:
        self.plan = make_plan(list(scripts))
        self.transports = {name: FakeTransport(name, script) for name, script in scripts.items()}
        self.run_dir = RunDir.create(tmp_path / "runs", self.plan.run_id)
        self.out, self.err = io.StringIO(), io.StringIO()
        self.settings = SupervisorSettings(**{**fast(), **settings})
        links = {n.name: open_link(self.transports[n.name], n) for n in self.plan.nodes}
        self.sup = Supervisor(self.plan, links, self.run_dir, Console(self.out, self.err, color=False),
                              self.settings)

    def run(self) -> RunRecord:
        outcome = self.sup.run()
        self.check_scripts()
        return outcome

    def check_scripts(self) -> None:
        for transport in self.transports.values():
            transport.check(timeout=scaled(T))  # a script's failed assertion fails the test here

    def log(self, node: str, rank: int) -> str:
        path = self.run_dir.rank_log(node, rank)
        return path.read_text() if path.exists() else ""

    def rank_states(self, node: str) -> dict[int, RankState]:
        return {r: o.state for r, o in self.sup.outcome.nodes[node].ranks.items()}


# ------------------------------------------------------------------ node scripts


def ranks(agent: FakeAgent) -> range:
    offset = agent.spec["rank_offset"]  # from the agent spec clusterrun put on the command line
    return range(offset, offset + NPROC)


def finishes(agent: FakeAgent) -> None:
    """A node whose ranks all print two lines and exit 0."""
    agent.started()
    for r in ranks(agent):
        agent.out(r, f"rank {r}: step 1\n")
    for r in ranks(agent):
        agent.out(r, f"rank {r}: done\n")
    agent.exit(0, ranks={r: {"rc": 0} for r in ranks(agent)})


def runs_until_stopped(agent: FakeAgent) -> None:
    """A node whose ranks run until clusterrun says ``term``; then torchrun exits 1, as a real one does on SIGTERM
    (its agent stops its workers, and it prints no failure summary: the ranks' own codes are unknown)."""
    agent.started()
    agent.out(ranks(agent)[0], "training\n")
    assert agent.wait_for("term", scaled(T)), "clusterrun never sent term"
    agent.exit(1, reason="term from clusterrun")


def fails_second_rank(agent: FakeAgent) -> None:
    """Local rank 1 exits 3 (torchrun says so at once); torchrun stops local rank 0 with SIGTERM."""
    agent.started()
    first, second = ranks(agent)
    agent.out(second, "RuntimeError: loss is nan\n", "stderr")
    agent.rank_failed(second, 3)
    assert agent.wait_for("term", scaled(T)), "clusterrun never sent term to the failing node"
    agent.exit(1, ranks={second: {"rc": 3, "signal": None, "root_cause": True},
                         first: {"rc": 143, "signal": 15, "root_cause": False}})


def fails_second_rank_at_exit(agent: FakeAgent) -> None:
    """As :func:`fails_second_rank`, but torchrun's "failed (exitcode: 3)" line never came (no ``rank_failed``):
    the failure is known from the exit event's summary only."""
    agent.started()
    first, second = ranks(agent)
    agent.exit(1, ranks={second: {"rc": 3, "signal": None, "root_cause": True},
                         first: {"rc": 143, "signal": 15, "root_cause": False}})


def ignores_term(agent: FakeAgent) -> None:
    """Gets ``term`` but never confirms: answers pings (its agent lives) and says nothing more."""
    agent.started()
    assert agent.wait_for("term", scaled(T))
    assert agent.wait_dropped(scaled(T)), "clusterrun never gave up on the node"


def node(i: int) -> str:
    return f"node{i}"


# ------------------------------------------------------------------ the tests


def test_run_succeeds_and_logs_every_rank_when_all_nodes_exit_0(tmp_path: Path) -> None:
    c = Harness(tmp_path, {node(i): finishes for i in range(3)})

    outcome = c.run()

    assert outcome.state is RunState.succeeded and outcome.exit_code == 0
    assert outcome.first_failure is None and outcome.notes == []
    for plan_node in c.plan.nodes:
        got = outcome.nodes[plan_node.name]
        assert got.state is RankState.succeeded and got.exit_code == 0
        assert {r: (o.state, o.exit_code) for r, o in got.ranks.items()} == {
            r: (RankState.succeeded, 0) for r in plan_node.ranks}
        for r in plan_node.ranks:
            assert c.log(plan_node.name, r) == f"rank {r}: step 1\nrank {r}: done\n"
        assert c.transports[plan_node.name].commands == []  # nobody was told to stop
    assert "[node1:3] rank 3: done" in c.out.getvalue().splitlines()
    assert c.sup.relay.gaps() == []


@pytest.mark.parametrize("seen", ["rank_failed event", "exit event only"])
def test_first_failing_rank_stops_every_other_node(tmp_path: Path, seen: str) -> None:
    failing = fails_second_rank if seen == "rank_failed event" else fails_second_rank_at_exit
    c = Harness(tmp_path, {node(0): runs_until_stopped, node(1): failing, node(2): runs_until_stopped})

    outcome = c.run()

    assert c.transports[node(0)].commands == ["term"]
    assert c.transports[node(2)].commands == ["term"]
    failure = outcome.first_failure
    assert failure is not None
    assert (failure.node, failure.rank, failure.exit_code, failure.signal) == (node(1), 3, 3, None)
    assert outcome.state is RunState.failed and outcome.exit_code == 3
    assert outcome.nodes[node(1)].ranks[3].state is RankState.failed
    assert outcome.nodes[node(1)].ranks[3].exit_code == 3
    if seen == "rank_failed event":  # the other case: test_..._when_only_the_exit_event_tells, below
        assert outcome.nodes[node(1)].ranks[2].state is RankState.stopped  # torchrun stopped it after rank 3 failed
    for name in (node(0), node(2)):
        assert set(c.rank_states(name).values()) == {RankState.stopped}
        assert outcome.nodes[name].state is RankState.stopped
    assert "node1 rank 3: exit code 3" in c.err.getvalue()


def test_node_whose_connection_drops_is_lost_and_the_others_are_stopped(tmp_path: Path) -> None:
    def drops(agent: FakeAgent) -> None:
        agent.started()
        agent.out(ranks(agent)[0], "step 1\n")
        agent.stderr("Connection to 10.0.0.2 closed by remote host.\n")
        agent.close()  # no exit event

    c = Harness(tmp_path, {node(0): runs_until_stopped, node(1): drops, node(2): runs_until_stopped})

    outcome = c.run()

    lost = outcome.nodes[node(1)]
    assert lost.state is RankState.unknown
    assert set(c.rank_states(node(1)).values()) == {RankState.unknown}
    assert "connection lost before the node reported" in (lost.reason or "")
    assert "closed by remote host" in (lost.reason or "")  # ssh's own words, from the stream's stderr
    assert outcome.first_failure is not None and (outcome.first_failure.node, outcome.first_failure.rank) == (
        node(1), None)
    assert outcome.state is RunState.failed and outcome.exit_code == 1
    assert c.transports[node(0)].commands == ["term"] and c.transports[node(2)].commands == ["term"]
    assert set(c.rank_states(node(0)).values()) == {RankState.stopped}
    assert c.log(node(1), 2) == "step 1\n"  # what arrived before the break is kept


def test_node_whose_agent_says_what_cannot_be_read_is_lost_with_the_field_named(tmp_path: Path) -> None:
    def garbles(agent: FakeAgent) -> None:
        agent.started()
        agent.out(ranks(agent)[0], "step 1\n")
        agent.emit({"ev": "rank_failed", "rank": "two", "rc": 3})  # a rank that is no number
        assert agent.wait_dropped(T), "clusterrun kept reading a node it cannot understand"

    c = Harness(tmp_path, {node(0): runs_until_stopped, node(1): garbles})

    outcome = c.run()

    lost = outcome.nodes[node(1)]
    assert lost.state is RankState.unknown
    assert "the node agent's 'rank_failed' event has 'rank' str 'two', not int" in (lost.reason or "")
    assert outcome.first_failure is not None and (outcome.first_failure.node, outcome.first_failure.rank) == (
        node(1), None)
    assert "'rank_failed' event has 'rank'" in outcome.first_failure.detail
    assert c.transports[node(0)].commands == ["term"] and set(c.rank_states(node(0)).values()) == {RankState.stopped}
    assert c.log(node(1), 2) == "step 1\n"  # what it said before is kept
    assert "'rank_failed' event has 'rank'" in c.err.getvalue() + c.out.getvalue()  # shown, not only recorded


def test_rank_torchrun_stopped_after_its_sibling_failed_is_stopped_when_only_the_exit_event_tells(
        tmp_path: Path) -> None:
    c = Harness(tmp_path, {node(0): runs_until_stopped, node(1): fails_second_rank_at_exit})

    outcome = c.run()

    assert outcome.nodes[node(1)].ranks[3].state is RankState.failed
    assert outcome.nodes[node(1)].ranks[2].state is RankState.stopped


def test_node_that_stops_answering_heartbeats_is_lost_after_the_heartbeat_timeout(tmp_path: Path) -> None:
    def hangs(agent: FakeAgent) -> None:
        agent.started()
        agent.go_silent()  # the connection stays open; nothing comes back any more
        assert agent.wait_dropped(scaled(T)), "clusterrun never dropped the silent node"

    c = Harness(tmp_path, {node(0): runs_until_stopped, node(1): hangs, node(2): runs_until_stopped})

    outcome = c.run()

    silent = outcome.nodes[node(1)]
    assert silent.state is RankState.unknown
    assert "no word from the node" in (silent.reason or "")
    assert set(c.rank_states(node(1)).values()) == {RankState.unknown}
    assert silent.ended is not None and silent.started is not None
    assert silent.ended - silent.started >= c.settings.heartbeat_timeout
    assert c.transports[node(1)].agents[0].dropped
    assert outcome.first_failure is not None and outcome.first_failure.node == node(1)
    # The others said nothing either, but answered every ping: they were stopped, not lost.
    for name in (node(0), node(2)):
        assert c.transports[name].commands == ["term"]
        assert outcome.nodes[name].state is RankState.stopped


def test_ctrl_c_stops_every_node_and_a_second_one_kills(tmp_path: Path) -> None:
    def waits_for_kill(agent: FakeAgent) -> None:
        agent.started()
        assert agent.wait_for("term", scaled(T))
        assert agent.wait_for("kill", scaled(T))  # this node takes longer than the user wants to wait
        agent.exit(137, signal=9, reason="kill from clusterrun")

    c = Harness(tmp_path, {node(i): waits_for_kill for i in range(3)})

    # Not the main thread: the supervisor installs no handlers; the test delivers Ctrl-C as the handler does.
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(c.sup.run)
        assert all(t.wait_received("ping", scaled(T)) for t in c.transports.values())  # the loop runs
        c.sup._on_signal(signal.SIGINT, None)
        assert all(t.wait_received("term", scaled(T)) for t in c.transports.values())
        c.sup._on_signal(signal.SIGINT, None)
        outcome = running.result(timeout=scaled(T))
    c.check_scripts()

    assert outcome.interrupted_by == signal.SIGINT
    assert outcome.state is RunState.interrupted and outcome.exit_code == 130
    assert outcome.first_failure is None
    for name, transport in c.transports.items():
        assert transport.commands == ["term", "kill"]
        assert set(c.rank_states(name).values()) == {RankState.stopped}


def test_job_past_its_time_limit_is_stopped_with_exit_code_124(tmp_path: Path) -> None:
    c = Harness(tmp_path, {node(i): runs_until_stopped for i in range(3)}, timeout=0.2)

    outcome = c.run()

    assert outcome.exit_code == EXIT_TIMEOUT == 124
    assert outcome.state is RunState.failed
    assert outcome.first_failure is not None and "time limit" in outcome.first_failure.detail
    assert outcome.ended is not None and outcome.ended - outcome.started >= 0.2
    for name, transport in c.transports.items():
        assert transport.commands == ["term"]
        assert set(c.rank_states(name).values()) == {RankState.stopped}


def test_node_that_never_confirms_its_stop_is_given_up_after_the_stop_timeout(tmp_path: Path) -> None:
    c = Harness(tmp_path, {node(0): runs_until_stopped, node(1): fails_second_rank, node(2): ignores_term})

    outcome = c.run()

    stuck = outcome.nodes[node(2)]
    assert stuck.state is RankState.unknown
    said = f"did not confirm it stopped within {c.settings.stop_timeout:g}s"  # 0.25s on an idle machine
    assert stuck.reason == said
    assert [n for n in outcome.notes if n.startswith(f"node2: {said}")]
    assert c.transports[node(2)].agents[0].dropped
    assert outcome.ended is not None and outcome.ended - outcome.started >= c.settings.stop_timeout
    # The first failure stays the cause of the run, not the stuck node.
    assert outcome.first_failure is not None and outcome.first_failure.node == node(1)
    assert outcome.nodes[node(0)].state is RankState.stopped


def test_ranks_of_a_node_given_up_end_unknown(tmp_path: Path) -> None:
    c = Harness(tmp_path, {node(0): runs_until_stopped, node(1): fails_second_rank, node(2): ignores_term})

    outcome = c.run()

    assert set(c.rank_states(node(2)).values()) == {RankState.unknown}
    assert outcome.nodes[node(2)].ended is not None


def drains_slowly(agent: FakeAgent, stop_timeouts: float = 2.2) -> None:
    """After ``term``, goes on sending its logs for ``stop_timeouts`` stop timeouts (a line per heartbeat), then
    exits."""
    agent.started()
    assert agent.wait_for("term", scaled(T))
    end = time.monotonic() + stop_timeouts * fast()["stop_timeout"]
    i = 0
    while time.monotonic() < end:
        assert agent.wait_for("ping", scaled(T))
        agent.out(ranks(agent)[0], f"flushing {i}\n")
        i += 1
    agent.out(ranks(agent)[0], "flushed\n")
    agent.exit(1, reason="term from clusterrun")


def test_node_still_sending_its_logs_after_the_stop_gets_more_time(tmp_path: Path) -> None:
    c = Harness(tmp_path, {node(0): drains_slowly, node(1): fails_second_rank, node(2): ignores_term})

    outcome = c.run()

    # node0 kept talking: waited for, to its end; node2 said nothing: given up meanwhile.
    assert outcome.nodes[node(0)].state is RankState.stopped
    assert c.log(node(0), 0).startswith("flushing 0\n") and c.log(node(0), 0).endswith("flushed\n")
    assert c.sup.relay.gaps() == []
    assert not c.transports[node(0)].agents[0].dropped
    assert outcome.ended is not None and outcome.ended - outcome.started > 2 * c.settings.stop_timeout
    assert [n.split(":")[0] for n in outcome.notes] == [node(2)]
    assert c.transports[node(2)].agents[0].dropped


def test_node_given_up_keeps_its_reason_while_another_node_still_drains(tmp_path: Path) -> None:
    # node0 still drains when node2 is given up (at one stop timeout), and for a while after
    c = Harness(tmp_path, {node(0): functools.partial(drains_slowly, stop_timeouts=1.4), node(1): fails_second_rank,
                           node(2): ignores_term})

    outcome = c.run()

    assert outcome.nodes[node(2)].reason == f"did not confirm it stopped within {c.settings.stop_timeout:g}s"


def test_output_sent_just_before_the_exit_event_is_all_logged(tmp_path: Path) -> None:
    many = 2000

    def bursts_then_exits(agent: FakeAgent) -> None:
        agent.started()
        for r in ranks(agent):
            for i in range(0, many, 100):
                agent.out(r, "".join(f"rank {r} line {j}\n" for j in range(i, i + 100)))
            agent.out(r, f"rank {r} warning\n", "stderr")
        agent.exit(0)  # logs: the sizes of everything sent

    c = Harness(tmp_path, {node(0): bursts_then_exits, node(1): bursts_then_exits})

    outcome = c.run()

    assert outcome.state is RunState.succeeded
    for plan_node in c.plan.nodes:
        for r in plan_node.ranks:
            text = c.log(plan_node.name, r)
            assert text.splitlines() == [f"rank {r} line {j}" for j in range(many)] + [f"rank {r} warning"]
    assert c.sup.relay.gaps() == []
    assert c.sup.relay.reported == {node(0), node(1)}


def test_exit_event_claiming_more_than_arrived_leaves_a_gap(tmp_path: Path) -> None:
    def claims_more(agent: FakeAgent) -> None:
        agent.started()
        r = ranks(agent)[0]
        agent.out(r, "one\ntwo\n")
        # The node's file holds 100 more bytes (3 more lines) than the stream carried.
        agent.exit(0, logs={f"{r}/stdout": {"bytes": 108, "sent": 108, "lines": 5}})

    c = Harness(tmp_path, {node(0): finishes, node(1): claims_more})

    outcome = c.run()

    assert outcome.state is RunState.succeeded  # the job itself went well; only runs/ lacks part of a log
    gaps = c.sup.relay.gaps()
    assert [(g.node, g.rank, g.stream, g.expected_bytes, g.received_bytes, g.missing_lines) for g in gaps] == [
        (node(1), 2, "stdout", 108, 8, 3)]
    assert c.log(node(1), 2) == "one\ntwo\n"


def test_node_whose_agent_is_gone_before_go_starts_nothing(tmp_path: Path) -> None:
    """The agents were started by the ready check; one's connection broke before the job's `go`: the run does not
    start, and every other node's agent is dropped."""
    def waits_to_be_dropped(agent: FakeAgent) -> None:
        assert agent.wait_dropped(scaled(T)), (
            "clusterrun kept the other node's agent when one could not be told to start")

    def breaks(agent: FakeAgent) -> None:
        agent.stderr("Connection to 10.0.0.2 closed by remote host.")
        agent.close()

    c = Harness(tmp_path, {node(0): waits_to_be_dropped, node(1): breaks})
    assert c.transports[node(1)].agents[0].stream.wait(scaled(T)) == 255  # its connection is gone before `go`

    with pytest.raises(StartError) as raised:
        c.sup.run()
    c.check_scripts()

    assert raised.value.problems == {node(1): "the node agent's connection closed before it got the run's spec"}
    assert c.transports[node(0)].agents[0].dropped  # its agent stops whatever it started once dropped


def test_a_node_whose_frames_wait_behind_a_backlog_is_not_lost(tmp_path: Path) -> None:
    """clusterrun falls behind (a flood of output, a starved CPU): a node whose answers wait in the queue longer
    than the heartbeat timeout is still heard, from the moment its bytes arrived."""
    def floods(agent: FakeAgent) -> None:
        agent.started()
        for i in range(60):
            agent.out(ranks(agent)[0], f"line {i}\n")
        agent.exit(0, ranks={r: {"rc": 0} for r in ranks(agent)})

    def answers_then_finishes(agent: FakeAgent) -> None:
        agent.started()
        time.sleep(scaled(1.5))  # pongs only, meanwhile (3 heartbeat timeouts)
        agent.exit(0, ranks={r: {"rc": 0} for r in ranks(agent)})

    c = Harness(tmp_path, {node(0): floods, node(1): answers_then_finishes})
    write = c.sup.relay.write

    def slow_write(*args: Any) -> None:  # 60 frames x 40 ms: over twice the 0.5 s heartbeat timeout (both scaled)
        time.sleep(scaled(0.04))
        write(*args)

    c.sup.relay.write = slow_write  # type: ignore[method-assign]
    outcome = c.run()

    assert outcome.state is RunState.succeeded, outcome.first_failure
    assert c.log(node(0), 0).count("line ") == 60


def test_heartbeats_and_load_reports_are_spaced_out_on_large_runs() -> None:
    """Up to 32 nodes the settings are as given; beyond, clusterrun hears about as many heartbeats and CPU reports
    a second as at 32 nodes, and a node is still lost only after as many unanswered heartbeats in a row."""
    given = SupervisorSettings()
    assert given.paced(1) == given and given.paced(32) == given
    large = given.paced(128)
    assert large.heartbeat_interval == 4.0 and large.load_every == pytest.approx(12.0)
    assert large.heartbeat_timeout == given.heartbeat_timeout + 4 * 3.0  # 27 s: 12 s more, for 3 s more a beat
    assert large.grace == given.grace and large.stop_timeout == given.stop_timeout
    assert SupervisorSettings(load_every=0).paced(128).load_every == 0  # off stays off
    assert SupervisorSettings(heartbeat_interval=2.0).paced(8).heartbeat_interval == 2.0  # a slower given pace stays
