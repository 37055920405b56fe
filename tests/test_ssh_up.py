"""`clusterrun up` over SSH on the simulated cluster: real sshd, real torchrun, gloo on the CPU."""

from __future__ import annotations

import base64
import binascii
import os
import signal
import time
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import (
    WORKER,
    agent_of,
    assert_nothing_left,
    fault_mid_run,
    nic_bytes,
    reports,
    run_clusterrun,
    start_clusterrun,
    status,
    the_run,
    wait_for_lines,
    write_inventory,
)

from clusterrun.runs.record import RunRecord
from clusterrun.runs.timeline import PHASES, ordered

pytestmark = pytest.mark.cluster

FAIL_ON_RANK_2 = """
import os, sys, time
rank = int(os.environ["RANK"])
print("up", rank, flush=True)
if rank == 2:
    time.sleep(2)
    print("rank 2 gives up", flush=True)
    sys.exit(1)
time.sleep(120)
"""

SLEEPER = """
import os, time
print("sleeping", os.environ["RANK"], flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("nodes", [2, 4])
def test_env_allreduce_and_data_nic(sim_cluster: SimCluster, tmp_path: Path, nodes: int) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", nodes)
    (tmp_path / "worker.py").write_text(WORKER)
    names = [n.name for n in sim_cluster.nodes[:nodes]]
    before = {(n, nic): nic_bytes(sim_cluster, n, nic) for n in names for nic in ("eth0", "eth1")}
    done = run_clusterrun("up", str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    world = 2 * nodes
    got = sorted(reports(done.stdout), key=lambda r: int(r["RANK"]))
    assert [int(r["RANK"]) for r in got] == list(range(world))
    master = sim_cluster.nodes[0].data_ip
    for r in got:
        rank = int(r["RANK"])
        assert r["host"] == names[rank // 2]
        assert int(r["LOCAL_RANK"]) == rank % 2 and int(r["GROUP_RANK"]) == rank // 2
        assert int(r["WORLD_SIZE"]) == world and int(r["LOCAL_WORLD_SIZE"]) == 2
        assert r["MASTER_ADDR"] == master and r["MASTER_PORT"] == "29500"
        assert r["GLOO_SOCKET_IFNAME"] == "eth1" and r["NCCL_SOCKET_IFNAME"] == "=eth1"
        assert r["sum"] == world * (world + 1) / 2 and r["big"] == world**8  # 8 in-place sums
    for name in names:  # the all-reduce went over the data NIC (eth1), not the management one
        data = nic_bytes(sim_cluster, name, "eth1") - before[(name, "eth1")]
        mgmt = nic_bytes(sim_cluster, name, "eth0") - before[(name, "eth0")]
        assert data > 16 * 2**20, f"{name}: only {data} bytes on the data NIC"
        assert mgmt < data / 4, f"{name}: {mgmt} bytes on the management NIC vs {data} on the data NIC"
    run = the_run(tmp_path)
    st = status(run)
    assert st["state"] == "succeeded"
    for name in names:
        assert "REPORT" in "".join(p.read_text() for p in (run / name).glob("rank*.log"))
    assert_nothing_left(sim_cluster, run.name)
    if nodes == 4:  # the same run's launch timeline: every phase of every node, in order
        assert_timeline_complete(st, names, tmp_path)


def assert_timeline_complete(st: dict, names: list[str], cwd: Path) -> None:
    record = RunRecord.from_dict(st)
    for name in names:
        timeline = record.nodes[name].timeline
        assert list(timeline) == list(PHASES), f"{name}: {list(timeline)}"
        assert all(s.start is not None and s.end is not None for s in timeline.values()), f"{name}: {timeline}"
        assert not ordered(timeline), f"{name}: {ordered(timeline)}"
    shown = run_clusterrun("status", cwd=cwd)
    assert shown.returncode == 0, shown.stderr
    table = shown.stdout.split("launch timeline", 1)[1].splitlines()
    assert all(p.replace("_", " ") in table[1] for p in PHASES), shown.stdout
    rows = [line.split() for line in table[2:] if line.split() and line.split()[0] in names]
    assert sorted(r[0] for r in rows) == sorted(names) and all("-" not in r for r in rows), shown.stdout


def test_second_up_copies_nothing(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "hello.py").write_text(f"print('hello {time.time()}', flush=True)\n")  # new content: new hash
    first = run_clusterrun("up", str(inv), "hello.py", cwd=tmp_path)
    second = run_clusterrun("up", str(inv), "hello.py", cwd=tmp_path)
    assert first.returncode == 0 and second.returncode == 0, second.stderr
    assert "copied 2 file(s)" in first.stderr or "copied 1 file(s)" in first.stderr
    assert "copied" not in second.stderr


def test_failing_worker_stops_every_node(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2)
    (tmp_path / "fail.py").write_text(FAIL_ON_RANK_2)
    started = time.monotonic()
    done = run_clusterrun("up", str(inv), "fail.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 60  # the others sleep 120 s: they were stopped
    assert "first failure: node1 rank 2: exit code 1" in done.stderr
    assert "rank 2 gives up" in done.stderr.split("first failure:")[1]
    run = the_run(tmp_path)
    st = status(run)
    assert st["first_failure"]["node"] == "node1" and st["first_failure"]["rank"] == 2
    assert st["nodes"]["node0"]["ranks"]["0"]["state"] == "stopped"
    assert_nothing_left(sim_cluster, run.name, timeout=5)


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_interrupting_the_orchestrator_leaves_nothing(sim_cluster: SimCluster, tmp_path: Path, how: str) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    proc = start_clusterrun("up", str(inv), "sleeper.py", cwd=tmp_path)
    try:
        wait_for_lines(proc, 4, "sleeping")
        run = the_run(tmp_path)
        assert set(sim_cluster.job_processes(run.name)) == {"node0", "node1"}
        proc.send_signal(getattr(signal, how))
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if how != "SIGKILL":
        assert proc.returncode == 128 + getattr(signal, how)
        assert status(run)["state"] == "interrupted"
    assert_nothing_left(sim_cluster, run.name, timeout=5 if how != "SIGKILL" else 10)


@pytest.mark.parametrize("fault", ["sshd-down", "blackholed", "wrong-python"])
def test_unreachable_node_starts_nothing_anywhere(sim_cluster: SimCluster, tmp_path: Path, fault: str) -> None:
    # node2 gets a tight connect bound (the one a blackholed node waits out); the healthy nodes the usual one.
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, node_connect_timeout={"node2": 3.0})
    if fault == "wrong-python":
        text = inv.read_text().replace("  - name: node2\n", "  - name: node2\n    python: /nonexistent/bin/python\n")
        inv.write_text(text)
    elif fault == "sshd-down":
        sim_cluster.stop_sshd("node2")
    else:
        sim_cluster.partition("node2")
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    started = time.monotonic()
    done = run_clusterrun("up", str(inv), "sleeper.py", cwd=tmp_path)
    took = time.monotonic() - started
    assert done.returncode == 125, done.stderr
    assert took < 30, f"took {took:.0f}s with a 3 s connect timeout"
    expected = {
        "sshd-down": "node2: connection refused",
        "blackholed": "node2: root@",
        "wrong-python": "node2: python '/nonexistent/bin/python' not found",
    }[fault]
    assert expected in done.stderr, done.stderr
    if fault == "blackholed":
        assert "did not answer within 3s" in done.stderr
    assert "nothing was started" in done.stderr
    assert "node0:" not in done.stderr and "node1:" not in done.stderr  # only the bad node is blamed
    run = the_run(tmp_path)
    assert status(run)["state"] == "not-started"
    assert not sim_cluster.job_processes(run.name)


def test_sync_dir_brings_sibling_modules_and_is_cached(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    code = tmp_path / "project"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "__init__.py").write_text("")
    (code / "pkg" / "helper.py").write_text(f"TOKEN = 'synced-{time.time_ns()}'\n")
    (code / "train.py").write_text("import os\nfrom pkg.helper import TOKEN\nprint(TOKEN, os.getcwd(), flush=True)\n")
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    first = run_clusterrun("up", str(inv), "--sync", str(code), str(code / "train.py"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    token = (code / "pkg" / "helper.py").read_text().split("'")[1]
    assert first.stdout.count(token) == 2
    assert "copied 2 file(s)" in first.stderr or "copied 1 file(s)" in first.stderr  # one archive, shared home
    run = the_run(tmp_path)
    node_code = Path.home() / ".clusterrun" / "runs" / run.name / "node1" / "code"
    assert (node_code / "pkg" / "helper.py").is_file() and not (node_code / "__pycache__").exists()
    second = run_clusterrun("up", "--runs-dir", "runs2", str(inv), "--sync", str(code), str(code / "train.py"),
                            cwd=tmp_path)
    assert second.returncode == 0 and "copied" not in second.stderr, second.stderr


CLEANUP_ON_TERM = """
import os, signal, sys, time
def bye(*_):
    print("rank", os.environ["RANK"], "cleaning up after SIGTERM", flush=True)
    time.sleep(0.3)
    sys.exit(3)
