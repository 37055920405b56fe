"""Jobs inside an image on the simulated nodes, with real podman: the ranks run in the image with the same env contract
and data NIC as without it, a secret reaches them in no argv, no container of a run is left however the run ends,
and a missing or differing image is refused before anything starts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from containerbed import MARKER, PodmanBed, container_inventory, give_cgroups, podman_missing
from simcluster import SimCluster
from simjobs import (
    assert_nothing_left,
    clusterrun_env,
    nic_bytes,
    reports,
    run_clusterrun,
    start_clusterrun,
    status,
    the_run,
    wait_for_lines,
    wait_until,
)

pytestmark = pytest.mark.cluster

#: Reports what it sees (the image's marker, the env contract, a forwarded secret's length), all-reduces enough
#: bytes that the NIC which carried them shows it, then waits for ``RELEASE`` (bounded) so the test can look at
#: every process of the run while the ranks live. ``FAIL_RANK``: that rank exits 7 instead.
WORKER = """
import json, os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
    print("rank gives up", flush=True)
    sys.exit(7)
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
big = torch.ones(4 * 1024 * 1024)
for _ in range(2):
    dist.all_reduce(big)
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "GLOO_SOCKET_IFNAME", "CLUSTERRUN_RUN_ID")
marker = open("MARKER").read() if os.path.exists("MARKER") else None
print("REPORT " + json.dumps({**{k: os.environ.get(k) for k in keys}, "sum": total.item(), "marker": marker,
                              "secret": len(os.environ.get("CR_TEST_SECRET", "")),
                              "host": os.uname().nodename}), flush=True)
release = os.environ.get("RELEASE")
deadline = time.monotonic() + 60
while release and not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.05)
dist.destroy_process_group()
""".replace("MARKER", MARKER)

SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n"


@pytest.fixture(scope="module")
def podman_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodmanBed]:
    why = podman_missing()
    if why:
        if "CI" in os.environ:
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    bed = PodmanBed(tmp_path_factory.mktemp("podman"))
    bed.import_image(bed.image)
    try:
        yield bed
    finally:
        bed.remove_all()


@pytest.fixture
def bed(podman_bed: PodmanBed, sim_cluster: SimCluster) -> PodmanBed:
    give_cgroups(sim_cluster)  # a restarted sshd has a fresh mount namespace
    return podman_bed


def assert_no_container(bed: PodmanBed, run_id: str, timeout: float) -> None:
    wait_until(lambda: not bed.containers(run_id), timeout, f"no container of run {run_id} left",
               step=0.2)


def test_ranks_train_inside_the_image_and_a_secret_is_in_no_argv(sim_cluster: SimCluster, bed: PodmanBed,
                                                                 tmp_path: Path) -> None:
    inv = container_inventory(sim_cluster, tmp_path / "cluster.yaml", bed)
    (tmp_path / "train.py").write_text(WORKER)
    secret = "s3cret-" + os.urandom(6).hex()
    release = tmp_path / "release"
    env = {**clusterrun_env(), "CR_TEST_SECRET": secret}
    before = nic_bytes(sim_cluster, "node1", sim_cluster.nodes[1].data_nic)
    proc = subprocess.Popen([sys.executable, "-m", "clusterrun", "up", "--env-forward", "CR_TEST_SECRET",
                             "-e", f"RELEASE={release}", str(inv), "train.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        wait_for_lines(proc, 4, "REPORT", timeout=120)
        run = the_run(tmp_path)
        # While every rank runs: their containers exist, and no process on any node has the secret in its argv.
        assert len(bed.containers(run.name)) == 2
        argvs = [p.read_bytes() for p in Path("/proc").glob("[0-9]*/cmdline") if _readable(p)]
        assert not [a for a in argvs if secret.encode() in a]
        release.write_text("go")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    st = status(run)
    assert st["state"] == "succeeded"
    # The reports went out before wait_for_lines stopped reading: read them from the node logs instead.
    lines = "".join(p.read_text() for p in run.rglob("*.log") if p.is_file())
    found = reports(lines) or reports(out)
    assert len({r["RANK"] for r in found}) == 4, lines[-2000:]
    assert all(r["marker"] == "image" for r in found)  # inside the image
    assert all(r["secret"] == len(secret) for r in found)  # the forwarded secret reached every rank
    assert {r["GLOO_SOCKET_IFNAME"] for r in found} == {sim_cluster.nodes[0].data_nic}
    assert {r["MASTER_ADDR"] for r in found} == {sim_cluster.nodes[0].data_ip}
    assert all(r["sum"] == 10.0 and r["CLUSTERRUN_RUN_ID"] == run.name for r in found)
    assert {r["host"] for r in found} == {"node0", "node1"}
    # The all-reduces went over the data NIC, as without a container.
    assert nic_bytes(sim_cluster, "node1", sim_cluster.nodes[1].data_nic) - before > 16 * 1024 * 1024
    assert_no_container(bed, run.name, timeout=10)
    assert_nothing_left(sim_cluster, run.name)


def _readable(path: Path) -> bool:
    try:
        path.stat()
        return True
    except OSError:
        return False


def test_a_failing_rank_keeps_its_exit_code_and_restarts_leave_no_container(sim_cluster: SimCluster,
                                                                           bed: PodmanBed, tmp_path: Path) -> None:
    """Rank 3 fails in both attempts: before the restart the first attempt's containers are removed (the sweep
    by label), and the run ends with rank 3's exit code and no container anywhere."""
    inv = container_inventory(sim_cluster, tmp_path / "cluster.yaml", bed)
    (tmp_path / "train.py").write_text(WORKER)
    done = run_clusterrun("up", "--max-restarts", "1", "--restart-backoff", "0", "-e", "FAIL_RANK=3", str(inv),
                          "train.py", cwd=tmp_path)
    assert done.returncode == 7, done.stderr[-3000:]  # the failing rank's code is the run's, as without an image
    assert "node1 rank 3: exit code 7" in done.stderr, done.stderr[-3000:]
    run = the_run(tmp_path)
    assert len(status(run)["attempts"]) == 2
    assert_no_container(bed, run.name, timeout=5)
    assert_nothing_left(sim_cluster, run.name, timeout=5)


