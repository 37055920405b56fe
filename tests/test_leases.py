"""GPU and master-port leases on a node (clusterrun/remote/leases.py), held by real processes; how the plan steps
around leased GPUs (facts/leases.py), the queue of `up --wait-gpus`, and the rank order by label."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from loadscale import scaled
from simjobs import clusterrun_env

from clusterrun.errors import GpusLeased
from clusterrun.facts.leases import held_gpus, parse_leases
from clusterrun.facts.node import ProbedNode
from clusterrun.inventory.yaml_source import parse_inventory_text
from clusterrun.launch.ready import GpuWait
from clusterrun.planning.complete import with_slurm_topology
from clusterrun.planning.gpuchoice import spare_leased
from clusterrun.planning.plan import JobSpec, build_plan
from clusterrun.remote import leases

ROOT = Path(__file__).resolve().parent.parent

HOLDER = """
import sys, time
from clusterrun.remote import leases
who = leases.holder(sys.argv[1], "gpu01")
for gpu in filter(None, sys.argv[3].split(",")):
    assert leases.take(leases.GPU, int(gpu), who) is None
if sys.argv[2] != "0":
    assert leases.check_port(int(sys.argv[2]), who) == ""
print("held", flush=True)
time.sleep(300)
"""


@pytest.fixture
def lease_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv(leases.DIR_VAR, str(tmp_path / "leases"))
    return {**clusterrun_env(), leases.DIR_VAR: str(tmp_path / "leases")}


@pytest.fixture
def holders(lease_env: dict[str, str]):
    """Start a process holding leases (``run``, ``port``, ``gpus``) as a run's agent does; killed at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(run: str, gpus: str, port: int = 0) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, run, str(port), gpus], env=lease_env,
                                stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=scaled(10))


def test_a_leased_gpu_is_refused_naming_the_run_user_and_start(holders) -> None:
    holder = holders("20261125-170000-ab12", "0,1")
    got = leases.take_gpus([1, 2], leases.holder("other-run"))
    assert got.startswith("GPU 1 is leased by run 20261125-170000-ab12 of ")
    assert f"(pid {holder.pid})" in got and "--wait-gpus" in got
    # The refused run holds nothing: GPU 2, which was free, is free again.
    assert set(leases.held(leases.GPU)) == {"0", "1"}
    assert leases.held(leases.GPU)["0"]["run"] == "20261125-170000-ab12"


def test_leases_are_free_once_their_holder_is_killed(holders) -> None:
    holder = holders("20261125-170000-ab12", "0,1", port=0)
    assert set(leases.held(leases.GPU)) == {"0", "1"}
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=scaled(10))
    # The lock files stay, but nobody holds them: free.
    assert sorted(p.name for p in Path(leases.lease_dir()).iterdir()) == ["gpu0.lock", "gpu1.lock"]
    assert leases.held(leases.GPU) == {}
    assert leases.take_gpus([0, 1], leases.holder("next-run")) == ""
    assert {k: v["run"] for k, v in leases.held(leases.GPU).items()} == {"0": "next-run", "1": "next-run"}
    leases.release(leases.GPU, 0)
    leases.release(leases.GPU, 1)


def test_two_nodes_of_one_run_on_one_machine_share_its_leases(holders) -> None:
    holders("run-a", "0")
    assert leases.take_gpus([0], leases.holder("run-a", "gpu02")) == ""


def _free_port_pair() -> int:
    """A port that is free, with the one after it free too."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two free ports in a row")


def test_a_chosen_master_port_skips_one_another_run_leased(holders) -> None:
    port = _free_port_pair()
    holders("run-a", "", port=port)
    chosen = leases.free_port(leases.holder("run-b"), first=port, tries=2)
    try:
        assert chosen == port + 1
    finally:
        leases.release(leases.PORT, chosen)


def test_a_given_master_port_that_is_held_names_the_run_holding_it(holders) -> None:
    port = _free_port_pair()
    holders("20261125-170000-ab12", "", port=port)
    problem = leases.check_port(port, leases.holder("run-b"))
    assert problem.startswith(f"master port {port} is held by run 20261125-170000-ab12 of ")
    assert "leave the port unset" in problem


def test_the_default_lease_directory_is_per_machine_and_shared_by_users() -> None:
    assert leases.lease_dir({}) == os.path.join("/tmp", "clusterrun-leases", socket.gethostname())


# ---------------------------------------------------------------- the plan around leased GPUs

def inv(text: str):
    return parse_inventory_text(textwrap.dedent(text).lstrip("\n"), "inv.yaml")


TWO_NODES = """
nodes:
  - {name: gpu01, host: 10.0.0.1, gpus: [0, 1]}
  - {name: gpu02, host: 10.0.0.2}
