"""The wrong-NIC verdict (clusterrun/runs/traffic.py) over samples as the sampler writes them: named once, within
10 s of sustained rank traffic off the data NIC, with the variable that did it; never for SSH, the log relay,
heavy output, a dataset read, or traffic that does not last."""

from __future__ import annotations

from typing import Any

import pytest

from clusterrun.runs.traffic import SUSTAIN, WrongNicJudge, names_nic

PLAN = {"nodes": [
    {"name": "node0", "host": "10.0.0.10", "data_nic": "eth1", "data_address": "192.168.50.10",
     "env": {"NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1"},
     "env_sources": {"NCCL_SOCKET_IFNAME": "rule:socket-ifname", "GLOO_SOCKET_IFNAME": "rule:socket-ifname"}},
    {"name": "node1", "host": "10.0.0.11", "data_nic": "eth1", "data_address": "192.168.50.11",
     "env": {}, "env_sources": {}},
]}
RDMA_PLAN = {"nodes": [
    {"name": "gpu01", "host": "10.0.0.1", "data_nic": "ib0", "data_address": "192.168.1.1",
     "env": {"NCCL_IB_HCA": "mlx5_0"}, "env_sources": {"NCCL_IB_HCA": "rule:ib-hca"}},
    {"name": "gpu02", "host": "10.0.0.2", "data_nic": "ib0", "data_address": "192.168.1.2",
     "env": {"NCCL_IB_HCA": "mlx5_0"}, "env_sources": {"NCCL_IB_HCA": "rule:ib-hca"}},
]}
GB = 1_000_000_000


def sample(t: int, nics: dict[str, list[int]], conns: dict[str, dict[str, dict[str, int]]] | None = None,
           env: dict[str, str] | None = None, **more: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"t": 1000.0 + t, "dt": 1.0, "nics": nics, **more}
    if conns:
        out["conns"] = conns
    if env:
        out["env"] = env
    return out


