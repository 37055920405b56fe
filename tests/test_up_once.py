"""`up` reaches every node once: one program per node does the checks before the job, then runs it.

On the simulated cluster. The nodes' python is a wrapper that writes down each start (the node, how it was
called) before it becomes the real interpreter: a whole run starts the agent once and torchrun once per node,
nothing else. When the checks refuse a start (the master port taken, a firewall on it, no such python), the
error names the node and what to do, and no agent is left waiting on any node.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loadscale import scaled
from simcluster import SimCluster
from simjobs import clusterrun_env, run_clusterrun, the_run, write_inventory

pytestmark = pytest.mark.cluster

PORT = 29613
WRAPPER = """#!/bin/sh
for last; do :; done
printf '%s %s %s\\n' "$(hostname)" "$1" "$(printf '%s' "$last" | head -n 1)" >> {log}
exec {python} "$@"
"""


def agents_left(cluster: SimCluster, nodes: int) -> dict[str, list[str]]:
    """Node agents still waiting before a job (``agent.py prepare``), by node."""
    found: dict[str, list[str]] = {}
    for node in cluster.nodes[:nodes]:
        left = [cmd for _, cmd in cluster.processes(node) if cmd.rstrip().endswith(" prepare")]
        if left:
            found[node.name] = left
    return found


def wait_no_agents(cluster: SimCluster, nodes: int, timeout: float = 10.0) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout
    while True:
        left = agents_left(cluster, nodes)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_a_run_starts_one_program_per_node_before_torchrun(sim_cluster: SimCluster, tmp_path: Path) -> None:
    log = tmp_path / "starts.log"
    python = tmp_path / "python"
    python.write_text(WRAPPER.format(log=log, python=sys.executable))
    python.chmod(0o755)
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1, python=str(python))
    (tmp_path / "worker.py").write_text("print('hello from', __import__('os').environ['RANK'])\n")
    done = run_clusterrun("up", "--master-port", str(PORT), str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "network paths to node0 ok" in done.stderr  # the path check ran, by the agents already there
    starts: dict[str, list[str]] = {}
    for line in log.read_text().splitlines():
        node, first, last = line.split(" ", 2)
        starts.setdefault(node, []).append(f"{first} {last}")
    for node in ("node0", "node1", "node2"):
        programs = starts.get(node, [])
        assert len(programs) == 2, f"{node} started {programs}"
        assert programs[0] == "-S prepare"  # the agent: ready check, path probes, then the job
        # torchrun, by the agent at the ready check: it imports torch until go hands it the job (remote/warm.py)
        assert programs[1] == "-c import json,os,runpy,sys", programs
    status = json.loads((the_run(tmp_path) / "status.json").read_text())
    assert all(node["timeline"]["torchrun"]["warm"] for node in status["nodes"].values())
    assert not wait_no_agents(sim_cluster, 3)


def test_master_port_in_use_is_refused_and_no_agent_waits(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    (tmp_path / "worker.py").write_text("")
    holder = sim_cluster.ns_popen("node0", [sys.executable, "-c", (
        "import socket, time\n"
        f"s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('', {PORT})); s.listen(1); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        done = run_clusterrun("up", "--master-port", str(PORT), str(inv), "worker.py", cwd=tmp_path)
    finally:
        holder.kill()
        holder.wait(timeout=scaled(10))
    assert done.returncode == 125, done.stderr
    assert f"node0: master port {PORT} is already in use on this node" in done.stderr
    assert "--master-port" in done.stderr
    assert not wait_no_agents(sim_cluster, 3), "agents were left waiting for a job that never came"


def test_a_firewalled_master_port_is_told_from_a_dead_path(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    (tmp_path / "worker.py").write_text("")
    sim_cluster.block_port("node0", PORT)
    done = run_clusterrun("up", "--master-port", str(PORT), str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode == 125, done.stderr
    master = f"{sim_cluster.nodes[0].data_ip}:{PORT}"
    for node in ("node1", "node2"):
        assert f"{node}: cannot reach node0's master address {master}" in done.stderr
    assert "the master answers ping, so something blocks the port (firewall)" in done.stderr
    assert not wait_no_agents(sim_cluster, 3)


def test_a_dead_master_data_nic_is_named_once_not_each_workers(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """Rank 0's data NIC drops everything: no worker reaches the master, the master reaches no worker, the workers
    reach each other. One suspect, the master's NIC, with that evidence; no worker's NIC is blamed."""
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    (tmp_path / "worker.py").write_text("")
    sim_cluster.drop_nic("node0", "data")
    done = run_clusterrun("up", "--master-port", str(PORT), str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode == 125, done.stderr
    master = sim_cluster.nodes[0]
    assert done.stderr.count(f"  node0: its data NIC {master.data_nic} ({master.data_ip}) is the suspect: no worker "
                             "reaches it") == 1, done.stderr
    assert "it gets no ping reply from any worker; the workers reach each other" in done.stderr
    assert "1 problem(s)" in done.stderr and "this NIC or the path to the master" not in done.stderr
    assert json.loads((the_run(tmp_path) / "preflight.json").read_text())["suspect"] == "node0"
    assert not wait_no_agents(sim_cluster, 3)


def test_a_dead_worker_data_nic_is_that_workers_alone(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    (tmp_path / "worker.py").write_text("")
    sim_cluster.drop_nic("node2", "data")
    done = run_clusterrun("up", "--master-port", str(PORT), str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode == 125, done.stderr
    worker = sim_cluster.nodes[2]
    assert f"  node2: cannot reach node0's master address {sim_cluster.nodes[0].data_ip}:{PORT} from " \
           f"{worker.data_nic} ({worker.data_ip})" in done.stderr, done.stderr
    assert "this NIC or the path to the master is down (the other workers reach node0" in done.stderr
    assert "1 problem(s)" in done.stderr and "  node0:" not in done.stderr and "  node1:" not in done.stderr
    assert json.loads((the_run(tmp_path) / "preflight.json").read_text())["suspect"] == "node2"
    assert not wait_no_agents(sim_cluster, 3)


def test_a_python_the_node_lacks_is_named_with_the_fix(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1, python="/opt/nowhere/bin/python3")
    (tmp_path / "worker.py").write_text("")
    done = run_clusterrun("up", str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode != 0
    for node in ("node0", "node1"):
        assert f"{node}: python '/opt/nowhere/bin/python3' not found on the node" in done.stderr, done.stderr
    assert "--python" in done.stderr


def test_agents_end_when_clusterrun_is_killed_before_the_job(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """SIGKILL of clusterrun while the agents wait (here: for a path check that cannot finish, because the
    master port is firewalled and each connect waits out its timeout): the connections close, the agents end."""
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    (tmp_path / "worker.py").write_text("")
    sim_cluster.block_port("node0", PORT)
    proc = subprocess.Popen([sys.executable, "-m", "clusterrun", "up", "--master-port", str(PORT), str(inv),
                             "worker.py"], cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=clusterrun_env())
    try:
        deadline = time.monotonic() + scaled(30)
        while len(agents_left(sim_cluster, 3)) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert len(agents_left(sim_cluster, 3)) == 3, "the agents never started"
        proc.kill()
        proc.wait(timeout=scaled(10))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=scaled(10))
    assert not wait_no_agents(sim_cluster, 3), "agents outlived the clusterrun that started them"


def test_preflight_full_runs_doctor_while_the_agents_wait(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """`--preflight full`: doctor's network checks run between the agents' ready check and the job, and the job
    then starts on the agents that waited."""
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "worker.py").write_text("print('hello from', __import__('os').environ['RANK'])\n")
    done = run_clusterrun("up", "--preflight", "full", "--master-port", str(PORT), str(inv), "worker.py",
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "running doctor's network checks (--preflight full)" in done.stderr
    assert "hello from 0" in done.stdout and "hello from 1" in done.stdout
    pre = json.loads((the_run(tmp_path) / "preflight.json").read_text())
    assert pre["mode"] == "full" and pre["doctor"]["failures"] == [] and pre["passed"] is True
    # Both pages: doctor's round in the run's doctor/, and the run's, which points to it.
    assert (the_run(tmp_path) / "doctor" / "report.html").is_file()
    assert 'href="doctor/report.html"' in (the_run(tmp_path) / "report.html").read_text()
    assert not wait_no_agents(sim_cluster, 2)
