"""A run's series through `clusterrun up` on the simulated cluster: an all-reduce's traffic shows on the data NIC
(as the veths' own counters say), and a job sent over the management NIC by a variable is named; a GPU run has
its series and energy, and the rank whose GPU keeps working while the others wait is named a straggler."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from simcluster import SimCluster
from simjobs import run_clusterrun, write_inventory
from test_notify import hook  # noqa: F401 (the webhook fixture)

pytestmark = pytest.mark.cluster

# STEPS all-reduces of 4 MiB over gloo (seconds of traffic), with a flood of output besides (heavy output is not
# training traffic).
ALLREDUCE = """
import sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1 << 20)
for step in range(int(sys.argv[1])):
    dist.all_reduce(t)
    for _ in range(50):
        print("rank", dist.get_rank(), "step", step, "x" * 200, flush=True)
dist.destroy_process_group()
"""


def _counter(cluster: SimCluster, node: str, nic: str, name: str) -> int:
    done = cluster.ns_run(node, ["cat", f"/sys/class/net/{nic}/statistics/{name}"])
    return int(done.stdout.strip())


def _sent(samples: list[dict], nic: str) -> float:
    """Bytes the node's samples say ``nic`` sent: rate x interval, summed."""
    return sum((s.get("nics") or {}).get(nic, [0, 0])[1] * float(s.get("dt") or 0) for s in samples)


