"""The data-path watch on the simulated cluster: a data NIC that stops passing traffic mid-run is named in
seconds, with its node and the peer it stopped reaching; the job is stopped (or, with --on-path-loss warn,
left running); nothing is left on any node."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from loadscale import scaled
from simcluster import SimCluster
from simjobs import (
    assert_nothing_left,
    run_clusterrun,
    start_clusterrun,
    status,
    the_run,
    wait_for_lines,
    write_inventory,
)

pytestmark = pytest.mark.cluster

ALLREDUCE_LOOP = """
import datetime, time, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))  # gloo alone would wait 5 minutes
t = torch.ones(1024)
for step in range(100000):
    dist.all_reduce(t)
    if step % 10 == 0:
        print("step", step, "rank", dist.get_rank(), flush=True)
    time.sleep(0.05)
"""

QUIET_JOB = """
import os, time
print("working", os.environ["RANK"], flush=True)
time.sleep(16)
print("done", os.environ["RANK"], flush=True)
"""


def test_dead_data_nic_is_named_and_the_job_stopped_within_seconds(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    (tmp_path / "loop.py").write_text(ALLREDUCE_LOOP)
    proc = start_clusterrun("up", str(inv), "loop.py", cwd=tmp_path)
    try:
        wait_for_lines(proc, 8, "step")  # every rank is training (twice)
        run = the_run(tmp_path)
        sim_cluster.drop_nic("node2", "data")
        fault = time.monotonic()
        _out, err = proc.communicate(timeout=scaled(90))
        took = time.monotonic() - fault
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    nic, master = sim_cluster.nodes[2].data_nic, sim_cluster.nodes[0].data_ip
    assert f"node2: its data path died: {nic} stopped reaching node0 ({master}) at " in err, err
    assert took < 30, f"the run ended {took:.1f}s after the fault"
    st = status(run)
    assert st["first_failure"]["node"] == "node2" and st["first_failure"]["detail"].startswith("its data path died: ")
    assert [e["node"] for e in st["events"] if e["kind"] == "path-verdict"] == ["node2"]
    assert all(n["received"] > 0 for n in st["watch"].values())  # the watch ran on every node
    shown = run_clusterrun("status", run.name, cwd=tmp_path).stdout
    assert "node2: path-verdict: node2: eth1 stopped reaching node0" in shown.replace(nic, "eth1"), shown
    assert_nothing_left(sim_cluster, run.name, timeout=15)


def test_on_path_loss_warn_reports_and_lets_the_job_run(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    (tmp_path / "quiet.py").write_text(QUIET_JOB)
    proc = start_clusterrun("up", "--on-path-loss", "warn", str(inv), "quiet.py", cwd=tmp_path)
    try:
        wait_for_lines(proc, 3, "working")
        run = the_run(tmp_path)
        sim_cluster.drop_nic("node1", "data")
        deadline = time.monotonic() + scaled(30)
        while "path-verdict" not in str(status(run).get("events")) and time.monotonic() < deadline:
            time.sleep(0.2)
        # The job would stay blocked in torchrun's exit barrier without its data network: bring it back.
        sim_cluster.restore_nic("node1", "data")
        _out, err = proc.communicate(timeout=scaled(120))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "node1: " in err and "(--on-path-loss warn: the job goes on)" in err
    st = status(run)
    assert st["state"] == "succeeded"
    assert any(n.startswith("node1: ") and "stopped reaching" in n for n in st["notes"])
    assert_nothing_left(sim_cluster, run.name)


ONE_RANK_STUCK = """
import time
print("importing torch", flush=True)  # output at every step of the start, so only the hang is silent
import torch, torch.distributed as dist

def stuck_here():
    time.sleep(300)

def train():
    print("joining", flush=True)
    dist.init_process_group("gloo")
    t = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(t)
    print("warmed up", dist.get_rank(), flush=True)
    if dist.get_rank() == 3:
        stuck_here()
    dist.all_reduce(t)

train()
"""


def test_hang_gets_every_ranks_stack_and_names_the_stuck_one(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """Rank 3 sleeps while the others wait for it in all_reduce; nothing prints. The nodes have no py-spy on
    their PATH: the stacks come from the faulthandler hook clusterrun installs in every worker."""
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=2)
    (tmp_path / "stuck.py").write_text(ONE_RANK_STUCK)
    done = run_clusterrun("up", "--hang-timeout", "10", "--on-hang", "stop", str(inv), "stuck.py", cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    assert "no rank has printed anything for" in done.stderr
    assert "ranks 0-2 in all_reduce (stuck.py:18)" in done.stderr, done.stderr
    assert "rank 3 in stuck_here (stuck.py:7)   <- the odd one out" in done.stderr
    assert ("default_pg: ranks 0-2 wait in all_reduce #4; rank 3 never called it (last collective: all_reduce #3)"
            in done.stderr), done.stderr  # torch's flight recorder, asked of every rank on both nodes
    run = the_run(tmp_path)
    for rank in range(4):
        saved = (run / f"node{rank // 2}" / f"stack-rank{rank}.txt").read_text()
        assert saved.startswith(f"# rank {rank} on node{rank // 2}, taken with faulthandler")
        assert 'in train' in saved
        assert (run / f"node{rank // 2}" / f"flight-rank{rank}.json").stat().st_size > 0
    st = status(run)
    assert [e["kind"] for e in st["events"] if e["kind"].startswith("hang")] == ["hang", "hang-stacks",
                                                                                "hang-collectives"]
    assert st["first_failure"]["detail"].startswith("hung: no rank printed anything")
    assert (st["first_failure"]["node"], st["first_failure"]["rank"]) == ("node1", 3)
    assert_nothing_left(sim_cluster, run.name)


STUCK_BEFORE_ANY_COLLECTIVE = """
import time
print("importing torch", flush=True)
import torch, torch.distributed as dist