@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_interrupting_clusterrun_leaves_no_container(sim_cluster: SimCluster, bed: PodmanBed, tmp_path: Path,
                                                     how: str) -> None:
    """With Ctrl-C, the ranks first go silent long enough for a hang: the agent on the host takes the stacks of
    the ranks in their containers (the hook writes them in the mounted run directory)."""
    inv = container_inventory(sim_cluster, tmp_path / "cluster.yaml", bed, nproc=1)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    hang = ("--hang-timeout", "3") if how == "SIGINT" else ()
    proc = start_clusterrun("up", *hang, str(inv), "sleeper.py", cwd=tmp_path)
    try:
        wait_for_lines(proc, 2, "sleeping", timeout=120)
        run = the_run(tmp_path)
        assert len(bed.containers(run.name)) == 2
        if hang:
            stacks = [run / f"node{rank}" / f"stack-rank{rank}.txt" for rank in (0, 1)]
            wait_until(lambda: all(p.exists() and "sleeper.py" in p.read_text() for p in stacks), 60,
                       "both ranks' stacks taken in their containers")
        started = time.monotonic()
        proc.send_signal(getattr(signal, how))
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Ctrl-C: clusterrun stops the job; SIGKILL: each node's agent sees its stream end (its watchdog).
    assert_no_container(bed, run.name, timeout=(5 if how == "SIGINT" else 10) + 5)
    assert_nothing_left(sim_cluster, run.name, timeout=5 if how == "SIGINT" else 10)
    assert time.monotonic() - started < 30


