"""`doctor`'s ib_write_bw orchestration end to end on the simulated cluster.

There is no RDMA hardware here: the nodes run a stand-in ``ib_write_bw`` (tests/standins/ib_write_bw.py)
that does the real tool's TCP handshake between server and client and prints output recorded from real
runs. What is tested is clusterrun's part: pairing, a free port on the server, server before client,
time limits, parsing, the verdict against line rate; and the real absence of the tool.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import run_clusterrun, write_inventory

pytestmark = pytest.mark.cluster

STANDIN = Path(__file__).resolve().parent / "standins" / "ib_write_bw.py"


def standin_dir(tmp_path: Path, output: str = "roce_92gbps_rdma_cm_cpu_freq_warning.txt") -> Path:
    bindir = tmp_path / "perftest-bin"
    bindir.mkdir()
    tool = bindir / "ib_write_bw"
    tool.write_text(f"#!/bin/sh\nSTANDIN_IB_CLIENT_OUTPUT={output} STANDIN_IB_LOG={tmp_path / 'calls.log'} "
                    f"exec {sys.executable} {STANDIN} \"$@\"\n")
    tool.chmod(0o755)
    return bindir


def roce_inventory(cluster: SimCluster, path: Path, speed: str = "100gbit") -> Path:
    """Two nodes whose data NIC is listed as a RoCE NIC on HCA mlx5_0 (port 1, GID index 3)."""
    inv = write_inventory(cluster, path, 2, nproc=1)
    text = inv.read_text()
    for node in cluster.nodes[:2]:
        text = text.replace(f"{{name: {node.data_nic}, ip: {node.data_ip}/24, speed: {cluster.data_rate}}}",
                            f"{{name: {node.data_nic}, ip: {node.data_ip}/24, kind: roce, hca: mlx5_0, "
                            f"gid_index: 3, speed: {speed}}}")
    inv.write_text(text)
    return inv


def ib_findings(cwd: Path, inv: Path, *args: str) -> tuple[int, list[dict]]:
    done = run_clusterrun("doctor", str(inv), "--json", "--checks", "ib.bandwidth", *args, cwd=cwd, timeout=240)
    report = json.loads(done.stdout)
    return done.returncode, next(c for c in report["checks"] if c["name"] == "ib.bandwidth")["findings"]


def test_ib_write_bw_pair_passes_at_line_rate(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = roce_inventory(sim_cluster, tmp_path / "cluster.yaml")
    rc, found = ib_findings(tmp_path, inv, "--path", str(standin_dir(tmp_path)))
    assert rc == 0, found
    assert [(f["verdict"], f["node"], f["subject"]) for f in found] == [("pass", "node0", "mlx5_0/1->mlx5_0/1")]
    assert "92.4 Gbit/s, 92% of the listed 100 Gbit/s" in found[0]["summary"]
    calls = (tmp_path / "calls.log").read_text().splitlines()
    server = next(c for c in calls if c.endswith("--report_gbits"))
    client = next(c for c in calls if c.endswith(sim_cluster.nodes[1].data_ip))
    for call in (server, client):
        assert "-d mlx5_0 -i 1" in call and "-x 3" in call and "-D 3" in call
    assert server.split("-p ")[1].split()[0] == client.split("-p ")[1].split()[0]  # the port chosen on the server


def test_ib_write_bw_below_line_rate_warns(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = roce_inventory(sim_cluster, tmp_path / "cluster.yaml", speed="200gbit")
    rc, found = ib_findings(tmp_path, inv, "--path", str(standin_dir(tmp_path)))
    assert rc == 3
    assert found[0]["verdict"] == "warn" and "46% of the listed 200 Gbit/s" in found[0]["summary"]
    assert "ibstat" in found[0]["hint"]


def test_ib_write_bw_mebibyte_table_is_converted_before_the_verdict(sim_cluster: SimCluster, tmp_path: Path) -> None:
    # Newer perftest prints MiB/sec when run without --report_gbits: 46557 MiB/s is 390.5 Gbit/s, not 46557.
    inv = roce_inventory(sim_cluster, tmp_path / "cluster.yaml", speed="400gbit")
    bindir = standin_dir(tmp_path, output="send_bw_mib_ndr_cpu_freq_warning_in_table.txt")
    rc, found = ib_findings(tmp_path, inv, "--path", str(bindir))
    assert rc == 0, found
    assert found[0]["verdict"] == "pass" and "390.5 Gbit/s, 98% of the listed 400 Gbit/s" in found[0]["summary"]


def test_ib_write_bw_handshake_blocked_fails_in_time(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = roce_inventory(sim_cluster, tmp_path / "cluster.yaml")
    sim_cluster.drop_nic("node1", "data")
    rc, found = ib_findings(tmp_path, inv, "--path", str(standin_dir(tmp_path)))
    assert rc == 1
    assert found[0]["verdict"] == "fail" and found[0]["node"] == "node0"
    assert "Couldn't connect" in found[0]["summary"]


def test_ib_write_bw_missing_fails_where_the_inventory_lists_rdma(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = roce_inventory(sim_cluster, tmp_path / "cluster.yaml")
    rc, found = ib_findings(tmp_path, inv)  # the real thing: perftest is not installed on these nodes
    assert rc == 1
    assert sorted((f["verdict"], f["node"]) for f in found) == [("fail", "node0"), ("fail", "node1")]
    assert "ib_write_bw not installed" in found[0]["summary"] and "perftest" in found[0]["hint"]


def test_ib_write_bw_pair_with_a_typo_in_the_servers_address_is_not_tested_not_failed(sim_cluster: SimCluster,
                                                                                      tmp_path: Path) -> None:
    inv = roce_inventory(sim_cluster, tmp_path / "cluster.yaml")
    real = sim_cluster.nodes[1].data_ip
    wrong = real.rsplit(".", 1)[0] + ".99"
    inv.write_text(inv.read_text().replace(f"ip: {real}/24", f"ip: {wrong}/24"))
    rc, found = ib_findings(tmp_path, inv, "--path", str(standin_dir(tmp_path)))

    assert rc == 0  # nothing failed: the only pair was not tested, and nic.present (not run here) says why
    assert [(f["verdict"], f["node"]) for f in found] == [("skip", "node0")]
    assert f"not tested: inventory says {wrong}, node has {real}/24" in found[0]["summary"]
    assert not (tmp_path / "calls.log").exists()  # no ib_write_bw was started against an address nobody has