signal.signal(signal.SIGTERM, bye)
print("ready", os.environ["RANK"], flush=True)
time.sleep(120)
"""


def test_broken_stream_logs_are_fetched_from_the_node(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """The agent on node1 dies: its stream breaks, but what its rank wrote afterwards still reaches runs/."""
    write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "job.py").write_text(CLEANUP_ON_TERM)
    run, rc, err = fault_mid_run(tmp_path, "job.py", "ready",
                                  lambda run: os.kill(agent_of(run.name, "node1"), signal.SIGKILL))
    assert rc not in (0, None), err
    assert "fetching the logs runs/ lacks from node1 and checking for leftovers on node1" in err
    log = (run / "node1" / "rank1.log").read_text()
    # Written after the agent died (torchrun got SIGTERM and passed it on): only the node's log file had it.
    assert "rank 1 cleaning up after SIGTERM" in log
    assert log.count("ready 1") == 1  # lines the stream delivered are not fetched twice
    notes = " ".join(status(run)["notes"])
    assert "node1: its stream broke; fetched" in notes, notes
    assert_nothing_left(sim_cluster, run.name, timeout=5)


def test_partitioned_node_is_reported_and_its_watchdog_stops_the_job(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """node1 falls off the network mid-run: the run fails naming it, and node1's own agent stops the job there."""
    write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "sleep.py").write_text(SLEEPER)
    run, rc, err = fault_mid_run(tmp_path, "sleep.py", "sleeping", lambda _run: sim_cluster.partition("node1"))
    assert rc not in (0, None), err
    assert "node1" in err.split("first failure:")[1].splitlines()[0]
    notes = " ".join(status(run)["notes"])
    assert "node1: could not reach the node after its stream broke" in notes, notes
    assert "torchrun/" in notes  # where the logs stayed
    # Nothing of the run is left on node1 (its watchdog) nor on node0 (stopped by clusterrun): check, even
    # before healing, from the root namespace (no PID namespaces here).
    assert_nothing_left(sim_cluster, run.name, timeout=20)
    sim_cluster.heal("node1")


