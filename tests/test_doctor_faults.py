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
