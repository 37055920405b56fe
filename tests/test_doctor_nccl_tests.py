"""`doctor`'s nccl-tests check end to end on the simulated cluster.

There are no GPUs and no nccl-tests here: where the tool must run, the nodes run a stand-in
``all_reduce_perf`` (tests/standins/all_reduce_perf.py) printing output recorded from real runs. What is
tested is clusterrun's part: finding the tool (PATH, ``--path``, beside the inventory's python), running it
on the GPUs the inventory lists, reading its table, the verdict; and the real absence of the tool.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import run_clusterrun, write_inventory

pytestmark = pytest.mark.cluster

STANDIN = Path(__file__).resolve().parent / "standins" / "all_reduce_perf.py"


def standin(folder: Path, log: Path, output: str = "nccl_info_interleaved_efa_2node.txt") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "all_reduce_perf"
    tool.write_text(f"#!/bin/sh\nSTANDIN_NCCL_TESTS_OUTPUT={output} STANDIN_NCCL_TESTS_LOG={log} "
                    f"exec {sys.executable} {STANDIN} \"$@\"\n")
    tool.chmod(0o755)
    return folder


def gpu_inventory(cluster: SimCluster, path: Path, python: str | None = None) -> Path:
    """Two nodes that list two GPUs each (nothing here checks that they exist)."""
    inv = write_inventory(cluster, path, 2, nproc=2, python=python)
    text = inv.read_text()
    for node in cluster.nodes[:2]:
        text = text.replace(f"    host: {node.name}\n", f"    host: {node.name}\n    gpus: [0, 1]\n")
    inv.write_text(text)
    return inv


def findings(cwd: Path, inv: Path, *args: str) -> tuple[int, list[dict]]:
    done = run_clusterrun("doctor", str(inv), "--json", "--checks", "cluster.nccl_tests", *args, cwd=cwd, timeout=240)
    assert done.stdout.strip(), done.stderr
    report = json.loads(done.stdout)
    return done.returncode, next(c for c in report["checks"] if c["name"] == "cluster.nccl_tests")["findings"]


def test_no_nccl_tests_anywhere_is_one_clear_skip(sim_cluster: SimCluster, tmp_path: Path) -> None:
    rc, found = findings(tmp_path, gpu_inventory(sim_cluster, tmp_path / "cluster.yaml"))

    assert rc == 0, found
    assert [(f["verdict"], f["summary"]) for f in found] == [
        ("skip", "nccl-tests not found on any node: skipped; install nccl-tests for busbw")]
    assert "doctor --path" in found[0]["hint"]


def test_busbw_reported_per_node_from_the_tool_on_path(sim_cluster: SimCluster, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    bindir = standin(tmp_path / "nccl-tests", log)
    rc, found = findings(tmp_path, gpu_inventory(sim_cluster, tmp_path / "cluster.yaml"), "--path", str(bindir))

    assert rc == 0, found
    assert [(f["verdict"], f["node"]) for f in found] == [("pass", "node0"), ("pass", "node1")]
    assert found[0]["summary"] == ("node0: all_reduce_perf on 2 GPU(s): busbw 12.39 GB/s (99.1 Gbit/s) at best, "
                                   "12.39 GB/s at 1073741824 bytes; average 4.27 GB/s")
    assert found[0]["data"]["rows"] == 28
    assert log.read_text().splitlines() == ["-b 8M -e 128M -f 2 -g 2"] * 2


def test_tool_beside_the_inventory_python_is_found(sim_cluster: SimCluster, tmp_path: Path) -> None:
    env = tmp_path / "env" / "bin"
    standin(env, tmp_path / "calls.log")
    (env / "python").symlink_to(sys.executable)
    rc, found = findings(tmp_path, gpu_inventory(sim_cluster, tmp_path / "cluster.yaml", python=str(env / "python")))

    assert rc == 0, found
    assert [f["verdict"] for f in found] == ["pass", "pass"]


def test_crash_inside_the_table_fails_with_the_tools_own_line(sim_cluster: SimCluster, tmp_path: Path) -> None:
    bindir = standin(tmp_path / "nccl-tests", tmp_path / "calls.log", output="failure_first_then_cut_table_4090.txt")
    rc, found = findings(tmp_path, gpu_inventory(sim_cluster, tmp_path / "cluster.yaml"), "--path", str(bindir))

    assert rc == 1
    assert found[0]["verdict"] == "fail"
    assert found[0]["summary"] == ("node0: all_reduce_perf failed after 3 size(s): c2211f46f318: Test NCCL failure "
                                   "common.cu:1005 'unhandled CUDA error'")
    assert "NCCL_DEBUG=INFO" in found[0]["hint"]
