"""`up --detach` on the simulated cluster: the job outlives clusterrun, `logs -f` follows it from the nodes and
records its end, `down` stops it, and nothing of it is left afterwards."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import run_clusterrun, write_inventory

pytestmark = pytest.mark.cluster

TICKER = """
import os, sys, time
for i in range(4):
    print("tick", i, "rank", os.environ["RANK"], flush=True)
    time.sleep(1)
sys.exit(0)
"""
SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n"


def detach(inv: Path, cwd: Path, script: str) -> str:
    started = time.monotonic()
    done = run_clusterrun("up", "--detach", str(inv), script, cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    run_id = done.stdout.strip()
    assert f"clusterrun logs {run_id} -f" in done.stderr
    return run_id


def test_detached_job_runs_on_and_logs_follow_it_to_its_end(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "tick.py").write_text(TICKER)
    run_id = detach(inv, tmp_path, "tick.py")
    assert set(sim_cluster.job_processes(run_id)) == {"node0", "node1"}  # clusterrun is gone, the job is not
    status = json.loads(run_clusterrun("status", run_id, "--json", cwd=tmp_path).stdout)
    assert status["state"] == "detached"
    done = run_clusterrun("logs", run_id, "-f", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for rank, node in ((0, "node0"), (1, "node1")):
        assert [x for x in lines if x.startswith(f"[{node}:{rank}] tick")] == [
            f"[{node}:{rank}] tick {i} rank {rank}" for i in range(4)]
    status = json.loads(run_clusterrun("status", run_id, "--json", cwd=tmp_path).stdout)
    assert status["state"] == "succeeded" and status["exit_code"] == 0
    # The run's page, written at the start (detached) and again once its end was recorded.
    assert "clusterrun run " + run_id + ": succeeded" in (tmp_path / "runs" / run_id / "report.html").read_text()
    assert sim_cluster.wait_no_processes(run_id, 5) == {}


def test_down_stops_a_detached_job(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "sleep.py").write_text(SLEEPER)
    run_id = detach(inv, tmp_path, "sleep.py")
    deadline = time.monotonic() + 30
    while set(sim_cluster.job_processes(run_id)) != {"node0", "node1"} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(sim_cluster.job_processes(run_id)) == {"node0", "node1"}
    done = run_clusterrun("down", run_id, "--grace", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "node0: stopped" in done.stdout and "node1: stopped" in done.stdout
    assert sim_cluster.wait_no_processes(run_id, 5) == {}
    assert json.loads(run_clusterrun("status", run_id, "--json", cwd=tmp_path).stdout)["state"] == "stopped"
    # Its logs were never copied here: `logs` says where they are instead of only that runs/ has none.
    logs = run_clusterrun("logs", run_id, cwd=tmp_path)
    assert logs.returncode == 2
    assert "detached, so its rank logs stayed on its nodes" in logs.stderr
    assert f"node0:~/.clusterrun/runs/{run_id}/node0/torchrun/" in logs.stderr and "scp" in logs.stderr


def test_logs_follow_started_right_after_detach_follows_the_run_to_its_end(sim_cluster: SimCluster,
                                                                         tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "late.py").write_text("import time\ntime.sleep(3)\n" + TICKER)
    run_id = detach(inv, tmp_path, "late.py")
    done = run_clusterrun("logs", run_id, "-f", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    for rank, node in ((0, "node0"), (1, "node1")):
        assert [x for x in done.stdout.splitlines() if x.startswith(f"[{node}:{rank}]")] == [
            f"[{node}:{rank}] tick {i} rank {rank}" for i in range(4)]
    assert json.loads(run_clusterrun("status", run_id, "--json", cwd=tmp_path).stdout)["state"] == "succeeded"
    assert sim_cluster.wait_no_processes(run_id, 5) == {}


# Rank 1 fails at once; rank 0 fails later with another code. Left alone (detached), both fail; attached, rank 0
# is stopped when rank 1 fails. Either way the run's first failure is rank 1's.
FAILING = """
import os, sys, time
if os.environ["RANK"] == "1":
    print("rank 1 gives up", flush=True)
    sys.exit(3)
time.sleep(4)
sys.exit(5)
"""


def test_attached_and_detached_runs_of_one_failing_job_record_the_same_first_failure(sim_cluster: SimCluster,
                                                                                     tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "fail.py").write_text(FAILING)
    attached = run_clusterrun("up", str(inv), "fail.py", cwd=tmp_path, timeout=120)
    assert attached.returncode == 3, attached.stderr[-3000:]
    run_id = detach(inv, tmp_path, "fail.py")
    followed = run_clusterrun("logs", run_id, "-f", cwd=tmp_path, timeout=120)
    assert followed.returncode == 0, followed.stderr
    records = [json.loads(run_clusterrun("status", r["run_id"], "--json", cwd=tmp_path).stdout)
               for r in json.loads(run_clusterrun("runs", "--json", cwd=tmp_path).stdout)]
    assert [r["state"] for r in records] == ["failed", "failed"]
    for record in records:
        failure = record["first_failure"]
        assert (failure["node"], failure["rank"], failure["exit_code"]) == ("node1", 1, 3), record
        assert record["exit_code"] == 3
        assert record["nodes"]["node1"]["ranks"]["1"]["state"] == "failed"
    assert records[1]["nodes"]["node0"]["ranks"]["0"]["exit_code"] == 5  # detached: rank 0 failed too, later
    assert sim_cluster.wait_no_processes(run_id, 5) == {}