"""
HELD = {"gpu01": {1: "run r0 of bob since 17:00:03 (pid 42)"}, "gpu02": {0: "run r0 of bob since 17:00:03 (pid 43)"}}


FOUR = {"gpu01": range(4), "gpu02": range(4)}


def test_a_listed_gpu_another_run_holds_refuses_naming_the_holder() -> None:
    given = inv(TWO_NODES)
    completed = given.model_copy(update={"nodes": [given.nodes[0], given.nodes[1].model_copy(
        update={"gpus": [0, 1, 2, 3]})]})
    _, lines, problems = spare_leased(given, completed, None, FOUR, HELD)
    assert problems["gpu01"].startswith("GPU 1 is leased by run r0 of bob since 17:00:03 (pid 42); list other GPUs")
    # Not listed and no process count: every GPU of the node, so one another run holds refuses, never 3 ranks.
    assert problems["gpu02"] == (
        "GPU 0 is leased by run r0 of bob since 17:00:03 (pid 43); two runs never share a GPU, and without a process "
        "count the run takes every GPU the node allows (0-3), one process each: `--nproc-per-node 3` takes the 3 best "
        "idle GPUs on every node, or `up --wait-gpus` waits until they are free")
    assert lines == []


def test_unlisted_gpus_with_a_process_count_take_that_many_free_ones() -> None:
    given = inv(TWO_NODES)
    out, _, problems = spare_leased(given, given, 2, {"gpu01": range(2), "gpu02": range(4)},
                                         {"gpu02": HELD["gpu02"]})
    assert not problems and out.node("gpu02").gpus == [1, 2]
    out, _, problems = spare_leased(given, given, 2, {"gpu02": (2, 3, 5)}, {"gpu02": {2: "run r0"}})
    assert not problems and out.node("gpu02").gpus == [3, 5]  # the node's own indices, never renumbered
    out, _, problems = spare_leased(given, given, 4, {"gpu02": range(4)}, {"gpu02": HELD["gpu02"]})
    assert problems["gpu02"].startswith("4 GPU(s) needed, 3 of 4 free; GPU 0 is leased by run r0")


def test_without_leases_a_process_count_above_the_gpus_is_left_as_given() -> None:
    given = inv(TWO_NODES)
    out, lines, problems = spare_leased(given, given, 8, {"gpu02": range(4)}, {})
    assert out is given and not lines and not problems


def test_the_nodes_leases_become_holders_in_words_without_the_runs_own() -> None:
    raw = {"0": {"run": "r0", "user": "bob", "since": 0.0, "pid": 42, "node": "gpu01"},
           "1": {"run": "mine", "user": "alice", "since": 0.0, "pid": 7}, "x": {}, "2": "junk"}
    assert set(parse_leases(raw)) == {0, 1}
    held = held_gpus({"gpu01": raw}, own_run="mine")
    assert list(held) == ["gpu01"] and list(held["gpu01"]) == [0]
    assert held["gpu01"][0].startswith("run r0 of bob since ") and held["gpu01"][0].endswith("(pid 42)")


def test_waiting_for_gpus_backs_off_and_gives_up_past_its_limit() -> None:
    now = [0.0]
    said: list[str] = []
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    wait = GpuWait(20.0, said.append, clock=lambda: now[0], sleep=sleep)
    refused = GpusLeased({"gpu01": "GPU 1 is leased by run r0 of bob since 17:00:03 (pid 42); list other GPUs, or x"})
    while wait.again(refused):
        pass
    assert slept == [2.0, 4.0, 8.0, 6.0]  # doubling, cut to what is left of the limit
    assert said[0] == ("waiting for GPUs (gpu01: GPU 1 is leased by run r0 of bob since 17:00:03 (pid 42)); next "
                       "look in 2s, giving up in 20s")


# ---------------------------------------------------------------- rank order

SWITCHES = """
network: {rank_order: "label:switch"}
nodes:
  - {name: a, host: 10.0.0.1, labels: {switch: s1}}
  - {name: b, host: 10.0.0.2, labels: [switch=s2, a100]}
  - {name: c, host: 10.0.0.3, labels: {switch: s1}}
  - {name: d, host: 10.0.0.4}
  - {name: e, host: 10.0.0.5, labels: {switch: s2}}
