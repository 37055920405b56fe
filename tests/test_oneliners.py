"""Nodes without an inventory file, on the simulated cluster: --ips, --hostfile, --slurm, and --nodes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from gpunodes import python_on_gpu_node
from simcluster import SimCluster
from simjobs import WORKER, reports, run_clusterrun, the_run, write_inventory

pytestmark = pytest.mark.cluster


def ip_ssh_config(cluster: SimCluster, path: Path) -> Path:
    """An ssh_config for reaching the nodes by their management addresses (what --ips users type)."""
    blocks = [f"Host {n.mgmt_ip}\n    User root\n    IdentityFile {cluster.identity_file}\n    IdentitiesOnly yes\n"
              f"    UserKnownHostsFile {cluster.known_hosts}\n    StrictHostKeyChecking yes\n    BatchMode yes\n"
              for n in cluster.nodes]
    path.write_text("\n".join(blocks) + "\n" + cluster.ssh_config.read_text())
    return path


def plan_json(cwd: Path, *args: str) -> dict:
    (cwd / "x.py").write_text("")
    done = run_clusterrun("plan", "--json", *args, "x.py", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_ips_one_liner_runs_on_the_probed_data_nic(sim_cluster: SimCluster, tmp_path: Path) -> None:
    cfg = ip_ssh_config(sim_cluster, tmp_path / "ssh_config")
    ips = ",".join(n.mgmt_ip for n in sim_cluster.nodes[:2])
    (tmp_path / "worker.py").write_text(WORKER)
    done = run_clusterrun("up", "--ips", ips, "--ssh-config", str(cfg), "--python", sys.executable,
                          "--nproc-per-node", "2", "worker.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = reports(done.stdout)
    assert len(got) == 4 and {r["sum"] for r in got} == {10.0}
    assert {r["GLOO_SOCKET_IFNAME"] for r in got} == {sim_cluster.nodes[0].data_nic}
    assert {r["MASTER_ADDR"] for r in got} == {sim_cluster.nodes[0].data_ip}
    assert {r["host"] for r in got} == {"node0", "node1"}


def test_ips_plan_shows_what_the_one_liner_means(sim_cluster: SimCluster, tmp_path: Path) -> None:
    ips = f"{sim_cluster.nodes[0].mgmt_ip},{sim_cluster.nodes[1].mgmt_ip}:22"
    plan = plan_json(tmp_path, "--ips", ips, "--gpus", "0-3")
    assert [(n["name"], n["host"], n["node_rank"], n["nproc_per_node"]) for n in plan["nodes"]] == [
        (sim_cluster.nodes[0].mgmt_ip, sim_cluster.nodes[0].mgmt_ip, 0, 4),
        (sim_cluster.nodes[1].mgmt_ip, sim_cluster.nodes[1].mgmt_ip, 1, 4)]


def test_hostfile_slots_set_processes_per_node(sim_cluster: SimCluster, tmp_path: Path) -> None:
    (tmp_path / "hostfile").write_text("# DeepSpeed style\nnode0 slots=2\n\nnode1 slots=1  # smaller box\n")
    plan = plan_json(tmp_path, "--hostfile", "hostfile", "--ssh-config", str(sim_cluster.ssh_config))
    assert [(n["name"], n["nproc_per_node"]) for n in plan["nodes"]] == [("node0", 2), ("node1", 1)]
    assert plan["world_size"] == 3


def test_slurm_node_list_and_the_probe(sim_cluster: SimCluster, tmp_path: Path) -> None:
    args = ("--slurm", "node[0-2]", "--ssh-config", str(sim_cluster.ssh_config), "--python", sys.executable)
    plan = plan_json(tmp_path, *args, "--probe")
    assert [n["name"] for n in plan["nodes"]] == ["node0", "node1", "node2"]
    assert plan["master_addr"] == sim_cluster.nodes[0].data_ip
    assert [n["data_nic"] for n in plan["nodes"]] == [sim_cluster.nodes[i].data_nic for i in range(3)]


def test_nodes_picks_a_subset_of_an_inventory(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4)
    plan = plan_json(tmp_path, str(inv), "--nodes", "node[1-2]")
    assert [(n["name"], n["node_rank"]) for n in plan["nodes"]] == [("node1", 0), ("node2", 1)]
    assert plan["master_addr"] == sim_cluster.nodes[1].data_ip
    done = run_clusterrun("plan", "--nodes", "gpu*", str(inv), "x.py", cwd=tmp_path)
    assert done.returncode == 2 and "selects no node" in done.stderr and "node[0-3]" in done.stderr


def test_doctor_on_a_one_liner_pings_the_networks_it_finds(sim_cluster: SimCluster, tmp_path: Path) -> None:
    cfg = ip_ssh_config(sim_cluster, tmp_path / "ssh_config")
    ips = ",".join(n.mgmt_ip for n in sim_cluster.nodes[:3])
    done = run_clusterrun("doctor", "--ips", ips, "--ssh-config", str(cfg), "--python", sys.executable, "--json",
                          "--checks", "net.ping", cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    ping = next(c for c in report["checks"] if c["name"] == "net.ping")
    assert sorted(f["subject"] for f in ping["findings"]) == sorted([sim_cluster.mgmt_subnet, sim_cluster.data_subnet])
    assert f"data: {sim_cluster.data_subnet}" in report["recommended"]


def test_data_nic_as_a_subnet_works_for_a_one_liner(sim_cluster: SimCluster, tmp_path: Path) -> None:
    cfg = ip_ssh_config(sim_cluster, tmp_path / "ssh_config")
    ips = ",".join(n.mgmt_ip for n in sim_cluster.nodes[:2])
    plan = plan_json(tmp_path, "--ips", ips, "--ssh-config", str(cfg), "--python", sys.executable,
                     "--data-nic", sim_cluster.mgmt_subnet, "--probe")
    assert plan["master_addr"] == sim_cluster.nodes[0].mgmt_ip  # the user's choice, even the slower network
    assert [n["data_nic"] for n in plan["nodes"]] == [sim_cluster.nodes[0].mgmt_nic, sim_cluster.nodes[1].mgmt_nic]


def test_init_writes_an_inventory_that_up_runs(sim_cluster: SimCluster, tmp_path: Path) -> None:
    cfg = ip_ssh_config(sim_cluster, tmp_path / "ssh_config")
    ips = ",".join(n.mgmt_ip for n in sim_cluster.nodes[:2])
    out = tmp_path / "cluster.yaml"
    done = run_clusterrun("init", "--ips", ips, "--ssh-config", str(cfg), "--python", sys.executable, "-o", str(out),
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert f"data: {sim_cluster.data_subnet}" in text
    for node in sim_cluster.nodes[:2]:
        assert f"{{name: {node.data_nic}, ip: {node.data_ip}/24" in text
        assert f"{{name: {node.mgmt_nic}, ip: {node.mgmt_ip}/24" in text
    assert "SSH reaches the node here" in text
    again = run_clusterrun("init", "--ips", ips, "--ssh-config", str(cfg), "-o", str(out), cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr and out.read_text() == text  # nothing overwritten
    assert run_clusterrun("check", str(out), cwd=tmp_path).returncode == 0
    (tmp_path / "worker.py").write_text(WORKER)
    up = run_clusterrun("up", "--preflight", "quick", str(out), "worker.py", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    assert {r["GLOO_SOCKET_IFNAME"] for r in reports(up.stdout)} == {sim_cluster.nodes[0].data_nic}
    assert "from the node" not in up.stderr  # the inventory already said everything


GPU_WORKER = """
import json, os
keys = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")
print("REPORT " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
"""


def test_without_gpus_given_every_gpu_a_node_sees_gets_a_process(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """The nodes' nvidia-smi is a stand-in replaying 4 idle H200s (tests/fixtures/gpu_nodes/h200x4_idle); the
    interpreter the one-liner names puts it first on the PATH, as a site's environment module would."""
    python = python_on_gpu_node(tmp_path, "h200x4_idle")
    cfg = ip_ssh_config(sim_cluster, tmp_path / "ssh_config")
    ips = ",".join(n.mgmt_ip for n in sim_cluster.nodes[:2])
    (tmp_path / "gpu_worker.py").write_text(GPU_WORKER)
    done = run_clusterrun("up", "--ips", ips, "--ssh-config", str(cfg), "--python", str(python), "gpu_worker.py",
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = [json.loads(line.split("REPORT ", 1)[1]) for line in done.stdout.splitlines() if "REPORT " in line]
    assert sorted(int(r["RANK"]) for r in got) == list(range(8))
    assert {(r["WORLD_SIZE"], r["LOCAL_WORLD_SIZE"], r["CUDA_VISIBLE_DEVICES"]) for r in got} == {("8", "4", "0,1,2,3")}
    assert f"{sim_cluster.nodes[0].mgmt_ip}: 4 GPU(s) seen, one process each (gpus: 0-3)" in done.stderr


def test_plan_probe_shows_the_gpus_up_will_use(sim_cluster: SimCluster, tmp_path: Path) -> None:
    python = python_on_gpu_node(tmp_path, "h200x4_idle")
    cfg = ip_ssh_config(sim_cluster, tmp_path / "ssh_config")
    plan = plan_json(tmp_path, "--probe", "--ips", sim_cluster.nodes[0].mgmt_ip, "--ssh-config", str(cfg),
                     "--python", str(python))
    assert [(n["nproc_per_node"], n["gpus"]) for n in plan["nodes"]] == [(4, [0, 1, 2, 3])]


def test_init_lists_the_gpus_up_counts(sim_cluster: SimCluster, tmp_path: Path) -> None:
    python = python_on_gpu_node(tmp_path)  # the recorded 4 x H200, busy: init lists what the node has
    cfg = ip_ssh_config(sim_cluster, tmp_path / "ssh_config")
    done = run_clusterrun("init", "--ips", sim_cluster.nodes[0].mgmt_ip, "--ssh-config", str(cfg), "--python",
                          str(python), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "    gpus: [0, 1, 2, 3]   # NVIDIA H200-141C\n" in done.stdout  # the recorded 4 x H200


def test_doctor_and_up_report_the_same_nics_of_a_one_liner(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """`up --ips` and `doctor --ips` on the same nodes give each node the same NICs: one reporter, one reading."""
    cfg = ip_ssh_config(sim_cluster, tmp_path / "ssh_config")
    nodes = sim_cluster.nodes[:2]
    ips = ",".join(n.mgmt_ip for n in nodes)
    (tmp_path / "x.py").write_text("")
    up = run_clusterrun("up", "--ips", ips, "--ssh-config", str(cfg), "--python", sys.executable,
                        "--nproc-per-node", "1", "x.py", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    probed = json.loads((the_run(tmp_path) / "plan.json").read_text())["probed"]
    # "198.18.5.10: eth1 198.19.5.10/24 (probed: not in the inventory)"
    up_nics = {(node.rstrip(":"), nic, ip) for node, nic, ip, *_ in (line.split(" ") for line in probed
                                                                      if line.endswith("(probed: not in the inventory)"))}
    doctor = run_clusterrun("doctor", "--ips", ips, "--ssh-config", str(cfg), "--python", sys.executable, "--json",
                            "--checks", "nic.present", cwd=tmp_path, timeout=180)
    assert doctor.returncode == 0, doctor.stderr
    present = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "nic.present")["findings"]
    assert all(f["verdict"] == "pass" for f in present), present
    doctor_nics = {(f["node"], f["subject"], tuple(f["data"]["addresses"])) for f in present}

    assert {(node, nic) for node, nic, _ in up_nics} == {(node, nic) for node, nic, _ in doctor_nics}
    assert all(any(ip.split("/")[0] in addresses for n, nic_, addresses in doctor_nics if (n, nic_) == (node, nic))
               for node, nic, ip in up_nics)
    for node in nodes:  # both networks of every node, as the node has them
        assert {(node.mgmt_ip, node.mgmt_nic, f"{node.mgmt_ip}/24"),
                (node.mgmt_ip, node.data_nic, f"{node.data_ip}/24")} <= up_nics
