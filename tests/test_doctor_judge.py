"""The pure parts of the network checks and of the recommendation: which networks doctor tests
(``networks``), how ping and bandwidth results are judged (``_judge_pings``, ``_judge_bandwidth``), and the
inventory snippet doctor recommends (``choose_network``, ``recommend``).

No command runs: ping outcomes are built from the recorded ping output in tests/fixtures/real/ping/ (see
SOURCE.md), bandwidth transfers by hand. ``ip -j addr`` output is the recording in tests/fixtures/real/ip/
where it fits, else small synthetic JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from itertools import permutations
from pathlib import Path
from typing import Any, TypeVar

import pytest
from reported import facts_section

from clusterrun.doctor.checks.net import Transfer, _judge_bandwidth
from clusterrun.doctor.checks.paths import Endpoint, Network, networks
from clusterrun.doctor.checks.ping import PingOutcome, _judge_pings
from clusterrun.doctor.facts import FACTS, MISSING, NodeFacts
from clusterrun.doctor.model import Evidence, Finding, Verdict
from clusterrun.doctor.recommend import choose_network, recommend
from clusterrun.doctor.registry import Context
from clusterrun.facts.parsers import ping
from clusterrun.inventory.models import Inventory

REAL = Path(__file__).parent / "fixtures" / "real"
ADDR_NETNS = (REAL / "ip" / "addr_netns_mixed.json").read_text()  # data0: 198.19.0.1/16, up

T = TypeVar("T")

NODES = ("gpu01", "gpu02", "gpu03", "gpu04")


def ping_text(name: str) -> str:
    return (REAL / "ping" / name).read_text()


# --- builders ------------------------------------------------------------------------------------------------------


def synthetic_ip(*nics: tuple[str, str]) -> str:
    """Synthetic ``ip -j addr show``: loopback plus each ``(name, "a.b.c.d/NN")``, up with carrier."""
    entries: list[dict[str, Any]] = [
        {"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "mtu": 65536, "operstate": "UNKNOWN",
         "link_type": "loopback", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8,
                                                 "scope": "host"}]}]
    for i, (name, cidr) in enumerate(nics, 2):
        local, prefix = cidr.split("/")
        entries.append({"ifindex": i, "ifname": name, "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
                        "mtu": 1500, "operstate": "UP", "link_type": "ether",
                        "addr_info": [{"family": "inet", "local": local, "prefixlen": int(prefix), "scope": "global"},
                                      {"family": "inet6", "local": f"fe80::{i}", "prefixlen": 64, "scope": "link"}]})
    return json.dumps(entries)


def facts(node: str, ip_addr: str | tuple[str, int] | None = None) -> NodeFacts:
    sections = {}
    if ip_addr is not None:
        sections[FACTS] = facts_section(ip=ip_addr)  # what the node reporter's `ip -j addr show` printed
    return NodeFacts(node, sections)


def mgmt_ip(i: int) -> str:
    return f"192.168.1.{10 + i}"


def data_ip(i: int) -> str:
    return f"10.0.0.{11 + i}"


def cluster(count: int = 4, *, inventory_prefix: bool = False, data: str = "10.0.0.0/24",
            data_nic: dict[str, Any] | None = None, unreachable: tuple[str, ...] = ()) -> Context:
    """``count`` nodes, each with eth0 on 192.168.1.0/24 (its SSH host) and eth1 on 10.0.0.0/24 (synthetic ip addr).

    The inventory lists both NICs, with their prefix only when ``inventory_prefix``; ``network.data`` is ``data``.
    """
    suffix = "/24" if inventory_prefix else ""
    nodes, node_facts = [], {}
    for i, name in enumerate(NODES[:count]):
        nodes.append({"name": name, "host": mgmt_ip(i),
                      "nics": [{"name": "eth0", "ip": mgmt_ip(i) + suffix},
                               {"name": "eth1", "ip": data_ip(i) + suffix, **(data_nic or {})}]})
        node_facts[name] = (NodeFacts(name, error="timed out") if name in unreachable
                            else facts(name, synthetic_ip(("eth0", f"{mgmt_ip(i)}/24"), ("eth1", f"{data_ip(i)}/24"))))
    inv = Inventory.model_validate({"nodes": nodes, "network": {"data": data}})
    return Context(inv, node_facts)


def by_verdict(findings: list[Finding], verdict: Verdict) -> list[Finding]:
    return [f for f in findings if f.verdict is verdict]


def one(items: list[T]) -> T:
    assert len(items) == 1, items
    return items[0]


# --- networks() ----------------------------------------------------------------------------------------------------


def test_networks_take_the_prefix_from_ip_addr_and_mark_the_data_network() -> None:
    nets = networks(cluster(3))  # inventory addresses have no prefix; network.data names the subnet

    assert [(n.subnet, n.data) for n in nets] == [("10.0.0.0/24", True), ("192.168.1.0/24", False)]
    assert nets[0].members == {"gpu01": Endpoint("gpu01", "eth1", "10.0.0.11"),
                               "gpu02": Endpoint("gpu02", "eth1", "10.0.0.12"),
                               "gpu03": Endpoint("gpu03", "eth1", "10.0.0.13")}
    assert nets[1].members["gpu02"] == Endpoint("gpu02", "eth0", "192.168.1.11")
    assert (nets[0].label, nets[1].label) == ("10.0.0.0/24 (data)", "192.168.1.0/24 (other)")


@pytest.mark.parametrize(("data", "expected"), [("auto", "10.0.0.0/24"), ("192.168.1.0/24", "192.168.1.0/24"),
                                                ("eth0", "192.168.1.0/24"), ("eth1", "10.0.0.0/24")])
def test_networks_mark_the_network_the_inventory_plans_on(data: str, expected: str) -> None:
    # auto: both subnets are shared; the one SSH does not use wins.
    nets = networks(cluster(3, inventory_prefix=True, data=data))

    assert [n.subnet for n in nets if n.data] == [expected]
    assert nets[0].subnet == expected  # the data network comes first


def test_networks_leave_out_unreachable_nodes_and_subnets_with_one_member() -> None:
    nets = networks(cluster(3, unreachable=("gpu02", "gpu03")))

    assert nets == []


def test_networks_fall_back_to_the_inventory_prefix_without_ip_output() -> None:
    ctx = cluster(3, inventory_prefix=True)
    ctx.facts = {**ctx.facts, "gpu03": facts("gpu03", ("ip: not installed", MISSING))}
    data, mgmt = networks(ctx)

    assert data.members["gpu03"] == Endpoint("gpu03", "eth1", "10.0.0.13")
    assert set(mgmt.members) == {"gpu01", "gpu02", "gpu03"}


def test_networks_without_prefix_nor_ip_output_leave_the_node_out() -> None:
    ctx = cluster(3)
    ctx.facts = {**ctx.facts, "gpu03": facts("gpu03", ("ip: not installed", MISSING))}

    assert all(set(n.members) == {"gpu01", "gpu02"} for n in networks(ctx))


def test_networks_on_recorded_ip_addr_for_a_nic_listed_without_address() -> None:
    # gpu01: the recorded namespace (data0 198.19.0.1/16 plus a link-local address); gpu02: synthetic.
    inv = Inventory.model_validate({"nodes": [{"name": "gpu01", "host": "192.168.1.10", "nics": [{"name": "data0"}]},
                                              {"name": "gpu02", "host": "192.168.1.11", "nics": [{"name": "data0"}]}]})
    ctx = Context(inv, {"gpu01": facts("gpu01", ADDR_NETNS), "gpu02": facts("gpu02", synthetic_ip(("data0",
                                                                                                   "198.19.0.2/16")))})
    net = one(networks(ctx))

    assert net.subnet == "198.19.0.0/16"
    assert net.members == {"gpu01": Endpoint("gpu01", "data0", "198.19.0.1"),
                           "gpu02": Endpoint("gpu02", "data0", "198.19.0.2")}
    assert net.data is False  # the inventory knows no address, so the data network is the host addresses


# --- _judge_pings --------------------------------------------------------------------------------------------------


def network(subnet: str, nic: str, address: Any, data: bool, count: int = 4) -> Network:
    return Network(subnet, {n: Endpoint(n, nic, address(i)) for i, n in enumerate(NODES[:count])}, data)


def outcome(net: Network, src: str, dst: str, fixture: str | None = "loopback_ok.txt",
            error: str | None = None) -> PingOutcome:
    """One directed ping; ``fixture`` is the recorded output it printed, or None with ``error`` (no result)."""
    s, d = net.members[src], net.members[dst]
    command = f"ping -n -c 3 -i 0.2 -W 1 -w 5 -I {s.address} {d.address}"
    if fixture is None:
        return PingOutcome(net, s, d, None, error, Evidence(command, error or "", None, src))
    text = ping_text(fixture)
    return PingOutcome(net, s, d, ping.parse(text), None, Evidence(command, text, 0, src))


def all_pings(net: Network, failing: Mapping[tuple[str, str], str | None] | None = None) -> list[PingOutcome]:
    """Every directed pair of ``net``; the pairs in ``failing`` get that recorded output (None: no result)."""
    failing = failing or {}
    return [outcome(net, s, d, failing.get((s, d), "loopback_ok.txt"), error="ssh: timed out")
            for s, d in permutations(net.members, 2)]


def isolating(node: str, fixture: str = "all_dropped.txt") -> dict[tuple[str, str], str]:
    return {pair: fixture for pair in permutations(NODES, 2) if node in pair}


DATA = network("10.0.0.0/24", "eth1", data_ip, True)
MGMT = network("192.168.1.0/24", "eth0", mgmt_ip, False)


def test_pings_all_answer_pass_once_per_network() -> None:
    lossy = {("gpu01", "gpu02"): "partial_loss.txt"}
    found = list(_judge_pings([DATA, MGMT], all_pings(DATA) + all_pings(MGMT, lossy)))

    assert [(f.verdict, f.subject, f.measured) for f in found] == [
        (Verdict.passed, "10.0.0.0/24", "12/12"), (Verdict.passed, "192.168.1.0/24", "12/12")]
    assert found[0].summary == "10.0.0.0/24 (data): all 12 directed pairs answer, average rtt 0.05 ms"
    assert "(other): all 12 directed pairs answer" in found[1].summary  # 50% loss still answers


def test_pings_isolated_node_on_the_data_network_is_named_once_and_the_other_network_suggested() -> None:
    found = list(_judge_pings([DATA, MGMT], all_pings(DATA, isolating("gpu04")) + all_pings(MGMT)))

    fail = one(by_verdict(found, Verdict.failed))
    assert (fail.node, fail.subject) == ("gpu04", "eth1")
    assert fail.summary == "gpu04: eth1 (10.0.0.14) reaches no peer on 10.0.0.0/24 (3 peer(s) tried both ways)"
    assert (fail.measured, fail.expected) == ("0/3 peers", "all peers")
    assert "`network.data: 192.168.1.0/24`" in (fail.hint or "")
    assert "firewall" in (fail.hint or "") and "gpu04" in (fail.hint or "")
    assert fail.data == {"unreachable_peers": ["gpu01", "gpu02", "gpu03"]}
    assert 0 < len(fail.evidence) <= 4 and all(e.output == ping_text("all_dropped.txt") for e in fail.evidence)
    assert [(f.verdict, f.subject) for f in by_verdict(found, Verdict.passed)] == [(Verdict.passed, "192.168.1.0/24")]


@pytest.mark.parametrize(
    ("data_failing", "mgmt_failing", "isolated"),
    [({}, isolating("gpu04"), {("gpu04", "eth0")}),
     (isolating("gpu04"), isolating("gpu02", "dest_host_unreachable.txt"), {("gpu04", "eth1"), ("gpu02", "eth0")})],
    ids=["other-network-fails", "no-healthy-fallback"],
)
def test_pings_isolated_node_gets_no_fallback_advice(data_failing: dict[tuple[str, str], str],
                                                     mgmt_failing: dict[tuple[str, str], str],
                                                     isolated: set[tuple[str, str]]) -> None:
    outcomes = all_pings(DATA, data_failing) + all_pings(MGMT, mgmt_failing)
    found = by_verdict(list(_judge_pings([DATA, MGMT], outcomes)), Verdict.failed)

    assert {(f.node, f.subject) for f in found} == isolated and len(found) == len(isolated)
    assert all("reaches no peer" in f.summary and "network.data" not in (f.hint or "") for f in found)


@pytest.mark.parametrize(
    ("fixture", "why"),
    [("all_dropped.txt", "no reply"), ("dest_host_unreachable.txt", "no reply"),
     ("network_unreachable.txt", "connect: Network is unreachable"), (None, "ssh: timed out")],
    ids=["dropped", "host-unreachable", "network-unreachable", "no-result"],
)
def test_pings_one_failing_pair_gets_a_pair_finding(fixture: str | None, why: str) -> None:
    found = list(_judge_pings([DATA], all_pings(DATA, {("gpu01", "gpu02"): fixture})))

    fail = one(by_verdict(found, Verdict.failed))
    assert (fail.node, fail.subject) == ("gpu01", "eth1")
    assert fail.summary == f"gpu01 -> gpu02 on 10.0.0.0/24: eth1 gets no reply from 10.0.0.12 ({why})"
    assert "between gpu01 and gpu02" in (fail.hint or "")
    assert len(fail.evidence) == 1 and fail.evidence[0].node == "gpu01"
    assert by_verdict(found, Verdict.passed) == []  # the network is not reported as passing


def test_pings_two_nodes_failing_each_other_are_two_pairs_not_an_isolated_node() -> None:
    two = network("10.0.0.0/24", "eth1", data_ip, True, count=2)
    found = list(_judge_pings([two], all_pings(two, isolating("gpu02"))))

    assert [(f.verdict, f.node) for f in found] == [(Verdict.failed, "gpu01"), (Verdict.failed, "gpu02")]
    assert all(" -> " in f.summary for f in found)


def test_pings_network_where_nothing_was_sent_does_not_pass() -> None:
    # What net.ping hands over when ping is missing on the nodes of a network: no outcome there.
    found = list(_judge_pings([DATA, MGMT], all_pings(DATA)))

    assert one([f for f in found if f.verdict is Verdict.passed]).subject == "10.0.0.0/24"


# --- _judge_bandwidth ----------------------------------------------------------------------------------------------

GBIT = 1e9


def bandwidth_ctx(speeds: dict[str, str] | None = None, count: int = 4) -> tuple[Context, Network]:
    speeds = speeds or {}
    nodes = [{"name": n, "host": mgmt_ip(i),
              "nics": [{"name": "eth1", "ip": f"{data_ip(i)}/24", **({"speed": speeds[n]} if n in speeds else {})}]}
             for i, n in enumerate(NODES[:count])]
    ctx = Context(Inventory.model_validate({"nodes": nodes}), {n: facts(n) for n in NODES[:count]})
    return ctx, network("10.0.0.0/24", "eth1", data_ip, True, count)


def transfers(rates: Mapping[tuple[str, str], float | None], count: int = 4, default: float | None = 9.4 * GBIT,
              error: str = "iperf3 server did not start on the node") -> list[Transfer]:
    """Every directed pair (all rounds of the tournament) at ``default`` bits/s unless ``rates`` says otherwise."""
    out = []
    for s, d in permutations(NODES[:count], 2):
        bps = rates.get((s, d), default)
        evidence = (Evidence(f"iperf3 -c {d} -J", "{}", 0, s),)
        out.append(Transfer(s, d, bps, "iperf3", None if bps is not None else error, evidence))
    return out


def test_bandwidth_even_transfers_pass_once_with_the_median() -> None:
    ctx, data = bandwidth_ctx({n: "10gbit" for n in NODES})
    f = one(list(_judge_bandwidth(ctx, data, transfers({}), "iperf3")))

    assert (f.verdict, f.subject, f.measured) == (Verdict.passed, "10.0.0.0/24", "9.40 Gbit/s")
    assert f.summary.startswith("10.0.0.0/24: median 9.40 Gbit/s over 12 transfer(s) (iperf3): "
                                "gpu01->gpu02 9.40 Gbit/s, gpu01->gpu03 9.40 Gbit/s")
    assert f.data["median_bps"] == 9.4 * GBIT and f.data["tool"] == "iperf3" and len(f.data["transfers"]) == 12


@pytest.mark.parametrize("speeds", [None, {n: "10gbit" for n in NODES}], ids=["no-speed", "listed-speed"])
@pytest.mark.parametrize("side", ["sends", "receives"])
def test_bandwidth_one_slow_node_warns_naming_it(side: str, speeds: dict[str, str] | None) -> None:
    ctx, data = bandwidth_ctx(speeds)
    slow = {(s, d): 1.2 * GBIT for s, d in permutations(NODES, 2) if (s if side == "sends" else d) == "gpu03"}
    found = list(_judge_bandwidth(ctx, data, transfers(slow), "builtin"))

    warn = one(by_verdict(found, Verdict.warned))  # the slow node's own transfers are not also warned one by one
    assert (warn.node, warn.subject) == ("gpu03", "eth1")
    assert warn.summary == f"gpu03: eth1 {side} at 1.20 Gbit/s at best, the cluster's median is 9.40 Gbit/s"
    assert (warn.measured, warn.expected) == ("1.20 Gbit/s", "9.40 Gbit/s")
    assert "ethtool" in (warn.hint or "")
    assert 0 < len(warn.evidence) <= 4
    passed = one(by_verdict(found, Verdict.passed))
    assert passed.summary.startswith("10.0.0.0/24: median 9.40 Gbit/s over 12 transfer(s) (builtin)")


def test_bandwidth_failed_transfer_fails_and_the_rest_is_still_measured() -> None:
    ctx, data = bandwidth_ctx()
    found = list(_judge_bandwidth(ctx, data, transfers({("gpu01", "gpu02"): None}), "iperf3"))

    fail = one(by_verdict(found, Verdict.failed))
    assert (fail.node, fail.subject) == ("gpu01", "eth1")
    assert fail.summary == "gpu01 -> gpu02 on 10.0.0.0/24: no measure (iperf3 server did not start on the node)"
    assert "net.ping" in (fail.hint or "")
    assert "over 11 transfer(s)" in one(by_verdict(found, Verdict.passed)).summary


def test_bandwidth_all_transfers_failed_gives_only_failures() -> None:
    ctx, data = bandwidth_ctx(count=2)
    found = list(_judge_bandwidth(ctx, data, transfers({}, count=2, default=None), "builtin"))

    assert [(f.verdict, f.node) for f in found] == [(Verdict.failed, "gpu01"), (Verdict.failed, "gpu02")]


def test_bandwidth_transfer_under_half_the_listed_speed_warns_when_no_node_is_an_outlier() -> None:
    # gpu02's NIC is listed faster: the slower end (gpu01, 10gbit) is the line rate.
    ctx, data = bandwidth_ctx({"gpu01": "10gbit", "gpu02": "100gbit", "gpu03": "10gbit", "gpu04": "10gbit"})
    found = list(_judge_bandwidth(ctx, data, transfers({("gpu01", "gpu02"): 4 * GBIT}), "iperf3"))

    warn = one(by_verdict(found, Verdict.warned))
    assert (warn.node, warn.subject) == ("gpu01", "eth1")
    assert warn.summary == "gpu01 -> gpu02: 4.00 Gbit/s, under half the listed 10.00 Gbit/s"
    assert (warn.measured, warn.expected) == ("4.00 Gbit/s", "10.00 Gbit/s")
    assert "iperf3 -P 4" in (warn.hint or "")
    assert len(by_verdict(found, Verdict.passed)) == 1


def test_bandwidth_two_nodes_are_never_outliers_but_still_compared_with_the_line_rate() -> None:
    ctx, data = bandwidth_ctx({"gpu01": "1gbit", "gpu02": "1gbit"}, count=2)
    found = list(_judge_bandwidth(ctx, data, transfers({("gpu02", "gpu01"): 200e6}, count=2, default=940e6), "builtin"))

    assert [(f.verdict, f.node) for f in found] == [(Verdict.warned, "gpu02"), (Verdict.passed, None)]
    assert found[0].summary == "gpu02 -> gpu01: 200 Mbit/s, under half the listed 1.00 Gbit/s"


def test_bandwidth_transfer_that_moved_nothing_is_reported() -> None:
    ctx, data = bandwidth_ctx()
    found = list(_judge_bandwidth(ctx, data, transfers({("gpu01", "gpu02"): 0.0}), "iperf3"))

    bad = [f for f in found if f.verdict in (Verdict.warned, Verdict.failed)]
    assert [(f.node, "gpu02" in f.summary) for f in bad] == [("gpu01", True)]


# --- choose_network / recommend ------------------------------------------------------------------------------------


def ping_findings(ctx: Context, failing: dict[str, dict[tuple[str, str], str]] | None = None) -> list[Finding]:
    """net.ping's findings on ``ctx``'s networks; ``failing`` maps a subnet to its failing pairs."""
    nets = networks(ctx)
    failing = failing or {}
    return list(_judge_pings(nets, [o for n in nets for o in all_pings(n, failing.get(n.subnet))]))


def test_recommend_healthy_data_network() -> None:
    ctx = cluster(3)
    findings = ping_findings(ctx)

    net, why = choose_network(ctx, findings)
    assert (net.subnet if net else None, why) == ("10.0.0.0/24", "the planned data network, and every pair answered")
    assert recommend(ctx, findings) == (
        "network:\n"
        "  data: 10.0.0.0/24   # the planned data network, and every pair answered\n"
        "nodes:\n"
        "  - name: gpu01   # NCCL_SOCKET_IFNAME=eth1\n"
        "    nics: [{name: eth1, ip: 10.0.0.11/24}]\n"
        "  - name: gpu02   # NCCL_SOCKET_IFNAME=eth1\n"
        "    nics: [{name: eth1, ip: 10.0.0.12/24}]\n"
        "  - name: gpu03   # NCCL_SOCKET_IFNAME=eth1\n"
        "    nics: [{name: eth1, ip: 10.0.0.13/24}]\n"
    )


@pytest.mark.parametrize(
    "failing",
    [isolating("gpu03"), {("gpu01", "gpu02"): "all_dropped.txt"}],
    ids=["isolated-node", "one-pair"],
)
def test_recommend_the_other_network_when_the_data_network_failed_ping(failing: dict[tuple[str, str], str]) -> None:
    ctx = cluster(3)
    findings = ping_findings(ctx, {"10.0.0.0/24": failing})

    net, why = choose_network(ctx, findings)
    assert net is not None and net.subnet == "192.168.1.0/24"
    assert "the planned data network did not pass" in why
    text = recommend(ctx, findings)
    assert "  data: 192.168.1.0/24   # every pair answered on it" in text
    assert text.count("NCCL_SOCKET_IFNAME=eth0") == 3 and "eth1" not in text
    assert "    nics: [{name: eth0, ip: 192.168.1.12/24}]" in text


def test_recommend_says_so_when_no_network_passed() -> None:
    ctx = cluster(3)
    findings = ping_findings(ctx, {"10.0.0.0/24": isolating("gpu01"), "192.168.1.0/24": isolating("gpu02")})

    assert choose_network(ctx, findings) == (None, "no network passed the pairwise ping")
    assert recommend(ctx, findings) == \
        "# no network passed the pairwise ping: fix the NICs named above, then run doctor again\n"


def test_recommend_marks_a_node_that_is_not_on_the_chosen_network() -> None:
    ctx = cluster(3, unreachable=("gpu02",))

    text = recommend(ctx, ping_findings(ctx))
    assert "  - name: gpu02   # not on 10.0.0.0/24 (unreachable or no NIC there)\n" in text
    assert text.count("NCCL_SOCKET_IFNAME=eth1") == 2


def test_recommend_names_the_hcas_except_ports_that_failed() -> None:
    ctx = cluster(3, data_nic={"kind": "roce", "hca": "mlx5_0"})
    bad_port = Finding("ib.port", Verdict.failed, "gpu02: mlx5_0 port 1 is down", node="gpu02", subject="mlx5_0/1")
    text = recommend(ctx, [*ping_findings(ctx), bad_port])

    assert "  - name: gpu01   # NCCL_SOCKET_IFNAME=eth1, NCCL_IB_HCA=mlx5_0:1\n" in text
    assert "  - name: gpu02   # NCCL_SOCKET_IFNAME=eth1\n" in text


def test_recommend_nothing_for_one_node_or_without_known_networks() -> None:
    single = Inventory.model_validate({"nodes": [{"name": "gpu01", "host": "192.168.1.10",
                                                  "nics": [{"name": "eth1", "ip": "10.0.0.11/24"}]}]})
    assert recommend(Context(single, {"gpu01": facts("gpu01", synthetic_ip(("eth1", "10.0.0.11/24")))}), []) == ""

    ctx = cluster(3, unreachable=("gpu02", "gpu03"))
    assert recommend(ctx, []) == ""