def test_a_partitioned_node_and_down_leave_no_container(sim_cluster: SimCluster, bed: PodmanBed,
                                                        tmp_path: Path) -> None:
    """node1 falls off the network: its agent's watchdog removes its container; a detached run's containers go
    with `down RUN`."""
    inv = container_inventory(sim_cluster, tmp_path / "cluster.yaml", bed, nproc=1)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    proc = start_clusterrun("up", str(inv), "sleeper.py", cwd=tmp_path)
    try:
        wait_for_lines(proc, 2, "sleeping", timeout=120)
        run = the_run(tmp_path)
        sim_cluster.partition("node1")
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sim_cluster.heal("node1")
    assert proc.returncode not in (0, None)
    assert_no_container(bed, run.name, timeout=30)
    assert_nothing_left(sim_cluster, run.name, timeout=20)

    runs = tmp_path / "detached"
    done = run_clusterrun("up", "--detach", "--runs-dir", str(runs), str(inv), "sleeper.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (detached,) = [p for p in runs.iterdir() if p.is_dir()]
    wait_until(lambda: len(bed.containers(detached.name)) == 2, 60, "both containers of the detached run")
    down = run_clusterrun("down", "--runs-dir", str(runs), detached.name, cwd=tmp_path)
    assert down.returncode == 0, down.stderr[-3000:]
    assert_no_container(bed, detached.name, timeout=5)
    assert_nothing_left(sim_cluster, detached.name, timeout=5)


def test_a_missing_image_and_differing_images_are_refused_before_start(sim_cluster: SimCluster, bed: PodmanBed,
                                                                       tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(WORKER)
    inv = container_inventory(sim_cluster, tmp_path / "missing.yaml", bed, image="localhost/no-such-image:1")
    started = time.monotonic()
    done = run_clusterrun("up", str(inv), "train.py", cwd=tmp_path)
    assert done.returncode != 0
    assert time.monotonic() - started < 60
    assert "localhost/no-such-image:1" in done.stderr and "node0" in done.stderr, done.stderr[-3000:]
    assert "no node was started" in done.stderr
    assert not bed.containers(the_run(tmp_path).name)

    # node1 keeps its images in a store of its own, where the same tag names another image.
    own = Path(tempfile.mkdtemp(prefix="crs-", dir="/tmp"))
    store, conf = bed.private_store(own)
    bed.import_image(bed.image, marker_text="other build", store=store)
    other = container_inventory(sim_cluster, tmp_path / "differ.yaml", bed,
                                node_env={"node1": f"{{CONTAINERS_STORAGE_CONF: {conf}}}"})
    done = run_clusterrun("up", "--runs-dir", str(tmp_path / "differ"), str(other), "train.py", cwd=tmp_path)
    assert done.returncode != 0
    assert "node1" in done.stderr and "node0" in done.stderr and "the image" in done.stderr, done.stderr[-3000:]
    assert "pull the same image on every node" in done.stderr
    assert not any("REPORT" in line for line in done.stdout.splitlines())
    bed.podman("rmi", "-f", bed.image, store=store)
    shutil.rmtree(own, ignore_errors=True)


def test_doctor_checks_the_nodes_inside_the_image(sim_cluster: SimCluster, bed: PodmanBed, tmp_path: Path) -> None:
    """doctor probes each node in the image (its python and torch as the ranks see them), and its all-reduce goes
    through `up`'s launch path, in the image too; no container of either is left."""
    inv = container_inventory(sim_cluster, tmp_path / "cluster.yaml", bed, nproc=1)
    done = run_clusterrun("doctor", "--json", "--checks", "node.os,node.python,cluster.allreduce", str(inv),
                          cwd=tmp_path)
    report = json.loads(done.stdout)
    verdicts = {check["name"]: check["verdict"] for check in report["checks"]}
    assert verdicts["node.python"] == "pass" and verdicts["cluster.allreduce"] == "pass", done.stdout[-4000:]
    # The probe ran in the image: the skeleton has no /etc/os-release, the host (Debian) has one.
    for node in ("node0", "node1"):
        os_release = Path(report["directory"], "evidence", node, "os_release.txt").read_text()
        assert "No such file" in os_release and "Debian" not in os_release, os_release
    left = bed.podman("ps", "-a", "--format", "{{.Labels}}").stdout.decode()
    assert "doctor-" not in left