def stuck_here():
    time.sleep(300)

dist.init_process_group("gloo")
print("joined", dist.get_rank(), flush=True)
if dist.get_rank() == 3:
    stuck_here()
dist.all_reduce(torch.ones(8))
"""


def test_a_hang_before_any_collective_names_the_stuck_rank_everywhere(sim_cluster: SimCluster,
                                                                       tmp_path: Path) -> None:
    """Rank 3 sleeps before its first collective: its flight recorder holds nothing. The stacks, the flight
    recorder and the run's first failure all name rank 3 on node1 (not "no rank is missing", not the master)."""
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=2)
    (tmp_path / "first.py").write_text(STUCK_BEFORE_ANY_COLLECTIVE)
    done = run_clusterrun("up", "--hang-timeout", "10", "--on-hang", "stop", str(inv), "first.py", cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    assert "rank 3 in stuck_here (first.py:7)   <- the odd one out" in done.stderr, done.stderr
    assert ("default_pg: ranks 0-2 wait in all_reduce #1; rank 3 never called it (last collective: none)"
            in done.stderr), done.stderr
    assert "no rank is missing" not in done.stderr
    assert "node1 rank 3: hung: no rank printed anything" in done.stderr
    run = the_run(tmp_path)
    st = status(run)
    assert (st["first_failure"]["node"], st["first_failure"]["rank"]) == ("node1", 3)
    assert_nothing_left(sim_cluster, run.name)


SLOW_NODE1 = """
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(8)
end = time.time() + 16
while True:
    if dist.get_rank() == 1:
        busy = time.time() + 0.2
        while time.time() < busy:  # a slower machine: more time on the same work
            pass
    flag = torch.tensor([1.0 if time.time() < end else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # the first rank past the end stops all at the same step
    if flag.item() == 0.0:
        break
print("done", dist.get_rank(), flush=True)
dist.barrier()  # leave together: a rank that exits while gloo still talks to it may abort (SIGABRT)
dist.destroy_process_group()
"""


def _clearly_apart(run: Path, span: int = 12) -> bool:
    """Whether the run's series shows node1's rank 1 working clearly apart for ``span`` seconds in a row: its mean
    share of a CPU over them at least 0.65 and three times the busier of the two others' (the rule asks 0.5 and
    twice their median, over three 3-s reports: how a loaded machine lets the rank run decides)."""
    seconds: dict[int, dict[int, float]] = {}
    for path in run.glob("node*/metrics.jsonl"):
        for sample in map(json.loads, path.read_text().splitlines()):
            for rank, reading in (sample.get("ranks") or {}).items():
                if "cpu" in reading:
                    seconds.setdefault(int(sample["t"]), {})[int(rank)] = reading["cpu"]
    for first in sorted(seconds):
        stretch = [seconds.get(first + k, {}) for k in range(span)]
        if all(len(cpu) == 3 for cpu in stretch):
            mean = [sum(cpu[r] for cpu in stretch) / span for r in range(3)]
            if mean[1] >= 0.65 and mean[1] >= 3 * max(mean[0], mean[2], 0.05):
                return True
    return False


def test_a_slow_node_is_named_as_a_straggler(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    (tmp_path / "slow.py").write_text(SLOW_NODE1)
    done = run_clusterrun("up", str(inv), "slow.py", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    run = the_run(tmp_path)
    named = [e for e in status(run)["events"] if e["kind"] == "straggler"]
    # Never a rank that waits, whatever the machine's load; the evidence the rule's own (twice the others at least).
    assert all((e["node"], e["rank"], e["by"]) == ("node1", 1, "cpu") for e in named), named
    assert all(e["cpu"] >= 0.5 and e["cpu"] >= 2 * e["cpu_others"] for e in named), named
    assert "node0 rank" not in done.stderr and "node2 rank" not in done.stderr
    # Named once whenever its work stood clearly apart for 12 s (three 3-s reports in a row, wherever they fell).
    if _clearly_apart(run):
        assert len(named) == 1 and "node1 rank 1 looks like a straggler: it kept" in done.stderr, done.stderr[-3000:]
