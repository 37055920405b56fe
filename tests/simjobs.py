"""Helpers to run `clusterrun` against the simulated cluster: inventories, runs, their processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from simcluster import SimCluster

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT = 180


def write_inventory(cluster: SimCluster, path: Path, nodes: int, *, nproc: int = 2, python: str | None = None,
                    connect_timeout: float = 3.0, data: str | None = None) -> Path:
    """An inventory of the first ``nodes`` simulated nodes: SSH over the management network, data NIC eth1."""
    lines = [
        "version: 1",
        "defaults:",
        f"  ssh: {{config_file: {cluster.ssh_config}, known_hosts: {cluster.known_hosts},",
        f"        host_key_policy: strict, connect_timeout: {connect_timeout}}}",
        # The nodes share this machine's filesystem: its interpreter has torch (a node's PATH python does not).
        f"  python: {python or sys.executable}",
        f"  nproc_per_node: {nproc}",
        f"network: {{data: '{data or cluster.data_subnet}'}}",
        "nodes:",
    ]
    for node in cluster.nodes[:nodes]:
        lines += [
            f"  - name: {node.name}",
            f"    host: {node.name}",
            "    nics:",
            f"      - {{name: {node.mgmt_nic}, ip: {node.mgmt_ip}/24, speed: {cluster.mgmt_rate}}}",
            f"      - {{name: {node.data_nic}, ip: {node.data_ip}/24, speed: {cluster.data_rate}}}",
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def clusterrun_env() -> dict[str, str]:
    """This checkout's package first, whatever else is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_clusterrun(*args: str, cwd: Path, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clusterrun", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=clusterrun_env(), check=False)


def start_clusterrun(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "clusterrun", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=clusterrun_env())


def the_run(cwd: Path) -> Path:
    runs = [p for p in (cwd / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def status(run: Path) -> dict:
    return json.loads((run / "status.json").read_text())
