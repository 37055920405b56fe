"""`clusterrun up` over SSH on the simulated cluster: real sshd, real torchrun, gloo on the CPU."""

from __future__ import annotations

import base64
import binascii
import json
import os
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from procs import marked_processes
from simcluster import SimCluster
from simjobs import run_clusterrun, start_clusterrun, status, the_run, write_inventory

pytestmark = pytest.mark.cluster

WORKER = """
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
big = torch.ones(4 * 1024 * 1024)
for _ in range(8):  # enough bytes that the NIC that carried them shows it
    dist.all_reduce(big)
print("REPORT " + json.dumps({**{k: os.environ.get(k) for k in keys}, "sum": total.item(),
                              "big": big[0].item(), "host": os.uname().nodename}), flush=True)
dist.destroy_process_group()
"""

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


def nic_bytes(cluster: SimCluster, node: str, nic: str) -> int:
    out = cluster.ns_run(node, ["cat", f"/sys/class/net/{nic}/statistics/tx_bytes"]).stdout
    return int(out.strip())


def reports(stdout: str) -> list[dict]:
    return [json.loads(line.split("REPORT ", 1)[1]) for line in stdout.splitlines() if "REPORT " in line]


def assert_nothing_left(cluster: SimCluster, run_id: str, timeout: float = 10.0) -> None:
    left = cluster.wait_no_processes(run_id, timeout)
    assert not left, f"processes of run {run_id} left behind: {left}"


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


def _wait_for_lines(proc, count: int, needle: str, timeout: float = 90.0) -> None:
    """Read ``proc``'s stdout until ``count`` lines hold ``needle``; the deadline holds even when nothing comes.

    Reads the pipe itself (not through the text wrapper, whose buffer select cannot see); what it read is
    not seen by a later ``communicate()``.
    """
    seen, buf = 0, b""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    while seen < count and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        *lines, buf = (buf + chunk).split(b"\n")
        seen += sum(needle.encode() in line for line in lines)
    assert seen == count, f"saw {seen} of {count} '{needle}' lines"


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_interrupting_the_orchestrator_leaves_nothing(sim_cluster: SimCluster, tmp_path: Path, how: str) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    proc = start_clusterrun("up", str(inv), "sleeper.py", cwd=tmp_path)
    try:
        _wait_for_lines(proc, 4, "sleeping")
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
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3)
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


def _agent_of(run_id: str, node: str) -> int:
    """The node agent of ``node``: the parent of that node's torchrun (the agent itself carries no marker)."""
    for pid, cmd in marked_processes(run_id):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"CLUSTERRUN_NODE={node}".encode() in environ and "torch.distributed.run" in cmd:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
            assert argv[1] == b"-c" and b"'agent'" in argv[2] and argv[3] == b"prepare", argv[3:]
            return ppid
    raise AssertionError(f"no torchrun of {node} in run {run_id}")


def _fault_mid_run(cwd: Path, script: str, needle: str, fault: Callable[[Path], object]) -> tuple[Path, int, str]:
    """Start `up` on cluster.yaml, wait until both ranks printed ``needle``, apply ``fault`` to the run directory,
    and let clusterrun finish (killed after 90 s). Returns the run directory, clusterrun's exit code and stderr."""
    proc = start_clusterrun("up", str(cwd / "cluster.yaml"), script, cwd=cwd)
    try:
        _wait_for_lines(proc, 2, needle)
        run = the_run(cwd)
        fault(run)
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return run, proc.returncode, err


def test_broken_stream_logs_are_fetched_from_the_node(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """The agent on node1 dies: its stream breaks, but what its rank wrote afterwards still reaches runs/."""
    write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "job.py").write_text(CLEANUP_ON_TERM)
    run, rc, err = _fault_mid_run(tmp_path, "job.py", "ready",
                                  lambda run: os.kill(_agent_of(run.name, "node1"), signal.SIGKILL))
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
    run, rc, err = _fault_mid_run(tmp_path, "sleep.py", "sleeping", lambda _run: sim_cluster.partition("node1"))
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
        _wait_for_lines(proc, 2, "sleeping True")  # the ranks have it
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
