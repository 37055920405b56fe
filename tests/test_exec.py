"""`clusterrun exec` on the simulated cluster: output per node, folding, failures, an unreachable node, and
nothing left behind after Ctrl-C or a time limit."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import clusterrun_env, run_clusterrun, wait_for_lines, write_inventory

pytestmark = pytest.mark.cluster


def test_exec_prefixes_each_nodes_output_and_folds(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4)
    done = run_clusterrun("exec", str(inv), "--", "hostname", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"[node{i}] node{i}" for i in range(4)]
    assert "4 of 4 node(s) succeeded" in done.stderr
    folded = run_clusterrun("exec", str(inv), "--fold", "--", "echo same; echo also >&2", cwd=tmp_path)
    assert folded.stdout.splitlines()[0] == "---------------- node0,node1,node2,node3 (4)"
    assert folded.stdout.splitlines()[1:] == ["same", "also"]  # stdout first, then stderr


def test_exec_failure_and_unreachable_node_are_named(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4)
    sim_cluster.stop_sshd("node3")
    done = run_clusterrun("exec", str(inv), "--", 'test "$(hostname)" != node2', cwd=tmp_path)
    assert done.returncode == 1
    summary = dict(line.split(":", 1) for line in done.stderr.splitlines() if line.startswith("node"))
    assert summary["node0"].strip() == "ok" and summary["node1"].strip() == "ok"
    assert summary["node2"].strip() == "exit 1"
    assert summary["node3"].strip().startswith("no result:") and "refused" in summary["node3"]


@pytest.mark.parametrize("how", ["ctrl-c", "timeout"])
def test_exec_leaves_nothing_running(sim_cluster: SimCluster, tmp_path: Path, how: str) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2)
    marker = "299.4321"  # a sleep nobody else runs
    args = [sys.executable, "-m", "clusterrun", "exec", str(inv)]
    if how == "timeout":
        args += ["--timeout", "2"]
    proc = subprocess.Popen([*args, "--", f"echo started; sleep {marker}"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clusterrun_env(), stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for_lines(proc, 2, "started", timeout=60)
        assert set(sim_cluster.job_processes(marker)) == {"node0", "node1"}
        if how == "ctrl-c":
            proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == (130 if how == "ctrl-c" else 1), err
    if how == "timeout":
        assert "exit 143 (timed out after 2s)" in err
    assert sim_cluster.wait_no_processes(marker, 5) == {}
