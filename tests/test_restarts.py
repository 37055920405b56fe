"""Keeping training going on the simulated cluster: a restart after a failure, a lost node left out, a spare in
its place, a failure that repeats stops the restarts; nothing is left on any node after any of them."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from loadscale import scaled
from simcluster import SimCluster
from simjobs import run_clusterrun, start_clusterrun, status, the_run, write_inventory

pytestmark = pytest.mark.cluster

JOB = """
import os, sys, time, torch, torch.distributed as dist
mode = sys.argv[1]
attempt = int(os.environ["CLUSTERRUN_RESTART_COUNT"])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"attempt {attempt} rank {rank} world {world} torchelastic {os.environ['TORCHELASTIC_RESTART_COUNT']}",
      flush=True)
if mode == "always" and rank == 1:
    print("cannot open data/shard-7.bin", flush=True)
    sys.exit(4)
t = torch.ones(4)
steps = 900 if mode == "partition" and attempt == 0 else 3
for i in range(steps):
    dist.all_reduce(t)
    if rank == 0 and i % 10 == 0:
        print("step", i, flush=True)
    time.sleep(0.1)
if mode == "once" and attempt == 0 and rank == 1:
    sys.exit(3)
dist.barrier()
dist.destroy_process_group()
print("finished", rank, flush=True)
"""

FAST = ("--restart-backoff", "0.5")


def lines(done_stdout: str, prefix: str) -> list[str]:
    return [line.split("] ", 1)[1] for line in done_stdout.splitlines() if "] " in line
            and line.split("] ", 1)[1].startswith(prefix)]


def test_a_rank_that_fails_once_is_restarted_and_sees_the_count(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "job.py").write_text(JOB)
    done = run_clusterrun("up", "--max-restarts", "1", *FAST, str(inv), "job.py", "once", cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(lines(done.stdout, "attempt 1")) == ["attempt 1 rank 0 world 2 torchelastic 1",
                                                       "attempt 1 rank 1 world 2 torchelastic 1"]
    run = the_run(tmp_path)
    st = status(run)
    assert st["state"] == "succeeded" and st["restart_count"] == 1
    assert [(a["attempt"], a["state"]) for a in st["attempts"]] == [(0, "failed"), (1, "succeeded")]
    assert "node1 rank 1: exit code 3" in st["attempts"][0]["cause"]
    assert "attempt 0 torchelastic" not in (run / "node1" / "rank1.log").read_text()  # the top: the last attempt
    assert "attempt 0 rank 1" in (run / "attempt-0" / "node1" / "rank1.log").read_text()  # the first, kept
    assert not sim_cluster.wait_no_processes(run.name, 15)


ENV = """
import os
print("env", os.environ["RANK"], os.environ["TORCHELASTIC_MAX_RESTARTS"], os.environ["TORCHELASTIC_RESTART_COUNT"],
      flush=True)
