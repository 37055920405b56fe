"""Completing and checking an inventory with the nodes' network facts (pure; recorded and synthetic `ip -j addr`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clusterrun.facts.nics import NetFacts, parse_net_facts, probed_nics, reconcile
from clusterrun.inventory.models import Inventory, NicKind
from clusterrun.planning.plan import JobSpec, build_plan

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "ip"


def iface(name: str, addr: str | None, *, up: bool = True, mtu: int = 1500) -> dict[str, Any]:
    """One synthetic `ip -j addr` entry."""
    info = []
    if addr:
        local, prefix = addr.split("/")
        info.append({"family": "inet", "local": local, "prefixlen": int(prefix), "scope": "global"})
    flags = ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"] if up else ["BROADCAST", "MULTICAST"]
    return {"ifindex": 2, "ifname": name, "flags": flags, "mtu": mtu, "operstate": "UP" if up else "DOWN",
            "link_type": "ether", "address": "02:00:00:00:00:01", "addr_info": info}


def facts(node: str, *ifaces: dict[str, Any], speeds: dict[str, int] | None = None,
          rdma: list[dict[str, Any]] | None = None) -> NetFacts:
    lo = {"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "mtu": 65536, "operstate": "UNKNOWN",
          "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8, "scope": "host"}]}
    return parse_net_facts(node, {"ip": json.dumps([lo, *ifaces]), "speeds": speeds or {}, "rdma": rdma or []})


def inventory(*nodes: dict[str, Any], data: str = "auto") -> Inventory:
    return Inventory.model_validate({"network": {"data": data}, "nodes": list(nodes)})


def test_recorded_namespace_addresses_give_only_the_nic_that_is_up_with_ipv4() -> None:
    raw = {"ip": (FIXTURES / "addr_netns_mixed.json").read_text(), "speeds": {"data0": 25000}}
    nics = probed_nics(parse_net_facts("n", raw))
    # mgmt0 is DOWN, crv0 has no carrier, br0 has only a link-local address, lo is loopback.
    assert [(n.name, n.ip, n.speed) for n in nics] == [("data0", "198.19.0.1/16", 25_000_000_000)]


def test_hosts_only_inventory_gets_the_nodes_nics_and_plans_on_the_fast_separate_network() -> None:
    inv = inventory({"name": "a", "host": "gpu-a"}, {"name": "b", "host": "gpu-b"})
    found = {
        "a": facts("a", iface("eno1", "10.1.0.1/24"), iface("ens5", "10.2.0.1/24"), iface("docker0", "172.17.0.1/16"),
                   speeds={"eno1": 1000, "ens5": 100000}),
        "b": facts("b", iface("eno1", "10.1.0.2/24"), iface("ens7", "10.2.0.2/24"), speeds={"eno1": 1000, "ens7": 100000}),
    }
    result = reconcile(inv, found)
    assert not result.problems
    assert [n.name for n in result.inventory.nodes[0].nics] == ["eno1", "ens5"]  # docker0 left out
    assert "a: ens5 10.2.0.1/24 (probed: not in the inventory)" in result.probed
    plan = build_plan(result.inventory, JobSpec(script="t.py", run_id="r"), probed=result.probed)
    assert plan.master_addr == "10.2.0.1"
    assert [n.data_nic for n in plan.nodes] == ["ens5", "ens7"]  # each node's own name
    assert plan.probed == result.probed


def test_equal_speeds_prefer_the_network_ssh_does_not_use() -> None:
    inv = inventory({"name": "a", "host": "alias-a"}, {"name": "b", "host": "alias-b"})
    found = {n: facts(n, iface("eth0", f"198.18.0.{i}/24"), iface("eth1", f"198.19.0.{i}/24"))
             for i, n in ((1, "a"), (2, "b"))}
    result = reconcile(inv, found)
    job = JobSpec(script="t.py", run_id="r")
    # The SSH network sorts last by text, so only the SSH addresses can tell the networks apart.
    ssh_on_data = build_plan(result.inventory, job, ssh_addresses={"a": "198.19.0.1", "b": "198.19.0.2"})
    assert ssh_on_data.master_addr == "198.18.0.1"
    ssh_on_mgmt = build_plan(result.inventory, job, ssh_addresses={"a": "198.18.0.1", "b": "198.18.0.2"})
    assert ssh_on_mgmt.master_addr == "198.19.0.1"


def test_rdma_netdev_becomes_a_roce_nic_with_its_hca() -> None:
    found = facts("a", iface("ens1f0np0", "10.3.0.1/24"), speeds={"ens1f0np0": 200000},
                  rdma=[{"hca": "mlx5_0", "port": 1, "state": "4: ACTIVE", "link_layer": "Ethernet",
                         "netdevs": ["ens1f0np0"]}])
    (nic,) = probed_nics(found)
    assert (nic.kind, nic.hca, nic.port, nic.speed) == (NicKind.roce, "mlx5_0", 1, 200_000_000_000)


@pytest.mark.parametrize(("listed", "node_ifaces", "rdma", "problem"), [
    ({"name": "eth9", "ip": "10.0.0.1/24"}, [iface("eth1", "10.0.0.1/24")], None,
     "NIC eth9 does not exist (10.0.0.1 is on eth1)"),
    ({"name": "eth9"}, [iface("eth1", "10.0.0.1/24")], None, "NIC eth9 does not exist (it has: eth1)"),
    ({"name": "eth1", "ip": "10.0.0.9/24"}, [iface("eth1", "10.0.0.1/24")], None,
     "NIC eth1 does not have 10.0.0.9 (it has 10.0.0.1)"),
    ({"name": "eth1", "ip": "10.0.0.1/24"}, [iface("eth1", "10.0.0.1/24", up=False)], None, "NIC eth1 is down (DOWN)"),
    ({"name": "ib0", "kind": "infiniband", "hca": "mlx5_0"}, [iface("ib0", "10.5.0.1/24")],
     [{"hca": "mlx5_0", "port": 1, "state": "1: DOWN", "link_layer": "InfiniBand", "netdevs": ["ib0"]}],
     "mlx5_0 port 1 is DOWN, not ACTIVE"),
    ({"name": "ib0", "kind": "infiniband", "hca": "mlx5_3"}, [iface("ib0", "10.5.0.1/24")],
     [{"hca": "mlx5_0", "port": 1, "state": "4: ACTIVE", "link_layer": "InfiniBand", "netdevs": ["ib0"]}],
     "RDMA device mlx5_3 port 1 does not exist (it has: mlx5_0/1)"),
], ids=["wrong-name-address-elsewhere", "wrong-name", "wrong-address", "down", "ib-port-down", "no-such-hca"])
def test_listed_nics_that_contradict_the_node_are_problems(listed: dict, node_ifaces: list, rdma: list | None,
                                                           problem: str) -> None:
    inv = inventory({"name": "a", "host": "h", "nics": [listed]})
    result = reconcile(inv, {"a": facts("a", *node_ifaces, rdma=rdma)})
    assert result.problems == {"a": problem}


def test_listed_nic_is_completed_not_changed() -> None:
    inv = inventory({"name": "a", "host": "h", "nics": [{"name": "eth1", "ip": "10.0.0.1"}]},
                    {"name": "b", "host": "h2", "nics": [{"name": "eth1", "speed": "25gbit"}]})
    result = reconcile(inv, {"a": facts("a", iface("eth1", "10.0.0.1/24"), speeds={"eth1": 100000}),
                             "b": facts("b", iface("eth1", "10.0.0.2/24"), speeds={"eth1": 100000})})
    a, b = (n.nics[0] for n in result.inventory.nodes)
    assert (a.ip, a.speed) == ("10.0.0.1/24", 100_000_000_000)
    assert (b.ip, b.speed) == ("10.0.0.2/24", 25_000_000_000)  # the inventory's speed stays
    assert "a: eth1 prefix /24 (probed)" in result.probed and "b: eth1 address 10.0.0.2/24 (probed)" in result.probed


def test_nodes_without_facts_are_left_as_they_are() -> None:
    inv = inventory({"name": "a", "host": "h"})
    assert reconcile(inv, {}).inventory == inv


def test_infiniband_without_ipoib_still_reaches_nccl_and_down_ports_do_not() -> None:
    found = facts("a", iface("eno1", "10.1.0.1/24"), iface("ib1", "10.6.0.1/24"), rdma=[
        {"hca": "mlx5_0", "port": 1, "state": "4: ACTIVE", "link_layer": "InfiniBand", "netdevs": []},
        {"hca": "mlx5_1", "port": 1, "state": "1: DOWN", "link_layer": "InfiniBand", "netdevs": ["ib1"]},
    ])
    nics = {n.name: n for n in probed_nics(found)}
    assert (nics["mlx5_0-1"].kind, nics["mlx5_0-1"].hca, nics["mlx5_0-1"].ip) == (NicKind.infiniband, "mlx5_0", None)
    assert (nics["ib1"].kind, nics["ib1"].hca) == (NicKind.ethernet, None)  # its port is down: no NCCL_IB_HCA


def test_listed_rdma_nic_on_a_node_without_rdma_devices_is_a_problem() -> None:
    inv = inventory({"name": "a", "host": "h", "nics": [{"name": "ib0", "kind": "infiniband", "hca": "mlx5_0"}]})
    result = reconcile(inv, {"a": facts("a", iface("ib0", "10.5.0.1/24"))})
    assert "no RDMA device on the node (/sys/class/infiniband is empty)" in result.problems["a"]
