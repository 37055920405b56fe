"""`clusterrun runs`, `status`, `logs` and `down` on real runs: local ones, and a run left behind on the
simulated cluster when its clusterrun was killed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
from loadscale import scaled
from simcluster import SimCluster
from simjobs import (
    ROOT,
    agent_of,
    run_clusterrun,
    sshd_connections,
    start_clusterrun,
    the_run,
    wait_for_lines,
    wait_until,
    write_inventory,
)

LOCAL = ROOT / "inventories" / "localhost.yaml"
TWO_LINES = """
import os, sys
print("hello from", os.environ["RANK"], flush=True)
print("bye from", os.environ["RANK"], flush=True)
sys.exit(3 if os.environ["RANK"] == "1" else 0)
"""


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("runs")
    (cwd / "job.py").write_text(TWO_LINES)
    (cwd / "ok.py").write_text("print('fine')\n")
    assert run_clusterrun("up", str(LOCAL), "ok.py", cwd=cwd).returncode == 0
    assert run_clusterrun("up", str(LOCAL), "job.py", cwd=cwd).returncode == 3
    return cwd


def test_runs_lists_both_with_state_and_exit(two_runs: Path) -> None:
    rows = json.loads(run_clusterrun("runs", "--json", cwd=two_runs).stdout)
    assert [(r["state"], r["exit_code"], r["world_size"]) for r in rows] == [("succeeded", 0, 2), ("failed", 3, 2)]
    table = run_clusterrun("runs", cwd=two_runs).stdout
    assert all(r["run_id"] in table for r in rows)


def test_status_of_the_last_run_names_the_failure(two_runs: Path) -> None:
    done = run_clusterrun("status", cwd=two_runs)
    assert done.returncode == 0
    assert "failed" in done.stdout and "first failure: localhost rank 1: exit code 3" in done.stdout
    first = json.loads(run_clusterrun("runs", "--json", cwd=two_runs).stdout)[0]["run_id"]
    by_suffix = run_clusterrun("status", first[-4:], "--json", cwd=two_runs)
    assert json.loads(by_suffix.stdout)["state"] == "succeeded"
    missing = run_clusterrun("status", "nope", cwd=two_runs)
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr


def test_status_watch_of_a_finished_run_prints_it_once_and_ends(two_runs: Path) -> None:
    done = run_clusterrun("status", "--watch", cwd=two_runs, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("failed, ") == 1 and "localhost" in done.stdout and "0/2" in done.stdout
    refused = run_clusterrun("status", "--watch", "--json", cwd=two_runs)
    assert refused.returncode == 2 and "--watch" in refused.stderr


def test_logs_prefix_every_line_and_filter(two_runs: Path) -> None:
    out = run_clusterrun("logs", cwd=two_runs).stdout.splitlines()
    assert "[localhost:0] hello from 0" in out and "[localhost:1] bye from 1" in out
    only = run_clusterrun("logs", "last", "--rank", "1", cwd=two_runs).stdout.splitlines()
    assert only == ["[localhost:1] hello from 1", "[localhost:1] bye from 1"]
    none = run_clusterrun("logs", "last", "--node", "gpu9", cwd=two_runs)
    assert none.returncode == 2 and "no rank logs for node gpu9" in none.stderr


def test_down_on_a_finished_local_run_finds_nothing(two_runs: Path) -> None:
    done = run_clusterrun("down", cwd=two_runs)
    assert done.returncode == 0 and "localhost: nothing left" in done.stdout


SLOW_START = """
import os, time
time.sleep(2)
for i in range(3):
    print("line", i, "from", os.environ["RANK"], flush=True)
    time.sleep(0.5)
"""


def test_logs_follow_started_before_any_output_waits_for_the_run(tmp_path: Path) -> None:
    """`logs -f` in the first moments of a run (nodes still checked, no rank has written) follows it to its end."""
    (tmp_path / "slow.py").write_text(SLOW_START)
    proc = start_clusterrun("up", str(LOCAL), "slow.py", cwd=tmp_path)
    try:
        deadline = time.monotonic() + scaled(30)
        while not list(tmp_path.glob("runs/*/status.json")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        run = the_run(tmp_path)
        assert not list(run.glob("*/rank*.log"))  # nothing written yet
        follow = run_clusterrun("logs", "-f", cwd=tmp_path, timeout=120)
        assert follow.returncode == 0, follow.stderr
        assert proc.wait(timeout=scaled(60)) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = follow.stdout.splitlines()
    for rank in (0, 1):
        assert [x for x in lines if x.startswith(f"[localhost:{rank}]")] == [
            f"[localhost:{rank}] line {i} from {rank}" for i in range(3)]


SLEEPER = "import os, time\nprint('up', os.environ['RANK'], flush=True)\ntime.sleep(300)\n"


@pytest.mark.cluster
def test_down_stops_what_a_hung_agent_left_behind(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """The node agents hang (SIGSTOP) and clusterrun is killed: nothing stops the job by itself; `down` does."""
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "sleep.py").write_text(SLEEPER)
    proc = start_clusterrun("up", str(inv), "sleep.py", cwd=tmp_path)
    agents: list[int] = []
    try:
        wait_for_lines(proc, 2, "up ")
        run = the_run(tmp_path)
        agents = [agent_of(run.name, node) for node in ("node0", "node1")]
        for pid in agents:
            os.kill(pid, signal.SIGSTOP)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=scaled(10))
        assert json.loads(run_clusterrun("status", "--json", cwd=tmp_path).stdout)["state"] == "lost"
        # Each node's sshd has seen its connection end (what a live agent would act on): the job is still there.
        for node in ("node0", "node1"):
            wait_until(lambda node=node: not sshd_connections(sim_cluster, node), 30, f"{node}'s sshd closing")
        assert set(sim_cluster.job_processes(run.name)) == {"node0", "node1"}  # left behind
        started = time.monotonic()
        done = run_clusterrun("down", run.name, "--grace", "1", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "node0: stopped" in done.stdout and "node1: stopped" in done.stdout
        assert time.monotonic() - started < 15
        assert sim_cluster.wait_no_processes(run.name, 2) == {}
        assert json.loads(run_clusterrun("status", "--json", cwd=tmp_path).stdout)["state"] == "stopped"
    finally:
        for pid in agents:  # the hung agents are ours: let them go
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