"""


def test_workers_see_clusterruns_max_restarts_as_torchelastic_max_restarts(sim_cluster: SimCluster,
                                                                           tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "env.py").write_text(ENV)
    done = run_clusterrun("up", "--max-restarts", "3", *FAST, str(inv), "env.py", cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(lines(done.stdout, "env ")) == ["env 0 3 0", "env 1 3 0"]
    plan = json.loads((the_run(tmp_path) / "plan.json").read_text())
    assert plan["nodes"][0]["env"]["CLUSTERRUN_MAX_RESTARTS"] == "3"
    done = run_clusterrun("up", str(inv), "env.py", cwd=tmp_path, timeout=240)  # no restarts: torchrun's 0
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(lines(done.stdout, "env ")) == ["env 0 0 0", "env 1 0 0"]


def test_the_same_failure_twice_stops_the_restarts(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "job.py").write_text(JOB)
    done = run_clusterrun("up", "--max-restarts", "5", *FAST, str(inv), "job.py", "always", cwd=tmp_path,
                          timeout=240)
    assert done.returncode == 4, done.stderr[-3000:]
    assert "attempts 0 and 1 failed the same way" in done.stderr and "a restart cannot fix that" in done.stderr
    st = status(the_run(tmp_path))
    assert [a["attempt"] for a in st["attempts"]] == [0, 1] and st["state"] == "failed"
    assert not sim_cluster.wait_no_processes(the_run(tmp_path).name, 15)


def _run_and_partition(sim_cluster: SimCluster, tmp_path: Path, inv: Path, victim: int,
                       *flags: str) -> tuple[int, str, str]:
    (tmp_path / "job.py").write_text(JOB)
    proc = start_clusterrun("up", "--max-restarts", "2", *FAST, *flags, str(inv), "job.py", "partition", cwd=tmp_path)
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True),  # type: ignore[arg-type]
               threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)]  # type: ignore[arg-type]
    for t in readers:
        t.start()
    try:
        deadline = time.monotonic() + scaled(120)
        while not any("step 20" in line for line in out) and time.monotonic() < deadline:
            assert proc.poll() is None, "".join(err)[-3000:]
            time.sleep(0.2)
        sim_cluster.partition(victim)  # the node falls off both networks in the middle of training
        proc.wait(timeout=scaled(300))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for t in readers:
            t.join(timeout=scaled(10))
        sim_cluster.heal(victim)
    return proc.returncode, "".join(out), "".join(err)


def test_a_lost_node_is_left_out_and_the_job_goes_on_with_fewer(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    code, out, err = _run_and_partition(sim_cluster, tmp_path, inv, 3, "--min-nodes", "3")
    assert code == 0, err[-4000:]
    assert sorted(lines(out, "attempt 1")) == [f"attempt 1 rank {r} world 3 torchelastic 1" for r in range(3)]
    assert "node3 left out" in err
    assert "node3: its data path died: stopped answering on its data address" in err  # not its only watcher
    run = the_run(tmp_path)
    st = status(run)
    assert st["state"] == "succeeded" and st["attempts"][1]["nodes"] == ["node0", "node1", "node2"]
    assert "node3" in st["attempts"][1]["left_out"]
    # The record covers the whole run: both attempts, from the first start to the last end, and what the watch
    # saw in attempt 0 and why it failed, at the top.
    first, second = st["attempts"]
    assert (first["state"], second["state"]) == ("failed", "succeeded")
    assert first["started"] < first["ended"] <= second["started"] < second["ended"] == st["ended"]
    assert st["started"] == first["started"] and st["duration"] == pytest.approx(st["ended"] - first["started"])
    assert st["first_failure"]["node"] == "node3" and first["first_failure"] == st["first_failure"]
    lost = [e for e in st["events"] if e["kind"] in ("path-lost", "path-verdict") and e["node"] == "node3"]
    assert lost and {e["attempt"] for e in lost} == {0}
    # The summary, `status` and `runs` give the whole run's duration, not the last attempt's.
    whole = f"{st['duration']:.1f}s"
    assert f"succeeded after {whole}" in err
    shown = run_clusterrun("status", cwd=tmp_path).stdout
    assert f"took {whole}" in shown and "attempt 0 on node0, node1, node2, node3" in shown
    assert "first failure: node3: its data path died" in shown and "path-" in shown
    assert json.loads(run_clusterrun("runs", "--json", cwd=tmp_path).stdout)[0]["duration"] == st["duration"]
    # node3 was left out of attempt 1: its logs are those of attempt 0, and `logs` finds them there.
    logs = run_clusterrun("logs", "--node", "node3", cwd=tmp_path)
    assert logs.returncode == 0 and "[node3:3] attempt 0 rank 3 world 4" in logs.stdout, logs.stderr
    assert f"logs of node3: runs/{run.name}/attempt-0/node3/" in shown
    # node3's agent stopped its job when clusterrun went silent (the partition); nothing anywhere now
    assert not sim_cluster.wait_no_processes(run.name, 30)


def test_a_spare_takes_the_lost_masters_place(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    inv.write_text(inv.read_text().replace("    host: node3\n", "    host: node3\n    spare: true\n"))
    (tmp_path / "job.py").write_text(JOB)
    plan = json.loads(run_clusterrun("plan", "--json", str(inv), "job.py", cwd=tmp_path).stdout)
    assert plan["spares"] == ["node3"] and plan["world_size"] == 3
    code, out, err = _run_and_partition(sim_cluster, tmp_path, inv, 0)
    assert code == 0, err[-4000:]
    assert sorted(lines(out, "attempt 1")) == [f"attempt 1 rank {r} world 3 torchelastic 1" for r in range(3)]
    st = status(the_run(tmp_path))
    assert st["attempts"][1]["replaced"] == {"node0": "node3"}
    assert st["attempts"][1]["nodes"] == ["node3", "node1", "node2"]  # the spare is rank 0: the master moved
    assert not sim_cluster.wait_no_processes(the_run(tmp_path).name, 30)
