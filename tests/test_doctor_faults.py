"""doctor on the simulated cluster with a data NIC that drops everything (TCP connects hang, like a dead switch
port): every network check still names the node and its NIC, and once a node is known dead its pairs are left
out instead of waited for round after round. And the probe reads torch's versions without importing torch."""

from __future__ import annotations

import importlib.metadata
import json
import stat
import sys
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import run_clusterrun, write_inventory

pytestmark = pytest.mark.cluster


def doctor(inv: Path, cwd: Path, *args: str) -> tuple[int, dict]:
    done = run_clusterrun("doctor", str(inv), "--json", *args, cwd=cwd, timeout=300)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def findings(report: dict, name: str, verdict: str | None = None) -> list[dict]:
    found = next(c for c in report["checks"] if c["name"] == name)["findings"]
    return [f for f in found if verdict is None or f["verdict"] == verdict]


def test_dead_data_nic_is_named_by_each_network_check_and_its_pairs_are_left_out(sim_cluster: SimCluster,
                                                                                  tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    nic = sim_cluster.nodes[2].data_nic
    sim_cluster.drop_nic("node2", "data")
    rc, report = doctor(inv, tmp_path, "--checks", "net,cluster", "--bandwidth-seconds", "1")

    assert rc == 1
    # Every node pings all its peers at once: node2 is one finding, with all three peers, found in one deadline.
    ping = findings(report, "net.ping", "fail")
    assert [(f["node"], f["subject"]) for f in ping] == [("node2", nic)]
    assert ping[0]["data"] == {"unreachable_peers": ["node0", "node1", "node3"]}
    assert "(3 peer(s) tried both ways)" in ping[0]["summary"]
    assert "firewall" in ping[0]["hint"]
    assert [f["verdict"] for f in findings(report, "net.ping") if f["subject"] == str(sim_cluster.mgmt_subnet)] == \
        ["pass"]
    # Bandwidth knows it from the pings: node2 is told once, never waited for, and the other pairs are measured.
    bw = findings(report, "net.bandwidth", "fail")
    assert [(f["node"], f["subject"]) for f in bw] == [("node2", nic)]
    assert bw[0]["data"] == {"untried_peers": ["node0", "node1", "node3"]}
    measured = findings(report, "net.bandwidth", "pass")[0]["data"]["transfers"]
    assert measured and all("node2" not in (t["src"], t["dst"]) for t in measured)
    port = findings(report, "net.port", "fail")
    assert [f["node"] for f in port] == ["node2"]
    assert "node2's NIC on the data network reaches no peer" in port[0]["hint"]
    allreduce = findings(report, "cluster.allreduce")
    assert [f["verdict"] for f in allreduce] == ["skip"]
    assert f"node2 ({nic}) reaches no peer on the data network" in allreduce[0]["summary"]


@pytest.mark.parametrize("tool", ["iperf3", "builtin"])
def test_bandwidth_alone_finds_the_dead_nic_and_stops_waiting_for_it(sim_cluster: SimCluster, tmp_path: Path,
                                                                     tool: str) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    nic = sim_cluster.nodes[2].data_nic
    sim_cluster.drop_nic("node2", "data")
    rc, report = doctor(inv, tmp_path, "--checks", "net.bandwidth", "--bandwidth-seconds", "1",
                        "--bandwidth-tool", tool)

    assert rc == 1
    bad = findings(report, "net.bandwidth", "fail")
    assert [(f["node"], f["subject"]) for f in bad] == [("node2", nic)]
    # Both ways with node1, then node0 -> node2, each connect given up after seconds: node2 failed with two peers
    # that work with others, so node2 -> node0 and the pair with node3 are not waited for.
    assert bad[0]["data"] == {"failed_peers": ["node0", "node1"], "untried_peers": ["node3"]}
    assert "(3 transfer(s) failed, 1 peer(s) not tried)" in bad[0]["summary"]
    assert any("cannot connect" in e["output"] or "FAILED" in e["output"] for e in bad[0]["evidence"])
    passed = findings(report, "net.bandwidth", "pass")[0]["data"]
    assert passed["tool"] == tool
    assert {(t["src"], t["dst"]) for t in passed["transfers"]} == {("node0", "node3"), ("node3", "node0"),
                                                                   ("node3", "node1"), ("node1", "node3"),
                                                                   ("node0", "node1"), ("node1", "node0")}


def test_probe_reads_torch_versions_without_importing_torch(sim_cluster: SimCluster, tmp_path: Path) -> None:
    # The nodes' python, wrapped to log every import (-X importtime writes to stderr, which the probe keeps).
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -X importtime \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1, python=str(wrapper))
    rc, report = doctor(inv, tmp_path, "--checks", "node.python,node.versions")

    assert rc == 0, report
    torch_version = importlib.metadata.version("torch")
    for f in findings(report, "node.python"):
        assert f["verdict"] == "pass" and "not imported" in f["summary"]
        assert f["data"]["torch"] == torch_version and f["data"]["imported"] is False
        imports = f["evidence"][0]["output"]
        imported = {line.rsplit("|", 1)[1].strip() for line in imports.splitlines() if line.startswith("import time:")}
        assert "importlib.util" in imported and not {m for m in imported if m.split(".")[0] == "torch"}
    assert findings(report, "node.versions")[0]["verdict"] == "pass"
    assert f"torch {torch_version}" in findings(report, "node.versions")[0]["summary"]


