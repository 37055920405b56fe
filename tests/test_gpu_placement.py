"""GPU choice and CPU binding end to end on the simulated cluster: each node plays a recorded GPU node through the
stand-in nvidia-smi (tests/fixtures/gpu_nodes/) whose NUMA CPU lists are CPUs of this machine, so what a rank is
bound to can be read in its own /proc/<pid>/status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpunodes import numa_cpus, python_on_gpu_node
from simcluster import SimCluster
from simjobs import run_clusterrun, write_inventory

pytestmark = pytest.mark.cluster

#: Each rank says which GPUs it was given and which CPUs it may run on (its /proc/<pid>/status).
PLACED = """
import json, os
with open("/proc/%d/status" % os.getpid()) as fh:
    status = dict(line.rstrip("\\n").split(":\\t", 1) for line in fh if ":\\t" in line)
print("PLACED " + json.dumps({"rank": int(os.environ["RANK"]), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
                              "cpus": status["Cpus_allowed_list"].strip()}), flush=True)
"""


def placed(stdout: str) -> dict[int, dict]:
    return {r["rank"]: r for r in (json.loads(line.split("PLACED ", 1)[1]) for line in stdout.splitlines()
                                   if "PLACED " in line)}


def numa_cpu(node: int) -> str:
    """The CPU of this machine that plays NUMA node ``node`` (gpunodes.numa_cpus)."""
    return dict(item.split("=") for item in numa_cpus().split(";"))[str(node)]


def up_on(cluster: SimCluster, tmp_path: Path, python: Path, *args: str, gpus: str = "") -> tuple[int, str, str]:
    inv = write_inventory(cluster, tmp_path / "inventory.yaml", 1, python=str(python))
    text = inv.read_text().replace("  nproc_per_node: 2\n", "")
    if gpus:
        text = text.replace("    host: node0\n", f"    host: node0\n    gpus: [{gpus}]\n")
    inv.write_text(text)
    (tmp_path / "placed.py").write_text(PLACED)
    done = run_clusterrun("up", *args, str(inv), "placed.py", cwd=tmp_path)
    return done.returncode, done.stdout, done.stderr


def test_the_nodes_cuda_visible_devices_gives_ranks_its_physical_gpus(sim_cluster: SimCluster, tmp_path: Path) -> None:
    python = python_on_gpu_node(tmp_path, "h100x8_one_busy", CUDA_VISIBLE_DEVICES="2,3")
    rc, out, err = up_on(sim_cluster, tmp_path, python)
    assert rc == 0, err
    ranks = placed(out)
    assert sorted(ranks) == [0, 1]
    assert {r["gpus"] for r in ranks.values()} == {"2,3"}  # GPUs 2 and 3 of the node, not 0 and 1
    assert {r["cpus"] for r in ranks.values()} == {numa_cpu(0)}  # GPUs 2 and 3 sit on NUMA node 0
    assert "node0: 2 GPU(s) seen, one process each (gpus: 2-3) (the node's CUDA_VISIBLE_DEVICES=2,3)" in err


def test_four_ranks_take_the_idle_socket_and_run_on_its_cpus(sim_cluster: SimCluster, tmp_path: Path) -> None:
    python = python_on_gpu_node(tmp_path, "h100x8_one_busy")
    rc, out, err = up_on(sim_cluster, tmp_path, python, "--nproc-per-node", "4")
    assert rc == 0, err
    ranks = placed(out)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert {r["gpus"] for r in ranks.values()} == {"4,5,6,7"}
    assert {r["cpus"] for r in ranks.values()} == {numa_cpu(1)}  # each rank on its GPU's NUMA node's CPUs
    assert ("node0: GPUs 4-7 for 4 process(es): one NVLink island (NV18), one NUMA node (1); left out: GPU 1 busy: "
            "pid 3999999 /app/llama-server, 45652 MiB") in err


def test_plan_probe_says_which_gpus_and_why(sim_cluster: SimCluster, tmp_path: Path) -> None:
    python = python_on_gpu_node(tmp_path, "h100x8_one_busy")
    inv = write_inventory(sim_cluster, tmp_path / "inventory.yaml", 1, python=str(python))
    (tmp_path / "placed.py").write_text(PLACED)
    done = run_clusterrun("plan", "--probe", "--json", "--nproc-per-node", "4", str(inv), "placed.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["probed"][0].startswith("node0: GPUs 4-7 for 4 process(es): one NVLink island (NV18), one NUMA node")
    assert plan["nodes"][0]["gpus"] == [4, 5, 6, 7]
    assert plan["nodes"][0]["env"]["CLUSTERRUN_CPU_BIND"] == ";".join([f"{numa_cpu(1)}/1"] * 4)


def test_a_busy_gpu_named_in_the_inventory_is_refused_before_anything_starts(sim_cluster: SimCluster,
                                                                             tmp_path: Path) -> None:
    python = python_on_gpu_node(tmp_path, "h100x8_one_busy")
    rc, out, err = up_on(sim_cluster, tmp_path, python, gpus="0, 1")
    assert rc == 125 and not placed(out)
    assert ("node0: GPU 1 is busy: pid 3999999 /app/llama-server, 45652 MiB; one busy GPU slows every rank of the "
            "job: list idle GPUs, or add --allow-busy-gpus to use it anyway") in err
    assert not any((tmp_path / "runs").glob("*/node0/rank*.log"))


def test_without_a_count_a_busy_gpu_refuses_the_start_instead_of_fewer_ranks(sim_cluster: SimCluster,
                                                                             tmp_path: Path) -> None:
    python = python_on_gpu_node(tmp_path, "h100x8_gpu0_busy")
    rc, out, err = up_on(sim_cluster, tmp_path, python)
    assert rc == 125 and not placed(out)
    assert ("node0: GPU 0 is busy: pid 3999999 /app/llama-server, 45652 MiB; without a process count the run takes "
            "every GPU the node allows (0-7), one process each, and one busy GPU slows every rank of the job: "
            "`--nproc-per-node 7` takes the 7 best idle GPUs on every node, or add --allow-busy-gpus to use busy "
            "GPUs anyway") in err
    assert not any((tmp_path / "runs").glob("*/node0/rank*.log"))
    # The first way out: a count takes the best idle GPUs (one NUMA node, GPU 0 left out).
    rc, out, err = up_on(sim_cluster, tmp_path, python, "--nproc-per-node", "2")
    assert rc == 0, err
    assert {r["gpus"] for r in placed(out).values()} == {"1,2"}
