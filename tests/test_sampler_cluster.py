"""The sampler inside a simulated node, during real traffic between two namespaces: the data NIC's sampled bytes
are the veth's kernel counters, the management NIC stays near idle, and the rank's connection is attributed to
the data NIC between the two data addresses; a rank sent over the management network by GLOO_SOCKET_IFNAME is
named by the verdict, with the variable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from loadscale import scaled

from clusterrun.runs.traffic import WrongNicJudge

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
RECEIVER = """
import socket, sys
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
total = 0
while True:
    data = conn.recv(1 << 20)
    if not data:
        break
    total += len(data)
print(total, flush=True)
"""
# The rank: connects, says so, waits for "go", then sends MIB MiB in 1 MiB pieces PAUSE seconds apart (seconds
# of traffic, so that several samples see it), says so and closes the connection when told.
SENDER = """
import socket, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print("connected", flush=True)
sys.stdin.readline()
for _ in range(int(sys.argv[3])):
    conn.sendall(b"x" * (1 << 20))
    time.sleep(float(sys.argv[4]))
print("sent", flush=True)
sys.stdin.readline()
conn.close()
"""
DRIVER = """
import json, os, select, subprocess, sys
from clusterrun.remote import sampler

def counters(nic):
    stats = "/sys/class/net/%s/statistics/" % nic
    return [int(open(stats + name).read()) for name in ("rx_bytes", "tx_bytes")]

data, mgmt, address, port, code, mib, pause, rank_env = sys.argv[1:9]
rank = subprocess.Popen([sys.executable, "-c", code, address, port, mib, pause], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, text=True, env=dict(os.environ, LOCAL_RANK="0", **json.loads(rank_env)))
assert rank.stdout.readline().strip() == "connected"
s = sampler.Sampler(lambda: {4: rank.pid}, smi="")
before = {nic: counters(nic) for nic in (data, mgmt)}
s.sample()
rank.stdin.write("go\\n")
rank.stdin.flush()
samples = []
while not select.select([rank.stdout], [], [], 0.2)[0]:  # a sample every 0.2 s until the rank has sent it all
    samples.append(s.sample())
assert rank.stdout.readline().strip() == "sent"
samples.append(s.sample())
rank.stdin.write("close\\n")
rank.stdin.flush()
rank.wait(timeout=60)
after = {nic: counters(nic) for nic in (data, mgmt)}
print(json.dumps({"before": before, "after": after, "samples": samples}))
"""


def _traffic(cluster, to: str, mib: int, pause: float, rank_env: dict[str, str]) -> dict:  # type: ignore[no-untyped-def]
    """A rank of node1 sending ``mib`` MiB to node0's address on network ``to`` ("data" or "mgmt"), sampled."""
    server, client = cluster.node(0), cluster.node(1)
    address = server.data_ip if to == "data" else server.mgmt_ip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    receiver = cluster.ns_popen(server, [sys.executable, "-c", RECEIVER, address], stdout=subprocess.PIPE, text=True,
                                env=env)
    try:
        port = receiver.stdout.readline().strip()
        done = cluster.ns_run(client, [sys.executable, "-c", DRIVER, client.data_nic, client.mgmt_nic, address, port,
                                       SENDER, str(mib), str(pause), json.dumps(rank_env)], timeout=120)
        received = int(receiver.stdout.readline().strip())
    finally:
        receiver.kill()
        receiver.wait(timeout=scaled(10))
    assert received == mib << 20
    return json.loads(done.stdout)


def test_sampled_bytes_match_the_veths_kernel_counters_and_name_the_data_nic(sim_cluster) -> None:  # type: ignore[no-untyped-def]
    server, client = sim_cluster.node(0), sim_cluster.node(1)
    got = _traffic(sim_cluster, "data", 48, 0.025, {})
    samples = got["samples"]
    assert len(samples) >= 3
    data, mgmt = client.data_nic, client.mgmt_nic
    kernel_tx = got["after"][data][1] - got["before"][data][1]
    sampled_tx = sum(s["nics"][data][1] * s["dt"] for s in samples)
    assert kernel_tx >= 48 << 20
    assert sampled_tx == pytest.approx(kernel_tx, rel=0.01)
    sampled_mgmt = sum(sum(s["nics"][mgmt]) * s["dt"] for s in samples)
    assert sampled_mgmt < 0.01 * kernel_tx  # the management NIC near idle
    pair = f"{client.data_ip}>{server.data_ip}"
    assert all(list(s["conns"]) == [data] and list(s["conns"][data]) == [pair] for s in samples if "conns" in s)
    # a sample taken in a lull reads no bytes (no "tx"); the next one's hold them
    by_connection = sum(s["conns"][data][pair].get("tx", 0) * s["dt"] for s in samples if "conns" in s)
    assert by_connection == pytest.approx(48 << 20, rel=0.05)
    judge = WrongNicJudge.from_plan(_plan(sim_cluster))
    assert [v for s in samples for v in judge.feed("node1", s)] == []


def _plan(cluster) -> dict:  # type: ignore[no-untyped-def]
    return {"nodes": [{"name": n.name, "host": n.mgmt_ip, "data_nic": n.data_nic, "data_address": n.data_ip,
                       "env": {"GLOO_SOCKET_IFNAME": n.data_nic}, "env_sources": {"GLOO_SOCKET_IFNAME": "rule:gloo"}}
                      for n in (cluster.node(0), cluster.node(1))]}


def test_a_rank_on_the_management_nic_by_its_variable_is_named(sim_cluster) -> None:  # type: ignore[no-untyped-def]
    client = sim_cluster.node(1)
    # 160 MiB through the 200 Mbit/s management link: about 7 s of sustained traffic, sampled every 0.2 s
    got = _traffic(sim_cluster, "mgmt", 160, 0.0, {"GLOO_SOCKET_IFNAME": client.mgmt_nic})
    judge = WrongNicJudge.from_plan(_plan(sim_cluster))
    verdicts = [v for s in got["samples"] for v in judge.feed("node1", s)]
    [verdict] = verdicts
    assert (verdict.node, verdict.nic, verdict.data_nic, verdict.variable) == (
        "node1", client.mgmt_nic, client.data_nic, "GLOO_SOCKET_IFNAME")
    assert verdict.peers == (sim_cluster.node(0).mgmt_ip,) and verdict.rate > 10e6
    assert "the plan set" in verdict.cause