def feed(judge: WrongNicJudge, node: str, samples: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    return [(i, v) for i, s in enumerate(samples) for v in judge.feed(node, s)]


def gloo_on_management(t: int) -> dict[str, Any]:
    pair = {"n": 4, "tx": GB // 2, "rx": GB // 2}
    return sample(t, {"eth0": [GB // 2 + 5000, GB // 2], "eth1": [300, 200]},
                  {"eth0": {"10.0.0.11>10.0.0.10": pair}}, env={"GLOO_SOCKET_IFNAME": "eth0", "MASTER_PORT": "29500"})


def test_rank_traffic_on_the_management_nic_is_named_once_with_the_variable_and_its_origin() -> None:
    judge = WrongNicJudge.from_plan(PLAN)
    found = feed(judge, "node1", [gloo_on_management(t) for t in range(30)])
    [(when, verdict)] = found
    assert when + 1 <= 10  # within 10 s of one sample a second
    assert (verdict.node, verdict.nic, verdict.data_nic, verdict.variable) == ("node1", "eth0", "eth1",
                                                                                "GLOO_SOCKET_IFNAME")
    assert verdict.rate == GB and verdict.peers == ("10.0.0.10",)
    assert "not from clusterrun's plan" in verdict.cause
    text = verdict.message()
    assert text.startswith("node1: ") and "eth0 at 1.0 GB/s" in text and "data NIC eth1" in text
    assert "GLOO_SOCKET_IFNAME=eth0" in text and "set it to eth1" in text


def test_a_variable_that_overrides_the_plan_says_so() -> None:
    judge = WrongNicJudge.from_plan(PLAN)
    samples = [{**gloo_on_management(t), "conns": {"eth0": {"10.0.0.10>10.0.0.11": {"n": 1, "tx": GB, "rx": 0}}}}
               for t in range(10)]
    [(_, verdict)] = feed(judge, "node0", samples)
    assert "the plan set 'eth1'" in verdict.cause


def test_the_kernel_giving_no_bytes_per_connection_falls_back_to_the_nic_holding_them() -> None:
    judge = WrongNicJudge.from_plan(PLAN)
    samples = [sample(t, {"eth0": [GB, GB]}, {"eth0": {"10.0.0.11>10.0.0.10": {"n": 4}}}) for t in range(10)]
    [(_, verdict)] = feed(judge, "node1", samples)
    assert verdict.rate == 2 * GB and verdict.variable is None
    assert "the script may set one itself" in verdict.cause


def test_heavy_output_and_ssh_on_the_management_nic_never_count() -> None:
    # The log relay and SSH go over eth0 at full speed; the ranks' own connections are on the data NIC, and
    # the one to torchrun's store (MASTER_PORT) is never among those the sampler reports.
    judge = WrongNicJudge.from_plan(PLAN)
    samples = [sample(t, {"eth0": [2_000_000, 3 * GB], "eth1": [GB, GB]},
                      {"eth1": {"192.168.50.11>192.168.50.10": {"n": 4, "tx": GB, "rx": GB}}}) for t in range(60)]
    assert feed(judge, "node1", samples) == []


def test_a_dataset_read_over_the_management_nic_never_counts() -> None:
    judge = WrongNicJudge.from_plan(PLAN)
    samples = [sample(t, {"eth0": [3 * GB, 1000]},
                      {"eth0": {"10.0.0.11>10.0.0.99": {"n": 8, "tx": 1000, "rx": 3 * GB}},  # not a node of the run
                       "eth1": {"192.168.50.11>192.168.50.10": {"n": 4, "tx": GB, "rx": GB}}}) for t in range(60)]
    assert feed(judge, "node1", samples) == []


def test_traffic_that_does_not_last_is_not_named() -> None:
    judge = WrongNicJudge.from_plan(PLAN)
    quiet = sample(0, {"eth0": [0, 0]}, {"eth0": {"10.0.0.11>10.0.0.10": {"n": 4, "tx": 0, "rx": 0}}})
    bursts = [gloo_on_management(t) if t % int(SUSTAIN) else quiet for t in range(60)]
    assert feed(judge, "node1", bursts) == []


def test_sockets_on_the_data_nic_while_the_plan_chose_rdma_are_named_with_the_variable() -> None:
    judge = WrongNicJudge.from_plan(RDMA_PLAN)
    samples = [sample(t, {"ib0": [GB, GB]}, {"ib0": {"192.168.1.1>192.168.1.2": {"n": 2, "tx": GB, "rx": GB}}},
                      env={"NCCL_IB_DISABLE": "1", "NCCL_IB_HCA": "mlx5_0"}, rdma={"mlx5_0/1": [10, 10]})
               for t in range(10)]
    [(_, verdict)] = feed(judge, "gpu01", samples)
    assert (verdict.kind, verdict.nic, verdict.variable) == ("sockets_not_rdma", "ib0", "NCCL_IB_DISABLE")
    assert "RDMA counters stay flat" in verdict.message()


def test_rdma_traffic_with_its_bootstrap_sockets_is_healthy() -> None:
    judge = WrongNicJudge.from_plan(RDMA_PLAN)
    samples = [sample(t, {"ib0": [5000, 5000]}, {"ib0": {"192.168.1.1>192.168.1.2": {"n": 2, "tx": 2000, "rx": 2000}}},
                      rdma={"mlx5_0/1": [20 * GB, 20 * GB]}) for t in range(60)]
    assert feed(judge, "gpu01", samples) == []


@pytest.mark.parametrize(("value", "nic", "names"), [
    ("eth0", "eth0", True), ("eth", "eth0", True), ("=eth", "eth0", False), ("^docker,lo", "eth0", True),
    ("^eth", "eth0", False), ("ib0,eth0", "eth0", True), ("", "eth0", False),
])
def test_interface_variables_read_as_nccl_reads_them(value: str, nic: str, names: bool) -> None:
    assert names_nic(value, nic) is names
