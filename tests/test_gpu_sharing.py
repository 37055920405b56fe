"""Two runs on the same simulated node: GPU leases, the master port chosen free, `clusterrun ps`, `--wait-gpus`,
and leases freed by the kernel when a run's processes are SIGKILLed.

The node has a stand-in nvidia-smi reporting four GPUs (kept minimal here: index and name, as the ready check
asks), put first on the PATH by the node's python, which also gives the node a lease directory of this test's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import marked_processes
from simcluster import SimCluster
from simjobs import agent_of, assert_nothing_left, run_clusterrun, start_clusterrun, wait_until, write_inventory

pytestmark = pytest.mark.cluster

WORKER = """
import json, os, sys, time
path = os.path.join(os.environ["OUT_DIR"], "%s-%s.json" % (os.environ["CLUSTERRUN_RUN_ID"], os.environ["RANK"]))
with open(path + ".tmp", "w") as f:
    json.dump({k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "MASTER_PORT")}, f)
os.replace(path + ".tmp", path)
time.sleep(float(sys.argv[1]))
"""


def node_python(tmp_path: Path, gpus: int) -> Path:
    """The node's python: a stand-in nvidia-smi with ``gpus`` GPUs first on the PATH, leases under tmp_path."""
    tools = tmp_path / "tools"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nfor i in $(seq 0 {gpus - 1}); do echo "$i, Stand-in GPU"; done\n')
    smi.chmod(0o755)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPATH={tools}:$PATH CLUSTERRUN_LEASES={tmp_path / 'leases'} "
                      f"exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


def detach(inv: Path, cwd: Path, *args: str) -> str:
    done = run_clusterrun("up", "--detach", "-e", f"OUT_DIR={cwd}", str(inv), "worker.py", *args, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def ranks_of(cwd: Path, run_id: str, count: int) -> list[dict]:
    paths = [cwd / f"{run_id}-{rank}.json" for rank in range(count)]
    wait_until(lambda: all(p.exists() for p in paths), 90, f"the {count} ranks of {run_id} started")
    return [json.loads(p.read_text()) for p in paths]


def ps(inv: Path, cwd: Path) -> dict[str, dict]:
    done = run_clusterrun("ps", "--json", str(inv), cwd=cwd)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["unreachable"] == {}
    return {r["run"]: r for r in found["runs"]}


def wait_for_stderr(proc: subprocess.Popen[str], needle: str, timeout: float = 90.0) -> str:
    """Read ``proc``'s stderr until a line holds ``needle``; what was read so far."""
    assert proc.stderr is not None
    fd, seen = proc.stderr.fileno(), b""
    deadline = time.monotonic() + timeout
    while needle.encode() not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 1 << 16) if ready else b""
        if not chunk:
            break
        seen += chunk
    assert needle.encode() in seen, seen.decode(errors="replace")
    return seen.decode(errors="replace")


def test_a_second_run_gets_other_gpus_its_own_port_and_the_first_ones_leases_free_after_sigkill(
        sim_cluster: SimCluster, tmp_path: Path) -> None:
    python = node_python(tmp_path, gpus=4)
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 1, nproc=2, python=str(python))
    listed = tmp_path / "listed.yaml"
    listed.write_text(inv.read_text().replace("  nproc_per_node: 2\n", "").replace(
        "    host: node0\n", "    host: node0\n    gpus: [1]\n"))
    (tmp_path / "worker.py").write_text(WORKER)

    first = detach(inv, tmp_path, "300")
    a = ranks_of(tmp_path, first, 2)
    second = detach(inv, tmp_path, "300")
    b = ranks_of(tmp_path, second, 2)
    try:
        assert {r["CUDA_VISIBLE_DEVICES"] for r in a} == {"0,1"}
        assert {r["CUDA_VISIBLE_DEVICES"] for r in b} == {"2,3"}  # never a GPU the first run holds
        assert a[0]["MASTER_PORT"] == "29500" and b[0]["MASTER_PORT"] == "29501"  # both started

        running = ps(inv, tmp_path)
        assert {(r["node"], tuple(r["gpus"]), tuple(r["ports"])) for run, r in running.items() if run in
                (first, second)} == {("node0", (0, 1), (29500,)), ("node0", (2, 3), (29501,))}
        assert running[first]["user"] == "root" and running[first]["processes"] >= 3  # torchrun and 2 workers

        # A listed GPU that the first run holds: refused before anything starts, naming who holds it.
        refused = run_clusterrun("up", "-e", f"OUT_DIR={tmp_path}", str(listed), "worker.py", "0", cwd=tmp_path)
        assert refused.returncode == 125
        assert f"node0: GPU 1 is leased by run {first} of root since " in refused.stderr
        assert "--wait-gpus" in refused.stderr

        # Queued instead: it starts once the first run's processes are SIGKILLed (agent included: the kernel
        # releases the leases its agent held).
        waiting = start_clusterrun("up", "--wait-gpus", "120", "-e", f"OUT_DIR={tmp_path}", str(listed),
                                   "worker.py", "0", cwd=tmp_path)
        try:
            said = wait_for_stderr(waiting, "waiting for GPUs")
            assert f"GPU 1 is leased by run {first} of root" in said
            victims = [agent_of(first, "node0"), *(pid for pid, _ in marked_processes(first))]
            for pid in victims:  # killing the agent first may end its torchrun and workers before their turn
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _, err = waiting.communicate(timeout=120)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait()
        assert waiting.returncode == 0, err
        queued = next(p for p in tmp_path.glob("*-0.json") if p.name.split("-0.json")[0] not in (first, second))
        assert json.loads(queued.read_text())["CUDA_VISIBLE_DEVICES"] == "1"
        assert first not in ps(inv, tmp_path)  # its leases are free: nothing of it is shown
    finally:
        run_clusterrun("down", second, cwd=tmp_path)
    assert_nothing_left(sim_cluster, first)
    assert_nothing_left(sim_cluster, second)
    assert second not in ps(inv, tmp_path)