"""


def job(**kw: object) -> JobSpec:
    return JobSpec(**{"script": "train.py", "run_id": "r1", "local_runs_dir": "/tmp/runs", "local_cwd": "/w", **kw})


def test_nodes_under_one_switch_get_consecutive_ranks() -> None:
    plan = build_plan(inv(SWITCHES), job())
    assert [n.name for n in sorted(plan.nodes, key=lambda n: n.node_rank)] == ["a", "c", "b", "e", "d"]
    assert [n.rank_offset for n in sorted(plan.nodes, key=lambda n: n.node_rank)] == [0, 1, 2, 3, 4]
    assert plan.rank_order == "by label switch (s1, s2)"
    # --rank-order wins over the inventory
    again = build_plan(inv(SWITCHES), job(rank_order="inventory"))
    assert [n.name for n in sorted(again.nodes, key=lambda n: n.node_rank)] == ["a", "b", "c", "d", "e"]


def test_plan_shows_the_rank_order_by_label(tmp_path: Path) -> None:
    (tmp_path / "inv.yaml").write_text(textwrap.dedent(SWITCHES).replace('"label:switch"', "inventory"))
    (tmp_path / "train.py").write_text("")
    args = [sys.executable, "-m", "clusterrun", "plan", "--rank-order", "label:switch", "inv.yaml", "train.py"]
    shown = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env=clusterrun_env(), timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "node ranks: by label switch (s1, s2): 0 a, 1 c, 2 b, 3 e, 4 d" in shown.stdout
    as_json = subprocess.run([*args[:4], "--json", *args[4:]], cwd=tmp_path, capture_output=True, text=True,
                             env=clusterrun_env(), timeout=60)
    shown_json = json.loads(as_json.stdout)
    assert [(n["name"], n["node_rank"]) for n in shown_json["nodes"]] == [("a", 0), ("c", 1), ("b", 2), ("e", 3),
                                                                           ("d", 4)]
    assert shown_json["rank_order"] == "by label switch (s1, s2)"
    bad = subprocess.run([*args[:5], "label:", *args[6:]], cwd=tmp_path, capture_output=True, text=True,
                         env=clusterrun_env(), timeout=60)
    assert bad.returncode == 2 and "--rank-order: expected 'inventory' or 'label:KEY'" in bad.stderr


def test_under_slurm_the_topology_address_keeps_nodes_of_one_switch_together() -> None:
    nodes = inv("""
        nodes:
          - {name: n1, host: 10.0.0.1}
          - {name: n2, host: 10.0.0.2}
          - {name: n3, host: 10.0.0.3}
          - {name: n4, host: 10.0.0.4}
        """)
    ready = {name: ProbedNode(name, topology_addr=f"s0.{switch}.{name}")
             for name, switch in (("n1", "s1"), ("n2", "s2"), ("n3", "s1"), ("n4", "s2"))}
    labelled, ordered = with_slurm_topology(nodes, job(), ready)
    plan = build_plan(labelled, ordered)
    assert [n.name for n in sorted(plan.nodes, key=lambda n: n.node_rank)] == ["n1", "n3", "n2", "n4"]
    assert plan.rank_order == "by label slurm-switch (s0.s1, s0.s2)"
    # A rank order the user chose wins; without a topology (the address is the bare node name) nothing changes.
    assert with_slurm_topology(nodes, job(rank_order="inventory"), ready) == (nodes, job(rank_order="inventory"))
    flat = {name: ProbedNode(name, topology_addr=name) for name in ready}
    assert with_slurm_topology(nodes, job(), flat) == (nodes, job())


@pytest.mark.parametrize(("given", "value"), [(["--wait-gpus"], "inf"), (["--wait-gpus", "90"], "90")])
def test_wait_gpus_takes_seconds_or_nothing_before_the_inventory(given: list[str], value: str) -> None:
    from clusterrun.cli.job_argv import split
    from clusterrun.cli.up_cmd import up

    ours, positionals, script_args, _ = split(up, [*given, "inv.yaml", "train.py", "--lr", "1"],
                                              ("--ips", "--hostfile", "--slurm"))
    assert (ours, positionals, script_args) == (["--wait-gpus", value], ["inv.yaml", "train.py"], ["--lr", "1"])


def test_ps_names_a_node_it_could_not_ask(tmp_path: Path) -> None:
    (tmp_path / "inv.yaml").write_text(textwrap.dedent(f"""
        defaults: {{transport: local}}
        nodes:
          - {{name: here, host: localhost, python: {sys.executable}}}
          - {{name: broken, host: localhost, python: {tmp_path / 'no-such-python'}}}
        """))
    env = {**clusterrun_env(), leases.DIR_VAR: str(tmp_path / "leases")}
    args = [sys.executable, "-m", "clusterrun", "ps", "inv.yaml", "--timeout", "20"]
    shown = subprocess.run([*args, "--json"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 1
    found = json.loads(shown.stdout)
    assert list(found["unreachable"]) == ["broken"] and "clusterrun: broken: could not be asked: " in shown.stderr
    table = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60)
    assert table.returncode == 1 and "on 1 of 2 node(s)" in table.stderr
