"""`up` plans from what the nodes really have, and checks the data path before it starts anything.

On the simulated cluster: an inventory that names hosts only gets its data NIC from the nodes; an
inventory that contradicts a node is refused; a blackholed data NIC is refused in seconds, naming the
node and NIC (and `--preflight off` starts anyway, leaving the failure to the job); nodes whose data NICs
have different names each get their own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import WORKER, assert_nothing_left, nic_bytes, reports, run_clusterrun, status, the_run, write_inventory

pytestmark = pytest.mark.cluster

SHORT_TIMEOUT_WORKER = """
import datetime, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
dist.barrier()
"""


def hosts_only(cluster: SimCluster, path: Path, nodes: int) -> Path:
    """An inventory without any NIC: only how SSH reaches each node (as after `--ips`)."""
    inv = write_inventory(cluster, path, nodes, nproc=1, data="auto")
    kept = [line for line in inv.read_text().splitlines()
            if not line.strip().startswith(("nics:", "- {name: "))]
    inv.write_text("\n".join(kept) + "\n")
    assert "nics" not in inv.read_text()
    return inv


def test_plan_probe_finds_the_data_nic_of_a_hosts_only_inventory(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = hosts_only(sim_cluster, tmp_path / "cluster.yaml", 2)
    (tmp_path / "x.py").write_text("")
    offline = json.loads(run_clusterrun("plan", "--json", str(inv), "x.py", cwd=tmp_path).stdout)
    assert offline["probed"] == [] and offline["master_addr"] == "node0"  # nothing known without the nodes
    done = run_clusterrun("plan", "--json", "--probe", str(inv), "x.py", cwd=tmp_path)
    plan = json.loads(done.stdout)
    assert plan["master_addr"] == sim_cluster.nodes[0].data_ip, done.stderr
    assert any(f"node1: {sim_cluster.nodes[1].data_nic} {sim_cluster.nodes[1].data_ip}/24" in p for p in plan["probed"])
    # The management network (what SSH uses) is not chosen although both are equally fast veths.
    assert sim_cluster.data_subnet in plan["data_network"]


def test_up_on_a_hosts_only_inventory_uses_the_probed_data_nic(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = hosts_only(sim_cluster, tmp_path / "cluster.yaml", 2)
    (tmp_path / "worker.py").write_text(WORKER)
    before = {n.name: (nic_bytes(sim_cluster, n.name, n.data_nic), nic_bytes(sim_cluster, n.name, n.mgmt_nic))
              for n in sim_cluster.nodes[:2]}
    done = run_clusterrun("up", str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "network paths to node0 ok" in done.stderr
    got = reports(done.stdout)
    assert {r["GLOO_SOCKET_IFNAME"] for r in got} == {sim_cluster.nodes[0].data_nic}
    assert {r["NCCL_SOCKET_IFNAME"] for r in got} == {"=" + sim_cluster.nodes[0].data_nic}  # exact name
    assert {r["MASTER_ADDR"] for r in got} == {sim_cluster.nodes[0].data_ip}
    for node in sim_cluster.nodes[:2]:  # 8 x 16 MiB all-reduces: the data NIC carried them
        data = nic_bytes(sim_cluster, node.name, node.data_nic) - before[node.name][0]
        mgmt = nic_bytes(sim_cluster, node.name, node.mgmt_nic) - before[node.name][1]
        assert data > 50_000_000 > mgmt, (node.name, data, mgmt)
    run = the_run(tmp_path)
    assert json.loads((run / "preflight.json").read_text())["passed"] is True
    assert json.loads((run / "plan.json").read_text())["probed"]


def test_inventory_address_the_node_lacks_is_refused(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    wrong = sim_cluster.nodes[2].data_ip.rsplit(".", 1)[0] + ".250"
    inv.write_text(inv.read_text().replace(f"ip: {sim_cluster.nodes[2].data_ip}/24", f"ip: {wrong}/24"))
    (tmp_path / "worker.py").write_text(WORKER)
    done = run_clusterrun("up", str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode == 125, done.stderr
    assert f"node2: NIC {sim_cluster.nodes[2].data_nic} does not have {wrong}" in done.stderr
    assert sim_cluster.nodes[2].data_ip in done.stderr  # what it has instead
    assert status(the_run(tmp_path))["state"] == "not-started"


def test_blackholed_data_nic_is_refused_in_seconds(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    (tmp_path / "worker.py").write_text(SHORT_TIMEOUT_WORKER)
    sim_cluster.drop_nic("node1", "data")
    started = time.monotonic()
    done = run_clusterrun("up", str(inv), "worker.py", cwd=tmp_path)
    assert time.monotonic() - started < 30
    assert done.returncode == 125, done.stderr
    nic, ip = sim_cluster.nodes[1].data_nic, sim_cluster.nodes[1].data_ip
    assert f"node1: cannot reach node0's master address {sim_cluster.nodes[0].data_ip}:" in done.stderr
    assert f"from {nic} ({ip})" in done.stderr and "no ping reply either" in done.stderr
    assert "clusterrun doctor" in done.stderr and "--preflight off" in done.stderr
    run = the_run(tmp_path)
    pre = json.loads((run / "preflight.json").read_text())
    assert pre["passed"] is False and set(pre["problems"]) == {"node1"}
    assert not any(sim_cluster.job_processes(run.name).values())  # nothing was started anywhere


def test_preflight_off_starts_and_the_failure_is_the_jobs(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "worker.py").write_text(SHORT_TIMEOUT_WORKER)
    sim_cluster.drop_nic("node1", "data")
    started = time.monotonic()
    # Without the check, node1's torchrun waits for the rendezvous store (15 min by default); the data-path watch
    # names the dead path within seconds (the time limit is only a safety net here).
    done = run_clusterrun("up", "--preflight", "off", "--timeout", "60", str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 90
    assert "node0: its data path died: it and node1 never reached each other on the data network" in done.stderr
    run = the_run(tmp_path)
    assert json.loads((run / "preflight.json").read_text())["skipped"] == "--preflight off"
    assert status(run)["state"] == "failed"
    assert_nothing_left(sim_cluster, run.name)


@pytest.fixture(scope="module")
def odd_names(cluster_requirements: None) -> Iterator[SimCluster]:
    cluster = SimCluster(2, data_nic_names=["ens1f0", "data7"])
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_nodes_with_different_data_nic_names_each_get_their_own(odd_names: SimCluster, tmp_path: Path) -> None:
    inv = hosts_only(odd_names, tmp_path / "cluster.yaml", 2)
    (tmp_path / "worker.py").write_text(WORKER)
    done = run_clusterrun("up", str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    by_rank = {int(r["RANK"]): r for r in reports(done.stdout)}
    assert by_rank[0]["GLOO_SOCKET_IFNAME"] == "ens1f0" and by_rank[1]["GLOO_SOCKET_IFNAME"] == "data7"
    assert by_rank[0]["NCCL_SOCKET_IFNAME"] == "=ens1f0" and by_rank[1]["NCCL_SOCKET_IFNAME"] == "=data7"