def test_an_allreduce_runs_on_the_data_nic_as_the_kernel_counts_it(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=2)
    (tmp_path / "ar.py").write_text(ALLREDUCE)
    before = {n.name: _counter(sim_cluster, n.name, "eth1", "tx_bytes") for n in sim_cluster.nodes}
    done = run_clusterrun("up", "-q", str(inv), "ar.py", "30", cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    after = {n.name: _counter(sim_cluster, n.name, "eth1", "tx_bytes") for n in sim_cluster.nodes}
    run_id = json.loads(run_clusterrun("runs", "--json", cwd=tmp_path).stdout)[-1]["run_id"]
    shown = run_clusterrun("metrics", run_id, "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["verdicts"] == []  # the right NIC, and a flood of output, is never a verdict
    for name, node in view["nodes"].items():
        assert node["data_nic"] == "eth1"
        data, mgmt = _sent(node["samples"], "eth1"), _sent(node["samples"], "eth0")
        kernel = after[name] - before[name]
        # The series covers the job's life; the kernel's count also has the checks before it (small).
        assert 0.8 * kernel <= data <= 1.05 * kernel, (name, data, kernel)
        assert data > 20 * (1 << 20), (name, data)  # the all-reduce moved tens of MiB
        assert mgmt < data / 10, (name, mgmt, data)  # the management NIC: ssh and the log relay only
    status = json.loads(run_clusterrun("status", run_id, "--json", cwd=tmp_path).stdout)
    assert [e for e in status["events"] if e["kind"] == "wrong-nic"] == []


def test_gloo_forced_onto_the_management_nic_is_named_with_its_variable(sim_cluster: SimCluster,
                                                                        tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "ar.py").write_text(ALLREDUCE)
    # 80 steps: about 13 s on the 200 Mbit management NIC, past the verdict's 5 s of sustained traffic.
    done = run_clusterrun("up", "-q", "-e", "GLOO_SOCKET_IFNAME=eth0", str(inv), "ar.py", "80", cwd=tmp_path,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "goes over eth0" in done.stderr and "not the data NIC eth1" in done.stderr, done.stderr[-3000:]
    run_id = json.loads(run_clusterrun("runs", "--json", cwd=tmp_path).stdout)[-1]["run_id"]
    status = json.loads(run_clusterrun("status", run_id, "--json", cwd=tmp_path).stdout)
    named = [e for e in status["events"] if e["kind"] == "wrong-nic"]
    assert {e["node"] for e in named} == {"node0", "node1"}, named  # once per node
    for event in named:
        assert (event["nic"], event["data_nic"], event["variable"]) == ("eth0", "eth1", "GLOO_SOCKET_IFNAME")
        assert "--env" in event["text"]


def test_a_gpu_run_has_gpu_series_and_its_energy_in_the_record(sim_cluster: SimCluster, tmp_path: Path) -> None:
    # node0 plays an 8-GPU node (the stand-in nvidia-smi first on its interpreter's PATH); its series loop gives
    # every GPU 250 W, so the energy is about 250 W x the job's seconds x its GPUs.
    from gpunodes import python_on_gpu_node

    python = python_on_gpu_node(tmp_path, "h100x8_idle")
    inv = write_inventory(sim_cluster, tmp_path / "inventory.yaml", 1, python=str(python))
    inv.write_text(inv.read_text().replace("  nproc_per_node: 2\n", ""))
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(6)\n")
    done = run_clusterrun("up", "--nproc-per-node", "2", str(inv), "sleep.py", cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GPU energy: " in done.stderr  # in the summary
    run_id = json.loads(run_clusterrun("runs", "--json", cwd=tmp_path).stdout)[-1]["run_id"]
    view = json.loads(run_clusterrun("metrics", run_id, "--json", cwd=tmp_path).stdout)
    samples = view["nodes"]["node0"]["samples"]
    gpus = {index for s in samples for index in (s.get("gpus") or {})}
    assert len(gpus) == 2 and all(s["gpus"][g]["util"] == 97 for s in samples if s.get("gpus") for g in s["gpus"])
    record = json.loads(run_clusterrun("status", run_id, "--json", cwd=tmp_path).stdout)
    energy = record["energy"]
    seconds = sum(float(s["dt"]) for s in samples if s.get("gpus"))
    assert energy["per_node_j"]["node0"] == pytest.approx(2 * 250 * seconds, rel=0.35), (energy, seconds)
    assert energy["total_j"] == energy["per_node_j"]["node0"]
    assert "GPU energy: " in run_clusterrun("status", run_id, cwd=tmp_path).stdout


# The job lasts until the run's record has its straggler verdict (90 s at most), however slowly the machine runs.
UNTIL_NAMED = """
import os, sys, time
status = os.path.join(sys.argv[1], os.environ["CLUSTERRUN_RUN_ID"], "status.json")
deadline = time.time() + 90
while time.time() < deadline:
    try:
        with open(status) as fh:
            if '"straggler"' in fh.read():  # the verdict's kind
                break
    except OSError:
        pass
    time.sleep(0.2)
"""


def test_the_rank_whose_gpu_keeps_working_while_the_others_wait_is_named(sim_cluster: SimCluster, tmp_path: Path,
                                                                         hook: Any) -> None:  # noqa: F811
    # node0 plays an 8-GPU node whose series loop has GPU 1 at 97 % and 300 W and every other at 20 % and 90 W;
    # the ranks sleep (no CPU to tell them apart): the GPUs alone name the straggler.
    from gpunodes import python_on_gpu_node

    python = python_on_gpu_node(tmp_path, "h100x8_idle", STANDIN_SMI_LOOP_SLOW="1")
    inv = write_inventory(sim_cluster, tmp_path / "inventory.yaml", 1, python=str(python))
    inv.write_text(inv.read_text().replace("  nproc_per_node: 2\n", ""))
    (tmp_path / "wait.py").write_text(UNTIL_NAMED)
    done = run_clusterrun("up", "--nproc-per-node", "3", "--notify", hook.url, str(inv), "wait.py",
                          str(tmp_path / "runs"), cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = json.loads(run_clusterrun("runs", "--json", cwd=tmp_path).stdout)[-1]["run_id"]
    plan = json.loads((tmp_path / "runs" / run_id / "plan.json").read_text())
    gpus = plan["nodes"][0]["gpus"]
    assert 1 in gpus, gpus
    rank = gpus.index(1)  # local rank i on the node's i-th GPU
    line = (f"node0 rank {rank} looks like a straggler: its GPU 1 kept working at 97% and 300 W while the other "
            "GPUs ran at 20% and 90 W (their median), waiting for it")
    assert line in done.stderr, done.stderr[-3000:]
    record = json.loads(run_clusterrun("status", run_id, "--json", cwd=tmp_path).stdout)
    named = [e for e in record["events"] if e["kind"] == "straggler"]
    assert [(e["node"], e["rank"], e["by"], e["gpu"], e["util"], e["power"], e["util_others"], e["power_others"])
            for e in named] == [("node0", rank, "gpu", "1", 97.0, 300.0, 20.0, 90.0)]
    sent = [d for d in hook.received if d["event"] == "straggler"]
    assert len(sent) == 1 and sent[0]["text"] == f"clusterrun: run {run_id}: {named[0]['text']}"
    assert (sent[0]["node"], sent[0]["rank"], sent[0]["gpu"]) == ("node0", rank, "1")