SECRET = "hf_s3cret-token-Zq81"


def _holds_secret(cmd: str) -> bool:
    """The secret in a command line, as it is or inside a base64 word (a spec travels base64-encoded)."""
    if SECRET in cmd:
        return True
    for word in cmd.replace("'", " ").replace('"', " ").replace("(", " ").replace(")", " ").split():
        if len(word) < 16:
            continue
        try:
            if SECRET.encode() in base64.b64decode(word + "=" * (-len(word) % 4), validate=False):
                return True
        except (binascii.Error, ValueError):
            continue
    return False


def test_environment_secrets_never_show_in_any_command_line(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """`-e HF_TOKEN=...` reaches the ranks, but no process on any node shows it in its command line (ps)."""
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "sleeper.py").write_text(
        f"import os, time\nprint('sleeping', os.environ['HF_TOKEN'] == {SECRET!r}, flush=True)\ntime.sleep(120)\n")
    proc = start_clusterrun("up", "-e", f"HF_TOKEN={SECRET}", str(inv), "sleeper.py", cwd=tmp_path)
    try:
        wait_for_lines(proc, 2, "sleeping True")  # the ranks have it
        run = the_run(tmp_path)
        shown = [(node.name, pid, cmd[:120]) for node in sim_cluster.nodes[:2]
                 for pid, cmd in sim_cluster.processes(node) if _holds_secret(cmd)]
        assert not shown, f"the secret shows in command lines: {shown}"
        for node in sim_cluster.nodes[:2]:  # the node's run directory (the ranks' logs) is the user's only
            node_dir = Path.home() / ".clusterrun" / "runs" / run.name / node.name
            assert node_dir.stat().st_mode & 0o777 == 0o700
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_nothing_left(sim_cluster, run.name)