def _typo_data_nic(sim_cluster: SimCluster, inv: Path, node: int) -> tuple[str, str, str]:
    """Write node ``node``'s data NIC in ``inv`` with an address the node does not have: (wrong, real, file:line)."""
    real = sim_cluster.nodes[node].data_ip
    wrong = real.rsplit(".", 1)[0] + ".99"
    text = inv.read_text().replace(f"ip: {real}/24", f"ip: {wrong}/24")
    inv.write_text(text)
    line = next(i for i, text_line in enumerate(text.splitlines(), 1) if f"ip: {wrong}/" in text_line)
    return wrong, real, f"{inv}:{line}"


@pytest.mark.parametrize("typo", [2, 0], ids=["worker", "master"])
def test_typo_in_a_nic_address_is_an_inventory_problem_not_a_network_fault(sim_cluster: SimCluster,
                                                                          tmp_path: Path, typo: int) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    name, nic = sim_cluster.nodes[typo].name, sim_cluster.nodes[typo].data_nic
    wrong, real, where = _typo_data_nic(sim_cluster, inv, typo)
    done = run_clusterrun("doctor", str(inv), "--json", "--checks", "nic,net,cluster", "--bandwidth-seconds", "1",
                          cwd=tmp_path, timeout=300)
    report = json.loads(done.stdout)

    # Told once, as the inventory's problem: the node, the file:line, what the node has, the corrected line.
    bad = [f for c in report["checks"] for f in c["findings"] if f["verdict"] == "fail"]
    assert [(f["check"], f["node"], f["subject"]) for f in bad] == [("nic.present", name, nic)]
    assert where in bad[0]["summary"] and real in bad[0]["summary"]
    assert f"{{name: {nic}, ip: {real}/24}}" in bad[0]["hint"] and "inventory" in bad[0]["hint"]
    assert bad[0]["data"]["inventory"] == where
    # The checks that would use the inventory's address say what they did not test, and why; no cable, no firewall.
    for check in ("net.ping", "net.bandwidth"):
        about = [f for f in findings(report, check) if f.get("node") == name]
        assert [f["verdict"] for f in about] == ["skip"], about
        assert f"not tested on {sim_cluster.data_subnet}: inventory says {wrong}, node has {real}/24" in \
            about[0]["summary"]
    port = findings(report, "net.port")
    if typo == 0:  # every node would connect to an address the master does not have
        assert [f["verdict"] for f in port] == ["skip"] and f"inventory says {wrong}" in port[0]["summary"]
    else:
        assert [f["verdict"] for f in port] == ["pass"]
    allreduce = findings(report, "cluster.allreduce")
    assert [f["verdict"] for f in allreduce] == ["skip"]
    assert f"not tested: {name}: {nic}: inventory says {wrong}" in allreduce[0]["summary"]
    every = json.dumps(report["checks"])
    assert "cable" not in every and "firewall" not in every
    # The data network works between the other nodes: kept, with the node's real address, not the management one.
    assert f"data: {sim_cluster.data_subnet}" in report["recommended"]
    assert f"data: {sim_cluster.mgmt_subnet}" not in report["recommended"]
    assert f"{{name: {nic}, ip: {real}/24}}" in report["recommended"]
    assert f"ip: {wrong}/" not in report["recommended"]
    # iperf3's and the other tools' complaints go to the report's evidence, never to doctor's terminal.
    assert all(line.startswith("clusterrun: doctor: ") for line in done.stderr.splitlines()), done.stderr


def test_nic_checks_alone_recommend_what_the_nodes_have(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    wrong, _, _ = _typo_data_nic(sim_cluster, inv, 1)
    rc, report = doctor(inv, tmp_path, "--checks", "nic")

    assert rc == 1
    assert f"data: {sim_cluster.data_subnet}" in report["recommended"]
    for node in sim_cluster.nodes[:4]:
        assert f"{{name: {node.data_nic}, ip: {node.data_ip}/24}}" in report["recommended"]
    assert f"ip: {wrong}/" not in report["recommended"]
