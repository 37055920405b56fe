"""`clusterrun doctor` end to end on the simulated cluster: a healthy cluster passes, and each real fault
(iptables drop on a NIC, sshd down, a slow link, a blocked port, an MTU mismatch, a missing python) gets the
right verdict naming the right node and NIC, with the hint to fix it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import run_clusterrun, write_inventory

pytestmark = pytest.mark.cluster


def doctor(inv: Path, cwd: Path, *args: str) -> tuple[int, dict, str]:
    done = run_clusterrun("doctor", str(inv), "--json", *args, cwd=cwd, timeout=300)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


def check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


def failing(report: dict, name: str, verdict: str = "fail") -> list[dict]:
    return [f for f in check(report, name)["findings"] if f["verdict"] == verdict]


def test_healthy_cluster_passes_every_check_that_applies(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    rc, report, err = doctor(inv, tmp_path, "--bandwidth-seconds", "1")
    assert rc in (0, 3), err  # warnings only (for example open-file limits of this machine)
    verdicts = {c["name"]: c["verdict"] for c in report["checks"]}
    assert "fail" not in verdicts.values(), {k: failing(report, k) for k, v in verdicts.items() if v == "fail"}
    for name in ("node.ssh", "node.python", "node.versions", "nic.present", "nic.mtu", "net.ping", "net.bandwidth",
                 "net.port", "cluster.allreduce"):
        assert verdicts[name] == "pass", (name, check(report, name))
    for name in ("gpu.present", "gpu.busy"):
        assert verdicts[name] == "skip"  # no GPUs listed
    # Both networks pinged, every pair both ways: 4 nodes, 3 rounds.
    pings = [f for f in check(report, "net.ping")["findings"] if f["verdict"] == "pass"]
    assert sorted(f["subject"] for f in pings) == sorted([str(sim_cluster.mgmt_subnet), str(sim_cluster.data_subnet)])
    assert all("12/12" in f["measured"] for f in pings)
    allreduce = check(report, "cluster.allreduce")["findings"][0]
    assert allreduce["data"]["world_size"] == 4 and allreduce["data"]["backend"] == "gloo"
    assert allreduce["data"]["busbw_gbps"] > 0
    assert f"name: node2   # NCCL_SOCKET_IFNAME={sim_cluster.nodes[2].data_nic}" in report["recommended"]
    saved = Path(report["directory"])
    assert json.loads((saved / "report.json").read_text())["verdict"] == report["verdict"]
    assert (saved / "evidence" / "node3" / "ip_addr.txt").read_text().startswith("$ ip -j addr show")


def test_data_nic_that_drops_everything_is_named(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    sim_cluster.drop_nic("node2", "data")
    rc, report, _ = doctor(inv, tmp_path, "--checks", "net.ping")
    assert rc == 1
    bad = failing(report, "net.ping")
    assert [(f["node"], f["subject"]) for f in bad] == [("node2", sim_cluster.nodes[2].data_nic)]
    assert "reaches no peer" in bad[0]["summary"]
    mgmt = str(sim_cluster.mgmt_subnet)
    assert f"network.data: {mgmt}" in bad[0]["hint"]  # the management network still works
    assert f"data: {mgmt}" in report["recommended"]


def test_sshd_down_is_named_and_other_nodes_still_checked(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    sim_cluster.stop_sshd("node3")
    rc, report, _ = doctor(inv, tmp_path, "--checks", "node")
    assert rc == 1
    bad = failing(report, "node.ssh")
    assert [f["node"] for f in bad] == ["node3"]
    assert "refused" in bad[0]["summary"]
    assert {f["node"] for f in check(report, "node.python")["findings"]} == {"node0", "node1", "node2"}


@pytest.mark.parametrize("tool", ["iperf3", "builtin"])
def test_slow_link_is_a_bandwidth_outlier(sim_cluster: SimCluster, tmp_path: Path, tool: str) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    sim_cluster.shape("node1", "data", "200mbit")
    rc, report, _ = doctor(inv, tmp_path, "--checks", "net.bandwidth", "--bandwidth-seconds", "1",
                           "--bandwidth-tool", tool)
    assert rc == 3
    warned = failing(report, "net.bandwidth", "warn")
    assert [(f["node"], f["subject"]) for f in warned] == [("node1", sim_cluster.nodes[1].data_nic)]
    assert "sends at" in warned[0]["summary"]
    passed = check(report, "net.bandwidth")["findings"][-1]["data"]
    assert passed["tool"] == tool
    slow = [t["bps"] for t in passed["transfers"] if t["src"] == "node1"]
    fast = [t["bps"] for t in passed["transfers"] if t["src"] != "node1"]
    assert max(slow) < 0.3e9 < 1.0e9 < min(fast)  # shaped 200 Mbit/s against 2 Gbit/s


def test_allreduce_on_a_dead_data_nic_fails_in_seconds(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    sim_cluster.drop_nic("node1", "data")
    started = time.monotonic()
    rc, report, _ = doctor(inv, tmp_path, "--checks", "cluster.allreduce", "--timeout", "20")
    # Not a hang (gloo alone would wait 30 min): the launch path's own check stops it before torchrun starts.
    assert time.monotonic() - started < 60
    assert rc == 1
    bad = failing(report, "cluster.allreduce")
    assert len(bad) == 1 and "could not start the test: node1: cannot reach node0's master address" in bad[0]["summary"]
    assert f"from {sim_cluster.nodes[1].data_nic} ({sim_cluster.nodes[1].data_ip})" in bad[0]["summary"]


def test_allreduce_that_hangs_is_stopped_at_its_time_limit(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """Every path check passes, but both nodes drop gloo's own connections (any port but the master's)."""
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    for node in ("node0", "node1"):
        sim_cluster.block_ports_except(node, 29500)
    started = time.monotonic()
    rc, report, _ = doctor(inv, tmp_path, "--checks", "cluster.allreduce", "--timeout", "20")
    assert time.monotonic() - started < 90
    assert rc == 1
    bad = failing(report, "cluster.allreduce")
    assert len(bad) == 1 and "all-reduce failed" in bad[0]["summary"] and "time limit" in bad[0]["summary"]
    assert Path(bad[0]["data"]["run_dir"], "status.json").is_file()


def test_blocked_master_port_is_found(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    sim_cluster.block_port("node0", 29500)
    rc, report, _ = doctor(inv, tmp_path, "--checks", "net.port", "--master-port", "29500")
    assert rc == 1
    bad = failing(report, "net.port")
    assert sorted(f["node"] for f in bad) == ["node1", "node2"]
    assert "29500" in bad[0]["summary"] and "firewall" in bad[0]["hint"]


def test_mtu_mismatch_names_the_odd_node(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    sim_cluster.set_mtu("node2", "data", 9000)
    rc, report, _ = doctor(inv, tmp_path, "--checks", "nic.mtu")
    assert rc == 3
    warned = failing(report, "nic.mtu", "warn")
    assert [(f["node"], f["measured"]) for f in warned] == [("node2", "9000")]


def test_missing_python_fails_naming_the_interpreter(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    inv.write_text(inv.read_text().replace("  - name: node1\n", "  - name: node1\n    python: /opt/nowhere/bin/python3\n"))
    rc, report, _ = doctor(inv, tmp_path, "--checks", "node.python")
    assert rc == 1
    bad = failing(report, "node.python")
    assert [f["node"] for f in bad] == ["node1"]  # node0 keeps the default python
    assert "/opt/nowhere/bin/python3 not found" in bad[0]["summary"]
    assert "absolute path" in bad[0]["hint"]


def linked_venv_python(tmp_path: Path) -> tuple[Path, Path]:
    """A venv of the system python holding a torch, and a symlink to its interpreter from outside it.

    The torch is a stand-in: only the ``version.py`` that doctor's python report reads (it never imports torch).
    """
    base = Path("/usr/bin/python3")
    if not base.exists() or subprocess.run([str(base), "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("needs a /usr/bin/python3 without torch")
    venv = tmp_path / "venv"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("__version__ = '2.3.1+cpu'\ncuda = None\n")
    (tmp_path / "bin").mkdir()
    link = tmp_path / "bin" / "trainpy"
    link.symlink_to(venv / "bin" / "python")
    return venv, link


def test_symlink_that_leaves_its_venv_is_explained(sim_cluster: SimCluster, tmp_path: Path) -> None:
    venv, link = linked_venv_python(tmp_path)
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    inv.write_text(inv.read_text().replace("  - name: node1\n", f"  - name: node1\n    python: {link}\n")
                   .replace("  - name: node0\n", f"  - name: node0\n    python: {venv}/bin/python\n"))
    rc, report, _ = doctor(inv, tmp_path, "--checks", "node.python")
    assert rc == 1
    (bad,) = failing(report, "node.python")
    assert bad["node"] == "node1"  # node0 names the venv's own interpreter: its torch is found
    real = os.path.realpath("/usr/bin/python3")
    assert f"has no torch: no module named 'torch' on this python's path; sys.executable {link} (real path {real}), " \
           f"sys.prefix /usr" in bad["summary"]
    assert bad["hint"].startswith(f"{link} is a symlink to {venv}/bin/python of the venv {venv}, but its real path "
                                  f"{real} is outside that venv")
    assert f"set `python` to {venv}/bin/python itself" in bad["hint"]
