"""`clusterrun` inside a Slurm allocation: the nodes are reached with srun job steps, not SSH.

The cluster tests run on the Slurm test bed (tests/slurmbed.py: real slurmctld, slurmd and munged on simulated
nodes) with every node's sshd stopped, so anything that still tried SSH would fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from simjobs import clusterrun_env, status, the_run, wait_for_lines
from slurmbed import SlurmBed

from clusterrun.errors import CommandTimeout, ConnectError, UsageError
from clusterrun.inventory.models import Transport
from clusterrun.inventory.sources import HostSource, load_cluster
from clusterrun.transport.srun import SrunTransport, _srun_failure, _task_noise_removed, allocation_cpus

RUN_TIMEOUT = 120

WORKER = """
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print("REPORT " + json.dumps({**{k: os.environ.get(k) for k in keys}, "sum": total.item(),
                              "host": os.uname().nodename}), flush=True)
dist.destroy_process_group()
"""

FAIL_ON_RANK_5 = """
import os, sys, time
rank = int(os.environ["RANK"])
print("up", rank, flush=True)
if rank == 5:
    time.sleep(1)
    print("rank 5 gives up", flush=True)
    sys.exit(7)
time.sleep(120)
"""

SLEEPER = """
import os, time
print("sleeping", os.environ["RANK"], flush=True)
time.sleep(120)
"""


# ------------------------------------------------------------------------------------ without Slurm


@pytest.mark.parametrize(("nodelist", "cpus", "expected"), [
    ("node[0-3]", "2(x4)", {"node0": 2, "node1": 2, "node2": 2, "node3": 2}),
    ("gpu[01-03]", "72(x2),36", {"gpu01": 72, "gpu02": 72, "gpu03": 36}),
    ("a,b", "4,8", {"a": 4, "b": 8}),
    ("node[0-3]", "2(x3)", {}),  # counts that do not match the nodes: unknown, not guessed
    ("node[0-1]", "two", {}),
    ("", "2(x2)", {}),
])
def test_allocation_cpus_follow_the_node_list(nodelist: str, cpus: str, expected: dict[str, int]) -> None:
    assert allocation_cpus({"SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_CPUS_PER_NODE": cpus}) == expected


def test_srun_errors_are_told_from_task_ends() -> None:
    assert _srun_failure("srun: error: node2: task 0: Exited with exit code 3\n") is None
    assert _srun_failure("srun: error: Unable to create step for job 1: Requested node configuration is not "
                         "available\n") == "Unable to create step for job 1: Requested node configuration is not available"
    assert _task_noise_removed("boom\nsrun: error: node2: task 0: Killed\n") == "boom\n"


def test_slurm_nodes_use_srun_inside_an_allocation_and_ssh_outside() -> None:
    inside = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[0-1]"}
    assert load_cluster(HostSource(slurm=""), inside).defaults.transport is Transport.srun
    assert load_cluster(HostSource(slurm="gpu[1-2]"), {}).defaults.transport is Transport.ssh
    assert load_cluster(HostSource(slurm="", transport="ssh"), inside).defaults.transport is Transport.ssh
    assert load_cluster(HostSource(ips="a,b"), inside).defaults.transport is Transport.ssh  # only --slurm
    assert load_cluster(HostSource(ips="a,b", transport="srun"), {}).defaults.transport is Transport.srun


def test_ssh_flags_with_srun_say_how_to_keep_ssh() -> None:
    with pytest.raises(UsageError, match=r"--ssh-user only applies to SSH.*add --transport ssh"):
        load_cluster(HostSource(slurm="", ssh_user="me"), {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"})


def test_transport_flag_is_refused_with_an_inventory_file(tmp_path: Path) -> None:
    inv = tmp_path / "cluster.yaml"
    inv.write_text("version: 1\nnodes:\n  - {name: a, host: a}\n")
    with pytest.raises(UsageError, match=r"--transport as defaults.transport"):
        load_cluster(HostSource(inventory=inv, transport="srun"), {})


def test_srun_argv_shares_the_allocation() -> None:
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_CPUS_PER_NODE": "8(x2)",
           "PATH": os.environ.get("PATH", "")}
    transport = SrunTransport("n2", "n2", env)
    try:
        argv = transport.srun_argv("step", "true")
    except ConnectError:
        pytest.skip("srun is not installed")
    assert {"--nodes=1", "--ntasks=1", "--nodelist=n2", "--overlap", "--cpus-per-task=8", "--job-name=step",
            "--kill-on-bad-exit=1"} <= set(argv)
    assert argv[-3:] == ["/bin/sh", "-c", "true"]
    assert "--overlap" not in SrunTransport("n2", "n2", {"PATH": env["PATH"]}).srun_argv("step", "true")


# ------------------------------------------------------------------------------------ on the test bed


@pytest.fixture
def bed(slurm_bed: SlurmBed) -> Iterator[SlurmBed]:
    """The bed with every node's sshd stopped: whatever works here went through srun."""
    for node in slurm_bed.cluster.nodes:
        slurm_bed.cluster.stop_sshd(node)
    try:
        yield slurm_bed
    finally:
        slurm_bed.reset()


@pytest.fixture
def allocation(bed: SlurmBed) -> Iterator[dict[str, str]]:
    """A 4-node allocation (``salloc --no-shell``): the environment a command inside it sees."""
    env = bed.allocate(4)
    try:
        yield env
    finally:
        bed.cancel(env["SLURM_JOB_ID"])


def _clusterrun(bed: SlurmBed, *args: str, cwd: Path, extra: dict[str, str] | None = None,
                salloc: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "clusterrun", *args]
    if salloc:
        argv = ["salloc", "--nodes=4", "--immediate=20", "--job-name=clusterrun-test", *argv]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          stdin=subprocess.DEVNULL, env=bed.env({**clusterrun_env(), **(extra or {})}), check=False)


def _reports(stdout: str) -> list[dict]:
    """Every ``REPORT {json}`` in the output. A batch job's output file holds the lines of every node's task as
    srun passed them on, and a line may arrive glued to the end of another node's, so each report is read
    from where it starts to where its JSON ends, not line by line."""
    decoder, found, at = json.JSONDecoder(), [], stdout.find("REPORT {")
    while at >= 0:
        report, end = decoder.raw_decode(stdout, at + len("REPORT "))
        found.append(report)
        at = stdout.find("REPORT {", end)
    return found


def _our_sruns() -> list[str]:
    """Command lines of this machine's srun processes that clusterrun started (its steps are named clusterrun-*)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if argv and argv[0].endswith(b"srun") and any(a.startswith(b"--job-name=clusterrun-") for a in argv):
            found.append(b" ".join(argv[:8]).decode(errors="replace"))
    return found


def _assert_nothing_left(bed: SlurmBed, run_id: str, job: str | None = None, timeout: float = 10.0) -> None:
    """No process of the run on any node, no srun of ours here and no step of ours in the allocation."""
    left = bed.cluster.wait_no_processes(run_id, timeout)
    assert not left, f"processes of run {run_id} left behind: {left}"
    deadline = time.monotonic() + timeout
    steps, sruns = "", _our_sruns()
    for _ in range(int(timeout / 0.1) + 1):
        if job is not None:
            steps = bed.client(["squeue", "--noheader", "--steps", f"--jobs={job}", "--format=%i %j"]).stdout
        sruns = _our_sruns()
        if ("clusterrun-" not in steps and not sruns) or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # poll step of a deadline-bounded wait
    assert "clusterrun-" not in steps, f"steps of the run left in job {job}: {steps}"
    assert not sruns, f"srun processes left on this machine: {sruns}"


@pytest.mark.cluster
def test_up_inside_salloc_runs_the_allreduce_through_srun(bed: SlurmBed, tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(WORKER)
    done = _clusterrun(bed, "up", "--slurm", "--nproc-per-node", "2", "--python", sys.executable, "job.py",
                       cwd=tmp_path, salloc=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    got = sorted(_reports(done.stdout), key=lambda r: int(r["RANK"]))
    assert [int(r["RANK"]) for r in got] == list(range(8))
    names = bed.node_names
    master = bed.cluster.nodes[0].data_ip
    jobs = {r["SLURM_JOB_ID"] for r in got}
    assert len(jobs) == 1 and None not in jobs  # every rank ran in a step of the salloc job
    # the step's own task numbering (rank 0 of 1 on every node) does not reach the job
    assert all(r["SLURM_PROCID"] is None and r["SLURM_NTASKS"] is None for r in got)
    for r in got:
        rank = int(r["RANK"])
        assert r["host"] == names[rank // 2]
        assert int(r["LOCAL_RANK"]) == rank % 2 and int(r["GROUP_RANK"]) == rank // 2
        assert int(r["WORLD_SIZE"]) == 8 and int(r["LOCAL_WORLD_SIZE"]) == 2
        assert r["MASTER_ADDR"] == master and r["MASTER_PORT"] == "29500"
        # Slurm's NodeAddr is the management network: the data network is the other one
        assert r["GLOO_SOCKET_IFNAME"] == "eth1" and r["NCCL_SOCKET_IFNAME"] == "=eth1"
        assert r["sum"] == 36.0
    run = the_run(tmp_path)
    assert status(run)["state"] == "succeeded"
    for name in names:
        assert "REPORT" in "".join(p.read_text() for p in (run / name).glob("rank*.log"))
    _assert_nothing_left(bed, run.name)


@pytest.mark.cluster
def test_a_failing_rank_stops_every_node_with_its_exit_code(bed: SlurmBed, allocation: dict[str, str],
                                                            tmp_path: Path) -> None:
    (tmp_path / "fail.py").write_text(FAIL_ON_RANK_5)
    started = time.monotonic()
    done = _clusterrun(bed, "up", "--slurm", "--nproc-per-node", "2", "--python", sys.executable, "fail.py",
                       cwd=tmp_path, extra=allocation)
    assert done.returncode == 7, done.stderr[-3000:]
    assert time.monotonic() - started < 60  # the others sleep 120 s: they were stopped
    assert "first failure: node2 rank 5: exit code 7" in done.stderr
    run = the_run(tmp_path)
    st = status(run)
    assert st["first_failure"]["node"] == "node2" and st["first_failure"]["rank"] == 5
    assert st["nodes"]["node0"]["ranks"]["0"]["state"] == "stopped"
    _assert_nothing_left(bed, run.name, allocation["SLURM_JOB_ID"])


@pytest.mark.cluster
def test_ctrl_c_leaves_nothing_on_any_node(bed: SlurmBed, allocation: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, "-m", "clusterrun", "up", "--slurm", "--nproc-per-node", "2",
                             "--python", sys.executable, "sleeper.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env=bed.env({**clusterrun_env(), **allocation}))
    try:
        wait_for_lines(proc, 8, "sleeping")
        run = the_run(tmp_path)
        assert set(bed.cluster.job_processes(run.name)) == set(bed.node_names)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGINT
    assert status(run)["state"] == "interrupted"
    _assert_nothing_left(bed, run.name, allocation["SLURM_JOB_ID"])


@pytest.mark.cluster
def test_exec_runs_on_every_node_through_srun(bed: SlurmBed, allocation: dict[str, str], tmp_path: Path) -> None:
    done = _clusterrun(bed, "exec", "--slurm", "--python", sys.executable, "--", "hostname", cwd=tmp_path,
                       extra=allocation)
    assert done.returncode == 0, done.stderr
    for name in bed.node_names:
        assert f"[{name}] {name}" in done.stdout.replace("  ", " "), done.stdout


@pytest.mark.cluster
def test_transport_ssh_keeps_ssh_inside_the_allocation(bed: SlurmBed, allocation: dict[str, str],
                                                       tmp_path: Path) -> None:
    done = _clusterrun(bed, "exec", "--slurm", "--transport", "ssh", "--ssh-config", str(bed.cluster.ssh_config),
                       "--", "hostname", cwd=tmp_path, extra=allocation)
    assert done.returncode != 0
    assert "connection refused" in done.stdout + done.stderr  # every sshd is stopped


@pytest.mark.cluster
def test_srun_transport_copies_times_out_and_names_foreign_nodes(bed: SlurmBed, allocation: dict[str, str],
                                                                 tmp_path: Path) -> None:
    env = bed.env(allocation)
    transport = SrunTransport("node1", "node1", env)
    source = tmp_path / "payload.bin"
    source.write_bytes(os.urandom(300_000))
    source.chmod(0o750)
    dest = tmp_path / "copied" / "payload.bin"  # the nodes share this machine's files
    transport.put(source, str(dest))
    assert dest.read_bytes() == source.read_bytes() and dest.stat().st_mode & 0o777 == 0o750
    assert transport.peer_address() == bed.cluster.nodes[1].mgmt_ip
    result = transport.run(["sh", "-c", "cat; echo; hostname; exit 3"], stdin=b"fed")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "fed\nnode1\n", "")
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match="node1: `sleep 60` did not finish within 1s"):
        transport.run(["sleep", "60"], timeout=1)
    assert time.monotonic() - started < 10
    assert bed.cluster.wait_no_processes("sleep 60", 5.0) == {}
    with pytest.raises(ConnectError, match="srun could not run a step on nodeX"):
        SrunTransport("nodeX", "nodeX", env).run(["true"])


@pytest.mark.cluster
def test_an_aborted_step_that_stays_is_cancelled(bed: SlurmBed, allocation: dict[str, str]) -> None:
    transport = SrunTransport("node2", "node2", bed.env(allocation), abort_grace=1.0)
    stream = transport.start(["sh", "-c", "echo up; exec sleep 61"])  # never reads its stdin
    assert next(stream.lines()) == "up"
    stream.abort()
    assert stream.wait(15.0) is not None  # the step was cancelled: srun ended
    _assert_nothing_left(bed, "sleep 61", allocation["SLURM_JOB_ID"])



def test_an_exported_batch_script_runs_to_completion_with_sbatch(bed: SlurmBed, tmp_path: Path) -> None:
    """`clusterrun export sbatch` for 2 nodes x 2 ranks, submitted with `sbatch --wait`: every rank all-reduces
    over the data NIC the plan names and reports; the batch job ends COMPLETED."""
    (tmp_path / "worker.py").write_text(WORKER)
    done = _clusterrun(bed, "export", "sbatch", "--slurm", "node[0-1]", "--data-nic", "eth1", "--nproc-per-node", "2",
                       "-o", "job.sbatch", "worker.py", cwd=tmp_path, extra={"SLURM_JOB_ID": ""})
    assert done.returncode == 0, done.stderr
    submitted = bed.client(["sbatch", "--wait", f"--chdir={tmp_path}", str(tmp_path / "job.sbatch")], timeout=120,
                           check=False)
    outputs = "".join(p.read_text() for p in tmp_path.glob("*.out"))
    assert submitted.returncode == 0, submitted.stderr + outputs[-3000:]
    got = _reports(outputs)
    assert sorted(int(r["RANK"]) for r in got) == [0, 1, 2, 3]
    assert {r["sum"] for r in got} == {10.0} and {r["GLOO_SOCKET_IFNAME"] for r in got} == {"eth1"}
